"""A snapshot's Parquet files read as Arrow batches, by both report engines (Spark's
`danube` data source on its executors, the Python engine in-process): a file that is
missing or damaged is an error naming it."""

from __future__ import annotations

import fnmatch
from collections.abc import Iterator

import pyarrow as pa
import pyarrow.parquet as pq

from danube_zmq.snapshots.manifest import TopicState
from danube_zmq.snapshots.store import SnapshotStore
from danube_zmq.transport.errors import InvalidArgument, NotFound

__all__ = ["read_batches", "topic_matches"]


def read_batches(store: SnapshotStore, path: str, topic: str, columns: list[str]) -> Iterator[pa.RecordBatch]:
    """The `columns` of the records file `path` (relative to the store) of `topic`."""
    where = f"{store.url}/{path}"
    try:
        with store.open_read(path) as file:
            yield from pq.ParquetFile(file).iter_batches(columns=columns)
    except FileNotFoundError:
        raise NotFound(f"snapshot file {where} is missing (topic {topic})") from None
    except (OSError, pa.ArrowException) as exc:
        raise InvalidArgument(f"snapshot file {where} cannot be read (topic {topic}):"
                              f" {type(exc).__name__}: {exc}") from None


def topic_matches(topic: TopicState, pattern: str | None) -> bool:
    """A glob over the partition's name or its base topic's (None: every topic)."""
    return pattern is None or fnmatch.fnmatchcase(topic.topic, pattern) or fnmatch.fnmatchcase(topic.base_topic, pattern)

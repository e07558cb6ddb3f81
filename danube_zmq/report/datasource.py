"""`danube_snapshots`, a PySpark data source (Spark 4 `pyspark.sql.datasource`) over WAL snapshots.

    spark.dataSource.register(SnapshotDataSource)
    records = spark.read.format("danube_snapshots").option("path", "s3://bucket/danube-snapshots").load()
    cursors = spark.read.format("danube_snapshots").option("path", url).option("table", "subscriptions").load()

Options:

| option | default | meaning |
|---|---|---|
| path | (required) | the snapshot location (`snapshots.url`): any fsspec URL |
| table | records | `records`: one row per record of one snapshot; `subscriptions`: one row per |
| | | subscription per snapshot (the manifests' cursors); `topics`: one per topic per snapshot |
| snapshot | latest | `records`: the snapshot id to read (`latest`: the newest) |
| topic | all | a glob over topic and partition names (`/default/orders*`) |
| from, to | all | `subscriptions`/`topics`: snapshots taken in [from, to] (ms since the epoch) |
| payload | false | `records`: add the `payload` column; the snapshot must hold payloads |
| | | (`snapshots.include_payloads` on when it was taken), else the read is refused |

`records` has a Kafka-like schema (`RECORDS_SCHEMA`); its partitions are the snapshot's
Parquet files, read on the executors through fsspec as Arrow batches. A file that is
missing or damaged fails the read with an error naming it. Batch reads only:
`spark.readStream` is refused at once (`streamReader`).

Importing this module points Spark's Python workers at this interpreter
(`PYSPARK_PYTHON`, unless set), which has danube-zmq: Spark's default, the first
`python3` on the PATH, usually has not, and its workers then fail to unpickle the data
source with `ModuleNotFoundError`.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark import SparkContext
from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.types import StructType

from danube_zmq.report.records import read_batches, topic_matches
from danube_zmq.snapshots.manifest import Manifest
from danube_zmq.snapshots.store import SnapshotStore, select_manifests
from danube_zmq.transport.errors import FailedPrecondition, InvalidArgument, NotFound

__all__ = ["RECORDS_SCHEMA", "SUBSCRIPTIONS_SCHEMA", "TOPICS_SCHEMA", "SnapshotDataSource"]

RECORDS_SCHEMA = (
    "topic STRING, partition INT, offset BIGINT, publish_time TIMESTAMP, key STRING, size INT, record_bytes INT,"
    " producer_id BIGINT, producer STRING, attributes MAP<STRING, STRING>, schema_id BIGINT, schema_version INT"
)
SUBSCRIPTIONS_SCHEMA = (
    "snapshot_id STRING, snapshot_time TIMESTAMP, topic STRING, base_topic STRING, partition INT,"
    " subscription STRING, sub_type STRING, cursor BIGINT, acked_above ARRAY<BIGINT>, unacked BIGINT,"
    " consumers ARRAY<STRING>, backlog_messages BIGINT, log_start_offset BIGINT, end_offset BIGINT"
)
TOPICS_SCHEMA = (
    "snapshot_id STRING, snapshot_time TIMESTAMP, topic STRING, base_topic STRING, partition INT,"
    " log_start_offset BIGINT, end_offset BIGINT, messages_in BIGINT, records BIGINT, record_bytes BIGINT, files INT"
)
_TABLES = {"records": RECORDS_SCHEMA, "subscriptions": SUBSCRIPTIONS_SCHEMA, "topics": TOPICS_SCHEMA}
# What Spark expects of the Arrow batches `read` yields: every field nullable, timestamps
# in microseconds (the files hold milliseconds), a map's entries named `entries`.
_SPARK_ARROW = pa.schema([
    ("topic", pa.string()), ("partition", pa.int32()), ("offset", pa.int64()),
    ("publish_time", pa.timestamp("us", tz="UTC")), ("key", pa.string()), ("size", pa.int32()),
    ("record_bytes", pa.int32()), ("producer_id", pa.int64()), ("producer", pa.string()),
    ("attributes", pa.map_(pa.string(), pa.string())), ("schema_id", pa.int64()), ("schema_version", pa.int32()),
])
_SPARK_ARROW_PAYLOAD = _SPARK_ARROW.append(pa.field("payload", pa.binary()))


def _workers_run_this_interpreter() -> None:
    """`PYSPARK_PYTHON` for sessions started after this import; a context already running
    with Spark's default (`python3`, PYSPARK_PYTHON unset) registers data sources with its
    `pythonExec`, so that is pointed here too."""
    if os.environ.get("PYSPARK_PYTHON"):
        return
    os.environ["PYSPARK_PYTHON"] = sys.executable
    context = SparkContext._active_spark_context
    if context is not None and context.pythonExec == "python3":
        context.pythonExec = sys.executable


_workers_run_this_interpreter()


def _flag(options: dict[str, str], name: str) -> bool:
    value = str(options.get(name, "false")).strip().lower()
    if value not in ("true", "false"):
        raise InvalidArgument(f"danube data source option {name!r} is true or false, not {value!r}")
    return value == "true"


def _time_option(options: dict[str, str], name: str) -> int | None:
    value = options.get(name)
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        raise InvalidArgument(f"danube data source option {name!r} is ms since the epoch, not {value!r}") from None


@dataclass(frozen=True)
class _FilePartition(InputPartition):  # type: ignore[misc]
    path: str
    topic: str


@dataclass(frozen=True)
class _ManifestPartition(InputPartition):  # type: ignore[misc]
    snapshot_ids: tuple[str, ...]


class SnapshotDataSource(DataSource):  # type: ignore[misc]
    @classmethod
    def name(cls) -> str:
        return "danube_snapshots"  # `danube` reads the topics themselves (danube_zmq.spark)

    def schema(self) -> str:
        table = self.options.get("table", "records")
        if table not in _TABLES:
            raise InvalidArgument(f"danube data source table {table!r}: expected records, subscriptions or topics")
        schema = _TABLES[table]
        return schema + ", payload BINARY" if table == "records" and _flag(self.options, "payload") else schema

    def reader(self, schema: StructType) -> DataSourceReader:
        return _Reader(dict(self.options))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        # Spark falls back to simpleStreamReader when this is not implemented, and that
        # fails later, inside start(), with an internal error naming neither.
        raise InvalidArgument("the danube data source reads snapshots in batch only, not as a stream:"
                              " use spark.read.format('danube_snapshots'), not spark.readStream")

    simpleStreamReader = streamReader


class _Reader(DataSourceReader):  # type: ignore[misc]
    def __init__(self, options: dict[str, str]) -> None:
        url = options.get("path")
        if not url:
            raise InvalidArgument("the danube data source needs option('path', <snapshot location URL>)")
        self.url = url
        self.table = options.get("table", "records")
        self.snapshot = options.get("snapshot", "latest")
        self.pattern = options.get("topic")
        self.payload = _flag(options, "payload")
        self.from_ms = _time_option(options, "from")
        self.to_ms = _time_option(options, "to")

    def partitions(self) -> list[InputPartition]:
        store = SnapshotStore(self.url)
        if self.table == "records":
            manifest = self._records_manifest(store)
            files = [_FilePartition(f.path, t.topic) for t in manifest.topics if topic_matches(t, self.pattern)
                     for f in t.files]
            return files or [_ManifestPartition(())]
        ids = tuple(m.snapshot_id for m in select_manifests(store, self.from_ms, self.to_ms))
        return [_ManifestPartition(ids[i:i + 64]) for i in range(0, len(ids), 64)] or [_ManifestPartition(())]

    def _records_manifest(self, store: SnapshotStore) -> Manifest:
        if self.snapshot != "latest":
            manifest = store.manifest(self.snapshot)
        else:
            ids = store.snapshot_ids()
            if not ids:
                raise NotFound(f"no snapshot at {self.url}")
            manifest = store.manifest(ids[-1])
        if self.payload and not manifest.include_payloads:
            raise FailedPrecondition(
                f"snapshot {manifest.snapshot_id} at {self.url} was taken without payloads, so option('payload',"
                " 'true') has none to read: turn snapshots.include_payloads on in the brokers' config"
                " (DANUBE_SNAPSHOTS__INCLUDE_PAYLOADS=true) and take a new snapshot")
        return manifest

    def read(self, partition: InputPartition) -> Iterator[Any]:
        store = SnapshotStore(self.url)
        if isinstance(partition, _FilePartition):
            yield from self._read_file(store, partition)
            return
        for snapshot_id in partition.snapshot_ids:
            manifest = store.manifest(snapshot_id)
            yield from (_subscription_rows if self.table == "subscriptions" else _topic_rows)(manifest, self.pattern)

    def _read_file(self, store: SnapshotStore, partition: _FilePartition) -> Iterator[pa.RecordBatch]:
        target = _SPARK_ARROW_PAYLOAD if self.payload else _SPARK_ARROW
        for batch in read_batches(store, partition.path, partition.topic, target.names):
            yield batch.cast(target)


def _time(manifest: Manifest) -> Any:
    import datetime

    return datetime.datetime.fromtimestamp(manifest.created_ms / 1000, tz=datetime.UTC)


def _subscription_rows(manifest: Manifest, pattern: str | None) -> Iterator[tuple[Any, ...]]:
    when = _time(manifest)
    for t in manifest.topics:
        if not topic_matches(t, pattern):
            continue
        for s in t.subscriptions:
            yield (manifest.snapshot_id, when, t.topic, t.base_topic, t.partition, s.name, s.sub_type, s.cursor,
                   s.acked_above, s.unacked, s.consumers, s.backlog_messages, t.log_start_offset, t.end_offset)


def _topic_rows(manifest: Manifest, pattern: str | None) -> Iterator[tuple[Any, ...]]:
    when = _time(manifest)
    for t in manifest.topics:
        if topic_matches(t, pattern):
            yield (manifest.snapshot_id, when, t.topic, t.base_topic, t.partition, t.log_start_offset, t.end_offset,
                   t.messages_in, t.records, sum(f.record_bytes for f in t.files), len(t.files))

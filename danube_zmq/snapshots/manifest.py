"""What a WAL snapshot is: its manifest, and where its files live under the snapshot URL.

    {url}/segments/{ns}/{topic}/{base:020d}-{last:020d}[.payloads].parquet   a sealed segment's
                                         records; written once, shared by every snapshot
                                         that covers the segment
    {url}/snapshots/{id}/tail/{ns}/{topic}/{base:020d}-{last:020d}.parquet
                                         the records of the active segment up to the cut
    {url}/snapshots/{id}/manifest.json   written last: a snapshot without one is unfinished

A manifest holds, per reliable topic (partition): the cut (`end_offset`, the topic's
next offset when the snapshot was taken: every record below it is in the files), the
files covering `[log_start_offset, end_offset)` in offset order, and every subscription
as it was at the cut (cursor: the last offset acknowledged with all below it; offsets
acknowledged above the cursor; messages in flight; consumers). A topic that could not
be exported (a damaged segment) is left out and named in `errors`. Snapshot ids sort
by time: `20261121T230102.123Z-n<cluster node id>`.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from danube_zmq.transport.errors import InvalidArgument

__all__ = [
    "FORMAT",
    "FileRef",
    "Manifest",
    "SubscriptionState",
    "TopicState",
    "manifest_path",
    "new_snapshot_id",
    "segment_path",
    "tail_path",
]

FORMAT = 1
SNAPSHOTS_DIR = "snapshots"
SEGMENTS_DIR = "segments"
MANIFEST = "manifest.json"


def new_snapshot_id(now_ms: int, node_id: int) -> str:
    """Sortable by time; the suffix is the broker's cluster node id, stable across its
    restarts (retention keeps each broker's own newest snapshots)."""
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(now_ms / 1000))
    return f"{stamp}.{now_ms % 1000:03d}Z-n{node_id}"


def _topic_dir(topic: str) -> str:
    return topic.strip("/")


def _span(base_offset: int, last_offset: int, payloads: bool) -> str:
    return f"{base_offset:020d}-{last_offset:020d}{'.payloads' if payloads else ''}.parquet"


def segment_path(topic: str, base_offset: int, last_offset: int, payloads: bool) -> str:
    return f"{SEGMENTS_DIR}/{_topic_dir(topic)}/{_span(base_offset, last_offset, payloads)}"


def tail_path(snapshot_id: str, topic: str, base_offset: int, last_offset: int, payloads: bool) -> str:
    return f"{SNAPSHOTS_DIR}/{snapshot_id}/tail/{_topic_dir(topic)}/{_span(base_offset, last_offset, payloads)}"


def manifest_path(snapshot_id: str) -> str:
    return f"{SNAPSHOTS_DIR}/{snapshot_id}/{MANIFEST}"


@dataclass(frozen=True, slots=True)
class FileRef:
    """One Parquet file of records `base_offset ..= last_offset` (relative `path`)."""

    path: str
    base_offset: int
    last_offset: int
    records: int
    record_bytes: int  # the records' bytes in the WAL, headers included
    shared: bool  # a sealed segment's file (kept while a manifest names it)


@dataclass(frozen=True, slots=True)
class SubscriptionState:
    name: str
    sub_type: str
    cursor: int  # -1: nothing acknowledged
    acked_above: list[int]
    unacked: int
    consumers: list[str]
    backlog_messages: int  # the broker's own count at the cut

    def backlog_offsets(self, end_offset: int) -> int:
        """Records after the cursor and before the cut, not acknowledged individually."""
        return max(0, end_offset - 1 - self.cursor - sum(1 for o in self.acked_above if o < end_offset))


@dataclass(frozen=True, slots=True)
class TopicState:
    topic: str  # the partition's name (the topic's own when not partitioned)
    base_topic: str
    partition: int | None
    log_start_offset: int
    end_offset: int
    messages_in: int
    producers: list[str]
    files: list[FileRef] = field(default_factory=list)
    subscriptions: list[SubscriptionState] = field(default_factory=list)

    @property
    def records(self) -> int:
        return sum(f.records for f in self.files)


@dataclass(frozen=True, slots=True)
class Manifest:
    snapshot_id: str
    created_ms: int
    broker_id: int
    broker_url: str
    include_payloads: bool
    topics: list[TopicState]
    errors: list[str] = field(default_factory=list)  # topics left out, and why
    format: int = FORMAT

    @property
    def records(self) -> int:
        return sum(t.records for t in self.topics)

    @property
    def record_bytes(self) -> int:
        return sum(f.record_bytes for t in self.topics for f in t.files)

    @property
    def files(self) -> list[FileRef]:
        return [f for t in self.topics for f in t.files]

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, sort_keys=True)

    @staticmethod
    def from_json(text: str | bytes, where: str) -> Manifest:
        """Parse a manifest; anything malformed is an `InvalidArgument` naming `where`."""
        try:
            raw = json.loads(text)
            if raw.get("format") != FORMAT:
                raise InvalidArgument(f"snapshot manifest {where} has format {raw.get('format')!r}; this"
                                      f" version reads format {FORMAT}")
            topics = [_topic(t) for t in raw["topics"]]
            return Manifest(snapshot_id=str(raw["snapshot_id"]), created_ms=int(raw["created_ms"]),
                            broker_id=int(raw["broker_id"]), broker_url=str(raw["broker_url"]),
                            include_payloads=bool(raw["include_payloads"]), topics=topics,
                            errors=[str(e) for e in raw.get("errors", [])])
        except InvalidArgument:
            raise
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise InvalidArgument(f"snapshot manifest {where} is not valid: {type(exc).__name__}: {exc}") from None


def _topic(raw: dict[str, Any]) -> TopicState:
    return TopicState(
        topic=str(raw["topic"]), base_topic=str(raw["base_topic"]),
        partition=None if raw["partition"] is None else int(raw["partition"]),
        log_start_offset=int(raw["log_start_offset"]), end_offset=int(raw["end_offset"]),
        messages_in=int(raw["messages_in"]), producers=[str(p) for p in raw["producers"]],
        files=[FileRef(path=str(f["path"]), base_offset=int(f["base_offset"]), last_offset=int(f["last_offset"]),
                       records=int(f["records"]), record_bytes=int(f["record_bytes"]), shared=bool(f["shared"]))
               for f in raw["files"]],
        subscriptions=[SubscriptionState(name=str(s["name"]), sub_type=str(s["sub_type"]), cursor=int(s["cursor"]),
                                         acked_above=[int(o) for o in s["acked_above"]], unacked=int(s["unacked"]),
                                         consumers=[str(c) for c in s["consumers"]],
                                         backlog_messages=int(s["backlog_messages"]))
                       for s in raw["subscriptions"]],
    )

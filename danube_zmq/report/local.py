"""The backlog report in plain Python (pyarrow over the snapshot's Parquet files, no JVM):
the same rows as Spark's `compute_backlog`, for snapshots small enough that Spark's
start-up would be most of the wall time.

1. The manifests of the window (`select_window`), the newest one's topics.
2. Each records file of the newest snapshot, one Arrow batch at a time: per subscription
   of its topic, the records after the cursor and not acknowledged above it (count,
   bytes, oldest publish time). Memory holds one batch, not the snapshot.
3. From every manifest of the window: backlog per snapshot, produce and consume rates
   per minute (the step from the partition's previous snapshot, as Spark's `lag`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc

from danube_zmq.report.backlog import (
    BacklogReport,
    SubscriptionTotals,
    TopicTotals,
    assemble,
    select_window,
)
from danube_zmq.report.records import read_batches, topic_matches
from danube_zmq.snapshots.manifest import Manifest, SubscriptionState
from danube_zmq.snapshots.store import SnapshotStore

__all__ = ["compute_backlog_python"]

_MINUTE_MS = 60_000


@dataclass
class _Unacked:
    messages: int = 0
    bytes: int = 0
    oldest_ms: int | None = None


@dataclass
class _SubscriptionSum:
    sub_type: str
    partitions: int = 0
    unacked: int = 0
    consumers: set[str] = field(default_factory=set)
    backlog: _Unacked = field(default_factory=_Unacked)


def compute_backlog_python(url: str, *, from_ms: int | None = None, to_ms: int | None = None,
                           topic: str | None = None, top: int = 10,
                           progress: Callable[[str], None] | None = None) -> BacklogReport:
    """The report over the snapshots at `url` taken in [from_ms, to_ms], computed here."""
    def step(text: str) -> None:
        if progress is not None:
            progress(text)

    step("reading snapshot manifests")
    store = SnapshotStore(url)
    manifests = select_window(store, from_ms, to_ms, topic)
    latest = manifests[-1]
    step(f"computing backlog from {latest.records:,} records of snapshot {latest.snapshot_id}")
    current: dict[tuple[str, str], _SubscriptionSum] = {}
    growth: dict[str, TopicTotals] = {}
    for t in (t for t in latest.topics if topic_matches(t, topic)):
        sums = []
        for s in t.subscriptions:
            total = current.setdefault((t.base_topic, s.name), _SubscriptionSum(sub_type=s.sub_type))
            total.partitions += 1
            total.unacked += s.unacked
            total.consumers.update(s.consumers)
            sums.append((s, total.backlog))
        for file in t.files:
            for batch in read_batches(store, file.path, t.topic, ["offset", "record_bytes", "publish_time"]):
                for s, backlog in sums:
                    _count_unacked(batch, s, backlog)
        before = growth.get(t.base_topic)
        growth[t.base_topic] = TopicTotals(
            topic=t.base_topic, partitions=1 + (before.partitions if before else 0),
            end_offset=t.end_offset + (before.end_offset if before else 0),
            records=t.records + (before.records if before else 0),
            record_bytes=sum(f.record_bytes for f in t.files) + (before.record_bytes if before else 0))

    step(f"computing rates over {len(manifests)} snapshots")
    backlog_series, consume_series, produce_series = _series(manifests, topic)
    return assemble(
        url, manifests, from_ms=from_ms, to_ms=to_ms, topic=topic, top=top, engine="python",
        current=[SubscriptionTotals(topic=base, subscription=name, sub_type=s.sub_type, partitions=s.partitions,
                                    unacked=s.unacked, consumers=sorted(s.consumers),
                                    backlog_messages=s.backlog.messages, backlog_bytes=s.backlog.bytes,
                                    oldest_unacked_ms=s.backlog.oldest_ms)
                 for (base, name), s in current.items()],
        growth=list(growth.values()), backlog_series=backlog_series, consume_series=consume_series,
        produce_series=produce_series)


def _count_unacked(batch: pa.RecordBatch, subscription: SubscriptionState, into: _Unacked) -> None:
    offsets = batch.column("offset")
    after = pc.greater(offsets, subscription.cursor)
    if subscription.acked_above:
        after = pc.and_(after, pc.invert(pc.is_in(offsets, value_set=pa.array(subscription.acked_above, pa.int64()))))
    messages = pc.sum(after).as_py() or 0
    if not messages:
        return
    into.messages += messages
    into.bytes += pc.sum(pc.filter(batch.column("record_bytes"), after)).as_py() or 0
    oldest = pc.min(pc.filter(batch.column("publish_time"), after).cast(pa.int64())).as_py()
    if oldest is not None and (into.oldest_ms is None or oldest < into.oldest_ms):
        into.oldest_ms = oldest


def _seconds(manifest: Manifest) -> float:
    # As Spark casts the snapshot's timestamp to double: seconds, the same float.
    return manifest.created_ms / 1000.0


def _series(manifests: list[Manifest], pattern: str | None) -> tuple[
        dict[str, list[tuple[int, int]]], dict[str, list[tuple[int, float]]], dict[str, list[tuple[int, float]]]]:
    """Backlog per snapshot, consume and produce rates per minute, oldest first: each
    partition's step is from its own previous snapshot in the window."""
    backlog: dict[str, dict[int, int]] = {}
    # name -> snapshot ms -> [messages, minutes] (partitions' messages summed, their minutes the longest)
    consumed: dict[str, dict[int, list[float]]] = {}
    produced: dict[str, dict[int, list[float]]] = {}
    last_sub: dict[tuple[str, str], tuple[float, int]] = {}  # (partition, subscription) -> (seconds, acked)
    last_topic: dict[str, tuple[float, int]] = {}  # partition -> (seconds, end offset)
    for manifest in sorted(manifests, key=lambda m: m.created_ms):
        now_s = _seconds(manifest)
        for t in (t for t in manifest.topics if topic_matches(t, pattern)):
            for s in t.subscriptions:
                name = f"{t.base_topic}:{s.name}"
                per_time = backlog.setdefault(name, {})
                per_time[manifest.created_ms] = per_time.get(manifest.created_ms, 0) + s.backlog_offsets(t.end_offset)
                acked = s.cursor + 1 + len(s.acked_above)
                previous = last_sub.get((t.topic, s.name))
                last_sub[(t.topic, s.name)] = (now_s, acked)
                if previous is not None:
                    _add_step(consumed, name, manifest.created_ms, acked - previous[1], (now_s - previous[0]) / 60.0)
            previous_end = last_topic.get(t.topic)
            last_topic[t.topic] = (now_s, t.end_offset)
            if previous_end is not None:
                _add_step(produced, t.base_topic, manifest.created_ms, t.end_offset - previous_end[1],
                          (now_s - previous_end[0]) / 60.0)
    backlog_series = {name: sorted(points.items()) for name, points in backlog.items()}
    return backlog_series, _per_minute(consumed), _per_minute(produced)


def _add_step(into: dict[str, dict[int, list[float]]], name: str, at_ms: int, messages: int, minutes: float) -> None:
    if minutes <= 0:
        return
    step = into.setdefault(name, {}).setdefault(at_ms, [0, 0.0])
    step[0] += messages
    step[1] = max(step[1], minutes)


def _per_minute(steps: dict[str, dict[int, list[float]]]) -> dict[str, list[tuple[int, float]]]:
    """Per name and minute: the messages of the steps ending in that minute over their minutes."""
    out: dict[str, list[tuple[int, float]]] = {}
    for name, per_snapshot in steps.items():
        minutes: dict[int, list[float]] = {}
        for at_ms, (messages, span) in sorted(per_snapshot.items()):
            bucket = minutes.setdefault(at_ms - at_ms % _MINUTE_MS, [0, 0.0])
            bucket[0] += messages
            bucket[1] += span
        out[name] = [(minute, round(messages / span, 2)) for minute, (messages, span) in sorted(minutes.items())]
    return out

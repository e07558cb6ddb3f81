"""The backlog report: which subscriptions fall behind, by how much, since when, and how
fast each topic grows, computed from WAL snapshots by one of two engines giving the same
rows: Spark (`compute_backlog`, here) or plain Python over the same files
(`report/local.py`, no JVM: for small snapshots).

From the newest snapshot in the window (record by record, `danube` data source):
- backlog of each subscription: records after its cursor and not acknowledged
  individually (messages, and bytes as the records take in the WAL), summed over the
  topic's partitions; the oldest such record's publish time, and its age at the
  snapshot.

From every snapshot in the window (the manifests: `subscriptions` and `topics` tables):
- backlog over time per subscription, and its trend (messages per minute, first to last);
- produce rate per topic and consume rate per subscription, per minute: the growth of the
  topic's end offset and of the subscription's acknowledged offsets between consecutive
  snapshots, summed over partitions and divided by the minutes between them.

Top lagging: the subscriptions with the largest backlog.
"""

from __future__ import annotations

import datetime
from dataclasses import asdict, dataclass, field
from typing import Any

from danube_zmq.report.records import topic_matches
from danube_zmq.snapshots.manifest import Manifest
from danube_zmq.snapshots.store import SnapshotStore, select_manifests
from danube_zmq.transport.errors import NotFound

__all__ = ["BacklogReport", "SubscriptionBacklog", "SubscriptionTotals", "TopicGrowth", "TopicTotals", "assemble",
           "compute_backlog", "select_window"]


@dataclass(frozen=True, slots=True)
class SubscriptionBacklog:
    topic: str  # the base topic (partitions summed)
    subscription: str
    sub_type: str
    partitions: int
    backlog_messages: int
    backlog_bytes: int
    oldest_unacked_ms: int | None  # publish time of the oldest record not yet acknowledged
    oldest_unacked_age_s: float | None  # its age when the snapshot was taken
    unacked: int  # delivered, awaiting acknowledgement
    consumers: list[str]
    consume_rate_per_min: float | None  # in the last minute with two snapshots
    backlog_trend_per_min: float | None  # + grows, - shrinks (first to last snapshot of the window)

    @property
    def name(self) -> str:
        return f"{self.topic}:{self.subscription}"


@dataclass(frozen=True, slots=True)
class TopicGrowth:
    topic: str
    partitions: int
    end_offset: int  # sum of the partitions' next offsets: messages ever produced
    records: int  # records the snapshot holds (after retention)
    record_bytes: int
    produce_rate_per_min: float | None  # in the last minute with two snapshots


@dataclass
class BacklogReport:
    url: str
    snapshot_id: str
    snapshot_ms: int
    snapshots: int  # in the window
    from_ms: int | None
    to_ms: int | None
    topic_pattern: str | None
    engine: str  # which engine computed it: "python", or "spark (MASTER)"
    subscriptions: list[SubscriptionBacklog]
    topics: list[TopicGrowth]
    top_lagging: list[str]
    # name -> [(ms, value)], oldest first
    backlog_series: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    produce_series: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    consume_series: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        for key in ("backlog_series", "produce_series", "consume_series"):
            out[key] = {name: [{"time_ms": t, "value": v} for t, v in points] for name, points in out[key].items()}
        return out


@dataclass(frozen=True, slots=True)
class SubscriptionTotals:
    """One subscription at the newest snapshot, its partitions summed: what an engine computes."""

    topic: str
    subscription: str
    sub_type: str
    partitions: int
    unacked: int
    consumers: list[str]  # sorted, distinct
    backlog_messages: int
    backlog_bytes: int
    oldest_unacked_ms: int | None


@dataclass(frozen=True, slots=True)
class TopicTotals:
    """One topic at the newest snapshot, its partitions summed."""

    topic: str
    partitions: int
    end_offset: int
    records: int
    record_bytes: int


def _ms(value: datetime.datetime | None) -> int | None:
    return None if value is None else round(value.timestamp() * 1000)


def select_window(store: SnapshotStore, from_ms: int | None, to_ms: int | None, topic: str | None) -> list[Manifest]:
    """The snapshots in the window, oldest first; `NotFound` when there is none, or no
    topic matches the glob."""
    manifests = select_manifests(store, from_ms, to_ms)
    if not manifests:
        raise NotFound(f"no snapshot at {store.url}" + (" in the given time window" if from_ms or to_ms else ""))
    if topic is not None and not any(topic_matches(t, topic) for m in manifests for t in m.topics):
        raise NotFound(f"no topic matching {topic!r} in the snapshots at {store.url}")
    return manifests


def assemble(url: str, manifests: list[Manifest], *, from_ms: int | None, to_ms: int | None, topic: str | None,
             top: int, engine: str, current: list[SubscriptionTotals], growth: list[TopicTotals],
             backlog_series: dict[str, list[tuple[int, int]]], consume_series: dict[str, list[tuple[int, float]]],
             produce_series: dict[str, list[tuple[int, float]]]) -> BacklogReport:
    """The report from what an engine computed (the same code after either engine)."""
    latest = manifests[-1]
    rows = []
    for totals in current:
        name = f"{totals.topic}:{totals.subscription}"
        oldest = totals.oldest_unacked_ms
        series = backlog_series.get(name, [])
        trend = None
        if len(series) > 1 and series[-1][0] > series[0][0]:
            trend = round((series[-1][1] - series[0][1]) / ((series[-1][0] - series[0][0]) / 60_000), 2)
        consumed = consume_series.get(name)
        rows.append(SubscriptionBacklog(
            topic=totals.topic, subscription=totals.subscription, sub_type=totals.sub_type,
            partitions=totals.partitions, backlog_messages=totals.backlog_messages,
            backlog_bytes=totals.backlog_bytes, oldest_unacked_ms=oldest,
            oldest_unacked_age_s=None if oldest is None else round((latest.created_ms - oldest) / 1000, 3),
            unacked=totals.unacked, consumers=totals.consumers,
            consume_rate_per_min=consumed[-1][1] if consumed else None, backlog_trend_per_min=trend))
    rows.sort(key=lambda r: (-r.backlog_messages, r.name))
    topics = [TopicGrowth(topic=g.topic, partitions=g.partitions, end_offset=g.end_offset, records=g.records,
                          record_bytes=g.record_bytes,
                          produce_rate_per_min=produce_series[g.topic][-1][1] if produce_series.get(g.topic) else None)
              for g in sorted(growth, key=lambda g: g.topic)]
    return BacklogReport(
        url=url, snapshot_id=latest.snapshot_id, snapshot_ms=latest.created_ms, snapshots=len(manifests),
        from_ms=from_ms, to_ms=to_ms, topic_pattern=topic, engine=engine, subscriptions=rows, topics=topics,
        top_lagging=[r.name for r in rows if r.backlog_messages > 0][:top],
        backlog_series=backlog_series, produce_series=produce_series, consume_series=consume_series,
        errors=[f"{m.snapshot_id}: {e}" for m in manifests for e in m.errors],
    )


def compute_backlog(spark: Any, url: str, *, from_ms: int | None = None, to_ms: int | None = None,
                    topic: str | None = None, top: int = 10, progress: Any = None) -> BacklogReport:
    """The report over the snapshots at `url` taken in [from_ms, to_ms], computed by Spark."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    def step(text: str) -> None:
        if progress is not None:
            progress(text)

    step("reading snapshot manifests")
    manifests = select_window(SnapshotStore(url), from_ms, to_ms, topic)
    latest = manifests[-1]

    def read(table: str, **options: str | None) -> Any:
        reader = spark.read.format("danube_snapshots").option("path", url).option("table", table)
        for key, value in {"topic": topic, **options}.items():
            if value is not None:
                reader = reader.option(key, value)
        return reader.load()

    window = {"from": None if from_ms is None else str(from_ms), "to": None if to_ms is None else str(to_ms)}
    subs_all = read("subscriptions", **window).cache()
    topics_all = read("topics", **window).cache()
    subs = subs_all.where(F.col("snapshot_id") == latest.snapshot_id)

    step(f"computing backlog from {latest.records:,} records of snapshot {latest.snapshot_id}")
    records = read("records", snapshot=latest.snapshot_id).select("topic", "offset", "record_bytes", "publish_time")
    unacked = (
        subs.select("topic", "base_topic", "subscription", "cursor", "acked_above")
        .join(records, "topic")
        .where((F.col("offset") > F.col("cursor")) & ~F.array_contains(F.col("acked_above"), F.col("offset")))
        .groupBy("base_topic", "subscription")
        .agg(F.count(F.lit(1)).alias("backlog_messages"), F.sum("record_bytes").alias("backlog_bytes"),
             F.min("publish_time").alias("oldest_unacked"))
    )
    current = (
        subs.groupBy("base_topic", "subscription")
        .agg(F.first("sub_type").alias("sub_type"), F.count(F.lit(1)).alias("partitions"),
             F.sum("unacked").alias("unacked"), F.array_sort(F.array_distinct(F.flatten(F.collect_list("consumers"))))
             .alias("consumers"))
        .join(unacked, ["base_topic", "subscription"], "left")
        .collect()
    )

    step(f"computing rates over {len(manifests)} snapshots")
    minutes = (F.col("snapshot_time").cast("double") - F.lag(F.col("snapshot_time").cast("double")).over(
        Window.partitionBy("topic", "subscription").orderBy("snapshot_time"))) / 60.0
    acked = F.col("cursor") + 1 + F.size(F.col("acked_above"))
    in_backlog = F.col("end_offset") - 1 - F.col("cursor") - F.size(F.filter("acked_above", lambda o: o < F.col("end_offset")))
    sub_steps = (
        subs_all.withColumn("acked", acked)
        .withColumn("backlog", F.greatest(F.lit(0), in_backlog))
        .withColumn("minutes", minutes)
        .withColumn("consumed", acked - F.lag(acked).over(
            Window.partitionBy("topic", "subscription").orderBy("snapshot_time")))
    )
    backlog_points = (sub_steps.groupBy("base_topic", "subscription", "snapshot_time")
                      .agg(F.sum("backlog").alias("backlog")).orderBy("snapshot_time").collect())
    consume_points = _per_minute(sub_steps.where(F.col("minutes") > 0), ["base_topic", "subscription"], "consumed", F)
    topic_minutes = (F.col("snapshot_time").cast("double") - F.lag(F.col("snapshot_time").cast("double")).over(
        Window.partitionBy("topic").orderBy("snapshot_time"))) / 60.0
    topic_steps = (topics_all.withColumn("minutes", topic_minutes)
                   .withColumn("produced", F.col("end_offset") - F.lag("end_offset").over(
                       Window.partitionBy("topic").orderBy("snapshot_time"))))
    produce_points = _per_minute(topic_steps.where(F.col("minutes") > 0), ["base_topic"], "produced", F)
    growth = (topics_all.where(F.col("snapshot_id") == latest.snapshot_id).groupBy("base_topic")
              .agg(F.count(F.lit(1)).alias("partitions"), F.sum("end_offset").alias("end_offset"),
                   F.sum("records").alias("records"), F.sum("record_bytes").alias("record_bytes"))
              .orderBy("base_topic").collect())
    subs_all.unpersist()
    topics_all.unpersist()

    backlog_series: dict[str, list[tuple[int, int]]] = {}
    for row in backlog_points:
        backlog_series.setdefault(f"{row.base_topic}:{row.subscription}", []).append(
            (_ms(row.snapshot_time) or 0, int(row.backlog)))
    return assemble(
        url, manifests, from_ms=from_ms, to_ms=to_ms, topic=topic, top=top,
        engine=f"spark ({spark.sparkContext.master})",
        current=[SubscriptionTotals(
            topic=row.base_topic, subscription=row.subscription, sub_type=row.sub_type, partitions=row.partitions,
            unacked=int(row.unacked or 0), consumers=list(row.consumers or []),
            backlog_messages=int(row.backlog_messages or 0), backlog_bytes=int(row.backlog_bytes or 0),
            oldest_unacked_ms=_ms(row.oldest_unacked)) for row in current],
        growth=[TopicTotals(topic=g.base_topic, partitions=g.partitions, end_offset=int(g.end_offset),
                            records=int(g.records), record_bytes=int(g.record_bytes)) for g in growth],
        backlog_series=backlog_series,
        consume_series={f"{k[0]}:{k[1]}": v for k, v in consume_points.items()},
        produce_series={k[0]: v for k, v in produce_points.items()})


def _per_minute(steps: Any, keys: list[str], delta: str, F: Any) -> dict[tuple[str, ...], list[tuple[int, float]]]:
    """Per key and minute: the messages of the snapshot-to-snapshot steps ending in that
    minute over their minutes (partitions of one snapshot share its step)."""
    per_snapshot = (steps.groupBy(*keys, "snapshot_time")
                    .agg(F.sum(delta).alias("delta"), F.max("minutes").alias("minutes"))
                    .withColumn("minute", F.date_trunc("minute", "snapshot_time")))
    rows = (per_snapshot.groupBy(*keys, "minute")
            .agg((F.sum("delta") / F.sum("minutes")).alias("rate"))
            .orderBy("minute").collect())
    out: dict[tuple[str, ...], list[tuple[int, float]]] = {}
    for row in rows:
        out.setdefault(tuple(row[k] for k in keys), []).append((_ms(row.minute) or 0, round(float(row.rate), 2)))
    return out

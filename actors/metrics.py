"""Prometheus metrics of a broker process (served on `broker.metrics_port`).

Names follow Danube's (`danube_topic_messages_in_total`, ...) and Prometheus'
conventions: base units, `_total` on counters, no per-message or per-client labels.
Actors update these sinks as they work; the HTTP server only reads them.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import Counter, Gauge


@dataclass(frozen=True, slots=True)
class _Metrics:
    connections: Gauge
    bad_frames: Counter
    frames_dropped: Counter
    topics: Gauge
    messages_in: Counter
    bytes_in: Counter
    messages_out: Counter
    messages_dropped: Counter
    actor_failures: Counter
    wal_flushes: Counter
    wal_records: Counter


METRICS = _Metrics(
    connections=Gauge("danube_broker_connections", "Client connections open"),
    bad_frames=Counter("danube_broker_bad_frames_total", "Client frames rejected as malformed"),
    frames_dropped=Counter("danube_broker_frames_dropped_total",
                           "Frames to clients dropped because the client was gone or its queue full"),
    topics=Gauge("danube_broker_topics_owned", "Topics (partitions) served by this broker"),
    messages_in=Counter("danube_topic_messages_in_total", "Messages published", ["topic"]),
    bytes_in=Counter("danube_topic_bytes_in_total", "Payload bytes published", ["topic"]),
    messages_out=Counter("danube_subscription_messages_out_total", "Messages delivered to consumers",
                         ["topic", "subscription"]),
    messages_dropped=Counter("danube_subscription_messages_dropped_total",
                             "Non-reliable messages dropped because the subscription's pending bound was reached",
                             ["topic", "subscription"]),
    actor_failures=Counter("danube_actor_failures_total", "Actor handlers that raised (each restarts the actor)"),
    wal_flushes=Counter("danube_wal_flushes_total",
                        "WAL group commits (one write and, with wal_sync always, one fsync each)"),
    wal_records=Counter("danube_wal_records_total", "Records committed to WALs"),
)

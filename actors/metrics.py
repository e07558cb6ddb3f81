"""Prometheus metrics of a broker process (served on `broker.metrics_port`).

Names follow Danube's (`danube_topic_messages_in_total`, ...) and Prometheus'
conventions: base units, `_total` on counters, no per-message or per-client labels.
Actors update these sinks as they work; the HTTP server only reads them.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from prometheus_client import REGISTRY, Counter, Gauge
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from danube_zmq.runtime.metrics import RUNTIME_METRICS

if TYPE_CHECKING:
    from danube_zmq.consensus.peer import RaftPeer


class Tally:
    """One label set's count: a plain integer the loop's thread adds to, read whole by
    the scrape thread (one attribute read under the GIL, no lock on either side)."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0

    def inc(self, amount: int = 1) -> None:
        self.value += amount


class ScrapeCounter:
    """A labelled counter for the per-message paths, exported at scrape time.

    prometheus_client's `Counter.inc` takes a lock for every increment, about a
    microsecond a batch over a topic's and a subscription's counters; here an increment
    is an integer add and the scrape reads the tallies. Only the event loop's thread
    increments; a label set's tally lives as long as the process, as a `Counter`
    child does, so a topic that moves away and back keeps counting up."""

    def __init__(self, name: str, documentation: str, labelnames: list[str]) -> None:
        self.name = name.removesuffix("_total")
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self._tallies: dict[tuple[str, ...], Tally] = {}
        REGISTRY.register(self)

    def labels(self, **labels: str) -> Tally:
        key = tuple(labels[name] for name in self.labelnames)
        tally = self._tallies.get(key)
        if tally is None:
            tally = self._tallies[key] = Tally()
        return tally

    def describe(self) -> list[Metric]:
        return [CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)]

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for key, tally in list(self._tallies.items()):  # one C call: the loop may add a label set meanwhile
            family.add_metric(key, tally.value)
        yield family


@dataclass(frozen=True, slots=True)
class _Metrics:
    connections: Gauge
    bad_frames: Counter
    frames_dropped: Counter
    topics: Gauge
    messages_in: ScrapeCounter
    bytes_in: ScrapeCounter
    messages_out: ScrapeCounter
    messages_dropped: ScrapeCounter
    actor_failures: Counter
    wal_flushes: Counter
    wal_records: Counter
    schema_mismatched: Counter
    schema_rejected: Counter
    wal_damaged_topics: Gauge
    wal_damage: Counter
    outbound_frames_refused: Counter
    consumers_paused: Counter
    outbound_connections_paused: Gauge
    outbound_queued_bytes: Gauge
    outbound_stalled: Counter
    idle_connections_cut: Counter
    inbound_overrun_cut: Counter
    inbound_budget_cut: Counter
    inbound_held_bytes: Gauge
    inbound_held_bytes_peak: Gauge
    inbound_held_bytes_at_cut_max: Gauge
    requests_refused: Counter


METRICS = _Metrics(
    connections=Gauge("danube_broker_connections", "Client connections open"),
    bad_frames=RUNTIME_METRICS.bad_frames,
    frames_dropped=RUNTIME_METRICS.frames_dropped,
    topics=Gauge("danube_broker_topics_owned", "Topics (partitions) served by this broker"),
    messages_in=ScrapeCounter("danube_topic_messages_in_total", "Messages published", ["topic"]),
    bytes_in=ScrapeCounter("danube_topic_bytes_in_total", "Payload bytes published", ["topic"]),
    messages_out=ScrapeCounter("danube_subscription_messages_out_total", "Messages delivered to consumers",
                         ["topic", "subscription"]),
    messages_dropped=ScrapeCounter("danube_subscription_messages_dropped_total",
                             "Non-reliable messages dropped because the subscription's pending bound was reached",
                             ["topic", "subscription"]),
    actor_failures=RUNTIME_METRICS.actor_failures,
    wal_flushes=Counter("danube_wal_flushes_total",
                        "WAL group commits (one write and, with wal_sync always, one fsync each)"),
    wal_records=Counter("danube_wal_records_total", "Records committed to WALs"),
    schema_mismatched=Counter("danube_topic_schema_mismatched_messages_total",
                              "Messages accepted without the topic's schema (validation policy warn)", ["topic"]),
    schema_rejected=Counter("danube_topic_schema_rejected_messages_total",
                            "Messages refused by the topic's validation policy or payload validation", ["topic"]),
    wal_damaged_topics=Gauge("danube_wal_damaged_topics",
                             "Reliable topics assigned here and not served because their WAL is damaged"),
    wal_damage=Counter("danube_wal_damage_total",
                       "Damaged WALs found at recovery (each also an ERROR naming file and byte)"),
    # Memory bounds of the client and admin ports (`port` is client or admin).
    outbound_frames_refused=Counter("danube_broker_outbound_frames_refused_total",
                                    "Frames to a connection dropped because its outbound byte budget, or the"
                                    " broker's, was spent", ["port"]),
    consumers_paused=Counter("danube_broker_consumers_paused_total",
                             "Consumers paused because their connection held more unsent bytes than half its budget"),
    outbound_connections_paused=Gauge("danube_broker_outbound_connections_paused",
                                      "Client connections paused now for their outbound byte budget"),
    outbound_queued_bytes=Gauge("danube_broker_outbound_queued_bytes",
                                "Bytes handed to ZeroMQ for client connections and not yet written to their sockets"),
    outbound_stalled=Counter("danube_broker_outbound_stalled_connections_total",
                             "Connections disconnected after outbound_stall_timeout_ms paused (not reading)", ["port"]),
    idle_connections_cut=Counter("danube_broker_idle_connections_cut_total",
                                 "Connections without a session (admin: with no request in flight) disconnected:"
                                 " evicted over connections_pending_max, or expired after connect_timeout_ms",
                                 ["port", "reason"]),
    inbound_overrun_cut=Counter("danube_broker_inbound_overrun_connections_total",
                                "Connections disconnected because ZeroMQ held more of their input than"
                                " inbound_bytes_per_connection_max (an unfinished multipart message)", ["port"]),
    # From the inbound watcher process's reports (actors/inbound_watch.py).
    inbound_budget_cut=Counter("danube_broker_inbound_budget_connections_total",
                               "Connections disconnected as the largest holders when ZeroMQ held more of all"
                               " connections' input than inbound_bytes_max", ["port"]),
    inbound_held_bytes=Gauge("danube_broker_inbound_held_bytes",
                             "Bytes ZeroMQ has read from all client and admin connections and not handed to the"
                             " broker, as last measured"),
    inbound_held_bytes_peak=Gauge("danube_broker_inbound_held_bytes_peak",
                                  "The largest danube_broker_inbound_held_bytes since the broker started"),
    inbound_held_bytes_at_cut_max=Gauge("danube_broker_inbound_held_bytes_at_cut_max",
                                        "The most bytes one connection held when it was cut for an inbound budget"
                                        " (the budget plus what arrived before the watcher saw it)"),
    requests_refused=Counter("danube_requests_refused_total",
                             "Requests refused by the permission check (security.mode curve), by port (client,"
                             " admin) and code (UNAUTHENTICATED, PERMISSION_DENIED)", ["port", "code"]),
)


class RaftCollector:
    """The broker's Raft peer, read at scrape time (`danube_raft_*`). Registered by the
    broker service while its metadata store runs. It reads plain counters only (no
    disk), so the scrape thread never touches the log store."""

    def __init__(self, peer: RaftPeer) -> None:
        self._peer = peer

    def describe(self) -> list[Metric]:
        return []  # no registration-time name check: tests run several brokers in one process

    def collect(self) -> Iterator[Metric]:
        s = self._peer.statistics(with_log=False)
        yield GaugeMetricFamily("danube_raft_term", "Current Raft term of this broker's metadata peer", value=s.term)
        yield GaugeMetricFamily("danube_raft_leader", "1 if this broker's metadata peer is the Raft leader",
                                value=1 if s.role == "LEADER" else 0)
        yield GaugeMetricFamily("danube_raft_commit_index", "Highest Raft log index known committed",
                                value=s.commit_index)
        yield GaugeMetricFamily("danube_raft_applied_index", "Highest Raft log index applied to the metadata",
                                value=s.applied_index)
        yield GaugeMetricFamily("danube_raft_voters", "Voting members of the metadata cluster",
                                value=len(self._peer.membership.voters))
        yield CounterMetricFamily("danube_raft_proposals", "Metadata writes proposed here", value=s.proposals)
        yield CounterMetricFamily("danube_raft_proposals_failed", "Metadata writes that failed or timed out here",
                                  value=s.proposals_failed)
        yield CounterMetricFamily("danube_raft_elections_won", "Elections this peer won", value=s.elections_won)
        yield CounterMetricFamily("danube_raft_messages_dropped",
                                  "Peer messages dropped (peer down or its queue full; Raft retries)",
                                  value=s.messages_dropped)

"""Prometheus metrics of a broker process (served on `broker.metrics_port`).

Names follow Danube's (`danube_topic_messages_in_total`, ...) and Prometheus'
conventions: base units, `_total` on counters, no per-message or per-client labels.
Actors update these sinks as they work; the HTTP server only reads them.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prometheus_client import REGISTRY, Counter, Gauge
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import CollectorRegistry
from prometheus_client.utils import floatToGoString

from danube_zmq.runtime.metrics import RUNTIME_METRICS

if TYPE_CHECKING:
    from danube_zmq.consensus.peer import RaftPeer


# The `topic` label of every topic past `broker.metrics_topics_max`, and the
# `subscription` label of its subscriptions and of those past
# `broker.metrics_subscriptions_max` on a named topic.
OTHER = "_other"


class TopicSeries:
    """Which topics and subscriptions have series of their own, and when their label
    children go.

    At most `topics_max` topics (set by the broker at start) are labelled by name; the
    series of any other topic add up under `topic="_other"` (its subscriptions under
    `subscription="_other"`), so the number of series stays bounded however many
    partitions a broker serves. Likewise at most `subscriptions_max` subscriptions of
    each named topic are labelled by name, the others adding up under
    `{topic=<it>, subscription="_other"}`: a principal that may only consume can make
    many subscriptions, about 27 series each. The bound is per topic, so one tenant's
    subscriptions never push another topic's out of their names, and a topic keeps its
    names on whichever broker serves it; the broker's total is bounded by
    topics_max x (subscriptions_max + 1) subscription rows.

    A topic's actor and each of its subscriptions' actors hold its name (`acquire`,
    idempotent per holder, so an actor rebuilt by a restart holds it once); when the
    last lets go (the topic deleted, unloaded or moved away) its children are removed
    from every per-topic family, and its place is free. A subscription's place frees
    when it goes likewise. Holders are keyed by their actor system too: tests run
    several brokers in one process, and a topic moving between two of them is held by
    both for a moment."""

    def __init__(self) -> None:
        self.topics_max = 1_000
        self.subscriptions_max = 10
        # topic -> holder name ("" the topic's actor, else a named subscription) -> the
        # actor systems holding it.
        self._holders: dict[str, dict[str, set[int]]] = {}
        self._families: list[_PerTopic] = []

    def acquire(self, topic: str, holder: tuple[int, str], *, admit: bool = True) -> str:
        """The label `holder` (an actor system's id and "" for the topic's actor, or a
        subscription's name) counts `topic` under: `topic`, or OTHER when full. A
        subscription does not `admit` its topic: it counts where its topic does, and by
        its own name only while the topic has fewer than `subscriptions_max` named."""
        system, name = holder
        holders = self._holders.get(topic)
        if holders is None:
            if not admit or len(self._holders) >= self.topics_max:
                return OTHER
            holders = self._holders[topic] = {}
        systems = holders.get(name)
        if systems is None:
            if name and len(holders) - ("" in holders) >= self.subscriptions_max:
                return topic  # counted under subscription="_other"
            systems = holders[name] = set()
        systems.add(system)
        return topic

    def release(self, topic: str, holder: tuple[int, str]) -> None:
        """`holder` stopped for good; a subscription's own children go at once, the
        topic's when its last holder is gone."""
        system, name = holder
        holders = self._holders.get(topic)
        systems = holders.get(name) if holders is not None else None
        if holders is None or systems is None or system not in systems:
            return  # counted under OTHER: its counts stay in the sum
        systems.discard(system)
        if not systems:
            del holders[name]
            if name:
                for family in self._families:
                    family.remove(topic, name)
        if not holders:
            del self._holders[topic]
            for family in self._families:
                family.remove(topic, None)

    def label(self, topic: str) -> str:
        """`topic` if it has series of its own, else OTHER."""
        return topic if topic in self._holders else OTHER

    def subscription_label(self, topic: str, subscription: str) -> str:
        """`subscription` if it has series of its own (its topic too), else OTHER."""
        holders = self._holders.get(topic)
        return subscription if holders is not None and subscription and subscription in holders else OTHER

    def register(self, family: _PerTopic) -> None:
        self._families.append(family)


TOPIC_SERIES = TopicSeries()


class Tally:
    """One label set's count: a plain integer the loop's thread adds to, read whole by
    the scrape thread (one attribute read under the GIL, no lock on either side)."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0

    def inc(self, amount: int = 1) -> None:
        self.value += amount


class _PerTopic:
    """A family labelled by `topic` (first) and maybe `subscription` (second): a label
    set's child is taken by `labels` (the topic mapped through TOPIC_SERIES) and removed
    by TOPIC_SERIES when its topic or subscription goes."""

    def __init__(self, name: str, documentation: str, labelnames: list[str], *, series: TopicSeries = TOPIC_SERIES,
                 registry: CollectorRegistry | None = REGISTRY) -> None:
        assert labelnames[0] == "topic" and labelnames[1:] in ([], ["subscription"]), labelnames
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self._series = series
        # topic label -> that topic's children by their whole label tuple: removing a
        # topic costs its own children, not a walk over every topic's.
        self._children: dict[str, dict[tuple[str, ...], Any]] = {}
        series.register(self)
        if registry is not None:
            registry.register(self)

    def _new_child(self) -> Any:
        raise NotImplementedError

    def labels(self, **labels: str) -> Any:
        topic = self._series.label(labels["topic"])
        key = (topic,) if len(self.labelnames) == 1 else (
            topic, self._series.subscription_label(labels["topic"], labels["subscription"]))
        children = self._children.get(topic)
        if children is None:
            children = self._children[topic] = {}
        child = children.get(key)
        if child is None:
            child = children[key] = self._new_child()
        return child

    def remove(self, topic: str, subscription: str | None) -> None:
        """Drop the children of `topic` (subscription None) or of one of its subscriptions."""
        if subscription is None:
            self._children.pop(topic, None)
        elif (children := self._children.get(topic)) is not None:
            children.pop((topic, subscription), None)

    def describe(self) -> list[Metric]:
        return []  # no registration-time name check: the same family name is never registered twice here

    def _items(self) -> list[tuple[tuple[str, ...], Any]]:
        # list() of a dict is one C call: the loop may add a label set meanwhile.
        return [item for children in list(self._children.values()) for item in list(children.items())]


class ScrapeCounter(_PerTopic):
    """A per-topic counter for the per-message paths, exported at scrape time.

    prometheus_client's `Counter.inc` takes a lock for every increment, about a
    microsecond a batch over a topic's and a subscription's counters; here an increment
    is an integer add and the scrape reads the tallies. Only the event loop's thread
    increments. A topic that moves away and back starts again from 0 (a counter reset,
    which `rate()` handles)."""

    def __init__(self, name: str, documentation: str, labelnames: list[str], **kwargs: Any) -> None:
        super().__init__(name.removesuffix("_total"), documentation, labelnames, **kwargs)

    def _new_child(self) -> Tally:
        return Tally()

    def labels(self, **labels: str) -> Tally:
        return super().labels(**labels)  # type: ignore[no-any-return]

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for key, tally in self._items():
            family.add_metric(key, tally.value)
        yield family


class Buckets:
    """One label set's histogram: counts per bucket as plain integers (see Tally)."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last: above every bound
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.total += value

    def observe_many(self, value: float, times: int) -> None:
        self.counts[bisect_left(self.bounds, value)] += times
        self.total += value * times


def export_buckets(family: HistogramMetricFamily, key: tuple[str, ...], buckets: Buckets) -> None:
    counts, total = list(buckets.counts), buckets.total
    cumulative, running = [], 0
    for bound, count in zip((*buckets.bounds, float("inf")), counts, strict=True):
        running += count
        cumulative.append(("+Inf" if bound == float("inf") else floatToGoString(bound), running))
    family.add_metric(list(key), cumulative, sum_value=total)


class ScrapeHistogram(_PerTopic):
    """A per-topic histogram observed once per batch (an integer add into fixed
    buckets) and exported as a real Prometheus histogram (`_bucket`, `_sum`, `_count`)
    at scrape time, so `histogram_quantile` works (Danube exports summaries)."""

    def __init__(self, name: str, documentation: str, labelnames: list[str], bounds: tuple[float, ...],
                 **kwargs: Any) -> None:
        self.bounds = bounds
        super().__init__(name, documentation, labelnames, **kwargs)

    def _new_child(self) -> Buckets:
        return Buckets(self.bounds)

    def labels(self, **labels: str) -> Buckets:
        return super().labels(**labels)  # type: ignore[no-any-return]

    def collect(self) -> Iterator[Metric]:
        family = HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for key, buckets in self._items():
            export_buckets(family, key, buckets)
        yield family


class BrokerHistogram:
    """A histogram of the broker as a whole (no labels), kept as `Buckets`; observed
    from any one thread (the WAL's flush threads observe under the GIL: a lost
    increment between two threads is possible and harmless for a latency figure)."""

    def __init__(self, name: str, documentation: str, bounds: tuple[float, ...]) -> None:
        self.name = name
        self.documentation = documentation
        self.buckets = Buckets(bounds)
        REGISTRY.register(self)

    def observe(self, value: float) -> None:
        self.buckets.observe(value)

    def describe(self) -> list[Metric]:
        return [HistogramMetricFamily(self.name, self.documentation)]

    def collect(self) -> Iterator[Metric]:
        family = HistogramMetricFamily(self.name, self.documentation, labels=())
        export_buckets(family, (), self.buckets)
        yield family


# Seconds: 0.5 ms to 10 s, about x2 apart (a local fsync is ~1 ms; an acknowledged
# reliable send under load tens of ms).
LATENCY_BOUNDS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


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
    messages_expired: ScrapeCounter
    duplicates: ScrapeCounter
    actor_failures: Counter
    wal_flushes: Counter
    wal_records: Counter
    wal_bytes: Counter
    wal_fsync_latency: BrokerHistogram
    produce_ack_latency: ScrapeHistogram
    end_to_end_latency: ScrapeHistogram
    schema_mismatched: ScrapeCounter
    schema_rejected: ScrapeCounter
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
    load_decisions: Counter
    lease_renewals: Counter
    subscriptions_expired: Counter


METRICS = _Metrics(
    connections=Gauge("danube_broker_connections", "Client connections open"),
    bad_frames=RUNTIME_METRICS.bad_frames,
    frames_dropped=RUNTIME_METRICS.frames_dropped,
    topics=Gauge("danube_broker_topics_owned", "Topics (partitions) served by this broker"),
    messages_in=ScrapeCounter("danube_topic_messages_in_total", "Messages published", ["topic"]),
    bytes_in=ScrapeCounter("danube_topic_bytes_in_total", "Bytes published: payloads, keys and attributes", ["topic"]),
    messages_out=ScrapeCounter("danube_subscription_messages_out_total", "Messages delivered to consumers",
                         ["topic", "subscription"]),
    messages_dropped=ScrapeCounter("danube_subscription_messages_dropped_total",
                             "Non-reliable messages dropped because the subscription's pending bound was reached",
                             ["topic", "subscription"]),
    messages_expired=ScrapeCounter("danube_subscription_messages_expired_total",
                                   "Reliable topics: messages acknowledged for the subscription by its topic's"
                                   " message TTL (message_ttl_s) before a consumer acknowledged them",
                                   ["topic", "subscription"]),
    duplicates=ScrapeCounter("danube_topic_duplicate_messages_total",
                             "Reliable topics with deduplication: messages sent again (a sequence id at or below"
                             " its producer's highest) and answered with their first offset, not stored",
                             ["topic"]),
    actor_failures=RUNTIME_METRICS.actor_failures,
    wal_flushes=Counter("danube_wal_flushes_total",
                        "WAL group commits (one write and, with wal_sync always, one fsync each)"),
    wal_records=Counter("danube_wal_records_total", "Records committed to WALs"),
    wal_bytes=Counter("danube_wal_bytes_total", "Bytes of batch records written to WALs (headers included)"),
    wal_fsync_latency=BrokerHistogram("danube_wal_fsync_latency_seconds",
                                      "Time one WAL fsync took (group commits and wal_sync interval syncs)",
                                      LATENCY_BOUNDS_S),
    produce_ack_latency=ScrapeHistogram(
        "danube_producer_send_latency_seconds",
        "Reliable topics: from the topic accepting a producer's batch to its receipt leaving (after the"
        " fsync, or the upload with seal_every_flush); one observation a batch", ["topic"], LATENCY_BOUNDS_S),
    end_to_end_latency=ScrapeHistogram(
        "danube_subscription_end_to_end_latency_seconds",
        "From a message's publish time (the producer's clock) to its first dispatch to a consumer; one"
        " observation a message", ["topic", "subscription"], LATENCY_BOUNDS_S),
    schema_mismatched=ScrapeCounter("danube_topic_schema_mismatched_messages_total",
                              "Messages accepted without the topic's schema (validation policy warn)", ["topic"]),
    schema_rejected=ScrapeCounter("danube_topic_schema_rejected_messages_total",
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
    # From the inbound watcher process's reports (actors/sockets/inbound_watch.py).
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
    load_decisions=Counter("danube_load_manager_decisions_total",
                           "Decisions the load manager wrote while this broker led the cluster: assign (a waiting"
                           " topic placed), failover (a gone broker's topic unassigned), move (a rebalance, drain"
                           " or unload started)", ["decision"]),
    lease_renewals=Counter("danube_broker_lease_renewals_total",
                           "Renewals of this broker's registration lease, by result (renewed, failed)", ["result"]),
    subscriptions_expired=Counter("danube_subscriptions_expired_total",
                                  "Subscriptions removed with their cursors after no consumer was attached for"
                                  " their topic's subscription_expiration_ms"),
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
        yield GaugeMetricFamily("danube_raft_apply_lag", "Raft log entries committed and not yet applied to the"
                                " metadata here", value=s.commit_index - s.applied_index)
        yield CounterMetricFamily("danube_raft_elections_won", "Elections this peer won", value=s.elections_won)
        yield CounterMetricFamily("danube_raft_leader_changes", "Times this peer learned of a new Raft leader",
                                  value=s.leader_changes)
        yield CounterMetricFamily("danube_raft_messages_dropped",
                                  "Peer messages dropped (peer down or its queue full; Raft retries)",
                                  value=s.messages_dropped)

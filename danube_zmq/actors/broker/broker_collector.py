"""The series of a broker read from its actors at scrape time: per topic and
subscription (backlog, lag, ...), and the broker's uploads, lease and CURVE refusals.

Backlog, lag, unacknowledged messages, redeliveries and dead letters are state the
topic and subscription actors already hold; nothing on the data path keeps them for
metrics. A scrape (the metrics server's thread) asks the event loop to run one sample:
on the loop's thread, between handlers, it walks the topics the broker actor serves
and reads each topic's and subscription's counts (plain reads: no message; each
topic's counts are as of one instant, and the walk yields to the loop every 2,000
topics). The scrape thread then builds the families. Topics past
`broker.metrics_topics_max` add up under `topic="_other"`, and a topic's subscriptions
past `broker.metrics_subscriptions_max` under `subscription="_other"`
(`actors/metrics.py` TopicSeries).

Reading other actors' state is the broker service's privilege as the system's owner
(`ActorSystem.actor`); actors themselves never do it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from collections.abc import Iterator
from dataclasses import dataclass

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from danube_zmq.actors.broker.broker import BrokerActor
from danube_zmq.actors.metrics import TOPIC_SERIES
from danube_zmq.actors.subscription.shell import SubscriptionActor
from danube_zmq.actors.topic.shell import TopicActor
from danube_zmq.runtime.system import ActorSystem
from danube_zmq.security.curve import Credentials, CredentialsStatistics
from danube_zmq.storage.durable.uploader import UploaderStatistics

log = logging.getLogger("danube_zmq.metrics")

# A scrape waits this long for the loop to take its sample; Prometheus' own scrape
# timeout is 10 s by default.
SAMPLE_TIMEOUT_S = 5.0
# Topics sampled in one go: a few microseconds each, so a broker serving 100,000
# partitions never holds its loop for a whole scrape (leases, Raft and admin Pings
# run in between).
_TOPICS_PER_SLICE = 2_000

_TOPIC = ("topic",)
_SUBSCRIPTION = ("topic", "subscription")


@dataclass(slots=True)
class _TopicRow:
    producers: int = 0
    subscriptions: int = 0
    dropped: int = 0


@dataclass(slots=True)
class _SubscriptionRow:
    consumers: int = 0
    backlog_messages: int = 0
    backlog_bytes: int = 0
    lag_messages: int = 0
    unacked_messages: int = 0
    redeliveries: int = 0
    dead_lettered: int = 0
    delayed_messages: int = 0
    oldest_unacked_age_s: float | None = None  # the largest, under _other


@dataclass(slots=True)
class _Sample:
    topics: dict[tuple[str, ...], _TopicRow]
    subscriptions: dict[tuple[str, ...], _SubscriptionRow]
    uploads: UploaderStatistics | None = None  # None: storage.mode local, or no broker actor yet
    lease_held: bool | None = None
    lease_remaining_ms: int = 0
    curve: CredentialsStatistics | None = None  # security.mode curve only


class BrokerCollector:
    """Registered by the broker service while its actor system runs."""

    def __init__(self, system: ActorSystem, loop: asyncio.AbstractEventLoop, *,
                 credentials: Credentials | None = None) -> None:
        self._system = system
        self._loop = loop
        self._credentials = credentials

    def describe(self) -> list[Metric]:
        return []  # no registration-time name check: tests run several brokers in one process

    def _instance(self, endpoint: str) -> object | None:
        try:
            return self._system.actor(endpoint)
        except KeyError:  # stopped, or not spawned yet
            return None

    async def sample(self) -> _Sample:
        """On the loop's thread: the counts of every topic and subscription served here,
        `_TOPICS_PER_SLICE` topics between two yields to the loop's other work."""
        sample = _Sample(topics={}, subscriptions={})
        if self._credentials is not None:
            sample.curve = self._credentials.statistics()
        broker = self._instance(self._system.broker_endpoint) if self._system.broker_endpoint else None
        if not isinstance(broker, BrokerActor):
            return sample
        if broker.files.uploader is not None:
            sample.uploads = broker.files.uploader.statistics()
        sample.lease_held = broker.lease_held
        sample.lease_remaining_ms = max(0, broker.lease_until_ms - self._system.clock.monotonic_ms())
        now_ms = self._system.clock.now_ms()
        for n, entry in enumerate(list(broker.topics.values())):
            if n and n % _TOPICS_PER_SLICE == 0:
                await asyncio.sleep(0)
            topic = self._instance(entry.endpoint)
            if not isinstance(topic, TopicActor):
                continue
            label = TOPIC_SERIES.label(topic.topic)
            row = sample.topics.setdefault((label,), _TopicRow())
            row.producers += len(topic.producers)
            row.subscriptions += len(topic.subscriptions)
            row.dropped += topic.dropped_messages
            for name, subscription in topic.subscriptions.items():
                actor = self._instance(subscription.endpoint)
                if not isinstance(actor, SubscriptionActor):
                    continue
                counts = actor.delivery.sample()
                key = (label, TOPIC_SERIES.subscription_label(topic.topic, name))
                sub = sample.subscriptions.setdefault(key, _SubscriptionRow())
                sub.consumers += len(actor.consumers)
                sub.backlog_messages += counts.backlog_messages
                if counts.pending_bytes is not None:
                    sub.backlog_bytes += counts.pending_bytes
                elif counts.cursor is not None and (wal := topic.storage.reliable_log) is not None:
                    sub.backlog_bytes += wal.backlog_bytes_after(counts.cursor, counts.backlog_messages) or 0
                sub.lag_messages += counts.lag_messages
                sub.unacked_messages += counts.unacked_messages
                sub.redeliveries += counts.redeliveries
                sub.dead_lettered += counts.dead_lettered
                sub.delayed_messages += counts.delayed_messages
                if counts.oldest_publish_ms is not None:
                    age_s = max(0, now_ms - counts.oldest_publish_ms) / 1000
                    sub.oldest_unacked_age_s = max(age_s, sub.oldest_unacked_age_s or 0.0)
        return sample

    def _sample_on_loop(self) -> _Sample | None:
        if self._loop.is_closed():  # the broker is stopping
            return None
        future = asyncio.run_coroutine_threadsafe(self.sample(), self._loop)
        try:
            return future.result(timeout=SAMPLE_TIMEOUT_S)
        except concurrent.futures.TimeoutError:
            future.cancel()
            log.warning("metrics: the event loop took more than %.0f s to sample topics; per-topic gauges left"
                        " out of this scrape", SAMPLE_TIMEOUT_S)
            return None

    def collect(self) -> Iterator[Metric]:
        sample = self._sample_on_loop()
        if sample is None:
            return
        yield from _broker_families(sample)
        topic_gauges = [
            ("danube_topic_active_producers", "Producers attached to the topic", "producers"),
            ("danube_topic_active_subscriptions", "Subscriptions of the topic", "subscriptions"),
        ]
        for name, documentation, field in topic_gauges:
            family = GaugeMetricFamily(name, documentation, labels=_TOPIC)
            for key, row in sample.topics.items():
                family.add_metric(key, getattr(row, field))
            yield family
        dropped = CounterMetricFamily("danube_topic_messages_dropped",
                                      "Non-reliable messages a subscription missed because its mailbox was full"
                                      " (since the topic started here)", labels=_TOPIC)
        for key, row in sample.topics.items():
            dropped.add_metric(key, row.dropped)
        yield dropped
        subscription_families: list[tuple[type[GaugeMetricFamily] | type[CounterMetricFamily], str, str, str]] = [
            (GaugeMetricFamily, "danube_subscription_active_consumers", "Consumers attached to the subscription",
             "consumers"),
            (GaugeMetricFamily, "danube_subscription_backlog_messages",
             "Messages the subscription has not acknowledged (non-reliable: held for its consumers' permits)",
             "backlog_messages"),
            (GaugeMetricFamily, "danube_subscription_backlog_bytes",
             "Bytes of those messages (reliable: in the log, prorated for acks out of order)", "backlog_bytes"),
            (GaugeMetricFamily, "danube_subscription_lag_messages",
             "Messages stored (or held) and not yet sent to any consumer of the subscription", "lag_messages"),
            (GaugeMetricFamily, "danube_subscription_unacked_messages",
             "Deliveries awaiting their consumer's acknowledgement", "unacked_messages"),
            (GaugeMetricFamily, "danube_subscription_delayed_messages",
             "Delayed messages the subscription holds until their time (Shared and Key-Shared)", "delayed_messages"),
            (CounterMetricFamily, "danube_subscription_redelivery",
             "Deliveries that were not the first of their message (since the subscription started here)",
             "redeliveries"),
            (CounterMetricFamily, "danube_subscription_dlq",
             "Messages sent to the dead-letter topic after their last redelivery (since the subscription"
             " started here)", "dead_lettered"),
        ]
        for kind, name, documentation, field in subscription_families:
            family = kind(name, documentation, labels=_SUBSCRIPTION)
            for key, sub in sample.subscriptions.items():
                family.add_metric(key, getattr(sub, field))
            yield family
        family = GaugeMetricFamily("danube_subscription_oldest_unacked_age_seconds",
                                   "Age (from its publish time, the producer's clock) of the first message the"
                                   " subscription has not acknowledged (non-reliable: the first it holds); absent"
                                   " when it holds none, or has not read that message yet", labels=_SUBSCRIPTION)
        for key, sub in sample.subscriptions.items():
            if sub.oldest_unacked_age_s is not None:
                family.add_metric(key, sub.oldest_unacked_age_s)
        yield family


def _broker_families(sample: _Sample) -> Iterator[Metric]:
    if sample.uploads is not None:
        u = sample.uploads
        yield CounterMetricFamily("danube_cloud_upload_objects", "Sealed segments uploaded to the durable store",
                                  value=u.uploaded_segments)
        yield CounterMetricFamily("danube_cloud_upload_bytes", "Bytes of the segments uploaded to the durable store",
                                  value=u.uploaded_bytes)
        yield CounterMetricFamily("danube_cloud_upload_failed_attempts",
                                  "Upload attempts that failed (each retried with backoff, up to the attempts_max)",
                                  value=u.failed_attempts)
        yield GaugeMetricFamily("danube_cloud_uploads_pending", "Segment uploads queued or running",
                                value=u.pending)
        yield GaugeMetricFamily("danube_cloud_upload_failures",
                                "Segments whose last upload gave up (kept local until submitted again)",
                                value=len(u.failures))
    if sample.lease_held is not None:
        yield GaugeMetricFamily("danube_broker_lease_held",
                                "1 while this broker holds its registration lease and serves topics",
                                value=1 if sample.lease_held else 0)
        yield GaugeMetricFamily("danube_broker_lease_remaining_seconds",
                                "Time until the lease last renewed runs out, as this broker counts it",
                                value=sample.lease_remaining_ms / 1000)
    if sample.curve is not None:
        family = CounterMetricFamily("danube_curve_handshakes_refused",
                                     "CURVE handshakes refused by ZAP (a key that is not a broker's on the Raft"
                                     " port), by port", labels=["port"])
        for domain, count in sorted(sample.curve.refused.items()):
            family.add_metric([domain], count)
        yield family

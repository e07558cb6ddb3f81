"""Prometheus metrics the runtime itself keeps (served with the broker's, actors/metrics.py).

They live here, not in `actors/metrics.py`, so the runtime does not import the broker's
actors; the broker's `METRICS` names the same counter objects (a name registers once).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client import Counter
from prometheus_client.core import GaugeMetricFamily, Metric


@dataclass(frozen=True, slots=True)
class _RuntimeMetrics:
    bad_frames: Counter
    frames_dropped: Counter
    actor_failures: Counter


RUNTIME_METRICS = _RuntimeMetrics(
    bad_frames=Counter("danube_broker_bad_frames_total", "Client frames rejected as malformed"),
    frames_dropped=Counter("danube_broker_frames_dropped_total",
                           "Frames to clients dropped because the client was gone or its queue full"),
    actor_failures=Counter("danube_actor_failures_total", "Actor handlers that raised (each restarts the actor)"),
)


class MailboxCollector:
    """What the actor system's mailboxes hold, read at scrape time
    (`danube_actor_mailbox_*`): sums kept by the mailboxes themselves, so a scrape costs
    no work on the event loop. Registered by the broker service while its system runs."""

    def __init__(self, statistics: Callable[[], Any]) -> None:
        self._statistics = statistics  # `ActorSystem.statistics`

    def describe(self) -> list[Metric]:
        return []  # no registration-time name check: tests run several brokers in one process

    def collect(self) -> Iterator[Metric]:
        s = self._statistics()
        yield GaugeMetricFamily("danube_actor_mailbox_messages",
                                "Messages waiting in this broker's actor mailboxes", value=s.mailbox_messages)
        yield GaugeMetricFamily("danube_actor_mailbox_bytes",
                                "Bytes the messages waiting in this broker's actor mailboxes carry",
                                value=s.mailbox_bytes)

"""What the console's charts draw when no Prometheus is given: each topic's backlog and
counters as sampled while someone looks at it, in bounded rings. Pure (the clock is
passed in).

A sample is taken when a browser asks for a topic's series (after its admin call, with
its caller's credentials, succeeded), at most one per `interval_s`, so history exists
only for topics someone watched. Rates come from counter deltas; a counter that went
backwards (the topic restarted or moved, its counters began again) gives no rate for
that step rather than a negative one.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict, deque
from typing import Any

__all__ = ["Sample", "TopicHistory"]


@dataclasses.dataclass(frozen=True, slots=True)
class Sample:
    at_s: float
    backlog_messages: int
    backlog_bytes: int
    unacked_messages: int
    messages_in: int  # counter: messages the topic accepted
    messages_out: int  # counter: messages its subscriptions delivered


class TopicHistory:
    """At most `topics_max` topics (the least recently sampled is forgotten first), each
    with at most `points_max` samples: a bound of topics_max * points_max samples."""

    def __init__(self, *, topics_max: int = 200, points_max: int = 720, interval_s: float = 1.0) -> None:
        if topics_max < 1 or points_max < 2:
            raise ValueError("topics_max must be >= 1 and points_max >= 2")
        self.topics_max = topics_max
        self.points_max = points_max
        self.interval_s = interval_s
        self._topics: OrderedDict[str, deque[Sample]] = OrderedDict()

    def record(self, topic: str, sample: Sample) -> None:
        ring = self._topics.get(topic)
        if ring is None:
            while len(self._topics) >= self.topics_max:
                self._topics.popitem(last=False)
            ring = self._topics[topic] = deque(maxlen=self.points_max)
        elif ring and sample.at_s - ring[-1].at_s < self.interval_s:
            return
        ring.append(sample)
        self._topics.move_to_end(topic)

    def forget(self, topic: str) -> None:
        self._topics.pop(topic, None)

    def series(self, topic: str) -> dict[str, list[Any]]:
        """Columns for the charts: time (ms since the epoch), backlog, unacked, and the
        in and out rates (messages/s; None where no rate can be told)."""
        ring = list(self._topics.get(topic, ()))
        out: dict[str, list[Any]] = {"time_ms": [], "backlog_messages": [], "backlog_bytes": [],
                                     "unacked_messages": [], "in_rate": [], "out_rate": []}
        previous: Sample | None = None
        for sample in ring:
            out["time_ms"].append(int(sample.at_s * 1000))
            out["backlog_messages"].append(sample.backlog_messages)
            out["backlog_bytes"].append(sample.backlog_bytes)
            out["unacked_messages"].append(sample.unacked_messages)
            out["in_rate"].append(_rate(previous, sample, "messages_in"))
            out["out_rate"].append(_rate(previous, sample, "messages_out"))
            previous = sample
        return out


def _rate(previous: Sample | None, sample: Sample, counter: str) -> float | None:
    if previous is None:
        return None
    elapsed = sample.at_s - previous.at_s
    delta = getattr(sample, counter) - getattr(previous, counter)
    if elapsed <= 0 or delta < 0:
        return None
    return round(delta / elapsed, 3)

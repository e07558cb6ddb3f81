"""Where a new (or unassigned) topic goes: Danube's three assignment strategies.

- `fair`: the broker's topic count.
- `balanced`: 0.3 x its topics' load (reports.py) + 0.35 x CPU + 0.35 x memory, each
  resource as a fraction (0-1) and the topic load as a fraction of the largest one.
- `weighted_load`: topic load, throughput, CPU and memory, each as a fraction of the
  cluster's largest (CPU and memory of 100%); the broker's bottleneck (its largest
  metric) weighs 50% when it is above 0.7, else all four weigh 25%.

The lowest score wins; brokers within 10% of it take turns (a cursor the caller keeps
and passes back, so a burst of new topics spreads instead of piling on one broker).
Only ACTIVE brokers are candidates. Pure: values in, a decision out. `Placer` keeps
each broker's totals and updates them per placed topic, so a burst of N new topics
costs O(A + N x B) (A assigned topics, B brokers) instead of summing every broker's
topics again for each new one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum

from danube_zmq.actors.load.reports import TOPIC_COUNT_WEIGHT, BrokerState, LoadReport, TopicLoad
from danube_zmq.transport.errors import Unavailable

TIE_BAND = 0.10  # brokers within 10% of the best score take turns
BOTTLENECK_LEVEL = 0.7


class Strategy(Enum):
    FAIR = "fair"
    BALANCED = "balanced"
    WEIGHTED_LOAD = "weighted_load"


@dataclass(frozen=True, slots=True)
class Placement:
    broker_id: int
    cursor: int  # pass back on the next call
    scores: tuple[tuple[int, float], ...]  # every candidate's score, for logs and `brokers balance`


class Placer:
    """Placement of many topics in a row (a burst of new topics, a drain): each ACTIVE
    broker's topic count, topic load and throughput are summed once from the
    assignments, then updated per placed topic, so placing N topics among B brokers
    with A topics assigned costs O(A + N x B), never the O(N x A) of summing every
    broker's topics again for each one. Pure, like `place`: the caller keeps the cursor."""

    def __init__(self, strategy: Strategy, states: Mapping[int, BrokerState], reports: Mapping[int, LoadReport],
                 assignments: Mapping[str, int], loads: Mapping[str, TopicLoad]) -> None:
        self.strategy = strategy
        self._loads = loads
        self._active = sorted(broker for broker, state in states.items() if state is BrokerState.ACTIVE)
        self._count = dict.fromkeys(self._active, 0.0)
        self._topic_load = dict.fromkeys(self._active, 0.0)
        self._throughput = dict.fromkeys(self._active, 0.0)
        self._cpu = {b: _fraction(reports.get(b), "cpu_percent") for b in self._active}
        self._memory = {b: _fraction(reports.get(b), "memory_percent") for b in self._active}
        for topic, broker in assignments.items():
            self.add(topic, broker)

    def add(self, topic: str, broker: int) -> None:
        """`topic` is now served by `broker` (a broker that is not ACTIVE is not scored)."""
        self._change(topic, broker, 1.0)

    def remove(self, topic: str, broker: int) -> None:
        """`topic` no longer counts on `broker` (it moves away)."""
        self._change(topic, broker, -1.0)

    def _change(self, topic: str, broker: int, sign: float) -> None:
        if broker not in self._count:
            return
        self._count[broker] += sign
        if self.strategy is Strategy.FAIR:
            return
        load = self._loads.get(topic)  # one lookup per topic: the loads may be a large mapping
        self._topic_load[broker] += sign * (load.weight if load is not None else TOPIC_COUNT_WEIGHT)
        if load is not None:
            self._throughput[broker] += sign * load.throughput_mbps

    def scores(self) -> dict[int, float]:
        """The score of every ACTIVE broker (lower is better): O(B)."""
        if self.strategy is Strategy.FAIR:
            return dict(self._count)
        topic_load, cpu, memory = self._topic_load, self._cpu, self._memory
        largest = max(topic_load.values(), default=0.0) or 1.0
        if self.strategy is Strategy.BALANCED:
            return {b: 0.3 * topic_load[b] / largest + 0.35 * cpu[b] + 0.35 * memory[b] for b in self._active}
        most = max(self._throughput.values(), default=0.0) or 1.0
        result = {}
        for b in self._active:
            metrics = (topic_load[b] / largest, self._throughput[b] / most, cpu[b], memory[b])
            bottleneck = max(metrics)
            if bottleneck > BOTTLENECK_LEVEL:
                index = metrics.index(bottleneck)
                weights = [0.5 if i == index else 0.5 / 3 for i in range(4)]
            else:
                weights = [0.25] * 4
            result[b] = sum(w * m for w, m in zip(weights, metrics, strict=True))
        return result

    def place(self, *, cursor: int = 0, exclude: frozenset[int] = frozenset()) -> Placement:
        """The broker for one more topic (not yet counted: call `add` once it is
        assigned). Raises Unavailable when no ACTIVE broker outside `exclude` is left."""
        scored = {b: s for b, s in self.scores().items() if b not in exclude}
        if not scored:
            raise Unavailable("no active broker can take the topic")
        best = min(scored.values())
        band = best + TIE_BAND * abs(best)
        tied = sorted(b for b, s in scored.items() if s <= band)
        chosen = tied[cursor % len(tied)]
        return Placement(broker_id=chosen, cursor=cursor + 1, scores=tuple(sorted(scored.items())))


def scores(strategy: Strategy, states: Mapping[int, BrokerState], reports: Mapping[int, LoadReport],
           assignments: Mapping[str, int], loads: Mapping[str, TopicLoad]) -> dict[int, float]:
    """The score of every ACTIVE broker (lower is better)."""
    return Placer(strategy, states, reports, assignments, loads).scores()


def place(strategy: Strategy, states: Mapping[int, BrokerState], reports: Mapping[int, LoadReport],
          assignments: Mapping[str, int], loads: Mapping[str, TopicLoad], *, cursor: int = 0,
          exclude: frozenset[int] = frozenset()) -> Placement:
    """The broker for one more topic. `exclude`: brokers it must not go to (the one it is
    moving away from). Raises Unavailable when no ACTIVE broker is left. O(A): to place
    many topics, keep a `Placer`."""
    return Placer(strategy, states, reports, assignments, loads).place(cursor=cursor, exclude=exclude)


def _fraction(report: LoadReport | None, attribute: str) -> float:
    if report is None:
        return 0.0
    return min(max(getattr(report, attribute), 0.0), 100.0) / 100.0

"""Where a new (or unassigned) topic goes: Danube's three assignment strategies.

- `fair`: the broker's topic count.
- `balanced`: 0.3 x its topics' load (reports.py) + 0.35 x CPU + 0.35 x memory, each
  resource as a fraction (0-1) and the topic load as a fraction of the largest one.
- `weighted_load`: topic load, throughput, CPU and memory, each as a fraction of the
  cluster's largest (CPU and memory of 100%); the broker's bottleneck (its largest
  metric) weighs 50% when it is above 0.7, else all four weigh 25%.

The lowest score wins; brokers within 10% of it take turns (a cursor the caller keeps
and passes back, so a burst of new topics spreads instead of piling on one broker).
Only ACTIVE brokers are candidates. Pure: values in, a decision out.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum

from danube_zmq.actors.load.reports import BrokerState, LoadReport, TopicLoad, broker_loads
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


def scores(strategy: Strategy, states: Mapping[int, BrokerState], reports: Mapping[int, LoadReport],
           assignments: Mapping[str, int], loads: Mapping[str, TopicLoad]) -> dict[int, float]:
    """The score of every ACTIVE broker (lower is better)."""
    active = sorted(broker for broker, state in states.items() if state is BrokerState.ACTIVE)
    if strategy is Strategy.FAIR:
        counts = dict.fromkeys(active, 0.0)
        for broker in assignments.values():
            if broker in counts:
                counts[broker] += 1
        return counts
    topic_load = broker_loads(active, assignments, loads)
    largest = max(topic_load.values(), default=0.0) or 1.0
    cpu = {b: _fraction(reports.get(b), "cpu_percent") for b in active}
    memory = {b: _fraction(reports.get(b), "memory_percent") for b in active}
    if strategy is Strategy.BALANCED:
        return {b: 0.3 * topic_load[b] / largest + 0.35 * cpu[b] + 0.35 * memory[b] for b in active}
    throughput = {b: sum(loads[t].throughput_mbps for t, owner in assignments.items() if owner == b and t in loads)
                  for b in active}
    most = max(throughput.values(), default=0.0) or 1.0
    result = {}
    for b in active:
        metrics = (topic_load[b] / largest, throughput[b] / most, cpu[b], memory[b])
        bottleneck = max(metrics)
        if bottleneck > BOTTLENECK_LEVEL:
            index = metrics.index(bottleneck)
            weights = [0.5 if i == index else 0.5 / 3 for i in range(4)]
        else:
            weights = [0.25] * 4
        result[b] = sum(w * m for w, m in zip(weights, metrics, strict=True))
    return result


def place(strategy: Strategy, states: Mapping[int, BrokerState], reports: Mapping[int, LoadReport],
          assignments: Mapping[str, int], loads: Mapping[str, TopicLoad], *, cursor: int = 0,
          exclude: frozenset[int] = frozenset()) -> Placement:
    """The broker for one more topic. `exclude`: brokers it must not go to (the one it is
    moving away from). Raises Unavailable when no ACTIVE broker is left."""
    scored = {b: s for b, s in scores(strategy, states, reports, assignments, loads).items() if b not in exclude}
    if not scored:
        raise Unavailable("no active broker can take the topic")
    best = min(scored.values())
    band = best + TIE_BAND * abs(best)
    tied = sorted(b for b, s in scored.items() if s <= band)
    chosen = tied[cursor % len(tied)]
    return Placement(broker_id=chosen, cursor=cursor + 1, scores=tuple(sorted(scored.items())))


def _fraction(report: LoadReport | None, attribute: str) -> float:
    if report is None:
        return 0.0
    return min(max(getattr(report, attribute), 0.0), 100.0) / 100.0

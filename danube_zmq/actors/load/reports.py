"""What brokers report about their load, and the loads the load manager derives from it.

Brokers publish a `LoadReport` on an interval (CPU and memory from psutil, and per
topic the rates, connections and backlog). The load manager scores brokers from the
latest reports and the current assignments; everything here is arithmetic on values
(no clock, no I/O), so placement and rebalancing decisions can be replayed and tested.

The weights are Danube's (`danube_service/load_manager/rankings.rs`, `rebalancing.rs`):
a topic's load is `0.2 + 0.3 * throughput_mbps + 0.3 * connections + 0.2 * backlog /
10,000`, the same formula Danube applies to whole brokers with the topic count in place
of the 1.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from enum import Enum

MIB = 1024 * 1024
BACKLOG_UNIT = 10_000  # backlog is counted in units of 10,000 messages
TOPIC_COUNT_WEIGHT = 0.2
THROUGHPUT_WEIGHT = 0.3
CONNECTIONS_WEIGHT = 0.3
BACKLOG_WEIGHT = 0.2


class BrokerState(Enum):
    """Only ACTIVE brokers take topics; DRAINING ones are being emptied; DRAINED hold none."""

    ACTIVE = "active"
    DRAINING = "draining"
    DRAINED = "drained"


@dataclass(frozen=True, slots=True)
class TopicLoad:
    """One topic (or partition) on the broker that reports it."""

    topic: str
    msg_rate_in: float = 0.0
    msg_rate_out: float = 0.0
    byte_rate_in: float = 0.0
    byte_rate_out: float = 0.0
    producers: int = 0
    consumers: int = 0
    subscriptions: int = 0
    backlog: int = 0

    @property
    def throughput_mbps(self) -> float:
        return (self.byte_rate_in + self.byte_rate_out) / MIB

    @property
    def connections(self) -> int:
        return self.producers + self.consumers

    @property
    def weight(self) -> float:
        """The topic's load, as the rebalancer moves it."""
        return (TOPIC_COUNT_WEIGHT + THROUGHPUT_WEIGHT * self.throughput_mbps
                + CONNECTIONS_WEIGHT * self.connections + BACKLOG_WEIGHT * self.backlog / BACKLOG_UNIT)


@dataclass(frozen=True, slots=True)
class LoadReport:
    """A broker's latest report: resources in percent (0-100) and its topics."""

    broker_id: int
    cpu_percent: float = 0.0
    memory_percent: float = 0.0
    topics: tuple[TopicLoad, ...] = field(default=())


def topic_loads(reports: Mapping[int, LoadReport], backlog: Mapping[str, int] | None = None) -> dict[str, TopicLoad]:
    """The latest known load of every reported topic. `backlog` (from the Spark backlog
    report, when one was published) replaces a topic's reported backlog where it is
    larger (the report reads the WAL snapshots, the broker only what it holds), and
    gives a topic no broker reported yet its backlog."""
    loads: dict[str, TopicLoad] = {}
    for report in reports.values():
        for load in report.topics:
            loads[load.topic] = load
    for topic, messages in (backlog or {}).items():
        load = loads.get(topic)
        if load is None:
            loads[topic] = TopicLoad(topic=topic, backlog=messages)  # no report yet: its backlog is still known
        elif messages > load.backlog:
            loads[topic] = replace(load, backlog=messages)
    return loads


def weight_of(topic: str, loads: Mapping[str, TopicLoad]) -> float:
    """A topic's load; a topic nobody reported yet (new, or just moved) counts as idle."""
    load = loads.get(topic)
    return load.weight if load is not None else TOPIC_COUNT_WEIGHT


def broker_loads(brokers: Iterable[int], assignments: Mapping[str, int],
                 loads: Mapping[str, TopicLoad]) -> dict[int, float]:
    """Each broker's load: the sum of its assigned topics' loads (0 for an empty one)."""
    totals = {broker: 0.0 for broker in brokers}
    for topic, broker in assignments.items():
        if broker in totals:
            totals[broker] += weight_of(topic, loads)
    return totals

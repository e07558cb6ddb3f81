"""When and what to move: Danube's rebalancing, as a pure function of (load, assignments,
policy, clock).

A broker's load is the sum of its topics' loads (reports.py). The cluster is out of
balance when the coefficient of variation of the ACTIVE brokers' loads (std / mean)
is above the policy's threshold. Then, up to the moves a cycle and the hour allow, the
lightest eligible topic on the most loaded broker moves to the least loaded one, as
long as the move narrows the gap (destination + topic < source). Every move so made
lowers the sum of squared broker loads, so a sequence of plans cannot cycle back to a
state it left (no oscillation) and stops when no move narrows a gap or the CV is under
the threshold. A topic is eligible when it is not blacklisted (exact name, or a
`/ns/*` pattern), is at least `min_topic_age_s` old, has not moved within
`cooldown_s`, and is not damaged (its WAL is: the next broker would serve it from an
empty log).

`drain` empties one broker (admin `brokers unload`): each of its topics goes where
placement would put a new topic, the broker itself excluded; its damaged topics stay
until repaired.

Cost: a plan sorts each broker's eligible topics once (O(N log N)) and a move costs
O(B); a drain keeps one `Placer` (O(N x B)). Neither sums the brokers' loads per topic.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass, field, replace
from enum import Enum

from danube_zmq.actors.load.placement import Placer, Strategy
from danube_zmq.actors.load.reports import BrokerState, LoadReport, TopicLoad, broker_loads, weight_of
from danube_zmq.transport.errors import InvalidArgument
from danube_zmq.transport.topic_name import parse_topic

HOUR_MS = 3_600_000
# A move must narrow the gap by more than float rounding: two brokers whose loads differ
# by an ulp are even, and moving a topic between them would only trade the rounding.
GAP_MARGIN = 1e-9


class Aggressiveness(Enum):
    CONSERVATIVE = "conservative"
    BALANCED = "balanced"
    AGGRESSIVE = "aggressive"


@dataclass(frozen=True, slots=True)
class RebalancePolicy:
    cv_threshold: float
    check_interval_s: int
    max_moves_per_hour: int
    cooldown_s: int
    min_brokers: int = 2
    min_topic_age_s: int = 300
    blacklist: tuple[str, ...] = ()
    moves_per_cycle: int = 1

    def __post_init__(self) -> None:
        if not 0 < self.cv_threshold:
            raise InvalidArgument(f"rebalancing cv_threshold must be > 0, got {self.cv_threshold}")
        for name in ("check_interval_s", "max_moves_per_hour", "moves_per_cycle", "min_brokers"):
            if getattr(self, name) < 1:
                raise InvalidArgument(f"rebalancing {name} must be >= 1, got {getattr(self, name)}")
        for name in ("cooldown_s", "min_topic_age_s"):
            if getattr(self, name) < 0:
                raise InvalidArgument(f"rebalancing {name} must be >= 0, got {getattr(self, name)}")
        for pattern in self.blacklist:
            if not pattern.startswith("/"):
                raise InvalidArgument(f"blacklist entry {pattern!r} is not a topic name or /namespace/* pattern")

    @classmethod
    def of(cls, level: Aggressiveness, **overrides: object) -> RebalancePolicy:
        """The level's defaults (Danube's documented table), with `overrides` applied."""
        return replace(LEVELS[level], **overrides)  # type: ignore[arg-type]


LEVELS = {
    Aggressiveness.CONSERVATIVE: RebalancePolicy(cv_threshold=0.40, check_interval_s=600, max_moves_per_hour=5,
                                                 cooldown_s=120),
    Aggressiveness.BALANCED: RebalancePolicy(cv_threshold=0.30, check_interval_s=300, max_moves_per_hour=10,
                                             cooldown_s=60),
    Aggressiveness.AGGRESSIVE: RebalancePolicy(cv_threshold=0.20, check_interval_s=180, max_moves_per_hour=20,
                                               cooldown_s=30),
}


@dataclass(frozen=True, slots=True)
class Balance:
    """The ACTIVE brokers' loads and how uneven they are (`danube admin brokers balance`)."""

    loads: dict[int, float]
    mean: float
    std: float
    cv: float
    overloaded: frozenset[int]  # load > mean + std and >= the overload threshold
    underloaded: frozenset[int]  # load < mean - std and < mean / 2


@dataclass(frozen=True, slots=True)
class Move:
    topic: str
    from_broker: int
    to_broker: int
    estimated_load: float
    reason: str


@dataclass(frozen=True, slots=True)
class Plan:
    balance: Balance
    moves: tuple[Move, ...] = ()
    why_none: str = ""  # when `moves` is empty: why
    after: dict[int, float] = field(default_factory=dict)  # broker loads once the moves are done


def measure(loads: Mapping[int, float], overload_threshold: float = 0.0) -> Balance:
    """How uneven `loads` are. A broker is overloaded when it carries more than its share
    (above mean + std) and, absolutely, at least `overload_threshold`: on a near-idle
    cluster (one topic, load 0.2) the broker with a topic is above the mean and no more
    loaded for that (`load_manager.overload_threshold`)."""
    values = list(loads.values())
    mean = statistics.fmean(values) if values else 0.0
    std = statistics.pstdev(values) if len(values) > 1 else 0.0
    cv = std / mean if mean > 0 else 0.0
    return Balance(
        loads=dict(loads), mean=mean, std=std, cv=cv,
        overloaded=frozenset(b for b, v in loads.items() if v > mean + std and v >= overload_threshold),
        underloaded=frozenset(b for b, v in loads.items() if v < mean - std and v < mean / 2),
    )


def blacklisted(topic: str, patterns: Sequence[str]) -> bool:
    """Exact names (a partitioned topic's name covers its partitions) and `/ns/*`."""
    base = _base(topic)
    for pattern in patterns:
        if pattern.endswith("/*"):
            if topic.startswith(pattern[:-1]):
                return True
        elif pattern in (topic, base):
            return True
    return False


def plan(*, now_ms: int, policy: RebalancePolicy, states: Mapping[int, BrokerState],
         assignments: Mapping[str, int], loads: Mapping[str, TopicLoad], created_ms: Mapping[str, int],
         last_moved_ms: Mapping[str, int], recent_moves_ms: Sequence[int], max_moves: int | None = None,
         damaged: Set[str] = frozenset()) -> Plan:
    """The moves to make now. `created_ms`: when each topic was created (a topic missing
    there counts as old enough); `last_moved_ms`: when each topic last moved;
    `recent_moves_ms`: when the moves of the past hour were made; `max_moves` (admin
    `rebalance --max-moves`) replaces the policy's moves per cycle; `damaged`: topics
    never moved."""
    active = sorted(b for b, s in states.items() if s is BrokerState.ACTIVE)
    current = broker_loads(active, assignments, loads)
    balance = measure(current)
    if len(active) < policy.min_brokers:
        return Plan(balance, why_none=f"{len(active)} active brokers, fewer than {policy.min_brokers}", after=current)
    if balance.cv <= policy.cv_threshold:
        return Plan(balance, why_none=f"balanced: cv {balance.cv:.2f} <= {policy.cv_threshold:.2f}", after=current)
    done_this_hour = sum(1 for t in recent_moves_ms if now_ms - HOUR_MS < t <= now_ms)
    budget = min(policy.moves_per_cycle if max_moves is None else max_moves,
                 policy.max_moves_per_hour - done_this_hour)
    if budget <= 0:
        return Plan(balance, why_none=f"{done_this_hour} moves in the past hour, the cap is "
                                      f"{policy.max_moves_per_hour}", after=current)
    # Each broker's eligible topics, lightest first, sorted once (O(N log N) a plan, not
    # a sort per move): the lightest one not yet moved is the only candidate, since a
    # heavier one narrows the gap less and fits whenever a lighter one does not.
    queues: dict[int, list[tuple[float, str]]] = {b: [] for b in active}
    for t, b in assignments.items():
        if b in queues and t not in damaged and _eligible(t, now_ms, policy, created_ms, last_moved_ms):
            queues[b].append((weight_of(t, loads), t))
    for queue in queues.values():
        queue.sort()
    heads = dict.fromkeys(active, 0)
    moves: list[Move] = []
    while len(moves) < budget and measure(current).cv > policy.cv_threshold:
        source = max(active, key=lambda b: (current[b], -b))
        target = min(active, key=lambda b: (current[b], b))
        queue, head = queues[source], heads[source]
        if head >= len(queue) or not current[target] + queue[head][0] < current[source] - GAP_MARGIN:
            break
        weight, topic = queue[head]
        heads[source] = head + 1  # a moved topic is not moved again in this plan
        moves.append(Move(topic=topic, from_broker=source, to_broker=target, estimated_load=weight,
                          reason=f"cv {measure(current).cv:.2f} above {policy.cv_threshold:.2f}"))
        current[source] -= weight
        current[target] += weight
    if not moves:
        return Plan(balance, why_none="no eligible topic whose move would narrow the gap", after=current)
    return Plan(balance, moves=tuple(moves), after=current)


def drain(broker_id: int, *, strategy: Strategy, states: Mapping[int, BrokerState],
          reports: Mapping[int, LoadReport], assignments: Mapping[str, int],
          loads: Mapping[str, TopicLoad], damaged: Set[str] = frozenset()) -> list[Move]:
    """Every topic of `broker_id` but the `damaged` ones to the broker placement picks,
    heaviest first so the big ones spread before the small ones fill the gaps."""
    owned = sorted((t for t, b in assignments.items() if b == broker_id and t not in damaged),
                   key=lambda t: (-weight_of(t, loads), t))
    placer = Placer(strategy, states, reports, assignments, loads)
    moves = []
    cursor = 0
    for topic in owned:
        chosen = placer.place(cursor=cursor, exclude=frozenset({broker_id}))
        cursor = chosen.cursor
        placer.remove(topic, broker_id)
        placer.add(topic, chosen.broker_id)
        moves.append(Move(topic=topic, from_broker=broker_id, to_broker=chosen.broker_id,
                          estimated_load=weight_of(topic, loads), reason=f"broker {broker_id} unloaded"))
    return moves


def _eligible(topic: str, now_ms: int, policy: RebalancePolicy, created_ms: Mapping[str, int],
              last_moved_ms: Mapping[str, int]) -> bool:
    if blacklisted(topic, policy.blacklist):
        return False
    created = created_ms.get(topic)
    if created is not None and now_ms - created < policy.min_topic_age_s * 1000:
        return False
    moved = last_moved_ms.get(topic)
    return moved is None or now_ms - moved >= policy.cooldown_s * 1000


def _base(topic: str) -> str:
    try:
        return parse_topic(topic).base.full
    except InvalidArgument:
        return topic

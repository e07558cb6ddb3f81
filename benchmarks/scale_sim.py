"""Scale past one machine, in simulation (issue 22): the load manager and the metadata
store at 100 brokers, 100,000 topics and 1,000,000 subscriptions, with no sockets.

It drives the real pure cores and encoders; only the workload is synthetic (seeded):

1. Placement: `actors.load.assign.plan` places every topic of a cluster just created
   (none assigned, no load reported yet: the burst the load manager sees), then a
   broker's topics again after it dies (failover). Wall and CPU time.
2. Rebalancing: `actors.load.rebalance.plan` every `check_interval_s` of simulated time
   while each topic's rate drifts (a geometric random walk), one broker is drained
   (`rebalance.drain`) and an empty one joins. Moves per hour, the CV over time.
3. Raft writes, from the cadences in the code (`cursor_flusher.py`: one transaction of
   every changed cursor per broker every `storage.cursor_flush_interval_ms`;
   `lease_keeper.py`/`lease.py`: a `PutWithTtl` every third of `cluster.lease_ttl_ms`;
   `load_reporter.py`: a `PutWithTtl` of the broker's report every
   `load_manager.report_interval_ms`; `topic/wal/commit.py`: offset reservations of
   `max(4096, 2 s of sends)` rounded up to a power of two, asked for at half), with the
   byte sizes of the real encoded commands (`encode_command`, Raft `Entry`). A cursor
   changes in a flush interval when its topic got a message in it (Poisson:
   `1 - exp(-rate x interval)`).
4. The state machine's apply cost: the sampled cursor flushes applied to a
   `MetadataStateMachine` in-process (the work every replica does per entry), and the
   default bounds (`batch_keys_max`, `keys_max`, `value_bytes_max`) checked by applying.
5. The metadata store at that scale: keys, bytes, memory after `restore`, the time and
   size of `snapshot()`.
6. The same write rate with cursors out of Raft (kept next to the data, written to Raft
   only by a seal), and with one cursor record per topic flushed every second.

    .venv/bin/python benchmarks/scale_sim.py [--brokers 100] [--topics 100000]
        [--subscriptions 1000000] [--mean-rate 10] [--hours 6] [--seed 1] [--json FILE]
    .venv/bin/python benchmarks/scale_sim.py --small      # seconds: what the unit test runs

Prints a human summary, and the JSON with `--json`.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import math
import random
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import msgpack
import psutil

from danube_zmq.actors.broker.cursor_flusher import subscription_key
from danube_zmq.actors.load import assign, rebalance
from danube_zmq.actors.load.placement import Strategy
from danube_zmq.actors.load.reports import BrokerState, TopicLoad
from danube_zmq.consensus.log_store import encode_struct
from danube_zmq.consensus.state_machine import (
    Batch,
    KeyValue,
    MetadataStateMachine,
    PutWithTtl,
    RejectCode,
    Rejected,
    encode_command,
)
from danube_zmq.consensus.types import Entry, EntryKind
from danube_zmq.storage.catalog import topic_key
from danube_zmq.transport import cluster_records as cr

# The defaults of the code paths this simulation accounts for (config/broker_config.py and the
# actors named): kept here as parameters so the figures say which values they assume.
CURSOR_FLUSH_INTERVAL_MS = 100  # storage.cursor_flush_interval_ms
LEASE_TTL_MS = 6_000  # cluster.lease_ttl_ms; renewed every third (lease.py)
REPORT_INTERVAL_MS = 30_000  # load_manager.report_interval_ms
RESERVE_MIN, RESERVE_MAX, RESERVE_AHEAD_S = 4096, 1 << 22, 2.0  # actors/topic/wal/commit.py
# Measured Raft capacity (docs/performance.md, "The Raft metadata store"): 3 brokers on
# loopback, 100 B puts, every append fsynced.
RAFT_SEQUENTIAL_PUTS_S = 369
RAFT_CONCURRENT_PUTS_S = 2_721
RAFT_MEASURED_VALUE_BYTES = 100
# A move writes: the unload marker (transaction), the old owner's cursors (transaction),
# its TopicState (seal), the marker sealed, the assignment (transaction), a MoveRecord
# (put with a TTL of an hour, then its expiry): load_manager.py, hand_over.py.
ENTRIES_PER_MOVE = 7
MESSAGE_BYTES = 1024
SECOND_MS = 1000


@dataclass(frozen=True, slots=True)
class Scale:
    brokers: int = 100
    topics: int = 100_000
    subscriptions: int = 1_000_000
    mean_rate: float = 10.0  # messages/s per topic, on average (Pareto-distributed)
    rate_alpha: float = 1.5  # Pareto shape of topic rates: smaller is more skewed
    reliable_fraction: float = 1.0  # subscriptions with a persisted cursor
    subscription_churn_per_hour: float = 0.01  # fraction of subscriptions created/deleted an hour
    hours: float = 6.0  # simulated time for rebalancing
    drift_per_hour: float = 0.3  # sigma of log(rate) a topic's rate wanders in an hour
    level: rebalance.Aggressiveness = rebalance.Aggressiveness.BALANCED
    cursor_flush_interval_ms: int = CURSOR_FLUSH_INTERVAL_MS
    lease_ttl_ms: int = LEASE_TTL_MS
    report_interval_ms: int = REPORT_INTERVAL_MS
    store: bool = True  # build the whole metadata store (memory, snapshot)
    seed: int = 1

    @classmethod
    def small(cls, **overrides: Any) -> Scale:
        return dataclasses.replace(cls(brokers=8, topics=2_000, subscriptions=20_000, hours=2.0), **overrides)


@dataclass(slots=True)
class Workload:
    """The synthetic cluster: topic names, rates, subscriptions per topic."""

    topics: list[str]
    rates: list[float]
    subscriptions: list[int]  # per topic, same order

    @classmethod
    def generate(cls, scale: Scale, rng: random.Random) -> Workload:
        assert scale.subscriptions >= scale.topics >= scale.brokers >= 2
        names = [f"/tenant-{i % 1000:03d}/topic-{i:07d}" for i in range(scale.topics)]
        # Pareto rates with the requested mean: mean of paretovariate(a) is a / (a - 1).
        unit = scale.mean_rate * (scale.rate_alpha - 1) / scale.rate_alpha
        rates = [unit * rng.paretovariate(scale.rate_alpha) for _ in names]
        # One subscription each, the rest spread with the square root of the rate (busy
        # topics have more readers, not proportionally more).
        subs = [1] * scale.topics
        popular = [math.sqrt(r) for r in rates]
        for i in rng.choices(range(scale.topics), weights=popular, k=scale.subscriptions - scale.topics):
            subs[i] += 1
        return cls(names, rates, subs)

    def load(self, i: int, rate: float | None = None) -> TopicLoad:
        r = self.rates[i] if rate is None else rate
        return TopicLoad(topic=self.topics[i], msg_rate_in=r, msg_rate_out=r * self.subscriptions[i],
                         byte_rate_in=r * MESSAGE_BYTES, byte_rate_out=r * MESSAGE_BYTES * self.subscriptions[i],
                         producers=1, consumers=self.subscriptions[i], subscriptions=self.subscriptions[i])


@contextmanager
def timed(into: dict[str, float], name: str) -> Iterator[None]:
    wall, cpu = time.perf_counter(), time.process_time()
    yield
    into[f"{name}_wall_s"] = round(time.perf_counter() - wall, 3)
    into[f"{name}_cpu_s"] = round(time.process_time() - cpu, 3)


def active_brokers(n: int) -> dict[int, BrokerState]:
    return dict.fromkeys(range(1, n + 1), BrokerState.ACTIVE)


# ------------------------------------------------------------------ 1. placement

def simulate_placement(scale: Scale, work: Workload) -> tuple[dict[str, Any], dict[str, int]]:
    """Every topic placed by the load manager's round; then one broker's topics failed over."""
    out: dict[str, Any] = {}
    brokers = active_brokers(scale.brokers)
    view = assign.ClusterView(brokers=brokers, assignments={}, waiting={}, exists=frozenset(work.topics))
    with timed(out, "place_all"):
        plan = assign.plan(view, Strategy.BALANCED, {}, {}, now_ms=0, grace_ms=0)
    assert plan.unplaced == 0 and len(plan.assign) == scale.topics
    assignments = {a.topic: a.broker_id for a in plan.assign}
    per_broker = _count(assignments.values())
    out["topics_per_broker_min_max"] = [min(per_broker.values()), max(per_broker.values())]
    out["place_all_us_per_topic"] = round(out["place_all_wall_s"] / scale.topics * 1e6, 1)

    # Broker 1 is gone (its lease expired past the grace): its topics are orphaned and
    # placed again, now with every topic's load reported.
    loads = {t: work.load(i) for i, t in enumerate(work.topics)}
    survivors = {b: s for b, s in brokers.items() if b != 1}
    view = assign.ClusterView(brokers=survivors, assignments={t: (b, 1) for t, b in assignments.items()},
                              waiting={}, exists=frozenset(work.topics), absent_since_ms={1: 0})
    with timed(out, "failover_orphans"):
        orphaned = assign.plan(view, Strategy.BALANCED, {}, loads, now_ms=10_000, grace_ms=5_000)
    waiting = {o.topic: assign.Waiting(from_broker=o.from_broker, epoch=o.epoch) for o in orphaned.orphans}
    rest = {t: (b, 1) for t, b in assignments.items() if b != 1}
    view = assign.ClusterView(brokers=survivors, assignments=rest, waiting=waiting, exists=frozenset(work.topics))
    with timed(out, "failover_place"):
        replaced = assign.plan(view, Strategy.BALANCED, {}, loads, now_ms=10_000, grace_ms=5_000)
    out["failover_topics"] = len(replaced.assign)
    return out, assignments


# ------------------------------------------------------------------ 2. rebalancing

def simulate_rebalancing(scale: Scale, work: Workload, assignments: dict[str, int],
                         rng: random.Random) -> dict[str, Any]:
    """`rebalance.plan` every check interval for `hours` while rates drift; at a third of
    the run broker 1 is drained, at two thirds an empty broker joins."""
    policy = rebalance.RebalancePolicy.of(scale.level)
    step_s = policy.check_interval_s
    steps = max(1, int(scale.hours * 3600 // step_s))
    sigma = scale.drift_per_hour * math.sqrt(step_s / 3600)
    states = active_brokers(scale.brokers)
    assignments = dict(assignments)
    rates = list(work.rates)
    recent: list[int] = []
    last_moved: dict[str, int] = {}
    moves_by_hour = [0] * math.ceil(scale.hours)
    drained = joined = 0
    cv_trace = []
    plan_wall = plan_cpu = 0.0
    newcomer = scale.brokers + 1
    for step in range(steps):
        now_ms = (step + 1) * step_s * 1000
        rates = [r * math.exp(rng.gauss(-sigma * sigma / 2, sigma)) for r in rates]  # mean-preserving
        loads = {t: work.load(i, rates[i]) for i, t in enumerate(work.topics)}
        if step == steps // 3:  # broker 1 drained (admin `brokers unload`)
            moves = rebalance.drain(1, strategy=Strategy.BALANCED, states=states, reports={},
                                    assignments=assignments, loads=loads)
            for m in moves:
                assignments[m.topic] = m.to_broker
            states[1] = BrokerState.DRAINED
            drained = len(moves)
        if step == 2 * steps // 3:  # an empty broker joins
            states[newcomer] = BrokerState.ACTIVE
        wall, cpu = time.perf_counter(), time.process_time()
        plan = rebalance.plan(now_ms=now_ms, policy=policy, states=states, assignments=assignments, loads=loads,
                              created_ms={}, last_moved_ms=last_moved, recent_moves_ms=recent)
        plan_wall += time.perf_counter() - wall
        plan_cpu += time.process_time() - cpu
        for m in plan.moves:
            assignments[m.topic] = m.to_broker
            last_moved[m.topic] = now_ms
            recent.append(now_ms)
            moves_by_hour[min(len(moves_by_hour) - 1, (now_ms - 1) // rebalance.HOUR_MS)] += 1
        cv_trace.append(round(plan.balance.cv, 3))
    joined = sum(1 for b in assignments.values() if b == newcomer)
    after = rebalance.measure(rebalance.broker_loads(
        [b for b, s in states.items() if s is BrokerState.ACTIVE], assignments,
        {t: work.load(i, rates[i]) for i, t in enumerate(work.topics)}))
    return {
        "policy": dataclasses.asdict(policy) | {"level": scale.level.value},
        "plans": steps, "plan_wall_s_mean": round(plan_wall / steps, 4), "plan_cpu_s_mean": round(plan_cpu / steps, 4),
        "moves_by_hour": moves_by_hour, "moves_per_hour_max": max(moves_by_hour),
        "drain_moves": drained, "topics_on_joined_broker": joined,
        "cv_min_max": [min(cv_trace), max(cv_trace)], "cv_end": round(after.cv, 3),
        "joined_broker_load_vs_mean": round(after.loads.get(newcomer, 0.0) / after.mean, 3) if after.mean else 0.0,
    }


# ------------------------------------------------------------------ 3. Raft writes

@dataclass(slots=True)
class Source:
    """One kind of Raft write: entries/s, keys/s, command bytes/s, and the size of one."""

    entries_s: float = 0.0
    keys_s: float = 0.0
    bytes_s: float = 0.0
    largest_entry_keys: int = 0
    largest_entry_bytes: int = 0
    note: str = ""

    def add(self, count_s: float, keys: int, size: int) -> None:
        self.entries_s += count_s
        self.keys_s += count_s * keys
        self.bytes_s += count_s * size
        self.largest_entry_keys = max(self.largest_entry_keys, keys)
        self.largest_entry_bytes = max(self.largest_entry_bytes, size)

    def as_dict(self) -> dict[str, Any]:
        return {k: round(v, 2) if isinstance(v, float) else v for k, v in dataclasses.asdict(self).items()}


def entry_bytes(command: bytes, index: int = 10_000_000, term: int = 10) -> int:
    """A command's size as a Raft log entry (what is appended, fsynced and replicated)."""
    return len(encode_struct(Entry(index=index, term=term, kind=int(EntryKind.COMMAND), data=command)))


def cursor_record(rng: random.Random) -> bytes:
    # A live cursor: an offset in the hundreds of millions, a few acks above it.
    cursor = rng.randrange(10**8, 10**9)
    return cr.encode(cr.CursorRecord(sub_type=1, cursor=cursor,
                                     acked_above=sorted(rng.sample(range(cursor + 1, cursor + 64), rng.randrange(4)))))


def changed_probability(rate: float, interval_ms: int) -> float:
    """A cursor moves in an interval when its topic got at least one message in it."""
    return 1.0 - math.exp(-rate * interval_ms / SECOND_MS)


def cursor_flushes(scale: Scale, work: Workload, assignments: dict[str, int], rng: random.Random,
                   ) -> dict[int, Batch]:
    """One flush interval's transaction per broker: every reliable cursor whose topic got
    a message (`CursorFlusher._flush`)."""
    puts: dict[int, list[KeyValue]] = {b: [] for b in range(1, scale.brokers + 1)}
    for i, topic in enumerate(work.topics):
        p = changed_probability(work.rates[i], scale.cursor_flush_interval_ms)
        batch = puts[assignments[topic]]
        for s in range(work.subscriptions[i]):
            if rng.random() < scale.reliable_fraction and rng.random() < p:
                batch.append(KeyValue(key=subscription_key(topic, f"sub-{s:03d}"), value=cursor_record(rng)))
    return {b: Batch(puts=kv, deletes=[]) for b, kv in puts.items() if kv}


def raft_writes(scale: Scale, work: Workload, assignments: dict[str, int], flushes: dict[int, Batch],
                moves_per_hour: float, rng: random.Random) -> dict[str, Source]:
    per_s = SECOND_MS / scale.cursor_flush_interval_ms
    sources: dict[str, Source] = {}
    cursors = sources["cursors"] = Source(note=f"one Batch per broker every {scale.cursor_flush_interval_ms} ms")
    for batch in flushes.values():
        cursors.add(per_s, len(batch.puts), entry_bytes(encode_command(batch)))

    lease = sources["leases"] = Source(note=f"PutWithTtl every {scale.lease_ttl_ms // 3} ms per broker")
    registration = cr.encode(cr.BrokerRegistration(broker_id=100, broker_url="tcp://10.77.1.100:6650",
                                                   admin_url="tcp://10.77.1.100:50051", raft_node_id=100,
                                                   started_ms=1_790_000_000_000,
                                                   metrics_url="http://10.77.1.100:9040/metrics"))
    renewal = PutWithTtl(key=cr.register_key(100), value=registration, ttl_ms=scale.lease_ttl_ms,
                         now_ms=1_790_000_000_000)
    lease.add(scale.brokers * SECOND_MS / (scale.lease_ttl_ms // 3), 1, entry_bytes(encode_command(renewal)))

    reports = sources["load_reports"] = Source(note=f"PutWithTtl every {scale.report_interval_ms} ms per broker")
    by_broker: dict[int, list[int]] = {}
    for i, topic in enumerate(work.topics):
        by_broker.setdefault(assignments[topic], []).append(i)
    for broker, indexes in by_broker.items():
        record = cr.LoadReportRecord(broker_id=broker, cpu_percent=41.5, memory_percent=63.2, topics=[
            cr.TopicLoadRecord(topic=work.topics[i], **_load_fields(work.load(i))) for i in indexes],
            reported_ms=1_790_000_000_000)
        put = PutWithTtl(key=cr.load_key(broker), value=cr.encode(record), ttl_ms=3 * scale.report_interval_ms,
                         now_ms=1_790_000_000_000)
        reports.add(SECOND_MS / scale.report_interval_ms, 1, entry_bytes(encode_command(put)))

    reservations = sources["offset_reservations"] = Source(
        note="TopicState per reliable topic each half block (block: 2 s of sends, >= 4096)")
    state = cr.encode(cr.TopicState(next_offset=0, broker_id=100, sealed_ms=0, reserved_until=123_456_789_012))
    one = Batch(puts=[KeyValue(key=cr.topic_state_key(work.topics[-1]), value=state)], deletes=[])
    size = entry_bytes(encode_command(one))
    for rate in work.rates:
        if scale.reliable_fraction > 0:  # a topic with a reliable subscription reserves
            reservations.add(rate / (reserve_block(rate) / 2), 1, size)

    moves = sources["rebalancing"] = Source(note=f"{ENTRIES_PER_MOVE} entries per move")
    moves.add(moves_per_hour * ENTRIES_PER_MOVE / 3600, 1, 200)

    churn = sources["subscription_churn"] = Source(note="a cursor created or deleted")
    churn.add(scale.subscriptions * scale.reliable_fraction * scale.subscription_churn_per_hour / 3600, 1,
              entry_bytes(encode_command(Batch(puts=[KeyValue(key=subscription_key(work.topics[-1], "sub-000"),
                                                               value=cursor_record(rng))], deletes=[]))))
    return sources


def reserve_block(rate: float) -> int:
    """`WalStorage`'s reservation block for a topic sending `rate` messages/s."""
    wanted = max(RESERVE_MIN, min(RESERVE_MAX, int(rate * RESERVE_AHEAD_S)))
    return 1 << (wanted - 1).bit_length()


def _load_fields(load: TopicLoad) -> dict[str, Any]:
    return {f: getattr(load, f) for f in ("msg_rate_in", "msg_rate_out", "byte_rate_in", "byte_rate_out",
                                          "producers", "consumers", "subscriptions", "backlog")}


def totals(sources: dict[str, Source], *, without: frozenset[str] = frozenset()) -> dict[str, float]:
    kept = [s for name, s in sources.items() if name not in without]
    return {"entries_s": round(sum(s.entries_s for s in kept), 1), "keys_s": round(sum(s.keys_s for s in kept), 1),
            "bytes_s": round(sum(s.bytes_s for s in kept), 1)}


def cursors_per_topic(scale: Scale, work: Workload, assignments: dict[str, int], rng: random.Random,
                      interval_ms: int = SECOND_MS) -> Source:
    """The interim plan: one record per topic holding all its subscriptions' cursors,
    each broker writing the changed topics' records once per `interval_ms`."""
    per_s = SECOND_MS / interval_ms
    keys: dict[int, int] = {}
    sizes: dict[int, int] = {}
    for i, topic in enumerate(work.topics):
        reliable = [s for s in range(work.subscriptions[i]) if rng.random() < scale.reliable_fraction]
        if reliable and rng.random() < changed_probability(work.rates[i], interval_ms):
            value = msgpack.packb([[f"sub-{s:03d}", cursor_record(rng)] for s in reliable], use_bin_type=True)
            b = assignments[topic]
            keys[b] = keys.get(b, 0) + 1
            sizes[b] = sizes.get(b, 0) + len(f"{topic_key(topic)}/cursors") + len(value) + 8
    source = Source(note=f"one record per topic, one Batch per broker every {interval_ms} ms")
    for b in keys:
        source.add(per_s, keys[b], sizes[b] + 16)
    return source


# ------------------------------------------------------------------ 4. apply cost

def apply_cost(flushes: dict[int, Batch], *, keys_limit: int) -> dict[str, Any]:
    """The cursor flushes applied to one replica's state machine: the first round
    creates the keys, the second (measured) updates them, as every flush after."""
    machine = MetadataStateMachine(batch_keys_max=max(4096, *(len(b.puts) for b in flushes.values())),
                                   keys_max=max(1_000_000, keys_limit))
    commands = [encode_command(b) for b in flushes.values()]
    index = 0
    for data in commands:
        index += 1
        machine.apply(index, data)
    keys = sum(len(b.puts) for b in flushes.values())
    gc.collect()
    wall = time.perf_counter()
    for data in commands:
        index += 1
        result = machine.apply(index, data)
        assert not isinstance(result, Rejected), result
    seconds = time.perf_counter() - wall
    # The default bound: the largest flush applied to a state machine as shipped.
    largest = max(flushes.values(), key=lambda b: len(b.puts))
    default = MetadataStateMachine().apply(1, encode_command(largest))
    return {"keys": keys, "entries": len(commands), "apply_s": round(seconds, 4),
            "us_per_key": round(seconds / keys * 1e6, 2) if keys else 0.0,
            "largest_flush_keys": len(largest.puts),
            "largest_flush_with_default_bounds": ("rejected: " + RejectCode(default.code).name)
            if isinstance(default, Rejected) else "applied"}


# ------------------------------------------------------------------ 5. store size

def store_keys(scale: Scale, work: Workload, assignments: dict[str, int], rng: random.Random,
               ) -> Iterator[tuple[str, bytes, int | None]]:
    """Every key the store holds at this scale: (key, value, ttl_ms)."""
    now = 1_790_000_000_000
    for b in range(1, scale.brokers + 1):
        yield cr.register_key(b), b"x" * 120, scale.lease_ttl_ms
        yield cr.state_key(b), cr.encode(cr.BrokerStateRecord(mode="active", reason="")), None
    for i, topic in enumerate(work.topics):
        yield cr.topic_record_key(topic), cr.encode(cr.TopicRecord(dispatch_strategy=1, partitions=0,
                                                                   created_ms=now)), None
        yield cr.assignment_key(topic), cr.encode(cr.Assignment(broker_id=assignments[topic], epoch=3,
                                                                assigned_ms=now)), None
        yield cr.topic_state_key(topic), cr.encode(cr.TopicState(next_offset=0, broker_id=assignments[topic],
                                                                 sealed_ms=0, reserved_until=10**9)), None
        yield cr.producer_key(topic, 1), cr.encode(cr.ProducerRecord(producer_id=1, producer_name=f"p-{i}",
                                                                     topic=topic, access_mode=0,
                                                                     broker_id=assignments[topic])), None
        for s in range(work.subscriptions[i]):
            if rng.random() < scale.reliable_fraction:
                yield subscription_key(topic, f"sub-{s:03d}"), cursor_record(rng), None


def store_size(scale: Scale, work: Workload, assignments: dict[str, int], rng: random.Random,
               load_report_bytes: int) -> dict[str, Any]:
    """The whole keyspace restored into a state machine (as a follower installs a
    snapshot): keys, memory, and what `snapshot()` costs."""
    rows = sorted([k, v, 1, 7, 7, ttl, None if ttl is None else 1_790_000_000_000 + ttl]
                  for k, v, ttl in store_keys(scale, work, assignments, rng))
    keys = len(rows)
    for b in range(1, scale.brokers + 1):  # each broker's load report, at its real size
        rows.append([cr.load_key(b), b"r" * (load_report_bytes // scale.brokers), 1, 7, 7,
                     3 * scale.report_interval_ms, 1_790_000_000_000])
    rows.sort(key=lambda r: r[0])
    data = msgpack.packb([1, 7, 10_000, rows, []], use_bin_type=True)
    payload = sum(len(r[0]) + len(r[1]) for r in rows)
    del rows
    gc.collect()
    process = psutil.Process()
    before = process.memory_info().rss
    machine = MetadataStateMachine(keys_max=max(1_000_000, keys + scale.brokers))
    out: dict[str, Any] = {}
    with timed(out, "restore"):
        machine.restore(data)
    del data
    gc.collect()
    out["rss_bytes"] = process.memory_info().rss - before
    with timed(out, "snapshot"):
        snapshot = machine.snapshot()
    out |= {"keys": keys + scale.brokers, "keys_max_default": 1_000_000, "payload_bytes": payload,
            "snapshot_bytes": len(snapshot),
            "rss_bytes_per_key": round(out["rss_bytes"] / (keys + scale.brokers), 1)}
    return out


# ------------------------------------------------------------------ the run

def run(scale: Scale, *, log: Callable[[str], None] = lambda s: None) -> dict[str, Any]:
    rng = random.Random(scale.seed)
    work = Workload.generate(scale, rng)
    log(f"workload: {scale.topics} topics, {sum(work.subscriptions)} subscriptions, "
        f"{sum(work.rates):,.0f} msg/s in")
    placement, assignments = simulate_placement(scale, work)
    log(f"placement: {placement}")
    balancing = simulate_rebalancing(scale, work, assignments, rng)
    log(f"rebalancing: {balancing}")
    flushes = cursor_flushes(scale, work, assignments, rng)
    sources = raft_writes(scale, work, assignments, flushes, balancing["moves_per_hour_max"], rng)
    interim = cursors_per_topic(scale, work, assignments, rng)
    applied = apply_cost(flushes, keys_limit=sum(len(b.puts) for b in flushes.values()))
    log(f"apply: {applied}")
    out: dict[str, Any] = {
        "scale": dataclasses.asdict(scale) | {"level": scale.level.value},
        "workload": {"messages_in_s": round(sum(work.rates)), "subscriptions": sum(work.subscriptions),
                     "topic_rate_median": round(sorted(work.rates)[len(work.rates) // 2], 2),
                     "topic_rate_max": round(max(work.rates))},
        "placement": placement, "rebalancing": balancing,
        "raft_writes": {name: s.as_dict() for name, s in sources.items()},
        "raft_total": totals(sources),
        "raft_total_cursors_out": totals(sources, without=frozenset({"cursors"})),
        "raft_total_cursors_per_topic": totals({**sources, "cursors": interim}),
        "cursors_per_topic": interim.as_dict(),
        "raft_capacity": {"sequential_puts_s": RAFT_SEQUENTIAL_PUTS_S, "concurrent_puts_s": RAFT_CONCURRENT_PUTS_S,
                          "value_bytes": RAFT_MEASURED_VALUE_BYTES},
        "apply": applied,
    }
    # The state machine's CPU per second for the cursor writes alone, on every replica.
    out["apply"]["cursor_apply_cpu_s_per_s"] = round(sources["cursors"].keys_s * applied["us_per_key"] / 1e6, 3)
    if scale.store:
        out["store"] = store_size(scale, work, assignments, rng,
                                  int(sources["load_reports"].bytes_s * scale.report_interval_ms / SECOND_MS))
        log(f"store: {out['store']}")
    return out


def _count(values: Any) -> dict[int, int]:
    counts: dict[int, int] = {}
    for v in values:
        counts[v] = counts.get(v, 0) + 1
    return counts


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--small", action="store_true", help="8 brokers, 2,000 topics, 20,000 subscriptions")
    for f in dataclasses.fields(Scale):
        if f.type in ("int", "float"):
            parser.add_argument(f"--{f.name.replace('_', '-')}", type=int if f.type == "int" else float)
    parser.add_argument("--level", choices=[a.value for a in rebalance.Aggressiveness])
    parser.add_argument("--no-store", action="store_true", help="skip building the whole metadata store")
    parser.add_argument("--json", help="write the figures to this file too")
    args = parser.parse_args(argv)
    given = {f.name: getattr(args, f.name) for f in dataclasses.fields(Scale)
             if f.type in ("int", "float") and getattr(args, f.name) is not None}
    if args.level:
        given["level"] = rebalance.Aggressiveness(args.level)
    if args.no_store:
        given["store"] = False
    scale = Scale.small(**given) if args.small else Scale(**given)
    print(f"seed {scale.seed}", file=sys.stderr)
    result = run(scale, log=lambda s: print(s, file=sys.stderr, flush=True))
    text = json.dumps(result, indent=1, default=str)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()

"""The load manager's assignment decisions (actors/load/assign.py) and the cluster
records they are stored as (transport/cluster_records.py)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from danube_zmq.actors.load.assign import ClusterView, Waiting, plan
from danube_zmq.actors.load.placement import Strategy
from danube_zmq.actors.load.reports import BrokerState
from danube_zmq.transport import cluster_records as cr
from danube_zmq.transport.errors import InvalidArgument

GRACE = 1_000

states = st.sampled_from(list(BrokerState))
broker_ids = st.integers(1, 6)


@st.composite
def views(draw: st.DrawFn) -> ClusterView:
    brokers = draw(st.dictionaries(broker_ids, states, max_size=5))
    topics = [f"/ns/t{i}" for i in range(draw(st.integers(0, 30)))]
    deleted = set(draw(st.lists(st.sampled_from(topics), max_size=3))) if topics else set()
    exists = set(topics) - deleted
    assignments = {}
    waiting = {}
    for topic in topics:
        kind = draw(st.sampled_from(["assigned", "waiting", "none"]))
        if kind == "assigned":
            assignments[topic] = (draw(broker_ids), draw(st.integers(1, 5)))
        elif kind == "waiting":
            waiting[topic] = Waiting(from_broker=draw(st.none() | broker_ids), to_broker=draw(st.none() | broker_ids),
                                     epoch=draw(st.integers(0, 5)), sealed=draw(st.booleans()))
    absent = {b: draw(st.integers(0, 2 * GRACE)) for b in draw(st.lists(broker_ids, max_size=3)) if b not in brokers}
    pinned = set(draw(st.lists(st.sampled_from(topics), max_size=10))) if topics else set()
    return ClusterView(brokers=brokers, assignments=assignments, waiting=waiting, exists=exists,
                       absent_since_ms=absent, pinned=pinned)


@given(views(), st.sampled_from(list(Strategy)), st.integers(0, 100))
def test_decisions_keep_the_rules(view: ClusterView, strategy: Strategy, cursor: int) -> None:
    now = 2 * GRACE
    decided = plan(view, strategy, {}, {}, now_ms=now, grace_ms=GRACE, cursor=cursor)
    for choice in decided.assign:
        marker = view.waiting.get(choice.topic, Waiting())  # a topic with neither is new
        assert view.brokers[choice.broker_id] is BrokerState.ACTIVE  # only live ACTIVE brokers take topics
        others = [b for b, s in view.brokers.items() if s is BrokerState.ACTIVE and b != marker.from_broker]
        assert choice.broker_id != marker.from_broker or not others  # back only when it is the only one
        assert choice.topic in view.exists and choice.topic not in view.assignments
        assert choice.epoch == marker.epoch + 1
        assert marker.sealed or marker.from_broker not in view.brokers  # never before the old owner sealed it
        # A topic whose data is on its old broker's disk only waits for it to seal (or a forced reassignment).
        assert marker.sealed or choice.topic not in view.pinned
        if marker.to_broker is not None and view.brokers.get(marker.to_broker) is BrokerState.ACTIVE \
                and marker.to_broker != marker.from_broker:
            assert choice.broker_id == marker.to_broker  # a rebalance's target is kept
    assert len({c.topic for c in decided.assign}) == len(decided.assign)
    for orphan in decided.orphans:
        assert orphan.topic not in view.pinned  # its data went with its broker: only an operator moves it
        assert orphan.from_broker not in view.brokers  # only brokers whose lease is gone
        assert now - decided.absent_since_ms[orphan.from_broker] >= GRACE
        assert view.assignments[orphan.topic] == (orphan.from_broker, orphan.epoch)
    assert set(decided.drop) == {t for t in view.waiting if t not in view.exists}
    placeable = [t for t, m in view.waiting.items() if t in view.exists and t not in view.assignments
                 and (m.sealed or (m.from_broker not in view.brokers and t not in view.pinned))]
    placeable += [t for t in view.exists if t not in view.assignments and t not in view.waiting
                  and t not in view.damaged]
    assert len(decided.assign) + decided.unplaced == len(placeable)
    if not any(s is BrokerState.ACTIVE for s in view.brokers.values()):
        assert not decided.assign


def test_a_partition_with_neither_marker_nor_assignment_is_placed_as_new() -> None:
    """A topic (or partition) that exists with no assignment and no unassigned marker (a
    topic too large for one metadata batch whose creator stopped between its batches)
    is placed like a new one, epoch 1, instead of staying unserved forever."""
    view = ClusterView(brokers={1: BrokerState.ACTIVE}, assignments={"/ns/t-part-0": (1, 1)},
                       waiting={"/ns/t-part-1": Waiting()}, exists={f"/ns/t-part-{i}" for i in range(3)})
    decided = plan(view, Strategy.FAIR, {}, {}, now_ms=0, grace_ms=GRACE)
    assert sorted((a.topic, a.broker_id, a.epoch) for a in decided.assign) == [("/ns/t-part-1", 1, 1),
                                                                               ("/ns/t-part-2", 1, 1)]


def test_a_missing_broker_is_orphaned_only_after_the_grace() -> None:
    view = ClusterView(brokers={1: BrokerState.ACTIVE}, assignments={"/ns/a": (2, 3)}, waiting={},
                       exists={"/ns/a"})
    first = plan(view, Strategy.FAIR, {}, {}, now_ms=10_000, grace_ms=GRACE)
    assert first.orphans == () and first.absent_since_ms == {2: 10_000}
    later = ClusterView(brokers=view.brokers, assignments=view.assignments, waiting={}, exists=view.exists,
                        absent_since_ms=first.absent_since_ms)
    assert plan(later, Strategy.FAIR, {}, {}, now_ms=10_999, grace_ms=GRACE).orphans == ()
    [orphan] = plan(later, Strategy.FAIR, {}, {}, now_ms=11_000, grace_ms=GRACE).orphans
    assert (orphan.topic, orphan.from_broker, orphan.epoch) == ("/ns/a", 2, 3)
    # Back before the grace ran out: forgotten, nothing moves.
    back = ClusterView(brokers={1: BrokerState.ACTIVE, 2: BrokerState.ACTIVE}, assignments=view.assignments,
                       waiting={}, exists=view.exists, absent_since_ms=first.absent_since_ms)
    assert plan(back, Strategy.FAIR, {}, {}, now_ms=20_000, grace_ms=GRACE).absent_since_ms == {}


def test_a_dead_brokers_local_topics_wait_for_it_or_a_forced_reassignment() -> None:
    """In storage.mode local a reliable topic's WAL is on its broker's disk only: when the
    broker is gone its topic is not orphaned (another broker would serve it without its
    messages), an unload it never sealed waits, and only a forced reassignment (a sealed
    failover marker) places it. Its unpinned neighbour fails over as before."""
    view = ClusterView(brokers={1: BrokerState.ACTIVE}, assignments={"/ns/wal": (2, 3), "/ns/mem": (2, 3)},
                       waiting={"/ns/unloading": Waiting(from_broker=2, epoch=1, sealed=False)},
                       exists={"/ns/wal", "/ns/mem", "/ns/unloading"}, absent_since_ms={2: 0},
                       pinned={"/ns/wal", "/ns/unloading"})
    decided = plan(view, Strategy.FAIR, {}, {}, now_ms=GRACE, grace_ms=GRACE)
    assert [o.topic for o in decided.orphans] == ["/ns/mem"]
    assert decided.assign == ()
    forced = ClusterView(brokers=view.brokers, assignments={"/ns/mem": (1, 4)}, exists=view.exists,
                         pinned=view.pinned,
                         waiting={"/ns/wal": Waiting(from_broker=2, epoch=3, sealed=True),
                                  "/ns/unloading": view.waiting["/ns/unloading"]})
    [choice] = plan(forced, Strategy.FAIR, {}, {}, now_ms=GRACE, grace_ms=GRACE).assign
    assert (choice.topic, choice.broker_id, choice.epoch) == ("/ns/wal", 1, 4)


def test_a_dead_brokers_damaged_topic_waits_in_every_storage_mode() -> None:
    """A topic whose WAL is damaged (its broker recorded it; no durable segment covers
    it) is held like a pinned one even in a durable mode (nothing pinned): its broker
    gone, it is not orphaned and its unsealed unload waits, so no broker serves it from
    an empty log; its healthy neighbour fails over, and a forced reassignment places it."""
    view = ClusterView(brokers={1: BrokerState.ACTIVE}, assignments={"/ns/bad": (2, 3), "/ns/ok": (2, 3)},
                       waiting={"/ns/bad-leaving": Waiting(from_broker=2, epoch=1, sealed=False)},
                       exists={"/ns/bad", "/ns/ok", "/ns/bad-leaving"}, absent_since_ms={2: 0},
                       damaged={"/ns/bad", "/ns/bad-leaving"})
    decided = plan(view, Strategy.FAIR, {}, {}, now_ms=GRACE, grace_ms=GRACE)
    assert [o.topic for o in decided.orphans] == ["/ns/ok"]
    assert decided.assign == ()
    forced = ClusterView(brokers=view.brokers, assignments={"/ns/ok": (1, 4)}, exists=view.exists,
                         damaged=view.damaged,
                         waiting={"/ns/bad": Waiting(from_broker=2, epoch=3, sealed=True),
                                  "/ns/bad-leaving": view.waiting["/ns/bad-leaving"]})
    [choice] = plan(forced, Strategy.FAIR, {}, {}, now_ms=GRACE, grace_ms=GRACE).assign
    assert (choice.topic, choice.broker_id) == ("/ns/bad", 1)


@given(views(), st.data())
def test_a_damaged_topic_is_never_orphaned_nor_placed_before_its_seal(view: ClusterView, data: st.DataObject) -> None:
    """Whatever the cluster, a damaged topic is never posted unassigned by the planner and
    never placed from a marker its broker did not seal."""
    topics = sorted(set(view.assignments) | set(view.waiting))
    damaged = set(data.draw(st.lists(st.sampled_from(topics), max_size=10))) if topics else set()
    view = ClusterView(brokers=view.brokers, assignments=view.assignments, waiting=view.waiting, exists=view.exists,
                       absent_since_ms=view.absent_since_ms, pinned=view.pinned, damaged=damaged)
    decided = plan(view, Strategy.FAIR, {}, {}, now_ms=2 * GRACE, grace_ms=GRACE)
    assert not {o.topic for o in decided.orphans} & damaged
    assert all(view.waiting[c.topic].sealed for c in decided.assign if c.topic in damaged)


@pytest.mark.parametrize("strategy", list(Strategy))
@given(count=st.integers(1, 40), active=st.integers(1, 5))
def test_new_topics_spread_evenly_on_an_idle_cluster(strategy: Strategy, count: int, active: int) -> None:
    view = ClusterView(brokers={b: BrokerState.ACTIVE for b in range(1, active + 1)}, assignments={},
                       waiting={f"/ns/p-part-{i}": Waiting() for i in range(count)},
                       exists={f"/ns/p-part-{i}" for i in range(count)})
    decided = plan(view, strategy, {}, {}, now_ms=0, grace_ms=GRACE)
    per_broker = [sum(1 for c in decided.assign if c.broker_id == b) for b in view.brokers]
    assert len(decided.assign) == count
    assert max(per_broker) - min(per_broker) <= 1


def test_records_round_trip_and_refuse_the_wrong_kind() -> None:
    record = cr.Assignment(broker_id=7, epoch=2, assigned_ms=123)
    assert cr.decode(cr.encode(record), cr.Assignment) == record
    with pytest.raises(InvalidArgument, match="is a Assignment, expected TopicRecord"):
        cr.decode(cr.encode(record), cr.TopicRecord)
    with pytest.raises(InvalidArgument):
        cr.decode(b"\x93garbage", cr.Assignment)
    assert cr.topic_of(cr.assignment_key("/ns/t-part-1"), cr.ASSIGNMENTS) == "/ns/t-part-1"
    assert cr.broker_of(cr.state_key(42), cr.BROKERS) == 42
    assert cr.broker_of(cr.register_key(9), cr.REGISTER) == 9


class CountingLoads(dict):
    """Topic loads that count every lookup: the work placement does per topic."""

    lookups = 0

    def get(self, key, default=None):  # type: ignore[override]
        CountingLoads.lookups += 1
        return super().get(key, default)

    def __getitem__(self, key):
        CountingLoads.lookups += 1
        return super().__getitem__(key)

    def __contains__(self, key):
        CountingLoads.lookups += 1
        return super().__contains__(key)


@pytest.mark.parametrize("strategy", [Strategy.BALANCED, Strategy.WEIGHTED_LOAD])
def test_placing_a_burst_of_topics_reads_each_topic_load_a_bounded_number_of_times(strategy: Strategy) -> None:
    """Placing N waiting topics on a cluster with A assigned ones looks up topic loads
    O(A + N) times, not once per assigned topic for every placed one (O(N x A), what
    starved the event loop at 12k partitions): a counting fake, no timing."""
    assigned = {f"/ns/a{i}": (1 + i % 3, 1) for i in range(2_000)}
    waiting = {f"/ns/w{i}": Waiting() for i in range(2_000)}
    view = ClusterView(brokers=dict.fromkeys((1, 2, 3), BrokerState.ACTIVE), assignments=assigned,
                       waiting=waiting, exists=set(assigned) | set(waiting))
    CountingLoads.lookups = 0
    decided = plan(view, strategy, {}, CountingLoads(), now_ms=0, grace_ms=GRACE)
    assert len(decided.assign) == 2_000
    assert CountingLoads.lookups <= 3 * (len(assigned) + len(waiting))

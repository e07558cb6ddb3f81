"""The load manager's pure core: placement strategies and rebalancing decisions, with
property tests over random clusters (never a non-active broker, never past the hourly
cap, every move narrows a gap so nothing oscillates, a skewed cluster converges)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from danube_zmq.actors.load import (
    Aggressiveness,
    BrokerState,
    LoadReport,
    RebalancePolicy,
    Strategy,
    TopicLoad,
    broker_loads,
    drain,
    measure,
    place,
    plan,
    scores,
    topic_loads,
)
from danube_zmq.actors.load.rebalance import HOUR_MS, blacklisted
from danube_zmq.transport.errors import InvalidArgument, Unavailable

ACTIVE, DRAINING, DRAINED = BrokerState.ACTIVE, BrokerState.DRAINING, BrokerState.DRAINED
MIB = 1024 * 1024


def topic(i: int) -> str:
    return f"/default/t{i}"


states_strategy = st.dictionaries(st.integers(1, 6), st.sampled_from(list(BrokerState)), min_size=1, max_size=6)


@st.composite
def clusters(draw: st.DrawFn) -> tuple[dict[int, BrokerState], dict[str, int], dict[str, TopicLoad]]:
    states = draw(states_strategy)
    brokers = sorted(states)
    count = draw(st.integers(0, 40))
    assignments = {topic(i): draw(st.sampled_from(brokers)) for i in range(count)}
    loads = {}
    for name in assignments:
        if draw(st.booleans()):
            loads[name] = TopicLoad(topic=name, byte_rate_in=draw(st.floats(0, 5 * MIB)),
                                    producers=draw(st.integers(0, 5)), consumers=draw(st.integers(0, 5)),
                                    backlog=draw(st.integers(0, 100_000)))
    return states, assignments, loads


def squares(loads: dict[int, float]) -> float:
    return sum(v * v for v in loads.values())


# ---------------------------------------------------------------- loads


def test_topic_load_is_danubes_weighted_sum() -> None:
    load = TopicLoad(topic=topic(1), byte_rate_in=MIB, byte_rate_out=MIB, producers=1, consumers=2, backlog=20_000)
    assert load.weight == pytest.approx(0.2 + 0.3 * 2 + 0.3 * 3 + 0.2 * 2)
    assert broker_loads([1, 2], {topic(1): 1, topic(2): 1}, {topic(1): load}) == {1: pytest.approx(load.weight + 0.2),
                                                                                 2: 0.0}


def test_a_published_backlog_report_raises_a_topics_backlog() -> None:
    reports = {1: LoadReport(broker_id=1, topics=(TopicLoad(topic=topic(1), backlog=10),))}
    assert topic_loads(reports, {topic(1): 50_000, topic(9): 5})[topic(1)].backlog == 50_000
    assert topic_loads(reports, {topic(1): 3})[topic(1)].backlog == 10
    assert topic_loads(reports, {topic(9): 5})[topic(9)] == TopicLoad(topic=topic(9), backlog=5)


# ---------------------------------------------------------------- placement


@given(clusters(), st.sampled_from(list(Strategy)), st.integers(0, 100))
def test_placement_only_picks_an_active_broker_within_10_percent_of_the_best(cluster, strategy, cursor) -> None:
    states, assignments, loads = cluster
    reports = {b: LoadReport(broker_id=b, cpu_percent=10.0 * b, memory_percent=5.0 * b) for b in states}
    if ACTIVE not in states.values():
        with pytest.raises(Unavailable):
            place(strategy, states, reports, assignments, loads, cursor=cursor)
        return
    chosen = place(strategy, states, reports, assignments, loads, cursor=cursor)
    assert states[chosen.broker_id] is ACTIVE
    scored = dict(chosen.scores)
    assert set(scored) == {b for b, s in states.items() if s is ACTIVE}
    best = min(scored.values())
    assert scored[chosen.broker_id] <= best + 0.1 * abs(best) + 1e-12


def test_fair_placement_takes_turns_and_spreads_a_burst() -> None:
    states = {1: ACTIVE, 2: ACTIVE, 3: ACTIVE, 4: DRAINING}
    assignments: dict[str, int] = {}
    cursor = 0
    for i in range(30):
        chosen = place(Strategy.FAIR, states, {}, assignments, {}, cursor=cursor)
        assignments[topic(i)], cursor = chosen.broker_id, chosen.cursor
    counts = [list(assignments.values()).count(b) for b in (1, 2, 3, 4)]
    assert counts == [10, 10, 10, 0]


def test_balanced_placement_weighs_cpu_and_memory() -> None:
    states = {1: ACTIVE, 2: ACTIVE}
    reports = {1: LoadReport(broker_id=1, cpu_percent=90, memory_percent=80), 2: LoadReport(broker_id=2)}
    assignments = {topic(1): 2}  # broker 2 has the only topic but no resource use
    scored = scores(Strategy.BALANCED, states, reports, assignments, {})
    assert scored == {1: pytest.approx(0.35 * 0.9 + 0.35 * 0.8), 2: pytest.approx(0.3)}
    assert place(Strategy.BALANCED, states, reports, assignments, {}).broker_id == 2


def test_weighted_load_gives_a_bottleneck_half_the_weight() -> None:
    states = {1: ACTIVE, 2: ACTIVE}
    reports = {1: LoadReport(broker_id=1, cpu_percent=95), 2: LoadReport(broker_id=2, cpu_percent=40)}
    scored = scores(Strategy.WEIGHTED_LOAD, states, reports, {}, {})
    # broker 1: CPU 0.95 > 0.7 weighs 0.5, the three other metrics (all 0) 1/6 each
    assert scored[1] == pytest.approx(0.5 * 0.95)
    assert scored[2] == pytest.approx(0.25 * 0.4)


def test_placement_can_exclude_the_broker_a_topic_leaves() -> None:
    states = {1: ACTIVE, 2: ACTIVE}
    assert place(Strategy.FAIR, states, {}, {topic(1): 2}, {}, exclude=frozenset({1})).broker_id == 2
    with pytest.raises(Unavailable):
        place(Strategy.FAIR, {1: ACTIVE, 2: DRAINED}, {}, {}, {}, exclude=frozenset({1}))


# ---------------------------------------------------------------- balance and policy


def test_measure_names_overloaded_and_underloaded_brokers() -> None:
    balance = measure({1: 10.0, 2: 2.0, 3: 0.0, 4: 4.0})
    assert balance.mean == 4.0
    assert balance.cv == pytest.approx(balance.std / 4.0)
    assert balance.overloaded == {1} and balance.underloaded == {3}
    assert measure({}).cv == 0.0 and measure({1: 0.0}).cv == 0.0


def test_policy_levels_and_their_checks() -> None:
    assert RebalancePolicy.of(Aggressiveness.CONSERVATIVE).max_moves_per_hour == 5
    assert RebalancePolicy.of(Aggressiveness.AGGRESSIVE).cv_threshold == 0.20
    custom = RebalancePolicy.of(Aggressiveness.BALANCED, cooldown_s=5, blacklist=("/system/*",))
    assert (custom.cv_threshold, custom.cooldown_s) == (0.30, 5)
    with pytest.raises(InvalidArgument, match="max_moves_per_hour"):
        RebalancePolicy.of(Aggressiveness.BALANCED, max_moves_per_hour=0)
    with pytest.raises(InvalidArgument, match="blacklist"):
        RebalancePolicy.of(Aggressiveness.BALANCED, blacklist=("orders",))


def test_blacklist_matches_names_partitions_and_namespaces() -> None:
    patterns = ("/default/orders", "/system/*")
    assert blacklisted("/default/orders", patterns)
    assert blacklisted("/default/orders-part-3", patterns)
    assert blacklisted("/system/anything", patterns)
    assert not blacklisted("/default/orders2", patterns)
    assert not blacklisted("/systems/x", patterns)


# ---------------------------------------------------------------- rebalancing


def skewed(topics: int = 30) -> tuple[dict[int, BrokerState], dict[str, int]]:
    return {1: ACTIVE, 2: ACTIVE, 3: ACTIVE}, {topic(i): 1 for i in range(topics)}


def run_cycles(policy: RebalancePolicy, states, assignments, loads, *, cycles: int, start_ms: int = 10 * HOUR_MS):
    """Apply plans cycle after cycle as the load manager would; returns the assignments
    and every executed move with its time."""
    assignments = dict(assignments)
    history: list[tuple[int, object]] = []
    last_moved: dict[str, int] = {}
    now = start_ms
    for _ in range(cycles):
        result = plan(now_ms=now, policy=policy, states=states, assignments=assignments, loads=loads,
                      created_ms={}, last_moved_ms=last_moved, recent_moves_ms=[t for t, _ in history])
        for move in result.moves:
            assert assignments[move.topic] == move.from_broker
            assignments[move.topic] = move.to_broker
            last_moved[move.topic] = now
            history.append((now, move))
        now += policy.check_interval_s * 1000
    return assignments, history


def test_thirty_topics_on_one_broker_converge_under_the_balanced_policy() -> None:
    states, assignments = skewed()
    policy = RebalancePolicy.of(Aggressiveness.BALANCED)
    final, history = run_cycles(policy, states, assignments, {}, cycles=60)
    loads = broker_loads(states, final, {})
    assert measure(loads).cv <= policy.cv_threshold
    assert len(history) == len({move.topic for _, move in history})  # no topic moved twice
    for t, _ in history:  # never more than the hourly cap in any hour
        assert sum(1 for u, _ in history if t <= u < t + HOUR_MS) <= policy.max_moves_per_hour


def test_a_plan_respects_age_cooldown_blacklist_and_the_hourly_cap() -> None:
    states, assignments = skewed(6)
    policy = RebalancePolicy.of(Aggressiveness.AGGRESSIVE, moves_per_cycle=10, blacklist=(topic(0),))
    now = 5 * HOUR_MS
    result = plan(now_ms=now, policy=policy, states=states, assignments=assignments, loads={},
                  created_ms={topic(1): now - 1000}, last_moved_ms={topic(2): now - 1000},
                  recent_moves_ms=[now - HOUR_MS - 1] + [now - 60_000] * 18)
    assert [m.topic for m in result.moves] == [topic(3), topic(4)]  # 20 an hour, 18 done: 2 left
    assert {m.to_broker for m in result.moves} == {2, 3}
    capped = plan(now_ms=now, policy=policy, states=states, assignments=assignments, loads={}, created_ms={},
                  last_moved_ms={}, recent_moves_ms=[now - 1] * 20)
    assert capped.moves == () and "cap" in capped.why_none


def test_a_dry_run_is_the_plan_itself_and_max_moves_replaces_the_cycle_budget() -> None:
    states, assignments = skewed()
    policy = RebalancePolicy.of(Aggressiveness.BALANCED)
    one = plan(now_ms=HOUR_MS, policy=policy, states=states, assignments=assignments, loads={}, created_ms={},
               last_moved_ms={}, recent_moves_ms=[])
    three = plan(now_ms=HOUR_MS, policy=policy, states=states, assignments=assignments, loads={}, created_ms={},
                 last_moved_ms={}, recent_moves_ms=[], max_moves=3)
    assert len(one.moves) == 1 and len(three.moves) == 3
    assert assignments == skewed()[1]  # planning changed nothing


def test_balanced_or_small_clusters_plan_nothing() -> None:
    policy = RebalancePolicy.of(Aggressiveness.BALANCED)
    even = {topic(i): 1 + i % 3 for i in range(30)}
    states = {1: ACTIVE, 2: ACTIVE, 3: ACTIVE}
    assert "balanced" in plan(now_ms=0, policy=policy, states=states, assignments=even, loads={}, created_ms={},
                              last_moved_ms={}, recent_moves_ms=[]).why_none
    lonely = plan(now_ms=0, policy=policy, states={1: ACTIVE, 2: DRAINING}, assignments={topic(0): 1}, loads={},
                  created_ms={}, last_moved_ms={}, recent_moves_ms=[])
    assert lonely.moves == () and "fewer than 2" in lonely.why_none


@settings(max_examples=200, deadline=None)
@given(clusters(), st.sampled_from(list(Aggressiveness)), st.integers(1, 5))
def test_every_move_narrows_a_gap_between_active_brokers(cluster, level, per_cycle) -> None:
    """Moves go between ACTIVE brokers only, and each lowers the sum of squared broker
    loads: a sequence of plans can never come back to a state it left."""
    states, assignments, loads = cluster
    policy = RebalancePolicy.of(level, moves_per_cycle=per_cycle, cooldown_s=0, min_topic_age_s=0)
    result = plan(now_ms=HOUR_MS, policy=policy, states=states, assignments=assignments, loads=loads,
                  created_ms={}, last_moved_ms={}, recent_moves_ms=[])
    assert len(result.moves) <= per_cycle
    active = [b for b, s in states.items() if s is ACTIVE]
    current = broker_loads(active, assignments, loads)
    working = dict(assignments)
    for move in result.moves:
        assert states[move.from_broker] is ACTIVE and states[move.to_broker] is ACTIVE
        assert working[move.topic] == move.from_broker
        before = squares(current)
        working[move.topic] = move.to_broker
        current = broker_loads(active, working, loads)
        assert squares(current) < before
    assert result.after == pytest.approx(current)


@settings(max_examples=100, deadline=None)
@given(clusters(), st.sampled_from(list(Aggressiveness)))
def test_repeated_cycles_settle_and_keep_the_hourly_cap(cluster, level) -> None:
    """Cycle after cycle on a random cluster: no hour has more than the cap, no topic
    moves within its cooldown, and without the caps the moves stop (balanced, or no move
    narrows a gap)."""
    states, assignments, loads = cluster
    policy = RebalancePolicy.of(level, moves_per_cycle=3, min_topic_age_s=0)
    final, history = run_cycles(policy, states, assignments, loads, cycles=80)
    for t, _ in history:
        assert sum(1 for u, _ in history if t <= u < t + HOUR_MS) <= policy.max_moves_per_hour
    moved_at: dict[str, int] = {}
    for t, move in history:
        if move.topic in moved_at:
            assert t - moved_at[move.topic] >= policy.cooldown_s * 1000
        moved_at[move.topic] = t
    # Past the caps (no hourly limit, no cooldown), planning still stops: every move
    # lowers the sum of squared loads, so there is no endless sequence of them.
    free = RebalancePolicy.of(level, moves_per_cycle=1, min_topic_age_s=0, cooldown_s=0, max_moves_per_hour=10**9)
    for _ in range(2_000):
        settled = plan(now_ms=HOUR_MS, policy=free, states=states, assignments=final, loads=loads, created_ms={},
                       last_moved_ms={}, recent_moves_ms=[])
        if not settled.moves:
            break
        final = {**final, settled.moves[0].topic: settled.moves[0].to_broker}
    assert not settled.moves
    assert "balanced" in settled.why_none or "narrow" in settled.why_none or "fewer than" in settled.why_none


# ---------------------------------------------------------------- draining


@given(clusters(), st.sampled_from(list(Strategy)))
def test_drain_moves_every_topic_of_the_broker_to_other_active_brokers(cluster, strategy) -> None:
    states, assignments, loads = cluster
    broker = min(states)
    others = [b for b, s in states.items() if s is ACTIVE and b != broker]
    owned = {t for t, b in assignments.items() if b == broker}
    if owned and not others:
        with pytest.raises(Unavailable):
            drain(broker, strategy=strategy, states=states, reports={}, assignments=assignments, loads=loads)
        return
    moves = drain(broker, strategy=strategy, states=states, reports={}, assignments=assignments, loads=loads)
    assert {m.topic for m in moves} == owned
    assert all(m.from_broker == broker and m.to_broker in others for m in moves)


# ---------------------------------------------------------------- incremental placement


@given(clusters(), st.sampled_from(list(Strategy)), st.integers(0, 20), st.integers(0, 100))
def test_a_placer_places_a_burst_as_placing_each_topic_from_scratch_would(cluster, strategy, burst, cursor) -> None:
    """A `Placer` updated per placed topic picks exactly the brokers that `place` picks
    when it recomputes every broker's totals from all the assignments each time: the
    incremental sums are the same sums, in the same order."""
    from danube_zmq.actors.load.placement import Placer

    states, assignments, loads = cluster
    if ACTIVE not in states.values():
        return
    reports = {b: LoadReport(broker_id=b, cpu_percent=10.0 * b, memory_percent=5.0 * b) for b in states}
    placer = Placer(strategy, states, reports, assignments, loads)
    scratch = dict(assignments)
    incremental_cursor = scratch_cursor = cursor
    for i in range(burst):
        name = f"/default/new{i}"
        fast = placer.place(cursor=incremental_cursor)
        slow = place(strategy, states, reports, scratch, loads, cursor=scratch_cursor)
        assert fast == slow
        placer.add(name, fast.broker_id)
        scratch[name] = slow.broker_id
        incremental_cursor, scratch_cursor = fast.cursor, slow.cursor


def test_fair_and_weighted_placement_choose_differently() -> None:
    """FAIR counts topics only; the load strategies weigh what the topics carry: one
    busy topic on broker 1 against two idle ones on broker 2 sends FAIR to 1 and
    BALANCED and WEIGHTED_LOAD to 2 (a mutant treating one like the other fails)."""
    states = {1: ACTIVE, 2: ACTIVE}
    busy = TopicLoad(topic=topic(1), byte_rate_in=10 * MIB, producers=5, consumers=5)
    assignments = {topic(1): 1, topic(2): 2, topic(3): 2}
    loads = {topic(1): busy}
    assert place(Strategy.FAIR, states, {}, assignments, loads).broker_id == 1
    assert place(Strategy.BALANCED, states, {}, assignments, loads).broker_id == 2
    assert place(Strategy.WEIGHTED_LOAD, states, {}, assignments, loads).broker_id == 2
    fair = scores(Strategy.FAIR, states, {}, assignments, loads)
    assert fair == {1: 1.0, 2: 2.0}
    # weighted: broker 1 is the heaviest in topic load and throughput (both 1.0, a
    # bottleneck above 0.7: half the weight on the first one found)
    weighted = scores(Strategy.WEIGHTED_LOAD, states, {}, assignments, loads)
    assert weighted[1] == pytest.approx(0.5 * 1.0 + (0.5 / 3) * 1.0)
    assert weighted[2] == pytest.approx(0.25 * (0.4 / busy.weight))


# ---------------------------------------------------------------- the limits at their edges

EDGE_POLICY = RebalancePolicy.of(Aggressiveness.BALANCED, cooldown_s=60, min_topic_age_s=300, max_moves_per_hour=3,
                                 moves_per_cycle=5, blacklist=(topic(0),))
NOW = 10 * HOUR_MS


def moved_topics(*, created_ms=None, last_moved_ms=None, recent_moves_ms=(), policy=EDGE_POLICY) -> list[str]:
    """Broker 1 holds topic 0 (blacklisted) and topic 1, broker 2 nothing: topic 1 is
    the only topic whose move could narrow the gap."""
    result = plan(now_ms=NOW, policy=policy, states={1: ACTIVE, 2: ACTIVE}, assignments={topic(0): 1, topic(1): 1},
                  loads={}, created_ms=created_ms or {}, last_moved_ms=last_moved_ms or {},
                  recent_moves_ms=list(recent_moves_ms))
    return [m.topic for m in result.moves]


def test_a_topic_moves_again_exactly_when_its_cooldown_ends() -> None:
    """Cooldown 60 s: a topic moved 60,000 ms ago may move, one moved 59,999 ms ago not."""
    assert moved_topics(last_moved_ms={topic(1): NOW - 60_000}) == [topic(1)]
    assert moved_topics(last_moved_ms={topic(1): NOW - 59_999}) == []


def test_a_topic_moves_exactly_when_it_reaches_the_minimum_age() -> None:
    """Minimum age 300 s: a topic created 300,000 ms ago may move, one 299,999 ms old not."""
    assert moved_topics(created_ms={topic(1): NOW - 300_000}) == [topic(1)]
    assert moved_topics(created_ms={topic(1): NOW - 299_999}) == []


def test_the_hourly_cap_counts_moves_in_the_hour_up_to_now_only() -> None:
    """Cap 3 an hour: moves at now - 1 h + 1 ms and at now count (three fill the cap);
    one exactly an hour ago or one stamped in the future (a skewed clock) does not."""
    inside = [NOW - HOUR_MS + 1, NOW - 1, NOW]
    assert moved_topics(recent_moves_ms=inside) == []
    assert moved_topics(recent_moves_ms=inside[1:] + [NOW - HOUR_MS]) == [topic(1)]
    assert moved_topics(recent_moves_ms=inside[1:] + [NOW + 1]) == [topic(1)]
    assert moved_topics(recent_moves_ms=inside[1:]) == [topic(1)]


def test_the_cv_threshold_is_exclusive() -> None:
    """A cluster whose CV equals the threshold is balanced; just above, it is not."""
    states = {1: ACTIVE, 2: ACTIVE}
    assignments = {topic(0): 1, topic(1): 1, topic(2): 2}  # loads 0.4 and 0.2: CV exactly 1/3
    cv = measure(broker_loads(states, assignments, {})).cv
    at = RebalancePolicy.of(Aggressiveness.BALANCED, cv_threshold=cv, min_topic_age_s=0)
    below = RebalancePolicy.of(Aggressiveness.BALANCED, cv_threshold=cv * 0.999, min_topic_age_s=0)
    kwargs = dict(now_ms=NOW, states=states, assignments=assignments, loads={}, created_ms={}, last_moved_ms={},
                  recent_moves_ms=[])
    assert plan(policy=at, **kwargs).moves == ()
    assert "balanced" in plan(policy=at, **kwargs).why_none
    # above the threshold, but moving 0.2 from 0.4 to 0.2 would only swap the two: nothing narrows the gap
    assert "narrow" in plan(policy=below, **kwargs).why_none


def test_outliers_are_strictly_beyond_one_standard_deviation() -> None:
    """Overloaded: load > mean + std; underloaded: load < mean - std and < mean / 2.
    Loads 0, 2, 4: mean 2, std 1.633; 4 and 0 are outliers, 2 is not. Loads 1, 3:
    mean 2, std 1: 3 is exactly mean + std (not overloaded) and 1 exactly mean - std
    (not underloaded)."""
    spread = measure({1: 0.0, 2: 2.0, 3: 4.0})
    assert spread.overloaded == {3} and spread.underloaded == {1}
    edge = measure({1: 1.0, 2: 3.0})
    assert edge.std == pytest.approx(1.0)
    assert edge.overloaded == frozenset() and edge.underloaded == frozenset()
    # below mean - std but not below half the mean: not underloaded
    half = measure({1: 5.5, 2: 10.0, 3: 10.0, 4: 10.0, 5: 10.0})
    assert half.loads[1] < half.mean - half.std and half.loads[1] >= half.mean / 2
    assert half.underloaded == frozenset()


def test_policy_refuses_negative_cooldown_and_age_and_accepts_zero() -> None:
    """cooldown_s and min_topic_age_s of -1 are refused with INVALID_ARGUMENT naming the
    field; 0 (move at once) is allowed; so is the smallest positive check interval."""
    with pytest.raises(InvalidArgument, match="cooldown_s"):
        RebalancePolicy.of(Aggressiveness.BALANCED, cooldown_s=-1)
    with pytest.raises(InvalidArgument, match="min_topic_age_s"):
        RebalancePolicy.of(Aggressiveness.BALANCED, min_topic_age_s=-1)
    with pytest.raises(InvalidArgument, match="cv_threshold"):
        RebalancePolicy.of(Aggressiveness.BALANCED, cv_threshold=0.0)
    with pytest.raises(InvalidArgument, match="min_brokers"):
        RebalancePolicy.of(Aggressiveness.BALANCED, min_brokers=0)
    zero = RebalancePolicy.of(Aggressiveness.BALANCED, cooldown_s=0, min_topic_age_s=0, check_interval_s=1,
                              max_moves_per_hour=1, moves_per_cycle=1, min_brokers=1)
    assert (zero.cooldown_s, zero.min_topic_age_s) == (0, 0)
    assert moved_topics(last_moved_ms={topic(1): NOW}, created_ms={topic(1): NOW},
                        policy=RebalancePolicy.of(Aggressiveness.BALANCED, cooldown_s=0, min_topic_age_s=0,
                                                  blacklist=(topic(0),))) == [topic(1)]


def test_the_config_refuses_a_negative_cooldown() -> None:
    """`load_manager.rebalancing_cooldown_s: -1` is a config error naming the key."""
    from danube_zmq.config.broker_config import LoadManagerSection
    from danube_zmq.transport.errors import ConfigError

    with pytest.raises(ConfigError, match="rebalancing_cooldown_s"):
        LoadManagerSection(rebalancing_cooldown_s=-1)
    assert LoadManagerSection(rebalancing_cooldown_s=0).rebalancing_cooldown_s == 0


# ---------------------------------------------------------------- damaged topics


def test_rebalancing_never_picks_a_damaged_topic() -> None:
    """The lightest topics of the loaded broker are damaged (not served, their WAL is):
    the plan moves the next ones instead, and with only damaged topics there, none."""
    states, assignments = skewed(6)
    policy = RebalancePolicy.of(Aggressiveness.AGGRESSIVE, moves_per_cycle=2)
    damaged = {topic(0), topic(1)}
    result = plan(now_ms=HOUR_MS, policy=policy, states=states, assignments=assignments, loads={}, created_ms={},
                  last_moved_ms={}, recent_moves_ms=[], damaged=damaged)
    assert [m.topic for m in result.moves] == [topic(2), topic(3)]
    stuck = plan(now_ms=HOUR_MS, policy=policy, states=states, assignments=assignments, loads={}, created_ms={},
                 last_moved_ms={}, recent_moves_ms=[], damaged=set(assignments))
    assert stuck.moves == () and "no eligible topic" in stuck.why_none


@given(clusters(), st.integers(1, 5), st.data())
def test_no_plan_moves_a_damaged_topic(cluster, per_cycle, data) -> None:
    """Whatever the loads, a damaged topic is never in a rebalancing plan."""
    states, assignments, loads = cluster
    damaged = set(data.draw(st.lists(st.sampled_from(sorted(assignments)), max_size=20))) if assignments else set()
    policy = RebalancePolicy.of(Aggressiveness.AGGRESSIVE, moves_per_cycle=per_cycle, cv_threshold=0.01)
    result = plan(now_ms=HOUR_MS, policy=policy, states=states, assignments=assignments, loads=loads, created_ms={},
                  last_moved_ms={}, recent_moves_ms=[], damaged=damaged)
    assert not {m.topic for m in result.moves} & damaged


@given(clusters(), st.sampled_from(list(Strategy)), st.data())
def test_drain_moves_every_topic_but_the_damaged_ones(cluster, strategy, data) -> None:
    """A drain moves the broker's healthy topics and leaves its damaged ones where they
    are (until repaired): no other broker serves them from an empty log."""
    states, assignments, loads = cluster
    broker = min(states)
    owned = {t for t, b in assignments.items() if b == broker}
    damaged = set(data.draw(st.lists(st.sampled_from(sorted(owned)), max_size=10))) if owned else set()
    if not any(s is ACTIVE and b != broker for b, s in states.items()) and owned - damaged:
        return  # nowhere to go: covered by the drain test above
    moves = drain(broker, strategy=strategy, states=states, reports={}, assignments=assignments, loads=loads,
                  damaged=damaged)
    assert {m.topic for m in moves} == owned - damaged


def test_rebalancing_levels_are_the_documented_table() -> None:
    """The three levels are Danube's table, as config/danube_broker.yml documents it:
    conservative CV 0.40, every 600 s, 5 moves/h, 120 s cooldown; balanced 0.30, 300 s,
    10/h, 60 s; aggressive 0.20, 180 s, 20/h, 30 s; each with 2 brokers at least,
    topics 300 s old at least, one move a cycle and no blacklist."""
    table = {
        Aggressiveness.CONSERVATIVE: (0.40, 600, 5, 120),
        Aggressiveness.BALANCED: (0.30, 300, 10, 60),
        Aggressiveness.AGGRESSIVE: (0.20, 180, 20, 30),
    }
    for level, row in table.items():
        p = RebalancePolicy.of(level)
        assert (p.cv_threshold, p.check_interval_s, p.max_moves_per_hour, p.cooldown_s) == row, level
        assert (p.min_brokers, p.min_topic_age_s, p.moves_per_cycle, p.blacklist) == (2, 300, 1, ())


def test_the_hourly_cap_window_is_3600000_ms() -> None:
    """The hour of the hourly cap is 3,600,000 ms, written out here (the other tests
    count from the module's own constant): a move 3,599,999 ms ago still counts, one
    3,600,000 ms ago no longer does."""
    recent = [NOW - 1, NOW]
    assert moved_topics(recent_moves_ms=[*recent, NOW - 3_599_999]) == []
    assert moved_topics(recent_moves_ms=[*recent, NOW - 3_600_000]) == [topic(1)]


def test_ties_go_to_the_lowest_broker_id_first_when_placing_and_draining() -> None:
    """Among brokers that tie, a placement without a cursor and the first topic of a
    drain go to the lowest id; the drain's turns then continue from there."""
    states = {1: ACTIVE, 2: ACTIVE, 3: ACTIVE}
    assert place(Strategy.FAIR, states, {}, {}, {}).broker_id == 1
    moves = drain(3, strategy=Strategy.FAIR, states=states, reports={}, assignments={topic(1): 3, topic(2): 3},
                  loads={})
    assert sorted(m.to_broker for m in moves) == [1, 2]
    assert moves[0].to_broker == 1


def test_a_plan_moves_the_lightest_eligible_topic_of_the_most_loaded_broker_first() -> None:
    """Broker 1 holds a heavy topic (listed first) and an idle one, broker 2 nothing:
    one move a cycle takes the idle topic, the lightest, which narrows the gap most
    gently and never overshoots, whatever order the assignments come in."""
    heavy = TopicLoad(topic=topic(0), byte_rate_in=4 * MIB, producers=3, consumers=3)
    result = plan(now_ms=NOW, policy=RebalancePolicy.of(Aggressiveness.BALANCED), states={1: ACTIVE, 2: ACTIVE},
                  assignments={topic(0): 1, topic(1): 1, topic(2): 1}, loads={topic(0): heavy}, created_ms={},
                  last_moved_ms={}, recent_moves_ms=[])
    assert [m.topic for m in result.moves] == [topic(1)]

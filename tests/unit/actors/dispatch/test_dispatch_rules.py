"""Behaviour of the pure subscription dispatch rules (Exclusive, Failover, Shared, Key-Shared)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from fnmatch import fnmatchcase

from hypothesis import given, settings
from hypothesis import strategies as st

from danube_zmq.actors.dispatch import (
    Assignment,
    DispatchRule,
    ExclusiveRule,
    FailoverRule,
    KeySharedRule,
    SharedRule,
    SubType,
    make_rule,
)
from danube_zmq.actors.dispatch.key_shared import ring_hash

FAST = settings(max_examples=200, deadline=None)
KEYS = ["eu-1", "eu-2", "us-1", "us-2", "asia-1", "order.7", "order.8", "k", "x9"]
FILTERS = ["eu-*", "us-*", "order.*", "*-1", "k"]


def check_assignment(
    rule: DispatchRule, assignment: Assignment, count: int, permits: Mapping[int, int]
) -> None:
    """Assert the contract every rule keeps for one batch."""
    attached = set(rule.consumer_ids())
    seen: list[int] = []
    consumers_seen: set[int] = set()
    for s in assignment.slices:
        indices = list(s.indices)
        assert indices, "slices are never empty"
        assert indices == sorted(indices)
        assert s.consumer_id in attached
        assert s.consumer_id not in consumers_seen, "one slice per consumer"
        consumers_seen.add(s.consumer_id)
        assert len(indices) <= permits.get(s.consumer_id, 0)
        seen += indices
    assert list(assignment.leftover) == sorted(assignment.leftover)
    assert list(assignment.skipped) == sorted(assignment.skipped)
    seen += list(assignment.leftover) + list(assignment.skipped)
    assert sorted(seen) == list(range(count)), "each index exactly once"


def delivered(assignment: Assignment) -> dict[int, list[int]]:
    return {s.consumer_id: list(s.indices) for s in assignment.slices}


@st.composite
def batches(draw: st.DrawFn) -> tuple[int, list[str | None] | None, dict[int, int]]:
    count = draw(st.integers(0, 40))
    keys = draw(
        st.none()
        | st.lists(st.none() | st.sampled_from(KEYS), min_size=count, max_size=count)
    )
    # Ids 1..6 may or may not be attached: permits for strangers must be ignored.
    permits = draw(st.dictionaries(st.integers(1, 6), st.integers(0, 20)))
    return count, keys, permits


@FAST
@given(
    sub_type=st.sampled_from(list(SubType)),
    consumers=st.lists(
        st.tuples(st.integers(1, 5), st.lists(st.sampled_from(FILTERS), max_size=2)),
        unique_by=lambda c: c[0],
        max_size=4,
    ),
    batch_list=st.lists(batches(), min_size=1, max_size=4),
)
def test_every_rule_places_each_index_once_within_permits(
    sub_type: SubType,
    consumers: list[tuple[int, list[str]]],
    batch_list: list[tuple[int, list[str | None] | None, dict[int, int]]],
) -> None:
    """Every rule puts each index in exactly one of slices/leftover/skipped, within permits, ascending."""
    rule = make_rule(sub_type)
    for consumer_id, filters in consumers:
        rule.add_consumer(consumer_id, f"consumer-{consumer_id}", filters)
    for count, keys, permits in batch_list:
        keys_before = None if keys is None else list(keys)
        permits_before = dict(permits)
        assignment = rule.assign(count, keys, "producer-a", permits)
        check_assignment(rule, assignment, count, permits)
        assert permits == permits_before and keys == keys_before, (
            "assign mutates no input"
        )
        if sub_type != SubType.KEY_SHARED:
            assert not assignment.skipped, "only Key-Shared skips"
        if sub_type in (SubType.EXCLUSIVE, SubType.FAILOVER):
            assert {s.consumer_id for s in assignment.slices} <= {
                rule.active_consumer_id()
            }
        else:
            assert rule.active_consumer_id() is None


def test_make_rule_maps_wire_values_to_rules() -> None:
    """The fixed Danube wire values build the matching rule class."""
    assert [int(t) for t in SubType] == [0, 1, 2, 3]
    assert isinstance(make_rule(SubType(0)), ExclusiveRule)
    assert isinstance(make_rule(SubType(1)), SharedRule)
    assert isinstance(make_rule(SubType(2)), FailoverRule)
    assert isinstance(make_rule(SubType(3)), KeySharedRule)


# Exclusive


def test_exclusive_delivers_all_to_single_consumer_within_permits() -> None:
    """The one consumer gets the head of the batch up to its permits; the tail stays pending."""
    rule = ExclusiveRule()
    rule.add_consumer(7, "only")
    a = rule.assign(10, None, "p", {7: 4})
    assert delivered(a) == {7: [0, 1, 2, 3]}
    assert a.leftover == range(4, 10)
    a = rule.assign(10, None, "p", {7: 50})
    assert delivered(a) == {7: list(range(10))} and not a.leftover


def test_exclusive_without_consumer_leaves_everything_pending() -> None:
    """With no consumer attached, the whole batch is leftover, not skipped."""
    a = ExclusiveRule().assign(5, None, "p", {1: 9})
    assert not a.slices and a.leftover == range(5) and not a.skipped


# Failover


def test_failover_standby_gets_nothing_until_promoted() -> None:
    """Only the active consumer receives; removing it promotes the next in attach order."""
    rule = FailoverRule()
    for consumer_id in (1, 2, 3):
        rule.add_consumer(consumer_id, f"c{consumer_id}")
    permits = {1: 5, 2: 5, 3: 5}
    assert delivered(rule.assign(3, None, "p", permits)) == {1: [0, 1, 2]}
    rule.remove_consumer(1)
    assert rule.active_consumer_id() == 2
    assert delivered(rule.assign(3, None, "p", permits)) == {2: [0, 1, 2]}
    rule.add_consumer(1, "c1")  # a returning consumer waits at the end of the line
    assert rule.consumer_ids() == (2, 3, 1)
    assert rule.active_consumer_id() == 2


@FAST
@given(ops=st.lists(st.tuples(st.booleans(), st.integers(1, 6)), max_size=40))
def test_failover_active_is_earliest_attached_still_present(
    ops: list[tuple[bool, int]],
) -> None:
    """Over random attach/remove sequences the active consumer is the earliest-attached still present."""
    rule = FailoverRule()
    model: list[int] = []
    for attach, consumer_id in ops:
        if attach and consumer_id not in model:
            rule.add_consumer(consumer_id, f"c{consumer_id}")
            model.append(consumer_id)
        elif not attach and consumer_id in model:
            rule.remove_consumer(consumer_id)
            model.remove(consumer_id)
        assert rule.consumer_ids() == tuple(model)
        assert rule.active_consumer_id() == (model[0] if model else None)
        a = rule.assign(4, None, "p", {c: 4 for c in model})
        assert delivered(a) == ({model[0]: [0, 1, 2, 3]} if model else {})


# Shared


def shared_with(*consumer_ids: int) -> SharedRule:
    rule = SharedRule()
    for consumer_id in consumer_ids:
        rule.add_consumer(consumer_id, f"c{consumer_id}")
    return rule


def test_shared_splits_one_batch_evenly_in_contiguous_slices() -> None:
    """36 messages in one batch over 3 consumers with ample permits go 12/12/12 as contiguous runs."""
    a = shared_with(1, 2, 3).assign(36, None, "p", {1: 100, 2: 100, 3: 100})
    assert [(s.consumer_id, s.indices) for s in a.slices] == [
        (1, range(12)),
        (2, range(12, 24)),
        (3, range(24, 36)),
    ]
    assert not a.leftover


def test_shared_rotates_single_message_batches() -> None:
    """36 one-message batches over 3 consumers go 12 to each, in turn."""
    rule = shared_with(1, 2, 3)
    receivers = [
        rule.assign(1, None, "p", {1: 100, 2: 100, 3: 100}).slices[0].consumer_id
        for _ in range(36)
    ]
    assert receivers[:6] == [1, 2, 3, 1, 2, 3]
    assert {c: receivers.count(c) for c in (1, 2, 3)} == {1: 12, 2: 12, 3: 12}


def test_shared_rotates_the_extra_message_across_batches() -> None:
    """Batches that do not divide evenly hand the extra message to each consumer in turn."""
    rule = shared_with(1, 2, 3)
    totals = {1: 0, 2: 0, 3: 0}
    for _ in range(3):
        for s in rule.assign(10, None, "p", {1: 100, 2: 100, 3: 100}).slices:
            totals[s.consumer_id] += len(s.indices)
    assert totals == {1: 10, 2: 10, 3: 10}


def test_shared_gives_a_short_consumers_part_to_the_others() -> None:
    """A consumer short of permits leaves its share to others; leftover is only what no permit holds."""
    a = shared_with(1, 2, 3).assign(36, None, "p", {1: 100, 2: 1, 3: 1})
    assert {c: len(i) for c, i in delivered(a).items()} == {1: 34, 2: 1, 3: 1}
    assert not a.leftover
    a = shared_with(1, 2, 3).assign(36, None, "p", {1: 5, 3: 2})
    assert {c: len(i) for c, i in delivered(a).items()} == {1: 5, 3: 2}
    assert a.leftover == range(7, 36)


@FAST
@given(
    ops=st.lists(
        st.one_of(
            st.tuples(st.just("publish"), st.integers(0, 15)),
            st.tuples(st.just("grant"), st.integers(1, 5), st.integers(0, 10)),
            st.tuples(st.just("add"), st.integers(1, 5)),
            st.tuples(st.just("remove"), st.integers(1, 5)),
        ),
        max_size=40,
    )
)
def test_shared_never_delivers_a_message_twice(ops: list[tuple]) -> None:
    """Over random batches, permit grants and consumer churn, no message is delivered twice, none lost."""
    rule = SharedRule()
    balance: dict[int, int] = {}
    pending: list[int] = []  # message ids not yet delivered, in publish order
    delivered_ids: list[int] = []
    next_id = 0

    def dispatch() -> None:
        nonlocal pending
        a = rule.assign(len(pending), None, "p", balance)
        check_assignment(rule, a, len(pending), balance)
        for s in a.slices:
            balance[s.consumer_id] -= len(s.indices)
            delivered_ids.extend(pending[i] for i in s.indices)
        pending = [pending[i] for i in a.leftover]

    for op in ops:
        if op[0] == "publish":
            pending += range(next_id, next_id + op[1])
            next_id += op[1]
        elif op[0] == "grant" and op[1] in balance:
            balance[op[1]] += op[2]
        elif op[0] == "add" and op[1] not in balance:
            rule.add_consumer(op[1], f"c{op[1]}")
            balance[op[1]] = 0
        elif op[0] == "remove" and op[1] in balance:
            rule.remove_consumer(op[1])
            del balance[op[1]]
        dispatch()
        assert len(delivered_ids) == len(set(delivered_ids))
    if balance:
        for consumer_id in balance:
            balance[consumer_id] += next_id
        dispatch()
        assert sorted(delivered_ids) == list(range(next_id))


# Key-Shared


def key_shared_with(consumers: Mapping[int, Sequence[str]]) -> KeySharedRule:
    rule = KeySharedRule()
    for consumer_id, filters in consumers.items():
        rule.add_consumer(consumer_id, f"consumer-{consumer_id}", filters)
    return rule


def owners_of(rule: KeySharedRule, keys: Sequence[str]) -> dict[str, int]:
    """Which consumer each key reaches, with ample permits."""
    a = rule.assign(len(keys), keys, "p", {c: len(keys) for c in rule.consumer_ids()})
    return {keys[i]: s.consumer_id for s in a.slices for i in s.indices}


@FAST
@given(
    consumer_count=st.integers(1, 5),
    batch_list=st.lists(batches(), min_size=1, max_size=6),
)
def test_key_shared_sends_a_key_to_one_consumer(
    consumer_count: int,
    batch_list: list[tuple[int, list[str | None] | None, dict[int, int]]],
) -> None:
    """With a stable consumer set, every message of a key reaches the same consumer, in key order."""
    rule = key_shared_with({c: () for c in range(1, consumer_count + 1)})
    owner: dict[str, int] = {}
    for count, keys, permits in batch_list:
        a = rule.assign(count, keys, "producer-a", permits)
        check_assignment(rule, a, count, permits)
        key_of = [
            "producer-a" if keys is None or keys[i] is None else keys[i]
            for i in range(count)
        ]
        for s in a.slices:
            for i in s.indices:
                assert owner.setdefault(key_of[i], s.consumer_id) == s.consumer_id
        # Per-key order: no message of a key is delivered after an earlier one was held back.
        first_held: dict[str, int] = {}
        for i in a.leftover:
            first_held.setdefault(key_of[i], i)
        for s in a.slices:
            assert all(i < first_held.get(key_of[i], count) for i in s.indices)


def test_key_shared_holds_later_messages_of_a_waiting_key() -> None:
    """Once a key's consumer runs out of permits, the rest of that key waits while other keys flow."""
    rule = key_shared_with({1: (), 2: ()})
    keys = [f"key-{n}" for n in range(40)]
    owners = owners_of(rule, keys)
    k1 = next(k for k in keys if owners[k] == 1)
    k2 = next(k for k in keys if owners[k] == 2)
    a = rule.assign(5, [k1, k2, k1, k2, k1], "p", {1: 1, 2: 5})
    assert delivered(a) == {1: [0], 2: [1, 3]}
    assert list(a.leftover) == [2, 4]


def test_key_shared_uses_default_key_for_unkeyed_messages() -> None:
    """Messages without a key are routed by the default key, so one producer's stream stays together."""
    rule = key_shared_with({1: (), 2: (), 3: ()})
    expected = owners_of(rule, ["producer-a"])["producer-a"]
    a = rule.assign(
        6,
        [None, "producer-a", None, None, "producer-a", None],
        "producer-a",
        {1: 9, 2: 9, 3: 9},
    )
    assert delivered(a) == {expected: list(range(6))}
    a = rule.assign(6, None, "producer-a", {1: 9, 2: 9, 3: 9})
    assert delivered(a) == {expected: list(range(6))}


@FAST
@given(
    consumer_count=st.integers(1, 5),
    keys=st.lists(
        st.text(min_size=1, max_size=8), min_size=1, max_size=60, unique=True
    ),
)
def test_key_shared_adding_a_consumer_only_moves_keys_to_it(
    consumer_count: int, keys: list[str]
) -> None:
    """A new consumer takes some keys; every other key stays where it was (and returns on removal)."""
    rule = key_shared_with({c: () for c in range(1, consumer_count + 1)})
    before = owners_of(rule, keys)
    new_id = consumer_count + 1
    rule.add_consumer(new_id, f"consumer-{new_id}")
    after = owners_of(rule, keys)
    assert all(after[k] in (before[k], new_id) for k in keys)
    rule.remove_consumer(new_id)
    assert owners_of(rule, keys) == before


def test_key_shared_spreads_keys_over_consumers() -> None:
    """With 100 virtual nodes each, 3000 keys over 3 consumers split roughly evenly."""
    rule = key_shared_with({1: (), 2: (), 3: ()})
    owners = list(owners_of(rule, [f"k{n}" for n in range(3000)]).values())
    assert all(600 <= owners.count(c) <= 1400 for c in (1, 2, 3))


def test_key_shared_glob_filters_route_and_skip() -> None:
    """Filtered consumers get only matching keys; a key nobody accepts is skipped, not left over."""
    rule = key_shared_with({1: ["eu-*"], 2: ["us-*", "order.*"]})
    keys = ["eu-1", "us-1", "asia-1", "order.7", "eu-2"]
    a = rule.assign(5, keys, "p", {1: 9, 2: 9})
    assert delivered(a) == {1: [0, 4], 2: [1, 3]}
    assert list(a.skipped) == [2] and not a.leftover
    rule.add_consumer(
        3, "catch-all"
    )  # no filters: accepts any key, so nothing is skipped
    a = rule.assign(5, keys, "p", {1: 9, 2: 9, 3: 9})
    assert 2 in delivered(a)[3] and not a.skipped
    assert set(delivered(a).get(1, [])) <= {0, 4} and set(delivered(a).get(2, [])) <= {
        1,
        3,
    }


@FAST
@given(
    consumers=st.dictionaries(
        st.integers(1, 5), st.lists(st.sampled_from(FILTERS), max_size=2), max_size=4
    ),
    keys=st.lists(st.sampled_from(KEYS), max_size=30),
)
def test_key_shared_filters_hold_for_random_consumers(
    consumers: dict[int, list[str]], keys: list[str]
) -> None:
    """Each delivered key matches its consumer's filters; each skipped key matches no consumer's."""

    def accepts(consumer_id: int, key: str) -> bool:
        filters = consumers[consumer_id]
        return not filters or any(fnmatchcase(key, f) for f in filters)

    rule = key_shared_with(consumers)
    permits = {c: 30 for c in consumers}
    a = rule.assign(len(keys), keys, "p", permits)
    check_assignment(rule, a, len(keys), permits)
    for s in a.slices:
        assert all(accepts(s.consumer_id, keys[i]) for i in s.indices)
    for i in a.skipped:
        assert consumers and not any(accepts(c, keys[i]) for c in consumers)
    if not consumers:
        assert list(a.leftover) == list(range(len(keys)))
    else:
        assert not a.leftover


def test_key_shared_ring_is_stable_across_processes() -> None:
    """Ring positions use a stable hash, not salted `hash()`: another process agrees on them."""
    code = (
        "from danube_zmq.actors.dispatch.key_shared import ring_hash;"
        "print([ring_hash(f'k{n}') for n in range(20)])"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == str([ring_hash(f"k{n}") for n in range(20)])


@FAST
@given(
    consumers=st.lists(st.integers(1, 6), min_size=1, max_size=6, unique=True),
    rounds=st.lists(st.dictionaries(st.integers(1, 6), st.integers(0, 2)), max_size=30),
)
def test_shared_single_message_batches_take_the_dealt_turns(consumers: list[int], rounds: list[dict[int, int]]) -> None:
    """A batch of one message (the one-pass path) goes where dealing it would, and leaves the
    cursor where dealing would: two rules fed the same permits, one through each path, agree."""
    fast, dealt = SharedRule(), SharedRule()
    for consumer_id in consumers:
        fast.add_consumer(consumer_id, f"c{consumer_id}")
        dealt.add_consumer(consumer_id, f"c{consumer_id}")
    for permits in rounds:
        assert fast.assign(1, None, "p", permits) == dealt._assign_dealt(1, permits)
        assert fast._cursor == dealt._cursor

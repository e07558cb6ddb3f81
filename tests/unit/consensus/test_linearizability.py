"""The linearizability checker: textbook histories, info operations, bounds, and properties
(histories made by a real sequential register always pass; an impossible read never does)."""

from __future__ import annotations

import itertools
import random
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from danube_zmq.consensus.linearizability import CheckResult, Operation, check
from danube_zmq.transport.errors import InvalidArgument


def put(client: int, value: bytes, invoke: int, complete: int | None, key: str = "x") -> Operation:
    return Operation(client=client, op="put", key=key, value=value, invoke=invoke, complete=complete)


def get(client: int, result: bytes | None, invoke: int, complete: int | None, key: str = "x") -> Operation:
    return Operation(client=client, op="get", key=key, result=result, invoke=invoke, complete=complete)


def cas(
    client: int, expected: bytes | None, value: bytes, result: bool | None, invoke: int, complete: int | None, key: str = "x"
) -> Operation:
    return Operation(
        client=client, op="cas", key=key, expected=expected, value=value, result=result, invoke=invoke, complete=complete
    )


def delete(client: int, invoke: int, complete: int | None, key: str = "x") -> Operation:
    return Operation(client=client, op="delete", key=key, invoke=invoke, complete=complete)


# ----------------------------------------------------------------------------- textbook histories


def test_sequential_history_of_a_register_is_linearizable() -> None:
    """Non-overlapping operations whose results follow the register are linearizable."""
    history = [
        get(1, None, 0, 1),
        put(1, b"a", 2, 3),
        get(2, b"a", 4, 5),
        cas(2, b"a", b"b", True, 6, 7),
        cas(1, b"a", b"c", False, 8, 9),
        delete(1, 10, 11),
        get(2, None, 12, 13),
    ]
    assert check(history) == CheckResult(ok=True, key=None, explanation="linearizable: 7 operations on 1 keys")


def test_stale_read_after_a_completed_write_is_caught() -> None:
    """A read that starts after a write completed must see it (or something later): reading
    the old value is the classic stale-read violation. The counterexample is shrunk to the
    write and the stale read, and names the key."""
    history = [
        put(1, b"1", 0, 10),
        put(1, b"2", 11, 20),
        get(2, b"2", 21, 22),  # fine
        get(3, b"1", 23, 24),  # stale
        get(2, b"2", 25, 26),
    ]
    result = check(history)
    assert result.ok is False and result.key == "x"
    assert set(result.operations) == {history[0], history[1], history[3]}
    assert "client 3: get('x') -> b'1'" in result.explanation


def test_a_read_overlapping_the_write_may_see_either_value() -> None:
    """While a write is in flight a read may return the old or the new value."""
    for seen in (None, b"1"):
        assert check([put(1, b"1", 0, 10), get(2, seen, 5, 6)]).ok is True


def test_reads_may_not_see_concurrent_writes_in_two_orders() -> None:
    """Two concurrent writes may take effect in either order, but one order for everybody:
    one reader seeing a then b while another sees b then a is not linearizable; both
    seeing a then b is."""
    writes = [put(1, b"a", 0, 100), put(2, b"b", 0, 100)]
    same_order = writes + [get(3, b"a", 10, 20), get(3, b"b", 30, 40), get(4, b"a", 10, 20), get(4, b"b", 30, 40)]
    assert check(same_order).ok is True
    two_orders = writes + [get(3, b"a", 10, 20), get(3, b"b", 30, 40), get(4, b"b", 10, 20), get(4, b"a", 30, 40)]
    result = check(two_orders)
    assert result.ok is False
    assert len(result.operations) == 6  # every read is needed to show it


def test_value_settles_after_concurrent_writes_complete() -> None:
    """Once both concurrent writes completed, reads must agree on the winner."""
    history = [put(1, b"a", 0, 10), put(2, b"b", 0, 10), get(3, b"a", 11, 12), get(3, b"b", 13, 14)]
    assert check(history).ok is False


def test_two_creating_cas_cannot_both_succeed() -> None:
    """cas(absent -> v) is a lock acquire: two overlapping ones cannot both win."""
    history = [cas(1, None, b"1", True, 0, 10), cas(2, None, b"2", True, 0, 10)]
    assert check(history).ok is False
    history = [cas(1, None, b"1", True, 0, 10), cas(2, None, b"2", False, 0, 10), get(3, b"1", 11, 12)]
    assert check(history).ok is True


def test_cas_anomalies_are_caught() -> None:
    """A cas that succeeds against a value never there, or fails when its expected value
    was certainly there, is not linearizable."""
    assert check([put(1, b"a", 0, 1), cas(2, b"z", b"b", True, 2, 3)]).ok is False
    assert check([put(1, b"a", 0, 1), cas(2, b"a", b"b", False, 2, 3)]).ok is False
    # Lost update: both cas read "a" and both "succeed" -> the second write vanished.
    lost = [put(1, b"a", 0, 1), cas(2, b"a", b"b", True, 2, 10), cas(3, b"a", b"c", True, 2, 10)]
    assert check(lost).ok is False


def test_delete_makes_the_key_absent() -> None:
    """After a completed delete a read sees nothing until the next write."""
    assert check([put(1, b"a", 0, 1), delete(1, 2, 3), get(2, b"a", 4, 5)]).ok is False
    assert check([put(1, b"a", 0, 1), delete(1, 2, 3), get(2, None, 4, 5)]).ok is True


# ----------------------------------------------------------------------------- unknown outcomes


def test_an_info_write_may_take_effect_late() -> None:
    """A write that timed out may take effect any time after its invocation: long after,
    readers may see the old value, then the new one."""
    history = [put(1, b"old", 0, 1), put(2, b"new", 2, None), get(3, b"old", 50, 51), get(3, b"new", 100, 101)]
    assert check(history).ok is True


def test_an_info_write_may_never_happen() -> None:
    """A timed-out write nobody observes may simply not have happened."""
    assert check([put(1, b"new", 0, None), get(2, None, 10, 11), get(2, None, 20, 21)]).ok is True


def test_an_info_write_cannot_be_seen_before_it_was_invoked() -> None:
    """Unknown outcome does not mean unknown time: it cannot take effect before its call."""
    history = [get(3, b"new", 0, 1), put(2, b"new", 2, None)]
    assert check(history).ok is False


def test_an_info_write_takes_effect_at_most_once() -> None:
    """An info write happens once: seen, overwritten, it cannot reappear."""
    history = [put(2, b"a", 0, None), get(3, b"a", 5, 6), put(1, b"b", 7, 8), get(3, b"a", 9, 10)]
    assert check(history).ok is False


def test_an_info_cas_applies_only_if_its_expected_value_matches() -> None:
    """A timed-out cas may or may not have applied, but only if its expected value was there."""
    assert check([put(1, b"a", 0, 1), cas(2, b"a", b"b", None, 2, None), get(3, b"b", 5, 6)]).ok is True
    assert check([put(1, b"z", 0, 1), cas(2, b"a", b"b", None, 2, None), get(3, b"b", 5, 6)]).ok is False


def test_an_info_read_constrains_nothing() -> None:
    """A read whose reply was lost says nothing (its result is ignored)."""
    assert check([put(1, b"a", 0, 1), get(2, b"zzz", 2, None)]).ok is True


# ----------------------------------------------------------------------------- edges, keys, bounds


def test_equal_times_count_as_overlapping() -> None:
    """A completion and an invocation at the same instant may be in either order, so the
    checker never blames a tie."""
    assert check([put(1, b"a", 0, 5), get(2, None, 5, 6)]).ok is True
    assert check([put(1, b"a", 0, 5), get(2, None, 6, 7)]).ok is False


def test_keys_are_checked_independently_and_the_bad_key_is_named() -> None:
    """A violation on one key is reported with that key; other keys do not hide it."""
    history = [
        put(1, b"1", 0, 1, key="good"),
        get(2, b"1", 2, 3, key="good"),
        put(1, b"1", 0, 1, key="bad"),
        get(2, b"2", 2, 3, key="bad"),
    ]
    result = check(history)
    assert (result.ok, result.key) == (False, "bad")
    assert all(op.key == "bad" for op in result.operations)


def test_initial_values_are_respected() -> None:
    """`initial` gives a key's value before the history starts."""
    assert check([get(1, b"seed", 0, 1)]).ok is False
    assert check([get(1, b"seed", 0, 1)], initial={"x": b"seed"}).ok is True


def test_the_search_bound_gives_unknown_not_a_hang() -> None:
    """Past states_max configurations the answer is ok=None ("unknown")."""
    history = [put(i, bytes([i]), 0, 100) for i in range(8)] + [get(99, bytes([0]), 101, 102)]
    assert check(history).ok is True
    result = check(history, states_max=5)
    assert result.ok is None and result.key == "x"
    assert "states_max=5" in result.explanation


@pytest.mark.parametrize(
    "op",
    [
        Operation(client=1, op="append", key="x", invoke=0, complete=1),
        Operation(client=1, op="put", key="x", value=None, invoke=0, complete=1),
        Operation(client=1, op="get", key="x", result="text", invoke=0, complete=1),
        Operation(client=1, op="cas", key="x", value=b"v", result=None, invoke=0, complete=1),
        Operation(client=1, op="get", key="x", invoke=5, complete=4),
        Operation(client=1, op="get", key="x", invoke=0.5, complete=4),  # type: ignore[arg-type]
    ],
)
def test_malformed_operations_are_rejected(op: Operation) -> None:
    """A history the checker cannot interpret is an InvalidArgument, not a verdict."""
    with pytest.raises(InvalidArgument):
        check([op])


def test_a_larger_concurrent_history_checks_quickly() -> None:
    """400 operations from 8 clients over 4 keys, generated by a real register, check well
    within a second: partitioning by key and memoization keep the search small."""
    history = _register_history(random.Random(7), ops_count=400, clients=8, keys=["a", "b", "c", "d"])
    started = time.perf_counter()
    assert check(history).ok is True
    assert time.perf_counter() - started < 5.0


# ----------------------------------------------------------------------------- properties


def _register_history(
    rng: random.Random, *, ops_count: int, clients: int, keys: list[str], info_rate: float = 0.1
) -> list[Operation]:
    """Run a real sequential register; each client issues one operation at a time, each
    operation takes effect at one instant inside its [invoke, complete] interval."""
    values = [b"1", b"2", b"3"]
    state: dict[str, bytes | None] = {}
    free_at = [0] * clients  # when each client may invoke its next operation
    history = []
    now = 0
    for _ in range(ops_count):
        now += rng.randint(1, 3)  # the instant this operation takes effect
        candidates = [c for c in range(clients) if free_at[c] <= now]
        if not candidates:
            continue
        client = rng.choice(candidates)
        invoke = rng.randint(free_at[client], now)
        complete = now + rng.randint(0, 10)
        key = rng.choice(keys)
        kind = rng.choice(["put", "get", "cas", "delete"])
        current = state.get(key)
        info = kind != "get" and rng.random() < info_rate
        if info and rng.random() < 0.5:
            # Timed out and never happened.
            op = Operation(client=client, op=kind, key=key, value=rng.choice(values), expected=rng.choice(values),
                           invoke=invoke, complete=None)
            history.append(op)
            free_at[client] = complete + 1
            continue
        if kind == "put":
            op = Operation(client=client, op="put", key=key, value=rng.choice(values), invoke=invoke, complete=complete)
            state[key] = op.value
        elif kind == "delete":
            op = Operation(client=client, op="delete", key=key, invoke=invoke, complete=complete)
            state[key] = None
        elif kind == "get":
            op = Operation(client=client, op="get", key=key, result=current, invoke=invoke, complete=complete)
        else:
            expected = rng.choice([None, current, *values])
            new = rng.choice(values)
            swapped = expected == current
            if swapped:
                state[key] = new
            op = Operation(client=client, op="cas", key=key, expected=expected, value=new, result=swapped,
                           invoke=invoke, complete=complete)
        if info:
            op = Operation(client=op.client, op=op.op, key=op.key, value=op.value, expected=op.expected,
                           invoke=op.invoke, complete=None)
        history.append(op)
        free_at[client] = complete + 1
    return history


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=0, max_value=2**32), st.integers(min_value=1, max_value=30), st.integers(min_value=1, max_value=6))
def test_histories_of_a_real_register_are_always_linearizable(seed: int, ops_count: int, clients: int) -> None:
    """Any history produced by a sequential register, with each operation's effect inside
    its interval and random overlaps and timeouts, is judged linearizable."""
    history = _register_history(random.Random(seed), ops_count=ops_count, clients=clients, keys=["a", "b"])
    result = check(history)
    assert result.ok is True, result.explanation


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=0, max_value=2**32), st.integers(min_value=1, max_value=30), st.integers(min_value=1, max_value=6))
def test_a_read_of_a_value_never_written_is_always_caught(seed: int, ops_count: int, clients: int) -> None:
    """Mutating one completed read to return a value nobody wrote makes the history
    non-linearizable, and the counterexample contains that read."""
    rng = random.Random(seed)
    history = _register_history(rng, ops_count=ops_count, clients=clients, keys=["a", "b"])
    reads = [i for i, op in enumerate(history) if op.op == "get" and op.complete is not None]
    if not reads:
        history.append(Operation(client=99, op="get", key="a", result=None, invoke=10**6, complete=10**6 + 1))
        reads = [len(history) - 1]
    i = rng.choice(reads)
    original = history[i]
    history[i] = Operation(client=original.client, op="get", key=original.key, result=b"never written",
                           invoke=original.invoke, complete=original.complete)
    result = check(history)
    assert result.ok is False and result.key == original.key
    assert history[i] in result.operations


def _brute_force(history: list[Operation]) -> bool:
    """Linearizability by enumeration (tiny histories only): some subset of the info
    operations plus every completed one, in some order respecting real time, replays on a
    register with the observed results."""
    done = [op for op in history if op.complete is not None]
    info = [op for op in history if op.complete is None]
    for size in range(len(info) + 1):
        for chosen in itertools.combinations(info, size):
            for order in itertools.permutations(done + list(chosen)):
                # a before b is impossible if b completed before a was invoked.
                if any(
                    b.complete is not None and b.complete < a.invoke
                    for i, a in enumerate(order)
                    for b in order[i + 1 :]
                ):
                    continue
                state: bytes | None = None
                for op in order:
                    if op.op == "put":
                        state = op.value
                    elif op.op == "delete":
                        state = None
                    elif op.op == "get":
                        if op.complete is not None and op.result != state:
                            break
                    else:
                        matches = state == op.expected
                        if op.complete is not None and op.result is not matches:
                            break
                        if matches:
                            state = op.value
                else:
                    return True
    return False


_small_values = st.sampled_from([None, b"1", b"2"])


@st.composite
def _random_operation(draw: st.DrawFn, client: int) -> Operation:
    kind = draw(st.sampled_from(["put", "get", "cas", "delete"]))
    invoke = draw(st.integers(min_value=0, max_value=12))
    complete = draw(st.one_of(st.none(), st.integers(min_value=invoke, max_value=invoke + 6)))
    value = draw(st.sampled_from([b"1", b"2"]))
    if kind == "get":
        return Operation(client=client, op="get", key="x", result=draw(_small_values), invoke=invoke, complete=complete)
    if kind == "cas":
        return Operation(client=client, op="cas", key="x", expected=draw(_small_values), value=value,
                         result=draw(st.booleans()), invoke=invoke, complete=complete)
    return Operation(client=client, op=kind, key="x", value=value if kind == "put" else None, invoke=invoke,
                     complete=complete)


@settings(max_examples=300, deadline=None)
@given(st.integers(min_value=1, max_value=6).flatmap(lambda n: st.tuples(*[_random_operation(c) for c in range(n)])))
def test_the_search_agrees_with_brute_force_on_arbitrary_small_histories(ops: tuple[Operation, ...]) -> None:
    """On random tiny histories (arbitrary results, so many are wrong) the WGL search gives
    the same verdict as enumerating every order, and a counterexample is itself a
    non-linearizable history."""
    result = check(list(ops))
    assert result.ok is _brute_force(list(ops))
    if result.ok is False:
        assert _brute_force(list(result.operations)) is False

"""The delayed-delivery index (`actors/dispatch/delayed_index.py`), pure: randomized against a
model (a plain list of entries) with tiny buckets and segments so that runs are sealed, read
segment by segment, merged and rewritten all the time, then the rules one by one."""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from danube_zmq.actors.dispatch.delayed_index import DelayedIndex


class MemoryRunStore:
    """`RunStore` in a dict, recording the calls made to it."""

    def __init__(self) -> None:
        self.runs: dict[int, list[tuple[int, int]]] = {}
        self.reads: list[tuple[int, int, int]] = []  # (run_id, start, count)
        self.writes: list[int] = []

    def write(self, run_id: int, entries: Sequence[tuple[int, int]]) -> None:
        assert list(entries) == sorted(entries), "a run is written sorted"
        assert run_id not in self.runs, "a run id is used once"
        self.runs[run_id] = list(entries)
        self.writes.append(run_id)

    def read(self, run_id: int, start: int, count: int) -> list[tuple[int, int]]:
        self.reads.append((run_id, start, count))
        return self.runs[run_id][start : start + count]

    def delete(self, run_id: int) -> None:
        self.runs.pop(run_id, None)

    def clear(self) -> None:
        self.runs.clear()


def index(
    store: MemoryRunStore, entries_max: int = 1_000, open_entries_max: int = 4, segment_entries: int = 2
) -> DelayedIndex:
    return DelayedIndex(
        store=store, entries_max=entries_max, open_entries_max=open_entries_max, segment_entries=segment_entries
    )


def ram_bound(idx: DelayedIndex) -> int:
    """The documented bound: open_entries_max + runs_max * segment_entries (the open bucket never stays full)."""
    return idx.open_entries_max - 1 + idx.runs_max * idx.segment_entries


class DelayedIndexMachine(RuleBasedStateMachine):
    """Random adds (within room()), pops, drops and clears against a model list of entries."""

    @initialize(
        entries_max=st.integers(1, 40),
        open_entries_max=st.integers(1, 8),
        segment_entries=st.integers(1, 4),
    )
    def setup(self, entries_max: int, open_entries_max: int, segment_entries: int) -> None:
        self.store = MemoryRunStore()
        self.idx = index(self.store, entries_max, open_entries_max, segment_entries)
        self.model: list[tuple[int, int]] = []

    def held(self, offset: int) -> bool:
        return any(o == offset for _, o in self.model)

    @rule(entries=st.lists(st.tuples(st.integers(0, 50), st.integers(0, 100)), max_size=12))
    def add(self, entries: list[tuple[int, int]]) -> None:
        for deliver_at_ms, offset in entries:
            if self.idx.room() > 0 and not self.held(offset):  # offsets are unique among held entries
                self.idx.add(deliver_at_ms, offset)
                self.model.append((deliver_at_ms, offset))

    @rule(now_ms=st.integers(-1, 60), limit=st.integers(0, 6))
    def pop_due(self, now_ms: int, limit: int) -> None:
        expected = sorted(e for e in self.model if e[0] <= now_ms)[:limit]
        assert self.idx.pop_due(now_ms, limit) == expected
        for entry in expected:
            self.model.remove(entry)

    @rule(offset_end=st.integers(0, 110))
    def drop_below(self, offset_end: int) -> None:
        below = [e for e in self.model if e[1] < offset_end]
        assert self.idx.drop_below(offset_end) == len(below)
        self.model = [e for e in self.model if e[1] >= offset_end]

    @rule()
    def clear(self) -> None:
        self.idx.clear()
        self.model = []
        assert self.store.runs == {}

    @invariant()
    def agrees_with_the_model(self) -> None:
        idx = self.idx
        assert len(idx) == len(self.model)
        assert idx.room() == idx.entries_max - len(self.model)
        assert idx.next_due() == (min(self.model) if self.model else None)
        low = idx.low_offset()
        if self.model:
            assert low is not None and low <= min(o for _, o in self.model)
        else:
            assert low is None

    @invariant()
    def stays_within_its_bounds(self) -> None:
        idx = self.idx
        assert idx.runs() <= idx.runs_max
        assert len(self.store.runs) == idx.runs(), "a run read to its end or rewritten is deleted"
        assert idx.memory_entries() <= min(len(self.model), ram_bound(idx))
        assert idx.memory_entries() <= idx.open_entries_max - 1 + idx.runs() * idx.segment_entries


TestDelayedIndexAgainstModel = DelayedIndexMachine.TestCase
TestDelayedIndexAgainstModel.settings = settings(max_examples=300, stateful_step_count=40, deadline=None)


def test_entries_come_out_in_time_then_offset_order_across_many_runs() -> None:
    """2,000 entries with colliding times, spread over many runs of 16 read 3 at a time,
    come out in (deliver_at_ms, offset) order, popped in batches of random size."""
    rng = random.Random(7)
    store = MemoryRunStore()
    idx = index(store, entries_max=2_000, open_entries_max=16, segment_entries=3)
    offsets = list(range(2_000))
    rng.shuffle(offsets)
    entries = [(rng.randrange(100), offset) for offset in offsets]
    for deliver_at_ms, offset in entries:
        idx.add(deliver_at_ms, offset)
    assert idx.runs() == idx.runs_max == 125 and len(idx) == 2_000
    got: list[tuple[int, int]] = []
    while batch := idx.pop_due(100, rng.randrange(1, 50)):
        got += batch
        assert idx.memory_entries() <= ram_bound(idx)
    assert got == sorted(entries)
    assert len(idx) == 0 and idx.runs() == 0 and store.runs == {}


def test_only_due_entries_are_popped() -> None:
    """pop_due stops at the first entry due after `now_ms`, and at `limit`."""
    idx = index(MemoryRunStore())
    for deliver_at_ms, offset in [(30, 1), (10, 2), (20, 3), (10, 0), (40, 4)]:
        idx.add(deliver_at_ms, offset)
    assert idx.pop_due(5, 10) == []
    assert idx.pop_due(20, 2) == [(10, 0), (10, 2)]
    assert idx.next_due() == (20, 3)
    assert idx.pop_due(30, 10) == [(20, 3), (30, 1)]
    assert idx.pop_due(1_000, 0) == []
    assert len(idx) == 1 and idx.next_due() == (40, 4)


def test_a_runs_next_segment_is_read_after_its_loaded_entries_are_popped() -> None:
    """A sealed run of 10 keeps 3 in RAM; the store is read again only when those 3 are gone."""
    store = MemoryRunStore()
    idx = index(store, entries_max=100, open_entries_max=10, segment_entries=3)
    for i in range(10):
        idx.add(i, 100 + i)
    assert (idx.runs(), idx.memory_entries(), store.reads) == (1, 3, [(0, 0, 3)])
    assert idx.pop_due(1, 10) == [(0, 100), (1, 101)]
    assert len(store.reads) == 1 and idx.memory_entries() == 1
    assert idx.pop_due(2, 10) == [(2, 102)]
    assert store.reads[1:] == [(0, 3, 3)] and idx.memory_entries() == 3
    assert idx.pop_due(8, 10) == [(i, 100 + i) for i in range(3, 9)]
    assert store.reads[2:] == [(0, 6, 3), (0, 9, 1)] and idx.memory_entries() == 1
    assert idx.pop_due(9, 10) == [(9, 109)]
    assert idx.runs() == 0 and store.runs == {} and len(store.reads) == 4


def test_drop_below_reads_no_run_with_nothing_below() -> None:
    """Runs keep their lowest offset: drop_below reads and rewrites only the runs it removes from."""
    store = MemoryRunStore()
    idx = index(store, entries_max=100, open_entries_max=10, segment_entries=2)
    for i in range(10):
        idx.add(1_000 - i, i)  # run 0: offsets 0..9
    for i in range(10):
        idx.add(2_000 + i, 100 + i)  # run 1: offsets 100..109
    idx.add(5, 50)  # the open bucket
    assert idx.low_offset() == 0 and store.writes == [0, 1]
    store.reads.clear()
    assert idx.drop_below(0) == 0 and store.reads == []
    assert idx.drop_below(5) == 5
    assert store.reads == [(0, 2, 8), (2, 0, 2)]  # run 0's rest read whole, run 2's first segment; run 1 untouched
    assert store.writes == [0, 1, 2]  # run 0 written again, offsets 5..9
    assert sorted(store.runs) == [1, 2] and idx.low_offset() == 5
    store.reads.clear()
    assert idx.drop_below(60) == 6  # run 2 emptied, 50 left the open bucket
    assert store.reads == [(2, 2, 3)] and sorted(store.runs) == [1] and store.writes == [0, 1, 2]
    store.reads.clear()
    assert idx.drop_below(100) == 0 and store.reads == []
    assert idx.low_offset() == 100 and len(idx) == 10
    assert idx.pop_due(10_000, 100) == [(2_000 + i, 100 + i) for i in range(10)]


def test_room_enforces_entries_max() -> None:
    """room() counts down to 0; an add without room is our bug (an assertion); popping makes room."""
    idx = index(MemoryRunStore(), entries_max=5, open_entries_max=2, segment_entries=1)
    for i in range(5):
        assert idx.room() == 5 - i
        idx.add(i, i)
    assert idx.room() == 0
    with pytest.raises(AssertionError):
        idx.add(9, 9)
    assert idx.pop_due(1, 10) == [(0, 0), (1, 1)]
    assert idx.room() == 2 and len(idx) == 3


def test_runs_popped_down_to_a_few_entries_are_merged() -> None:
    """Each sealed run keeps one far entry while the rest is popped: without merging, runs (and
    their segments in RAM) would pile up; they stay at ceil(entries_max / open_entries_max)."""
    store = MemoryRunStore()
    idx = index(store, entries_max=64, open_entries_max=8, segment_entries=4)
    offset = 0
    for _ in range(50):
        for i in range(idx.open_entries_max):
            idx.add(1_000_000 + offset if i == 0 else 0, offset)
            offset += 1
        idx.pop_due(0, 100)
        assert idx.runs() <= idx.runs_max == 8
        assert idx.memory_entries() <= ram_bound(idx)
    assert len(idx) == 50
    assert [o for _, o in idx.pop_due(2_000_000, 100)] == list(range(0, 400, 8))


def test_clear_forgets_everything_and_the_store() -> None:
    store = MemoryRunStore()
    store.runs[99] = [(0, 0)]  # a stale run: the index starts by clearing the store
    idx = index(store, open_entries_max=2, segment_entries=1)
    assert store.runs == {}
    for i in range(7):
        idx.add(i, i)
    idx.clear()
    assert (len(idx), idx.memory_entries(), idx.runs(), idx.next_due(), idx.low_offset()) == (0, 0, 0, None, None)
    assert store.runs == {}
    idx.add(3, 3)
    assert idx.pop_due(3, 1) == [(3, 3)]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"entries_max": 0},
        {"entries_max": 10, "open_entries_max": 0},
        {"entries_max": 10, "segment_entries": 0},
        {"entries_max": 1.5},
    ],
)
def test_constructor_rejects_bad_bounds(kwargs: dict[str, object]) -> None:
    with pytest.raises(AssertionError):
        DelayedIndex(store=MemoryRunStore(), **kwargs)  # type: ignore[arg-type]

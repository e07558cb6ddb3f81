"""The deduplication table (`actors/topic/dedup.py`), pure: randomized against a model
of what a topic stores, and the rules one by one."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from danube_zmq.actors.topic.dedup import DedupTable
from danube_zmq.transport.errors import InvalidArgument, Unavailable


def _table(window: int = 1000, producers_max: int = 100, inactivity_ms: int = 60_000) -> DedupTable:
    return DedupTable(window=window, producers_max=producers_max, inactivity_ms=inactivity_ms)


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(min_value=0, max_value=2**32), window=st.integers(min_value=1, max_value=50))
def test_a_log_fed_through_the_table_holds_every_id_once_and_answers_duplicates_with_their_offsets(
        seed: int, window: int) -> None:
    """Producers send batches of increasing ids, resend stretches of them (whole,
    straddling their highest, in other batch shapes), and batches fail and are rolled
    back. The log (the model) never holds an id twice per producer, holds them in
    order, and a duplicate is answered with the offset it was stored at (or -1 past the
    window); replaying the log into a new table gives the same highest ids and answers."""
    rng = random.Random(seed)
    table = _table(window=window)
    log: list[tuple[str, int]] = []  # (producer, id) at each offset
    sent: dict[str, int] = {}  # each producer's next new id
    for _ in range(rng.randrange(1, 60)):
        name = rng.choice("abc")
        start = sent.get(name, 0)
        if start and rng.random() < 0.4:
            start = rng.randrange(max(0, start - 3 * window), start)  # resend from earlier
        ids = sorted(rng.sample(range(start, start + 40), rng.randrange(1, 10)))
        duplicates = table.duplicates(name, ids)
        taken = [(i, offset) for offset, (n, i) in enumerate(log) if n == name]
        highest = max((i for i, _ in taken), default=-1)
        assert duplicates == sum(1 for i in ids if i <= highest)
        stored = dict(taken)
        for sequence_id, offset in zip(ids[:duplicates], table.offsets_of(name, ids[:duplicates]), strict=True):
            assert offset in (stored.get(sequence_id, -1), -1)
            assert offset == -1 or log[offset] == (name, sequence_id)
        fresh = ids[duplicates:]
        if not fresh:
            continue
        table.pushed(name, fresh[-1], 0)
        if rng.random() < 0.15:  # the write failed: nothing stored, sent again later
            table.rollback([])
            continue
        table.persisted(name, fresh, len(log), 0)
        log += [(name, i) for i in fresh]
        sent[name] = max(sent.get(name, 0), fresh[-1] + 1)
    for name in "abc":
        mine = [i for n, i in log if n == name]
        assert mine == sorted(set(mine))
        assert table.last_sequence_id(name) == (mine[-1] if mine else -1)
    replayed = _table(window=window)
    replayed.replay([n for n, _ in log], [i for _, i in log], list(range(len(log))), 0)
    for name in "abc":
        assert replayed.last_sequence_id(name) == table.last_sequence_id(name)
        recent = [i for n, i in log if n == name][-window:]
        assert replayed.offsets_of(name, recent) == table.offsets_of(name, recent)


def test_the_window_keeps_the_last_messages_and_one_run_per_batch_of_automatic_ids() -> None:
    table = _table(window=10)
    for batch in range(10):
        ids = list(range(batch * 5, batch * 5 + 5))
        table.persisted("p", ids, 100 + batch * 5, 0)
    assert table.offsets_of("p", [49, 45, 40, 39, 0]) == [149, 145, 140, -1, -1]
    assert len(table._producers["p"].runs) == 1  # consecutive batches at consecutive offsets merge
    assert table.duplicates("p", [48, 49, 50]) == 2


def test_ids_must_increase_and_a_duplicate_still_being_written_is_unavailable() -> None:
    table = _table()
    with pytest.raises(InvalidArgument, match="increase"):
        table.duplicates("p", [3, 3])
    with pytest.raises(InvalidArgument, match="at least 0"):
        table.duplicates("p", [-1, 0])
    table.persisted("p", [0, 1], 0, 0)
    table.pushed("p", 5, 0)  # 2..5 being written
    with pytest.raises(Unavailable, match="still being written"):
        table.duplicates("p", [4])
    assert table.duplicates("p", [0, 1]) == 2
    assert table.duplicates("p", [1, 6]) == 1
    with pytest.raises(Unavailable):
        table.duplicates("p", [1, 3])
    table.rollback([])  # the write of 2..5 failed: they are new again
    assert table.duplicates("p", [1, 3]) == 1


def test_inactive_producers_expire_and_the_bound_drops_the_least_recently_active() -> None:
    table = _table(producers_max=2, inactivity_ms=1000)
    table.persisted("old", [1], 0, 0)
    table.persisted("attached", [1], 1, 0)
    assert table.expire(999, attached=set()) == []
    assert table.expire(1000, attached={"attached"}) == ["old"]
    table.persisted("new", [1], 2, 1500)
    table.persisted("newer", [1], 3, 1600)  # a third name: the least recently active goes
    assert table.last_sequence_id("attached") == -1 and table.evicted == 1
    assert table.last_sequence_id("new") == 1 and table.last_sequence_id("newer") == 1


def test_the_checkpoint_round_trips_and_bad_bytes_are_an_error() -> None:
    table = _table()
    table.persisted("p", [7, 8], 10, 5)
    as_of, entries = DedupTable.decode(table.encode(12))
    assert as_of == 12 and entries == {"p": (8, 5)}
    restored = _table()
    restored.restore(entries, 100)
    assert restored.last_sequence_id("p") == 8 and restored.duplicates("p", [8, 9]) == 1
    for bad in (b"", b"\x92\x01", b"\xc1", b"\x92\x01\x81\xa1p\x01"):
        with pytest.raises(ValueError, match="undecodable deduplication checkpoint"):
            DedupTable.decode(bad)

"""Chunk affinity for Shared subscriptions (`actors/dispatch/chunks.py`), pure:
randomized against a model of dealing, and the rules one by one."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from danube_zmq.actors.dispatch.chunks import Chunk, ChunkAffinity, chunk_of


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(min_value=0, max_value=2**32))
def test_every_chunk_of_a_message_goes_to_one_consumer_while_it_stays(seed: int) -> None:
    """Batches mixing plain messages and the chunks of interleaved chunked messages are
    dealt round after round: the rule (random here) deals `plan.dealt`, owned chunks go
    to their owner, following ones after their first. A message's chunks all reach the
    consumer its first chunk went to, unless that consumer left first."""
    rng = random.Random(seed)
    affinity = ChunkAffinity()
    consumers = [1, 2, 3]
    got: dict[str, set[int]] = {}  # message -> consumers its chunks went to
    left: set[int] = set()
    pending: list[Chunk | None] = []
    for m in range(rng.randrange(1, 12)):
        count = rng.randrange(1, 6)
        pending += [Chunk(f"m{m}", i, count) for i in range(count)]
        pending += [None] * rng.randrange(0, 3)
    # Interleave messages, keeping each one's chunks in order.
    rng.shuffle(pending)
    for message in {c.message for c in pending if c is not None}:
        spots = [i for i, c in enumerate(pending) if c is not None and c.message == message]
        ordered = sorted((pending[i] for i in spots), key=lambda c: c.index)  # type: ignore[union-attr]
        for spot, chunk in zip(spots, ordered, strict=True):
            pending[spot] = chunk
    while pending:
        size = min(len(pending), rng.randrange(1, 8))
        batch, pending = pending[:size], pending[size:]
        plan = affinity.plan(batch)
        delivered: list[Chunk] = []
        for i, consumer in plan.owned:
            chunk = batch[i]
            assert chunk is not None
            got.setdefault(chunk.message, set()).add(consumer)
            delivered.append(chunk)
        for i in plan.dealt:
            consumer = rng.choice(consumers)
            chunk = batch[i]
            if chunk is not None:
                affinity.take(chunk.message, consumer)
                got.setdefault(chunk.message, set()).add(consumer)
                delivered.append(chunk)
        for i, message in plan.following:
            consumer = affinity.owner(message)
            assert consumer is not None
            chunk = batch[i]
            assert chunk is not None
            got.setdefault(message, set()).add(consumer)
            delivered.append(chunk)
        affinity.delivered(delivered)
        if rng.random() < 0.1 and len(consumers) > 1:
            gone = consumers.pop(rng.randrange(len(consumers)))
            affinity.consumer_left(gone)
            left.add(gone)
    for message, to in got.items():
        assert len(to) == 1 or to & left, (message, to)
    assert len(affinity) <= len({c for c in got})


def test_a_message_is_owned_from_its_first_chunk_to_its_last() -> None:
    affinity = ChunkAffinity()
    first = affinity.plan([Chunk("a", 0, 3), None, Chunk("a", 1, 3)])
    assert first.dealt == [0, 1] and first.following == [(2, "a")] and first.owned == []
    affinity.take("a", 7)
    assert affinity.plan([Chunk("a", 2, 3)]).owned == [(0, 7)]
    affinity.delivered([Chunk("a", 2, 3)])
    assert affinity.owner("a") is None and len(affinity) == 0


def test_owners_are_bounded_and_forgotten_with_their_consumer() -> None:
    affinity = ChunkAffinity(owners_max=2)
    for message, consumer in (("a", 1), ("b", 2), ("c", 1)):
        affinity.take(message, consumer)
    assert (affinity.owner("a"), affinity.owner("b"), affinity.owner("c")) == (None, 2, 1)
    affinity.consumer_left(1)
    assert affinity.owner("c") is None and affinity.owner("b") == 2


def test_chunk_attributes_parse_or_the_message_is_plain() -> None:
    ok = {"__chunk_uuid": "u", "__chunk_id": "1", "__chunk_count": "2", "__chunk_total_bytes": "9"}
    assert chunk_of(ok) == Chunk("u", 1, 2)
    assert chunk_of(None) is None and chunk_of({"k": "v"}) is None
    assert chunk_of({**ok, "__chunk_id": "x"}) is None
    assert chunk_of({**ok, "__chunk_id": "2"}) is None  # index past the count

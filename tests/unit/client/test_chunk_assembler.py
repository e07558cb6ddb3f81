"""The consumer's assembler of chunked messages (`client/chunks.py`), on a hand-moved
clock: chunks in any order, sent again, expired, past the count and byte bounds."""

from __future__ import annotations

import random

import pytest

from danube_zmq.client.chunks import CHUNK_ATTRIBUTES, ChunkAssembler, chunk_attributes, split
from danube_zmq.client.message import Message


class Clock:
    def __init__(self) -> None:
        self.ms = 0

    def __call__(self) -> int:
        return self.ms


def _chunks(uuid: str, payload: bytes, size: int, first_offset: int, topic: str = "/default/t") -> list[Message]:
    parts = split(payload, size)
    return [Message(payload=part, topic=topic, offset=first_offset + i, producer_id=1, publish_time=5,
                    producer_name="p", key="k",
                    attributes=chunk_attributes({"kind": "x"}, uuid, i, len(parts), len(payload)))
            for i, part in enumerate(parts)]


def _assembler(clock: Clock, **bounds: int) -> ChunkAssembler:
    return ChunkAssembler(max_pending=bounds.get("max_pending", 10), bytes_max=bounds.get("bytes_max", 1 << 20),
                          expire_ms=bounds.get("expire_ms", 1000), now_ms=clock)


@pytest.mark.parametrize("seed", range(20))
def test_chunks_in_any_order_and_sent_again_make_one_whole_message(seed: int) -> None:
    rng = random.Random(seed)
    payload = rng.randbytes(rng.randrange(1, 5000))
    chunks = _chunks("u", payload, rng.randrange(1, 700), 100)
    arriving = chunks + rng.sample(chunks, k=min(3, len(chunks)))  # some delivered twice
    rng.shuffle(arriving)
    assembler = _assembler(Clock())
    whole = []
    for chunk in arriving:
        done, dropped = assembler.add(chunk)
        assert dropped == []
        if done is not None:
            whole.append(done)
    assert len(whole) >= 1
    first = whole[0]
    assert first.payload == payload and first.offset == 100 and first.key == "k"
    assert dict(first.attributes) == {"kind": "x"} and not set(first.attributes) & set(CHUNK_ATTRIBUTES)
    assert first.chunk_offsets == tuple(range(100, 100 + len(chunks)))
    # Chunks delivered again after it was whole start it again (redelivery: at least once).
    assert assembler.bytes == sum(p.size for p in assembler._pending.values())


def test_an_incomplete_message_expires_and_its_chunks_are_given_back_to_acknowledge() -> None:
    clock = Clock()
    assembler = _assembler(clock, expire_ms=1000)
    chunks = _chunks("u", b"x" * 300, 100, 0)
    assert assembler.add(chunks[0]) == (None, [])
    clock.ms = 999
    assert assembler.add(chunks[1]) == (None, [])  # a chunk came: the wait starts again
    clock.ms = 1998
    assert assembler.expire() == []
    clock.ms = 1999
    assert assembler.expire() == chunks[:2]
    assert (len(assembler), assembler.bytes, assembler.dropped) == (0, 0, 1)


def test_past_the_count_or_the_bytes_the_oldest_incomplete_message_goes() -> None:
    clock = Clock()
    assembler = _assembler(clock, max_pending=2, bytes_max=1000)
    a, b, c = (_chunks(u, bytes([i]) * 600, 200, 10 * i) for i, u in enumerate("abc"))
    assert assembler.add(a[0])[1] == [] and assembler.add(b[0])[1] == []
    _, dropped = assembler.add(c[0])
    assert dropped == [a[0]]  # three pending: the oldest goes
    _, dropped = assembler.add(b[1])  # 200 + 400 + ... bytes: b and c hold 600; fine
    assert dropped == []
    _, dropped = assembler.add(c[1])
    assert dropped == []
    _, dropped = assembler.add(b[2])  # b whole
    assert assembler.dropped == 1
    huge = _chunks("h", b"h" * 3000, 1500, 90)
    _, dropped = assembler.add(huge[0])  # past bytes_max: c goes first, then h alone is too large
    assert {d.attributes["__chunk_uuid"] for d in dropped} == {"c", "h"}
    assert (len(assembler), assembler.bytes) == (0, 0)


def test_a_message_that_only_looks_like_a_chunk_is_handed_out_as_it_is() -> None:
    assembler = _assembler(Clock())
    odd = Message(payload=b"p", topic="/default/t", offset=1, producer_id=1, publish_time=1, producer_name="p",
                  attributes={"__chunk_uuid": "u", "__chunk_id": "zero"})
    assert assembler.add(odd) == (odd, [])

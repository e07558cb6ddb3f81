"""The frame fuzzer's generator (tests/chaos/harness/fuzz.py): seeded, covering, and making the frames
its kinds claim. The fuzz runs against a broker are in tests/chaos/test_fuzz.py."""

from __future__ import annotations

import random
import struct

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from danube_zmq.transport.admin_protocol import ADMIN_PROTOCOL, ADMIN_REQUESTS
from danube_zmq.transport.client_protocol import CLIENT_PROTOCOL, CLIENT_REQUESTS
from danube_zmq.transport.errors import InvalidArgument
from tests.chaos.harness.fuzz import KINDS, FrameGenerator

PORTS = {"client": (CLIENT_PROTOCOL, CLIENT_REQUESTS), "admin": (ADMIN_PROTOCOL, ADMIN_REQUESTS)}


@pytest.mark.parametrize("port", PORTS)
def test_the_same_seed_makes_the_same_messages(port: str) -> None:
    """A failing seed replays: two generators from one seed make the same 1,000
    messages, and another seed makes others."""
    requests = PORTS[port][1]
    first, second, other = (FrameGenerator(random.Random(seed), requests) for seed in (7, 7, 8))
    made = [first.case() for _ in range(1000)]
    assert made == [second.case() for _ in range(1000)]
    assert made != [other.case() for _ in range(1000)]


@pytest.mark.parametrize("port", PORTS)
def test_valid_frames_of_every_request_type_decode(port: str) -> None:
    """The corpus is valid: for every request type the port takes, the frames of kind
    `valid` decode to that type, so the mutations start from frames the broker handles."""
    protocol, requests = PORTS[port]
    gen = FrameGenerator(random.Random(1), requests)
    for cls in requests:
        for _ in range(20):
            assert type(protocol.decode(msgpack.packb(gen.valid_items(cls), use_bin_type=True))) is cls


@settings(max_examples=50, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_every_message_is_bytes_the_decoder_answers(seed: int) -> None:
    """Whatever a seed makes is a list of byte frames, and each frame either decodes or
    is an InvalidArgument: the generator makes nothing the codec itself would crash on
    (what the broker does with them is the fuzz run's question)."""
    gen = FrameGenerator(random.Random(seed), CLIENT_REQUESTS, frame_bytes_max=4096)
    for _ in range(50):
        case = gen.case()
        assert case.parts and all(type(part) is bytes for part in case.parts)
        if case.kind in ("too_many_parts", "oversize"):
            continue
        for part in case.parts:
            try:
                CLIENT_PROTOCOL.decode(part)
            except InvalidArgument:
                pass


def test_every_kind_is_made_in_a_short_run() -> None:
    """5,000 messages of one seed hold every kind, so a 60 s run exercises them all."""
    gen = FrameGenerator(random.Random(3), CLIENT_REQUESTS)
    assert {gen.case().kind for _ in range(5000)} == set(KINDS)


def test_bombs_declare_more_than_they_carry() -> None:
    """A bomb of a 32-bit declared length carries a body far shorter than it declares
    (the decoder must refuse it without allocating), or nests deeper than any message."""
    gen = FrameGenerator(random.Random(5), CLIENT_REQUESTS)
    for _ in range(300):
        frame = gen.case("bomb").parts[0]
        head = frame[3:] if frame[0] == 0x93 else frame  # [tag, id, <bomb>]: tag and id are fixints
        if head[0] in (0xDD, 0xDF, 0xDB, 0xC6, 0xC9):
            assert struct.unpack(">I", head[1:5])[0] >= 1 << 20 > len(frame)
        elif head[0] == 0xDC:
            assert len(frame) < 65535
        else:
            assert head[:100] in (b"\x91" * 100, b"\x81\xa1k" * 33 + b"\x81")


def test_size_kinds_cross_the_broker_limits() -> None:
    """`oversize` is one frame over frame_bytes_max; `too_many_parts` is a message of
    more parts than requests_per_message_max."""
    gen = FrameGenerator(random.Random(9), CLIENT_REQUESTS, frame_bytes_max=10_000, requests_per_message_max=64)
    for _ in range(20):
        (frame,) = gen.case("oversize").parts
        assert 10_000 < len(frame) <= 11_000
        assert len(gen.case("too_many_parts").parts) > 64


def test_mutations_name_ids_the_broker_gave_out() -> None:
    """Ids learnt from the broker's answers come back in generated integer fields, so
    mutated requests reach live producers and consumers."""
    gen = FrameGenerator(random.Random(11), CLIENT_REQUESTS)
    gen.learn_id(987_654_321_987)
    assert any(987_654_321_987 in gen.valid_items(cls) for cls in CLIENT_REQUESTS for _ in range(30))

"""The wire codec: every message round-trips, every malformed input is a clear error."""

from __future__ import annotations

import dataclasses
import types
import typing

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from danube_zmq.transport.admin_protocol import ADMIN_PROTOCOL
from danube_zmq.transport.client_protocol import CLIENT_PROTOCOL, Deliver, Send, SendReceipt, peek_send
from danube_zmq.transport.codec import Struct
from danube_zmq.transport.errors import InvalidArgument
from danube_zmq.transport.internal_protocol import INTERNAL_PROTOCOL

PROTOCOLS = [CLIENT_PROTOCOL, ADMIN_PROTOCOL, INTERNAL_PROTOCOL]
ALL_TYPES = [(p, cls) for p in PROTOCOLS for cls in p.message_types()]

_text = st.text(max_size=20)
_int = st.integers(min_value=-(2**63), max_value=2**64 - 1)


def strategy_for(tp: typing.Any) -> st.SearchStrategy[typing.Any]:
    origin = typing.get_origin(tp)
    if tp is int:
        return _int
    if tp is float:
        return st.floats(allow_nan=False)
    if tp is bool:
        return st.booleans()
    if tp is str:
        return _text
    if tp is bytes:
        return st.binary(max_size=64)
    if origin in (typing.Union, types.UnionType):
        (inner,) = [a for a in typing.get_args(tp) if a is not type(None)]
        return st.none() | strategy_for(inner)
    if origin is list:
        return st.lists(strategy_for(typing.get_args(tp)[0]), max_size=5)
    if origin is dict:
        return st.dictionaries(_text, strategy_for(typing.get_args(tp)[1]), max_size=4)
    if isinstance(tp, type) and issubclass(tp, Struct):
        return strategy_for_struct(tp)
    raise TypeError(tp)


def strategy_for_struct(cls: type) -> st.SearchStrategy[typing.Any]:
    hints = typing.get_type_hints(cls)
    fields = {f.name: strategy_for(hints[f.name]) for f in dataclasses.fields(cls)}
    return st.builds(cls, **fields)


@pytest.mark.parametrize(("protocol", "cls"), ALL_TYPES, ids=lambda v: getattr(v, "__name__", getattr(v, "name", "")))
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_every_message_round_trips(protocol: typing.Any, cls: type, data: st.DataObject) -> None:
    """Encoding then decoding any valid value of any message type gives it back."""
    msg = data.draw(strategy_for_struct(cls))
    assert protocol.decode(protocol.encode(msg)) == msg


def test_tags_are_unique_and_explicit() -> None:
    """Each boundary's tag table has one class per tag, none left at 0."""
    for protocol in PROTOCOLS:
        tags = [cls.TAG for cls in protocol.message_types()]
        assert len(tags) == len(set(tags)) and all(tag > 0 for tag in tags)


def test_optional_trailing_fields_may_be_omitted() -> None:
    """An older peer that sends only the required fields is understood."""
    frame = msgpack.packb([Send.TAG, 7, 1, [b"x"], [5]], use_bin_type=True)
    msg = CLIENT_PROTOCOL.decode(frame)
    assert msg == Send(request_id=7, producer_id=1, payloads=[b"x"], publish_times=[5])


def _required_items(cls: type) -> list[typing.Any]:
    """A value of each required field of `cls` (the defaulted ones left out)."""
    hints = typing.get_type_hints(cls)
    example = {int: 1, float: 1.0, bool: True, str: "s", bytes: b"b"}
    items: list[typing.Any] = []
    for f in dataclasses.fields(cls)[: cls._required]:
        tp = hints[f.name]
        origin = typing.get_origin(tp)
        if tp in example:
            items.append(example[tp])
        elif origin in (typing.Union, types.UnionType):
            items.append(None)
        elif origin is list:
            items.append([])
        elif origin is dict:
            items.append({})
        else:
            items.append(_required_items(tp))  # a nested record: its own required fields
    return items


@pytest.mark.parametrize(("protocol", "cls"), ALL_TYPES, ids=lambda v: getattr(v, "__name__", getattr(v, "name", "")))
def test_a_message_of_only_its_required_fields_decodes_with_the_declared_defaults(protocol, cls) -> None:
    """Every message sent without its defaulted trailing fields (an older peer, or a
    client in another language that leaves them out) decodes, with each left-out field
    at its declared default. Regression: a default that is an IntEnum member
    (`GetPartitions.dispatch_strategy`, `CreateProducer.dispatch_strategy`) was checked
    as if sent, and such a frame was refused "expected an integer" (found by
    tests/chaos/harness/fuzz.py)."""
    items = _required_items(cls)
    msg = protocol.decode(msgpack.packb([cls.TAG, *items], use_bin_type=True))
    for f in dataclasses.fields(cls)[cls._required:]:
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        assert getattr(msg, f.name) == default, f.name


MALFORMED = {
    "empty frame": b"",
    "not msgpack": b"\xc1",
    "truncated": msgpack.packb([Send.TAG, 1, 2, [b"abc"]])[:-2],
    "trailing bytes": msgpack.packb([6, 1]) + b"\x00",
    "not an array": msgpack.packb({"tag": 1}),
    "empty array": msgpack.packb([]),
    "tag not an int": msgpack.packb(["Send", 1]),
    "unknown tag": msgpack.packb([9999, 1]),
    "too few fields": msgpack.packb([Send.TAG, 1]),
    "too many fields": msgpack.packb([6, 1, 2]),
    "int field is a string": msgpack.packb([6, "1"]),
    "bool is not an int": msgpack.packb([6, True]),
    "bytes field is a string": msgpack.packb([Send.TAG, 1, 2, ["text"], [1]], use_bin_type=True),
    "list field is a map": msgpack.packb([Send.TAG, 1, 2, {"a": 1}, [1]]),
    "map with int keys": msgpack.packb([Send.TAG, 1, 2, [b"x"], [1], None, [{1: "v"}]], use_bin_type=True),
    "map value not a string": msgpack.packb([Send.TAG, 1, 2, [b"x"], [1], None, [{"k": 1}]], use_bin_type=True),
    "extension type": msgpack.packb([6, msgpack.ExtType(5, b"xx")]),
    "invalid utf-8": b"\x92\x10\xa2\xff\xfe",
    "huge declared array": b"\xdd\x7f\xff\xff\xff\x01",
    "huge declared map": b"\xdf\x7f\xff\xff\xff\x01\x01",
    "huge declared bin": b"\x92\x06\xc6\x7f\xff\xff\xffab",
}


@pytest.mark.parametrize("frame", MALFORMED.values(), ids=MALFORMED.keys())
def test_malformed_frames_are_clear_errors(frame: bytes) -> None:
    """Every class of bad input becomes InvalidArgument with a message, never a crash."""
    with pytest.raises(InvalidArgument) as info:
        CLIENT_PROTOCOL.decode(frame)
    assert info.value.message


DEEP = b"\x91" * 1020 + b"\xc0"  # arrays nested 1,020 deep: within msgpack's stack (1,024)
BAD_DEEP_VALUES = {
    "as a field": b"\x92\x06" + DEEP,  # [Ping tag, <deep>]
    "as the tag": b"\x92" + DEEP + b"\x01",
    "as a list item": msgpack.packb([Send.TAG, 1, 2, [b"x"], [1]], use_bin_type=True)[:-2] + b"\x91" + DEEP,
    "huge list": msgpack.packb([6, list(range(1 << 20))]),
}


@pytest.mark.parametrize("frame", BAD_DEEP_VALUES.values(), ids=BAD_DEEP_VALUES.keys())
def test_a_deep_or_huge_value_in_the_wrong_place_is_a_short_clear_error(frame: bytes) -> None:
    """A value nested as deep as msgpack allows, or a million-item list, where another
    type is expected is an InvalidArgument whose message stays short. Regression: the
    error showed the value with repr(), which raised RecursionError on the deep one; the
    gateway crashed on it and, after its restarts, the broker exited (found by
    tests/chaos/harness/fuzz.py)."""
    with pytest.raises(InvalidArgument) as error:
        CLIENT_PROTOCOL.decode(frame)
    assert len(str(error.value)) < 200


def test_error_names_the_field_at_fault() -> None:
    """The message of a type error says which message and field were wrong."""
    frame = msgpack.packb([Send.TAG, 1, "two", [b"x"], [1]], use_bin_type=True)
    with pytest.raises(InvalidArgument, match=r"Send\.producer_id"):
        CLIENT_PROTOCOL.decode(frame)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_random_bytes_never_crash_the_decoder(frame: bytes) -> None:
    """Arbitrary bytes decode to a message or raise InvalidArgument; nothing else escapes."""
    try:
        CLIENT_PROTOCOL.decode(frame)
    except InvalidArgument:
        pass


def test_deliver_keeps_columns_aligned() -> None:
    """A delivered batch carries one entry per message in each column."""
    msg = Deliver(consumer_id=1, topic="/default/t", producer_id=2, producer_name="p", base_offset=10,
                  payloads=[b"a", b"b"], publish_times=[1, 2], keys=["k", None], attributes=[{"a": "1"}, None])
    back = CLIENT_PROTOCOL.decode(CLIENT_PROTOCOL.encode(msg))
    assert back.keys == ["k", None] and back.attributes == [{"a": "1"}, None]


_U64 = st.integers(min_value=0, max_value=2**64 - 1)


@settings(max_examples=300, deadline=None)
@given(request_id=_U64, producer_id=_U64, payloads=st.lists(st.binary(max_size=40), min_size=1, max_size=20),
       sequence=st.none() | _U64)
def test_peek_send_reads_the_ids_a_decode_would(request_id, producer_id, payloads, sequence) -> None:
    frame = CLIENT_PROTOCOL.encode(Send(request_id=request_id, producer_id=producer_id, payloads=payloads,
                                        publish_times=[0] * len(payloads), sequence=sequence))
    assert peek_send(frame) == (request_id, producer_id)
    assert peek_send(memoryview(frame)) == (request_id, producer_id)
    # Cut anywhere, a frame is never misread: the ids or nothing.
    for end in range(min(len(frame), 24)):
        assert peek_send(frame[:end]) in (None, (request_id, producer_id))


@settings(max_examples=200, deadline=None)
@given(items=st.lists(st.one_of(st.integers(min_value=-2**63, max_value=2**64 - 1), st.binary(max_size=8),
                                st.text(max_size=8), st.none()), max_size=6))
def test_peek_send_reads_no_ids_from_what_is_not_a_send_of_ids(items) -> None:
    frame = msgpack.packb([Send.TAG, *items], use_bin_type=True)
    ids = peek_send(frame)
    if len(items) >= 2 and all(type(i) is int and i >= 0 for i in items[:2]):
        assert ids == (items[0], items[1])
    else:
        assert ids is None


def test_peek_send_is_none_for_other_messages_and_garbage() -> None:
    receipt = CLIENT_PROTOCOL.encode(SendReceipt(request_id=1, producer_id=2, offsets=[3]))
    assert peek_send(receipt) is None
    assert peek_send(b"") is None
    assert peek_send(b"\xc1\xff") is None
    assert peek_send(msgpack.packb({"tag": Send.TAG})) is None
    # A Send in an array16 header (more than 15 fields' worth is legal msgpack).
    assert peek_send(b"\xdc\x00\x04" + msgpack.packb(Send.TAG) + msgpack.packb(300) + msgpack.packb(7) + b"\x90") \
        == (300, 7)


def test_a_wire_message_refuses_checks_that_decoding_would_skip() -> None:
    """Decoding fills a message's slots directly, so a `__post_init__` or a field the
    constructor does not set would be skipped on the wire: `wire` refuses both."""
    from danube_zmq.transport.codec import Message, wire

    with pytest.raises(TypeError, match="__post_init__"):
        @wire
        class Checked(Message):
            TAG = 900
            n: int

            def __post_init__(self) -> None:
                pass

    with pytest.raises(TypeError, match="set by its constructor"):
        @wire
        class Hidden(Message):
            TAG = 901
            n: int = dataclasses.field(default=0, init=False)


def test_the_constructor_keeps_the_declared_signature_and_defaults() -> None:
    """The compiled constructor takes keywords only, fills defaults, refuses unknown or
    missing fields, and the message stays frozen."""
    send = Send(request_id=1, producer_id=2, payloads=[b"a"], publish_times=[3])
    assert (send.keys, send.attributes, send.sequence) == (None, None, None)
    with pytest.raises(TypeError):
        Send(1, 2, [b"a"], [3])  # type: ignore[misc]
    with pytest.raises(TypeError):
        Send(request_id=1, producer_id=2, payloads=[b"a"])  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        Send(request_id=1, producer_id=2, payloads=[b"a"], publish_times=[3], colour=1)  # type: ignore[call-arg]
    with pytest.raises(dataclasses.FrozenInstanceError):
        send.request_id = 5  # type: ignore[misc]
    assert dataclasses.replace(send, sequence=4) == Send(request_id=1, producer_id=2, payloads=[b"a"],
                                                         publish_times=[3], sequence=4)


def test_an_omitted_trailing_field_takes_its_default_unchecked() -> None:
    """A sender that leaves out a trailing field gets the declared default, even one the
    field's wire check would refuse (an IntEnum default of an int field): defaults are
    the receiver's, not the sender's, so they are not checked (a raw client's
    GetPartitions without its dispatch strategy was refused)."""
    from danube_zmq.transport.client_protocol import DispatchStrategy, GetPartitions

    frame = msgpack.packb([GetPartitions.TAG, 1, "/default/t"])
    decoded = CLIENT_PROTOCOL.decode(frame)
    assert decoded.dispatch_strategy is DispatchStrategy.NON_RELIABLE


def test_a_peer_protocol_drops_a_newer_peers_trailing_fields_and_a_client_protocol_refuses_them() -> None:
    """A rolling upgrade: a Raft answer from a peer of the next version, with a field
    this version does not know, decodes as this version's message (the fields it knows
    intact); the same extra field on a client frame is still a clear error."""
    from danube_zmq.consensus.peer import PEER_PROTOCOL
    from danube_zmq.consensus.raft.messages import RAFT_PROTOCOL, HeartbeatResponse

    answer = HeartbeatResponse(from_id=2, to_id=1, term=7, incarnation=99)
    newer = msgpack.packb([*answer.to_wire(), "a field of the next version", 5])
    for protocol in (RAFT_PROTOCOL, PEER_PROTOCOL):
        assert protocol.decode(newer) == answer
    with pytest.raises(InvalidArgument, match="fields, got"):
        CLIENT_PROTOCOL.decode(msgpack.packb([*Send(
            request_id=1, producer_id=2, payloads=[b"x"], publish_times=[1]).to_wire(), "extra"], use_bin_type=True))
    with pytest.raises(InvalidArgument, match="an integer"):  # the known fields are still checked
        RAFT_PROTOCOL.decode(msgpack.packb([HeartbeatResponse.TAG, "2", 1, 7, 99, "extra"]))


def test_producer_created_leaves_out_last_sequence_id_unless_the_topic_deduplicates() -> None:
    """A client from before the field decodes 6 fields and refuses more: the broker
    writes the 7th only for a deduplicating topic; both read back whole."""
    import msgpack

    from danube_zmq.transport import client_protocol as cp

    plain = cp.ProducerCreated(request_id=1, producer_id=2, producer_name="p", topic="/default/t")
    assert len(msgpack.unpackb(cp.CLIENT_PROTOCOL.encode(plain))) == 1 + 6
    assert cp.CLIENT_PROTOCOL.decode(cp.CLIENT_PROTOCOL.encode(plain)) == plain
    dedup = cp.ProducerCreated(request_id=1, producer_id=2, producer_name="p", topic="/default/t", last_sequence_id=-1)
    assert len(msgpack.unpackb(cp.CLIENT_PROTOCOL.encode(dedup))) == 1 + 7
    assert cp.CLIENT_PROTOCOL.decode(cp.CLIENT_PROTOCOL.encode(dedup)) == dedup

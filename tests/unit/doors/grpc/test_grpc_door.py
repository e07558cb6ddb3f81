"""The gRPC door's pure parts: error mapping, the address it dials, staying unloaded when off."""

from __future__ import annotations

import asyncio
import random
import subprocess
import sys

import grpc
import msgpack
import pytest

from danube_zmq.client.message import Message, MessageId
from danube_zmq.doors.grpc.calls import GRPC_STATUS, native_target
from danube_zmq.doors.grpc.client_door import GrpcDoor
from danube_zmq.doors.grpc.services import (
    SENDING_BYTES_MAX,
    STREAM_GRACE_MS,
    DoorConsumer,
    DoorProducer,
    ProducerDoor,
)
from danube_zmq.transport import cluster_records as cr
from danube_zmq.transport.danube_proto import DanubeApi_pb2 as pb
from danube_zmq.transport.errors import ErrorCode, InvalidArgument


def test_every_error_code_has_a_grpc_status() -> None:
    """A new ErrorCode must say which gRPC code Danube's clients see for it."""
    assert set(GRPC_STATUS) == set(ErrorCode)


def test_danube_client_reactions_are_kept() -> None:
    """The codes Danube's client acts on: UNAVAILABLE redoes the lookup, the Exclusive
    conflict (CONSUMER_BUSY here) is PERMISSION_DENIED, our TIMEOUT is retried."""
    assert GRPC_STATUS[ErrorCode.UNAVAILABLE] == grpc.StatusCode.UNAVAILABLE
    assert GRPC_STATUS[ErrorCode.CONSUMER_BUSY] == grpc.StatusCode.PERMISSION_DENIED
    assert GRPC_STATUS[ErrorCode.TIMEOUT] == grpc.StatusCode.DEADLINE_EXCEEDED


@pytest.mark.parametrize(("bound", "dialed"), [
    ("tcp://0.0.0.0:6650", "tcp://127.0.0.1:6650"), ("tcp://*:7000", "tcp://127.0.0.1:7000"),
    ("tcp://10.1.2.3:6650", "tcp://10.1.2.3:6650"), ("ipc:///tmp/b.sock", "ipc:///tmp/b.sock")])
def test_door_dials_its_own_client_port(bound: str, dialed: str) -> None:
    assert native_target(bound) == dialed


def test_door_cannot_dial_inproc() -> None:
    """Its native clients have their own ZeroMQ context, which cannot reach inproc://."""
    with pytest.raises(InvalidArgument, match="tcp:// or ipc://"):
        native_target("inproc://broker")


def test_registration_without_grpc_urls_still_decodes() -> None:
    """Records written before the doors existed (fields fewer) decode with grpc_url and
    grpc_admin_url None."""
    record = cr.BrokerRegistration(broker_id=1, broker_url="tcp://a:1", admin_url="tcp://a:2", raft_node_id=1,
                                   started_ms=5, grpc_url="http://a:3", grpc_admin_url="https://a:4")
    fields = msgpack.unpackb(cr.encode(record), raw=False)
    assert fields[-2:] == ["http://a:3", "https://a:4"]
    before_admin_door = cr.decode(msgpack.packb(fields[:-1], use_bin_type=True), cr.BrokerRegistration)
    assert (before_admin_door.grpc_url, before_admin_door.grpc_admin_url) == ("http://a:3", None)
    before_doors = cr.decode(msgpack.packb(fields[:-2], use_bin_type=True), cr.BrokerRegistration)
    assert (before_doors.grpc_url, before_doors.grpc_admin_url) == (None, None)
    assert cr.decode(cr.encode(record), cr.BrokerRegistration) == record


def test_a_broker_without_the_door_loads_no_grpc_module() -> None:
    """Off by default means off: starting the broker's service module imports neither
    door (client or admin), nor the vendored stubs, nor grpcio itself."""
    code = ("import sys, danube_zmq.actors.service, danube_zmq.cli.broker; "
            "print(sorted(m for m in sys.modules if 'grpc_door' in m or 'grpc_admin' in m or 'danube_proto' in m"
            " or m.split('.')[0] == 'grpc'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize(("version_ref", "expected"), [
    ({"use_latest": True}, {"schema_subject": "orders"}),
    ({"pinned_version": 3}, {"schema_subject": "orders", "schema_version": 3}),
    ({"min_version": 2}, {"schema_subject": "orders", "schema_min_version": 2}),
    ({}, {"schema_subject": "orders"}),
])
def test_schema_reference_becomes_the_native_producers_choice(version_ref: dict, expected: dict) -> None:
    from danube_zmq.doors.grpc.services import _schema_choice
    from danube_zmq.transport.danube_proto import DanubeApi_pb2 as pb

    request = pb.ProducerRequest(producer_name="p", topic_name="/default/t",
                                 schema_ref=pb.SchemaReference(subject="orders", **version_ref))
    assert _schema_choice(request) == expected
    assert _schema_choice(pb.ProducerRequest(producer_name="p", topic_name="/default/t")) == {}
    with pytest.raises(InvalidArgument):
        _schema_choice(pb.ProducerRequest(schema_ref=pb.SchemaReference(subject="", use_latest=True)))


class _Aborted(Exception):
    pass


class _Context:
    """What the door's handlers use of a grpc.aio context (security off: no metadata read)."""

    def __init__(self) -> None:
        self.code: grpc.StatusCode | None = None

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        self.code = code
        raise _Aborted(details)


class _Client:
    async def close(self) -> None:
        pass


class _HeldProducer:
    """A native producer whose sends wait until released (the broker's receipt late)."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.sent = 0

    async def send(self, payload: bytes, **_: object) -> None:
        await self.release.wait()
        self.sent += 1


def _door() -> GrpcDoor:
    return GrpcDoor(listen="http://127.0.0.1:0", advertised_url=None, client_url="tcp://127.0.0.1:1",
                    admin_url="tcp://127.0.0.1:2", broker_url="tcp://127.0.0.1:1", attachments_max=10, metadata=None,
                    rng=random.Random(7))


async def test_sends_awaiting_the_broker_are_bounded_in_bytes() -> None:
    """Concurrent SendMessage calls held by a slow broker stop at SENDING_BYTES_MAX of
    payload: the next is answered RESOURCE_EXHAUSTED at once (Danube's client retries
    it), and once the held ones complete the budget is whole again."""
    door = _door()
    producer = _HeldProducer()
    door.attachments[1] = DoorProducer(_Client(), producer, door.monotonic_ms(), None)  # type: ignore[arg-type]
    service = ProducerDoor(door)
    chunk = b"x" * (8 * 1024 * 1024)

    def request() -> pb.StreamMessage:
        return pb.StreamMessage(request_id=1, msg_id=pb.MsgID(producer_id=1), payload=chunk)

    held = [asyncio.create_task(service.SendMessage(request(), _Context())) for _ in range(SENDING_BYTES_MAX // len(chunk))]
    await asyncio.sleep(0)
    assert door.sending_bytes == SENDING_BYTES_MAX
    refused = _Context()
    with pytest.raises(_Aborted, match="bytes of sends awaiting the broker"):
        await service.SendMessage(request(), refused)
    assert refused.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    producer.release.set()
    await asyncio.gather(*held)
    assert door.sending_bytes == 0 and producer.sent == len(held)
    await service.SendMessage(request(), _Context())


def test_a_door_consumer_remembers_ids_not_payloads() -> None:
    """What a door consumer keeps to route Danube's Ack/Nack is the message's id: a
    payload is never held past its delivery."""
    consumer = DoorConsumer(_Client(), None, 0, None, {})  # type: ignore[arg-type]
    message = Message(topic="/default/t", offset=3, producer_id=9, payload=b"y" * 1_000_000, publish_time=0,
                      producer_name="p", attributes={})
    consumer.remember(message)
    assert list(consumer.delivered.values()) == [MessageId("/default/t", 3, 9)]
    assert type(next(iter(consumer.delivered.values()))) is MessageId


class _Native:
    """A native consumer fed by the test: `receive` waits on a queue."""

    def __init__(self) -> None:
        self.inbox: asyncio.Queue[str] = asyncio.Queue()
        self.closed = False

    @property
    def queued(self) -> int:
        return 0  # always the waiting path, where a takeover can land

    async def receive(self) -> str:
        return await self.inbox.get()

    async def close(self) -> None:
        self.closed = True


async def test_a_message_taken_as_its_stream_is_replaced_goes_to_the_next_stream() -> None:
    """The native receive and the takeover complete in the same turn: the old stream
    ends (None) and the message it took is the new stream's first, not lost."""
    native = _Native()
    consumer = DoorConsumer(_Client(), native, 0, None, {})  # type: ignore[arg-type]
    first = consumer.open_stream()
    waiting = asyncio.ensure_future(consumer.next_message(first, native))  # type: ignore[arg-type]
    await asyncio.sleep(0)
    native.inbox.put_nowait("m1")
    second = consumer.open_stream()
    assert await waiting is None
    consumer.stream_ended(first, 1)
    assert consumer.stream is second and consumer.stream_lost_ms is None  # replaced, not lost
    native.inbox.put_nowait("m2")
    assert [await consumer.next_message(second, native), await consumer.next_message(second, native)] == [  # type: ignore[arg-type]
        "m1", "m2"]


async def test_a_message_taken_as_the_client_leaves_waits_for_its_next_stream() -> None:
    """The client cancels the stream while the native receive has just taken a message:
    the message is kept for the consumer's next stream."""
    native = _Native()
    consumer = DoorConsumer(_Client(), native, 0, None, {})  # type: ignore[arg-type]
    stream = consumer.open_stream()
    waiting = asyncio.ensure_future(consumer.next_message(stream, native))  # type: ignore[arg-type]
    await asyncio.sleep(0)
    native.inbox.put_nowait("m1")
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    consumer.stream_ended(stream, 1)
    assert await consumer.next_message(consumer.open_stream(), native) == "m1"  # type: ignore[arg-type]


async def test_a_lost_stream_detaches_its_consumer_after_the_grace_only() -> None:
    """No stream for less than STREAM_GRACE_MS: the native consumer stays; past it, it is
    closed (the broker then hands its place on) and the consumer is detached."""
    native = _Native()
    consumer = DoorConsumer(_Client(), native, 0, None, {})  # type: ignore[arg-type]
    stream = consumer.open_stream()
    consumer.stream_ended(stream, 1_000)
    assert not consumer.busy()
    await consumer.tick(1_000 + STREAM_GRACE_MS - 1)
    assert consumer.consumer is native and not native.closed
    await consumer.tick(1_000 + STREAM_GRACE_MS)
    assert consumer.consumer is None and native.closed


def test_a_segment_listing_is_bounded_and_polls_on() -> None:
    """One answer holds at most DESCRIPTORS_PER_ANSWER_MAX descriptors (a topic may hold
    more than a gRPC message carries); polling from the last start offset seen gets the
    rest, in offset order, none twice."""
    from danube_zmq.doors.grpc.storage import segments_after
    from danube_zmq.storage.catalog import SegmentDescriptor

    segments = [SegmentDescriptor(topic="/default/t", base_offset=base, end_offset=base + 9, record_count=10,
                                  size_bytes=100, crc32c=0, object_key=f"default/t/{base:020d}.seg", created_ms=0)
                for base in range(0, 250, 10)]
    seen, after = [], 0
    while page := segments_after(segments, after, limit=7):
        assert len(page) <= 7
        seen += [s.base_offset for s in page]
        after = page[-1].base_offset
    assert seen == list(range(10, 250, 10))  # Danube's filter: never the segment at 0

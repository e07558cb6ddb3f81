"""The wire protocol as docs/protocol.md states it, driven by hand against a real broker.

Nothing here imports `danube_zmq.transport`: every frame is built with
`msgpack.packb([tag, ...], use_bin_type=True)` and every reply is read by position
with `msgpack.unpackb(raw=False)`, exactly as a client in another language would
from the document alone. If one of these tests fails, either the broker or
docs/protocol.md is wrong.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any

import msgpack
import pytest
import zmq
from zmq.utils.monitor import recv_monitor_message

# One broker for the module (tests/integration/conftest.py): each test has topics of its own.
SHARED_BROKER = True

RECV_TIMEOUT_MS = 3000

# Tags (docs/protocol.md section 7 and 11).
CONNECT, CONNECTED, ERROR, OK, PING, PONG = 1, 2, 3, 4, 5, 6
GET_PARTITIONS, PARTITIONS = 18, 19
CREATE_PRODUCER, PRODUCER_CREATED = 20, 21
SEND, SEND_RECEIPT = 23, 24
SUBSCRIBE, SUBSCRIBED, FLOW, DELIVER = 25, 26, 27, 28
PRODUCER_CLOSED, CONSUMER_CLOSED = 35, 36
ADMIN_LIST_NAMESPACES, ADMIN_NAMESPACE_LIST = 16, 17
PUSHES = {DELIVER, PRODUCER_CLOSED, CONSUMER_CLOSED}

# Error codes (section 6).
INVALID_ARGUMENT, UNAVAILABLE, UNSUPPORTED_VERSION = 1, 6, 9

PROTOCOL_VERSION = 1
EXCLUSIVE, EARLIEST = 0, 1


def pack(*items: Any) -> bytes:
    return msgpack.packb(list(items), use_bin_type=True)


class RawClient:
    """A DEALER with a stable random identity; replies are matched by request id."""

    def __init__(self, ctx: zmq.Context, url: str) -> None:
        self.sock = ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.RCVTIMEO, RECV_TIMEOUT_MS)
        self.sock.setsockopt(zmq.SNDTIMEO, RECV_TIMEOUT_MS)
        # 1..255 bytes, first byte non-zero (libzmq reserves a leading zero).
        self.sock.setsockopt(zmq.ROUTING_ID, b"\x01" + os.urandom(15))
        self.sock.connect(url)
        self.next_id = 1
        self.pushes: list[list[Any]] = []

    def send_raw(self, frame: bytes) -> None:
        self.sock.send(frame)

    def send(self, *items: Any) -> None:
        self.sock.send(pack(*items))

    def recv(self) -> list[Any]:
        reply = msgpack.unpackb(self.sock.recv(), raw=False)
        assert isinstance(reply, list) and reply, reply
        return reply

    def take_id(self) -> int:
        request_id, self.next_id = self.next_id, self.next_id + 1
        return request_id

    def reply_to(self, request_id: int) -> list[Any]:
        """The next reply with `request_id`; pushes met on the way are kept in `pushes`."""
        while True:
            reply = self.recv()
            if reply[0] in PUSHES:
                self.pushes.append(reply)
            elif reply[1] == request_id:
                return reply

    def replies_to(self, request_ids: list[int]) -> dict[int, list[Any]]:
        """The replies to all of `request_ids`, in whatever order they come."""
        replies: dict[int, list[Any]] = {}
        while len(replies) < len(request_ids):
            reply = self.recv()
            if reply[0] in PUSHES:
                self.pushes.append(reply)
            elif reply[1] in request_ids:
                replies[reply[1]] = reply
        return replies

    def request(self, tag: int, *fields: Any) -> list[Any]:
        request_id = self.take_id()
        self.send(tag, request_id, *fields)
        return self.reply_to(request_id)

    def push(self, tag: int) -> list[Any]:
        """The next push of type `tag` (already received, or the next to arrive)."""
        for i, push in enumerate(self.pushes):
            if push[0] == tag:
                return self.pushes.pop(i)
        while True:
            frame = self.recv()
            if frame[0] == tag:
                return frame
            self.pushes.append(frame)

    def connect(self) -> list[Any]:
        connected = self.request(CONNECT, PROTOCOL_VERSION, "raw-test")
        assert connected[0] == CONNECTED, connected
        return connected

    def ping_pongs(self) -> bool:
        reply = self.request(PING)
        return reply[0] == PONG


@pytest.fixture
def ctx() -> Iterator[zmq.Context]:
    context = zmq.Context()
    yield context
    context.destroy(linger=0)


def assert_error(reply: list[Any], code: int, request_id: int | None = None) -> str:
    """Check an `Error` [3, request_id, code, message, redirect_url]; return the message."""
    assert reply[0] == ERROR, reply
    assert len(reply) == 5, reply
    if request_id is not None:
        assert reply[1] == request_id, reply
    assert reply[2] == code, reply
    assert isinstance(reply[3], str) and reply[3], reply
    assert reply[4] is None, reply
    return reply[3]


def test_handshake_answers_connected_and_ping_answers_pong(broker, ctx):
    """Before Connect a request is UNAVAILABLE; a wrong version is UNSUPPORTED_VERSION;
    Connect gets Connected with the broker's limits, then Ping gets Pong."""
    client = RawClient(ctx, broker.url)

    message = assert_error(client.request(PING), UNAVAILABLE, request_id=1)
    assert "connection not established" in message

    assert_error(client.request(CONNECT, 2, "raw-test"), UNSUPPORTED_VERSION, request_id=2)

    connected = client.request(CONNECT, PROTOCOL_VERSION, "raw-test")
    assert len(connected) == 9, connected
    (tag, request_id, version, broker_id, broker_url, frame_bytes_max, message_bytes_max,
     heartbeat_ms, session_timeout_ms) = connected
    assert (tag, request_id, version) == (CONNECTED, 3, PROTOCOL_VERSION)
    assert isinstance(broker_id, int) and 0 <= broker_id < 2**63
    assert broker_url == broker.url
    assert frame_bytes_max == 16 * 1024 * 1024
    assert message_bytes_max == 10 * 1024 * 1024
    assert frame_bytes_max > message_bytes_max + 1024 * 1024
    # The fixture's environment: 300 ms heartbeats, 1500 ms session timeout.
    assert (heartbeat_ms, session_timeout_ms) == (300, 1500)

    assert client.request(PING) == [PONG, 4]
    assert client.request(PING) == [PONG, 5]


def test_raw_producer_and_raw_consumer_exchange_a_batch(broker, ctx):
    """GetPartitions(create) makes the topic; a raw producer's Send gets one offset per
    message, and a raw consumer with permits receives the batch as one Deliver."""
    topic = "/default/raw-batch"
    producer, consumer = RawClient(ctx, broker.url), RawClient(ctx, broker.url)
    producer.connect()
    consumer.connect()

    partitions = producer.request(GET_PARTITIONS, topic, True)
    assert partitions == [PARTITIONS, partitions[1], topic, [topic]]

    created = producer.request(CREATE_PRODUCER, topic, "raw-producer")
    assert created[0] == PRODUCER_CREATED, created
    _, _, producer_id, producer_name, created_topic, schema_id, schema_version = created
    assert (producer_name, created_topic, schema_id, schema_version) == ("raw-producer", topic, None, None)

    subscribed = consumer.request(SUBSCRIBE, topic, "raw-sub", "raw-consumer", EXCLUSIVE, EARLIEST)
    assert subscribed[0] == SUBSCRIBED, subscribed
    _, _, consumer_id, consumer_name, subscribed_topic, reliable = subscribed
    assert (consumer_name, subscribed_topic, reliable) == ("raw-consumer", topic, False)
    consumer.send(FLOW, consumer_id, 100)  # no request id, no reply

    payloads = [b"first", b"\x00\xffbinary", b""]
    publish_times = [1_700_000_000_000, 1_700_000_000_001, 1_700_000_000_002]
    keys = ["k1", None, "k3"]
    attributes = [{"colour": "blue"}, None, {}]
    receipt = producer.request(SEND, producer_id, payloads, publish_times, keys, attributes)
    assert receipt[0] == SEND_RECEIPT, receipt
    assert receipt[2:] == [producer_id, [0, 1, 2]]

    # The second batch: only the mandatory columns (keys and attributes left out).
    receipt = producer.request(SEND, producer_id, [b"fourth"], [1_700_000_000_003])
    assert receipt[2:] == [producer_id, [3]]

    deliver = consumer.push(DELIVER)
    assert len(deliver) == 14, deliver  # the tag and all 13 fields
    (_, to_consumer, from_topic, from_producer, from_name, base_offset, got_payloads, got_times,
     got_keys, got_attributes, offsets, redelivery_count, schema_id, schema_version) = deliver
    assert (to_consumer, from_topic, from_producer, from_name) == (consumer_id, topic, producer_id, "raw-producer")
    assert base_offset == 0 and offsets is None  # contiguous: offset i = base_offset + i
    assert (got_payloads, got_times, got_keys, got_attributes) == (payloads, publish_times, keys, attributes)
    assert (redelivery_count, schema_id, schema_version) == (0, None, None)

    deliver = consumer.push(DELIVER)
    assert deliver[5:10] == [3, [b"fourth"], [1_700_000_000_003], None, None]
    assert deliver[10] is None

    assert producer.ping_pongs() and consumer.ping_pongs()


# Each class of bad frame, as (frames of one ZeroMQ message, the request id the Error
# carries): the frame's second element when it is a non-negative integer, else 0.
MALFORMED = {
    "garbage bytes": ([b"\xc1\xff\x00 not msgpack"], 0),
    "not an array": ([msgpack.packb({"tag": PING}, use_bin_type=True)], 0),
    "unknown tag": ([pack(99, 7)], 7),
    "wrong field type": ([pack(PING, "seven")], 0),
    "payload as str": ([pack(SEND, 7, 1, ["not bin"], [0])], 7),
    "extra field": ([pack(PING, 7, "extra")], 7),
}


@pytest.mark.parametrize(("frames", "request_id"), MALFORMED.values(), ids=MALFORMED.keys())
def test_malformed_frame_gets_invalid_argument_and_the_connection_keeps_working(
        broker, ctx, frames, request_id):
    """Each class of bad frame is answered with Error code 1 (INVALID_ARGUMENT); the same
    connection then still answers Ping, and another client is unaffected."""
    client = RawClient(ctx, broker.url)
    client.connect()

    client.sock.send_multipart(frames)
    assert_error(client.recv(), INVALID_ARGUMENT, request_id=request_id)

    assert client.ping_pongs()

    other = RawClient(ctx, broker.url)
    other.connect()
    assert other.ping_pongs()
    assert client.ping_pongs()


# Bad batches of an attached producer: the gateway routes a Send by its ids alone and
# the topic decodes and checks it, so these errors come from the topic.
BAD_BATCHES = {
    "payload as str": (["not bin"], [0]),
    "no messages": ([], []),
    "publish_times short": ([b"a", b"b"], [0]),
    "publish time as str": ([b"a"], ["noon"]),
    "publish time negative": ([b"a", b"b"], [1_700_000_000_000, -1]),
    "publish time past year 9999": ([b"a"], [253_402_300_800_000]),
}


@pytest.mark.parametrize(("payloads", "publish_times"), BAD_BATCHES.values(), ids=BAD_BATCHES.keys())
def test_a_bad_batch_of_an_attached_producer_gets_invalid_argument_and_the_producer_keeps_working(
        broker, ctx, payloads, publish_times, request):
    client = RawClient(ctx, broker.url)
    client.connect()
    topic = f"/default/raw-bad-batch-{request.node.callspec.indices['payloads']}"  # a topic per case
    producer_id = client.request(CREATE_PRODUCER, topic, "bad-batch")[2]

    request_id = client.take_id()
    client.send(SEND, request_id, producer_id, payloads, publish_times)
    assert_error(client.reply_to(request_id), INVALID_ARGUMENT, request_id=request_id)

    receipt = client.request(SEND, producer_id, [b"good"], [1_700_000_000_000])
    assert receipt[0] == SEND_RECEIPT and receipt[2:] == [producer_id, [0]], receipt


def test_requests_in_one_message_are_each_handled_and_answered(broker, ctx):
    """A ZeroMQ message of several parts is several requests (docs/protocol.md section
    1): pings and the batches of two producers on two topics, in one message, are each
    answered with their own request id, and each producer's batches keep their order."""
    client = RawClient(ctx, broker.url)
    client.connect()
    first = client.request(CREATE_PRODUCER, "/default/raw-multi-a", "multi-a")[2]
    second = client.request(CREATE_PRODUCER, "/default/raw-multi-b", "multi-b")[2]
    requests = [(PING,), (SEND, first, [b"a0"], [1]), (SEND, second, [b"b0", b"b1"], [1, 1]),
                (SEND, first, [b"a1"], [1]), (PING,), (SEND, first, [b"a2", b"a3"], [1, 1])]
    ids = [client.take_id() for _ in requests]
    client.sock.send_multipart([pack(tag, request_id, *fields) for request_id, (tag, *fields) in
                                zip(ids, requests, strict=True)])
    answers = client.replies_to(ids)
    assert answers[ids[0]] == [PONG, ids[0]] and answers[ids[4]] == [PONG, ids[4]]
    assert answers[ids[1]] == [SEND_RECEIPT, ids[1], first, [0]]
    assert answers[ids[2]] == [SEND_RECEIPT, ids[2], second, [0, 1]]
    assert answers[ids[3]] == [SEND_RECEIPT, ids[3], first, [1]]
    assert answers[ids[5]] == [SEND_RECEIPT, ids[5], first, [2, 3]]


def test_a_bad_request_inside_a_message_answers_only_its_own_request(broker, ctx):
    """One message holding good batches of two producers on one topic, a bad batch of
    the second and an undecodable part: the bad batch gets INVALID_ARGUMENT with its id,
    the garbage part an INVALID_ARGUMENT with id 0, and every other request its receipt."""
    topic = "/default/raw-multi-bad"
    client = RawClient(ctx, broker.url)
    client.connect()
    good = client.request(CREATE_PRODUCER, topic, "multi-good")[2]
    bad = client.request(CREATE_PRODUCER, topic, "multi-bad")[2]
    ids = [client.take_id() for _ in range(4)]
    client.sock.send_multipart([
        pack(SEND, ids[0], good, [b"g0"], [1]),
        pack(SEND, ids[1], bad, ["not bin"], [1]),
        b"\xc1 not msgpack",
        pack(SEND, ids[2], bad, [b"b0"], [1]),
        pack(SEND, ids[3], good, [b"g1"], [1]),
    ])
    answers = client.replies_to([0, *ids])
    assert_error(answers[0], INVALID_ARGUMENT, request_id=0)
    assert answers[ids[0]] == [SEND_RECEIPT, ids[0], good, [0]]
    assert_error(answers[ids[1]], INVALID_ARGUMENT, request_id=ids[1])
    assert answers[ids[2]] == [SEND_RECEIPT, ids[2], bad, [1]]
    assert answers[ids[3]] == [SEND_RECEIPT, ids[3], good, [2]]
    assert client.ping_pongs()


def test_a_message_of_more_requests_than_the_broker_takes_is_refused_whole(broker, ctx):
    """A message of more parts than limits.requests_per_message_max (1,024) gets one
    INVALID_ARGUMENT naming the limit and none of its requests is handled; the
    connection keeps working."""
    client = RawClient(ctx, broker.url)
    client.connect()
    client.sock.send_multipart([pack(PING, 10_000 + i) for i in range(1025)])
    message = assert_error(client.recv(), INVALID_ARGUMENT, request_id=0)
    assert "at most 1024 requests" in message and "got 1025" in message
    assert client.request(PING) == [PONG, client.next_id - 1]


def test_a_burst_of_many_request_messages_gets_every_answer_through_a_small_outbox(broker_factory, ctx):
    """Fifty messages of 100 batches each, sent at once to a broker whose outbox lane
    holds 1,000 frames: every batch gets its receipt. The gateway takes at most 512
    requests (not messages) a round, so a round's receipts fit the lane as they did
    when every request was a message of its own (a round of 512 such messages
    overflowed it)."""
    broker = broker_factory(env={"DANUBE_LIMITS__OUTBOUND_FRAMES_MAX": "1000"})
    client = RawClient(ctx, broker.url)
    client.connect()
    producer_id = client.request(CREATE_PRODUCER, "/default/raw-burst", "burst")[2]
    ids = [client.take_id() for _ in range(5000)]
    for start in range(0, len(ids), 100):
        client.sock.send_multipart([pack(SEND, request_id, producer_id, [b"m"], [1])
                                    for request_id in ids[start:start + 100]])
    answers: dict[int, list[Any]] = {}
    try:
        while len(answers) < len(ids):
            reply = client.recv()
            answers[reply[1]] = reply
    except zmq.Again:
        raise AssertionError(f"only {len(answers)} of {len(ids)} batches were answered") from None
    assert sorted(answer[3][0] for answer in answers.values()) == list(range(5000))


def test_oversized_payload_is_rejected_and_oversized_frame_is_dropped_by_zeromq(broker_factory, ctx):
    """A payload over policies.max_message_size is INVALID_ARGUMENT; a frame over
    limits.frame_bytes_max gets no answer: ZMQ_MAXMSGSIZE resets the TCP connection,
    the DEALER reconnects with its identity and the session carries on."""
    frame_bytes_max = 2 * 1024 * 1024  # kept small so the test stays fast
    broker = broker_factory(env={
        "DANUBE_POLICIES__MAX_MESSAGE_SIZE": "1024",
        "DANUBE_LIMITS__FRAME_BYTES_MAX": str(frame_bytes_max),
        # Room for waiting on the dropped frame without losing the session.
        "DANUBE_BROKER__SESSION_TIMEOUT_MS": "20000",
    })
    client = RawClient(ctx, broker.url)
    connected = client.connect()
    assert connected[5:7] == [frame_bytes_max, 1024]
    producer_id = client.request(CREATE_PRODUCER, "/default/raw-sizes", "sizes")[2]

    request_id = client.take_id()
    client.send(SEND, request_id, producer_id, [b"x" * 1025], [0])
    message = assert_error(client.reply_to(request_id), INVALID_ARGUMENT, request_id=request_id)
    assert "max_message_size" in message

    exact = client.request(SEND, producer_id, [b"x" * 1024], [0])
    assert exact[0] == SEND_RECEIPT and exact[3] == [0], exact

    monitor = client.sock.get_monitor_socket(zmq.EVENT_DISCONNECTED | zmq.EVENT_HANDSHAKE_SUCCEEDED)
    try:
        client.send(SEND, client.take_id(), producer_id, [b"x" * (frame_bytes_max + 1)], [0])
        events: list[int] = []
        deadline = time.monotonic() + RECV_TIMEOUT_MS / 1000
        while time.monotonic() < deadline and not _reconnected(events):
            if monitor.poll(100):
                events.append(recv_monitor_message(monitor)["event"])
        # The broker reset the connection; the DEALER connected again by itself.
        assert _reconnected(events), events
    finally:
        client.sock.disable_monitor()
        monitor.close(linger=0)

    # The oversized Send is never answered: the next frame is the Pong.
    request_id = client.take_id()
    client.send(PING, request_id)
    assert client.recv() == [PONG, request_id]
    # Same identity, same session: the producer is still attached.
    after = client.request(SEND, producer_id, [b"after"], [0])
    assert after[0] == SEND_RECEIPT and after[3] == [1], after

    other = RawClient(ctx, broker.url)
    other.connect()
    assert other.ping_pongs()


def _reconnected(events: list[int]) -> bool:
    """A disconnect was seen, and a completed handshake after it."""
    if zmq.EVENT_DISCONNECTED not in events:
        return False
    return zmq.EVENT_HANDSHAKE_SUCCEEDED in events[events.index(zmq.EVENT_DISCONNECTED):]


def test_admin_connect_then_list_namespaces(broker, ctx):
    """On the admin socket, Connect answers Connected and ListNamespaces lists 'default'."""
    admin = RawClient(ctx, broker.admin_url)
    connected = admin.request(CONNECT, PROTOCOL_VERSION, "raw-admin")
    assert connected[0] == CONNECTED and connected[2] == PROTOCOL_VERSION, connected
    assert connected[4] == broker.url
    assert admin.request(ADMIN_LIST_NAMESPACES) == [ADMIN_NAMESPACE_LIST, 2, ["default"]]
    assert admin.request(PING) == [PONG, 3]

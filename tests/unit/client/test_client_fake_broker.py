"""A fake broker for the client's unit tests, and the tests of the handshake and of the
connection's liveness that need nothing more than it.

`FakeBroker` is a zmq.asyncio ROUTER on `tcp://127.0.0.1:<random port>` that speaks
`CLIENT_PROTOCOL` the way the real broker is specified to: a session per socket
identity opened by `Connect` (anything else before it is answered UNAVAILABLE "not
connected"), topics auto-created by producers, a log per partition, permits per
consumer. Tests steer it: inject errors, hold replies, go silent, restart on the
same port with no memory. It lives in a `test_client_*` module because the client's
tests may only add files of that name; the other client test modules import it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import pytest
import zmq
import zmq.asyncio

from danube_zmq.client import DanubeClient
from danube_zmq.client.errors import ConnectionLost
from danube_zmq.transport.client_protocol import (
    CLIENT_PROTOCOL,
    Ack,
    CloseConsumer,
    CloseProducer,
    ConsumerClosed,
    CreateProducer,
    Deliver,
    Flow,
    GetPartitions,
    Nack,
    Partitions,
    ProducerCreated,
    Send,
    SendReceipt,
    Subscribe,
    Subscribed,
    Unsubscribe,
)
from danube_zmq.transport.codec import Message
from danube_zmq.transport.common import PROTOCOL_VERSION, Connect, Connected, Error, Ok, Ping, Pong
from danube_zmq.transport.errors import ErrorCode, Timeout, UnsupportedVersion


@dataclass
class LogEntry:
    payload: bytes
    publish_time: int
    key: str | None
    attributes: dict[str, str] | None
    producer_id: int
    producer_name: str


@dataclass
class FakeConsumer:
    consumer_id: int
    identity: bytes
    topic: str
    subscription: str
    name: str
    sub_type: int
    key_filters: list[str] | None
    cursor: int
    permits: int = 0
    granted_total: int = 0
    delivered_total: int = 0
    max_outstanding: int = 0  # most permits ever held at once


@dataclass
class FakeProducer:
    producer_id: int
    identity: bytes
    topic: str
    name: str
    next_sequence: int | None = None  # as a reliable topic keeps it (`Send.sequence`)


@dataclass
class InjectedError:
    code: int
    message: str
    times: int
    redirect_url: str | None = None


@dataclass
class FakeBroker:
    port: int = 0
    frame_bytes_max: int = 1 << 20
    message_bytes_max: int = 1 << 19
    heartbeat_interval_ms: int = 50
    session_timeout_ms: int = 5_000  # long: a loaded machine stalls the test loop; silence tests set their own
    broker_id: int = 7
    protocol_version: int = PROTOCOL_VERSION
    connect_error: tuple[int, str] | None = None

    received: list[Message] = field(default_factory=list)
    messages: list[int] = field(default_factory=list)  # the requests each ZeroMQ message held
    sessions: set[bytes] = field(default_factory=set)
    topics: dict[str, list[str]] = field(default_factory=dict)
    logs: dict[str, list[LogEntry]] = field(default_factory=dict)
    producers: dict[int, FakeProducer] = field(default_factory=dict)
    consumers: dict[int, FakeConsumer] = field(default_factory=dict)
    acks: list[tuple[int, list[int]]] = field(default_factory=list)
    nacks: list[tuple[int, list[int], int | None]] = field(default_factory=list)
    errors: dict[type, InjectedError] = field(default_factory=dict)
    held_types: set[type] = field(default_factory=set)
    held: list[tuple[bytes, Message]] = field(default_factory=list)
    silent: bool = False
    socket_options: dict[int, int] = field(default_factory=dict)  # set on the ROUTER before it binds
    _next_id: int = 100
    _socket: zmq.asyncio.Socket | None = None
    _task: asyncio.Task[None] | None = None
    _context: zmq.asyncio.Context | None = None

    @property
    def url(self) -> str:
        return f"tcp://127.0.0.1:{self.port}"

    # ------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        self._context = zmq.asyncio.Context()
        sock = self._context.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.ROUTER_HANDOVER, 1)
        for option, value in self.socket_options.items():
            sock.setsockopt(option, value)
        if self.port:
            sock.bind(self.url)
        else:
            self.port = sock.bind_to_random_port("tcp://127.0.0.1")
        self._socket = sock
        self._task = asyncio.get_running_loop().create_task(self._serve())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._socket is not None:
            self._socket.close(linger=0)
            self._socket = None
        if self._context is not None:
            self._context.destroy(linger=0)
            self._context = None

    async def restart(self, *, down_s: float = 0.05) -> None:
        """Crash and come back on the same port with no sessions, producers or consumers;
        topics and their logs survive (as metadata and WAL would)."""
        await self.stop()
        self.sessions.clear()
        self.producers.clear()
        self.consumers.clear()
        self.held.clear()
        await asyncio.sleep(down_s)
        await self.start()

    # ------------------------------------------------------------ steering

    def fail_next(self, msg_type: type, code: ErrorCode, message: str = "injected", *, times: int = 1,
                  redirect_url: str | None = None) -> None:
        self.errors[msg_type] = InjectedError(int(code), message, times, redirect_url)

    def hold(self, msg_type: type) -> None:
        """Keep requests of this type unanswered until `release`."""
        self.held_types.add(msg_type)

    async def release(self, msg_type: type) -> None:
        self.held_types.discard(msg_type)
        held, self.held = self.held, []
        for identity, msg in held:
            if type(msg) is msg_type:
                await self._handle(identity, msg)
            else:
                self.held.append((identity, msg))

    def of(self, msg_type: type) -> list:
        return [m for m in self.received if type(m) is msg_type]

    def create_topic(self, topic: str, partitions: int = 0) -> list[str]:
        names = [topic] if partitions == 0 else [f"{topic}-part-{i}" for i in range(partitions)]
        self.topics[topic] = names
        for name in names:
            self.logs.setdefault(name, [])
        return names

    async def publish(self, topic: str, payloads: list[bytes], *, key: str | None = None,
                      attributes: dict[str, str] | None = None) -> None:
        """Append to a partition's log as some other producer would, and dispatch."""
        log = self.logs[topic]
        for payload in payloads:
            log.append(LogEntry(payload, 1_700_000_000_000, key, attributes, 9, "other-producer"))
        await self._dispatch_topic(topic)

    async def push(self, identity: bytes, msg: Message) -> None:
        assert self._socket is not None
        await self._socket.send_multipart([identity, CLIENT_PROTOCOL.encode(msg)])

    async def close_consumer(self, consumer_id: int, reason: str = "topic restarted", reattach: bool = True) -> None:
        consumer = self.consumers.pop(consumer_id)
        await self.push(consumer.identity, ConsumerClosed(consumer_id=consumer_id, reason=reason, reattach=reattach))

    # ------------------------------------------------------------ serving

    def _new_id(self) -> int:
        self._next_id += 1
        return self._next_id

    async def _serve(self) -> None:
        assert self._socket is not None
        while True:
            # A client message may hold several requests, a part each (docs/protocol.md).
            identity, *frames = await self._socket.recv_multipart()
            self.messages.append(len(frames))
            for frame in frames:
                msg = CLIENT_PROTOCOL.decode(frame)
                self.received.append(msg)
                if self.silent:
                    continue
                if type(msg) in self.held_types:
                    self.held.append((identity, msg))
                    continue
                await self._handle(identity, msg)

    async def _reply(self, identity: bytes, msg: Message) -> None:
        await self.push(identity, msg)

    async def _handle(self, identity: bytes, msg: Message) -> None:
        request_id = getattr(msg, "request_id", 0)
        if isinstance(msg, Connect):
            if self.connect_error is not None:
                code, text = self.connect_error
                await self._reply(identity, Error(request_id=request_id, code=code, message=text))
                return
            self.sessions.add(identity)
            await self._reply(identity, Connected(
                request_id=request_id, protocol_version=self.protocol_version, broker_id=self.broker_id,
                broker_url=self.url, frame_bytes_max=self.frame_bytes_max, message_bytes_max=self.message_bytes_max,
                heartbeat_interval_ms=self.heartbeat_interval_ms, session_timeout_ms=self.session_timeout_ms,
            ))
            return
        if identity not in self.sessions:
            if hasattr(msg, "request_id"):
                await self._reply(identity, Error(
                    request_id=request_id, code=ErrorCode.UNAVAILABLE,
                    message="connection not established: send Connect first",
                ))
            return
        injected = self.errors.get(type(msg))
        if injected is not None:
            injected.times -= 1
            if injected.times <= 0:
                del self.errors[type(msg)]
            if isinstance(msg, Send) and msg.sequence is not None and msg.producer_id in self.producers:
                # A refused batch: the producer's later ones are refused until it comes again.
                producer = self.producers[msg.producer_id]
                if producer.next_sequence is not None:
                    producer.next_sequence = min(producer.next_sequence, msg.sequence)
            await self._reply(identity, Error(
                request_id=request_id, code=injected.code, message=injected.message,
                redirect_url=injected.redirect_url,
            ))
            return
        handler: Callable[[bytes, Message], object] = getattr(self, f"_on_{type(msg).__name__}")
        reply = await handler(identity, msg)  # type: ignore[misc]
        if reply is not None:
            await self._reply(identity, reply)

    async def _on_Ping(self, identity: bytes, msg: Ping) -> Message:
        return Pong(request_id=msg.request_id)

    async def _on_GetPartitions(self, identity: bytes, msg: GetPartitions) -> Message:
        names = self.topics.get(msg.topic)
        if names is None:
            if not msg.create:
                return Error(request_id=msg.request_id, code=ErrorCode.NOT_FOUND,
                             message=f"topic {msg.topic} not found")
            names = self.create_topic(msg.topic, msg.partitions)
        return Partitions(request_id=msg.request_id, topic=msg.topic, partitions=names)

    async def _on_CreateProducer(self, identity: bytes, msg: CreateProducer) -> Message:
        if msg.topic not in self.logs:
            self.logs[msg.topic] = []
            self.topics.setdefault(msg.topic, [msg.topic])
        for producer in self.producers.values():
            if producer.topic == msg.topic and producer.name == msg.producer_name:
                producer.identity = identity
                producer.next_sequence = msg.next_sequence
                return ProducerCreated(request_id=msg.request_id, producer_id=producer.producer_id,
                                       producer_name=msg.producer_name, topic=msg.topic)
        producer_id = self._new_id()
        self.producers[producer_id] = FakeProducer(producer_id, identity, msg.topic, msg.producer_name,
                                                   msg.next_sequence)
        return ProducerCreated(request_id=msg.request_id, producer_id=producer_id,
                               producer_name=msg.producer_name, topic=msg.topic)

    async def _on_CloseProducer(self, identity: bytes, msg: CloseProducer) -> Message:
        self.producers.pop(msg.producer_id, None)
        return Ok(request_id=msg.request_id)

    async def _on_Send(self, identity: bytes, msg: Send) -> Message | None:
        producer = self.producers.get(msg.producer_id)
        if producer is None:
            return Error(request_id=msg.request_id, code=ErrorCode.NOT_FOUND, message="unknown producer")
        if msg.sequence is not None:
            expected = producer.next_sequence
            if expected is not None and msg.sequence > expected:
                return Error(request_id=msg.request_id, code=ErrorCode.UNAVAILABLE,
                             message=f"batch {msg.sequence} follows refused batch {expected}")
            producer.next_sequence = msg.sequence + 1 if expected is None else max(expected, msg.sequence + 1)
        log = self.logs[producer.topic]
        offsets = []
        for i, payload in enumerate(msg.payloads):
            offsets.append(len(log))
            log.append(LogEntry(
                payload, msg.publish_times[i], msg.keys[i] if msg.keys else None,
                msg.attributes[i] if msg.attributes else None, producer.producer_id, producer.name,
            ))
        await self._reply(identity, SendReceipt(request_id=msg.request_id, producer_id=msg.producer_id,
                                                offsets=offsets))
        await self._dispatch_topic(producer.topic)
        return None

    async def _on_Subscribe(self, identity: bytes, msg: Subscribe) -> Message:
        if msg.topic not in self.logs:
            return Error(request_id=msg.request_id, code=ErrorCode.NOT_FOUND, message=f"topic {msg.topic} not found")
        consumer_id = self._new_id()
        cursor = 0 if msg.initial_position == 1 else len(self.logs[msg.topic])
        self.consumers[consumer_id] = FakeConsumer(
            consumer_id, identity, msg.topic, msg.subscription, msg.consumer_name, msg.sub_type, msg.key_filters, cursor
        )
        return Subscribed(request_id=msg.request_id, consumer_id=consumer_id, consumer_name=msg.consumer_name,
                          topic=msg.topic)

    async def _on_Flow(self, identity: bytes, msg: Flow) -> None:
        consumer = self.consumers.get(msg.consumer_id)
        if consumer is None:
            return
        consumer.permits += msg.permits
        consumer.granted_total += msg.permits
        consumer.max_outstanding = max(consumer.max_outstanding, consumer.permits)
        await self._dispatch(consumer)

    async def _on_Ack(self, identity: bytes, msg: Ack) -> Message:
        self.acks.append((msg.consumer_id, list(msg.offsets)))
        return Ok(request_id=msg.request_id)

    async def _on_Nack(self, identity: bytes, msg: Nack) -> Message:
        self.nacks.append((msg.consumer_id, list(msg.offsets), msg.delay_ms))
        return Ok(request_id=msg.request_id)

    async def _on_Unsubscribe(self, identity: bytes, msg: Unsubscribe) -> Message:
        self.consumers.pop(msg.consumer_id, None)
        return Ok(request_id=msg.request_id)

    async def _on_CloseConsumer(self, identity: bytes, msg: CloseConsumer) -> Message:
        self.consumers.pop(msg.consumer_id, None)
        return Ok(request_id=msg.request_id)

    async def _dispatch_topic(self, topic: str) -> None:
        for consumer in list(self.consumers.values()):
            if consumer.topic == topic:
                await self._dispatch(consumer)

    async def _dispatch(self, consumer: FakeConsumer) -> None:
        log = self.logs[consumer.topic]
        while consumer.permits > 0 and consumer.cursor < len(log):
            count = min(consumer.permits, len(log) - consumer.cursor, 100)
            entries = log[consumer.cursor:consumer.cursor + count]
            # One Deliver per producer run, as the real broker batches per producer.
            same = 1
            while same < count and entries[same].producer_id == entries[0].producer_id:
                same += 1
            entries = entries[:same]
            await self.push(consumer.identity, Deliver(
                consumer_id=consumer.consumer_id, topic=consumer.topic, producer_id=entries[0].producer_id,
                producer_name=entries[0].producer_name, base_offset=consumer.cursor,
                payloads=[e.payload for e in entries], publish_times=[e.publish_time for e in entries],
                keys=[e.key for e in entries] if any(e.key for e in entries) else None,
                attributes=[e.attributes for e in entries] if any(e.attributes for e in entries) else None,
            ))
            consumer.cursor += len(entries)
            consumer.permits -= len(entries)
            consumer.delivered_total += len(entries)


@contextlib.asynccontextmanager
async def running_broker(**options: object) -> AsyncIterator[FakeBroker]:
    broker = FakeBroker(**options)  # type: ignore[arg-type]
    await broker.start()
    try:
        yield broker
    finally:
        await broker.stop()


async def eventually(predicate: Callable[[], object], timeout_s: float = 3.0, what: str = "condition") -> None:
    """Poll until `predicate()` is true (the fake runs in the same loop, so we yield)."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.005)


def client_for(broker: FakeBroker, **options: object) -> DanubeClient:
    options.setdefault("request_timeout_ms", 2_000)
    return DanubeClient(broker.url, **options)  # type: ignore[arg-type]


# ---------------------------------------------------------------------- tests


@pytest.mark.asyncio
async def test_handshake_sends_connect_and_learns_limits() -> None:
    """The first frame is Connect with our protocol version and client name; the
    limits in Connected are what the connection keeps to."""
    async with running_broker(frame_bytes_max=200_000, message_bytes_max=100_000) as broker:
        async with client_for(broker, client_name="tester") as client:
            connects = broker.of(Connect)
            assert len(connects) == 1
            assert broker.received[0] == connects[0]
            assert connects[0].protocol_version == PROTOCOL_VERSION
            assert connects[0].client_name == "tester"
            limits = client._connections[broker.url].limits
            assert limits.frame_bytes_max == 200_000
            assert limits.message_bytes_max == 100_000
            assert limits.session_timeout_ms == 5_000


@pytest.mark.asyncio
async def test_handshake_error_is_raised_as_its_class() -> None:
    """An Error answering Connect is raised from `start` as the matching class."""
    async with running_broker(connect_error=(ErrorCode.UNSUPPORTED_VERSION, "version 1 unknown")) as broker:
        client = client_for(broker)
        with pytest.raises(UnsupportedVersion, match="version 1 unknown") as info:
            await client.start()
        assert info.value.retriable is False
        await client.close()


@pytest.mark.asyncio
async def test_start_times_out_when_nobody_answers() -> None:
    """With no broker behind the port, `start` gives up after the request timeout."""
    async with running_broker() as broker:
        broker.silent = True
        client = client_for(broker, request_timeout_ms=200)
        started = time.monotonic()
        with pytest.raises(Timeout) as info:
            await client.start()
        assert info.value.retriable is True
        assert time.monotonic() - started < 1.5
        await client.close()


@pytest.mark.asyncio
async def test_pings_every_heartbeat_interval() -> None:
    """The client pings at the broker's heartbeat interval (50 ms here)."""
    async with running_broker() as broker:
        async with client_for(broker):
            await asyncio.sleep(0.35)
            pings = len(broker.of(Ping))
            assert 4 <= pings <= 8, pings


@pytest.mark.asyncio
async def test_silent_broker_means_reconnect_with_a_new_handshake() -> None:
    """When the broker says nothing for session_timeout_ms, the connection is lost: it
    handshakes again and re-creates its producer under the same name."""
    async with running_broker(session_timeout_ms=400) as broker:
        async with client_for(broker) as client:
            producer = await client.create_producer("/default/t", name="p1")
            connection = client._connections[broker.url]
            broker.silent = True
            await eventually(lambda: not connection.ready, what="connection lost")
            broker.silent = False
            await eventually(lambda: len(broker.of(Connect)) >= 2 and connection.ready, what="re-handshake")
            await eventually(lambda: len(broker.of(CreateProducer)) == 2, what="producer re-created")
            assert [m.producer_name for m in broker.of(CreateProducer)] == ["p1", "p1"]
            mid = await producer.send(b"after")
            assert mid.topic == "/default/t"
            assert connection.statistics().connections_lost == 1


@pytest.mark.asyncio
async def test_request_timeout_raises_timeout() -> None:
    """A request the broker never answers raises Timeout (retriable) after the request
    timeout, once the retries are spent."""
    async with running_broker() as broker:
        async with client_for(broker, request_timeout_ms=150, operation_retries_max=1) as client:
            broker.hold(GetPartitions)
            started = time.monotonic()
            with pytest.raises(Timeout, match="GetPartitions"):
                await client.subscribe("/default/t", "s")
            assert len(broker.of(GetPartitions)) == 2
            assert time.monotonic() - started < 2


@pytest.mark.asyncio
async def test_connection_lost_error_is_unavailable_and_retriable() -> None:
    """ConnectionLost is an Unavailable: retriable, code UNAVAILABLE."""
    error = ConnectionLost("gone")
    assert error.retriable is True
    assert error.code == ErrorCode.UNAVAILABLE


@pytest.mark.asyncio
async def test_a_send_at_the_high_water_mark_waits_for_room_and_keeps_order() -> None:
    """The connection sends without blocking; when the socket is full (the broker stopped
    reading) a send waits on the socket's FD instead of failing or spinning, and once
    the broker reads again every frame arrives, in order."""
    # Little room at the far end: a fixed kernel buffer instead of loopback's autotuned
    # one (up to 32 MiB here), and one message in the broker's pipe.
    async with running_broker(heartbeat_interval_ms=1_000, session_timeout_ms=10_000,
                              socket_options={zmq.RCVHWM: 1, zmq.RCVBUF: 128 * 1024}) as broker:
        async with client_for(broker, request_timeout_ms=10_000, socket_hwm_messages=2) as client:
            connection = client._connections[broker.url]
            assert broker._task is not None
            broker._task.cancel()  # the broker stops reading; its socket stays open
            with contextlib.suppress(asyncio.CancelledError):
                await broker._task
            payload = b"x" * (512 * 1024)

            async def send_all() -> None:
                for sequence in range(40):
                    frame = CLIENT_PROTOCOL.encode(Send(request_id=0, producer_id=1, payloads=[payload],
                                                        publish_times=[0], sequence=sequence))
                    await connection._send_frame(frame)

            sender = asyncio.get_running_loop().create_task(send_all())
            await asyncio.sleep(0.3)
            assert not sender.done() and connection._send_waiters  # 20 MiB do not fit: it waits for room
            broker._task = asyncio.get_running_loop().create_task(broker._serve())
            await asyncio.wait_for(sender, 10)
            await eventually(lambda: len(broker.of(Send)) == 40, what="every Send received")
            assert [m.sequence for m in broker.of(Send)] == list(range(40))


@pytest.mark.asyncio
async def test_request_nowait_calls_back_once_with_the_reply_an_error_or_the_timeout() -> None:
    """A request sent without a task: its callback runs once, from the receive path, with
    the reply, an Error reply as its exception, or Timeout; each gives its slot back."""
    async with running_broker() as broker:
        # The timeout must outlast a receipt on a loaded machine (200 ms did not, at load 8).
        async with client_for(broker, request_timeout_ms=2_000) as client:
            producer = await client.create_producer("/default/t")
            connection = client._connections[broker.url]
            producer_id = producer._partitions[0].producer_id
            answers: list[tuple[object, object]] = []

            def send(payload: bytes) -> bool:
                return connection.request_nowait(
                    lambda request_id: Send(request_id=request_id, producer_id=producer_id, payloads=[payload],
                                            publish_times=[0]),
                    lambda reply, error: answers.append((reply, error)))

            assert send(b"one")
            await eventually(lambda: len(answers) == 1, what="the receipt")
            assert type(answers[0][0]).__name__ == "SendReceipt" and answers[0][1] is None

            broker.fail_next(Send, ErrorCode.INVALID_ARGUMENT, "bad batch")
            assert send(b"two")
            await eventually(lambda: len(answers) == 2, what="the error")
            assert answers[1][0] is None and "bad batch" in str(answers[1][1])

            broker.hold(Send)
            assert send(b"three")
            await eventually(lambda: len(answers) == 3, what="the timeout")
            assert answers[2][0] is None and isinstance(answers[2][1], Timeout)
            await asyncio.sleep(0.5)
            assert len(answers) == 3  # once each
            stats = connection.statistics()
            assert stats.requests_pending == 0 and stats.requests_timed_out == 1
            assert connection._slots.used == 0


@pytest.mark.asyncio
async def test_request_nowait_sends_nothing_without_a_session_and_fails_on_loss() -> None:
    async with running_broker(heartbeat_interval_ms=100, session_timeout_ms=300) as broker:
        async with client_for(broker, request_timeout_ms=5_000) as client:
            producer = await client.create_producer("/default/t")
            connection = client._connections[broker.url]
            producer_id = producer._partitions[0].producer_id
            answers: list[tuple[object, object, bool]] = []

            def on_reply(reply: object, error: object) -> None:
                # Told from inside the loss: no session now, so nothing may be sent.
                again = connection.request_nowait(lambda request_id: Ping(request_id=request_id),
                                                  lambda *_: None)
                answers.append((reply, error, again))

            broker.hold(Send)
            assert connection.request_nowait(
                lambda request_id: Send(request_id=request_id, producer_id=producer_id, payloads=[b"x"],
                                        publish_times=[0]),
                on_reply)
            await broker.restart(down_s=1.0)  # silent past the session timeout: the session is lost
            await eventually(lambda: len(answers) == 1, what="the loss")
            assert answers[0][0] is None and isinstance(answers[0][1], ConnectionLost)
            assert answers[0][2] is False
            assert connection._slots.used == 0


@pytest.mark.asyncio
async def test_every_frame_of_a_several_part_message_from_the_broker_is_handled() -> None:
    """The broker may put what it has for one connection in one ZeroMQ message, a
    protocol frame per part (docs/protocol.md): the client handles each part as a
    frame of its own, none dropped. Two ConsumerClosed for consumers it does not know
    are counted as two unroutable pushes, not one dropped message."""
    async with running_broker() as broker:
        async with client_for(broker) as client:
            connection = client._connections[broker.url]
            identity = next(iter(broker.sessions))
            assert broker._socket is not None
            await broker._socket.send_multipart([identity] + [
                CLIENT_PROTOCOL.encode(ConsumerClosed(consumer_id=900 + i, reason="gone", reattach=False))
                for i in range(2)])
            await eventually(lambda: connection.statistics().pushes_unroutable == 2, what="both parts handled")
            assert connection.statistics().frames_dropped == 0


@pytest.mark.asyncio
async def test_requests_written_in_one_turn_leave_as_one_message() -> None:
    """Five requests written in one turn of the event loop reach the broker as one
    ZeroMQ message of five parts (one send, one broker wake-up), each answered, in order."""
    async with running_broker() as broker:
        async with client_for(broker) as client:
            connection = client._connections[broker.url]
            answers: list[object] = []
            messages_before = len(broker.messages)
            for i in range(5):
                assert connection.request_nowait(
                    lambda request_id, i=i: GetPartitions(request_id=request_id, topic=f"/default/t{i}", create=True),
                    lambda reply, error: answers.append(reply or error))
            await eventually(lambda: len(answers) == 5, what="five answers")
            assert [answer.topic for answer in answers] == [f"/default/t{i}" for i in range(5)]
            assert broker.messages[messages_before:] == [5]


@pytest.mark.asyncio
async def test_a_request_lingers_only_while_an_earlier_one_awaits_its_reply() -> None:
    """With a linger far longer than the test: a lone request leaves at once; requests
    written while it awaits its reply wait (in later turns, still one round), and leave
    together as one message as soon as its reply comes, not after the linger."""
    async with running_broker(heartbeat_interval_ms=1_000, session_timeout_ms=60_000) as broker:
        async with client_for(broker, request_timeout_ms=60_000, write_linger_us=1_000_000) as client:
            producer = await client.create_producer("/default/linger")
            connection = client._connections[broker.url]
            producer_id = producer._partitions[0].producer_id
            receipts: list[object] = []

            def send(payload: bytes) -> None:
                assert connection.request_nowait(
                    lambda request_id: Send(request_id=request_id, producer_id=producer_id, payloads=[payload],
                                            publish_times=[0]),
                    lambda reply, error: receipts.append(reply or error))

            broker.hold(Send)
            messages_before = len(broker.messages)
            send(b"first")
            await eventually(lambda: len(broker.of(Send)) == 1, what="the lone request, sent at once")
            send(b"second")
            await asyncio.sleep(0.05)
            send(b"third")
            await asyncio.sleep(0.05)
            assert len(broker.of(Send)) == 1  # both wait behind the first one's reply
            await broker.release(Send)
            await eventually(lambda: len(broker.of(Send)) == 3, timeout_s=0.9, what="the round, on the reply")
            assert broker.messages[messages_before:] == [1, 2]
            assert [m.payloads for m in broker.of(Send)] == [[b"first"], [b"second"], [b"third"]]
            await eventually(lambda: len(receipts) == 3, what="three receipts")


@pytest.mark.asyncio
async def test_a_batch_started_in_a_turn_is_cut_and_written_at_that_turns_end() -> None:
    """Two producers' `send_nowait` in one turn: both batches are cut and written as one
    ZeroMQ message in one end-of-turn callback, before the sender's task runs again (a
    turn to cut and another to write cost the producer a loop turn per batch)."""
    async with running_broker() as broker:
        async with client_for(broker) as client:
            first = await client.create_producer("/default/turn-a")
            second = await client.create_producer("/default/turn-b")
            connection = client._connections[broker.url]
            rounds_before, messages_before = connection.statistics().rounds_sent, len(broker.messages)
            pending = [first.send_nowait(b"a"), second.send_nowait(b"b")]
            await asyncio.sleep(0)  # one turn of the loop
            assert connection.statistics().rounds_sent == rounds_before + 1
            await asyncio.gather(*pending)
            assert broker.messages[messages_before:] == [2]

"""The gRPC door's ProducerService and ConsumerService (`doors/grpc/client_door.py`).

Write path: `CreateProducer` opens a native client and producer on the topic (created
with the asked dispatch strategy when missing and auto-create is on); each
`SendMessage` is one `producer.send` awaited for its receipt, so the reply means what a
native receipt means (on a reliable topic: fsynced). Concurrent calls share batches.

Read path: `Subscribe` opens a native client and consumer; `ReceiveMessages` streams
what it receives. Flow control is the native one end to end: the stream takes the next
message only when gRPC has sent the previous one (HTTP/2 flow control pushes back on a
slow reader), the native inbox holds at most `RECEIVER_QUEUE_SIZE`, and the broker
delivers only within the permits that inbox gives back. `Ack` and `Nack` name a message
by topic, offset and subscription (no consumer id), so each consumer remembers what it
handed out (bounded: `DELIVERED_MAX`) to find the consumer a message came from.

A consumer has one stream at a time, as on Danube's broker: a newer `ReceiveMessages`
(or `Subscribe` under the same name) ends the open one, which finishes with status OK.
A stream that ends with no successor (the client closed the consumer, or died) leaves
the consumer `STREAM_GRACE_MS` to come back; then the door closes its native consumer
(detached), so the broker hands an Exclusive or Failover place to the next consumer and
redelivers what it had not acknowledged. The Danube id stays: a later stream or
`Subscribe` attaches a native consumer again (at the end of a Failover line).

Publish times are the Danube producer's (`StreamMessage.publish_time`, ms since the
epoch), as Danube's broker keeps them; 0 means none given (the door's clock stamps it).
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

import grpc

from danube_zmq.client.consumer import Consumer
from danube_zmq.client.message import Message, MessageId
from danube_zmq.client.producer import Producer
from danube_zmq.doors.grpc.auth import Caller
from danube_zmq.doors.grpc.calls import Attachment, abort_with, caller_of
from danube_zmq.transport.client_protocol import DispatchStrategy, SubType
from danube_zmq.transport.danube_proto import DanubeApi_pb2 as pb
from danube_zmq.transport.danube_proto import DanubeApi_pb2_grpc as pb_grpc
from danube_zmq.transport.errors import DanubeError, InvalidArgument, NotFound, ResourceExhausted

if TYPE_CHECKING:
    from danube_zmq.doors.grpc.client_door import GrpcDoor

log = logging.getLogger("danube_zmq.grpc_door")

# Messages a door consumer's native inbox holds (and so permits the broker holds for it):
# Danube's broker buffers 4 per consumer; a few dozen keep a gRPC stream busy.
RECEIVER_QUEUE_SIZE = 64
# Handed-out, unacknowledged message ids remembered per consumer to route Ack/Nack; past
# it the oldest are forgotten (non-reliable subscriptions need no acks at all). Ids only,
# never payloads: a few hundred bytes each, whatever the messages' size.
DELIVERED_MAX = 10_000
# Payload bytes of `SendMessage` calls awaiting the broker's receipt, door-wide: past it a
# call is answered RESOURCE_EXHAUSTED at once (Danube's client backs off and retries)
# rather than held, so concurrent calls cannot pile up payloads without bound.
SENDING_BYTES_MAX = 64 * 1024 * 1024
# A consumer whose stream ended with no successor keeps its place this long. Danube's
# client opens a new stream at once when one breaks (no backoff), so one still running is
# back well within it; past it the door closes the native consumer, as Danube's broker
# marks a consumer without a stream inactive at once (freeing the place, not losing one
# that merely reconnects: that is what the grace buys over Danube's "at once").
STREAM_GRACE_MS = 2_000


class DoorProducer(Attachment):
    def __init__(self, client: Any, producer: Producer, now_ms: int, owner: Caller) -> None:
        super().__init__(client, now_ms, owner)
        self.producer = producer

    def __repr__(self) -> str:
        return f"<DoorProducer {self.producer.name} on {self.producer.topic}>"


class _Stream:
    """One `ReceiveMessages` call of a consumer; `ended` is done once a newer call (or a
    `Subscribe` under the consumer's name) took over."""

    __slots__ = ("ended",)

    def __init__(self) -> None:
        self.ended: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def end(self) -> None:
        if not self.ended.done():
            self.ended.set_result(None)


class DoorConsumer(Attachment):
    """A Danube consumer id: its subscription, and the native consumer standing for it
    (None while detached: its stream was lost for `STREAM_GRACE_MS`)."""

    def __init__(self, client: Any, consumer: Consumer, now_ms: int, owner: Caller,
                 options: dict[str, Any]) -> None:
        super().__init__(client, now_ms, owner)
        self.consumer: Consumer | None = consumer
        self.options = options  # `client.subscribe`'s arguments: how to attach again
        self.delivered: OrderedDict[tuple[str, int], MessageId] = OrderedDict()
        self.stream: _Stream | None = None  # the open stream: at most one
        self.stream_lost_ms: int | None = None  # when the last stream ended with no successor
        # A message taken from the native consumer for a stream that ended before sending
        # it: the next stream sends it first. At most one, since one stream runs at a time.
        self.carried: Message | None = None
        self._attaching = asyncio.Lock()  # attach and detach are awaited: one at a time

    @property
    def names(self) -> tuple[str, str, str]:
        o = self.options
        return o["topic"], o["subscription"], o["consumer_name"]

    def busy(self) -> bool:
        return self.stream is not None

    def remember(self, message: Message) -> None:
        self.delivered[(message.topic, message.offset)] = message.message_id
        if len(self.delivered) > DELIVERED_MAX:
            self.delivered.popitem(last=False)

    # ------------------------------------------------------------ streams
    def open_stream(self) -> _Stream:
        """The consumer's new stream; the one open until now ends (Danube: the newest
        stream takes over)."""
        if self.stream is not None:
            self.stream.end()
        self.stream = _Stream()
        self.stream_lost_ms = None
        return self.stream

    def end_stream(self) -> None:
        if self.stream is not None:
            self.stream.end()

    def stream_ended(self, stream: _Stream, now_ms: int) -> None:
        self.last_seen_ms = now_ms
        if self.stream is stream:  # no successor: the grace starts
            self.stream = None
            self.stream_lost_ms = now_ms

    async def next_message(self, stream: _Stream, consumer: Consumer) -> Message | None:
        """The next message for `stream`, None once another stream took over."""
        if stream.ended.done():
            return None
        carried, self.carried = self.carried, None
        if carried is not None:
            return carried
        if consumer.queued:
            return await consumer.receive()  # no wait: nothing for a takeover to interrupt
        receive = asyncio.ensure_future(consumer.receive())
        try:
            await asyncio.wait((receive, stream.ended), return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:  # the client went away
            self._carry(receive)
            raise
        if stream.ended.done():
            self._carry(receive)
            return None
        return receive.result()

    def _carry(self, receive: asyncio.Future[Message]) -> None:
        """What `receive` took goes to the next stream; a receive still waiting is
        cancelled (the native inbox gives nothing up to a cancelled wait)."""
        if not receive.done():
            receive.cancel()
        elif not receive.cancelled() and receive.exception() is None:
            assert self.carried is None, "one stream at a time carries at most one message"
            self.carried = receive.result()

    # ------------------------------------------------------------ attach, detach
    async def attached(self) -> Consumer:
        """The native consumer; subscribed again if the consumer was detached."""
        async with self._attaching:
            if self.closed:
                raise NotFound(f"consumer {self.options['consumer_name']} is closed")
            if self.consumer is None:
                self.consumer = await self.client.subscribe(**self.options)
            return self.consumer

    async def tick(self, now_ms: int) -> None:
        lost = self.stream_lost_ms
        if self.stream is None and lost is not None and now_ms - lost >= STREAM_GRACE_MS:
            await self.detach()

    async def detach(self) -> None:
        """Close the native consumer (its stream is gone): the broker gives its place to
        the next consumer and redelivers what it had not acknowledged."""
        async with self._attaching:
            consumer = self.consumer
            if self.stream is not None or consumer is None or self.closed:
                return
            self.consumer, self.carried, self.stream_lost_ms = None, None, None
            log.info("gRPC consumer %r: no stream for %d ms, detached", self, STREAM_GRACE_MS)
            try:
                await consumer.close()
            except DanubeError as exc:
                log.warning("gRPC consumer %r: closing its native consumer: %s", self, exc)

    async def close(self) -> None:
        self.end_stream()
        await super().close()

    def __repr__(self) -> str:
        topic, subscription, name = self.names
        return f"<DoorConsumer {name} of {subscription} on {topic}>"


def _check_room(door: GrpcDoor) -> None:
    if len(door.attachments) >= door.attachments_max:
        raise ResourceExhausted(f"the gRPC door holds {door.attachments_max} producers and consumers"
                                " (broker.grpc_attachments_max)")


def _schema_choice(request: Any) -> dict[str, Any]:
    """The native producer's schema arguments for a `ProducerRequest.schema_ref`: it binds
    the topic to the subject and stamps every message with the schema id and version,
    the same ones Danube's client reads from the door's SchemaRegistry."""
    if not request.HasField("schema_ref"):
        return {}
    ref = request.schema_ref
    if not ref.subject:
        raise InvalidArgument("schema_ref.subject must not be empty")
    which = ref.WhichOneof("version_ref")
    if which == "pinned_version":
        return {"schema_subject": ref.subject, "schema_version": ref.pinned_version}
    if which == "min_version":
        return {"schema_subject": ref.subject, "schema_min_version": ref.min_version}
    return {"schema_subject": ref.subject}  # use_latest, or no version named


class ProducerDoor(pb_grpc.ProducerServiceServicer):
    def __init__(self, door: GrpcDoor) -> None:
        self.door = door

    def _existing(self, topic: str, name: str, caller: Caller) -> int | None:
        # Danube: a producer created again under its name gets its id back; only by the
        # token that created it (another one's native producer meets PRODUCER_BUSY).
        for attachment_id, a in self.door.attachments.items():
            if (isinstance(a, DoorProducer) and a.owner == caller and a.producer.topic == topic
                    and a.producer.name == name):
                return attachment_id
        return None

    async def CreateProducer(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        door = self.door
        caller = await caller_of(context, self.door.security)
        existing = self._existing(request.topic_name, request.producer_name, caller)
        if existing is not None:
            door.touch(existing, caller)
            return pb.ProducerResponse(request_id=request.request_id, producer_id=existing,
                                       producer_name=request.producer_name)
        client = None
        try:
            if not request.producer_name:
                raise InvalidArgument("producer_name must not be empty")
            _check_room(door)
            client = door.native_client(f"grpc-producer-{request.producer_name}", caller)
            strategy = DispatchStrategy(int(request.dispatch_strategy))
            # Batching as for any producer: a lone SendMessage leaves on the next loop
            # turn, concurrent ones share a batch (and an fsync on a reliable topic).
            producer = await client.create_producer(request.topic_name, name=request.producer_name,
                                                    dispatch=strategy, **_schema_choice(request))
        except DanubeError as exc:
            if client is not None:
                await client.close()
            await abort_with(context, exc)
        except ValueError:
            if client is not None:
                await client.close()
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"unknown dispatch_strategy {request.dispatch_strategy}")
        producer_id = door.new_id()
        door.attachments[producer_id] = DoorProducer(client, producer, door.monotonic_ms(), caller)
        return pb.ProducerResponse(request_id=request.request_id, producer_id=producer_id,
                                   producer_name=request.producer_name)

    async def SendMessage(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        attachment = await _attachment(self.door, request.msg_id.producer_id, context)
        if not isinstance(attachment, DoorProducer):
            # Danube's client creates the producer again (lookup first) on NOT_FOUND... and on
            # UNAVAILABLE: a reaped producer or a restarted broker comes back through it.
            await abort_with(context, NotFound(f"no producer {request.msg_id.producer_id} on this gRPC door"))
        size = len(request.payload)
        if self.door.sending_bytes + size > SENDING_BYTES_MAX:
            await abort_with(context, ResourceExhausted(
                f"the gRPC door holds {self.door.sending_bytes} bytes of sends awaiting the broker"
                f" (at most {SENDING_BYTES_MAX}): retry"))
        self.door.sending_bytes += size
        try:
            # The Danube producer's publish time, as Danube's broker keeps it (0: none given).
            await attachment.producer.send(request.payload, key=request.routing_key or None,
                                           attributes=dict(request.attributes) or None,
                                           publish_time=request.publish_time or None)
        except DanubeError as exc:
            await abort_with(context, exc)
        finally:
            self.door.sending_bytes -= size
        return pb.MessageResponse(request_id=request.request_id)


class ConsumerDoor(pb_grpc.ConsumerServiceServicer):
    def __init__(self, door: GrpcDoor) -> None:
        self.door = door

    def _consumers(self, caller: Caller) -> list[tuple[int, DoorConsumer]]:
        # Only the caller's own: an Ack or a re-subscribe never reaches a consumer another
        # token created.
        return [(i, a) for i, a in self.door.attachments.items() if isinstance(a, DoorConsumer) and a.owner == caller]

    async def Subscribe(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        door = self.door
        caller = await caller_of(context, self.door.security)
        for attachment_id, a in self._consumers(caller):
            if a.names == (request.topic_name, request.subscription, request.consumer_name):
                # Danube: the same consumer name subscribing again is a reconnect; it takes
                # over (the open stream ends) and is active again at once.
                door.touch(attachment_id, caller)
                a.end_stream()
                try:
                    await a.attached()
                except DanubeError as exc:
                    await door.drop(attachment_id)
                    await abort_with(context, exc)
                return pb.ConsumerResponse(request_id=request.request_id, consumer_id=attachment_id,
                                           consumer_name=request.consumer_name)
        client = None
        try:
            if not request.consumer_name or not request.subscription:
                raise InvalidArgument("consumer_name and subscription must not be empty")
            _check_room(door)
            client = door.native_client(f"grpc-consumer-{request.consumer_name}", caller)
            options = {"topic": request.topic_name, "subscription": request.subscription,
                       "sub_type": SubType(int(request.subscription_type)), "consumer_name": request.consumer_name,
                       "key_filters": list(request.key_filters) or None, "receiver_queue_size": RECEIVER_QUEUE_SIZE}
            consumer = await client.subscribe(**options)
        except DanubeError as exc:
            if client is not None:
                await client.close()
            await abort_with(context, exc)
        except ValueError:
            if client is not None:
                await client.close()
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"unknown subscription_type {request.subscription_type}")
        consumer_id = door.new_id()
        door.attachments[consumer_id] = DoorConsumer(client, consumer, door.monotonic_ms(), caller, options)
        return pb.ConsumerResponse(request_id=request.request_id, consumer_id=consumer_id,
                                   consumer_name=request.consumer_name)

    async def ReceiveMessages(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        door = self.door
        attachment = await _attachment(door, request.consumer_id, context)
        if not isinstance(attachment, DoorConsumer):
            await abort_with(context, NotFound(f"no consumer {request.consumer_id} on this gRPC door"))
        stream = attachment.open_stream()
        try:
            try:
                consumer = await attachment.attached()
                # Danube's non-reliable messages carry topic offset 0 (nothing is stored;
                # danube-cli tells them apart by it) and need no ack to route. A topic's
                # dispatch strategy never changes: asked once a stream.
                stored = consumer.reliable is not False
                while True:
                    message = await attachment.next_message(stream, consumer)
                    if message is None:
                        return  # another stream took over: Danube ends this one with no error
                    if stored:
                        attachment.remember(message)
                    attachment.last_seen_ms = door.monotonic_ms()
                    yield _stream_message(message, consumer.subscription, door.url, stored)
            except DanubeError as exc:
                # Attaching again failed (another consumer holds the Exclusive place) or
                # the native consumer cannot go on: the door forgets the id, its health
                # check answers CLOSE, and Danube's client subscribes again, meeting the
                # error there instead of reopening this stream in a loop.
                await door.drop(request.consumer_id)
                await abort_with(context, exc)
        finally:
            attachment.stream_ended(stream, door.monotonic_ms())

    def _owner(self, msg_id: Any, subscription: str, caller: Caller) -> tuple[Consumer, MessageId] | None:
        key = (msg_id.topic_name, msg_id.topic_offset)
        fallback = None
        for _, a in self._consumers(caller):
            c = a.consumer
            # A detached consumer acks nothing: the broker redelivers what it held anyway.
            if c is None or c.subscription != subscription or msg_id.topic_name not in c.partitions:
                continue
            remembered = a.delivered.pop(key, None)
            if remembered is not None:
                return c, remembered
            fallback = fallback or c
        if fallback is None:
            return None
        return fallback, MessageId(msg_id.topic_name, msg_id.topic_offset, msg_id.producer_id)

    async def Ack(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        found = self._owner(request.msg_id, request.subscription_name, await caller_of(context, self.door.security))
        if found is None:
            await abort_with(context, NotFound(f"no consumer of subscription {request.subscription_name!r}"
                                                  f" on {request.msg_id.topic_name} on this gRPC door"))
        consumer, message = found
        try:
            await consumer.ack(message)
        except DanubeError as exc:
            await abort_with(context, exc)
        return pb.AckResponse(request_id=request.request_id)

    async def Nack(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        found = self._owner(request.msg_id, request.subscription_name, await caller_of(context, self.door.security))
        if found is None:
            await abort_with(context, NotFound(f"no consumer of subscription {request.subscription_name!r}"
                                                  f" on {request.msg_id.topic_name} on this gRPC door"))
        consumer, message = found
        delay_ms = request.delay_ms if request.HasField("delay_ms") else None
        try:
            await consumer.nack(message, delay_ms)
        except DanubeError as exc:
            await abort_with(context, exc)
        return pb.NackResponse(request_id=request.request_id)


async def _attachment(door: GrpcDoor, attachment_id: int, context: grpc.aio.ServicerContext) -> Any:
    """The attachment a call names, if the call's token created it (else the call ends
    PERMISSION_DENIED); None if the door holds none by that id."""
    caller = await caller_of(context, door.security)
    try:
        return door.touch(attachment_id, caller)
    except DanubeError as exc:
        await abort_with(context, exc)


def _stream_message(message: Message, subscription: str, broker_addr: str, stored: bool = True) -> Any:
    out = pb.StreamMessage(
        request_id=message.offset,
        msg_id=pb.MsgID(producer_id=message.producer_id, topic_name=message.topic, broker_addr=broker_addr,
                        topic_offset=message.offset if stored else 0),
        payload=message.payload, publish_time=message.publish_time, producer_name=message.producer_name,
        subscription_name=subscription, attributes=dict(message.attributes))
    if message.key is not None:
        out.routing_key = message.key
    if message.schema_id is not None:
        out.schema_id = message.schema_id
    if message.schema_version is not None:
        out.schema_version = message.schema_version
    return out

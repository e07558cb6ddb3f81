"""The gRPC door's ProducerService and ConsumerService (`actors/grpc_door.py`).

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
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from typing import Any

import grpc

from danube_zmq.actors.grpc_door import Attachment, GrpcDoor, abort_with, caller_of
from danube_zmq.actors.grpc_door_auth import Caller
from danube_zmq.client.consumer import Consumer
from danube_zmq.client.message import Message, MessageId
from danube_zmq.client.producer import Producer
from danube_zmq.transport.client_protocol import DispatchStrategy, SubType
from danube_zmq.transport.danube_proto import DanubeApi_pb2 as pb
from danube_zmq.transport.danube_proto import DanubeApi_pb2_grpc as pb_grpc
from danube_zmq.transport.errors import DanubeError, InvalidArgument, NotFound, ResourceExhausted

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


class DoorProducer(Attachment):
    def __init__(self, client: Any, producer: Producer, now_ms: int, owner: Caller) -> None:
        super().__init__(client, now_ms, owner)
        self.producer = producer

    def __repr__(self) -> str:
        return f"<DoorProducer {self.producer.name} on {self.producer.topic}>"


class DoorConsumer(Attachment):
    def __init__(self, client: Any, consumer: Consumer, now_ms: int, owner: Caller) -> None:
        super().__init__(client, now_ms, owner)
        self.consumer = consumer
        self.delivered: OrderedDict[tuple[str, int], MessageId] = OrderedDict()

    def remember(self, message: Message) -> None:
        self.delivered[(message.topic, message.offset)] = message.message_id
        if len(self.delivered) > DELIVERED_MAX:
            self.delivered.popitem(last=False)

    def __repr__(self) -> str:
        c = self.consumer
        return f"<DoorConsumer {c.consumer_name} of {c.subscription} on {c.topic}>"


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
            await attachment.producer.send(request.payload, key=request.routing_key or None,
                                           attributes=dict(request.attributes) or None)
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
            c = a.consumer
            if (c.topic, c.subscription, c.consumer_name) == (request.topic_name, request.subscription,
                                                               request.consumer_name):
                # Danube: the same consumer name subscribing again is a reconnect.
                door.touch(attachment_id, caller)
                return pb.ConsumerResponse(request_id=request.request_id, consumer_id=attachment_id,
                                           consumer_name=request.consumer_name)
        client = None
        try:
            if not request.consumer_name or not request.subscription:
                raise InvalidArgument("consumer_name and subscription must not be empty")
            _check_room(door)
            client = door.native_client(f"grpc-consumer-{request.consumer_name}", caller)
            consumer = await client.subscribe(
                request.topic_name, request.subscription, sub_type=SubType(int(request.subscription_type)),
                consumer_name=request.consumer_name, key_filters=list(request.key_filters) or None,
                receiver_queue_size=RECEIVER_QUEUE_SIZE)
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
        door.attachments[consumer_id] = DoorConsumer(client, consumer, door.monotonic_ms(), caller)
        return pb.ConsumerResponse(request_id=request.request_id, consumer_id=consumer_id,
                                   consumer_name=request.consumer_name)

    async def ReceiveMessages(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        attachment = await _attachment(self.door, request.consumer_id, context)
        if not isinstance(attachment, DoorConsumer):
            await abort_with(context, NotFound(f"no consumer {request.consumer_id} on this gRPC door"))
        attachment.streams += 1
        consumer = attachment.consumer
        try:
            while True:
                try:
                    message = await consumer.receive()
                except DanubeError as exc:
                    await abort_with(context, exc)
                attachment.remember(message)
                attachment.last_seen_ms = self.door.monotonic_ms()
                yield _stream_message(message, consumer.subscription, self.door.url)
        finally:
            attachment.streams -= 1
            attachment.last_seen_ms = self.door.monotonic_ms()

    def _owner(self, msg_id: Any, subscription: str, caller: Caller) -> tuple[DoorConsumer, MessageId] | None:
        key = (msg_id.topic_name, msg_id.topic_offset)
        fallback = None
        for _, a in self._consumers(caller):
            c = a.consumer
            if c.subscription != subscription or msg_id.topic_name not in c.partitions:
                continue
            remembered = a.delivered.pop(key, None)
            if remembered is not None:
                return a, remembered
            fallback = fallback or a
        if fallback is None:
            return None
        return fallback, MessageId(msg_id.topic_name, msg_id.topic_offset, msg_id.producer_id)

    async def Ack(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        found = self._owner(request.msg_id, request.subscription_name, await caller_of(context, self.door.security))
        if found is None:
            await abort_with(context, NotFound(f"no consumer of subscription {request.subscription_name!r}"
                                                  f" on {request.msg_id.topic_name} on this gRPC door"))
        attachment, message = found
        try:
            await attachment.consumer.ack(message)
        except DanubeError as exc:
            await abort_with(context, exc)
        return pb.AckResponse(request_id=request.request_id)

    async def Nack(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        found = self._owner(request.msg_id, request.subscription_name, await caller_of(context, self.door.security))
        if found is None:
            await abort_with(context, NotFound(f"no consumer of subscription {request.subscription_name!r}"
                                                  f" on {request.msg_id.topic_name} on this gRPC door"))
        attachment, message = found
        delay_ms = request.delay_ms if request.HasField("delay_ms") else None
        try:
            await attachment.consumer.nack(message, delay_ms)
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


def _stream_message(message: Message, subscription: str, broker_addr: str) -> Any:
    out = pb.StreamMessage(
        request_id=message.offset,
        msg_id=pb.MsgID(producer_id=message.producer_id, topic_name=message.topic, broker_addr=broker_addr,
                        topic_offset=message.offset),
        payload=message.payload, publish_time=message.publish_time, producer_name=message.producer_name,
        subscription_name=subscription, attributes=dict(message.attributes))
    if message.key is not None:
        out.routing_key = message.key
    if message.schema_id is not None:
        out.schema_id = message.schema_id
    if message.schema_version is not None:
        out.schema_version = message.schema_version
    return out

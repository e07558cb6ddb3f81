"""The subscription actor: one per subscription, the dispatcher of its type.

It holds the subscription's consumers and their permits, a bounded queue of pending
batches, and a pure dispatch rule (`actors/dispatch/`) that decides who gets which
messages of a batch. Deliveries go straight to the gateway's outbox as `Deliver`
frames, one per consumer per batch slice: payload lists are sliced, never copied
message by message, unless Key-Shared picks messages out of a batch.

1. Publish (from the topic) -> append to pending (over the bound: dropped, counted)
   -> dispatch. With no consumer attached nothing is kept (dropped, counted): delivery
   is fire-and-forget, as Danube's, so an abandoned subscription holds no memory
   however many there are; the last consumer leaving drops what was pending.
2. Flow (from a consumer) -> add permits -> dispatch.
3. Dispatch: while a batch is pending and someone has permits, `rule.assign` splits
   it; each slice becomes a `Deliver`; what nobody could take stays at the head.
4. Attach: a consumer name is held by one connection (the same connection takes it
   again; another gets CONSUMER_BUSY); Exclusive admits one consumer name, Failover
   keeps standbys in attach order, Shared and Key-Shared admit many. Before refusing
   for a holder on another connection, the gateway is asked whether that connection
   still holds it; one that is gone is detached and the attach goes on.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from danube_zmq.actors.actor import Actor
from danube_zmq.actors.config import BrokerConfig
from danube_zmq.actors.dispatch import make_rule
from danube_zmq.actors.gateway import OUTBOX, holder_lives, reply_client
from danube_zmq.actors.metrics import METRICS
from danube_zmq.transport import client_protocol as cp
from danube_zmq.transport.admin_protocol import SubscriptionInfo
from danube_zmq.transport.codec import Message
from danube_zmq.transport.common import Error, Ok
from danube_zmq.transport.errors import (
    ConsumerBusy,
    DanubeError,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
)
from danube_zmq.transport.internal_protocol import (
    INTERNAL_PROTOCOL,
    AttachConsumer,
    ClientRequest,
    ConsumerAttached,
    ConsumerCount,
    ConsumerDetached,
    ConsumerPaused,
    DeliveryRefused,
    DescribeSubscription,
    DetachConsumer,
    Publish,
    SubscriptionEnded,
    SubscriptionStats,
)

log = logging.getLogger("danube_zmq.subscription")

_PERMITS_MAX = 1 << 30
_KEY_FILTERS_MAX = 64


@dataclass(slots=True)
class _Consumer:
    consumer_id: int
    name: str
    identity: bytes
    permits: int = 0
    paused: bool = False  # its connection is over its outbound byte budget (actors/outbound.py)


@dataclass(slots=True)
class _Pending:
    """A batch, or what is left of it: `indices` into `publish` (None: all of it)."""

    publish: Publish
    indices: Sequence[int] | None
    count: int
    size: int


class SubscriptionActor(Actor):
    def __init__(self, *, topic: str, name: str, sub_type: int, config: BrokerConfig, topic_endpoint: str) -> None:
        self.topic = topic
        self.subscription = name
        self.sub_type = sub_type
        self.config = config
        self.topic_endpoint = topic_endpoint
        self.rule = make_rule(cp.SubType(sub_type))
        self.consumers: dict[int, _Consumer] = {}
        self.pending: deque[_Pending] = deque()
        self.pending_messages = 0
        self.pending_bytes = 0
        self.delivered_messages = 0
        self.dropped_messages = 0
        self._out_metric = METRICS.messages_out.labels(topic=topic, subscription=name)
        self._dropped_metric = METRICS.messages_dropped.labels(topic=topic, subscription=name)
        self._routes = {
            cp.Flow: self._flow,
            cp.Ack: self._ack,
            cp.Nack: self._ack,
            cp.Unsubscribe: self._unsubscribe,
            cp.CloseConsumer: self._close_consumer,
            cp.Seek: self._seek,
        }

    async def on_stop(self) -> None:
        # A subscription stopped with its parent topic's restart comes back too.
        restarting = self.restarting or self.moving or self._topic_restarting()
        state = "moved" if self.moving else "restarted" if restarting else "closed"
        for consumer in self.consumers.values():
            self.system.tell(self.system.gateway_endpoint, ConsumerDetached(
                identity=consumer.identity, consumer_id=consumer.consumer_id,
                reason=f"subscription '{self.subscription}' on {self.topic} {state}", reattach=restarting))

    def _topic_restarting(self) -> bool:
        return self.system.is_alive(self.topic_endpoint) and self.system.actor(self.topic_endpoint).restarting

    # ------------------------------------------------------------- consumers
    async def handle_AttachConsumer(self, msg: AttachConsumer) -> None:
        request = cp.CLIENT_PROTOCOL.decode(msg.frame)
        assert isinstance(request, cp.Subscribe)
        try:
            await self._release_if_gone(msg, request)
            self._attach(msg, request)
        except DanubeError as exc:
            reply_client(self.system, msg.identity,
                         Error(request_id=request.request_id, code=exc.code, message=exc.message))
            return
        for frame in msg.replay:
            publish = INTERNAL_PROTOCOL.decode(frame)
            assert isinstance(publish, Publish)
            self._enqueue(publish)
        self._dispatch()

    async def _release_if_gone(self, msg: AttachConsumer, request: cp.Subscribe) -> None:
        """Detach the consumer that would make `_attach` refuse the request (the holder of
        its name on another connection, or an Exclusive subscription's consumer) when the
        gateway says that consumer's connection is gone: the gateway's own notice of its
        departure is told, and may have been lost to a full mailbox."""
        blocker = next((c for c in self.consumers.values() if c.name == request.consumer_name), None)
        if blocker is None and self.sub_type == cp.SubType.EXCLUSIVE and self.consumers:
            blocker = next(iter(self.consumers.values()))
        if blocker is None or blocker.identity == msg.identity:
            return
        if await holder_lives(self.system, blocker.identity, cp.ClientKind.CONSUMER, blocker.consumer_id,
                              self.endpoint):
            return
        log.info("%s: consumer '%s' of '%s' was held by a connection that is gone; released", self.topic,
                 blocker.name, self.subscription)
        self._detach(blocker.consumer_id)

    def _attach(self, msg: AttachConsumer, request: cp.Subscribe) -> None:
        filters = request.key_filters or []
        if len(filters) > _KEY_FILTERS_MAX:
            raise InvalidArgument(f"at most {_KEY_FILTERS_MAX} key filters per consumer, got {len(filters)}")
        if filters and self.sub_type != cp.SubType.KEY_SHARED:
            raise InvalidArgument("key filters apply only to key_shared subscriptions")
        same_name = next((c for c in self.consumers.values() if c.name == request.consumer_name), None)
        if same_name is not None:
            # Only the connection holding the name takes it again (a client reconnecting on
            # its socket's fixed identity); another is refused while the holder lives (the
            # name frees when it closes or its session ends), as Pulsar's ConsumerBusy.
            if same_name.identity != msg.identity:
                raise ConsumerBusy(f"consumer name '{same_name.name}' is held by another connection on subscription"
                                   f" '{self.subscription}' of {self.topic}; it is free once that consumer closes"
                                   " or its session times out")
            self._detach(same_name.consumer_id, reason=f"consumer '{same_name.name}' was re-attached by its connection")
        elif self.sub_type == cp.SubType.EXCLUSIVE and self.consumers:
            holder = next(iter(self.consumers.values()))
            raise PermissionDenied(
                f"subscription '{self.subscription}' on {self.topic} is exclusive and consumer '{holder.name}'"
                f" holds it; a consumer named '{request.consumer_name}' cannot attach")
        limit = self.config.policies.max_consumers_per_subscription
        if limit and len(self.consumers) >= limit:
            raise ResourceExhausted(f"subscription '{self.subscription}' already has {limit} consumers"
                                    " (max_consumers_per_subscription)")
        consumer = _Consumer(msg.consumer_id, request.consumer_name, msg.identity)
        self.consumers[consumer.consumer_id] = consumer
        self.rule.add_consumer(consumer.consumer_id, consumer.name, filters)
        subscribed = cp.Subscribed(request_id=request.request_id, consumer_id=consumer.consumer_id,
                                   consumer_name=consumer.name, topic=self.topic)
        self.system.tell(self.system.gateway_endpoint, ConsumerAttached(
            identity=msg.identity, consumer_id=consumer.consumer_id, endpoint=self.endpoint,
            reply=cp.CLIENT_PROTOCOL.encode(subscribed)))
        self._report_count()

    def _detach(self, consumer_id: int, *, reason: str | None = None, reply: bytes | None = None) -> None:
        consumer = self.consumers.pop(consumer_id, None)
        if consumer is None:
            return
        self.rule.remove_consumer(consumer_id)
        if not self.consumers:
            self._drop_pending()
        if reason is not None or reply is not None:
            self.system.tell(self.system.gateway_endpoint, ConsumerDetached(
                identity=consumer.identity, consumer_id=consumer_id, reason=reason, reply=reply))
        self._report_count()

    def _report_count(self) -> None:
        self.system.tell(self.topic_endpoint, ConsumerCount(subscription=self.subscription,
                                                            consumers=len(self.consumers)))

    def handle_DetachConsumer(self, msg: DetachConsumer) -> None:
        consumer = self.consumers.get(msg.consumer_id)
        if consumer is None or consumer.identity != msg.identity:
            return
        self._detach(msg.consumer_id)
        self._dispatch()  # Failover may have promoted a standby with permits

    def handle_ConsumerPaused(self, msg: ConsumerPaused) -> None:
        consumer = self.consumers.get(msg.consumer_id)
        if consumer is None or consumer.identity != msg.identity:
            return
        consumer.paused = msg.paused
        if not msg.paused:
            self._dispatch()

    def handle_DeliveryRefused(self, msg: DeliveryRefused) -> None:
        """Lost for this subscription (not reliable): counted as dropped; the permits they
        took are the consumer's again (the client never saw the messages)."""
        consumer = self.consumers.get(msg.consumer_id)
        if consumer is not None and consumer.identity == msg.identity:
            self.dropped_messages += len(msg.offsets)
            self.delivered_messages -= len(msg.offsets)
            consumer.permits += len(msg.offsets)

    # ------------------------------------------------------------- client requests
    def handle_ClientRequest(self, req: ClientRequest) -> None:
        msg = cp.CLIENT_PROTOCOL.decode(req.frame)
        consumer = self.consumers.get(msg.consumer_id)
        try:
            if consumer is None or consumer.identity != req.identity:
                raise NotFound(f"consumer {msg.consumer_id} is not attached to '{self.subscription}'")
            answer = self._routes[type(msg)](consumer, msg)
        except DanubeError as exc:
            answer = Error(request_id=getattr(msg, "request_id", 0), code=exc.code, message=exc.message)
            if type(msg) is cp.Flow:
                return
        if answer is not None:
            reply_client(self.system, req.identity, answer)

    def _flow(self, consumer: _Consumer, msg: cp.Flow) -> Message | None:
        if msg.permits <= 0:
            return None
        consumer.permits = min(consumer.permits + msg.permits, _PERMITS_MAX)
        self._dispatch()
        return None

    def _ack(self, consumer: _Consumer, msg: cp.Ack | cp.Nack) -> Message:
        # Non-reliable subscriptions keep nothing to acknowledge or redeliver
        # (Danube's behaviour); the request is answered so clients need no special case.
        return Ok(request_id=msg.request_id)

    def _unsubscribe(self, consumer: _Consumer, msg: cp.Unsubscribe) -> Message | None:
        others = len(self.consumers) - 1
        if others:
            raise FailedPrecondition(f"subscription '{self.subscription}' has {others} other consumers;"
                                     " close them first or unsubscribe with `danube admin topics unsubscribe`")
        self._detach(consumer.consumer_id, reply=cp.CLIENT_PROTOCOL.encode(Ok(request_id=msg.request_id)))
        self.system.tell(self.topic_endpoint, SubscriptionEnded(subscription=self.subscription))
        return None

    def _seek(self, consumer: _Consumer, msg: cp.Seek) -> Message | None:
        # Nothing is stored to go back to (reliable subscriptions override this).
        raise FailedPrecondition(f"topic {self.topic} is not reliable: seek applies to reliable topics only")

    def _close_consumer(self, consumer: _Consumer, msg: cp.CloseConsumer) -> Message | None:
        self._detach(consumer.consumer_id, reply=cp.CLIENT_PROTOCOL.encode(Ok(request_id=msg.request_id)))
        self._dispatch()
        return None

    # ------------------------------------------------------------- dispatch
    def handle_Publish(self, msg: Publish) -> None:
        self._enqueue(msg)
        self._dispatch()

    def _drop_pending(self) -> None:
        """Nobody can receive what is pending (non-reliable: nothing is owed to a
        subscription without consumers); a reliable subscription keeps none here."""
        if self.pending_messages:
            self.dropped_messages += self.pending_messages
            self._dropped_metric.inc(self.pending_messages)
        self.pending.clear()
        self.pending_messages = self.pending_bytes = 0

    def _enqueue(self, publish: Publish) -> None:
        count = len(publish.payloads)
        if not self.consumers:
            self.dropped_messages += count
            self._dropped_metric.inc(count)
            return
        size = sum(map(len, publish.payloads))
        dispatch = self.config.dispatch
        # One batch is always taken when nothing is pending (it is bounded by the frame
        # size); beyond that the bounds hold what waits for consumers' permits.
        if self.pending and (self.pending_messages + count > dispatch.pending_messages_max
                             or self.pending_bytes + size > dispatch.pending_bytes_max):
            self.dropped_messages += count
            self._dropped_metric.inc(count)
            return
        self.pending.append(_Pending(publish, None, count, size))
        self.pending_messages += count
        self.pending_bytes += size

    def _dispatch(self) -> None:
        while self.pending:
            permits = {cid: c.permits for cid, c in self.consumers.items() if c.permits > 0 and not c.paused}
            if not permits:
                return
            head = self.pending[0]
            publish = head.publish
            keys = publish.keys
            if keys is not None and head.indices is not None:
                keys = [keys[i] for i in head.indices]
            assignment = self.rule.assign(head.count, keys, publish.producer_name, permits)
            for part in assignment.slices:
                indices = _compose(head.indices, part.indices)
                self._deliver(self.consumers[part.consumer_id], publish, indices)
            if assignment.skipped:
                self.dropped_messages += len(assignment.skipped)
            self.pending.popleft()
            self.pending_messages -= head.count
            self.pending_bytes -= head.size
            if assignment.leftover:
                rest = _compose(head.indices, assignment.leftover)
                size = sum(len(publish.payloads[i]) for i in rest)
                self.pending.appendleft(_Pending(publish, rest, len(rest), size))
                self.pending_messages += len(rest)
                self.pending_bytes += size
                if not assignment.slices:
                    return  # nobody can take the head now; wait for permits or consumers

    def _deliver(self, consumer: _Consumer, publish: Publish, indices: Sequence[int]) -> None:
        count = len(indices)
        consumer.permits -= count
        if isinstance(indices, range) and indices.step == 1:
            start, stop = indices.start, indices.stop
            deliver = cp.Deliver(
                consumer_id=consumer.consumer_id, topic=publish.topic, producer_id=publish.producer_id,
                producer_name=publish.producer_name, base_offset=publish.base_offset + start,
                payloads=publish.payloads[start:stop], publish_times=publish.publish_times[start:stop],
                keys=None if publish.keys is None else publish.keys[start:stop],
                attributes=None if publish.attributes is None else publish.attributes[start:stop],
                schema_id=publish.schema_id, schema_version=publish.schema_version)
        else:
            deliver = cp.Deliver(
                consumer_id=consumer.consumer_id, topic=publish.topic, producer_id=publish.producer_id,
                producer_name=publish.producer_name, base_offset=publish.base_offset + indices[0],
                payloads=[publish.payloads[i] for i in indices],
                publish_times=[publish.publish_times[i] for i in indices],
                keys=None if publish.keys is None else [publish.keys[i] for i in indices],
                attributes=None if publish.attributes is None else [publish.attributes[i] for i in indices],
                offsets=[publish.base_offset + i for i in indices],
                schema_id=publish.schema_id, schema_version=publish.schema_version)
        if self.system.push_frames(OUTBOX, [consumer.identity, cp.CLIENT_PROTOCOL.encode(deliver)]):
            self.delivered_messages += count
            self._out_metric.inc(count)
        else:
            self.dropped_messages += count
            self._dropped_metric.inc(count)

    # ------------------------------------------------------------- admin
    def handle_DescribeSubscription(self, msg: DescribeSubscription) -> Message:
        active = self.rule.active_consumer_id()
        info = SubscriptionInfo(
            name=self.subscription, topic=self.topic, sub_type=self.sub_type,
            consumers=[c.name for c in self.consumers.values()],
            active_consumer=self.consumers[active].name if active is not None else None,
            pending_messages=self.pending_messages, delivered_messages=self.delivered_messages,
            dropped_messages=self.dropped_messages)
        return SubscriptionStats(info=info)


def _compose(outer: Sequence[int] | None, inner: Sequence[int]) -> Sequence[int]:
    """Indices `inner` of a pending batch, as indices into the original publish."""
    if outer is None:
        return inner
    if isinstance(outer, range) and isinstance(inner, range):
        return outer[inner.start:inner.stop]
    return [outer[i] for i in inner]


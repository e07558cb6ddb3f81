"""The subscription actor: one per subscription, reliable or not. Holds the consumers
(attach, detach, permits, pauses) and handles every request; how messages reach them
is its delivery side, chosen by its topic's storage at spawn:

- `RuleDelivery` (`rule_delivery.py`, non-reliable): the pure dispatch rule
  (`actors/dispatch/`) over a bounded queue of pending batches, fire-and-forget.
- `TrackedDelivery` (`tracked_delivery.py`, reliable): the rule with the delivery
  tracker (`dispatch/tracker.py`): a read-ahead from the log, acks, redelivery, the
  poison policy, cursors, seek, admin-set failure policy and dispatch window.

1. Publish (from the topic) -> `delivery.publish`.
2. Flow (from a consumer) -> add permits -> `delivery.dispatch`.
3. Ack / Nack -> `delivery.ack` (non-reliable: answered, nothing kept).
4. Attach: a consumer name is held by one connection (the same connection takes it
   again; another gets CONSUMER_BUSY); Exclusive admits one consumer name, Failover
   keeps standbys in attach order, Shared and Key-Shared admit many. Before refusing
   for a holder on another connection, the gateway is asked whether that connection
   still holds it; one that is gone is detached and the attach goes on.
5. Messages only a tracked delivery has (`ReadResult`, `SeekTo`, policies, ...) go to
   it; with a rule alone they are refused (asks) or counted as unrecognized (tells).

Client requests reach `handle_<Type>(msg, origin)` through the runtime; each takes its
consumer with `_consumer`, which refuses a consumer not attached on that connection (a
refused `Flow` has no request id: nobody is answered).
"""

from __future__ import annotations

import logging

from danube_zmq.actors.metrics import METRICS, TOPIC_SERIES
from danube_zmq.actors.rate_limit import TokenBucket
from danube_zmq.actors.sockets.gateway import holder_lives, reply_client
from danube_zmq.actors.subscription.delivery import Consumer, Delivery
from danube_zmq.actors.subscription.tracked_delivery import TrackedDelivery
from danube_zmq.config.broker_config import TOPIC_POLICY_NAMES, BrokerConfig, topic_policy_default
from danube_zmq.runtime.actor import Actor, Origin
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
    ResourceExhausted,
)
from danube_zmq.transport.internal_protocol import (
    ApplyTopicPolicies,
    AttachConsumer,
    ConsumerAttached,
    ConsumerCount,
    ConsumerDetached,
    ConsumerPaused,
    DelayedDue,
    DeliveryRefused,
    DescribeSubscription,
    DescribeSubscriptionCut,
    DetachConsumer,
    DispatchTokensDue,
    ExpireBelow,
    GetSubscriptionDispatchConfig,
    GetSubscriptionPolicy,
    Publish,
    ReadResult,
    SeekTo,
    SetSubscriptionDispatchConfig,
    SetSubscriptionPolicy,
    SubscriptionEnded,
    SubscriptionStats,
    Tick,
)

log = logging.getLogger("danube_zmq.subscription")

_PERMITS_MAX = 1 << 30
_KEY_FILTERS_MAX = 64


class SubscriptionActor(Actor):
    def __init__(self, *, topic: str, name: str, sub_type: int, config: BrokerConfig, topic_endpoint: str,
                 broker_endpoint: str, delivery: Delivery, cursor_endpoint: str | None = None,
                 policies: ApplyTopicPolicies | None = None) -> None:
        self.topic = topic
        # Its topic's policies in force (the topic tells changes); the broker's by default.
        self.policies = policies or ApplyTopicPolicies(
            **{name: topic_policy_default(config, name) for name in TOPIC_POLICY_NAMES})
        self.subscription = name
        self.sub_type = sub_type
        self.config = config
        self.topic_endpoint = topic_endpoint
        self.broker_endpoint = broker_endpoint
        self.cursor_endpoint = cursor_endpoint or broker_endpoint  # the broker's cursor flusher
        self.delivery = delivery
        self.rule = delivery.rule
        self.consumers: dict[int, Consumer] = {}
        self.delivered_messages = 0
        self.dropped_messages = 0
        # max_dispatch_rate: the bucket (None: unlimited; made at start, on the system's
        # clock) and whether its timer is armed.
        self._dispatch_bucket: TokenBucket | None = None
        self._dispatch_timer = False
        delivery.bind(self)

    async def on_start(self) -> None:
        TOPIC_SERIES.acquire(self.topic, (id(self.system), self.subscription), admit=False)
        self.out_metric = METRICS.messages_out.labels(topic=self.topic, subscription=self.subscription)
        self.dropped_metric = METRICS.messages_dropped.labels(topic=self.topic, subscription=self.subscription)
        self.e2e_metric = METRICS.end_to_end_latency.labels(topic=self.topic, subscription=self.subscription)
        self._set_dispatch_rate(self.policies.max_dispatch_rate)
        self.delivery.start()

    async def on_stop(self) -> None:
        self.delivery.stop()
        # The runtime marks a subscription stopped with its topic's restart as restarting:
        # it comes back with the topic.
        state, reattach = self.stop_state()
        for consumer in self.consumers.values():
            self.system.tell(self.system.gateway_endpoint, ConsumerDetached(
                identity=consumer.identity, consumer_id=consumer.consumer_id,
                reason=f"subscription '{self.subscription}' on {self.topic} {state}", reattach=reattach))
        if not self.restarting:  # deleted, or its topic stopped here for good: its series go
            TOPIC_SERIES.release(self.topic, (id(self.system), self.subscription))

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
        self.delivery.set_read_compacted(request.read_compacted)
        self.delivery.attached(msg.replay)

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
            # Pulsar's ConsumerBusy ("Exclusive consumer is already connected"): not a
            # security refusal. The gRPC door still answers Danube's PERMISSION_DENIED.
            raise ConsumerBusy(
                f"subscription '{self.subscription}' on {self.topic} is exclusive and consumer '{holder.name}'"
                f" holds it; a consumer named '{request.consumer_name}' cannot attach")
        limit = self.policies.max_consumers_per_subscription
        if limit and len(self.consumers) >= limit:
            raise ResourceExhausted(f"subscription '{self.subscription}' already has {limit} consumers"
                                    " (max_consumers_per_subscription)")
        consumer = Consumer(msg.consumer_id, request.consumer_name, msg.identity)
        self.consumers[consumer.consumer_id] = consumer
        self.rule.add_consumer(consumer.consumer_id, consumer.name, filters)
        subscribed = cp.Subscribed(request_id=request.request_id, consumer_id=consumer.consumer_id,
                                   consumer_name=consumer.name, topic=self.topic,
                                   reliable=isinstance(self.delivery, TrackedDelivery))
        self.system.tell(self.system.gateway_endpoint, ConsumerAttached(
            identity=msg.identity, consumer_id=consumer.consumer_id, endpoint=self.endpoint,
            reply=cp.CLIENT_PROTOCOL.encode(subscribed), topic=self.topic))
        self._report_count()

    def detach(self, consumer_id: int, *, reason: str) -> None:
        """Detach a consumer for good, telling its client `reason`."""
        self._detach(consumer_id, reason=reason)

    def _detach(self, consumer_id: int, *, reason: str | None = None, reply: bytes | None = None) -> None:
        consumer = self.consumers.pop(consumer_id, None)
        if consumer is None:
            return
        self.rule.remove_consumer(consumer_id)
        self.delivery.consumer_left(consumer_id)
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
        self.delivery.dispatch()  # Failover may have promoted a standby with permits

    def handle_ConsumerPaused(self, msg: ConsumerPaused) -> None:
        consumer = self.consumers.get(msg.consumer_id)
        if consumer is None or consumer.identity != msg.identity:
            return
        consumer.paused = msg.paused
        if not msg.paused:
            self.delivery.dispatch()

    def handle_DeliveryRefused(self, msg: DeliveryRefused) -> None:
        """The gateway could not take these deliveries; the permits they took are the
        consumer's again (the client never saw the messages)."""
        consumer = self.consumers.get(msg.consumer_id)
        if consumer is not None and consumer.identity == msg.identity:
            self.delivery.refused(consumer, msg.offsets)

    # ------------------------------------------------------------- client requests
    def _consumer(self, consumer_id: int, origin: Origin) -> Consumer:
        """The consumer a request names, when the request's connection holds it."""
        consumer = self.consumers.get(consumer_id)
        if consumer is None or consumer.identity != origin.identity:
            raise NotFound(f"consumer {consumer_id} is not attached to '{self.subscription}'")
        return consumer

    def handle_Flow(self, msg: cp.Flow, origin: Origin) -> Message | None:
        consumer = self._consumer(msg.consumer_id, origin)
        if msg.permits <= 0:
            return None
        consumer.permits = min(consumer.permits + msg.permits, _PERMITS_MAX)
        self.delivery.dispatch()
        return None

    def handle_Ack(self, msg: cp.Ack, origin: Origin) -> Message:
        return self.delivery.ack(self._consumer(msg.consumer_id, origin), msg)

    def handle_Nack(self, msg: cp.Nack, origin: Origin) -> Message:
        return self.delivery.nack(self._consumer(msg.consumer_id, origin), msg)

    def handle_Unsubscribe(self, msg: cp.Unsubscribe, origin: Origin) -> Message | None:
        consumer = self._consumer(msg.consumer_id, origin)
        others = len(self.consumers) - 1
        if others:
            raise FailedPrecondition(f"subscription '{self.subscription}' has {others} other consumers;"
                                     " close them first or unsubscribe with `danube admin topics unsubscribe`")
        self._detach(consumer.consumer_id, reply=cp.CLIENT_PROTOCOL.encode(Ok(request_id=msg.request_id)))
        self.system.tell(self.topic_endpoint, SubscriptionEnded(subscription=self.subscription))
        return None

    def handle_Seek(self, msg: cp.Seek, origin: Origin) -> Message | None:
        consumer = self._consumer(msg.consumer_id, origin)
        if not isinstance(self.delivery, TrackedDelivery):
            # Nothing is stored to go back to.
            raise FailedPrecondition(f"topic {self.topic} is not reliable: seek applies to reliable topics only")
        self.delivery.seek(consumer, msg)
        return None

    def handle_GetLastOffset(self, msg: cp.GetLastOffset, origin: Origin) -> Message:
        self._consumer(msg.consumer_id, origin)
        if not isinstance(self.delivery, TrackedDelivery):
            raise FailedPrecondition(f"topic {self.topic} is not reliable: it keeps no offsets to read")
        return cp.LastOffset(request_id=msg.request_id, offset=self.delivery.head - 1,
                             cursor=self.delivery.tracker.cursor, log_start_offset=self.delivery.log_start)

    def handle_CloseConsumer(self, msg: cp.CloseConsumer, origin: Origin) -> Message | None:
        consumer = self._consumer(msg.consumer_id, origin)
        self._detach(consumer.consumer_id, reply=cp.CLIENT_PROTOCOL.encode(Ok(request_id=msg.request_id)))
        self.delivery.dispatch()
        return None

    def handle_ApplyTopicPolicies(self, msg: ApplyTopicPolicies) -> None:
        rate_changed = msg.max_dispatch_rate != self.policies.max_dispatch_rate
        self.policies = msg
        if rate_changed:
            self._set_dispatch_rate(msg.max_dispatch_rate)
            self.delivery.dispatch()

    # ------------------------------------------------------------- max_dispatch_rate
    # The delivery sides offer their consumers at most what the bucket holds
    # (`rate_capped`) and tell what they sent (`dispatched`); with nothing left, a timer
    # message dispatches again once a token is back.
    def _set_dispatch_rate(self, rate: int) -> None:
        self._dispatch_bucket = TokenBucket(rate, self.system.clock.monotonic_ms()) if rate else None

    def rate_capped(self, capacity: dict[int, int]) -> dict[int, int]:
        """`capacity` (messages per consumer) cut to what max_dispatch_rate allows now.
        When the bucket is what limits, the timer is armed: what is left over is
        dispatched again once tokens are back, whatever path cut it."""
        bucket = self._dispatch_bucket
        if bucket is None or not capacity:
            return capacity
        now = self.system.clock.monotonic_ms()
        left = bucket.available(now)
        if left >= sum(capacity.values()):
            return capacity
        if not self._dispatch_timer:
            self._dispatch_timer = True
            self.system.schedule_once(self.endpoint, bucket.wait_ms(max(1, left + 1), now), DispatchTokensDue())
        capped = {}
        for consumer_id, room in capacity.items():
            if left <= 0:
                break
            capped[consumer_id] = min(room, left)
            left -= capped[consumer_id]
        return capped

    def dispatched(self, count: int) -> None:
        if self._dispatch_bucket is not None:
            self._dispatch_bucket.spend(count)

    def handle_DispatchTokensDue(self, msg: DispatchTokensDue) -> None:
        self._dispatch_timer = False
        self.delivery.dispatch()

    # ------------------------------------------------------------- messages in
    def handle_Publish(self, msg: Publish) -> None:
        self.delivery.publish(msg)

    # ------------------------------------------------------------- messages of a tracked delivery
    # From the topic (reads, seeks, an admin's policy and window) and the subscription's
    # own timer; the topic sends them to subscriptions of reliable topics only.
    def handle_ReadResult(self, msg: ReadResult) -> None:
        if (tracked := self._tracked_or_drop(msg)) is not None:
            tracked.read_result(msg)

    def handle_Tick(self, msg: Tick) -> None:
        if (tracked := self._tracked_or_drop(msg)) is not None:
            tracked.tick()

    def handle_DelayedDue(self, msg: DelayedDue) -> None:
        if (tracked := self._tracked_or_drop(msg)) is not None:
            tracked.delayed_due()

    def handle_SeekTo(self, msg: SeekTo) -> Message:
        return self._tracked().seek_to(msg)

    def handle_ExpireBelow(self, msg: ExpireBelow) -> None:
        if (tracked := self._tracked_or_drop(msg)) is not None:
            tracked.expire_below(msg.end)

    def handle_SetSubscriptionPolicy(self, msg: SetSubscriptionPolicy) -> Message:
        return self._tracked().set_policy(msg)

    def handle_GetSubscriptionPolicy(self, msg: GetSubscriptionPolicy) -> Message:
        return self._tracked().get_policy()

    def handle_SetSubscriptionDispatchConfig(self, msg: SetSubscriptionDispatchConfig) -> Message:
        return self._tracked().set_window(msg)

    def handle_GetSubscriptionDispatchConfig(self, msg: GetSubscriptionDispatchConfig) -> Message:
        return self._tracked().get_window()

    def handle_DescribeSubscriptionCut(self, msg: DescribeSubscriptionCut) -> Message:
        return self._tracked().describe_cut()

    def _tracked(self) -> TrackedDelivery:
        """The tracked delivery, for an ask only it can answer."""
        if not isinstance(self.delivery, TrackedDelivery):
            raise FailedPrecondition(f"subscription '{self.subscription}' of {self.topic} is not reliable")
        return self.delivery

    def _tracked_or_drop(self, msg: Message) -> TrackedDelivery | None:
        if isinstance(self.delivery, TrackedDelivery):
            return self.delivery
        self.system.count_unrecognized(self.endpoint)
        log.warning("%s: %s is for reliable subscriptions; dropped", self.name, type(msg).__name__)
        return None

    # ------------------------------------------------------------- admin
    def handle_DescribeSubscription(self, msg: DescribeSubscription) -> Message:
        active = self.rule.active_consumer_id()
        info = SubscriptionInfo(
            name=self.subscription, topic=self.topic, sub_type=self.sub_type,
            consumers=[c.name for c in self.consumers.values()],
            active_consumer=self.consumers[active].name if active is not None else None,
            delivered_messages=self.delivered_messages, dropped_messages=self.dropped_messages,
            **self.delivery.info())
        return SubscriptionStats(info=info)

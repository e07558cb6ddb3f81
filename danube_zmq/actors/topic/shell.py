"""The topic actor: one per topic (or partition), reliable or not. Owns producers,
the subscription actors and the topic's counters, and handles every request; what it
stores and how it publishes is its storage side, chosen at spawn (`factory.make_topic`):

- `MemoryTail` (`memory_tail.py`, non-reliable): offsets assigned at once, a receipt,
  one `Publish` to every subscription, the last `tail_messages_max` messages kept for
  `earliest` subscribers.
- `WalStorage` (`wal/`, reliable): WAL appends with group commit, offset
  reservations, reads for lagging subscriptions, durable segments, retention, the
  backlog quota, snapshots.

The storage side sees the shell only through a `port.ShellPort` (`storage.TopicPort`),
bound at start; the shell sees the storage only through `storage.TopicStorage`.

1. CreateProducer -> check limits, re-attach by name -> `ProducerAttached` to the gateway.
2. Send -> checked here (columns, sizes) -> `storage.send`; over `max_publish_rate` the
   batch is held (in arrival order, behind any held before it) until the topic's token
   bucket lets it through (`PublishTokensDue`, a timer): its receipt comes later, and the
   producer's window of batches in flight bounds what is held.
3. Subscribe -> find the subscription actor, or spawn one with the delivery side the
   storage makes (`storage.start_subscription`) -> `AttachConsumer` to it.
4. Reliable topics: seek (`SeekCursor` from the admin, `ResolveSeek` from a consumer's
   `Seek`) -> an offset checked against the log (`storage.resolve_seek`) -> `SeekTo` to
   the subscription; failure policy and dispatch window requests go through to the
   subscription. Non-reliable topics refuse them with FAILED_PRECONDITION.
5. The policies in force (limits, message size, rates) come from the broker at spawn and
   with each change (`ApplyTopicPolicies`), which the topic passes to its subscriptions.
   Subscriptions without a consumer for `subscription_expiration_ms` are removed
   (`expiry.py`, a timer message `ExpireSubscriptions`); messages older than
   `message_ttl_s` are acknowledged for every subscription (`message_ttl.py`).
6. Messages only a WAL topic has (`FlushDone`, `ReadRequest`, ...) go to its storage's
   log side (`storage.reliable_log`); a topic whose storage has none logs and counts
   them as unrecognized.

Client requests reach `handle_<Type>(msg, origin)` through the runtime, which decodes
them (a `Send` routed by the gateway on its ids alone is decoded here first).
Offsets are real and increasing on non-reliable topics too (Danube leaves them 0).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from danube_zmq.actors.ids import IdSource
from danube_zmq.actors.metrics import METRICS, TOPIC_SERIES
from danube_zmq.actors.rate_limit import TokenBucket
from danube_zmq.actors.schema.topic_schema import TopicSchemaGuard
from danube_zmq.actors.sockets.gateway import holder_lives, reply_client
from danube_zmq.actors.subscription import Delivery, SubscriptionActor
from danube_zmq.actors.topic.expiry import SubscriptionExpiry
from danube_zmq.actors.topic.message_ttl import MessageTtl
from danube_zmq.actors.topic.port import ShellPort
from danube_zmq.actors.topic.storage import ReliableLog, TopicStorage, refused_first
from danube_zmq.config.broker_config import TOPIC_POLICY_NAMES, BrokerConfig, topic_policy_default
from danube_zmq.runtime.actor import Actor, Origin
from danube_zmq.storage.paths import check_name
from danube_zmq.transport import client_protocol as cp
from danube_zmq.transport.admin_protocol import PartitionInfo
from danube_zmq.transport.codec import Message
from danube_zmq.transport.common import Error, Ok
from danube_zmq.transport.errors import (
    ConsumerBusy,
    DanubeError,
    ErrorCode,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    ProducerBusy,
    ResourceExhausted,
)
from danube_zmq.transport.internal_protocol import (
    AppendInternal,
    ApplyBacklogQuota,
    ApplyTopicPolicies,
    AttachConsumer,
    ChildStopped,
    ClientRequest,
    CompactionFinished,
    CompactTopicNow,
    ConsumerCount,
    DeleteSubscription,
    DescribePartition,
    DescribeSubscription,
    DetachProducer,
    Done,
    ExpireMessages,
    ExpireSubscriptions,
    FailurePolicyState,
    FlushDone,
    GetSubscriptionDispatchConfig,
    GetSubscriptionPolicy,
    HeldSendsDue,
    OffsetsReserved,
    OpenSubscriptions,
    PartitionStats,
    PersistCursor,
    ProducerAttached,
    ProducerDetached,
    ProducerRegistry,
    ProducerSchema,
    PublishTokensDue,
    ReadRequest,
    ReleaseSnapshotCut,
    ResolveSeek,
    SchemaVersionRef,
    SealTopic,
    SeekCursor,
    SeekTo,
    SegmentDurable,
    SegmentFetched,
    SetSubscriptionDispatchConfig,
    SetSubscriptionPolicy,
    SubscriptionCursor,
    SubscriptionEnded,
    SubscriptionStats,
    TakeSnapshotCut,
    Tick,
    TopicSchemaChanged,
    TopicSchemaState,
    TopicSealed,
    WalSyncDue,
)

log = logging.getLogger("danube_zmq.topic")


@dataclass(slots=True)
class _Producer:
    producer_id: int
    name: str
    identity: bytes
    access_mode: int = 0
    # Reliable topics: the highest batch `sequence` accepted + 1, moved back to a refused
    # batch's number (later batches are refused until it comes again); at attach, the one
    # the client says it sends next (`CreateProducer.next_sequence`). None: any.
    next_sequence: int | None = None
    schema: SchemaVersionRef | None = None  # the schema version it writes, stamped on its messages


@dataclass(slots=True)
class _Subscription:
    endpoint: str
    sub_type: int
    consumers: int = 0
    idle_since_ms: int | None = None  # monotonic; None: a consumer is attached (expiry.py)
    durable: bool = True  # False: a reader's, gone with its consumer (`Subscribe.durable`)


class TopicActor(Actor):
    def __init__(self, *, name: str, config: BrokerConfig, rng: IdSource, broker_endpoint: str,
                 storage: TopicStorage, cursor_endpoint: str | None = None,
                 policies: ApplyTopicPolicies | None = None) -> None:
        self.topic = name
        # The policies in force (the broker tells changes): read here, not in the config.
        self.policies = policies or ApplyTopicPolicies(
            **{name: topic_policy_default(config, name) for name in TOPIC_POLICY_NAMES})
        # max_publish_rate: the bucket (None: unlimited) and the batches it holds back.
        self._publish_bucket: TokenBucket | None = None
        self._held_sends: deque[tuple[ClientRequest, cp.Send]] = deque()
        self._held_bytes = 0
        self._publish_timer = False
        self.broker_endpoint = broker_endpoint
        # Where the subscriptions' cursors go: the broker's cursor flusher.
        self.cursor_endpoint = cursor_endpoint or broker_endpoint
        self.config = config
        self.rng = rng
        self.storage = storage
        self.reliable = storage.reliable
        self.producers: dict[int, _Producer] = {}
        self.producer_ids_by_name: dict[str, int] = {}
        self.subscriptions: dict[str, _Subscription] = {}
        # Reliable topics: failure policies an admin set since the subscription's actor was
        # spawned, so that a restart of that actor (from its factory) keeps them.
        self.subscription_policies: dict[str, FailurePolicyState] = {}
        # Likewise their dispatch windows (`max_unacked_messages`).
        self.subscription_windows: dict[str, int] = {}
        self.messages_in = 0
        self.bytes_in = 0
        self.dropped_messages = 0  # missed by a subscription whose mailbox was full (non-reliable)
        # The topic's schema binding (None: no subject bound) and its metadata revision.
        self.schema_guard: TopicSchemaGuard | None = None
        self.schema_revision = -1
        self._schema_check: TopicSchemaGuard | None = None  # the guard when it checks anything
        self.expiry = SubscriptionExpiry(self)
        self.ttl = MessageTtl(self)

    async def on_start(self) -> None:
        self.storage.bind(ShellPort(self))
        TOPIC_SERIES.acquire(self.topic, (id(self.system), ""))
        self._messages_in_metric = METRICS.messages_in.labels(topic=self.topic)
        self._bytes_in_metric = METRICS.bytes_in.labels(topic=self.topic)
        self._set_publish_rate(self.policies.max_publish_rate)
        await self.storage.start()
        self.ttl.arm()

    async def on_stop(self) -> None:
        # Subscriptions (children) were stopped first and told their consumers.
        state, reattach = self.stop_state()
        for producer in self.producers.values():
            self.system.tell(self._gateway, ProducerDetached(
                identity=producer.identity, producer_id=producer.producer_id, reason=f"topic {self.topic} {state}",
                reattach=reattach))
        # Batches held over max_publish_rate are answered now, not left to the client's
        # timeout: it sends them again at once and in order (its later batches wait on them).
        for req, send in self._held_sends:
            reply_client(self.system, req.identity, Error(
                request_id=send.request_id, code=ErrorCode.UNAVAILABLE,
                message=f"topic {self.topic} {state} while this batch was held over its max_publish_rate;"
                        " send it again"))
        self._held_sends.clear()
        self._held_bytes = 0
        await self.storage.stop()
        if not self.restarting:  # deleted, unloaded or moved away: its series go
            TOPIC_SERIES.release(self.topic, (id(self.system), ""))

    @property
    def _gateway(self) -> str:
        return self.system.gateway_endpoint

    @property
    def next_offset(self) -> int:
        return self.storage.next_offset

    # ------------------------------------------------------------- what the storage side calls
    def count_in(self, count: int, size: int) -> None:
        """Messages accepted (not yet stored, on a reliable topic)."""
        self.messages_in += count
        self.bytes_in += size
        self._messages_in_metric.inc(count)
        self._bytes_in_metric.inc(size)

    def attached_producer(self, producer_id: int, identity: bytes) -> _Producer:
        producer = self.producers.get(producer_id)
        if producer is None or producer.identity != identity:
            raise NotFound(f"producer {producer_id} is not attached to topic {self.topic}")
        return producer

    async def spawn_subscription(self, name: str, sub_type: int, make_delivery: Callable[[], Delivery],
                                 durable: bool = True) -> _Subscription:
        """Spawn a subscription's actor with the delivery side `make_delivery` builds (at
        each restart of the subscription too)."""
        topic, config, parent, broker = self.topic, self.config, self.endpoint, self.broker_endpoint
        # storage.mode local: cursors go to this topic's WAL (`ReliableLog.persist_cursor`).
        cursors = self.endpoint if self._cursor_log() is not None else self.cursor_endpoint
        endpoint = await self.system.spawn(
            lambda: SubscriptionActor(topic=topic, name=name, sub_type=sub_type, config=config,
                                      topic_endpoint=parent, broker_endpoint=broker, delivery=make_delivery(),
                                      cursor_endpoint=cursors, policies=self.policies),
            name=f"subscription {topic}:{name}", parent=self.endpoint, share_mailbox=True)
        subscription = _Subscription(endpoint=endpoint, sub_type=sub_type, durable=durable)
        self.subscriptions[name] = subscription
        self.expiry.touch(subscription)
        return subscription

    # ------------------------------------------------------------- client requests
    async def handle_CreateProducer(self, msg: cp.CreateProducer, origin: Origin) -> Message | None:
        _check_name("producer name", msg.producer_name)
        req = _envelope(origin)
        context = req.schema
        if msg.schema_subject is not None and (context is None or context.version is None):
            raise FailedPrecondition(f"topic {self.topic}: this broker runs no schema registry")
        if context is not None:
            self._apply_schema_state(context.topic, context.topic.revision if context.topic is not None else 0)
        producer_id = self.producer_ids_by_name.get(msg.producer_name)
        if producer_id is not None and self.producers[producer_id].identity != req.identity:
            # Another connection is refused while the holder lives (Pulsar's ProducerBusy).
            # The name frees when the holder closes or its session ends: the gateway tells
            # us then, but that notice can be lost to a full mailbox, so it is asked here.
            producer = self.producers[producer_id]
            if await holder_lives(self.system, producer.identity, cp.ClientKind.PRODUCER, producer_id, self.endpoint):
                raise ProducerBusy(f"producer name '{producer.name}' is held by another connection on {self.topic};"
                                   " it is free once that producer closes or its session times out")
            log.info("%s: producer '%s' was held by a connection that is gone; released", self.topic, producer.name)
            self._forget_producer(producer_id)
            producer_id = None
        if producer_id is not None:
            # The same connection re-attaches (a client reconnecting on its socket's fixed
            # identity).
            producer = self.producers[producer_id]
            # The client re-attaches after a refusal and sends its unacknowledged batches
            # again, in order from the one it names (a batch it gave up on is not waited for).
            producer.next_sequence = msg.next_sequence
        else:
            limit = self.policies.max_producers_per_topic
            if limit and len(self.producers) >= limit:
                raise ResourceExhausted(f"topic {self.topic} already has {limit} producers (max_producers_per_topic)")
            producer_id = self._new_id(self.producers)
            self.producers[producer_id] = _Producer(producer_id, msg.producer_name, req.identity, msg.access_mode,
                                                    next_sequence=msg.next_sequence)
            self.producer_ids_by_name[msg.producer_name] = producer_id
            self._register(self.producers[producer_id], attached=True)
        schema = _version_of(context)
        self.producers[producer_id].schema = schema
        if schema is not None and self.schema_guard is not None:
            self.schema_guard.learn(schema)
        created = cp.ProducerCreated(request_id=msg.request_id, producer_id=producer_id,
                                     producer_name=msg.producer_name, topic=self.topic,
                                     schema_id=schema.schema_id if schema else None,
                                     schema_version=schema.version if schema else None,
                                     last_sequence_id=self.storage.last_sequence_id(msg.producer_name))
        self.system.tell(self._gateway, ProducerAttached(
            identity=req.identity, producer_id=producer_id, endpoint=self.endpoint,
            reply=cp.CLIENT_PROTOCOL.encode(created), topic=self.topic))
        return None

    def schema_of(self, producer: _Producer, msg: cp.Send) -> tuple[int | None, int | None]:
        """The schema (id, version) the batch is stored with: its producer's. Checked
        against the topic's binding when the topic has a guard that checks anything."""
        schema = producer.schema
        schema_id, version = (schema.schema_id, schema.version) if schema is not None else (None, None)
        if msg.schema_id is not None and (msg.schema_id != schema_id or msg.schema_version != version):
            raise InvalidArgument(f"producer '{producer.name}' writes schema id {schema_id} version {version};"
                                  f" this batch says schema id {msg.schema_id} version {msg.schema_version}")
        if self._schema_check is not None:
            self._schema_check.check(schema_id, version, msg.payloads, msg.attributes)
        return schema_id, version

    def _apply_schema_state(self, state: TopicSchemaState | None, revision: int) -> None:
        """Take the topic's binding as of `revision` unless a newer one is already known."""
        if revision < self.schema_revision:
            return
        self.schema_revision = revision
        if state is None:
            self.schema_guard = self._schema_check = None
            return
        guard = self.schema_guard
        if guard is None or guard.state.schema_id != state.schema_id:
            guard = TopicSchemaGuard(self.topic, state, budget_ms=self.config.limits.schema_validation_budget_ms,
                                     decompressed_bytes_max=self.config.limits.frame_bytes_max)
            for producer in self.producers.values():
                if producer.schema is not None:
                    guard.learn(producer.schema)
        else:
            guard.update(state)
        self.schema_guard = guard
        self._schema_check = guard if guard.active else None

    def handle_TopicSchemaChanged(self, msg: TopicSchemaChanged) -> None:
        self._apply_schema_state(msg.state, msg.revision)

    def handle_SealTopic(self, msg: SealTopic) -> Message:
        return TopicSealed(next_offset=self.storage.seal())

    def handle_Send(self, msg: cp.Send, origin: Origin) -> Message | None:
        req = _envelope(origin)
        count = len(msg.payloads)
        if count == 0 or len(msg.publish_times) != count or _column_mismatch(msg.keys, count) \
                or _column_mismatch(msg.attributes, count) or _column_mismatch(msg.sequence_ids, count):
            raise InvalidArgument("a Send needs at least one message and one entry per message"
                                  " in publish_times (and in keys/attributes/sequence_ids when given)")
        # Producers stamp publish times with their own clocks (ours, and Danube's through
        # the gRPC door): a wild one must not reach the WAL, where snapshots, reports and
        # seeks by time read it. Two passes in C over a list the batch carries anyway.
        if min(msg.publish_times) < 0 or max(msg.publish_times) > cp.PUBLISH_TIME_MS_MAX:
            raise InvalidArgument(f"publish_time must be ms since the epoch, 0..{cp.PUBLISH_TIME_MS_MAX}"
                                  " (the end of year 9999)")
        size_max = self.policies.max_message_size
        # The whole frame is smaller than the limit in the common case: no per-message check.
        if len(req.frame) > size_max:
            largest = max(map(len, msg.payloads))
            if largest > size_max:
                raise InvalidArgument(f"message of {largest} bytes exceeds max_message_size ({size_max} bytes:"
                                      " the topic's or namespace's policy, else policies.max_message_size)")
        bucket = self._publish_bucket
        if bucket is not None and (self._held_sends or not bucket.take(count, self.system.clock.monotonic_ms())):
            hold_max = self.config.policies.publish_rate_hold_bytes_max
            if self._held_bytes + len(req.frame) > hold_max:
                # A reliable producer's later batches are refused too until this one comes
                # again, so none is stored before it.
                producer = self.attached_producer(msg.producer_id, req.identity)
                raise refused_first(producer, msg, ResourceExhausted(
                    f"topic {self.topic} holds {self._held_bytes} bytes of batches over its max_publish_rate"
                    f" ({self.policies.max_publish_rate} messages/s), past publish_rate_hold_bytes_max"
                    f" ({hold_max}): retry later"))
            self._held_sends.append((req, msg))
            self._held_bytes += len(req.frame)
            self._schedule_publish_tokens()
            return None
        self.storage.send(req, msg)
        return None

    # ------------------------------------------------------------- policies
    def handle_ApplyTopicPolicies(self, msg: ApplyTopicPolicies) -> None:
        if msg == self.policies:
            return
        if msg.max_publish_rate != self.policies.max_publish_rate:
            self._set_publish_rate(msg.max_publish_rate)
        self.policies = msg
        for subscription in self.subscriptions.values():
            self.system.tell(subscription.endpoint, msg)
        self.expiry.arm()
        self.ttl.arm()

    def _set_publish_rate(self, rate: int) -> None:
        self._publish_bucket = TokenBucket(rate, self.system.clock.monotonic_ms()) if rate else None
        self.handle_PublishTokensDue(PublishTokensDue())

    def handle_PublishTokensDue(self, msg: PublishTokensDue) -> None:
        """Pass on the held batches the bucket has tokens for, in order."""
        self._publish_timer = False
        while self._held_sends:
            req, send = self._held_sends[0]
            bucket = self._publish_bucket
            if bucket is not None and not bucket.take(len(send.payloads), self.system.clock.monotonic_ms()):
                self._schedule_publish_tokens()
                return
            self._held_sends.popleft()
            self._held_bytes -= len(req.frame)
            try:
                self.storage.send(req, send)
            except DanubeError as exc:  # its producer went meanwhile: its connection is told
                reply_client(self.system, req.identity,
                             Error(request_id=send.request_id, code=exc.code, message=exc.message))

    def _schedule_publish_tokens(self) -> None:
        if self._publish_timer:
            return
        _, send = self._held_sends[0]
        assert self._publish_bucket is not None
        delay_ms = self._publish_bucket.wait_ms(len(send.payloads), self.system.clock.monotonic_ms())
        self._publish_timer = True
        self.system.schedule_once(self.endpoint, max(1, delay_ms), PublishTokensDue())

    def handle_CloseProducer(self, msg: cp.CloseProducer, origin: Origin) -> Message | None:
        self.attached_producer(msg.producer_id, origin.identity)
        self._forget_producer(msg.producer_id)
        self.system.tell(self._gateway, ProducerDetached(
            identity=origin.identity, producer_id=msg.producer_id,
            reply=cp.CLIENT_PROTOCOL.encode(Ok(request_id=msg.request_id))))
        return None

    async def handle_Subscribe(self, msg: cp.Subscribe, origin: Origin) -> Message | None:
        req = _envelope(origin)
        _check_name("subscription name", msg.subscription)
        _check_name("consumer name", msg.consumer_name)
        if msg.sub_type not in (0, 1, 2, 3):
            raise InvalidArgument(f"unknown subscription type {msg.sub_type}")
        if msg.initial_position not in (cp.InitialPosition.LATEST, cp.InitialPosition.EARLIEST):
            raise InvalidArgument(f"unknown initial position {msg.initial_position}")
        if msg.read_compacted:
            _check_read_compacted(msg, self.topic, self.storage.reliable_log is not None)
        policies = self.policies
        consumers = sum(s.consumers for s in self.subscriptions.values())
        if policies.max_consumers_per_topic and consumers >= policies.max_consumers_per_topic:
            raise ResourceExhausted(f"topic {self.topic} already has {consumers} consumers (max_consumers_per_topic)")
        subscription = self.subscriptions.get(msg.subscription)
        replay: list[bytes] = []
        if not msg.durable:
            _check_reader(msg, subscription is not None)
        if subscription is None:
            if policies.max_subscriptions_per_topic and len(self.subscriptions) >= policies.max_subscriptions_per_topic:
                raise ResourceExhausted(f"topic {self.topic} already has {len(self.subscriptions)} subscriptions"
                                        " (max_subscriptions_per_topic)")
            replay = await self.storage.start_subscription(msg)
            subscription = self.subscriptions[msg.subscription]
        elif subscription.sub_type != msg.sub_type:
            have = cp.SubType(subscription.sub_type).name.lower()
            want = cp.SubType(msg.sub_type).name.lower()
            raise FailedPrecondition(f"subscription '{msg.subscription}' on {self.topic} is {have};"
                                     f" a {want} consumer cannot attach")
        else:
            self.expiry.touch(subscription)  # a consumer is attaching: not idle meanwhile
        consumer_id = self.rng.getrandbits(63)
        if not self.system.tell(subscription.endpoint, AttachConsumer(
                identity=req.identity, frame=req.frame, consumer_id=consumer_id, replay=replay)):
            raise ResourceExhausted(f"subscription '{msg.subscription}' is busy; retry")
        return None

    # ------------------------------------------------------------- internal
    async def handle_OpenSubscriptions(self, msg: OpenSubscriptions) -> Message:
        for name, sub_type in zip(msg.names, msg.sub_types, strict=True):
            if name not in self.subscriptions:
                await self.storage.start_subscription(cp.Subscribe(
                    request_id=0, topic=self.topic, subscription=name, consumer_name="", sub_type=sub_type,
                    initial_position=cp.InitialPosition.EARLIEST))
        return Done()

    def handle_DetachProducer(self, msg: DetachProducer) -> None:
        producer = self.producers.get(msg.producer_id)
        if producer is not None and producer.identity == msg.identity:
            self._forget_producer(msg.producer_id)

    def handle_ChildStopped(self, msg: ChildStopped) -> None:
        for name, subscription in list(self.subscriptions.items()):
            if subscription.endpoint == msg.endpoint:
                log.error("%s: subscription '%s' stopped after repeated failures (%s)", self.topic, name, msg.reason)
                del self.subscriptions[name]
                self.subscription_policies.pop(name, None)
                self.subscription_windows.pop(name, None)

    async def handle_ConsumerCount(self, msg: ConsumerCount) -> None:
        subscription = self.subscriptions.get(msg.subscription)
        if subscription is None:
            return
        if not subscription.durable and not msg.consumers:
            await self.remove_subscription(msg.subscription)  # a reader's goes with its consumer
            return
        self.expiry.counted(subscription, msg.consumers)

    async def handle_ExpireSubscriptions(self, msg: ExpireSubscriptions) -> None:
        await self.expiry.due()

    async def handle_ExpireMessages(self, msg: ExpireMessages) -> None:
        await self.ttl.due()

    async def handle_SubscriptionEnded(self, msg: SubscriptionEnded) -> None:
        await self.remove_subscription(msg.subscription)

    async def handle_DeleteSubscription(self, msg: DeleteSubscription) -> Message:
        if not await self.remove_subscription(msg.subscription):
            raise NotFound(f"subscription '{msg.subscription}' does not exist on {self.topic}")
        return Done()

    async def remove_subscription(self, name: str) -> bool:
        """Stop a subscription's actor and forget it: its policy, window and (reliable)
        persisted cursor go (False: there is none)."""
        subscription = self.subscriptions.pop(name, None)
        if subscription is None:
            return False
        await self.system.stop(subscription.endpoint)
        self.subscription_policies.pop(name, None)
        self.subscription_windows.pop(name, None)
        if subscription.durable:  # a reader's kept no cursor to forget
            self.storage.forget_subscription(name)
        return True

    async def handle_DescribePartition(self, msg: DescribePartition) -> Message:
        subscriptions = []
        for subscription in self.subscriptions.values():
            stats = await self.system.ask(subscription.endpoint, DescribeSubscription())
            assert isinstance(stats, SubscriptionStats)
            subscriptions.append(stats.info)
        info = PartitionInfo(
            name=self.topic, next_offset=self.next_offset,
            producers=sorted(p.name for p in self.producers.values()),
            messages_in=self.messages_in, bytes_in=self.bytes_in, dropped_messages=self.dropped_messages,
            subscriptions=subscriptions)
        info = self.storage.describe(info)
        return PartitionStats(info=info)

    # ------------------------------------------------------------- seek and failure policy
    async def handle_SeekCursor(self, msg: SeekCursor) -> Message:
        subscription = self._reliable_subscription(msg.subscription)
        offset = await self._seek_offset(msg.offset, msg.publish_time)
        answer = await self.system.ask(subscription.endpoint, SeekTo(offset=offset))
        if isinstance(answer, PersistCursor) and (wal := self._cursor_log()) is not None:
            await wal.seek_durable(answer)
        return Done()

    async def handle_ResolveSeek(self, msg: ResolveSeek) -> None:
        """A consumer's `Seek`, from its subscription: resolved here, answered by the
        subscription once it has moved (or here, with the error)."""
        try:
            subscription = self._reliable_subscription(msg.subscription)
            offset = await self._seek_offset(msg.offset, msg.publish_time)
            if (wal := self._cursor_log()) is not None:
                # Answered here once the seek's checkpoint is in the WAL: a seek answered
                # before would be undone by a crash (the WAL's older cursor resumes).
                answer = await self.system.ask(subscription.endpoint, SeekTo(offset=offset))
                if isinstance(answer, PersistCursor):
                    await wal.seek_durable(answer)
                reply_client(self.system, msg.identity, Ok(request_id=msg.request_id))
            elif not self.system.tell(subscription.endpoint, SeekTo(
                    offset=offset, identity=msg.identity, request_id=msg.request_id)):
                raise ResourceExhausted(f"subscription '{msg.subscription}' is busy (full mailbox); retry the seek")
        except DanubeError as exc:
            reply_client(self.system, msg.identity, Error(request_id=msg.request_id, code=exc.code, message=exc.message))

    async def handle_SetSubscriptionPolicy(self, msg: SetSubscriptionPolicy) -> Message:
        answer = await self.system.ask(self._reliable_subscription(msg.subscription).endpoint, msg)
        self.subscription_policies[msg.subscription] = msg.policy  # accepted
        if isinstance(answer, PersistCursor) and (wal := self.storage.reliable_log) is not None:
            wal.settings_changed(answer)
        return answer

    async def handle_GetSubscriptionPolicy(self, msg: GetSubscriptionPolicy) -> Message:
        return await self.system.ask(self._reliable_subscription(msg.subscription).endpoint, msg)

    async def handle_SetSubscriptionDispatchConfig(self, msg: SetSubscriptionDispatchConfig) -> Message:
        answer = await self.system.ask(self._reliable_subscription(msg.subscription).endpoint, msg)
        self.subscription_windows[msg.subscription] = msg.max_unacked_messages  # accepted
        if isinstance(answer, PersistCursor) and (wal := self.storage.reliable_log) is not None:
            wal.settings_changed(answer)
        return answer

    async def handle_GetSubscriptionDispatchConfig(self, msg: GetSubscriptionDispatchConfig) -> Message:
        return await self.system.ask(self._reliable_subscription(msg.subscription).endpoint, msg)

    def _cursor_log(self) -> ReliableLog | None:
        """The log side when the subscriptions' cursors are checkpoints in it, else None."""
        wal = self.storage.reliable_log
        return wal if wal is not None and wal.cursors_in_wal else None

    def _reliable_subscription(self, name: str) -> _Subscription:
        if not self.reliable:
            raise FailedPrecondition(f"topic {self.topic} is not reliable: seek, failure policies and dispatch"
                                     " windows apply to subscriptions of reliable topics only")
        subscription = self.subscriptions.get(name)
        if subscription is None:
            raise NotFound(f"subscription '{name}' does not exist on {self.topic}")
        return subscription

    async def _seek_offset(self, offset: int | None, publish_time: int | None) -> int:
        """The offset a seek moves a subscription to: exactly one of `offset` (checked
        against the log) and `publish_time` (ms since the epoch: the first message
        published at or after it)."""
        _check_seek_target(offset, publish_time)
        return await self.storage.resolve_seek(offset, publish_time)

    # ------------------------------------------------------------- messages of a WAL topic
    # Sent by the WAL's worker threads, the broker, the topic's own timers and its
    # subscriptions, only to reliable topics; another storage counts them as unrecognized.
    async def handle_FlushDone(self, msg: FlushDone) -> None:
        if (wal := self._wal(msg)) is not None:
            await wal.flush_done(msg)

    async def handle_Tick(self, msg: Tick) -> None:
        if (wal := self._wal(msg)) is not None:
            await wal.tick()

    async def handle_WalSyncDue(self, msg: WalSyncDue) -> None:
        if (wal := self._wal(msg)) is not None:
            await wal.sync_due()

    def handle_OffsetsReserved(self, msg: OffsetsReserved) -> None:
        if (wal := self._wal(msg)) is not None:
            wal.offsets_reserved(msg)

    def handle_AppendInternal(self, msg: AppendInternal) -> None:
        if (wal := self._wal(msg)) is not None:
            wal.append_internal(msg)

    def handle_HeldSendsDue(self, msg: HeldSendsDue) -> None:
        if (wal := self._wal(msg)) is not None:
            wal.held_sends_due()

    def handle_ApplyBacklogQuota(self, msg: ApplyBacklogQuota) -> None:
        if (wal := self._wal(msg)) is not None:
            wal.apply_backlog_quota(msg)

    def handle_ReadRequest(self, msg: ReadRequest) -> None:
        if (wal := self._wal(msg)) is not None:
            wal.read(msg)

    def handle_PersistCursor(self, msg: PersistCursor) -> None:
        if (wal := self._wal(msg)) is not None:
            wal.persist_cursor(msg)

    def handle_SubscriptionCursor(self, msg: SubscriptionCursor) -> None:
        if (wal := self._wal(msg)) is not None:
            wal.subscription_cursor(msg)

    def handle_SegmentDurable(self, msg: SegmentDurable) -> None:
        if (wal := self._wal(msg)) is not None:
            wal.segment_durable(msg)

    def handle_SegmentFetched(self, msg: SegmentFetched) -> None:
        if (wal := self._wal(msg)) is not None:
            wal.segment_fetched(msg)

    def handle_ReleaseSnapshotCut(self, msg: ReleaseSnapshotCut) -> None:
        if (wal := self._wal(msg)) is not None:
            wal.release_snapshot_cut(msg)

    async def handle_CompactionFinished(self, msg: CompactionFinished) -> None:
        if (wal := self._wal(msg)) is not None:
            await wal.compaction_finished(msg)

    def handle_CompactTopicNow(self, msg: CompactTopicNow) -> Message:
        wal = self.storage.reliable_log
        if wal is None:
            raise FailedPrecondition(f"topic {self.topic} is not reliable: compaction needs its stored messages")
        wal.compact()
        return Done()

    async def handle_TakeSnapshotCut(self, msg: TakeSnapshotCut) -> Message:
        wal = self.storage.reliable_log
        if wal is None:
            raise FailedPrecondition(f"topic {self.topic} is not reliable: snapshots hold reliable topics only")
        return await wal.take_snapshot_cut(msg)

    def _wal(self, msg: Message) -> ReliableLog | None:
        wal = self.storage.reliable_log
        if wal is not None:
            return wal
        self.system.count_unrecognized(self.endpoint)
        log.warning("%s: %s is for reliable topics; dropped", self.name, type(msg).__name__)
        return None

    def _forget_producer(self, producer_id: int) -> None:
        producer = self.producers.pop(producer_id, None)
        if producer is not None:
            self.producer_ids_by_name.pop(producer.name, None)
            self._register(producer, attached=False)

    def _register(self, producer: _Producer, *, attached: bool) -> None:
        """Tell the broker, which records the topic's producers in the metadata store."""
        self.system.tell(self.broker_endpoint, ProducerRegistry(
            topic=self.topic, producer_id=producer.producer_id, producer_name=producer.name,
            access_mode=producer.access_mode, attached=attached))

    def _new_id(self, taken: dict[int, object]) -> int:
        while True:
            candidate = self.rng.getrandbits(63)
            if candidate not in taken:
                return candidate


def _envelope(origin: Origin) -> ClientRequest:
    envelope = origin.envelope
    assert isinstance(envelope, ClientRequest), "a topic serves the client port only"
    return envelope


def _version_of(context: ProducerSchema | None) -> SchemaVersionRef | None:
    return context.version if context is not None else None


def _check_reader(msg: cp.Subscribe, taken: bool) -> None:
    """A reader's subscription (`durable` False) is its own and Exclusive."""
    if taken:
        raise ConsumerBusy(f"subscription '{msg.subscription}' exists: a reader's subscription name must be new")
    if msg.sub_type != cp.SubType.EXCLUSIVE:
        raise InvalidArgument("a non-durable subscription (a reader's) is Exclusive")


def _check_seek_target(offset: int | None, publish_time: int | None) -> None:
    """A seek names exactly one target, never negative."""
    if (offset is None) == (publish_time is None):
        raise InvalidArgument("a seek takes exactly one of offset and publish_time")
    if offset is not None and offset < 0:
        raise InvalidArgument(f"offset must be >= 0, not {offset}")
    if publish_time is not None and publish_time < 0:
        raise InvalidArgument(f"publish_time must be >= 0 (ms since the epoch), not {publish_time}")


def _column_mismatch(column: list[object] | None, count: int) -> bool:
    return column is not None and len(column) != count


def _check_name(what: str, value: str) -> None:
    check_name(what, value)


def _check_read_compacted(msg: cp.Subscribe, topic: str, reliable: bool) -> None:
    if not reliable:
        raise FailedPrecondition(f"topic {topic} is not reliable: read_compacted reads a compacted reliable topic")
    if msg.sub_type not in (cp.SubType.EXCLUSIVE, cp.SubType.FAILOVER):
        raise InvalidArgument("read_compacted applies to exclusive and failover subscriptions (and readers),"
                              f" not {cp.SubType(msg.sub_type).name.lower()}")

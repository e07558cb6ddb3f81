"""The broker actor: the registry of namespaces and topics of one broker.

It answers the requests that need to know which topics exist (lookup, partition
discovery, producer creation, subscribe) and the admin requests, and it is the
parent of every topic actor. Creating a topic spawns its actor (one per partition);
deleting it stops the actor, whose `on_stop` tells its clients.

Until the Raft metadata store exists, the registry is persisted in the broker's local
catalog (LevelDB under `broker.data_dir/catalog`): namespaces, topics and the cursors
of reliable subscriptions survive a restart, and reliable topics reopen their WAL.

1. Client request -> validate the name -> create when allowed -> forward the frame
   to the topic actor, which answers the client.
2. Admin request -> change the registry -> answer on the admin outbox.
"""

from __future__ import annotations

import asyncio
import fnmatch
import logging
import random
import shutil
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack

from danube_zmq.actors.actor import Actor
from danube_zmq.actors.admin_gateway import reply_admin
from danube_zmq.actors.config import BrokerConfig
from danube_zmq.actors.gateway import reply_client
from danube_zmq.actors.metrics import METRICS
from danube_zmq.actors.reliable_topic import ReliableTopicActor
from danube_zmq.actors.topic import TopicActor
from danube_zmq.actors.topic_name import TopicName, parse_topic, validate_namespace
from danube_zmq.storage.catalog import LevelDbCatalog, SegmentCatalog, SegmentDescriptor, topic_key
from danube_zmq.storage.durable import DurableStore, SealedSegment, Uploader, UploaderConfig
from danube_zmq.transport import admin_protocol as ap
from danube_zmq.transport import client_protocol as cp
from danube_zmq.transport import internal_protocol as ip
from danube_zmq.transport.codec import Message
from danube_zmq.transport.common import Error, Ok
from danube_zmq.transport.errors import (
    AlreadyExists,
    DanubeError,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
)
from danube_zmq.transport.internal_protocol import (
    AdminRequest,
    AppendInternal,
    ChildStopped,
    ClientRequest,
    DeadLetter,
    DeleteSubscription,
    DescribePartition,
    DurableSegment,
    ForgetSegments,
    ForgetSubscription,
    ListSnapshotTopics,
    PartitionStats,
    PersistCursor,
    SegmentDurable,
    SegmentSealed,
    SnapshotTopicRef,
    SnapshotTopics,
    SubscriptionState,
    Tick,
    TopicSchemaChanged,
)

log = logging.getLogger("danube_zmq.broker")

# How long a clean stop waits for the uploads of just-sealed segments.
_UPLOADS_AT_STOP_S = 30.0


@dataclass(slots=True)
class TopicEntry:
    """A topic as the registry knows it. A partitioned topic has `partitions` > 0 and
    no actor of its own; each of its partitions has an entry with an actor."""

    name: TopicName
    dispatch_strategy: int
    partitions: int = 0
    endpoint: str | None = None


class BrokerActor(Actor):
    def __init__(self, *, config: BrokerConfig, broker_id: int, broker_url: str, admin_url: str,
                 metrics_url: str | None, rng: random.Random, executor: Executor) -> None:
        self.config = config
        self.executor = executor
        self.data_dir = Path(config.broker.data_dir)
        self.catalog: LevelDbCatalog | None = None
        self.cursor_writes: dict[str, bytes] = {}
        self.durable_store: DurableStore | None = None
        self.segment_catalog: SegmentCatalog | None = None
        self.uploader: Uploader | None = None
        self.broker_id = broker_id
        self.broker_url = broker_url
        self.admin_url = admin_url
        self.metrics_url = metrics_url
        self.rng = rng
        self.namespaces: set[str] = set(config.bootstrap_namespaces)
        self.topics: dict[str, TopicEntry] = {}
        self._client_routes = {
            cp.Lookup: self._lookup,
            cp.GetPartitions: self._get_partitions,
            cp.CreateProducer: self._create_producer,
            cp.Subscribe: self._subscribe,
        }
        self._admin_routes = {
            ap.ListNamespaces: self._list_namespaces,
            ap.CreateNamespace: self._create_namespace,
            ap.DeleteNamespace: self._delete_namespace,
            ap.ListTopics: self._list_topics,
            ap.CreateTopic: self._admin_create_topic,
            ap.DeleteTopic: self._delete_topic,
            ap.DescribeTopic: self._describe_topic,
            ap.ListSubscriptions: self._list_subscriptions,
            ap.Unsubscribe: self._unsubscribe,
            ap.ListBrokers: self._list_brokers,
            ap.SeekSubscription: self._seek_subscription,
            ap.SetFailurePolicy: self._set_failure_policy,
            ap.GetFailurePolicy: self._get_failure_policy,
            ap.SetDispatchConfig: self._set_dispatch_config,
            ap.GetDispatchConfig: self._get_dispatch_config,
        }

    # ------------------------------------------------------------- lifecycle
    async def on_start(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.catalog = LevelDbCatalog(self.data_dir / "catalog")
        if self.config.storage.mode != "local":
            self.segment_catalog = SegmentCatalog(self.catalog)
        for namespace in self.namespaces:
            self.catalog.put(_namespace_key(namespace), b"", sync=False)
        for key, _ in self.catalog.scan(_NAMESPACES):
            self.namespaces.add(key[len(_NAMESPACES):])
        for key, value in self.catalog.scan("/topics/"):
            if key.count("/") != 3:
                continue  # subscription records below a topic
            record = msgpack.unpackb(value)
            name = parse_topic(key[len("/topics"):])
            await self._open_topic(name, record["partitions"], record["dispatch_strategy"])
        await self._start_uploader()
        self.system.schedule_periodic(self.endpoint, self.config.storage.cursor_flush_interval_ms, Tick())

    async def _start_uploader(self) -> None:
        """Durable modes: sealed segments of reliable topics are copied to the durable store."""
        storage = self.config.storage
        if storage.mode == "local":
            return
        assert self.catalog is not None and storage.durable_url
        self.durable_store = DurableStore(storage.durable_url)
        self.segment_catalog = SegmentCatalog(self.catalog)
        self.uploader = Uploader(self.durable_store, self.segment_catalog, UploaderConfig(uploads_max=storage.uploads_max),
                                 clock=self.system.clock, on_uploaded=self._on_uploaded)
        await self.uploader.start()

    def _on_uploaded(self, desc: SegmentDescriptor) -> None:
        entry = self.topics.get(desc.topic)
        if entry is not None and entry.endpoint is not None:
            self.system.post(entry.endpoint, SegmentDurable(segment=_durable_segment(desc)))

    def handle_SegmentSealed(self, msg: SegmentSealed) -> None:
        if self.uploader is None or self.segment_catalog is None:
            return
        known = self.segment_catalog.get(msg.topic, msg.base_offset)
        if known is not None:
            self._on_uploaded(known)
            return
        try:
            self.uploader.submit(SealedSegment(topic=msg.topic, base_offset=msg.base_offset, end_offset=msg.end_offset,
                                               record_count=msg.record_count, local_path=Path(msg.path)))
        except DanubeError as exc:
            log.warning("segment %s@%d not queued for upload (%s); the topic reports it again", msg.topic,
                        msg.base_offset, exc)

    def handle_ForgetSegments(self, msg: ForgetSegments) -> None:
        if self.segment_catalog is not None:
            for base_offset in msg.base_offsets:
                self.segment_catalog.remove(msg.topic, base_offset)

    async def on_stop(self) -> None:
        if self.uploader is not None:
            try:  # the segments topics sealed while stopping (told before this runs)
                await asyncio.wait_for(self.uploader.wait_idle(), _UPLOADS_AT_STOP_S)
            except (TimeoutError, DanubeError) as exc:
                log.warning("uploads still pending at shutdown (%s); they resume at the next start", exc)
            await self.uploader.stop()
            self.uploader = None
        if self.catalog is not None:
            self._flush_cursors()
            self.catalog.close()
            self.catalog = None

    def handle_Tick(self, msg: Tick) -> None:
        self._flush_cursors()

    def handle_PersistCursor(self, msg: PersistCursor) -> None:
        # Coalesced: the last state of each subscription is written with the next flush.
        self.cursor_writes[_subscription_key(msg.topic, msg.subscription)] = msgpack.packb(
            {"sub_type": msg.sub_type, "cursor": msg.cursor, "acked_above": msg.acked_above,
             "policy": None if msg.policy is None else msg.policy.to_record(),
             "max_unacked_messages": msg.max_unacked_messages})

    def handle_ForgetSubscription(self, msg: ForgetSubscription) -> None:
        key = _subscription_key(msg.topic, msg.subscription)
        self.cursor_writes.pop(key, None)
        assert self.catalog is not None
        self.catalog.delete(key, sync=True)

    def _flush_cursors(self) -> None:
        if self.cursor_writes and self.catalog is not None:
            writes, self.cursor_writes = self.cursor_writes, {}
            self.catalog.write(writes, sync=True)

    async def handle_DeadLetter(self, msg: DeadLetter) -> None:
        try:
            name = parse_topic(msg.topic)
            entry = self.topics.get(name.full)
            if entry is None:
                entry = await self._create_topic(name, 0, cp.DispatchStrategy.RELIABLE)
            if entry.partitions:
                entry = self.topics[name.partition_name(0)]
        except DanubeError as exc:
            log.error("dead letters for %s lost: %s", msg.topic, exc)
            return
        assert entry.endpoint is not None
        await self.system.send(entry.endpoint, AppendInternal(
            producer_name="dead-letter", payloads=msg.payloads, publish_times=msg.publish_times, keys=msg.keys,
            attributes=msg.attributes))

    def handle_ListSnapshotTopics(self, msg: ListSnapshotTopics) -> Message:
        """The reliable topics (partitions) served here, by name or base-topic glob."""
        refs = []
        for name, entry in sorted(self.topics.items()):
            if entry.endpoint is None or entry.dispatch_strategy != cp.DispatchStrategy.RELIABLE:
                continue
            base = entry.name.base.full
            if msg.pattern is not None and not (fnmatch.fnmatchcase(name, msg.pattern)
                                                or fnmatch.fnmatchcase(base, msg.pattern)):
                continue
            refs.append(SnapshotTopicRef(topic=name, endpoint=entry.endpoint, base_topic=base,
                                         partition=entry.name.partition_index))
        return SnapshotTopics(topics=refs)

    def handle_TopicSchemaChanged(self, msg: TopicSchemaChanged) -> None:
        """A binding changed in the metadata store: tell the topic's actors served here."""
        entry = self.topics.get(msg.topic)
        if entry is None:
            return
        names = [entry.name.partition_name(i) for i in range(entry.partitions)] if entry.partitions else [msg.topic]
        for name in names:
            endpoint = self.topics[name].endpoint
            if endpoint is not None:
                self.system.post(endpoint, msg)  # not lost to a full mailbox; revisions keep the order

    # ------------------------------------------------------------- client side
    async def handle_ClientRequest(self, req: ClientRequest) -> None:
        msg = cp.CLIENT_PROTOCOL.decode(req.frame)
        try:
            answer = await self._client_routes[type(msg)](req, msg)
        except DanubeError as exc:
            answer = Error(request_id=msg.request_id, code=exc.code, message=exc.message)
        if answer is not None:
            reply_client(self.system, req.identity, answer)

    async def _lookup(self, req: ClientRequest, msg: cp.Lookup) -> Message:
        self._existing(parse_topic(msg.topic))
        return cp.LookupResult(request_id=msg.request_id, kind=cp.LookupKind.CONNECT, broker_url=self.broker_url)

    async def _get_partitions(self, req: ClientRequest, msg: cp.GetPartitions) -> Message:
        name = parse_topic(msg.topic)
        entry = self.topics.get(name.full)
        if entry is None:
            if not msg.create:
                raise NotFound(f"topic {name.full} does not exist")
            if not self.config.auto_create_topics:
                raise NotFound(f"topic {name.full} does not exist and auto_create_topics is off")
            entry = await self._create_topic(name, msg.partitions, msg.dispatch_strategy)
        elif msg.create:
            _check_shape(entry, msg.partitions, msg.dispatch_strategy)
        return cp.Partitions(request_id=msg.request_id, topic=name.full, partitions=_partition_names(entry))

    async def _create_producer(self, req: ClientRequest, msg: cp.CreateProducer) -> Message | None:
        name = parse_topic(msg.topic)
        entry = self.topics.get(name.full)
        if entry is None:
            if not self.config.auto_create_topics:
                raise NotFound(f"topic {name.full} does not exist and auto_create_topics is off")
            entry = await self._create_topic(name, 0, msg.dispatch_strategy)
        if entry.partitions:
            raise FailedPrecondition(f"topic {name.full} has {entry.partitions} partitions:"
                                     f" attach producers to its partitions {name.partition_name(0)} ...")
        _check_shape(entry, 0, msg.dispatch_strategy)
        return self._forward(entry, req, msg)

    async def _subscribe(self, req: ClientRequest, msg: cp.Subscribe) -> Message | None:
        entry = self._existing(parse_topic(msg.topic))
        if entry.partitions:
            raise FailedPrecondition(f"topic {entry.name.full} has {entry.partitions} partitions:"
                                     f" subscribe to each of its partitions")
        return self._forward(entry, req, msg)

    def _forward(self, entry: TopicEntry, req: ClientRequest, msg: Any) -> Message | None:
        assert entry.endpoint is not None
        if not self.system.tell(entry.endpoint, req):
            raise ResourceExhausted(f"topic {entry.name.full} is busy (full mailbox); retry")
        return None

    def _existing(self, name: TopicName) -> TopicEntry:
        entry = self.topics.get(name.full)
        if entry is None:
            raise NotFound(f"topic {name.full} does not exist")
        return entry

    async def _create_topic(self, name: TopicName, partitions: int, dispatch_strategy: int) -> TopicEntry:
        if name.namespace not in self.namespaces:
            raise NotFound(f"namespace '{name.namespace}' does not exist")
        if partitions < 0 or partitions > 10_000:
            raise InvalidArgument(f"partitions must be 0..10000, got {partitions}")
        if dispatch_strategy not in (cp.DispatchStrategy.NON_RELIABLE, cp.DispatchStrategy.RELIABLE):
            raise InvalidArgument(f"unknown dispatch strategy {dispatch_strategy}")
        base = name.base
        if name.partition_index is not None and base.full in self.topics:
            raise AlreadyExists(f"{name.full} is a partition of {base.full}; it exists only with it")
        names = [name.partition_name(i) for i in range(partitions)] if partitions else [name.full]
        clash = [n for n in names if n in self.topics]
        if clash:
            raise AlreadyExists(f"topic {clash[0]} already exists")
        assert self.catalog is not None
        self.catalog.put(topic_key(name.full), msgpack.packb(
            {"dispatch_strategy": dispatch_strategy, "partitions": partitions}), sync=True)
        entry = await self._open_topic(name, partitions, dispatch_strategy)
        log.info("topic %s created (%d partitions, %s)", name.full, partitions,
                 cp.DispatchStrategy(dispatch_strategy).name.lower())
        return entry

    async def _open_topic(self, name: TopicName, partitions: int, dispatch_strategy: int) -> TopicEntry:
        """Register a topic and start its actors (one per partition)."""
        entry = TopicEntry(name=name, dispatch_strategy=dispatch_strategy, partitions=partitions)
        if partitions:
            for i in range(partitions):
                partition = parse_topic(name.partition_name(i))
                self.topics[partition.full] = await self._spawn_topic(partition, dispatch_strategy)
            self.topics[name.full] = entry
        else:
            entry = await self._spawn_topic(name, dispatch_strategy)
            self.topics[name.full] = entry
        METRICS.topics.set(sum(1 for e in self.topics.values() if e.endpoint is not None))
        return entry

    def _wal_dir(self, name: TopicName) -> Path:
        return self.data_dir / "wal" / name.namespace / name.topic

    async def _spawn_topic(self, name: TopicName, dispatch_strategy: int) -> TopicEntry:
        config, rng, executor, broker = self.config, self.rng, self.executor, self.endpoint
        seed = rng.getrandbits(64)
        if dispatch_strategy == cp.DispatchStrategy.RELIABLE:
            wal_dir = self._wal_dir(name)
            cache_dir = self.data_dir / "durable-cache" / name.namespace / name.topic
            segments = self.segment_catalog

            def factory() -> Actor:
                # Evaluated at each (re)start: a topic restarted after a failure gets the
                # subscriptions, cursors and durable segments as they are now, not as they
                # were when it was first spawned. The parent builds its child's arguments.
                return ReliableTopicActor(
                    name=name.full, config=config, rng=random.Random(seed), wal_dir=wal_dir, executor=executor,
                    subscriptions=self._persisted_subscriptions(name), broker_endpoint=broker,
                    durable=[_durable_segment(d) for d in segments.list(name.full)] if segments else [],
                    cache_dir=cache_dir)
        else:
            factory = lambda: TopicActor(  # noqa: E731
                name=name.full, dispatch_strategy=dispatch_strategy, config=config, rng=random.Random(seed))
        endpoint = await self.system.spawn(factory, name=f"topic {name.full}", parent=self.endpoint)
        return TopicEntry(name=name, dispatch_strategy=dispatch_strategy, endpoint=endpoint)

    async def _delete_durable(self, topic: str) -> None:
        """A deleted topic's durable segments go too: objects first, then descriptors."""
        if self.segment_catalog is None:
            return
        for desc in self.segment_catalog.list(topic):
            if self.durable_store is not None:
                await asyncio.to_thread(self.durable_store.delete, desc.object_key)
            self.segment_catalog.remove(topic, desc.base_offset)

    def _persisted_subscriptions(self, name: TopicName) -> list[SubscriptionState]:
        assert self.catalog is not None
        prefix = f"{topic_key(name.full)}/subscriptions/"
        states = []
        # Cursors not yet flushed are newer than the catalog's.
        records = dict(self.catalog.scan(prefix))
        records.update((k, v) for k, v in self.cursor_writes.items() if k.startswith(prefix))
        for key, value in sorted(records.items()):
            record = msgpack.unpackb(value)
            states.append(SubscriptionState(name=key[len(prefix):].split("/")[0], sub_type=record["sub_type"],
                                            cursor=record["cursor"], acked_above=list(record["acked_above"]),
                                            policy=ip.FailurePolicyState.from_record(record.get("policy")),
                                            max_unacked_messages=record.get("max_unacked_messages")))
        return states

    def handle_ChildStopped(self, msg: ChildStopped) -> None:
        for full, entry in list(self.topics.items()):
            if entry.endpoint == msg.endpoint:
                log.error("topic %s stopped after repeated failures (%s); it is removed", full, msg.reason)
                del self.topics[full]

    # ------------------------------------------------------------- admin side
    async def handle_AdminRequest(self, req: AdminRequest) -> None:
        msg = ap.ADMIN_PROTOCOL.decode(req.frame)
        try:
            answer = await self._admin_routes[type(msg)](msg)
        except DanubeError as exc:
            answer = Error(request_id=msg.request_id, code=exc.code, message=exc.message)
        reply_admin(self.system, req.identity, answer)

    async def _list_namespaces(self, msg: ap.ListNamespaces) -> Message:
        return ap.NamespaceList(request_id=msg.request_id, namespaces=sorted(self.namespaces))

    async def _create_namespace(self, msg: ap.CreateNamespace) -> Message:
        namespace = validate_namespace(msg.namespace)
        if namespace in self.namespaces:
            raise AlreadyExists(f"namespace '{namespace}' already exists")
        self.namespaces.add(namespace)
        assert self.catalog is not None
        self.catalog.put(_namespace_key(namespace), b"", sync=True)
        return Ok(request_id=msg.request_id)

    async def _delete_namespace(self, msg: ap.DeleteNamespace) -> Message:
        namespace = validate_namespace(msg.namespace)
        if namespace not in self.namespaces:
            raise NotFound(f"namespace '{namespace}' does not exist")
        held = [full for full, e in self.topics.items()
                if e.name.namespace == namespace and not self._is_partition_of_partitioned(e)]
        if held:
            raise FailedPrecondition(f"namespace '{namespace}' still has {len(held)} topics; delete them first")
        self.namespaces.discard(namespace)
        assert self.catalog is not None
        self.catalog.delete(_namespace_key(namespace), sync=True)
        return Ok(request_id=msg.request_id)

    async def _list_topics(self, msg: ap.ListTopics) -> Message:
        namespace = validate_namespace(msg.namespace)
        if namespace not in self.namespaces:
            raise NotFound(f"namespace '{namespace}' does not exist")
        topics = [
            ap.TopicInfo(name=full, dispatch_strategy=e.dispatch_strategy, partitions=e.partitions,
                         broker_id=self.broker_id)
            for full, e in sorted(self.topics.items())
            if e.name.namespace == namespace and not self._is_partition_of_partitioned(e)
        ]
        return ap.TopicList(request_id=msg.request_id, topics=topics)

    async def _admin_create_topic(self, msg: ap.CreateTopic) -> Message:
        name = parse_topic(msg.topic)
        if name.full in self.topics:
            raise AlreadyExists(f"topic {name.full} already exists")
        await self._create_topic(name, msg.partitions, msg.dispatch_strategy)
        return Ok(request_id=msg.request_id)

    async def _delete_topic(self, msg: ap.DeleteTopic) -> Message:
        entry = self._existing(parse_topic(msg.topic))
        if self._is_partition_of_partitioned(entry):
            raise FailedPrecondition(f"{entry.name.full} is a partition; delete {entry.name.base.full} instead")
        assert self.catalog is not None
        for partition in _partition_names(entry):
            partition_entry = self.topics.pop(partition)
            if partition_entry.endpoint is not None:
                await self.system.stop(partition_entry.endpoint)
            self._flush_cursors()
            key = topic_key(partition)
            stale = [k for k, _ in self.catalog.scan(f"{key}/")] + [key]
            self.catalog.write({}, stale, sync=True)
            shutil.rmtree(self._wal_dir(parse_topic(partition)), ignore_errors=True)
            partition_name = parse_topic(partition)
            shutil.rmtree(self.data_dir / "durable-cache" / partition_name.namespace / partition_name.topic,
                          ignore_errors=True)
            await self._delete_durable(partition)
        self.topics.pop(entry.name.full, None)
        self.catalog.delete(topic_key(entry.name.full), sync=True)
        METRICS.topics.set(sum(1 for e in self.topics.values() if e.endpoint is not None))
        return Ok(request_id=msg.request_id)

    async def _describe_topic(self, msg: ap.DescribeTopic) -> Message:
        entry = self._existing(parse_topic(msg.topic))
        partitions = []
        for partition in _partition_names(entry):
            endpoint = self.topics[partition].endpoint
            assert endpoint is not None
            stats = await self.system.ask(endpoint, DescribePartition())
            assert isinstance(stats, PartitionStats)
            partitions.append(stats.info)
        return ap.TopicDescription(request_id=msg.request_id, name=entry.name.full,
                                   dispatch_strategy=entry.dispatch_strategy, broker_id=self.broker_id,
                                   partitions=partitions)

    async def _list_subscriptions(self, msg: ap.ListSubscriptions) -> Message:
        described = await self._describe_topic(ap.DescribeTopic(request_id=msg.request_id, topic=msg.topic))
        assert isinstance(described, ap.TopicDescription)
        names = sorted({s.name for p in described.partitions for s in p.subscriptions})
        return ap.SubscriptionList(request_id=msg.request_id, subscriptions=names)

    async def _unsubscribe(self, msg: ap.Unsubscribe) -> Message:
        entry = self._existing(parse_topic(msg.topic))
        found = False
        for partition in _partition_names(entry):
            endpoint = self.topics[partition].endpoint
            assert endpoint is not None
            try:
                await self.system.ask(endpoint, DeleteSubscription(subscription=msg.subscription))
                found = True
            except NotFound:
                continue
        if not found:
            raise NotFound(f"subscription '{msg.subscription}' does not exist on topic {entry.name.full}")
        return Ok(request_id=msg.request_id)

    async def _list_brokers(self, msg: ap.ListBrokers) -> Message:
        info = ap.BrokerInfo(broker_id=self.broker_id, broker_url=self.broker_url, admin_url=self.admin_url,
                             metrics_url=self.metrics_url, role="standalone", status="active")
        return ap.BrokerList(request_id=msg.request_id, brokers=[info])

    # ------------------------------------------------------------- admin: reliable subscriptions
    async def _seek_subscription(self, msg: ap.SeekSubscription) -> Message:
        entry = self._reliable_entry(msg.topic)
        if entry.partitions and msg.offset is not None:
            raise InvalidArgument(f"topic {entry.name.full} has {entry.partitions} partitions and offsets are per"
                                  f" partition: seek by publish time, or name one partition topic"
                                  f" ({entry.name.partition_name(0)} ...)")
        for partition in _partition_names(entry):
            endpoint = self.topics[partition].endpoint
            assert endpoint is not None
            await self.system.ask(endpoint, ip.SeekCursor(
                subscription=msg.subscription, offset=msg.offset, publish_time=msg.publish_time))
        return Ok(request_id=msg.request_id)

    async def _set_failure_policy(self, msg: ap.SetFailurePolicy) -> Message:
        entry = self._reliable_entry(msg.topic)
        policy = ip.FailurePolicyState(
            max_redelivery_count=msg.max_redelivery_count, ack_timeout_ms=msg.ack_timeout_ms,
            base_redelivery_delay_ms=msg.base_redelivery_delay_ms, max_redelivery_delay_ms=msg.max_redelivery_delay_ms,
            backoff=msg.backoff, poison_policy=msg.poison_policy, dead_letter_topic=msg.dead_letter_topic)
        for partition in _partition_names(entry):
            endpoint = self.topics[partition].endpoint
            assert endpoint is not None
            record = await self.system.ask(endpoint, ip.SetSubscriptionPolicy(subscription=msg.subscription,
                                                                              policy=policy))
            assert isinstance(record, PersistCursor)
            self.handle_PersistCursor(record)
        self._flush_cursors()  # stored before the answer: the policy survives a crash right after
        return Ok(request_id=msg.request_id)

    async def _get_failure_policy(self, msg: ap.GetFailurePolicy) -> Message:
        entry = self._reliable_entry(msg.topic)
        endpoint = self.topics[_partition_names(entry)[0]].endpoint
        assert endpoint is not None
        answer = await self.system.ask(endpoint, ip.GetSubscriptionPolicy(subscription=msg.subscription))
        assert isinstance(answer, ip.SubscriptionPolicy)
        policy = answer.policy
        return ap.FailurePolicyInfo(
            request_id=msg.request_id, max_redelivery_count=policy.max_redelivery_count,
            ack_timeout_ms=policy.ack_timeout_ms, base_redelivery_delay_ms=policy.base_redelivery_delay_ms,
            max_redelivery_delay_ms=policy.max_redelivery_delay_ms, backoff=policy.backoff,
            poison_policy=policy.poison_policy, dead_letter_topic=policy.dead_letter_topic, explicit=answer.explicit)

    async def _set_dispatch_config(self, msg: ap.SetDispatchConfig) -> Message:
        entry = self._reliable_entry(msg.topic)
        for partition in _partition_names(entry):
            endpoint = self.topics[partition].endpoint
            assert endpoint is not None
            record = await self.system.ask(endpoint, ip.SetSubscriptionDispatchConfig(
                subscription=msg.subscription, max_unacked_messages=msg.max_unacked_messages))
            assert isinstance(record, PersistCursor)
            self.handle_PersistCursor(record)
        self._flush_cursors()  # stored before the answer, as the failure policy
        return Ok(request_id=msg.request_id)

    async def _get_dispatch_config(self, msg: ap.GetDispatchConfig) -> Message:
        entry = self._reliable_entry(msg.topic)
        endpoint = self.topics[_partition_names(entry)[0]].endpoint
        assert endpoint is not None
        answer = await self.system.ask(endpoint, ip.GetSubscriptionDispatchConfig(subscription=msg.subscription))
        assert isinstance(answer, ip.SubscriptionDispatchConfig)
        return ap.DispatchConfigInfo(request_id=msg.request_id, max_unacked_messages=answer.max_unacked_messages,
                                     explicit=answer.explicit)

    def _reliable_entry(self, topic: str) -> TopicEntry:
        entry = self._existing(parse_topic(topic))
        if entry.dispatch_strategy != cp.DispatchStrategy.RELIABLE:
            raise FailedPrecondition(f"topic {entry.name.full} is not reliable: seek, failure policies and dispatch"
                                     " windows apply to subscriptions of reliable topics only")
        return entry

    def _is_partition_of_partitioned(self, entry: TopicEntry) -> bool:
        base = entry.name.base
        return entry.name.partition_index is not None and base.full in self.topics \
            and self.topics[base.full].partitions > 0


_NAMESPACES = "/namespaces/"


def _namespace_key(namespace: str) -> str:
    return f"{_NAMESPACES}{namespace}"


def _subscription_key(topic: str, subscription: str) -> str:
    # Not storage.catalog.cursor_key: the record holds the subscription's type too.
    return f"{topic_key(topic)}/subscriptions/{subscription}"


def _durable_segment(desc: SegmentDescriptor) -> DurableSegment:
    return DurableSegment(base_offset=desc.base_offset, end_offset=desc.end_offset, object_key=desc.object_key,
                          size_bytes=desc.size_bytes, crc32c=desc.crc32c, created_ms=desc.created_ms)


def _partition_names(entry: TopicEntry) -> list[str]:
    if entry.partitions:
        return [entry.name.partition_name(i) for i in range(entry.partitions)]
    return [entry.name.full]


def _check_shape(entry: TopicEntry, partitions: int, dispatch_strategy: int) -> None:
    if entry.dispatch_strategy != dispatch_strategy:
        have = cp.DispatchStrategy(entry.dispatch_strategy).name.lower()
        want = cp.DispatchStrategy(dispatch_strategy).name.lower() if dispatch_strategy in (0, 1) \
            else str(dispatch_strategy)
        raise FailedPrecondition(f"topic {entry.name.full} is {have}; a {want} producer cannot attach")
    if partitions and entry.partitions != partitions:
        raise FailedPrecondition(f"topic {entry.name.full} has {entry.partitions} partitions,"
                                 f" the producer asked for {partitions}")

"""The broker actor: the registry of namespaces and topics of one broker.

It answers the requests that need to know which topics exist (lookup, partition
discovery, producer creation, subscribe) and the admin requests, and it is the
parent of every topic actor. Creating a topic spawns its actor (one per partition);
deleting it stops the actor, whose `on_stop` tells its clients.

Until the Raft metadata store exists, this registry lives in memory: namespaces and
topics last as long as the broker process.

1. Client request -> validate the name -> create when allowed -> forward the frame
   to the topic actor, which answers the client.
2. Admin request -> change the registry -> answer on the admin outbox.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass
from typing import Any

from danube_zmq.actors.actor import Actor
from danube_zmq.actors.admin_gateway import reply_admin
from danube_zmq.actors.config import BrokerConfig
from danube_zmq.actors.gateway import reply_client
from danube_zmq.actors.metrics import METRICS
from danube_zmq.actors.topic import TopicActor
from danube_zmq.actors.topic_name import TopicName, parse_topic, validate_namespace
from danube_zmq.transport import admin_protocol as ap
from danube_zmq.transport import client_protocol as cp
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
    ChildStopped,
    ClientRequest,
    DeleteSubscription,
    DescribePartition,
    PartitionStats,
)

log = logging.getLogger("danube_zmq.broker")


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
                 metrics_url: str | None, rng: random.Random) -> None:
        self.config = config
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
        }

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
        if dispatch_strategy == cp.DispatchStrategy.RELIABLE:
            # The dispatch choice is made here already; the WAL that reliable topics
            # need is not part of this build yet, so say so instead of pretending.
            raise FailedPrecondition("reliable dispatch is not available in this build yet;"
                                     " use the non_reliable dispatch strategy")
        base = name.base
        if name.partition_index is not None and base.full in self.topics:
            raise AlreadyExists(f"{name.full} is a partition of {base.full}; it exists only with it")
        names = [name.partition_name(i) for i in range(partitions)] if partitions else [name.full]
        clash = [n for n in names if n in self.topics]
        if clash:
            raise AlreadyExists(f"topic {clash[0]} already exists")
        entry = TopicEntry(name=name, dispatch_strategy=dispatch_strategy, partitions=partitions)
        if partitions:
            for partition in names:
                self.topics[partition] = await self._spawn_topic(parse_topic(partition), dispatch_strategy)
            self.topics[name.full] = entry
        else:
            entry = await self._spawn_topic(name, dispatch_strategy)
            self.topics[name.full] = entry
        METRICS.topics.set(sum(1 for e in self.topics.values() if e.endpoint is not None))
        log.info("topic %s created (%d partitions, %s)", name.full, partitions,
                 cp.DispatchStrategy(dispatch_strategy).name.lower())
        return entry

    async def _spawn_topic(self, name: TopicName, dispatch_strategy: int) -> TopicEntry:
        config, rng = self.config, self.rng
        endpoint = await self.system.spawn(
            lambda: TopicActor(name=name.full, dispatch_strategy=dispatch_strategy, config=config,
                               rng=random.Random(rng.getrandbits(64))),
            name=f"topic {name.full}", parent=self.endpoint)
        return TopicEntry(name=name, dispatch_strategy=dispatch_strategy, endpoint=endpoint)

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
        for partition in _partition_names(entry):
            partition_entry = self.topics.pop(partition)
            if partition_entry.endpoint is not None:
                await self.system.stop(partition_entry.endpoint)
        self.topics.pop(entry.name.full, None)
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

    def _is_partition_of_partitioned(self, entry: TopicEntry) -> bool:
        base = entry.name.base
        return entry.name.partition_index is not None and base.full in self.topics \
            and self.topics[base.full].partitions > 0


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

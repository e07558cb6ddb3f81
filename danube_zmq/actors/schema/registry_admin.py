"""The registry admin: a child of the broker actor that answers the admin requests
about namespaces, topic records and brokers (`REGISTRY_REQUESTS`), all read and
written in the metadata store on any broker. The admin gateway sends them here
directly.

- Namespaces: listed, created, deleted (only when empty; its policies go with it).
- Topics: listed with the broker each partition is assigned to, created
  (`topic_catalog.py`: the record and an unassigned marker per partition; the load
  manager places them and their brokers load them).
- Brokers: listed from their registrations and leases (`broker_listing.py`).
- The client port's `GetTopicsOfNamespace` (a pattern subscription's listing), which
  the client gateway sends here: the names `ListTopics` lists, a page at a time
  (`namespace_topics_page`).

Deleting a topic is the broker's (it unloads what it serves of it): `topic_admin.py`.
The broker tells this actor `BrokerJoined` once its bootstrap namespaces are written.
"""

from __future__ import annotations

from danube_zmq.actors.broker.broker_listing import Registered, broker_rows
from danube_zmq.actors.broker.topic_catalog import TopicCatalog
from danube_zmq.actors.broker.topic_registry import Registry
from danube_zmq.config.broker_config import BrokerConfig
from danube_zmq.consensus.metadata_store import RaftMetadataStore
from danube_zmq.runtime.actor import Actor, Origin
from danube_zmq.transport import admin_protocol as ap
from danube_zmq.transport import client_protocol as cp
from danube_zmq.transport import cluster_records as cr
from danube_zmq.transport.codec import Message
from danube_zmq.transport.common import Ok
from danube_zmq.transport.errors import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound
from danube_zmq.transport.internal_protocol import BrokerJoined
from danube_zmq.transport.topic_name import parse_topic, validate_namespace

__all__ = ["RegistryAdmin", "namespace_topics_page"]

# msgpack's str header, at most 3 bytes for a name of up to 512 characters.
_NAME_OVERHEAD_BYTES = 3


def namespace_topics_page(keys: list[str], namespace: str, start_after: str | None, *,
                          names_max: int, bytes_max: int) -> tuple[list[str], bool]:
    """The topics of `namespace` from the metadata keys under its topics prefix (in key
    order, which is name order): the topic records' names after `start_after`, at most
    `names_max` of them and, past the first, no more than `bytes_max` bytes of names
    on the wire; and whether more follow. Subscriptions' and producers' keys under a
    topic are not topics; a partitioned topic has one record, its base name's."""
    assert names_max >= 1
    prefix = f"{cr.TOPICS}{namespace}/"
    page: list[str] = []
    size = 0
    for key in keys:
        # /topics/{ns}/{topic}: anything deeper is a topic's own record (a cursor, a producer).
        if key.count("/") != 3 or not key.startswith(prefix):
            continue
        name = cr.topic_of(key, cr.TOPICS)
        if start_after is not None and name <= start_after:
            continue
        size += len(name) + _NAME_OVERHEAD_BYTES
        if len(page) == names_max or (page and size > bytes_max):
            return page, True
        page.append(name)
    return page, False


class RegistryAdmin(Actor):
    def __init__(self, *, metadata: RaftMetadataStore, config: BrokerConfig, broker_id: int, broker_url: str) -> None:
        self.metadata = metadata
        self.config = config
        self.broker_url = broker_url
        self.registry = Registry(metadata, broker_id, config.bootstrap_namespaces)
        self.catalog: TopicCatalog  # built at start (it reads the system's clock)

    async def on_start(self) -> None:
        self.catalog = TopicCatalog(metadata=self.metadata, registry=self.registry, config=self.config,
                                    clock=self.system.clock)

    def handle_BrokerJoined(self, msg: BrokerJoined) -> None:
        self.registry.joined = True

    async def handle_ListNamespaces(self, msg: ap.ListNamespaces, origin: Origin) -> Message:
        names = [key[len(cr.NAMESPACES):] for key, _ in await self.metadata.list_prefix(cr.NAMESPACES)]
        return ap.NamespaceList(request_id=msg.request_id, namespaces=sorted(names))

    async def handle_CreateNamespace(self, msg: ap.CreateNamespace, origin: Origin) -> Message:
        namespace = validate_namespace(msg.namespace)
        created = await self.metadata.compare_and_swap(cr.namespace_key(namespace), 0, b"")
        if not created.succeeded:
            raise AlreadyExists(f"namespace '{namespace}' already exists")
        return Ok(request_id=msg.request_id)

    async def handle_DeleteNamespace(self, msg: ap.DeleteNamespace, origin: Origin) -> Message:
        namespace = validate_namespace(msg.namespace)
        key = cr.namespace_key(namespace)
        current = await self.metadata.get(key)
        if current is None:
            raise NotFound(f"namespace '{namespace}' does not exist")
        held = await self._topic_records(namespace)
        if held:
            raise FailedPrecondition(f"namespace '{namespace}' still has {len(held)} topics; delete them first")
        if not await self.metadata.transaction({key: current.version}, {},
                                               [key, cr.namespace_backlog_quota_key(namespace),
                                                cr.namespace_limits_key(namespace),
                                                cr.auto_topic_creation_key(namespace),
                                                cr.namespace_topic_policies_key(namespace)]):
            raise FailedPrecondition(f"namespace '{namespace}' changed meanwhile; retry")
        return Ok(request_id=msg.request_id)

    async def _topic_records(self, namespace: str) -> list[tuple[str, cr.TopicRecord]]:
        prefix = f"{cr.TOPICS}{namespace}/"
        return [(cr.topic_of(key, cr.TOPICS), cr.decode(value.value, cr.TopicRecord))
                for key, value in await self.metadata.list_prefix(prefix) if key.count("/") == 3]

    async def handle_ListTopics(self, msg: ap.ListTopics, origin: Origin) -> Message:
        namespace = validate_namespace(msg.namespace)
        if not await self.registry.namespace_exists(namespace):
            raise NotFound(f"namespace '{namespace}' does not exist")
        topics = []
        for full, record in await self._topic_records(namespace):
            name = parse_topic(full)
            names = [name.partition_name(i) for i in range(record.partitions)] if record.partitions else [full]
            owners = [self.registry.owner_of(n, self.broker_url) for n in names]
            topics.append(ap.TopicInfo(name=full, dispatch_strategy=record.dispatch_strategy,
                                       partitions=record.partitions, broker_id=owners[0].broker_id or 0,
                                       owners=owners))
        return ap.TopicList(request_id=msg.request_id, topics=topics)

    async def handle_GetTopicsOfNamespace(self, msg: cp.GetTopicsOfNamespace, origin: Origin) -> Message:
        """A client's listing (Lookup on the namespace, checked by its gateway): the
        topic records ListTopics reads, read linearizably, so every broker answers the
        same. A page ends at TOPICS_OF_NAMESPACE_PAGE_MAX names, or before the names take
        half of `limits.frame_bytes_max`: the answer always fits a frame."""
        namespace = await self.registry.existing_namespace(msg.namespace)
        if msg.start_after is not None and parse_topic(msg.start_after).namespace != namespace:
            raise InvalidArgument(f"start_after names topic {msg.start_after}, which is not in namespace '{namespace}'")
        keys = [key for key, _ in await self.metadata.list_prefix(f"{cr.TOPICS}{namespace}/")]
        topics, more = namespace_topics_page(keys, namespace, msg.start_after,
                                             names_max=cp.TOPICS_OF_NAMESPACE_PAGE_MAX,
                                             bytes_max=self.config.limits.frame_bytes_max // 2)
        return cp.TopicsOfNamespace(request_id=msg.request_id, namespace=namespace, topics=topics, more=more)

    async def handle_CreateTopic(self, msg: ap.CreateTopic, origin: Origin) -> Message:
        await self.catalog.write(parse_topic(msg.topic), msg.partitions, msg.dispatch_strategy)
        return Ok(request_id=msg.request_id)

    async def handle_ListBrokers(self, msg: ap.ListBrokers, origin: Origin) -> Message:
        await self.metadata.get(cr.LEADER)  # a linearizable barrier: registrations as of now
        store = self.metadata
        leader = store.local_get(cr.LEADER)
        leader_id = cr.decode(leader.value, cr.LeaderRecord).broker_id if leader is not None else None
        registered = []
        for key, value in store.local_scan(cr.REGISTER):
            registration = cr.decode(value.value, cr.BrokerRegistration)
            mode = store.local_get(cr.state_key(registration.broker_id))
            registered.append(Registered(
                registration=registration, renewing=not store.stopped_renewing(key),
                mode=str(cr.decode(mode.value, cr.BrokerStateRecord).mode if mode is not None else cr.BrokerMode.ACTIVE)))
        seen = [cr.decode(value.value, cr.BrokerRegistration)
                for key, value in store.local_scan(cr.BROKERS) if key.endswith("/seen")]
        members = {member.node_id for member in store.members()}
        return ap.BrokerList(request_id=msg.request_id, brokers=broker_rows(
            registered, seen, members, leader_id, standalone=self.config.cluster.raft_listen is None))


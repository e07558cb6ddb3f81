"""The admin client: one asyncio method per admin operation, over one zmq DEALER.

    AdminClient ── DEALER ──tcp──▶ ROUTER (broker admin port, default 50051)

1. `connect()` sends `Connect` and waits for `Connected` (or `Error`).
2. Each method sends one request with a fresh `request_id` and waits for the
   reply carrying the same id: `Ok`, the operation's reply, or `Error`, which is
   raised as the `DanubeError` subclass of its code.
3. No reply within `timeout_ms` is `Unavailable` naming the endpoint. A late
   reply to a request that already timed out is recognised by its id and dropped.
   A request refused by a broker still starting (`BROKER_STARTING`) is sent again
   within that time.

Requests go one at a time (admin traffic is low-rate), so there is no pending
map: the caller awaits each reply before sending the next request.

    async with AdminClient("tcp://127.0.0.1:50051") as admin:
        await admin.create_namespace("orders")
        await admin.create_topic("/orders/eu", partitions=3)
"""

from __future__ import annotations

import asyncio
from typing import Any, TypeVar

from danube_zmq.client.client import parse_enum
from danube_zmq.rpc.request_client import RequestClient, check_endpoint
from danube_zmq.transport import admin_protocol as ap
from danube_zmq.transport.admin_protocol import (
    ADMIN_PROTOCOL,
    ActivateBroker,
    AddClusterNode,
    AutoTopicCreationInfo,
    BacklogQuotaInfo,
    BrokerInfo,
    BrokerList,
    ClusterBalance,
    ClusterStatus,
    ClusterStatusInfo,
    CompactTopic,
    ConfigureTopicSchema,
    CreateNamespace,
    CreateSnapshot,
    CreateTopic,
    DeleteNamespace,
    DeleteSnapshot,
    DeleteTopic,
    DescribeSnapshot,
    DescribeTopic,
    DispatchConfigInfo,
    FailurePolicyInfo,
    GetAutoTopicCreation,
    GetBacklogQuota,
    GetClusterBalance,
    GetDispatchConfig,
    GetFailurePolicy,
    GetNamespaceLimits,
    GetTopicPolicies,
    GetTopicSchemaConfig,
    ListBrokers,
    ListNamespaces,
    ListSnapshots,
    ListSubscriptions,
    ListTopics,
    MetadataCompareAndSwap,
    MetadataDelete,
    MetadataEntries,
    MetadataEntry,
    MetadataGet,
    MetadataList,
    MetadataPut,
    MetadataWritten,
    NamespaceLimitsInfo,
    NamespaceList,
    PromoteClusterNode,
    ReassignTopic,
    RebalanceCluster,
    Rebalanced,
    RemoveAutoTopicCreation,
    RemoveBacklogQuota,
    RemoveClusterNode,
    RemoveNamespaceLimits,
    RemoveTopicPolicies,
    RepairTopic,
    SeekSubscription,
    SetAutoTopicCreation,
    SetBacklogQuota,
    SetDispatchConfig,
    SetFailurePolicy,
    SetNamespaceLimits,
    SetTopicPolicies,
    SnapshotCreated,
    SnapshotDescription,
    SnapshotList,
    SubscriptionList,
    TopicDescription,
    TopicInfo,
    TopicList,
    TopicPoliciesInfo,
    TopicReassignment,
    TopicRepaired,
    TopicSchemaConfigInfo,
    UnloadBroker,
    UnloadTopic,
    Unsubscribe,
)
from danube_zmq.transport.client_protocol import DispatchStrategy
from danube_zmq.transport.codec import Message
from danube_zmq.transport.common import Ok
from danube_zmq.transport.errors import FailedPrecondition, InvalidArgument, PermissionDenied, Timeout
from danube_zmq.transport.topic_name import parse_topic, validate_namespace

__all__ = ["AdminClient", "broker_label", "check_endpoint"]


def broker_label(broker_id: int | None, names: dict[int, str]) -> str:
    """`broker-2 (7212...)`: a broker's name beside its id, wherever a broker is named."""
    if broker_id is None:
        return "unassigned"
    name = names.get(broker_id)
    return f"{name} ({broker_id})" if name else str(broker_id)


class AdminClient(RequestClient):
    """Async client for the broker's admin API; use as `async with AdminClient(url)`."""

    PROTOCOL = ADMIN_PROTOCOL
    WHAT = "admin endpoint"

    def __init__(self, endpoint: str, *, timeout_ms: int = 5000, client_name: str = "danube-admin",
                 **curve: Any) -> None:
        """`curve`: server_public_key, client_keys, token, token_provider, use_env, as `RequestClient`."""
        super().__init__(endpoint, timeout_ms=timeout_ms, client_name=client_name, **curve)

    async def perform(self, request: type[Message], **params: Any) -> Message:
        """Any admin operation by its request type (transport/admin_operations.py): its
        reply (`Ok` for one that answers nothing more), or the broker's refusal raised."""
        return await self._call(lambda rid: request(request_id=rid, **params), Message)

    # -- namespaces ------------------------------------------------------

    async def list_namespaces(self) -> list[str]:
        reply = await self._call(lambda rid: ListNamespaces(request_id=rid), NamespaceList)
        return reply.namespaces

    async def create_namespace(self, namespace: str) -> None:
        validate_namespace(namespace)
        await self._call(lambda rid: CreateNamespace(request_id=rid, namespace=namespace), Ok)

    async def delete_namespace(self, namespace: str) -> None:
        validate_namespace(namespace)
        await self._call(lambda rid: DeleteNamespace(request_id=rid, namespace=namespace), Ok)

    # -- limits per namespace (over the broker's policies) -----------------

    async def set_namespace_limits(self, namespace: str, *, topics_max: int | None = None,
                                   partitions_max: int | None = None) -> None:
        """Set the most topics `namespace` may hold (each partition counted as one) and/or
        the most partitions one of its topics may have, over the broker's policies. Only
        the limits given change."""
        validate_namespace(namespace)
        await self._call(lambda rid: SetNamespaceLimits(request_id=rid, namespace=namespace, topics_max=topics_max,
                                                        partitions_max=partitions_max), Ok)

    async def get_namespace_limits(self, namespace: str) -> NamespaceLimitsInfo:
        """The limits in force for `namespace` and where each is set (`*_source`)."""
        validate_namespace(namespace)
        return await self._call(lambda rid: GetNamespaceLimits(request_id=rid, namespace=namespace),
                                NamespaceLimitsInfo)

    async def remove_namespace_limits(self, namespace: str) -> None:
        validate_namespace(namespace)
        await self._call(lambda rid: RemoveNamespaceLimits(request_id=rid, namespace=namespace), Ok)

    # -- auto topic creation per namespace (over the broker's policies) ------

    async def set_namespace_auto_topic_creation(
        self,
        namespace: str,
        *,
        allow_auto_topic_creation: bool | None = None,
        allow_auto_topic_creation_type: str | None = None,
        default_num_partitions: int | None = None,
        auto_topic_creation_dispatch: DispatchStrategy | str | None = None,
    ) -> None:
        """Set whether a subscriber creates a missing topic of `namespace` (Pulsar's
        allowAutoTopicCreation) and what it creates: `allow_auto_topic_creation_type`
        "non-partitioned" or "partitioned" (with `default_num_partitions`), and
        `auto_topic_creation_dispatch` (the enum or its name). Only those given change."""
        validate_namespace(namespace)
        kind = allow_auto_topic_creation_type
        if kind is not None:
            if not isinstance(kind, str):
                raise InvalidArgument(f"allow_auto_topic_creation_type must be a str, got {kind!r}")
            kind = kind.strip().lower().replace("_", "-")
        dispatch = None if auto_topic_creation_dispatch is None else parse_enum(
            auto_topic_creation_dispatch, DispatchStrategy, "auto_topic_creation_dispatch").name.lower()
        await self._call(lambda rid: SetAutoTopicCreation(
            request_id=rid, namespace=namespace, allow_auto_topic_creation=allow_auto_topic_creation,
            allow_auto_topic_creation_type=kind, default_num_partitions=default_num_partitions,
            auto_topic_creation_dispatch=dispatch), Ok)

    async def get_namespace_auto_topic_creation(self, namespace: str) -> AutoTopicCreationInfo:
        """The auto topic creation policy in force for `namespace` and where each is set."""
        validate_namespace(namespace)
        return await self._call(lambda rid: GetAutoTopicCreation(request_id=rid, namespace=namespace),
                                AutoTopicCreationInfo)

    async def remove_namespace_auto_topic_creation(self, namespace: str) -> None:
        validate_namespace(namespace)
        await self._call(lambda rid: RemoveAutoTopicCreation(request_id=rid, namespace=namespace), Ok)

    # -- backlog quotas (a topic's over its namespace's over the broker's) -----

    async def set_namespace_backlog_quota(self, namespace: str, *, limit_bytes: int, policy: str) -> None:
        """Set the backlog quota of every reliable topic of `namespace` without one of its
        own: at most `limit_bytes` (0: no limit) unacknowledged by the slowest
        subscription, then `policy` (producer_request_hold, producer_exception,
        consumer_backlog_eviction). Applies to live topics at once; stored."""
        validate_namespace(namespace)
        await self._call(lambda rid: SetBacklogQuota(request_id=rid, namespace=namespace, limit_bytes=limit_bytes,
                                                     policy=policy), Ok)

    async def get_namespace_backlog_quota(self, namespace: str) -> BacklogQuotaInfo:
        validate_namespace(namespace)
        return await self._call(lambda rid: GetBacklogQuota(request_id=rid, namespace=namespace), BacklogQuotaInfo)

    async def remove_namespace_backlog_quota(self, namespace: str) -> None:
        validate_namespace(namespace)
        await self._call(lambda rid: RemoveBacklogQuota(request_id=rid, namespace=namespace), Ok)

    async def set_topic_backlog_quota(self, topic: str, *, limit_bytes: int, policy: str) -> None:
        """As `set_namespace_backlog_quota`, for reliable `topic` (every partition): it
        overrides its namespace's."""
        parse_topic(topic)
        await self._call(lambda rid: SetBacklogQuota(request_id=rid, topic=topic, limit_bytes=limit_bytes,
                                                     policy=policy), Ok)

    async def get_topic_backlog_quota(self, topic: str) -> BacklogQuotaInfo:
        """The quota in force for `topic` and where it is set (`source`)."""
        parse_topic(topic)
        return await self._call(lambda rid: GetBacklogQuota(request_id=rid, topic=topic), BacklogQuotaInfo)

    async def remove_topic_backlog_quota(self, topic: str) -> None:
        parse_topic(topic)
        await self._call(lambda rid: RemoveBacklogQuota(request_id=rid, topic=topic), Ok)

    # -- topic policies (a topic's over its namespace's over the broker's) -----

    async def set_namespace_policies(self, namespace: str, **policies: int | None) -> None:
        """Set topic policies of `namespace` (keyword per policy, the broker's `policies`
        names: max_producers_per_topic, ..., max_publish_rate, max_dispatch_rate,
        retention_*, subscription_expiration_ms, message_ttl_s; 0: unlimited, kept, never;
        deduplication 1: on, 0: off); only those
        given (not None) change. Applies to live topics at once."""
        validate_namespace(namespace)
        await self._call(lambda rid: SetTopicPolicies(request_id=rid, namespace=namespace, **policies), Ok)

    async def get_namespace_policies(self, namespace: str) -> TopicPoliciesInfo:
        """The topic policies in force for the topics of `namespace` and where each is set."""
        validate_namespace(namespace)
        return await self._call(lambda rid: GetTopicPolicies(request_id=rid, namespace=namespace), TopicPoliciesInfo)

    async def remove_namespace_policies(self, namespace: str) -> None:
        validate_namespace(namespace)
        await self._call(lambda rid: RemoveTopicPolicies(request_id=rid, namespace=namespace), Ok)

    async def set_topic_policies(self, topic: str, **policies: int | None) -> None:
        """As `set_namespace_policies`, for `topic` (every partition), over its namespace's."""
        parse_topic(topic)
        await self._call(lambda rid: SetTopicPolicies(request_id=rid, topic=topic, **policies), Ok)

    async def get_topic_policies(self, topic: str) -> TopicPoliciesInfo:
        parse_topic(topic)
        return await self._call(lambda rid: GetTopicPolicies(request_id=rid, topic=topic), TopicPoliciesInfo)

    async def remove_topic_policies(self, topic: str) -> None:
        parse_topic(topic)
        await self._call(lambda rid: RemoveTopicPolicies(request_id=rid, topic=topic), Ok)

    # -- topics ------------------------------------------------------------

    async def list_topics(self, namespace: str) -> list[TopicInfo]:
        validate_namespace(namespace)
        reply = await self._call(lambda rid: ListTopics(request_id=rid, namespace=namespace), TopicList)
        return reply.topics

    async def create_topic(
        self,
        topic: str,
        partitions: int = 0,
        dispatch_strategy: DispatchStrategy | str = DispatchStrategy.NON_RELIABLE,
    ) -> None:
        """Create `topic`; `partitions` > 0 creates `topic-part-0..N-1`. `dispatch_strategy`:
        the enum, or its name in any case ("reliable", "non-reliable"), as a producer's."""
        parse_topic(topic)
        strategy = parse_enum(dispatch_strategy, DispatchStrategy, "dispatch_strategy")
        if type(partitions) is not int or partitions < 0:
            raise InvalidArgument(f"partitions must be an int >= 0, got {partitions!r}")
        await self._call(
            lambda rid: CreateTopic(
                request_id=rid,
                topic=topic,
                partitions=partitions,
                dispatch_strategy=int(strategy),
            ),
            Ok,
        )

    async def delete_topic(self, topic: str) -> None:
        parse_topic(topic)
        await self._call(lambda rid: DeleteTopic(request_id=rid, topic=topic), Ok)

    async def cluster_balance(self) -> ClusterBalance:
        """The coefficient of variation of broker load and each broker's load, as the
        leader's load manager sees them."""
        return await self._call(lambda rid: GetClusterBalance(request_id=rid), ClusterBalance)

    async def rebalance(self, *, dry_run: bool = False, max_moves: int | None = None) -> Rebalanced:
        """Plan a rebalancing round now and (unless `dry_run`) start its moves."""
        if max_moves is not None and max_moves < 1:
            raise InvalidArgument(f"max_moves must be >= 1, got {max_moves}")
        return await self._call(lambda rid: RebalanceCluster(request_id=rid, dry_run=dry_run, max_moves=max_moves),
                                Rebalanced)

    async def unload_broker(self, broker_id: int) -> Rebalanced:
        """Drain broker `broker_id`: no new topics, and each of its topics moves away."""
        return await self._call(lambda rid: UnloadBroker(request_id=rid, broker_id=broker_id), Rebalanced)

    async def activate_broker(self, broker_id: int) -> None:
        """Let broker `broker_id` take topics again."""
        await self._call(lambda rid: ActivateBroker(request_id=rid, broker_id=broker_id), Ok)

    async def unload_topic(self, topic: str, *, timeout_ms: int = 120_000) -> None:
        """Move `topic` (each partition) off its broker: sealed there, then served by
        another one the load manager picks. Returns once the move is recorded; in
        storage.mode local a reliable topic's WAL is handed to the next broker first,
        and this returns once it serves the topic (or raises why the move was refused:
        the topic then stays where it was)."""
        parse_topic(topic)
        await self._call(lambda rid: UnloadTopic(request_id=rid, topic=topic), Ok, timeout_ms=timeout_ms)

    async def compact_topic(self, topic: str) -> None:
        """Start compacting `topic` (each partition of a reliable topic): the latest
        message per key below its committed end, in the background. Its progress is in
        `describe_topic` (`PartitionInfo.compaction`); `wait_for_compaction` waits."""
        parse_topic(topic)
        await self._call(lambda rid: CompactTopic(request_id=rid, topic=topic), Ok)

    async def wait_for_compaction(self, topic: str, *, timeout_s: float = 600.0) -> TopicDescription:
        """The description of `topic` once no partition is being compacted; raises
        FAILED_PRECONDITION naming a partition whose compaction failed, and TIMEOUT
        after `timeout_s`."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        while True:
            described = await self.describe_topic(topic)
            states = [(p.name, p.compaction or "") for p in described.partitions]
            failed = [f"{name}: {state}" for name, state in states if state.startswith("failed")]
            if failed:
                raise FailedPrecondition("compaction " + "; ".join(failed))
            if not any(state == "running" for _, state in states):
                return described
            if asyncio.get_running_loop().time() > deadline:
                raise Timeout(f"topic {topic} still being compacted after {timeout_s:g} s")
            await asyncio.sleep(0.1)

    async def repair_topic(self, topic: str, *, accept_loss: bool) -> TopicRepaired:
        """What repairing `topic`'s damaged WAL gives up; with `accept_loss`, do it and
        serve the topic again (offsets continue past every one given out)."""
        parse_topic(topic)
        return await self._call(lambda rid: RepairTopic(request_id=rid, topic=topic, accept_loss=accept_loss),
                                TopicRepaired)

    async def reassign_topic(self, topic: str, *, force: bool) -> TopicReassignment:
        """What forcing `topic` (storage.mode local, its broker gone) onto another broker
        gives up; with `force`, do it: the load manager places it on a live broker."""
        parse_topic(topic)
        return await self._call(lambda rid: ReassignTopic(request_id=rid, topic=topic, force=force),
                                TopicReassignment)

    async def describe_topic(self, topic: str) -> TopicDescription:
        parse_topic(topic)
        return await self._call(lambda rid: DescribeTopic(request_id=rid, topic=topic), TopicDescription)

    # -- subscriptions -----------------------------------------------------

    async def list_subscriptions(self, topic: str) -> list[str]:
        parse_topic(topic)
        reply = await self._call(
            lambda rid: ListSubscriptions(request_id=rid, topic=topic), SubscriptionList
        )
        return reply.subscriptions

    async def unsubscribe(self, topic: str, subscription: str) -> None:
        parse_topic(topic)
        if not subscription:
            raise InvalidArgument("subscription name must not be empty")
        await self._call(
            lambda rid: Unsubscribe(request_id=rid, topic=topic, subscription=subscription), Ok
        )

    async def seek_subscription(
        self, topic: str, subscription: str, *, offset: int | None = None, publish_time: int | None = None
    ) -> None:
        """Move a subscription of a reliable topic to `offset`, or to the first message
        published at or after `publish_time` (ms since the epoch); exactly one of them.
        A partitioned topic seeks by publish time only (every partition); name one
        partition topic to seek it by offset. Its consumers stay attached and receive
        from the new position."""
        parse_topic(topic)
        _check_subscription(subscription)
        if (offset is None) == (publish_time is None):
            raise InvalidArgument("seek takes exactly one of offset and publish_time")
        for name, value in (("offset", offset), ("publish_time", publish_time)):
            if value is not None and (type(value) is not int or value < 0):
                raise InvalidArgument(f"{name} must be a non-negative int, got {value!r}")
        await self._call(
            lambda rid: SeekSubscription(
                request_id=rid, topic=topic, subscription=subscription, offset=offset, publish_time=publish_time
            ),
            Ok,
        )

    async def get_failure_policy(self, topic: str, subscription: str) -> FailurePolicyInfo:
        """The failure policy of a subscription of a reliable topic; `explicit` is False
        while it follows the broker's `reliable:` defaults."""
        parse_topic(topic)
        _check_subscription(subscription)
        return await self._call(
            lambda rid: GetFailurePolicy(request_id=rid, topic=topic, subscription=subscription),
            FailurePolicyInfo,
        )

    async def set_failure_policy(
        self,
        topic: str,
        subscription: str,
        *,
        max_redelivery_count: int | None = None,
        ack_timeout_ms: int | None = None,
        base_redelivery_delay_ms: int | None = None,
        max_redelivery_delay_ms: int | None = None,
        backoff: str | None = None,
        poison_policy: str | None = None,
        dead_letter_topic: str | None = None,
    ) -> FailurePolicyInfo:
        """Set the failure policy of a subscription of a reliable topic (every partition);
        fields left None keep their current values (`dead_letter_topic=""` clears it).
        The broker checks the result (INVALID_ARGUMENT names the field), applies it from
        now on and stores it with the subscription. Returns the policy set."""
        current = await self.get_failure_policy(topic, subscription)
        merged = FailurePolicyInfo(
            request_id=0,
            max_redelivery_count=_pick(max_redelivery_count, current.max_redelivery_count),
            ack_timeout_ms=_pick(ack_timeout_ms, current.ack_timeout_ms),
            base_redelivery_delay_ms=_pick(base_redelivery_delay_ms, current.base_redelivery_delay_ms),
            max_redelivery_delay_ms=_pick(max_redelivery_delay_ms, current.max_redelivery_delay_ms),
            backoff=_pick(backoff, current.backoff),
            poison_policy=_pick(poison_policy, current.poison_policy),
            dead_letter_topic=_pick(dead_letter_topic, current.dead_letter_topic) or None,
            explicit=True,
        )
        await self._call(
            lambda rid: SetFailurePolicy(
                request_id=rid,
                topic=topic,
                subscription=subscription,
                max_redelivery_count=merged.max_redelivery_count,
                ack_timeout_ms=merged.ack_timeout_ms,
                base_redelivery_delay_ms=merged.base_redelivery_delay_ms,
                max_redelivery_delay_ms=merged.max_redelivery_delay_ms,
                backoff=merged.backoff,
                poison_policy=merged.poison_policy,
                dead_letter_topic=merged.dead_letter_topic,
            ),
            Ok,
        )
        return merged

    async def get_dispatch_config(self, topic: str, subscription: str) -> DispatchConfigInfo:
        """The dispatch window of a subscription of a reliable topic; `explicit` is False
        while it follows the broker's `reliable.max_unacked_messages`."""
        parse_topic(topic)
        _check_subscription(subscription)
        return await self._call(
            lambda rid: GetDispatchConfig(request_id=rid, topic=topic, subscription=subscription),
            DispatchConfigInfo,
        )

    async def set_dispatch_config(self, topic: str, subscription: str, *, max_unacked_messages: int) -> None:
        """Set the dispatch window of a subscription of a reliable topic (every partition):
        at most `max_unacked_messages` (1..10000) unacknowledged deliveries per consumer.
        It applies at once and is stored with the subscription; the broker checks the
        range (INVALID_ARGUMENT naming the field)."""
        parse_topic(topic)
        _check_subscription(subscription)
        if type(max_unacked_messages) is not int:
            raise InvalidArgument(f"max_unacked_messages must be an int, got {max_unacked_messages!r}")
        await self._call(
            lambda rid: SetDispatchConfig(
                request_id=rid, topic=topic, subscription=subscription, max_unacked_messages=max_unacked_messages
            ),
            Ok,
        )

    # -- brokers -----------------------------------------------------------

    async def list_brokers(self) -> list[BrokerInfo]:
        """Every broker: the registered ones and, with status `down`, the Raft members whose
        broker is gone (`actors/broker/broker_listing.py`)."""
        reply = await self._call(lambda rid: ListBrokers(request_id=rid), BrokerList)
        return reply.brokers

    async def broker_names(self) -> dict[int, str]:
        """Broker id -> name (broker-{raft node id}), for views that show a broker id; {}
        when the caller may not list brokers or the brokers predate names."""
        try:
            return {b.broker_id: b.name for b in await self.list_brokers() if b.name}
        except PermissionDenied:  # allowed to describe a topic, not to list brokers
            return {}

    # -- topic schemas -------------------------------------------------------

    async def configure_topic_schema(self, topic: str, subject: str, *, validation_policy: str = "none",
                                     payload_validation: bool = False) -> TopicSchemaConfigInfo:
        """Bind `topic` to schema subject `subject` (Danube's `configure-schema`)."""
        parse_topic(topic)
        return await self._call(
            lambda rid: ConfigureTopicSchema(request_id=rid, topic=topic, subject=subject,
                                             validation_policy=validation_policy,
                                             payload_validation=payload_validation),
            TopicSchemaConfigInfo,
        )

    async def get_topic_schema_config(self, topic: str) -> TopicSchemaConfigInfo:
        parse_topic(topic)
        return await self._call(lambda rid: GetTopicSchemaConfig(request_id=rid, topic=topic), TopicSchemaConfigInfo)

    # -- WAL snapshots ---------------------------------------------------------

    async def create_snapshot(self, topic: str | None = None, *, timeout_ms: int = 600_000) -> SnapshotCreated:
        """Snapshot this broker's reliable topics (those matching the glob `topic`); the
        answer comes once the snapshot is written, which may take a while for big topics."""
        return await self._call(lambda rid: CreateSnapshot(request_id=rid, topic=topic), SnapshotCreated,
                                timeout_ms=timeout_ms)

    async def list_snapshots(self) -> SnapshotList:
        return await self._call(lambda rid: ListSnapshots(request_id=rid), SnapshotList)

    async def describe_snapshot(self, snapshot_id: str) -> SnapshotDescription:
        return await self._call(lambda rid: DescribeSnapshot(request_id=rid, snapshot_id=snapshot_id),
                                SnapshotDescription)

    async def delete_snapshot(self, snapshot_id: str) -> None:
        await self._call(lambda rid: DeleteSnapshot(request_id=rid, snapshot_id=snapshot_id), Ok)

    # -- the metadata cluster ------------------------------------------------

    async def cluster_status(self) -> ClusterStatusInfo:
        """This broker's view of the Raft metadata cluster: role, term, leader, members."""
        return await self._call(lambda rid: ClusterStatus(request_id=rid), ClusterStatusInfo)

    async def add_node(self, node_id: int, address: str) -> ClusterStatusInfo:
        """Add a node started with `cluster.join` (listening at `address`) as a learner."""
        _check_node_id(node_id)
        check_endpoint(address, "raft peer address")
        return await self._call(
            lambda rid: AddClusterNode(request_id=rid, node_id=node_id, address=address), ClusterStatusInfo
        )

    async def promote_node(self, node_id: int) -> ClusterStatusInfo:
        """Make a learner a voter; UNAVAILABLE (retriable) while it has not caught up."""
        _check_node_id(node_id)
        return await self._call(lambda rid: PromoteClusterNode(request_id=rid, node_id=node_id), ClusterStatusInfo)

    async def remove_node(self, node_id: int) -> ClusterStatusInfo:
        """Remove a voter or a learner from the metadata cluster."""
        _check_node_id(node_id)
        return await self._call(lambda rid: RemoveClusterNode(request_id=rid, node_id=node_id), ClusterStatusInfo)

    async def metadata_get(self, key: str, *, linearizable: bool = True) -> MetadataEntry | None:
        reply = await self._call(
            lambda rid: MetadataGet(request_id=rid, key=key, linearizable=linearizable), MetadataEntries
        )
        return reply.entries[0] if reply.entries else None

    async def metadata_list(self, prefix: str, *, linearizable: bool = True, limit: int = 1000) -> MetadataEntries:
        return await self._call(
            lambda rid: MetadataList(request_id=rid, prefix=prefix, linearizable=linearizable, limit=limit),
            MetadataEntries,
        )

    async def metadata_put(self, key: str, value: bytes, *, ttl_ms: int | None = None) -> MetadataEntry:
        reply = await self._call(
            lambda rid: MetadataPut(request_id=rid, key=key, value=value, ttl_ms=ttl_ms), MetadataWritten
        )
        assert reply.entry is not None
        return reply.entry

    async def metadata_cas(self, key: str, expected_version: int, value: bytes) -> MetadataWritten:
        """Set `key` if its version is `expected_version` (0: absent); `succeeded` says."""
        return await self._call(
            lambda rid: MetadataCompareAndSwap(request_id=rid, key=key, expected_version=expected_version,
                                               value=value),
            MetadataWritten,
        )

    async def metadata_delete(self, key: str, *, prefix: bool = False) -> int:
        """How many keys were deleted."""
        reply = await self._call(lambda rid: MetadataDelete(request_id=rid, key=key, prefix=prefix), MetadataWritten)
        return reply.deleted

    # ---- security: roles, bindings, revoked tokens, client keys (docs/security.md)

    async def create_role(self, name: str, permissions: list[str]) -> None:
        """A role of `permissions` (Danube's names: Lookup, Produce, Consume, ManageTopic ...)."""
        await self._call(lambda rid: ap.CreateRole(request_id=rid, name=name, permissions=list(permissions)), Ok)

    async def list_roles(self) -> list[ap.RoleInfo]:
        return (await self._call(lambda rid: ap.ListRoles(request_id=rid), ap.RoleList)).roles

    async def delete_role(self, name: str) -> None:
        await self._call(lambda rid: ap.DeleteRole(request_id=rid, name=name), Ok)

    async def create_binding(self, principal: str, principal_type: str, roles: list[str],
                             scope: str) -> ap.BindingInfo:
        """Give `roles` to a principal at `scope` (`cluster`, `namespace:NS`, `topic:/ns/t`)."""
        reply = await self._call(lambda rid: ap.CreateBinding(request_id=rid, principal=principal,
                                                              principal_type=principal_type, roles=list(roles),
                                                              scope=scope), ap.BindingCreated)
        return reply.binding

    async def list_bindings(self) -> list[ap.BindingInfo]:
        return (await self._call(lambda rid: ap.ListBindings(request_id=rid), ap.BindingList)).bindings

    async def delete_binding(self, binding_id: str) -> None:
        await self._call(lambda rid: ap.DeleteBinding(request_id=rid, binding_id=binding_id), Ok)

    async def revoke_token(self, jti: str, expires_at_ms: int) -> None:
        """Refuse the token with this `jti` until it expires (`expires_at_ms`, its `exp`)."""
        await self._call(lambda rid: ap.RevokeToken(request_id=rid, jti=jti, expires_at_ms=expires_at_ms), Ok)

    async def list_revoked_tokens(self) -> list[ap.RevokedTokenInfo]:
        return (await self._call(lambda rid: ap.ListRevokedTokens(request_id=rid), ap.RevokedTokenList)).tokens

    async def add_client_key(self, public_key: str, principal: str, principal_type: str) -> None:
        """Allow the CURVE client key `public_key` (Z85) as `principal`."""
        await self._call(lambda rid: ap.AddClientKey(request_id=rid, public_key=public_key, principal=principal,
                                                     principal_type=principal_type), Ok)

    async def list_client_keys(self) -> list[ap.ClientKeyInfo]:
        return (await self._call(lambda rid: ap.ListClientKeys(request_id=rid), ap.ClientKeyList)).keys

    async def remove_client_key(self, public_key: str) -> None:
        await self._call(lambda rid: ap.RemoveClientKey(request_id=rid, public_key=public_key), Ok)


V = TypeVar("V")


def _pick(given: V | None, current: V) -> V:
    return current if given is None else given


def _check_node_id(node_id: int) -> None:
    if node_id < 1:
        raise InvalidArgument(f"a node id is a positive integer, got {node_id}")


def _check_subscription(subscription: str) -> None:
    if not subscription:
        raise InvalidArgument("subscription name must not be empty")

"""The policy keeper: a child of the broker actor that keeps the policies set in the
metadata store over the broker's `policies` config, and tells the topics served here
those in force. Which value is in force, and from where, is `policies.py` (pure).

**Backlog quotas** per namespace and per topic (Pulsar's `set-backlog-quota`):

    admin SetBacklogQuota ──▶ any broker's keeper ──Raft──▶ /policies/backlog-quota/{ns}[/{topic}]
                                                        │ watch (every broker)
                                                        ▼
              keeper of the broker serving the topic ── ApplyBacklogQuota ──▶ reliable topic actor

1. Set / remove: checked (policy, limit, the namespace or topic exists), written to the
   metadata store, then applied to the topics served here before the answer.
2. Every keeper watches the prefix (a `MetadataWatch` child, `metadata_watch.py`, tells
   it `BacklogQuotasChanged`): on any change it works out the quota in force for
   each reliable topic served here (the topic's, else its namespace's, else the broker's
   `policies`) and tells the topic; the topic ignores an unchanged quota. Nothing is
   lost to a full mailbox, and the keeper never waits for a topic's room: a topic
   whose mailbox is full is kept pending and told again by a timer message
   (`BacklogQuotasPending`) with the quota the store holds then (`pending_tells.py`,
   as the topic policies).
3. A topic loaded here (a start, a restart, a move) is spawned by the broker with the
   quota in force read from the local replica of the store, so a quota survives
   restarts and follows the topic to its next broker. The broker then tells the keeper
   `TopicServed` with the replica's revision it read: a change the keeper learned of
   past that revision is told to the topic at once (it may have been spawned with the
   values before it).

**Topic policies** per namespace and per topic (Pulsar's namespace and topic policies):

    admin SetTopicPolicies ──▶ any broker's keeper ──Raft──▶ /policies/topic-policies/{ns}[/{topic}]
                                                        │ watch (every broker)
                                                        ▼
              keeper of the broker serving the topic ── ApplyTopicPolicies ──▶ topic actor ──▶ its subscriptions

1. Set / remove: checked (ranges, the namespace or topic exists), written to the
   metadata store (set changes only the policies it names), then applied to the
   topics served here before the answer.
2. Every keeper watches the prefix (a `MetadataWatch` child tells it
   `TopicPoliciesChanged`): it works out each policy in force for each topic served
   here (the topic's, else its namespace's, else the broker's `policies`, policy by
   policy) and tells the topic, which tells its subscriptions.
   Nothing is lost to a full mailbox. The keeper never waits for a topic's room (a
   topic flooded by producers could hold up every admin request for the ask
   timeout, and a `send` that gave up lost the change): a topic whose mailbox is
   full is kept pending and told again by a timer message (`TopicPoliciesPending`),
   with the policies the store holds then, so the last change wins whatever the
   order of the retries (`pending_tells.py`, shared with the backlog quotas). The
   topic tells its subscriptions from inside its group (they are its guests): those
   tells take the group's local lane, which has no bound, so a subscription's full
   mailbox loses nothing either.
3. A topic loaded here is spawned with the policies in force read from the local
   replica of the store (and `TopicServed` as for the quotas).

**What a namespace allows of topic creation**: limits on topics and on partitions per
topic (Pulsar's `set-max-topics-per-namespace`), and the auto topic creation policy of
subscribers (Pulsar's `set-auto-topic-creation`).

    admin SetNamespaceLimits ──▶ any broker's keeper ──Raft──▶ /policies/namespace-limits/{ns}
                                                            │ local replica
                                                            ▼
                          any broker creating a topic in {ns} checks against it

1. Set / remove: checked (ranges as the broker's config, the namespace exists) and
   written to the metadata store; set changes only the limits it names.
2. A create (admin, or a producer's auto-create) on any broker reads the limits in
   force from its local replica: the namespace's, else the broker's `policies`. Like
   the broker's own limits they are checked on the applied state, so creates racing on
   several brokers may pass them by the ones in flight.
3. Deleting the namespace deletes its limits.
4. The auto topic creation policy (/policies/auto-topic-creation/{ns}) is set, read and
   removed the same way, policy by policy over the broker's `policies`; a subscriber's
   `GetPartitions(create, for_subscription)` reads it from the local replica.

The admin gateway sends these requests here directly (`POLICY_REQUESTS`); the broker
tells the keeper what it serves (`TopicServed`, `TopicReleased`) and when it joined
the cluster (`BrokerJoined`: the watches start, and the bootstrap namespaces exist).
"""

from __future__ import annotations

from typing import Any

from danube_zmq.actors.broker.topic_registry import Registry, Resolved, TopicEntry
from danube_zmq.actors.cluster.metadata_watch import MetadataWatch
from danube_zmq.actors.policy import policies
from danube_zmq.actors.policy.pending_tells import PendingTells
from danube_zmq.config.broker_config import (
    AUTO_TOPIC_CREATION_DISPATCHES,
    AUTO_TOPIC_CREATION_POLICIES,
    AUTO_TOPIC_CREATION_TYPES,
    BACKLOG_QUOTA_POLICIES,
    BOOLEAN_POLICIES,
    TOPIC_POLICY_NAMES,
    ZERO_IS_NEVER,
    BrokerConfig,
)
from danube_zmq.consensus.metadata_store import RaftMetadataStore
from danube_zmq.consensus.state_machine import WatchEvent
from danube_zmq.runtime.actor import Actor, Origin
from danube_zmq.transport import admin_protocol as ap
from danube_zmq.transport import client_protocol as cp
from danube_zmq.transport import cluster_records as cr
from danube_zmq.transport.codec import Message
from danube_zmq.transport.common import Ok
from danube_zmq.transport.errors import FailedPrecondition, InvalidArgument, NotFound
from danube_zmq.transport.internal_protocol import (
    ApplyBacklogQuota,
    ApplyTopicPolicies,
    BacklogQuotasChanged,
    BacklogQuotasPending,
    BrokerJoined,
    TopicPoliciesChanged,
    TopicPoliciesPending,
    TopicReleased,
    TopicServed,
)
from danube_zmq.transport.topic_name import TopicName, parse_topic

__all__ = ["PolicyKeeper"]

# Far above any disk; keeps the value an int64 on the wire and in the store.
_LIMIT_BYTES_MAX = 2**62
# The counts' and rates' range (as the broker's own, config/broker_config.py): int64 on the wire.
_VALUE_MAX = 2**63 - 1
# The ranges of the broker's own policies (config/broker_config.py): an override cannot ask
# for more than a broker could be configured with.
_TOPICS_MAX = 1_000_000
_PARTITIONS_MAX = 100_000


class PolicyKeeper(Actor):
    def __init__(self, *, metadata: RaftMetadataStore, config: BrokerConfig, broker_id: int) -> None:
        self.metadata = metadata
        self.config = config
        self.broker_id = broker_id
        self.registry = Registry(metadata, broker_id, config.bootstrap_namespaces)
        self.topics: dict[str, TopicEntry] = {}  # served here, as the broker told
        # Topics whose mailbox was full when told the topic policies or the backlog quota
        # in force: told again until one tell gets through or the topic goes.
        self.policies_pending = PendingTells("topic policies", TopicPoliciesPending())
        self.quotas_pending = PendingTells("backlog quota", BacklogQuotasPending())
        # The store's revision of the last change of each kind this keeper learned of.
        self.policies_changed_at = 0
        self.quotas_changed_at = 0

    def _read(self, key: str) -> bytes | None:
        value = self.metadata.local_get(key)
        return None if value is None else value.value

    async def handle_BrokerJoined(self, msg: BrokerJoined) -> None:
        if self.registry.joined:
            return
        self.registry.joined = True
        metadata, keeper = self.metadata, self.endpoint

        async def quotas_changed() -> Message:
            return BacklogQuotasChanged(revision=metadata.local_revision())

        async def policies_changed() -> Message:
            return TopicPoliciesChanged(revision=metadata.local_revision())

        await self.system.spawn(lambda: MetadataWatch(
            metadata=metadata, prefix=cr.BACKLOG_QUOTAS, target=keeper, start_over=quotas_changed,
            on_event=_quotas_event), name=f"backlog quotas watch {self.broker_id}", parent=keeper)
        await self.system.spawn(lambda: MetadataWatch(
            metadata=metadata, prefix=cr.TOPIC_POLICIES, target=keeper, start_over=policies_changed,
            on_event=_policies_event), name=f"topic policies watch {self.broker_id}", parent=keeper)

    # ------------------------------------------------------------- the topics served here
    def handle_TopicServed(self, msg: TopicServed) -> None:
        entry = self.topics[msg.topic] = TopicEntry(name=parse_topic(msg.topic),
                                                    dispatch_strategy=msg.dispatch_strategy, endpoint=msg.endpoint)
        if self.policies_changed_at > msg.revision:
            self._tell_topic_policies([entry])
        if self.quotas_changed_at > msg.revision:
            self._tell_backlog_quotas([entry])

    def handle_TopicReleased(self, msg: TopicReleased) -> None:
        entry = self.topics.get(msg.topic)
        if entry is not None and msg.endpoint in (None, entry.endpoint):
            del self.topics[msg.topic]

    # ------------------------------------------------------------- telling the topics
    def handle_BacklogQuotasChanged(self, msg: BacklogQuotasChanged) -> None:
        self.quotas_changed_at = max(self.quotas_changed_at, msg.revision)
        self._tell_backlog_quotas(list(self.topics.values()))

    def handle_BacklogQuotasPending(self, msg: BacklogQuotasPending) -> None:
        self._tell_backlog_quotas(self.quotas_pending.due(self.topics))

    def _apply_backlog_quotas(self) -> None:
        self.handle_BacklogQuotasChanged(BacklogQuotasChanged(revision=self.metadata.local_revision()))

    def _tell_backlog_quotas(self, entries: list[TopicEntry]) -> None:
        self.quotas_pending.tell(
            self.system, self.endpoint, [entry for entry in entries
                                         if entry.dispatch_strategy == cp.DispatchStrategy.RELIABLE],
            self._backlog_quota_message)

    def _backlog_quota_message(self, entry: TopicEntry) -> ApplyBacklogQuota:
        limit_bytes, policy, _ = policies.backlog_quota(self._read, self.config, entry.name)
        return ApplyBacklogQuota(limit_bytes=limit_bytes, policy=policy)

    def handle_TopicPoliciesChanged(self, msg: TopicPoliciesChanged) -> None:
        self.policies_changed_at = max(self.policies_changed_at, msg.revision)
        self._tell_topic_policies(list(self.topics.values()))

    def handle_TopicPoliciesPending(self, msg: TopicPoliciesPending) -> None:
        self._tell_topic_policies(self.policies_pending.due(self.topics))

    def _apply_topic_policies(self) -> None:
        self.handle_TopicPoliciesChanged(TopicPoliciesChanged(revision=self.metadata.local_revision()))

    def _tell_topic_policies(self, entries: list[TopicEntry]) -> None:
        self.policies_pending.tell(self.system, self.endpoint, entries, self._topic_policies_message)

    def _topic_policies_message(self, entry: TopicEntry) -> ApplyTopicPolicies:
        return policies.topic_policies(self._read, self.config, entry.name)[0]

    # ------------------------------------------------------------- admin: namespace or topic
    async def _policy_level(self, msg: Any, what: str) -> tuple[str | None, Any]:
        """The level an admin request about `what` (a namespace's or a topic's backlog
        quota, topic policies) names: exactly one of `msg.namespace` (which must exist) and
        `msg.topic` (an existing base topic: `what` applies to every partition).
        (namespace, None) or (None, the resolved topic)."""
        if (msg.namespace is None) == (msg.topic is None):
            raise InvalidArgument("name exactly one of namespace and topic")
        if msg.namespace is not None:
            return await self.registry.existing_namespace(msg.namespace), None
        resolved = await self.registry.existing(parse_topic(msg.topic))
        if resolved.name.full != resolved.base.full:
            raise FailedPrecondition(f"{resolved.name.full} is a partition: set {what} of {resolved.base.full}"
                                     " (every partition has its topic's)")
        return None, resolved

    async def _level_to_read(self, msg: Any) -> TopicName | str:
        """What a Get names, as of now: a namespace that exists, or an existing topic."""
        if (msg.namespace is None) == (msg.topic is None):
            raise InvalidArgument("name exactly one of namespace and topic")
        await self.metadata.get(cr.LEADER)  # a barrier: read the replica as of now
        if msg.namespace is not None:
            return await self.registry.existing_namespace(msg.namespace)
        return (await self.registry.existing(parse_topic(msg.topic))).name

    async def _remove(self, key: str, what: str, kind: str) -> None:
        """Delete the own record at `key` of `what` (its `kind`): NOT_FOUND when it has
        none, FAILED_PRECONDITION when it changed since it was read."""
        current = await self.metadata.get(key)
        if current is None:
            raise NotFound(f"{what} has no {kind} of its own")
        if not await self.metadata.transaction({key: current.version}, {}, [key]):
            raise FailedPrecondition(f"the {kind} of {what} changed meanwhile; retry")

    # ------------------------------------------------------------- admin: backlog quotas
    async def _quota_key(self, msg: Any) -> tuple[str, str]:
        """(key in the store, what it names) of a request's namespace or topic, which
        must exist."""
        namespace, resolved = await self._policy_level(msg, "the quota")
        if namespace is not None:
            return cr.namespace_backlog_quota_key(namespace), f"namespace '{namespace}'"
        assert isinstance(resolved, Resolved)
        if resolved.record.dispatch_strategy != cp.DispatchStrategy.RELIABLE:
            raise FailedPrecondition(f"topic {resolved.name.full} is not reliable: it keeps no backlog, so a backlog"
                                     " quota does not apply to it")
        return cr.topic_backlog_quota_key(resolved.base.full), f"topic {resolved.base.full}"

    async def handle_SetBacklogQuota(self, msg: ap.SetBacklogQuota, origin: Origin) -> Message:
        if msg.policy not in BACKLOG_QUOTA_POLICIES:
            raise InvalidArgument(f"policy must be one of {', '.join(BACKLOG_QUOTA_POLICIES)}, got {msg.policy!r}")
        if not 0 <= msg.limit_bytes <= _LIMIT_BYTES_MAX:
            raise InvalidArgument(f"limit_bytes must be in 0..{_LIMIT_BYTES_MAX} (0: no limit), got {msg.limit_bytes}")
        key, _ = await self._quota_key(msg)
        await self.metadata.put(key, cr.encode(cr.BacklogQuotaRecord(limit_bytes=msg.limit_bytes, policy=msg.policy)))
        self._apply_backlog_quotas()  # queued here before the answer; other brokers follow their watch
        return Ok(request_id=msg.request_id)

    async def handle_GetBacklogQuota(self, msg: ap.GetBacklogQuota, origin: Origin) -> Message:
        limit_bytes, policy, source = policies.backlog_quota(self._read, self.config, await self._level_to_read(msg))
        return ap.BacklogQuotaInfo(request_id=msg.request_id, limit_bytes=limit_bytes, policy=policy, source=source)

    async def handle_RemoveBacklogQuota(self, msg: ap.RemoveBacklogQuota, origin: Origin) -> Message:
        key, what = await self._quota_key(msg)
        await self._remove(key, what, "backlog quota")
        self._apply_backlog_quotas()
        return Ok(request_id=msg.request_id)

    # ------------------------------------------------------------- admin: topic policies
    async def _policies_key(self, msg: Any) -> tuple[str, str]:
        """(key in the store, what it names) of a request's namespace or topic, which
        must exist."""
        namespace, resolved = await self._policy_level(msg, "the policies")
        if namespace is not None:
            return cr.namespace_topic_policies_key(namespace), f"namespace '{namespace}'"
        return cr.topic_policies_key(resolved.base.full), f"topic {resolved.base.full}"

    def _check_policy(self, policy: str, value: int) -> None:
        if policy == "max_message_size":
            # Lower only: clients learn the broker's at Connect (`message_bytes_max`) and
            # refuse larger messages themselves.
            size_max = self.config.policies.max_message_size
            if not 1 <= value <= size_max:
                raise InvalidArgument(f"max_message_size must be in 1..{size_max} (the broker's"
                                      f" policies.max_message_size, which clients check too), got {value}")
        elif policy in BOOLEAN_POLICIES:
            if value not in (0, 1):
                raise InvalidArgument(f"{policy} is 1 (on) or 0 (off), got {value}")
        elif not 0 <= value <= _VALUE_MAX:
            zero = "never" if policy in ZERO_IS_NEVER else "unlimited"
            raise InvalidArgument(f"{policy} must be in 0..{_VALUE_MAX} (0: {zero}), got {value}")

    async def handle_SetTopicPolicies(self, msg: ap.SetTopicPolicies, origin: Origin) -> Message:
        given = {policy: getattr(msg, policy) for policy in TOPIC_POLICY_NAMES if getattr(msg, policy) is not None}
        if not given:
            raise InvalidArgument(f"name at least one policy: {', '.join(TOPIC_POLICY_NAMES)}")
        for policy, value in given.items():
            self._check_policy(policy, value)
        key, what = await self._policies_key(msg)
        current = await self.metadata.get(key)
        old = cr.TopicPoliciesRecord() if current is None else policies.topic_policies_record(key, current.value)
        record = cr.TopicPoliciesRecord(**{p: given.get(p, getattr(old, p)) for p in TOPIC_POLICY_NAMES})
        if not await self.metadata.transaction({key: 0 if current is None else current.version},
                                               {key: cr.encode(record)}):
            raise FailedPrecondition(f"the topic policies of {what} changed meanwhile; retry")
        self._apply_topic_policies()  # queued here before the answer; other brokers follow their watch
        return Ok(request_id=msg.request_id)

    async def handle_GetTopicPolicies(self, msg: ap.GetTopicPolicies, origin: Origin) -> Message:
        values, sources = policies.topic_policies(self._read, self.config, await self._level_to_read(msg))
        return ap.TopicPoliciesInfo(request_id=msg.request_id, sources=sources,
                                    values={policy: getattr(values, policy) for policy in TOPIC_POLICY_NAMES})

    async def handle_RemoveTopicPolicies(self, msg: ap.RemoveTopicPolicies, origin: Origin) -> Message:
        key, what = await self._policies_key(msg)
        await self._remove(key, what, "topic policies")
        self._apply_topic_policies()
        return Ok(request_id=msg.request_id)

    # ------------------------------------------------------------- admin: what a namespace allows
    async def handle_SetAutoTopicCreation(self, msg: ap.SetAutoTopicCreation, origin: Origin) -> Message:
        given = {p: getattr(msg, p) for p in AUTO_TOPIC_CREATION_POLICIES if getattr(msg, p) is not None}
        if not given:
            raise InvalidArgument(f"name at least one of {', '.join(AUTO_TOPIC_CREATION_POLICIES)}")
        kind = given.get("allow_auto_topic_creation_type")
        if kind is not None and kind not in AUTO_TOPIC_CREATION_TYPES:
            raise InvalidArgument(f"allow_auto_topic_creation_type must be one of"
                                  f" {', '.join(AUTO_TOPIC_CREATION_TYPES)}, got {kind!r}")
        dispatch = given.get("auto_topic_creation_dispatch")
        if dispatch is not None and dispatch not in AUTO_TOPIC_CREATION_DISPATCHES:
            raise InvalidArgument(f"auto_topic_creation_dispatch must be one of"
                                  f" {', '.join(AUTO_TOPIC_CREATION_DISPATCHES)}, got {dispatch!r}")
        partitions = given.get("default_num_partitions")
        if partitions is not None and not 1 <= partitions <= _PARTITIONS_MAX:
            raise InvalidArgument(f"default_num_partitions must be in 1..{_PARTITIONS_MAX}, got {partitions}")
        namespace = await self.registry.existing_namespace(msg.namespace)
        key = cr.auto_topic_creation_key(namespace)
        current = await self.metadata.get(key)
        old = cr.AutoTopicCreationRecord() if current is None else policies.creation_record(key, current.value)
        record = cr.AutoTopicCreationRecord(**{p: given.get(p, getattr(old, p)) for p in AUTO_TOPIC_CREATION_POLICIES})
        if not await self.metadata.transaction({key: 0 if current is None else current.version},
                                               {key: cr.encode(record)}):
            raise FailedPrecondition(f"the auto topic creation policy of namespace '{namespace}' changed meanwhile;"
                                     " retry")
        return Ok(request_id=msg.request_id)

    async def handle_GetAutoTopicCreation(self, msg: ap.GetAutoTopicCreation, origin: Origin) -> Message:
        await self.metadata.get(cr.LEADER)  # a barrier: read the replica as of now
        namespace = await self.registry.existing_namespace(msg.namespace)
        return ap.AutoTopicCreationInfo(request_id=msg.request_id, namespace=namespace,
                                        **policies.auto_topic_creation(self._read, self.config, namespace)._asdict())

    async def handle_RemoveAutoTopicCreation(self, msg: ap.RemoveAutoTopicCreation, origin: Origin) -> Message:
        namespace = await self.registry.existing_namespace(msg.namespace)
        await self._remove(cr.auto_topic_creation_key(namespace), f"namespace '{namespace}'",
                           "auto topic creation policy")
        return Ok(request_id=msg.request_id)

    async def handle_SetNamespaceLimits(self, msg: ap.SetNamespaceLimits, origin: Origin) -> Message:
        if msg.topics_max is None and msg.partitions_max is None:
            raise InvalidArgument("name topics_max or partitions_max (or both)")
        if msg.topics_max is not None and not 1 <= msg.topics_max <= _TOPICS_MAX:
            raise InvalidArgument(f"topics_max must be in 1..{_TOPICS_MAX}, got {msg.topics_max}")
        if msg.partitions_max is not None and not 1 <= msg.partitions_max <= _PARTITIONS_MAX:
            raise InvalidArgument(f"partitions_max must be in 1..{_PARTITIONS_MAX}, got {msg.partitions_max}")
        namespace = await self.registry.existing_namespace(msg.namespace)
        key = cr.namespace_limits_key(namespace)
        current = await self.metadata.get(key)
        old = cr.NamespaceLimitsRecord() if current is None else policies.limits_record(key, current.value)
        record = cr.NamespaceLimitsRecord(
            topics_max=old.topics_max if msg.topics_max is None else msg.topics_max,
            partitions_max=old.partitions_max if msg.partitions_max is None else msg.partitions_max)
        if not await self.metadata.transaction({key: 0 if current is None else current.version},
                                               {key: cr.encode(record)}):
            raise FailedPrecondition(f"the limits of namespace '{namespace}' changed meanwhile; retry")
        return Ok(request_id=msg.request_id)

    async def handle_GetNamespaceLimits(self, msg: ap.GetNamespaceLimits, origin: Origin) -> Message:
        await self.metadata.get(cr.LEADER)  # a barrier: read the replica as of now
        namespace = await self.registry.existing_namespace(msg.namespace)
        limits = policies.namespace_limits(self._read, self.config, namespace)
        return ap.NamespaceLimitsInfo(request_id=msg.request_id, namespace=namespace, **limits._asdict())

    async def handle_RemoveNamespaceLimits(self, msg: ap.RemoveNamespaceLimits, origin: Origin) -> Message:
        namespace = await self.registry.existing_namespace(msg.namespace)
        await self._remove(cr.namespace_limits_key(namespace), f"namespace '{namespace}'", "limits")
        return Ok(request_id=msg.request_id)


def _quotas_event(event: WatchEvent) -> Message:
    return BacklogQuotasChanged(revision=event.revision)


def _policies_event(event: WatchEvent) -> Message:
    return TopicPoliciesChanged(revision=event.revision)

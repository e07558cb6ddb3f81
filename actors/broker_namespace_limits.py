"""What a namespace allows of topic creation, a part of `BrokerActor`: limits on topics
and on partitions per topic (Pulsar's `set-max-topics-per-namespace`), and the auto
topic creation policy of subscribers (Pulsar's `set-auto-topic-creation`).

    admin SetNamespaceLimits ──▶ any broker ──Raft──▶ /policies/namespace-limits/{ns}
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
"""

from __future__ import annotations

from typing import Any, NamedTuple

from danube_zmq.actors.config import (
    AUTO_TOPIC_CREATION_DISPATCHES,
    AUTO_TOPIC_CREATION_POLICIES,
    AUTO_TOPIC_CREATION_TYPES,
)
from danube_zmq.runtime.actor import Origin
from danube_zmq.transport import admin_protocol as ap
from danube_zmq.transport import cluster_records as cr
from danube_zmq.transport.codec import Message
from danube_zmq.transport.common import Ok
from danube_zmq.transport.errors import DanubeError, FailedPrecondition, InternalError, InvalidArgument, NotFound
from danube_zmq.transport.topic_name import validate_namespace

# The ranges of the broker's own policies (actors/config.py): an override cannot ask
# for more than a broker could be configured with.
_TOPICS_MAX = 1_000_000
_PARTITIONS_MAX = 100_000


class NamespaceLimits(NamedTuple):
    topics_max: int
    topics_max_source: str  # "namespace" or "broker"
    partitions_max: int
    partitions_max_source: str

    def topics_text(self, namespace: str) -> str:
        """Where the topics limit comes from, for an error."""
        if self.topics_max_source == "namespace":
            return (f"the topics limit of namespace '{namespace}' ({self.topics_max}),"
                    " set by danube admin namespaces set-limits")
        return f"policies.topics_per_namespace_max ({self.topics_max})"

    def partitions_text(self, namespace: str) -> str:
        if self.partitions_max_source == "namespace":
            return f"the partitions limit of namespace '{namespace}', set by danube admin namespaces set-limits"
        return "policies.partitions_per_topic_max"


class AutoTopicCreation(NamedTuple):
    """The auto topic creation policy in force for a namespace, with each one's source
    ("namespace" or "broker")."""

    allow_auto_topic_creation: bool
    allow_auto_topic_creation_type: str
    default_num_partitions: int
    auto_topic_creation_dispatch: str
    sources: dict[str, str]

    def refusal(self, namespace: str) -> str:
        """Why a subscriber meets NOT_FOUND, naming the setting that decides."""
        if self.sources["allow_auto_topic_creation"] == "namespace":
            return (f"auto topic creation is off in namespace '{namespace}' (allow_auto_topic_creation,"
                    " set by danube admin namespaces policies set)")
        return "auto topic creation is off (the broker's policies.allow_auto_topic_creation)"


def _decoded(key: str, data: bytes, record_type: type, what: str) -> Any:
    """A record that cannot be read is an error naming it: a limit silently dropped
    would let the namespace grow past it."""
    try:
        return cr.decode(data, record_type)
    except DanubeError as exc:
        raise InternalError(f"metadata record {key} cannot be read ({exc}): {what} unknown;"
                            f" fix it (danube admin metadata put/delete {key}) or remove it") from None


def _limits_record(key: str, data: bytes) -> cr.NamespaceLimitsRecord:
    return _decoded(key, data, cr.NamespaceLimitsRecord, "the namespace's limits are")


def _creation_record(key: str, data: bytes) -> cr.AutoTopicCreationRecord:
    return _decoded(key, data, cr.AutoTopicCreationRecord, "the namespace's auto topic creation policy is")


class BrokerNamespaceLimits:
    """Mixed into `BrokerActor`; uses its metadata store and config."""

    def namespace_limits_of(self, namespace: str) -> NamespaceLimits:
        """The limits in force for `namespace`, from the local replica of the store."""
        policies = self.config.policies
        key = cr.namespace_limits_key(namespace)
        value = self.metadata.local_get(key)
        record = cr.NamespaceLimitsRecord() if value is None else _limits_record(key, value.value)
        topics = (record.topics_max, "namespace") if record.topics_max is not None else (
            policies.topics_per_namespace_max, "broker")
        partitions = (record.partitions_max, "namespace") if record.partitions_max is not None else (
            policies.partitions_per_topic_max, "broker")
        return NamespaceLimits(*topics, *partitions)

    def auto_topic_creation_of(self, namespace: str) -> AutoTopicCreation:
        """The auto topic creation policy in force for `namespace`, from the local replica."""
        key = cr.auto_topic_creation_key(namespace)
        value = self.metadata.local_get(key)
        record = cr.AutoTopicCreationRecord() if value is None else _creation_record(key, value.value)
        values: dict[str, Any] = {}
        sources: dict[str, str] = {}
        for policy in AUTO_TOPIC_CREATION_POLICIES:
            own = getattr(record, policy)
            values[policy], sources[policy] = (own, "namespace") if own is not None else (
                getattr(self.config.policies, policy), "broker")
        return AutoTopicCreation(**values, sources=sources)

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
        namespace = await self._existing_namespace(msg.namespace)
        key = cr.auto_topic_creation_key(namespace)
        current = await self.metadata.get(key)
        old = cr.AutoTopicCreationRecord() if current is None else _creation_record(key, current.value)
        record = cr.AutoTopicCreationRecord(**{p: given.get(p, getattr(old, p)) for p in AUTO_TOPIC_CREATION_POLICIES})
        if not await self.metadata.transaction({key: 0 if current is None else current.version},
                                               {key: cr.encode(record)}):
            raise FailedPrecondition(f"the auto topic creation policy of namespace '{namespace}' changed meanwhile;"
                                     " retry")
        return Ok(request_id=msg.request_id)

    async def handle_GetAutoTopicCreation(self, msg: ap.GetAutoTopicCreation, origin: Origin) -> Message:
        await self.metadata.get(cr.LEADER)  # a barrier: read the replica as of now
        namespace = await self._existing_namespace(msg.namespace)
        return ap.AutoTopicCreationInfo(request_id=msg.request_id, namespace=namespace,
                                        **self.auto_topic_creation_of(namespace)._asdict())

    async def handle_RemoveAutoTopicCreation(self, msg: ap.RemoveAutoTopicCreation, origin: Origin) -> Message:
        namespace = await self._existing_namespace(msg.namespace)
        await self._remove_own(cr.auto_topic_creation_key(namespace), namespace,
                               "auto topic creation policy")
        return Ok(request_id=msg.request_id)

    async def _existing_namespace(self, namespace: str) -> str:
        namespace = validate_namespace(namespace)
        if not await self._namespace_exists(namespace):
            raise NotFound(f"namespace '{namespace}' does not exist")
        return namespace

    async def handle_SetNamespaceLimits(self, msg: ap.SetNamespaceLimits, origin: Origin) -> Message:
        if msg.topics_max is None and msg.partitions_max is None:
            raise InvalidArgument("name topics_max or partitions_max (or both)")
        if msg.topics_max is not None and not 1 <= msg.topics_max <= _TOPICS_MAX:
            raise InvalidArgument(f"topics_max must be in 1..{_TOPICS_MAX}, got {msg.topics_max}")
        if msg.partitions_max is not None and not 1 <= msg.partitions_max <= _PARTITIONS_MAX:
            raise InvalidArgument(f"partitions_max must be in 1..{_PARTITIONS_MAX}, got {msg.partitions_max}")
        namespace = await self._existing_namespace(msg.namespace)
        key = cr.namespace_limits_key(namespace)
        current = await self.metadata.get(key)
        old = cr.NamespaceLimitsRecord() if current is None else _limits_record(key, current.value)
        record = cr.NamespaceLimitsRecord(
            topics_max=old.topics_max if msg.topics_max is None else msg.topics_max,
            partitions_max=old.partitions_max if msg.partitions_max is None else msg.partitions_max)
        if not await self.metadata.transaction({key: 0 if current is None else current.version},
                                               {key: cr.encode(record)}):
            raise FailedPrecondition(f"the limits of namespace '{namespace}' changed meanwhile; retry")
        return Ok(request_id=msg.request_id)

    async def handle_GetNamespaceLimits(self, msg: ap.GetNamespaceLimits, origin: Origin) -> Message:
        await self.metadata.get(cr.LEADER)  # a barrier: read the replica as of now
        namespace = await self._existing_namespace(msg.namespace)
        limits = self.namespace_limits_of(namespace)
        return ap.NamespaceLimitsInfo(request_id=msg.request_id, namespace=namespace, **limits._asdict())

    async def handle_RemoveNamespaceLimits(self, msg: ap.RemoveNamespaceLimits, origin: Origin) -> Message:
        namespace = await self._existing_namespace(msg.namespace)
        await self._remove_own(cr.namespace_limits_key(namespace), namespace, "limits")
        return Ok(request_id=msg.request_id)

    async def _remove_own(self, key: str, namespace: str, what: str) -> None:
        """Delete the namespace's own record at `key` (its `what`): NOT_FOUND when it has
        none, FAILED_PRECONDITION when it changed since it was read."""
        current = await self.metadata.get(key)
        if current is None:
            raise NotFound(f"namespace '{namespace}' has no {what} of its own")
        if not await self.metadata.transaction({key: current.version}, {}, [key]):
            raise FailedPrecondition(f"the {what} of namespace '{namespace}' changed meanwhile; retry")

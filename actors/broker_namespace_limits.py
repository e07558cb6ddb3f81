"""Limits per namespace on topics and on partitions per topic (Pulsar's
`set-max-topics-per-namespace`), a part of `BrokerActor`.

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
"""

from __future__ import annotations

from typing import NamedTuple

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



def _limits_record(key: str, data: bytes) -> cr.NamespaceLimitsRecord:
    """A record that cannot be read is an error naming it: a limit silently dropped
    would let the namespace grow past it."""
    try:
        return cr.decode(data, cr.NamespaceLimitsRecord)
    except DanubeError as exc:
        raise InternalError(f"metadata record {key} cannot be read ({exc}): the namespace's limits are unknown;"
                            f" fix it (danube admin metadata put/delete {key}) or remove the limits") from None


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
        key = cr.namespace_limits_key(namespace)
        current = await self.metadata.get(key)
        if current is None:
            raise NotFound(f"namespace '{namespace}' has no limits of its own")
        if not await self.metadata.transaction({key: current.version}, {}, [key]):
            raise FailedPrecondition(f"the limits of namespace '{namespace}' changed meanwhile; retry")
        return Ok(request_id=msg.request_id)

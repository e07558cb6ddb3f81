"""Backlog quotas per namespace and per topic (Pulsar's `set-backlog-quota`), a part of
`BrokerActor`.

    admin SetBacklogQuota ──▶ any broker ──Raft──▶ /policies/backlog-quota/{ns}[/{topic}]
                                                        │ watch (every broker)
                                                        ▼
              broker serving the topic ── ApplyBacklogQuota ──▶ reliable topic actor

1. Set / remove: checked (policy, limit, the namespace or topic exists), written to the
   metadata store, then applied to the topics served here before the answer.
2. Every broker watches the prefix (a `MetadataWatch` child, `metadata_watch.py`, tells
   it `BacklogQuotasChanged`): on any change it works out the quota in force for
   each reliable topic it serves (the topic's, else its namespace's, else the broker's
   `policies`) and tells the topic; the topic ignores an unchanged quota. Nothing is
   lost to a full mailbox, and the broker never waits for a topic's room: a topic
   whose mailbox is full is kept pending and told again by a timer message
   (`BacklogQuotasPending`) with the quota the store holds then (`pending_tells.py`,
   as the topic policies).
3. A topic loaded here (a start, a restart, a move) is spawned with the quota in force
   read from the local replica of the store, so a quota survives restarts and follows
   the topic to its next broker.
"""

from __future__ import annotations

from typing import Any

from danube_zmq.actors.config import BACKLOG_QUOTA_POLICIES
from danube_zmq.actors.topic_registry import TopicEntry
from danube_zmq.runtime.actor import Origin
from danube_zmq.transport import admin_protocol as ap
from danube_zmq.transport import client_protocol as cp
from danube_zmq.transport import cluster_records as cr
from danube_zmq.transport.codec import Message
from danube_zmq.transport.common import Ok
from danube_zmq.transport.errors import FailedPrecondition, InvalidArgument, NotFound
from danube_zmq.transport.internal_protocol import ApplyBacklogQuota, BacklogQuotasChanged, BacklogQuotasPending
from danube_zmq.transport.topic_name import TopicName, parse_topic, validate_namespace

# Far above any disk; keeps the value an int64 on the wire and in the store.
_LIMIT_BYTES_MAX = 2**62


class BrokerBacklogQuotas:
    """Mixed into `BrokerActor`; uses its metadata store, config and topics."""

    def backlog_quota_of(self, name: TopicName | str) -> tuple[int, str, str]:
        """(limit_bytes, policy, source) in force for topic or partition `name` (a
        TopicName) or for the topics of namespace `name` (a str), from the local
        replica of the store."""
        store = self.metadata
        levels = [(cr.namespace_backlog_quota_key(name), "namespace")] if isinstance(name, str) else [
            (cr.topic_backlog_quota_key(name.base.full), "topic"),
            (cr.namespace_backlog_quota_key(name.namespace), "namespace")]
        for key, source in levels:
            value = store.local_get(key)
            if value is not None:
                record = cr.decode(value.value, cr.BacklogQuotaRecord)
                return record.limit_bytes, record.policy, source
        policies = self.config.policies
        return policies.backlog_quota_bytes_max, policies.backlog_quota_policy, "broker"

    def handle_BacklogQuotasChanged(self, msg: BacklogQuotasChanged) -> None:
        self._apply_backlog_quotas()

    def handle_BacklogQuotasPending(self, msg: BacklogQuotasPending) -> None:
        self._tell_backlog_quotas(self.quotas_pending.due(self.topics))

    def _apply_backlog_quotas(self) -> None:
        self._tell_backlog_quotas(list(self.topics.values()))

    def _tell_backlog_quotas(self, entries: list[TopicEntry]) -> None:
        self.quotas_pending.tell(
            self.system, self.endpoint, [entry for entry in entries
                                         if entry.dispatch_strategy == cp.DispatchStrategy.RELIABLE],
            self._backlog_quota_message)

    def _backlog_quota_message(self, entry: TopicEntry) -> ApplyBacklogQuota:
        limit_bytes, policy, _ = self.backlog_quota_of(entry.name)
        return ApplyBacklogQuota(limit_bytes=limit_bytes, policy=policy)

    async def _policy_level(self, msg: Any, what: str) -> tuple[str | None, Any]:
        """The level an admin request about `what` (a namespace's or a topic's backlog
        quota, topic policies) names: exactly one of `msg.namespace` (which must exist) and
        `msg.topic` (an existing base topic: `what` applies to every partition).
        (namespace, None) or (None, the resolved topic)."""
        if (msg.namespace is None) == (msg.topic is None):
            raise InvalidArgument("name exactly one of namespace and topic")
        if msg.namespace is not None:
            namespace = validate_namespace(msg.namespace)
            if not await self._namespace_exists(namespace):
                raise NotFound(f"namespace '{namespace}' does not exist")
            return namespace, None
        resolved = await self._existing(parse_topic(msg.topic))
        if resolved.name.full != resolved.base.full:
            raise FailedPrecondition(f"{resolved.name.full} is a partition: set {what} of {resolved.base.full}"
                                     " (every partition has its topic's)")
        return None, resolved

    async def _quota_key(self, msg: Any) -> tuple[str, str]:
        """(key in the store, what it names) of a request's namespace or topic, which
        must exist."""
        namespace, resolved = await self._policy_level(msg, "the quota")
        if namespace is not None:
            return cr.namespace_backlog_quota_key(namespace), f"namespace '{namespace}'"
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
        if (msg.namespace is None) == (msg.topic is None):
            raise InvalidArgument("name exactly one of namespace and topic")
        await self.metadata.get(cr.LEADER)  # a barrier: read the replica as of now
        if msg.namespace is not None:
            namespace = validate_namespace(msg.namespace)
            if not await self._namespace_exists(namespace):
                raise NotFound(f"namespace '{namespace}' does not exist")
            limit_bytes, policy, source = self.backlog_quota_of(namespace)
        else:
            limit_bytes, policy, source = self.backlog_quota_of((await self._existing(parse_topic(msg.topic))).name)
        return ap.BacklogQuotaInfo(request_id=msg.request_id, limit_bytes=limit_bytes, policy=policy, source=source)

    async def handle_RemoveBacklogQuota(self, msg: ap.RemoveBacklogQuota, origin: Origin) -> Message:
        key, what = await self._quota_key(msg)
        current = await self.metadata.get(key)
        if current is None:
            raise NotFound(f"{what} has no backlog quota of its own")
        if not await self.metadata.transaction({key: current.version}, {}, [key]):
            raise FailedPrecondition(f"the backlog quota of {what} changed meanwhile; retry")
        self._apply_backlog_quotas()
        return Ok(request_id=msg.request_id)

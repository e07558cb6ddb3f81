"""Topic policies per namespace and per topic (Pulsar's namespace and topic policies),
a part of `BrokerActor`.

    admin SetTopicPolicies ──▶ any broker ──Raft──▶ /policies/topic-policies/{ns}[/{topic}]
                                                        │ watch (every broker)
                                                        ▼
              broker serving the topic ── ApplyTopicPolicies ──▶ topic actor ──▶ its subscriptions

1. Set / remove: checked (ranges, the namespace or topic exists), written to the
   metadata store (set changes only the policies it names), then applied to the
   topics served here before the answer.
2. Every broker watches the prefix (a `MetadataWatch` child tells it
   `TopicPoliciesChanged`): it works out each policy in force for each topic it serves
   (the topic's, else its namespace's, else the broker's `policies`, policy by policy)
   and tells the topic, which tells its subscriptions.
   Nothing is lost to a full mailbox. The broker never waits for a topic's room (a
   topic flooded by producers could hold up every admin request for the ask
   timeout, and a `send` that gave up lost the change): a topic whose mailbox is
   full is kept pending and told again by a timer message (`TopicPoliciesPending`),
   with the policies the store holds then, so the last change wins whatever the
   order of the retries (`pending_tells.py`, shared with the backlog quotas). The
   topic tells its subscriptions from inside its group (they are its guests): those
   tells take the group's local lane, which has no bound, so a subscription's full
   mailbox loses nothing either.
3. A topic loaded here (a start, a restart, a move) is spawned with the policies in
   force read from the local replica of the store.
"""

from __future__ import annotations

from typing import Any

from danube_zmq.actors.config import TOPIC_POLICY_NAMES, topic_policy_default
from danube_zmq.actors.topic_registry import TopicEntry
from danube_zmq.runtime.actor import Origin
from danube_zmq.transport import admin_protocol as ap
from danube_zmq.transport import cluster_records as cr
from danube_zmq.transport.codec import Message
from danube_zmq.transport.common import Ok
from danube_zmq.transport.errors import DanubeError, FailedPrecondition, InternalError, InvalidArgument, NotFound
from danube_zmq.transport.internal_protocol import ApplyTopicPolicies, TopicPoliciesChanged, TopicPoliciesPending
from danube_zmq.transport.topic_name import TopicName, parse_topic, validate_namespace

# The counts' and rates' range (as the broker's own, actors/config.py): int64 on the wire.
_VALUE_MAX = 2**63 - 1


def _record(key: str, data: bytes) -> cr.TopicPoliciesRecord:
    """A record that cannot be read is an error naming it: a policy silently dropped
    would let a topic past it."""
    try:
        return cr.decode(data, cr.TopicPoliciesRecord)
    except DanubeError as exc:
        raise InternalError(f"metadata record {key} cannot be read ({exc}): the topic policies are unknown;"
                            f" fix it (danube admin metadata put/delete {key}) or remove the policies") from None


class BrokerTopicPolicies:
    """Mixed into `BrokerActor`; uses its metadata store, config and topics."""

    def topic_policies_of(self, name: TopicName | str) -> tuple[ApplyTopicPolicies, dict[str, str]]:
        """The policies in force for topic or partition `name` (a TopicName) or for the
        topics of namespace `name` (a str), and each one's source ("topic", "namespace",
        "broker"), from the local replica of the store."""
        if isinstance(name, str):
            keys = [(cr.namespace_topic_policies_key(name), "namespace")]
        else:
            keys = [(cr.topic_policies_key(name.base.full), "topic"),
                    (cr.namespace_topic_policies_key(name.namespace), "namespace")]
        levels = []
        for key, source in keys:
            value = self.metadata.local_get(key)
            if value is not None:
                levels.append((_record(key, value.value), source))
        values: dict[str, int] = {}
        sources: dict[str, str] = {}
        for policy in TOPIC_POLICY_NAMES:
            values[policy], sources[policy] = next(
                ((getattr(record, policy), source) for record, source in levels
                 if getattr(record, policy) is not None),
                (topic_policy_default(self.config, policy), "broker"))
        return ApplyTopicPolicies(**values), sources

    def handle_TopicPoliciesChanged(self, msg: TopicPoliciesChanged) -> None:
        self._apply_topic_policies()

    def handle_TopicPoliciesPending(self, msg: TopicPoliciesPending) -> None:
        self._tell_topic_policies(self.policies_pending.due(self.topics))

    def _apply_topic_policies(self) -> None:
        self._tell_topic_policies(list(self.topics.values()))

    def _tell_topic_policies(self, entries: list[TopicEntry]) -> None:
        self.policies_pending.tell(self.system, self.endpoint, entries, lambda entry: self.topic_policies_of(entry.name)[0])

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
        elif not 0 <= value <= _VALUE_MAX:
            zero = "never" if policy == "subscription_expiration_ms" else "unlimited"
            raise InvalidArgument(f"{policy} must be in 0..{_VALUE_MAX} (0: {zero}), got {value}")

    async def handle_SetTopicPolicies(self, msg: ap.SetTopicPolicies, origin: Origin) -> Message:
        given = {policy: getattr(msg, policy) for policy in TOPIC_POLICY_NAMES if getattr(msg, policy) is not None}
        if not given:
            raise InvalidArgument(f"name at least one policy: {', '.join(TOPIC_POLICY_NAMES)}")
        for policy, value in given.items():
            self._check_policy(policy, value)
        key, what = await self._policies_key(msg)
        current = await self.metadata.get(key)
        old = cr.TopicPoliciesRecord() if current is None else _record(key, current.value)
        record = cr.TopicPoliciesRecord(**{p: given.get(p, getattr(old, p)) for p in TOPIC_POLICY_NAMES})
        if not await self.metadata.transaction({key: 0 if current is None else current.version},
                                               {key: cr.encode(record)}):
            raise FailedPrecondition(f"the topic policies of {what} changed meanwhile; retry")
        self._apply_topic_policies()  # queued here before the answer; other brokers follow their watch
        return Ok(request_id=msg.request_id)

    async def handle_GetTopicPolicies(self, msg: ap.GetTopicPolicies, origin: Origin) -> Message:
        if (msg.namespace is None) == (msg.topic is None):
            raise InvalidArgument("name exactly one of namespace and topic")
        await self.metadata.get(cr.LEADER)  # a barrier: read the replica as of now
        if msg.namespace is not None:
            namespace = validate_namespace(msg.namespace)
            if not await self._namespace_exists(namespace):
                raise NotFound(f"namespace '{namespace}' does not exist")
            policies, sources = self.topic_policies_of(namespace)
        else:
            policies, sources = self.topic_policies_of((await self._existing(parse_topic(msg.topic))).name)
        values = {policy: getattr(policies, policy) for policy in TOPIC_POLICY_NAMES}
        return ap.TopicPoliciesInfo(request_id=msg.request_id, values=values, sources=sources)

    async def handle_RemoveTopicPolicies(self, msg: ap.RemoveTopicPolicies, origin: Origin) -> Message:
        key, what = await self._policies_key(msg)
        current = await self.metadata.get(key)
        if current is None:
            raise NotFound(f"{what} has no topic policies of its own")
        if not await self.metadata.transaction({key: current.version}, {}, [key]):
            raise FailedPrecondition(f"the topic policies of {what} changed meanwhile; retry")
        self._apply_topic_policies()
        return Ok(request_id=msg.request_id)

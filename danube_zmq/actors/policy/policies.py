"""The policies in force for a topic or a namespace, and where each comes from (pure).

Three kinds of policy live in the metadata store over the broker's `policies` config:
backlog quotas (per namespace and per topic), topic policies (per namespace and per
topic, policy by policy) and what a namespace allows of topic creation (its limits and
its auto topic creation policy, per namespace only). One rule decides them all:

    the topic's own value ──▶ else its namespace's ──▶ else the broker's config
        source "topic"           source "namespace"        source "broker"

`effective` is that rule; the functions below apply it to each kind's records, read
through `read` (a key -> its bytes, or None), which the caller points at the local
replica of the store. No I/O here: the same inputs give the same answer, so the
randomized tests (tests/unit/actors/policy/test_policies.py) check the rule against every shape of
records.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple, TypeVar

from danube_zmq.config.broker_config import AUTO_TOPIC_CREATION_POLICIES, TOPIC_POLICY_NAMES, BrokerConfig, topic_policy_default
from danube_zmq.transport import cluster_records as cr
from danube_zmq.transport.errors import DanubeError, InternalError
from danube_zmq.transport.internal_protocol import ApplyTopicPolicies
from danube_zmq.transport.topic_name import TopicName

__all__ = ["AutoTopicCreation", "NamespaceLimits", "Read", "auto_topic_creation", "backlog_quota", "creation_record",
           "effective", "limits_record", "namespace_limits", "topic_policies", "topic_policies_record"]

T = TypeVar("T")
Read = Callable[[str], bytes | None]


def effective(topic: T | None, namespace: T | None, default: T) -> tuple[T, str]:
    """The value in force and its source: the topic's own when it has one, else its
    namespace's, else the broker's config default."""
    if topic is not None:
        return topic, "topic"
    if namespace is not None:
        return namespace, "namespace"
    return default, "broker"


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


# A record that cannot be read is an error naming it: a policy or limit silently dropped
# would let a topic or namespace past it.
def topic_policies_record(key: str, data: bytes) -> cr.TopicPoliciesRecord:
    try:
        return cr.decode(data, cr.TopicPoliciesRecord)
    except DanubeError as exc:
        raise InternalError(f"metadata record {key} cannot be read ({exc}): the topic policies are unknown;"
                            f" fix it (danube admin metadata put/delete {key}) or remove the policies") from None


def _decoded(key: str, data: bytes, record_type: type, what: str) -> Any:
    try:
        return cr.decode(data, record_type)
    except DanubeError as exc:
        raise InternalError(f"metadata record {key} cannot be read ({exc}): {what} unknown;"
                            f" fix it (danube admin metadata put/delete {key}) or remove it") from None


def limits_record(key: str, data: bytes) -> cr.NamespaceLimitsRecord:
    return _decoded(key, data, cr.NamespaceLimitsRecord, "the namespace's limits are")


def creation_record(key: str, data: bytes) -> cr.AutoTopicCreationRecord:
    return _decoded(key, data, cr.AutoTopicCreationRecord, "the namespace's auto topic creation policy is")


def _levels(name: TopicName | str, topic_key: Callable[[str], str],
            namespace_key: Callable[[str], str]) -> tuple[str | None, str]:
    """The keys of the topic's and the namespace's own records: `name` is a topic or
    partition (a TopicName; a partition has its topic's) or a namespace (a str)."""
    if isinstance(name, str):
        return None, namespace_key(name)
    return topic_key(name.base.full), namespace_key(name.namespace)


def backlog_quota(read: Read, config: BrokerConfig, name: TopicName | str) -> tuple[int, str, str]:
    """(limit_bytes, policy, source) in force for topic `name` or the topics of namespace
    `name`; a level's record holds both, so the first level that has one decides both."""
    topic_key, namespace_key = _levels(name, cr.topic_backlog_quota_key, cr.namespace_backlog_quota_key)
    records = [None if key is None or (data := read(key)) is None else cr.decode(data, cr.BacklogQuotaRecord)
               for key in (topic_key, namespace_key)]
    policies = config.policies
    default = cr.BacklogQuotaRecord(limit_bytes=policies.backlog_quota_bytes_max, policy=policies.backlog_quota_policy)
    record, source = effective(records[0], records[1], default)
    return record.limit_bytes, record.policy, source


def topic_policies(read: Read, config: BrokerConfig,
                   name: TopicName | str) -> tuple[ApplyTopicPolicies, dict[str, str]]:
    """The topic policies in force for topic `name` or the topics of namespace `name`, and
    each one's source, decided policy by policy."""
    topic_key, namespace_key = _levels(name, cr.topic_policies_key, cr.namespace_topic_policies_key)
    records = [None if key is None or (data := read(key)) is None else topic_policies_record(key, data)
               for key in (topic_key, namespace_key)]
    values: dict[str, int] = {}
    sources: dict[str, str] = {}
    for policy in TOPIC_POLICY_NAMES:
        topic, namespace = (None if record is None else getattr(record, policy) for record in records)
        values[policy], sources[policy] = effective(topic, namespace, topic_policy_default(config, policy))
    return ApplyTopicPolicies(**values), sources


def namespace_limits(read: Read, config: BrokerConfig, namespace: str) -> NamespaceLimits:
    """The limits in force for `namespace` (a namespace level only: no topic has its own)."""
    key = cr.namespace_limits_key(namespace)
    data = read(key)
    record = cr.NamespaceLimitsRecord() if data is None else limits_record(key, data)
    policies = config.policies
    return NamespaceLimits(*effective(None, record.topics_max, policies.topics_per_namespace_max),
                           *effective(None, record.partitions_max, policies.partitions_per_topic_max))


def auto_topic_creation(read: Read, config: BrokerConfig, namespace: str) -> AutoTopicCreation:
    """The auto topic creation policy in force for `namespace`, policy by policy."""
    key = cr.auto_topic_creation_key(namespace)
    data = read(key)
    record = cr.AutoTopicCreationRecord() if data is None else creation_record(key, data)
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for policy in AUTO_TOPIC_CREATION_POLICIES:
        values[policy], sources[policy] = effective(None, getattr(record, policy), getattr(config.policies, policy))
    return AutoTopicCreation(**values, sources=sources)

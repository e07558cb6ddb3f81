"""The policies in force (`actors/policy/policies.py`, pure): the topic's own value, else its
namespace's, else the broker's config, for every kind of policy, checked on randomized
records (hypothesis) against the rule written out a second way, record by record."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from danube_zmq.actors.policy import policies
from danube_zmq.config.broker_config import (
    AUTO_TOPIC_CREATION_POLICIES,
    BACKLOG_QUOTA_POLICIES,
    TOPIC_POLICY_NAMES,
    BrokerConfig,
    PoliciesSection,
    topic_policy_default,
)
from danube_zmq.transport import cluster_records as cr
from danube_zmq.transport.errors import InternalError
from danube_zmq.transport.topic_name import parse_topic

CONFIG = BrokerConfig(policies=PoliciesSection(backlog_quota_bytes_max=123, topics_per_namespace_max=77))
TOPIC = parse_topic("/sales/orders")
PARTITION = parse_topic("/sales/orders-part-3")

maybe_int = st.one_of(st.none(), st.integers(min_value=0, max_value=2**40))


@given(st.one_of(st.none(), st.integers()), st.one_of(st.none(), st.integers()), st.integers())
def test_the_first_level_that_sets_a_value_decides_it_and_is_named(topic, namespace, default) -> None:
    """`effective` gives the topic's value when set, else the namespace's, else the
    default, each with its source."""
    value, source = policies.effective(topic, namespace, default)
    if topic is not None:
        assert (value, source) == (topic, "topic")
    elif namespace is not None:
        assert (value, source) == (namespace, "namespace")
    else:
        assert (value, source) == (default, "broker")


quota_records = st.one_of(st.none(), st.builds(cr.BacklogQuotaRecord, limit_bytes=st.integers(0, 2**40),
                                               policy=st.sampled_from(BACKLOG_QUOTA_POLICIES)))
policy_records = st.one_of(st.none(), st.builds(cr.TopicPoliciesRecord, **dict.fromkeys(TOPIC_POLICY_NAMES, maybe_int)))


def _store(**records: object) -> policies.Read:
    data = {key: cr.encode(record) for key, record in records.items() if record is not None}
    return data.get


@given(quota_records, quota_records, st.booleans())
def test_a_backlog_quota_is_a_whole_record_of_the_first_level_that_has_one(topic, namespace, partition) -> None:
    """A partition has its topic's quota; a level's record decides limit and policy
    together; a namespace's quota ignores any topic's."""
    read = _store(**{cr.topic_backlog_quota_key(TOPIC.full): topic,
                     cr.namespace_backlog_quota_key(TOPIC.namespace): namespace})
    got = policies.backlog_quota(read, CONFIG, PARTITION if partition else TOPIC)
    record, source = (topic, "topic") if topic else (namespace, "namespace") if namespace else (None, "broker")
    if record is None:
        assert got == (123, CONFIG.policies.backlog_quota_policy, "broker")
    else:
        assert got == (record.limit_bytes, record.policy, source)
    namespace_got = policies.backlog_quota(read, CONFIG, TOPIC.namespace)
    assert namespace_got[2] == ("namespace" if namespace else "broker")


@given(policy_records, policy_records)
def test_topic_policies_are_decided_policy_by_policy(topic, namespace) -> None:
    """Each policy on its own: a topic setting one policy leaves the others to its
    namespace or the broker."""
    read = _store(**{cr.topic_policies_key(TOPIC.full): topic,
                     cr.namespace_topic_policies_key(TOPIC.namespace): namespace})
    values, sources = policies.topic_policies(read, CONFIG, PARTITION)
    for name in TOPIC_POLICY_NAMES:
        own = None if topic is None else getattr(topic, name)
        inherited = None if namespace is None else getattr(namespace, name)
        if own is not None:
            assert (getattr(values, name), sources[name]) == (own, "topic")
        elif inherited is not None:
            assert (getattr(values, name), sources[name]) == (inherited, "namespace")
        else:
            assert (getattr(values, name), sources[name]) == (topic_policy_default(CONFIG, name), "broker")


@given(st.one_of(st.none(), st.builds(cr.NamespaceLimitsRecord, topics_max=maybe_int, partitions_max=maybe_int)))
def test_namespace_limits_are_the_namespaces_else_the_brokers(record) -> None:
    limits = policies.namespace_limits(_store(**{cr.namespace_limits_key("sales"): record}), CONFIG, "sales")
    own = record or cr.NamespaceLimitsRecord()
    assert (limits.topics_max, limits.topics_max_source) == (
        (own.topics_max, "namespace") if own.topics_max is not None else (77, "broker"))
    assert (limits.partitions_max, limits.partitions_max_source) == (
        (own.partitions_max, "namespace") if own.partitions_max is not None
        else (CONFIG.policies.partitions_per_topic_max, "broker"))


creation_records = st.one_of(st.none(), st.builds(
    cr.AutoTopicCreationRecord, allow_auto_topic_creation=st.one_of(st.none(), st.booleans()),
    allow_auto_topic_creation_type=st.one_of(st.none(), st.sampled_from(["partitioned", "non-partitioned"])),
    default_num_partitions=st.one_of(st.none(), st.integers(1, 100)),
    auto_topic_creation_dispatch=st.one_of(st.none(), st.sampled_from(["reliable", "non_reliable"]))))


@given(creation_records)
def test_auto_topic_creation_is_decided_policy_by_policy(record) -> None:
    policy = policies.auto_topic_creation(_store(**{cr.auto_topic_creation_key("sales"): record}), CONFIG, "sales")
    own = dataclasses.asdict(record) if record is not None else {}
    for name in AUTO_TOPIC_CREATION_POLICIES:
        if own.get(name) is not None:
            assert (getattr(policy, name), policy.sources[name]) == (own[name], "namespace")
        else:
            assert (getattr(policy, name), policy.sources[name]) == (getattr(CONFIG.policies, name), "broker")


def test_an_unreadable_record_is_an_error_naming_its_key() -> None:
    """A policy silently dropped would let a topic past it: the key is named instead."""
    key = cr.topic_policies_key(TOPIC.full)
    with pytest.raises(InternalError, match=f"metadata record {key} cannot be read"):
        policies.topic_policies({key: b"\x01garbage"}.get, CONFIG, TOPIC)

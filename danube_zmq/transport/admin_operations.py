"""The admin operations, declared once: for each admin request, its name, what it
does, its parameters (the request's fields, with their types and defaults, and a help
line each), the permission it needs and on what, and whether it changes the cluster.

    OPERATIONS ──▶ security/requirements.py   the permission table's admin rows
               ──▶ doors/mcp/server.py          the MCP tools of single operations
               ──▶ doors/grpc/admin_door.py  Danube's admin RPCs, each naming its operations (its table in docs)
               ◀── checked: every `danube admin` command and console action names the
                   operation it performs, and takes its parameters (tests)

A new admin operation is its request and answer in `admin_protocol.py`, its row here,
its handler in the broker, an `AdminClient` method, and a `danube admin` command (a
test fails until that command exists and takes every parameter). Its permission, its
MCP tool and its line in docs/security.md's table follow from the row.

The broker-to-broker requests of a move's WAL hand-over (`HANDOVER_REQUESTS`) are not
operations: only brokers send them.
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from dataclasses import dataclass
from typing import Any, Literal

from danube_zmq.transport import admin_protocol as ap
from danube_zmq.transport.client_protocol import DispatchStrategy
from danube_zmq.transport.codec import Message

__all__ = ["OPERATIONS", "Operation", "Param", "by_name", "by_request", "type_name"]

# Where the resource a request acts on is named (security/requirements.py's locators).
Resource = Literal["cluster", "namespace", "topic", "topic_or_namespace"]

# Help for parameters that mean the same in every operation naming them.
_HELP = {
    "namespace": "A namespace name, e.g. default.",
    "topic": "A topic, /namespace/topic (one partition: /namespace/topic-part-N).",
    "subscription": "A subscription name of the topic.",
    "broker_id": "A broker id, as list_brokers shows it.",
    "node_id": "A Raft node id (a broker's id).",
    "subject": "A schema subject (schemas are registered under subjects).",
    "snapshot_id": "A snapshot id, as list_snapshots shows it.",
    "key": "A metadata key, e.g. /cluster/assignments/default/orders.",
    "value": "The value's bytes.",
    "linearizable": "False: this broker's applied state, possibly stale (no Raft round).",
    "principal": "A principal: a user, service account or broker name.",
    "principal_type": "user, service_account or broker.",
    "public_key": "A CURVE public key (Z85, 40 characters).",
    "max_producers_per_topic": "Producers per topic at most.",
    "max_subscriptions_per_topic": "Subscriptions per topic at most.",
    "max_consumers_per_topic": "Consumers per topic at most.",
    "max_consumers_per_subscription": "Consumers per subscription at most.",
    "max_message_size": "Bytes per message at most.",
    "max_publish_rate": "Messages per second a producer may publish, at most.",
    "max_dispatch_rate": "Messages per second a subscription is dispatched, at most.",
    "retention_time_ms": "Acknowledged messages are kept this long (reliable topics).",
    "retention_bytes_max": "Acknowledged messages are kept up to this many bytes (reliable topics).",
    "subscription_expiration_ms": "A subscription with no consumer for this long is deleted.",
    "message_ttl_s": "Messages older than this many seconds are acknowledged for every subscription.",
    "deduplication": "1: a message whose producer sent its sequence id before is not stored again; 0: off.",
    "compaction_threshold_bytes": "The topic is compacted once its log holds this many bytes past the last"
                                  " compaction (0: never).",
}
# Parameters that take one of a few values: (operation or "" for any, parameter) -> values.
_CHOICES: dict[tuple[str, str], tuple[str, ...]] = {
    ("", "policy"): ("producer_request_hold", "producer_exception", "consumer_backlog_eviction"),
    ("", "validation_policy"): ("none", "warn", "enforce"),
    ("", "principal_type"): ("user", "service_account", "broker"),
    ("create_binding", "principal_type"): ("user", "service_account"),
    ("add_client_key", "principal_type"): ("user", "service_account"),
    ("", "backoff"): ("fixed", "exponential"),
    ("", "poison_policy"): ("drop", "dead_letter", "block"),
}
# Int parameters whose values are an enum's (given by name where a person types them).
_ENUMS: dict[str, type[enum.Enum]] = {"dispatch_strategy": DispatchStrategy}
_SCOPE_HELP = {"namespace": "The namespace (give this or topic).", "topic": "The topic (give this or namespace)."}


@dataclass(frozen=True, slots=True)
class Param:
    name: str
    type: Any  # the request field's type, e.g. int | None
    required: bool
    default: Any
    help: str


@dataclass(frozen=True, slots=True)
class Operation:
    """`name`: snake_case, the MCP tool's name. `permission`: an RBAC permission's
    Danube name (security/rbac.py `Permission`), needed on `resource`. `destructive`:
    it deletes or skips data; `idempotent`: doing it twice is doing it once."""

    name: str
    request: type[Message]
    help: str
    permission: str
    resource: Resource
    writes: bool
    destructive: bool = False
    idempotent: bool = False
    help_of: dict[str, str] = dataclasses.field(default_factory=dict)  # per-parameter help beyond `_HELP`

    def choices(self, param: str) -> tuple[str, ...] | None:
        """The values a text parameter takes, or an int enum's names (given by name)."""
        if param in _ENUMS:
            return tuple(member.name.lower() for member in _ENUMS[param])
        return _CHOICES.get((self.name, param)) or _CHOICES.get(("", param))

    @property
    def params(self) -> tuple[Param, ...]:
        """The request's fields but `request_id`, in order."""
        hints = typing.get_type_hints(self.request)
        out = []
        for field in dataclasses.fields(self.request):
            if field.name == "request_id":
                continue
            required = field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING
            default = None if required else (field.default if field.default is not dataclasses.MISSING
                                              else field.default_factory())  # type: ignore[misc]
            text = self.help_of.get(field.name) or _HELP.get(field.name)
            if text is None:
                raise AssertionError(f"{self.name}: no help for parameter {field.name}")
            out.append(Param(field.name, hints[field.name], required, default, text))
        return tuple(out)


def _read(name: str, request: type[Message], help: str, permission: str, resource: Resource, /,
          **help_of: str) -> Operation:
    return Operation(name, request, help, permission, resource, writes=False, help_of=help_of)


def _write(name: str, request: type[Message], help: str, permission: str, resource: Resource, /, *,
           destructive: bool = False, idempotent: bool = False, **help_of: str) -> Operation:
    return Operation(name, request, help, permission, resource, writes=True, destructive=destructive,
                     idempotent=idempotent, help_of=help_of)


_NS, _TOPIC, _BROKER, _CLUSTER, _SCHEMA = "ManageNamespace", "ManageTopic", "ManageBroker", "ManageCluster", "ManageSchema"

OPERATIONS: tuple[Operation, ...] = (
    # ---- namespaces and their policies
    _read("list_namespaces", ap.ListNamespaces, "The namespaces of the cluster.", _NS, "cluster"),
    _write("create_namespace", ap.CreateNamespace, "Creates a namespace (letters, digits, '_' and '-').",
           _NS, "namespace"),
    _write("delete_namespace", ap.DeleteNamespace, "Deletes an empty namespace.", _NS, "namespace",
           destructive=True),
    _write("set_namespace_limits", ap.SetNamespaceLimits,
           "Sets a namespace's topic and partition limits, over the broker's defaults.", _NS, "namespace",
           idempotent=True, topics_max="Topics in the namespace at most.",
           partitions_max="Partitions of one topic at most."),
    _read("get_namespace_limits", ap.GetNamespaceLimits,
          "The topic and partition limits in force for a namespace, and where each is set.", _NS, "namespace"),
    _write("remove_namespace_limits", ap.RemoveNamespaceLimits,
           "Removes a namespace's own limits: the broker's defaults apply.", _NS, "namespace", idempotent=True),
    _write("set_auto_topic_creation", ap.SetAutoTopicCreation,
           "Sets a namespace's auto topic creation: what subscribing to a missing topic creates.", _NS, "namespace",
           idempotent=True, allow_auto_topic_creation="Whether a subscriber creates a missing topic.",
           allow_auto_topic_creation_type="non-partitioned or partitioned.",
           default_num_partitions="Partitions of a topic created partitioned.",
           auto_topic_creation_dispatch="non_reliable or reliable: the created topic's dispatch."),
    _read("get_auto_topic_creation", ap.GetAutoTopicCreation,
          "The auto topic creation policy in force for a namespace, and where it is set.", _NS, "namespace"),
    _write("remove_auto_topic_creation", ap.RemoveAutoTopicCreation,
           "Removes a namespace's own auto topic creation policy: the broker's applies.", _NS, "namespace",
           idempotent=True),
    _write("set_backlog_quota", ap.SetBacklogQuota,
           "Sets the backlog quota of a namespace or of a topic: what happens when the slowest subscription's"
           " backlog passes it.", _NS, "topic_or_namespace", idempotent=True,
           limit_bytes="The backlog's bound in bytes.",
           policy="producer_request_hold, producer_exception or consumer_backlog_eviction.", **_SCOPE_HELP),
    _read("get_backlog_quota", ap.GetBacklogQuota,
          "The backlog quota in force for a namespace or a topic, and where it is set.", _NS, "topic_or_namespace",
          **_SCOPE_HELP),
    _write("remove_backlog_quota", ap.RemoveBacklogQuota,
           "Removes the backlog quota set on a namespace or a topic: the next level's applies.", _NS,
           "topic_or_namespace", idempotent=True, **_SCOPE_HELP),
    _write("set_topic_policies", ap.SetTopicPolicies,
           "Sets topic policies (limits, message size, rates, retention, subscription expiration) of a namespace"
           " or a topic; the policies left out keep their values.", _NS, "topic_or_namespace", idempotent=True,
           **_SCOPE_HELP),
    _read("get_topic_policies", ap.GetTopicPolicies,
          "The topic policies in force for a namespace or a topic, and where each is set.", _NS,
          "topic_or_namespace", **_SCOPE_HELP),
    _write("remove_topic_policies", ap.RemoveTopicPolicies,
           "Removes every topic policy set on a namespace or a topic: the next level's apply.", _NS,
           "topic_or_namespace", idempotent=True, **_SCOPE_HELP),
    # ---- topics and subscriptions
    _read("list_topics", ap.ListTopics,
          "The topics of a namespace: name, partitions, dispatch strategy, broker.", _TOPIC, "namespace"),
    _write("create_topic", ap.CreateTopic, "Creates a topic (and its partitions).", _TOPIC, "topic",
           partitions="0: a non-partitioned topic; N: partitions /ns/t-part-0..N-1.",
           dispatch_strategy="non_reliable, or reliable: stored and redelivered until acknowledged."),
    _write("delete_topic", ap.DeleteTopic,
           "Deletes a topic with every partition, its messages and subscriptions, closing its clients.", _TOPIC,
           "topic", destructive=True),
    _read("describe_topic", ap.DescribeTopic,
          "A topic in full: every partition's next offset, producers, counters, WAL damage, and its subscriptions.",
          _TOPIC, "topic"),
    _read("list_subscriptions", ap.ListSubscriptions, "The subscription names of a topic.", _TOPIC, "topic"),
    _write("unsubscribe", ap.Unsubscribe, "Deletes a subscription and its cursor, closing its consumers.", _TOPIC,
           "topic", destructive=True),
    _write("seek_subscription", ap.SeekSubscription,
           "Moves a subscription's cursor (a reliable topic): messages are redelivered or skipped.", _TOPIC, "topic",
           destructive=True, offset="An offset of one partition (give this or publish_time).",
           publish_time="Milliseconds since the epoch: the first message published at or after it."),
    _write("set_failure_policy", ap.SetFailurePolicy,
           "Sets a subscription's redelivery and dead-letter policy (a reliable topic).", _TOPIC, "topic",
           idempotent=True, max_redelivery_count="Deliveries of a message before the poison policy applies.",
           ack_timeout_ms="An unacknowledged delivery is redelivered after this long (0: never).",
           base_redelivery_delay_ms="The first redelivery's delay.",
           max_redelivery_delay_ms="The longest redelivery delay.", backoff="fixed or exponential.",
           poison_policy="drop, dead_letter or block: what a message past max_redelivery_count meets.",
           dead_letter_topic="The dead-letter topic (poison_policy dead_letter); empty clears it."),
    _read("get_failure_policy", ap.GetFailurePolicy, "A subscription's failure policy (a reliable topic).", _TOPIC,
          "topic"),
    _write("set_dispatch_config", ap.SetDispatchConfig,
           "Sets a subscription's window of unacknowledged deliveries per consumer (a reliable topic).", _TOPIC,
           "topic", idempotent=True, max_unacked_messages="1..10000 unacknowledged deliveries per consumer."),
    _read("get_dispatch_config", ap.GetDispatchConfig, "A subscription's dispatch window (a reliable topic).",
          _TOPIC, "topic"),
    _write("unload_topic", ap.UnloadTopic,
           "Moves a topic to another broker; offsets continue there and its clients reconnect.", _TOPIC, "topic"),
    _write("compact_topic", ap.CompactTopic,
           "Compacts a reliable topic in the background: the latest message per key, read with read_compacted;"
           " describe_topic shows its status.", _TOPIC, "topic"),
    _write("repair_topic", ap.RepairTopic,
           "Serves again a partition whose WAL is damaged, giving up the records past the damage.", _TOPIC, "topic",
           destructive=True, accept_loss="Required: the records past the damage are lost."),
    _write("reassign_topic", ap.ReassignTopic,
           "Gives a partition whose broker is gone, with the only copy of its WAL, to another broker.", _TOPIC,
           "topic", destructive=True, force="Required: what only the gone broker held is lost."),
    _write("configure_topic_schema", ap.ConfigureTopicSchema,
           "Binds a topic to a schema subject and sets how its messages are validated.", _SCHEMA, "topic",
           idempotent=True, validation_policy="none, warn or enforce.",
           payload_validation="Also decode each payload against the schema (not only its schema id)."),
    _read("get_topic_schema_config", ap.GetTopicSchemaConfig, "A topic's schema binding and validation.",
          "Lookup", "topic"),
    # ---- brokers and the cluster
    _read("list_brokers", ap.ListBrokers, "The brokers of the cluster: id, URLs, role, status.", _BROKER, "cluster"),
    _read("get_cluster_balance", ap.GetClusterBalance,
          "The cluster's load balance: each broker's load and topics, the assignment strategy.", _BROKER, "cluster"),
    _write("rebalance_cluster", ap.RebalanceCluster, "Moves topics between brokers (none with dry_run).", _CLUSTER,
           "cluster", dry_run="Plan only: move nothing.", max_moves="Moves at most (default: the policy's)."),
    _write("unload_broker", ap.UnloadBroker, "Drains a broker: it takes no topics and its topics move away.",
           _BROKER, "cluster"),
    _write("activate_broker", ap.ActivateBroker, "Lets a drained broker take topics again.", _BROKER, "cluster",
           idempotent=True),
    _read("cluster_status", ap.ClusterStatus,
          "The Raft metadata cluster as this broker sees it: role, term, leader, indexes, members.", _BROKER,
          "cluster"),
    _write("add_cluster_node", ap.AddClusterNode,
           "Adds a node (started to join) as a learner of the metadata cluster.", _CLUSTER, "cluster",
           address="The node's Raft address, tcp://host:port."),
    _write("promote_cluster_node", ap.PromoteClusterNode, "Makes a caught-up learner a voter.", _CLUSTER, "cluster"),
    _write("remove_cluster_node", ap.RemoveClusterNode, "Removes a voter or learner from the metadata cluster.",
           _CLUSTER, "cluster", destructive=True),
    # ---- the metadata store itself
    _read("metadata_get", ap.MetadataGet, "One key of the metadata store, with its versions.", _CLUSTER, "cluster"),
    _read("metadata_list", ap.MetadataList, "The keys under a prefix, sorted.", _CLUSTER, "cluster",
          prefix="A key prefix, e.g. /cluster/.", limit="Keys at most."),
    _write("metadata_put", ap.MetadataPut, "Sets a key of the metadata store.", _CLUSTER, "cluster",
           destructive=True, ttl_ms="A lease: the key is deleted after this long unless set again."),
    _write("metadata_compare_and_swap", ap.MetadataCompareAndSwap,
           "Sets a key if its version is the one expected.", _CLUSTER, "cluster", destructive=True,
           expected_version="The key's version now (0: absent)."),
    _write("metadata_delete", ap.MetadataDelete, "Deletes a key, or every key under a prefix.", _CLUSTER, "cluster",
           destructive=True, prefix="Delete every key under `key`."),
    # ---- snapshots
    _write("create_snapshot", ap.CreateSnapshot, "Snapshots the reliable topics served by the broker.", _CLUSTER,
           "cluster", topic="A topic name or pattern; all when left out."),
    _read("list_snapshots", ap.ListSnapshots, "The snapshots taken.", _CLUSTER, "cluster"),
    _read("describe_snapshot", ap.DescribeSnapshot, "A snapshot's topics, records and subscriptions.", _CLUSTER,
          "cluster"),
    _write("delete_snapshot", ap.DeleteSnapshot, "Deletes a snapshot.", _CLUSTER, "cluster", destructive=True),
    # ---- security
    _write("create_role", ap.CreateRole, "Creates an RBAC role: a named set of permissions.", _CLUSTER, "cluster",
           name="The role's name.", permissions="Permissions: Lookup, Produce, Consume, ManageNamespace, ..."),
    _read("list_roles", ap.ListRoles, "The RBAC roles and their permissions.", _CLUSTER, "cluster"),
    _write("delete_role", ap.DeleteRole, "Deletes an RBAC role.", _CLUSTER, "cluster", destructive=True,
           name="The role's name."),
    _write("create_binding", ap.CreateBinding, "Gives a principal roles at a scope.", _CLUSTER, "cluster",
           roles="Role names.", scope="cluster, namespace:NS or topic:/ns/t."),
    _read("list_bindings", ap.ListBindings, "The RBAC bindings: principal, type, roles, scope.", _CLUSTER, "cluster"),
    _write("delete_binding", ap.DeleteBinding, "Removes a principal's binding.", _CLUSTER, "cluster",
           destructive=True, binding_id="A binding id, as list_bindings shows it."),
    _write("revoke_token", ap.RevokeToken, "Refuses a token (by its jti) from now until it expires.", _CLUSTER,
           "cluster", jti="The token's jti claim.", expires_at_ms="The token's expiry, ms since the epoch."),
    _read("list_revoked_tokens", ap.ListRevokedTokens, "The revoked tokens and when each revocation lapses.",
          _CLUSTER, "cluster"),
    _write("add_client_key", ap.AddClientKey, "Allows a CURVE client key, bound to a principal.", _CLUSTER,
           "cluster"),
    _read("list_client_keys", ap.ListClientKeys, "The CURVE client keys allowed, with their principals.", _CLUSTER,
          "cluster"),
    _write("remove_client_key", ap.RemoveClientKey, "Removes a CURVE client key from the allow-list.", _CLUSTER,
           "cluster", destructive=True),
)

_BY_NAME = {op.name: op for op in OPERATIONS}
_BY_REQUEST = {op.request: op for op in OPERATIONS}
assert len(_BY_NAME) == len(_BY_REQUEST) == len(OPERATIONS), "an operation declared twice"


def by_name(name: str) -> Operation:
    return _BY_NAME[name]


def by_request(request: type[Message]) -> Operation | None:
    return _BY_REQUEST.get(request)


def type_name(annotation: Any) -> str:
    """`int | None` -> "int | None": a parameter's type as a person reads it."""
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        return " | ".join(type_name(a) for a in typing.get_args(annotation))
    if annotation is type(None):
        return "None"
    return annotation.__name__ if isinstance(annotation, type) and not typing.get_args(annotation) else str(annotation)

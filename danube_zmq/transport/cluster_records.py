"""The cluster's records in the Raft metadata store, and where each one lives.

Every broker reads and writes these through Raft, so they are a protocol like the
others: declared once, msgpack arrays checked field by field on decode.

    /namespaces/{ns}                      b""                 a namespace
    /topics/{ns}/{topic}                  TopicRecord         a topic (partitioned: one record for the base)
    /cluster/register/{broker_id}         BrokerRegistration  a live broker (TTL lease, renewed)
    /cluster/brokers/{broker_id}/state    BrokerStateRecord   active / draining / drained
    /cluster/brokers/{broker_id}/seen     BrokerRegistration  its last registration (no TTL): listed as down when gone
    /cluster/assignments/{ns}/{topic}     Assignment          who serves a topic or partition
    /cluster/unassigned/{ns}/{topic}      Unassigned          a topic or partition waiting for a broker
    /cluster/leader                       LeaderRecord        the broker whose Raft peer leads
    /cluster/load/{broker_id}             LoadReportRecord    CPU, memory and per-topic load (TTL)
    /cluster/backlog-report               BacklogReportRecord the latest Spark backlog report's totals
    /cluster/rebalancing/{ms}-{n}         MoveRecord          a move the load manager made (TTL 1 h)
    /cluster/damaged/{ns}/{topic}         WalDamageRecord     a reliable topic not served: its WAL is damaged
    /topics/{ns}/{topic}/subscriptions/{sub}  CursorRecord    a reliable subscription's cursor and settings
    /topics/{ns}/{topic}/producers/{id}   ProducerRecord      a producer attached to a topic or partition
    /storage/topics/{ns}/{topic}/segments/{base}  SegmentDescriptor (storage/catalog.py)
    /storage/topics/{ns}/{topic}/state    TopicState          where a reliable topic's offsets stopped
    /policies/backlog-quota/{ns}          BacklogQuotaRecord  a namespace's backlog quota (set-backlog-quota)
    /policies/backlog-quota/{ns}/{topic}  BacklogQuotaRecord  a topic's, over its namespace's
    /policies/namespace-limits/{ns}       NamespaceLimitsRecord  a namespace's topic and partition limits
    /policies/auto-topic-creation/{ns}    AutoTopicCreationRecord  what a subscriber's missing topic becomes
    /policies/topic-policies/{ns}         TopicPoliciesRecord a namespace's topic policies (namespaces policies set)
    /policies/topic-policies/{ns}/{topic} TopicPoliciesRecord a topic's, over its namespace's
    /security/roles/{name}                RoleRecord          a role: its permissions
    /security/bindings/{id}               BindingRecord       roles given to a principal at a scope
    /security/revoked/{jti}               RevokedTokenRecord  a revoked token (TTL: until it expires)
    /security/client_keys/{z85}           ClientKeyRecord     an allowed CURVE client key and its principal

Policies live under one prefix of their own so each broker follows them with one
watch (the topics' prefix also carries every cursor write); they go with their topic
or namespace when it is deleted.

Assignments are keyed by topic (Danube keys them by broker) so a lookup on any broker
is one read; each broker watches the prefix and keeps the entries naming it.
"""

from __future__ import annotations

import enum
from typing import TypeVar

import msgpack

from danube_zmq.transport.codec import Message, Protocol, Struct, unpack, wire
from danube_zmq.transport.common import PROTOCOL_VERSION
from danube_zmq.transport.errors import InvalidArgument
from danube_zmq.transport.internal_protocol import DelayedState, FailurePolicyState

T = TypeVar("T", bound=Message)

NAMESPACES = "/namespaces/"
TOPICS = "/topics/"
REGISTER = "/cluster/register/"
BROKERS = "/cluster/brokers/"
ASSIGNMENTS = "/cluster/assignments/"
UNASSIGNED = "/cluster/unassigned/"
LEADER = "/cluster/leader"
LOAD = "/cluster/load/"
BACKLOG_REPORT = "/cluster/backlog-report"
MOVES = "/cluster/rebalancing/"
DAMAGED = "/cluster/damaged/"
POLICIES = "/policies/"
BACKLOG_QUOTAS = "/policies/backlog-quota/"
NAMESPACE_LIMITS = "/policies/namespace-limits/"
TOPIC_POLICIES = "/policies/topic-policies/"
AUTO_TOPIC_CREATION = "/policies/auto-topic-creation/"
SECURITY = "/security/"
ROLES = "/security/roles/"
BINDINGS = "/security/bindings/"
REVOKED = "/security/revoked/"
CLIENT_KEYS = "/security/client_keys/"


def namespace_key(namespace: str) -> str:
    return f"{NAMESPACES}{namespace}"


def topic_record_key(topic: str) -> str:
    """`topic` is the full name, "/ns/name"."""
    return f"/topics{topic}"


def namespace_backlog_quota_key(namespace: str) -> str:
    return f"{BACKLOG_QUOTAS}{namespace}"


def topic_backlog_quota_key(topic: str) -> str:
    """`topic` is the full name of a base topic, "/ns/name" (partitions share its quota)."""
    return f"/policies/backlog-quota{topic}"


def namespace_limits_key(namespace: str) -> str:
    return f"{NAMESPACE_LIMITS}{namespace}"


def auto_topic_creation_key(namespace: str) -> str:
    return f"{AUTO_TOPIC_CREATION}{namespace}"


def namespace_topic_policies_key(namespace: str) -> str:
    return f"{TOPIC_POLICIES}{namespace}"


def topic_policies_key(topic: str) -> str:
    """`topic` is the full name of a base topic, "/ns/name" (partitions share its policies)."""
    return f"/policies/topic-policies{topic}"


def load_key(broker_id: int) -> str:
    return f"{LOAD}{broker_id}"


def register_key(broker_id: int) -> str:
    return f"{REGISTER}{broker_id}"


def state_key(broker_id: int) -> str:
    return f"{BROKERS}{broker_id}/state"


def seen_key(broker_id: int) -> str:
    return f"{BROKERS}{broker_id}/seen"


def broker_name(raft_node_id: int) -> str:
    """A broker's name for people: its Raft node id, as `danube cluster up` names brokers."""
    return f"broker-{raft_node_id}"


def assignment_key(topic: str) -> str:
    return f"/cluster/assignments{topic}"


def unassigned_key(topic: str) -> str:
    return f"/cluster/unassigned{topic}"


def topic_state_key(topic: str) -> str:
    return f"/storage/topics{topic}/state"


def damaged_key(topic: str) -> str:
    return f"/cluster/damaged{topic}"


def producers_prefix(topic: str) -> str:
    return f"/topics{topic}/producers/"


def producer_key(topic: str, producer_id: int) -> str:
    return f"{producers_prefix(topic)}{producer_id}"


def topic_of(key: str, prefix: str) -> str:
    """The full topic name in `prefix` + "ns/name" (the inverse of the key functions)."""
    return "/" + key[len(prefix):]


def broker_of(key: str, prefix: str) -> int | None:
    """The broker id in a `/cluster/register/{id}` or `/cluster/brokers/{id}/...` key."""
    head = key[len(prefix):].split("/", 1)[0]
    return int(head) if head.isdigit() else None


class BrokerMode(enum.StrEnum):
    ACTIVE = "active"
    DRAINING = "draining"
    DRAINED = "drained"


class UnassignedReason(enum.StrEnum):
    NEW = "new"
    UNLOAD = "unload"
    REBALANCE = "rebalance"
    FAILOVER = "failover"


@wire
class TopicRecord(Message):
    """A topic: its dispatch strategy and partitions (0: not partitioned)."""

    TAG = 1
    dispatch_strategy: int
    partitions: int
    created_ms: int
    # Made by a subscriber (auto topic creation) and no producer has attached yet: the
    # first producer's dispatch strategy replaces the policy's, which was a guess.
    adoptable: bool = False


@wire
class BrokerRegistration(Message):
    """A live broker's endpoints; the key has a TTL the broker renews (its lease)."""

    TAG = 2
    broker_id: int
    broker_url: str
    admin_url: str
    raft_node_id: int
    started_ms: int
    metrics_url: str | None = None
    # Its gRPC door for Danube's clients (broker.grpc_listen), if on: where a lookup
    # on another broker's door redirects them.
    grpc_url: str | None = None
    # Its gRPC admin door for Danube's admin tools (broker.grpc_admin_listen), if on:
    # what the admin door's ListBrokers names as the broker's `admin_addr`.
    grpc_admin_url: str | None = None


@wire
class BrokerStateRecord(Message):
    TAG = 3
    mode: str  # a BrokerMode
    reason: str = ""


@wire
class Assignment(Message):
    """The broker serving a topic (or one partition). `epoch` grows with every new
    owner, so a stale owner can tell it was replaced."""

    TAG = 4
    broker_id: int
    epoch: int
    assigned_ms: int


@wire
class Unassigned(Message):
    """A topic or partition waiting for the load manager. `from_broker`: the broker it
    leaves (excluded from placement); `to_broker`: a rebalance's chosen target."""

    TAG = 5
    reason: str  # an UnassignedReason
    from_broker: int | None = None
    to_broker: int | None = None
    epoch: int = 0  # the epoch of the assignment it replaces
    since_ms: int = 0
    # False while the broker it leaves is still sealing it (unload, rebalance): the
    # load manager waits for True, or for that broker's lease to end.
    sealed: bool = True


@wire
class LeaderRecord(Message):
    TAG = 6
    broker_id: int
    term: int


@wire
class TopicState(Message):
    """Where a topic's (or partition's) offsets stand, for its next owner.

    `next_offset`: written by the broker that stops serving the topic (a seal): the
    next owner starts there, never below. `reserved_until`: the serving broker
    (`broker_id`) reserves offsets in blocks before it acknowledges any of them, so
    a broker that takes the topic over from a dead one starts past every offset the
    dead one may have given out (a seal sets it to `next_offset`: no gap)."""

    TAG = 7
    next_offset: int
    broker_id: int
    sealed_ms: int
    reserved_until: int = 0


@wire
class TopicLoadRecord(Struct):
    """One topic (or partition) in a load report: rates over the last interval."""

    topic: str
    msg_rate_in: float
    msg_rate_out: float
    byte_rate_in: float
    byte_rate_out: float
    producers: int
    consumers: int
    subscriptions: int
    backlog: int


@wire
class LoadReportRecord(Message):
    """What a broker publishes every `load_manager.report_interval_ms` (with a TTL of
    three intervals, so a dead broker's report goes away)."""

    TAG = 8
    broker_id: int
    cpu_percent: float
    memory_percent: float
    topics: list[TopicLoadRecord]
    reported_ms: int


@wire
class TopicBacklogRecord(Struct):
    topic: str  # the base topic
    partitions: int
    backlog_messages: int  # over every subscription


@wire
class BacklogReportRecord(Message):
    """Published by `danube report backlog --publish`: what Spark read from the WAL
    snapshots; the load manager weighs a topic's backlog by the larger of this and what
    its broker reports."""

    TAG = 9
    snapshot_id: str
    snapshot_ms: int
    published_ms: int
    topics: list[TopicBacklogRecord]


@wire
class MoveRecord(Message):
    """A move the load manager started (rebalance or drain), kept an hour so the hourly
    cap and the cooldowns hold across leader changes."""

    TAG = 10
    at_ms: int
    topic: str
    from_broker: int
    to_broker: int


@wire
class ProducerRecord(Message):
    """A producer attached to a topic (or partition), as Danube records it: written by
    the broker serving it when it attaches, deleted when it closes or disconnects; the
    next broker to serve the topic clears the records of its previous one (those
    producers attach again)."""

    TAG = 11
    producer_id: int
    producer_name: str
    topic: str
    access_mode: int
    broker_id: int


@wire
class BacklogQuotaRecord(Message):
    """A namespace's or topic's backlog quota (`policies.backlog_quota_bytes_max` and
    `backlog_quota_policy` of the broker's config, overridden): `limit_bytes` 0 is no
    limit; `policy` one of BACKLOG_QUOTA_POLICIES (config/broker_config.py)."""

    TAG = 12
    limit_bytes: int
    policy: str


@wire
class WalDamageRecord(Message):
    """A reliable topic (or partition) its broker does not serve because its WAL is
    damaged: written by that broker when it finds the damage, deleted when the topic is
    served again (`topics repair`) or deleted. The load manager never moves such a topic
    (the next broker would serve it from an empty log) and unloads of it are refused."""

    TAG = 13
    broker_id: int
    reason: str
    valid_end: int  # offsets from here on cannot be read
    since_ms: int


@wire
class NamespaceLimitsRecord(Message):
    """A namespace's own limits over the broker's `policies.topics_per_namespace_max` and
    `partitions_per_topic_max` (Pulsar's max-topics-per-namespace); None: the broker's
    applies. Tag 244 (the admin messages of these limits take 240-243): past every tag
    of every protocol, so a record another branch adds does not meet it."""

    TAG = 244
    topics_max: int | None = None
    partitions_max: int | None = None


@wire
class TopicPoliciesRecord(Message):
    """A namespace's or topic's own topic policies over the broker's `policies` (names
    as there; `max_publish_rate` and `max_dispatch_rate` in messages per second; 0 is
    unlimited except for `max_message_size`); None: the next level's applies. Tag 275:
    in the range this feature took (271-279), past the others' tags."""

    TAG = 275
    max_producers_per_topic: int | None = None
    max_subscriptions_per_topic: int | None = None
    max_consumers_per_topic: int | None = None
    max_consumers_per_subscription: int | None = None
    max_message_size: int | None = None
    max_publish_rate: int | None = None
    max_dispatch_rate: int | None = None
    retention_time_ms: int | None = None  # 0: kept
    retention_bytes_max: int | None = None
    subscription_expiration_ms: int | None = None  # 0: never
    message_ttl_s: int | None = None  # 0: never
    deduplication: int | None = None  # 1: on
    compaction_threshold_bytes: int | None = None  # 0: never


@wire
class AutoTopicCreationRecord(Message):
    """A namespace's own auto topic creation policy (Pulsar's `set-auto-topic-creation`)
    over the broker's `policies.allow_auto_topic_creation`, `allow_auto_topic_creation_type`,
    `default_num_partitions` and `auto_topic_creation_dispatch`; None: the broker's
    applies. Tag 386 (the admin messages take 387-390)."""

    TAG = 386
    allow_auto_topic_creation: bool | None = None
    allow_auto_topic_creation_type: str | None = None  # non-partitioned | partitioned
    default_num_partitions: int | None = None
    auto_topic_creation_dispatch: str | None = None  # non_reliable | reliable


@wire
class CursorRecord(Message):
    """A reliable subscription's persisted state, written by the broker serving its
    topic (coalesced, `cursor_flush_interval_ms`) and read by the topic's next broker:
    the cursor (every offset up to it acknowledged) and the acknowledged offsets above
    it; its failure policy and dispatch window when an admin set them (None: the
    broker's defaults apply). Tag 246: past every tag of every protocol, as 244.
    Stores written before it was declared hold a msgpack map by field name:
    `decode_cursor` reads both."""

    TAG = 246
    sub_type: int
    cursor: int
    acked_above: list[int]
    policy: FailurePolicyState | None = None
    max_unacked_messages: int | None = None
    # A Shared or Key-Shared subscription's delayed messages (None: it never held one).
    delayed: DelayedState | None = None


# The security state (issue 21), tags 250-253: past every tag of every protocol, as 244.


@wire
class RoleRecord(Message):
    """A role: `permissions` by Danube's names (security/rbac.py `Permission`)."""

    TAG = 250
    name: str
    permissions: list[str]


@wire
class BindingRecord(Message):
    """`roles` given to the principal (`principal_type`: user or service_account) at
    `scope` (`cluster`, `namespace:NS`, `topic:/ns/t`)."""

    TAG = 251
    binding_id: str
    principal: str
    principal_type: str
    roles: list[str]
    scope: str


@wire
class RevokedTokenRecord(Message):
    """A token refused from its revocation on; stored with a TTL that ends after the
    token's own expiry (plus the accepted clock skew), when it needs no deny-list."""

    TAG = 252
    jti: str
    expires_at_ms: int


@wire
class ClientKeyRecord(Message):
    """A CURVE client public key (Z85) allowed to connect, and the principal it is."""

    TAG = 253
    public_key: str
    principal: str
    principal_type: str


def role_key(name: str) -> str:
    return f"{ROLES}{name}"


def binding_key(binding_id: str) -> str:
    return f"{BINDINGS}{binding_id}"


def revoked_key(jti: str) -> str:
    return f"{REVOKED}{jti}"


def client_key_key(public_key: str) -> str:
    return f"{CLIENT_KEYS}{public_key}"


CLUSTER_RECORDS = Protocol("cluster-records", PROTOCOL_VERSION, [
    TopicRecord, BrokerRegistration, BrokerStateRecord, Assignment, Unassigned, LeaderRecord, TopicState,
    LoadReportRecord, BacklogReportRecord, MoveRecord, ProducerRecord, BacklogQuotaRecord, WalDamageRecord,
    NamespaceLimitsRecord, CursorRecord, TopicPoliciesRecord, AutoTopicCreationRecord,
    RoleRecord, BindingRecord, RevokedTokenRecord, ClientKeyRecord,
])


def encode(record: Message) -> bytes:
    return CLUSTER_RECORDS.encode(record)


def decode(data: bytes, kind: type[T]) -> T:
    """Decode a stored record, checking it is a `kind` (InvalidArgument otherwise)."""
    record = CLUSTER_RECORDS.decode(data)
    if type(record) is not kind:
        raise InvalidArgument(f"metadata record is a {type(record).__name__}, expected {kind.__name__}")
    return record


def decode_cursor(data: bytes) -> CursorRecord:
    """A stored cursor, declared (`CursorRecord`) or in the map form written before it
    was; InvalidArgument naming the record when it is neither."""
    items = unpack(data)
    if type(items) is not dict:
        return decode(data, CursorRecord)
    # The map form: rebuilt as the record's array and checked field by field like any
    # frame. Fields are positional, so a map stops at its first absent one (the later
    # fields were added with defaults: older maps lack them).
    policy = items.get("policy")
    if type(policy) is dict:
        policy = _leading(policy, FailurePolicyState._fields)
    array = [CursorRecord.TAG, *_leading(items | {"policy": policy}, CursorRecord._fields)]
    return decode(msgpack.packb(array, use_bin_type=True), CursorRecord)


def _leading(fields: dict[str, object], names: tuple[str, ...]) -> list[object]:
    out = []
    for name in names:
        if name not in fields:
            break
        out.append(fields[name])
    return out

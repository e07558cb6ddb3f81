"""The admin protocol (DEALER on `danube admin`, its own ROUTER on the broker).

Low-rate control requests: namespaces, topics, subscriptions, brokers. Every request
has a `request_id` and is answered by a reply with the same id, `Ok`, or `Error`.
"""

from __future__ import annotations

from danube_zmq.transport.codec import Message, Protocol, Struct, wire
from danube_zmq.transport.common import COMMON_MESSAGES, PROTOCOL_VERSION


@wire
class ListNamespaces(Message):
    TAG = 16
    request_id: int


@wire
class NamespaceList(Message):
    TAG = 17
    request_id: int
    namespaces: list[str]


@wire
class CreateNamespace(Message):
    TAG = 18
    request_id: int
    namespace: str


@wire
class DeleteNamespace(Message):
    """Delete an empty namespace; one that still has topics is FAILED_PRECONDITION."""

    TAG = 19
    request_id: int
    namespace: str


@wire
class PartitionOwner(Struct):
    """The broker a topic (or one partition) is assigned to; both None: unassigned
    (being placed or moved, or its broker's lease is gone)."""

    name: str
    broker_id: int | None
    broker_url: str | None


@wire
class TopicInfo(Struct):
    name: str
    dispatch_strategy: int
    partitions: int
    broker_id: int
    # Each partition's broker (the topic itself when not partitioned), from the
    # answering broker's applied assignments. None from brokers before this field.
    owners: list[PartitionOwner] | None = None


@wire
class ListTopics(Message):
    TAG = 20
    request_id: int
    namespace: str


@wire
class TopicList(Message):
    TAG = 21
    request_id: int
    topics: list[TopicInfo]


@wire
class CreateTopic(Message):
    """Create a topic; `partitions` > 0 creates `/ns/t-part-0..N-1`."""

    TAG = 22
    request_id: int
    topic: str
    partitions: int = 0
    dispatch_strategy: int = 0


@wire
class DeleteTopic(Message):
    """Delete a topic (or every partition of a partitioned one), closing its clients."""

    TAG = 23
    request_id: int
    topic: str


@wire
class DescribeTopic(Message):
    TAG = 24
    request_id: int
    topic: str


@wire
class SubscriptionInfo(Struct):
    name: str
    topic: str
    sub_type: int
    consumers: list[str]
    active_consumer: str | None
    pending_messages: int
    delivered_messages: int
    dropped_messages: int
    # Reliable subscriptions only (None on non-reliable topics):
    cursor: int | None = None
    backlog_messages: int | None = None
    unacked_messages: int | None = None
    redeliveries: int | None = None
    blocked_offset: int | None = None
    # Bytes the backlog takes in the log (records after the cursor, headers included;
    # out-of-order acks prorated).
    backlog_bytes: int | None = None
    # Delayed messages held until their time (reliable Shared and Key-Shared).
    delayed_messages: int | None = None


@wire
class PartitionInfo(Struct):
    name: str
    next_offset: int
    producers: list[str]
    messages_in: int
    bytes_in: int
    dropped_messages: int
    subscriptions: list[SubscriptionInfo]
    # Set when the partition is not served because its WAL is damaged (file, byte, why,
    # which offsets cannot be read); `next_offset` is then where the readable log ends.
    wal_damage: str | None = None
    # Messages the backlog quota's `consumer_backlog_eviction` moved subscriptions'
    # cursors past (summed over subscriptions) since the topic was loaded here.
    evicted_messages: int = 0
    # The broker serving the partition (the one that answered for it) and its client
    # URL; None from brokers before these fields.
    broker_id: int | None = None
    broker_url: str | None = None
    # Set when no broker serves the partition right now (being placed or moved, or its
    # broker stopped renewing its lease): why. Its counters are then 0 and `next_offset`
    # where its offsets stopped (0 when not known). Only in a partitioned topic's
    # description: one topic on its own is answered UNAVAILABLE instead.
    not_served: str | None = None
    # Compaction (reliable topics): "never", "running", "done" or "failed: why"; the
    # compacted view holds the latest message per key below `compaction_horizon`.
    compaction: str | None = None
    compaction_horizon: int | None = None


@wire
class TopicDescription(Message):
    """`policies`: the topic policies in force for the topic (`GetTopicPolicies`'s
    values), `policy_sources` where each is set; None from a broker before them."""

    TAG = 25
    request_id: int
    name: str
    dispatch_strategy: int
    broker_id: int
    partitions: list[PartitionInfo]
    policies: dict[str, int] | None = None
    policy_sources: dict[str, str] | None = None


@wire
class ListSubscriptions(Message):
    TAG = 26
    request_id: int
    topic: str


@wire
class SubscriptionList(Message):
    TAG = 27
    request_id: int
    subscriptions: list[str]


@wire
class Unsubscribe(Message):
    """Delete a subscription of a topic (of every partition), closing its consumers."""

    TAG = 28
    request_id: int
    topic: str
    subscription: str


@wire
class BrokerInfo(Struct):
    broker_id: int
    broker_url: str
    admin_url: str
    metrics_url: str | None
    role: str
    status: str
    # The broker's gRPC admin door (Danube's admin API), None when it serves none.
    grpc_admin_url: str | None = None
    # Its name for people, broker-{raft node id} (`danube cluster up` and `cluster status`
    # name brokers so), and that node id; None from a broker before names.
    name: str | None = None
    node_id: int | None = None


# BrokerInfo.status besides a BrokerMode (active, draining, drained): registered but its
# lease not renewed for half its TTL (it may be dead), and no registration at all (its
# lease ended, or it stopped): a Raft member's last registration, until it comes back.
BROKER_UNREACHABLE = "unreachable"
BROKER_DOWN = "down"


@wire
class ListBrokers(Message):
    TAG = 29
    request_id: int


@wire
class BrokerList(Message):
    TAG = 30
    request_id: int
    brokers: list[BrokerInfo]


@wire
class SeekSubscription(Message):
    """Move a subscription of a reliable topic to `offset`, or to the first message
    published at or after `publish_time` (ms since the epoch); exactly one of the two.
    Offsets are per partition: on a partitioned topic only `publish_time` applies (to
    every partition); seek one partition by naming its topic. Answered by `Ok`."""

    TAG = 31
    request_id: int
    topic: str
    subscription: str
    offset: int | None = None
    publish_time: int | None = None


@wire
class SetFailurePolicy(Message):
    """Set the failure policy of a subscription of a reliable topic (every partition):
    Danube's `set-failure-policy`. Applies from now on and survives restarts. Answered
    by `Ok`."""

    TAG = 32
    request_id: int
    topic: str
    subscription: str
    max_redelivery_count: int
    ack_timeout_ms: int
    base_redelivery_delay_ms: int
    max_redelivery_delay_ms: int
    backoff: str
    poison_policy: str
    dead_letter_topic: str | None = None


@wire
class GetFailurePolicy(Message):
    """The failure policy of a subscription of a reliable topic (its first partition's
    when partitioned). Answered by `FailurePolicyInfo`."""

    TAG = 33
    request_id: int
    topic: str
    subscription: str


@wire
class FailurePolicyInfo(Message):
    """A subscription's failure policy; `explicit` is False while it still follows the
    broker's `reliable:` defaults (no `SetFailurePolicy` yet)."""

    TAG = 34
    request_id: int
    max_redelivery_count: int
    ack_timeout_ms: int
    base_redelivery_delay_ms: int
    max_redelivery_delay_ms: int
    backoff: str
    poison_policy: str
    dead_letter_topic: str | None
    explicit: bool = False


@wire
class SetDispatchConfig(Message):
    """Set the dispatch window of a subscription of a reliable topic (every partition):
    Danube's `SetSubscriptionDispatchConfig`. `max_unacked_messages` (1..10000) bounds
    each consumer's unacknowledged deliveries in place of `reliable.max_unacked_messages`;
    it applies at once and survives restarts. Answered by `Ok`."""

    TAG = 35
    request_id: int
    topic: str
    subscription: str
    max_unacked_messages: int


@wire
class GetDispatchConfig(Message):
    """The dispatch window of a subscription of a reliable topic (its first partition's
    when partitioned). Answered by `DispatchConfigInfo`."""

    TAG = 36
    request_id: int
    topic: str
    subscription: str


@wire
class DispatchConfigInfo(Message):
    """A subscription's dispatch window; `explicit` is False while it still follows the
    broker's `reliable.max_unacked_messages` (no `SetDispatchConfig` yet)."""

    TAG = 37
    request_id: int
    max_unacked_messages: int
    explicit: bool = False


# ---------------------------------------------------------------- the metadata cluster
# Answered by the admin gateway itself from the broker's Raft peer (not the broker actor).


@wire
class ClusterStatus(Message):
    """This broker's view of the metadata cluster. Answered by `ClusterStatusInfo`."""

    TAG = 38
    request_id: int


@wire
class ClusterMember(Struct):
    """`match_index`: the highest log index known replicated on the member, when the
    answering broker is the leader (None otherwise)."""

    node_id: int
    address: str | None
    voter: bool
    match_index: int | None


@wire
class ClusterStatusInfo(Message):
    TAG = 39
    request_id: int
    node_id: int
    role: str  # LEADER, FOLLOWER, CANDIDATE, PRE_CANDIDATE
    term: int
    leader_id: int | None
    leader_address: str | None
    commit_index: int
    applied_index: int
    last_index: int
    revision: int
    members: list[ClusterMember]


@wire
class AddClusterNode(Message):
    """Add node `node_id` (started with `cluster.join`, listening at `address`) as a
    learner. Answered by `ClusterStatusInfo` once the change is applied."""

    TAG = 40
    request_id: int
    node_id: int
    address: str


@wire
class PromoteClusterNode(Message):
    """Make a learner a voter (UNAVAILABLE while it is behind; retry). Answered by
    `ClusterStatusInfo`."""

    TAG = 41
    request_id: int
    node_id: int


@wire
class RemoveClusterNode(Message):
    """Remove a voter or learner. Answered by `ClusterStatusInfo`."""

    TAG = 42
    request_id: int
    node_id: int


@wire
class MetadataEntry(Struct):
    key: str
    value: bytes
    version: int
    mod_revision: int
    create_revision: int
    ttl_ms: int | None = None


@wire
class MetadataGet(Message):
    """One key. `linearizable` false: this broker's applied state, possibly stale.
    Answered by `MetadataEntries` (no entries: the key does not exist)."""

    TAG = 43
    request_id: int
    key: str
    linearizable: bool = True


@wire
class MetadataList(Message):
    """Keys under `prefix`, sorted, at most `limit`. Answered by `MetadataEntries`."""

    TAG = 44
    request_id: int
    prefix: str
    linearizable: bool = True
    limit: int = 1000


@wire
class MetadataEntries(Message):
    """`revision`: the answering broker's applied revision; `more`: `limit` cut the list."""

    TAG = 45
    request_id: int
    entries: list[MetadataEntry]
    revision: int
    more: bool = False


@wire
class MetadataPut(Message):
    """Set `key` (with a lease of `ttl_ms` when given). Answered by `MetadataWritten`."""

    TAG = 46
    request_id: int
    key: str
    value: bytes
    ttl_ms: int | None = None


@wire
class MetadataCompareAndSwap(Message):
    """Set `key` if its version is `expected_version` (0: absent). Answered by
    `MetadataWritten`: `succeeded` and the new entry, or not and the current one."""

    TAG = 47
    request_id: int
    key: str
    expected_version: int
    value: bytes


@wire
class MetadataDelete(Message):
    """Delete `key`, or every key under it with `prefix`. Answered by `MetadataWritten`
    (`deleted`: how many keys went)."""

    TAG = 48
    request_id: int
    key: str
    prefix: bool = False


@wire
class MetadataWritten(Message):
    TAG = 49
    request_id: int
    succeeded: bool
    entry: MetadataEntry | None = None
    deleted: int = 0


@wire
class ConfigureTopicSchema(Message):
    """Bind a topic (its base name: partitions share it) to a registered schema subject,
    with a validation policy (`none`, `warn`, `enforce`) and payload validation. Replaces
    any earlier binding. Answered by `TopicSchemaConfigInfo`."""

    TAG = 50
    request_id: int
    topic: str
    subject: str
    validation_policy: str = "none"
    payload_validation: bool = False


@wire
class GetTopicSchemaConfig(Message):
    """Answered by `TopicSchemaConfigInfo`; NOT_FOUND when no schema is bound."""

    TAG = 51
    request_id: int
    topic: str


@wire
class TopicSchemaConfigInfo(Message):
    TAG = 52
    request_id: int
    topic: str
    subject: str
    validation_policy: str
    payload_validation: bool
    schema_id: int
    latest_version: int | None
    # The subject's type and compatibility mode (Danube's DescribeTopic names them);
    # None from a broker that predates them.
    schema_type: str | None = None
    compatibility: str | None = None


# WAL snapshots (53-59): `danube admin snapshots ...`, answered by the snapshot actor.


@wire
class SnapshotSummary(Struct):
    snapshot_id: str
    created_ms: int
    broker_id: int
    topics: int
    subscriptions: int
    records: int
    record_bytes: int
    files: int


@wire
class CreateSnapshot(Message):
    """Snapshot the reliable topics served by this broker whose name (or base topic's
    name) matches the glob `topic` (None: all). Answered by `SnapshotCreated` once the
    manifest is written."""

    TAG = 53
    request_id: int
    topic: str | None = None


@wire
class SnapshotCreated(Message):
    TAG = 54
    request_id: int
    url: str
    snapshot: SnapshotSummary
    files_written: int
    files_shared: int
    elapsed_ms: int


@wire
class ListSnapshots(Message):
    TAG = 55
    request_id: int


@wire
class SnapshotList(Message):
    TAG = 56
    request_id: int
    url: str
    snapshots: list[SnapshotSummary]


@wire
class DescribeSnapshot(Message):
    TAG = 57
    request_id: int
    snapshot_id: str


@wire
class SnapshotDescription(Message):
    """`manifest`: the snapshot's manifest, as stored (JSON; see snapshots/manifest.py)."""

    TAG = 58
    request_id: int
    url: str
    manifest: str


@wire
class DeleteSnapshot(Message):
    """Answered by `Ok`; NOT_FOUND for an unknown id."""

    TAG = 59
    request_id: int
    snapshot_id: str


SNAPSHOT_REQUESTS = (CreateSnapshot, ListSnapshots, DescribeSnapshot, DeleteSnapshot)
"""Admin requests the snapshot actor answers."""


CLUSTER_REQUESTS = (
    ClusterStatus, AddClusterNode, PromoteClusterNode, RemoveClusterNode,
    MetadataGet, MetadataList, MetadataPut, MetadataCompareAndSwap, MetadataDelete,
    ConfigureTopicSchema, GetTopicSchemaConfig,
)
"""Admin requests the admin gateway answers from the metadata store (and the schema
registry kept in it)."""


@wire
class UnloadTopic(Message):
    """Stop serving `topic` (every partition of a partitioned one) on its broker: the
    broker seals it and the load manager gives it to another broker (Danube's `topics
    unload`). Answered `Ok` once the move is recorded (the topic's assignment is
    replaced by an unassigned marker); clients re-attach through a redirect."""

    TAG = 60
    request_id: int
    topic: str


@wire
class CompactTopic(Message):
    """Compact `topic` (every partition of a partitioned reliable one): the latest
    message per key below the committed end, in the background while producers keep
    writing (Pulsar's `topics compact`). Answered `Ok` once it started; `DescribeTopic`
    shows its status and horizon."""

    TAG = 391
    request_id: int
    topic: str


@wire
class BrokerLoadInfo(Struct):
    broker_id: int
    load: float
    topic_count: int
    overloaded: bool
    underloaded: bool
    status: str
    name: str | None = None  # broker-{raft node id}, as BrokerInfo.name


@wire
class GetClusterBalance(Message):
    """The cluster's balance as the leader's load manager sees it (Danube's `brokers
    balance`). Answered by `ClusterBalance`."""

    TAG = 61
    request_id: int


@wire
class ClusterBalance(Message):
    TAG = 62
    request_id: int
    coefficient_of_variation: float
    mean_load: float
    max_load: float
    min_load: float
    std_deviation: float
    brokers: list[BrokerLoadInfo]
    assignment_strategy: str
    rebalancing: bool


@wire
class MoveInfo(Struct):
    topic: str
    from_broker: int
    to_broker: int
    estimated_load: float


@wire
class RebalanceCluster(Message):
    """Plan a rebalancing round now and, unless `dry_run`, start its moves; at most
    `max_moves` (default: the policy's moves per cycle). Answered by `Rebalanced`."""

    TAG = 63
    request_id: int
    dry_run: bool = False
    max_moves: int | None = None


@wire
class Rebalanced(Message):
    TAG = 64
    request_id: int
    moves: list[MoveInfo]
    why_none: str
    coefficient_of_variation: float
    dry_run: bool


@wire
class UnloadBroker(Message):
    """Drain broker `broker_id`: it takes no new topics (draining) and each of its topics
    moves to the broker placement picks; then it is drained. Answered by `Rebalanced`
    (the moves started)."""

    TAG = 65
    request_id: int
    broker_id: int


@wire
class ActivateBroker(Message):
    """Make broker `broker_id` take topics again (active). Answered `Ok`."""

    TAG = 66
    request_id: int
    broker_id: int


@wire
class RepairTopic(Message):
    """Serve again a topic (one partition) whose WAL is damaged, giving up the records
    that cannot be read: its readable prefix is kept and offsets continue past every
    offset it may have given out (never reused). Without `accept_loss` nothing changes
    and the answer says what would be lost. Answered by `TopicRepaired`."""

    TAG = 90
    request_id: int
    topic: str
    accept_loss: bool = False


@wire
class TopicRepaired(Message):
    """Offsets [lost_start, lost_end) are given up (None: none); those below
    `acknowledged_end` had been acknowledged to producers (None: not known); the topic
    continues at `next_offset`. `repaired` is False for a dry run (nothing changed)."""

    TAG = 91
    request_id: int
    topic: str
    repaired: bool
    reason: str
    lost_start: int | None
    lost_end: int | None
    acknowledged_end: int | None
    next_offset: int
    quarantined: list[str]


# ---- backlog quotas per namespace and topic (Pulsar's set-backlog-quota), tags 80-83 ----


@wire
class SetBacklogQuota(Message):
    """Set the backlog quota of `namespace` or of `topic` (exactly one; a partitioned
    topic's base: every partition): `limit_bytes` (0: no limit) and `policy`
    (producer_request_hold, producer_exception, consumer_backlog_eviction). A topic's
    quota overrides its namespace's, which overrides the broker's `policies`. Stored in
    the metadata store; live topics apply it at once. Answered `Ok`."""

    TAG = 80
    request_id: int
    limit_bytes: int
    policy: str
    namespace: str | None = None
    topic: str | None = None


@wire
class GetBacklogQuota(Message):
    """The backlog quota in force for `namespace` or `topic` (exactly one). Answered by
    `BacklogQuotaInfo`."""

    TAG = 81
    request_id: int
    namespace: str | None = None
    topic: str | None = None


@wire
class BacklogQuotaInfo(Message):
    """`source`: where the quota in force is set: "topic", "namespace" or "broker" (the
    broker's `policies` config)."""

    TAG = 82
    request_id: int
    limit_bytes: int
    policy: str
    source: str


@wire
class RemoveBacklogQuota(Message):
    """Remove the quota set on `namespace` or `topic` (exactly one): the next level's
    applies. Answered `Ok` (NOT_FOUND: none was set)."""

    TAG = 83
    request_id: int
    namespace: str | None = None
    topic: str | None = None


# ---- broker to broker: a `local`-mode move hands a reliable topic's WAL over ----
# Tags from 190 up: this block is the brokers' own part of the admin port.


@wire
class HandOverFile(Struct):
    """One file offered: a WAL segment (`<20-digit base offset>.wal`) and its
    whole-record bytes, or the topic's compacted ledger (`<20-digit horizon>.compacted`)
    and its whole size."""

    name: str
    size_bytes: int


@wire
class BeginHandOver(Message):
    """From a topic's broker to the broker it is moving to, in storage.mode local: the
    WAL segments (`files`, in offset order, the last the active one, ending at
    `next_offset`) its subscriptions (and its compacted view) still need, then its newest
    compacted ledger if it has one. Answered `HandOverProgress` (the bytes
    of each file the receiver already holds for `handover_id`: a resumed move sends
    from there), or refused: more than `cluster.move_bytes_max`, or the topic is served
    by the receiver."""

    TAG = 190
    request_id: int
    topic: str
    handover_id: int
    files: list[HandOverFile]
    next_offset: int


@wire
class HandOverProgress(Message):
    TAG = 191
    request_id: int
    held_bytes: list[int]  # per offered file, in order


@wire
class HandOverChunk(Message):
    """`data` at byte `position` of offered file `file_index`; `crc32c` over `data`.
    Refused (nothing written) unless `position` is where the receiver's copy ends and
    the CRC matches. Answered `Ok`."""

    TAG = 192
    request_id: int
    topic: str
    handover_id: int
    file_index: int
    position: int
    data: bytes
    crc32c: int


@wire
class CommitHandOver(Message):
    """Every file sent: the receiver fsyncs them, scans every record of every file
    (CRCs, offsets continuous up to the offer's `next_offset`) and only then puts them
    in place of its own WAL of the topic. Answered `Ok`; the sender then switches
    ownership in the metadata store."""

    TAG = 193
    request_id: int
    topic: str
    handover_id: int


@wire
class AbortHandOver(Message):
    """The move was refused: the receiver drops what it received. Answered `Ok`."""

    TAG = 194
    request_id: int
    topic: str
    handover_id: int


# ---- an operator forces a dead broker's storage.mode local topic elsewhere ----


@wire
class ReassignTopic(Message):
    """Give a topic (one partition) whose broker is gone, and with it the only copy of
    its WAL (storage.mode local), to another broker, giving up the offsets that only
    that WAL held. Without `force` nothing changes and the answer says what would be
    lost. Answered by `TopicReassignment`."""

    TAG = 195
    request_id: int
    topic: str
    force: bool = False


@wire
class TopicReassignment(Message):
    """Offsets [lost_start, lost_end) become unreadable (None: none a subscription
    still needs): from the oldest cursor to the end of the dead broker's reservation;
    `subscription` holds the oldest cursor. The next broker continues at `next_offset`.
    `reassigned` is False for a dry run."""

    TAG = 196
    request_id: int
    topic: str
    reassigned: bool
    from_broker: int
    reason: str
    lost_start: int | None
    lost_end: int | None
    subscription: str | None
    next_offset: int


# ---- limits per namespace on topics and partitions (Pulsar's max-topics-per-namespace), tags 240-243 ----


@wire
class SetNamespaceLimits(Message):
    """Set `namespace`'s own limits, over the broker's `policies.topics_per_namespace_max`
    (topics, each partition counted as one) and `partitions_per_topic_max`: only those
    given (at least one) change, the other stays as it was. Stored in the metadata
    store; checked at every create from then on. Answered `Ok`."""

    TAG = 240
    request_id: int
    namespace: str
    topics_max: int | None = None
    partitions_max: int | None = None


@wire
class GetNamespaceLimits(Message):
    """The limits in force for `namespace`. Answered by `NamespaceLimitsInfo`."""

    TAG = 241
    request_id: int
    namespace: str


@wire
class NamespaceLimitsInfo(Message):
    """Each `*_source`: "namespace" (set on it) or "broker" (the broker's `policies`)."""

    TAG = 242
    request_id: int
    namespace: str
    topics_max: int
    topics_max_source: str
    partitions_max: int
    partitions_max_source: str


@wire
class RemoveNamespaceLimits(Message):
    """Remove both limits set on `namespace`: the broker's apply. Answered `Ok`
    (NOT_FOUND: none was set)."""

    TAG = 243
    request_id: int
    namespace: str


# ---- auto topic creation per namespace (Pulsar's set-auto-topic-creation), tags 387-390 ----
# The names are the broker's `policies` keys (config/broker_config.py AUTO_TOPIC_CREATION_POLICIES).


@wire
class SetAutoTopicCreation(Message):
    """Set `namespace`'s own auto topic creation policy: whether a subscriber creates a
    missing topic, and its shape (`allow_auto_topic_creation_type` non-partitioned or
    partitioned, `default_num_partitions`) and dispatch (non_reliable or reliable). Only
    those given (at least one) change. Answered `Ok`."""

    TAG = 387
    request_id: int
    namespace: str
    allow_auto_topic_creation: bool | None = None
    allow_auto_topic_creation_type: str | None = None
    default_num_partitions: int | None = None
    auto_topic_creation_dispatch: str | None = None


@wire
class GetAutoTopicCreation(Message):
    """The auto topic creation policy in force for `namespace`. Answered by
    `AutoTopicCreationInfo`."""

    TAG = 388
    request_id: int
    namespace: str


@wire
class AutoTopicCreationInfo(Message):
    """Each policy's value in force and `sources` for each: "namespace" or "broker"."""

    TAG = 389
    request_id: int
    namespace: str
    allow_auto_topic_creation: bool
    allow_auto_topic_creation_type: str
    default_num_partitions: int
    auto_topic_creation_dispatch: str
    sources: dict[str, str]


@wire
class RemoveAutoTopicCreation(Message):
    """Remove `namespace`'s own auto topic creation policy: the broker's apply.
    Answered `Ok` (NOT_FOUND: none was set)."""

    TAG = 390
    request_id: int
    namespace: str


# ---- topic policies per namespace and topic (Pulsar's namespace/topic policies), tags 271-274 ----
# The policies' names are the broker's `policies` keys (config/broker_config.py TOPIC_POLICY_NAMES).


@wire
class SetTopicPolicies(Message):
    """Set topic policies of `namespace` or of `topic` (exactly one; a partitioned
    topic's base: every partition): only those given (at least one) change, each to 0
    (unlimited) or a value; max_message_size 1 up to the broker's own. A topic's policy
    overrides its namespace's, which overrides the broker's `policies`. Stored in the
    metadata store; live topics apply them at once. Answered `Ok`."""

    TAG = 271
    request_id: int
    namespace: str | None = None
    topic: str | None = None
    max_producers_per_topic: int | None = None
    max_subscriptions_per_topic: int | None = None
    max_consumers_per_topic: int | None = None
    max_consumers_per_subscription: int | None = None
    max_message_size: int | None = None
    max_publish_rate: int | None = None
    max_dispatch_rate: int | None = None
    # Reliable topics: sealed segments older than this, or past this many bytes, are
    # deleted once every cursor passed them (0: kept).
    retention_time_ms: int | None = None
    retention_bytes_max: int | None = None
    # Subscriptions without a consumer for this long are removed with their cursors
    # (0: never; Pulsar's subscriptionExpirationTimeMinutes).
    subscription_expiration_ms: int | None = None
    # Reliable topics: messages published longer ago than this many seconds are
    # acknowledged for every subscription (0: never; Pulsar's message TTL).
    message_ttl_s: int | None = None
    # Reliable topics: producer deduplication (1: on, 0: off).
    deduplication: int | None = None
    # Reliable topics: compacted once this many bytes came since the last compaction (0: never).
    compaction_threshold_bytes: int | None = None


@wire
class GetTopicPolicies(Message):
    """The topic policies in force for `namespace` or `topic` (exactly one). Answered by
    `TopicPoliciesInfo`."""

    TAG = 272
    request_id: int
    namespace: str | None = None
    topic: str | None = None


@wire
class TopicPoliciesInfo(Message):
    """Each policy's value in force (`values`) and where it is set (`sources`: "topic",
    "namespace" or "broker")."""

    TAG = 273
    request_id: int
    values: dict[str, int]
    sources: dict[str, str]


@wire
class RemoveTopicPolicies(Message):
    """Remove every topic policy set on `namespace` or `topic` (exactly one): the next
    level's apply. Answered `Ok` (NOT_FOUND: none was set)."""

    TAG = 274
    request_id: int
    namespace: str | None = None
    topic: str | None = None


# ---- security: roles, bindings, revoked tokens, client keys (issue 21), tags 210-229 ----
# Answered by the admin gateway from the metadata store (actors/broker/security_admin.py); the
# records are in transport/cluster_records.py, under /security/.


@wire
class RoleInfo(Struct):
    name: str
    permissions: list[str]  # Danube's names: Lookup, Produce, Consume, ManageTopic, ...


@wire
class CreateRole(Message):
    """A role: a named set of permissions. INVALID_ARGUMENT for an unknown permission or
    a bad name, ALREADY_EXISTS when the name is taken. Answered `Ok`."""

    TAG = 210
    request_id: int
    name: str
    permissions: list[str]


@wire
class ListRoles(Message):
    """Answered by `RoleList`, sorted by name."""

    TAG = 211
    request_id: int


@wire
class RoleList(Message):
    TAG = 212
    request_id: int
    roles: list[RoleInfo]


@wire
class DeleteRole(Message):
    """Answered `Ok`; NOT_FOUND for an unknown role. Bindings naming it stay and grant
    nothing through it (until a role of that name is created again)."""

    TAG = 213
    request_id: int
    name: str


@wire
class BindingInfo(Struct):
    binding_id: str
    principal: str
    principal_type: str  # user, service_account
    roles: list[str]
    scope: str  # cluster, namespace:NS, topic:/ns/t


@wire
class CreateBinding(Message):
    """Give `roles` (existing roles) to a principal at `scope`. One binding per principal
    and scope: its id is derived from the three (ALREADY_EXISTS: delete it first to
    change its roles). Answered by `BindingCreated`."""

    TAG = 214
    request_id: int
    principal: str
    principal_type: str
    roles: list[str]
    scope: str


@wire
class BindingCreated(Message):
    TAG = 215
    request_id: int
    binding: BindingInfo


@wire
class ListBindings(Message):
    """Answered by `BindingList`, sorted by principal, type and scope."""

    TAG = 216
    request_id: int


@wire
class BindingList(Message):
    TAG = 217
    request_id: int
    bindings: list[BindingInfo]


@wire
class DeleteBinding(Message):
    """Answered `Ok`; NOT_FOUND for an unknown id."""

    TAG = 218
    request_id: int
    binding_id: str


@wire
class RevokedTokenInfo(Struct):
    jti: str
    expires_at_ms: int


@wire
class RevokeToken(Message):
    """Refuse the token whose `jti` claim is `jti` from now on, until it expires at
    `expires_at_ms` (ms since the epoch, its `exp`): the entry is kept that long plus
    `security.jwt_leeway_ms`, then dropped by the store. INVALID_ARGUMENT when already
    past; ALREADY_EXISTS when revoked already. Answered `Ok`."""

    TAG = 219
    request_id: int
    jti: str
    expires_at_ms: int


@wire
class ListRevokedTokens(Message):
    """Answered by `RevokedTokenList`, sorted by jti."""

    TAG = 220
    request_id: int


@wire
class RevokedTokenList(Message):
    TAG = 221
    request_id: int
    tokens: list[RevokedTokenInfo]


@wire
class ClientKeyInfo(Struct):
    public_key: str  # Z85, 40 characters
    principal: str
    principal_type: str  # user, service_account


@wire
class AddClientKey(Message):
    """Allow the CURVE client key `public_key` (Z85) and bind it to a principal (never a
    broker: brokers are the keys of `security.broker_public_keys_dir`). INVALID_ARGUMENT
    for a key that is not 40 Z85 characters; ALREADY_EXISTS when allowed already.
    Answered `Ok`."""

    TAG = 222
    request_id: int
    public_key: str
    principal: str
    principal_type: str


@wire
class ListClientKeys(Message):
    """Answered by `ClientKeyList`, sorted by key."""

    TAG = 223
    request_id: int


@wire
class ClientKeyList(Message):
    TAG = 224
    request_id: int
    keys: list[ClientKeyInfo]


@wire
class RemoveClientKey(Message):
    """Answered `Ok`; NOT_FOUND for a key not on the allow-list."""

    TAG = 225
    request_id: int
    public_key: str


SECURITY_REQUESTS = (
    CreateRole, ListRoles, DeleteRole, CreateBinding, ListBindings, DeleteBinding,
    RevokeToken, ListRevokedTokens, AddClientKey, ListClientKeys, RemoveClientKey,
)
"""Admin requests the admin gateway answers from the security state in the metadata store."""

SECURITY_MESSAGES = SECURITY_REQUESTS + (RoleList, BindingCreated, BindingList, RevokedTokenList, ClientKeyList)


REGISTRY_REQUESTS = (ListNamespaces, CreateNamespace, DeleteNamespace, ListTopics, CreateTopic, ListBrokers)
"""Admin requests the broker's registry admin answers (actors/schema/registry_admin.py)."""

POLICY_REQUESTS = (
    SetBacklogQuota, GetBacklogQuota, RemoveBacklogQuota,
    SetNamespaceLimits, GetNamespaceLimits, RemoveNamespaceLimits,
    SetTopicPolicies, GetTopicPolicies, RemoveTopicPolicies,
    SetAutoTopicCreation, GetAutoTopicCreation, RemoveAutoTopicCreation,
)
"""Admin requests the broker's policy keeper answers (actors/policy/policy_keeper.py)."""

HANDOVER_REQUESTS = (BeginHandOver, HandOverChunk, CommitHandOver, AbortHandOver)
"""Sent by brokers to brokers on the admin port (a later issue limits them to broker principals)."""

ADMIN_REQUESTS = (
    ListNamespaces, CreateNamespace, DeleteNamespace, ListTopics, CreateTopic, DeleteTopic,
    DescribeTopic, ListSubscriptions, Unsubscribe, ListBrokers, SeekSubscription, SetFailurePolicy,
    GetFailurePolicy, SetDispatchConfig, GetDispatchConfig, UnloadTopic, CompactTopic,
    GetClusterBalance, RebalanceCluster, UnloadBroker, ActivateBroker,
    RepairTopic, ReassignTopic,
) + POLICY_REQUESTS + HANDOVER_REQUESTS
"""What a client may send on the admin socket; the rest are answers."""

ADMIN_PROTOCOL = Protocol(
    "admin",
    PROTOCOL_VERSION,
    COMMON_MESSAGES
    + (
        ListNamespaces, NamespaceList, CreateNamespace, DeleteNamespace,
        ListTopics, TopicList, CreateTopic, DeleteTopic, DescribeTopic, TopicDescription,
        ListSubscriptions, SubscriptionList, Unsubscribe, ListBrokers, BrokerList,
        SeekSubscription, SetFailurePolicy, GetFailurePolicy, FailurePolicyInfo,
        SetDispatchConfig, GetDispatchConfig, DispatchConfigInfo,
        ClusterStatus, ClusterStatusInfo, AddClusterNode, PromoteClusterNode, RemoveClusterNode,
        MetadataGet, MetadataList, MetadataEntries, MetadataPut, MetadataCompareAndSwap, MetadataDelete,
        MetadataWritten, ConfigureTopicSchema, GetTopicSchemaConfig, TopicSchemaConfigInfo,
        CreateSnapshot, SnapshotCreated, ListSnapshots, SnapshotList, DescribeSnapshot, SnapshotDescription,
        DeleteSnapshot, UnloadTopic, CompactTopic, GetClusterBalance, ClusterBalance, RebalanceCluster, Rebalanced,
        UnloadBroker, ActivateBroker,
        RepairTopic, TopicRepaired,
        SetBacklogQuota, GetBacklogQuota, BacklogQuotaInfo, RemoveBacklogQuota,
        BeginHandOver, HandOverProgress, HandOverChunk, CommitHandOver, AbortHandOver,
        ReassignTopic, TopicReassignment,
        SetNamespaceLimits, GetNamespaceLimits, NamespaceLimitsInfo, RemoveNamespaceLimits,
        SetTopicPolicies, GetTopicPolicies, TopicPoliciesInfo, RemoveTopicPolicies,
        SetAutoTopicCreation, GetAutoTopicCreation, AutoTopicCreationInfo, RemoveAutoTopicCreation,
    )
    + SECURITY_MESSAGES,
)

"""Messages between the actors inside one broker process.

Actors of one process hand these over as objects (`runtime/mailbox.py`): no socket and
no encoding between them. They are encoded only where bytes are wanted: an ask's
`Request.frame` (and the `Reply` answering it), the encoded `Publish` a reliable topic
keeps, and the frames of timers. Client frames cross actors unchanged inside
`ClientRequest`: the gateway decodes a frame to route it (a producer's `Send` only has
the ids at its head read), and the actor that owns the producer or consumer decodes it
again to handle it. The data path (`Publish` to subscriptions, `Deliver` frames to the
gateway's outbox lane) moves whole columnar batches. `Request`/`Reply` carry asks: a
control-plane call whose `Reply` resolves the asker's waiting future directly
(`ActorSystem._deliver_reply`), not through the asker's mailbox.
"""

from __future__ import annotations

from danube_zmq.transport.admin_protocol import PartitionInfo, SubscriptionInfo
from danube_zmq.transport.codec import Message, Protocol, Struct, wire
from danube_zmq.transport.common import PROTOCOL_VERSION


@wire
class Request(Message):
    """An ask: handle `frame` and send the answer as `Reply(correlation_id)`."""

    TAG = 1
    correlation_id: int
    frame: bytes


@wire
class Reply(Message):
    """The answer to an ask: an encoded message, or an error code and text."""

    TAG = 2
    correlation_id: int
    frame: bytes | None
    error_code: int | None = None
    error_message: str | None = None


@wire
class Tick(Message):
    """A timer firing: the actor's own periodic housekeeping."""

    TAG = 3


@wire
class SchemaVersionRef(Struct):
    """One version of a registered schema, as a topic checks payloads against it."""

    schema_id: int
    version: int
    schema_type: str
    definition: bytes


@wire
class TopicSchemaState(Struct):
    """A topic's schema binding (`schemas.topic_binding`) with its subject's schema id."""

    subject: str
    schema_id: int
    validation_policy: str  # none | warn | enforce
    payload_validation: bool
    revision: int  # the binding's mod revision in the metadata store: newer states win


@wire
class ProducerSchema(Struct):
    """What the gateway resolved for a `CreateProducer`: the topic's binding as it is now
    (None: no schema bound) and the version the producer writes (None: no subject)."""

    topic: TopicSchemaState | None
    version: SchemaVersionRef | None


@wire
class ClientRequest(Message):
    """A validated client frame from connection `identity`, for the actor that owns it.
    A `CreateProducer` carries its resolved `schema` when the broker runs a registry."""

    TAG = 16
    identity: bytes
    frame: bytes
    schema: ProducerSchema | None = None


@wire
class AdminRequest(Message):
    TAG = 17
    identity: bytes
    frame: bytes
    # security.mode curve: the Z85 CURVE key ZAP authenticated for the connection (the
    # frame's User-Id, read by the admin gateway), for the permission check; else None.
    public_key: bytes | None = None


@wire
class ProducerAttached(Message):
    """Topic -> gateway: route this producer's sends to `endpoint`, then send `reply`."""

    TAG = 18
    identity: bytes
    producer_id: int
    endpoint: str
    reply: bytes
    # The (partition) topic it is attached to: the resource of its Send and
    # CloseProducer in the permission check (security.mode curve).
    topic: str = ""


@wire
class ProducerDetached(Message):
    """Topic -> gateway: forget the producer; tell the client why when `reason` is set."""

    TAG = 19
    identity: bytes
    producer_id: int
    reason: str | None = None
    reply: bytes | None = None
    reattach: bool = False


@wire
class ConsumerAttached(Message):
    TAG = 20
    identity: bytes
    consumer_id: int
    endpoint: str
    reply: bytes
    # The (partition) topic of its subscription: the resource of its Flow, Ack,
    # Nack, Seek, Unsubscribe and CloseConsumer in the permission check.
    topic: str = ""


@wire
class ConsumerDetached(Message):
    TAG = 21
    identity: bytes
    consumer_id: int
    reason: str | None = None
    reply: bytes | None = None
    reattach: bool = False


@wire
class DetachProducer(Message):
    """Gateway -> topic: the producer's connection `identity` is gone (ignored when the
    producer has been re-attached by another connection since)."""

    TAG = 22
    producer_id: int
    identity: bytes


@wire
class DetachConsumer(Message):
    """Gateway -> subscription: the consumer's connection `identity` is gone."""

    TAG = 23
    consumer_id: int
    identity: bytes


@wire
class Publish(Message):
    """Topic -> subscription: one producer batch with its assigned offsets."""

    TAG = 24
    topic: str
    producer_id: int
    producer_name: str
    base_offset: int
    payloads: list[bytes]
    publish_times: list[int]
    keys: list[str | None] | None = None
    attributes: list[dict[str, str] | None] | None = None
    schema_id: int | None = None
    schema_version: int | None = None


@wire
class AttachConsumer(Message):
    """Topic -> subscription: a `Subscribe` frame to serve, with the consumer id the topic
    chose and, for a new subscription starting at the earliest message, the encoded
    `Publish` frames the topic still holds."""

    TAG = 25
    identity: bytes
    frame: bytes
    consumer_id: int
    replay: list[bytes]


@wire
class ConsumerCount(Message):
    """Subscription -> topic: how many consumers it has now (for per-topic limits)."""

    TAG = 26
    subscription: str
    consumers: int


@wire
class SubscriptionEnded(Message):
    """Subscription -> topic: unsubscribed by its last consumer; stop me."""

    TAG = 27
    subscription: str


@wire
class DeleteSubscription(Message):
    """Broker -> topic (ask): remove a subscription and close its consumers."""

    TAG = 28
    subscription: str


@wire
class OpenSubscriptions(Message):
    """Broker -> topic (ask): open these subscriptions (name, sub type) at the log's
    start where missing: a topic restarted with its first producer's dispatch strategy
    keeps the subscriptions its consumers made before it."""

    TAG = 346
    names: list[str]
    sub_types: list[int]


@wire
class DescribeSubscription(Message):
    TAG = 29


@wire
class SubscriptionStats(Message):
    TAG = 30
    info: SubscriptionInfo


@wire
class DescribePartition(Message):
    TAG = 31


@wire
class PartitionStats(Message):
    TAG = 32
    info: PartitionInfo


@wire
class Done(Message):
    TAG = 34


@wire
class ChildStopped(Message):
    """System -> parent: a child actor used up its restart budget and was stopped."""

    TAG = 35
    endpoint: str
    name: str
    reason: str


@wire
class FlushDone(Message):
    """Reliable topic -> itself: the WAL flush `flush_id` finished (written and, with
    `wal_sync: always`, fsynced), or failed with an error code and text."""

    TAG = 36
    flush_id: int
    error_code: int | None = None
    error_message: str | None = None


# `ReadRequest.purpose`: the subscription's read-ahead, its delayed-delivery index being
# rebuilt from the log, or the records of delayed messages due now
# (actors/subscription/delayed.py).
READ_AHEAD, READ_DELAYED_SCAN, READ_DELAYED_DUE = 0, 1, 2


@wire
class ReadRequest(Message):
    """Reliable subscription -> its topic: committed records from `start_offset`."""

    TAG = 37
    subscription: str
    start_offset: int
    max_bytes: int
    # Echoed in the answer: which of the subscription's readers asked (READ_* below).
    purpose: int = 0
    # A read_compacted subscription's: below the compaction horizon, from the compacted view.
    compacted: bool = False


@wire
class ReadResult(Message):
    """Topic -> subscription: encoded `Publish` frames (one per producer run) covering
    `start_offset` onwards, up to the committed end; `log_start_offset` tells a reader
    that asked for offsets no longer held where the log now starts."""

    TAG = 38
    start_offset: int
    frames: list[bytes]
    log_start_offset: int
    committed_offset: int
    # > start_offset: offsets start_offset..gap_end-1 were never written (reserved by a
    # broker that died before it acknowledged them); the reader goes on at gap_end.
    gap_end: int = 0
    purpose: int = 0  # the request's
    # From the compacted view: a gap is the keys compaction dropped, crossed quietly.
    compacted: bool = False


@wire
class FailurePolicyState(Struct):
    """A reliable subscription's failure policy (`dispatch.tracker.FailurePolicy`, field
    by field) as persisted with its cursor and sent between actors."""

    max_redelivery_count: int
    ack_timeout_ms: int
    base_redelivery_delay_ms: int
    max_redelivery_delay_ms: int
    backoff: str
    poison_policy: str
    dead_letter_topic: str | None = None

    def to_record(self) -> dict[str, object]:
        """The catalog form: a map by field name, so that fields may be added later."""
        return {name: getattr(self, name) for name in self._fields}

    @classmethod
    def from_record(cls, record: dict[str, object] | None) -> FailurePolicyState | None:
        """Back from `to_record` (None stays None); unknown keys are ignored."""
        if record is None:
            return None
        return cls(**{name: record[name] for name in cls._fields if name in record})  # type: ignore[arg-type]


@wire
class DelayedState(Struct):
    """What a Shared or Key-Shared subscription persists of its delayed messages, with
    its cursor (actors/subscription/delayed.py): every time-marked message with (time,
    offset) at or below (`released_ms`, `released_offset`) was released; the log from
    `low` holds every one not acknowledged yet (None: none); `unacked`: the released
    ones not acknowledged, in release order."""

    released_ms: int
    released_offset: int
    low: int | None
    unacked: list[int]


@wire
class PersistCursor(Message):
    """Reliable subscription -> broker: its cursor and out-of-order acks, to persist;
    and its failure policy and dispatch window when an admin set them (None: the
    broker's defaults apply)."""

    TAG = 39
    topic: str
    subscription: str
    sub_type: int
    cursor: int
    acked_above: list[int]
    policy: FailurePolicyState | None = None
    max_unacked_messages: int | None = None
    # How many seeks the subscription had made when it sent this (storage.mode local:
    # the topic drops a record older than a seek it made durable, `WalCursors.seek_durable`).
    seeks: int = 0
    delayed: DelayedState | None = None


@wire
class ForgetSubscription(Message):
    """Topic -> broker: a reliable subscription was deleted; drop its persisted state."""

    TAG = 40
    topic: str
    subscription: str


@wire
class SubscriptionState(Struct):
    """A persisted reliable subscription, given to its topic at start."""

    name: str
    sub_type: int
    cursor: int
    acked_above: list[int]
    policy: FailurePolicyState | None = None
    max_unacked_messages: int | None = None
    delayed: DelayedState | None = None

    def retained_cursor(self) -> int:
        """What the log must keep after: the cursor, or below the lowest delayed message
        the subscription holds (actors/subscription/delayed.py)."""
        low = self.delayed.low if self.delayed is not None else None
        return self.cursor if low is None else min(self.cursor, low - 1)


@wire
class DeadLetter(Message):
    """Reliable subscription -> broker: republish poisoned messages to `topic`."""

    TAG = 41
    topic: str
    payloads: list[bytes]
    publish_times: list[int]
    keys: list[str | None]
    attributes: list[dict[str, str] | None]


@wire
class AppendInternal(Message):
    """Broker -> topic: append messages produced by the broker itself (dead letters)."""

    TAG = 42
    producer_name: str
    payloads: list[bytes]
    publish_times: list[int]
    keys: list[str | None]
    attributes: list[dict[str, str] | None]


@wire
class DurableSegment(Struct):
    """A sealed segment copied to the durable store (shared_fs, object_store)."""

    base_offset: int
    end_offset: int  # inclusive
    object_key: str
    size_bytes: int
    crc32c: int
    created_ms: int


@wire
class SegmentSealed(Message):
    """Reliable topic -> broker: a WAL segment is sealed; upload it (durable modes)."""

    TAG = 43
    topic: str
    base_offset: int
    end_offset: int
    record_count: int
    path: str


@wire
class SegmentDurable(Message):
    """Broker -> topic: a sealed segment is now in the durable store."""

    TAG = 44
    segment: DurableSegment


@wire
class SubscriptionCursor(Message):
    """Reliable subscription -> its topic: its cursor, for retention."""

    TAG = 45
    subscription: str
    cursor: int


@wire
class SegmentFetched(Message):
    """Reliable topic -> itself: a durable segment was downloaded to `path` (or failed)."""

    TAG = 46
    base_offset: int
    path: str | None
    error: str | None = None


@wire
class ForgetSegments(Message):
    """Reliable topic -> broker: retention deleted these durable segments' objects;
    drop their descriptors."""

    TAG = 47
    topic: str
    base_offsets: list[int]


# Seek and failure policy of reliable subscriptions (tags from 60: room above for storage).


@wire
class SeekCursor(Message):
    """Broker -> topic (ask): move subscription `subscription` to `offset`, or to the
    first message published at or after `publish_time`. Answered by `Done`; a
    non-reliable topic is FAILED_PRECONDITION, an offset outside the log INVALID_ARGUMENT."""

    TAG = 60
    subscription: str
    offset: int | None
    publish_time: int | None


@wire
class ResolveSeek(Message):
    """Reliable subscription -> its topic: a consumer's `Seek`; the topic resolves and
    checks the offset, then tells the subscription `SeekTo` (or answers the client's
    request `request_id` on connection `identity` with the error)."""

    TAG = 61
    subscription: str
    identity: bytes
    request_id: int
    offset: int | None
    publish_time: int | None


@wire
class SeekTo(Message):
    """Topic -> subscription (told, or asked): restart at `offset`, a checked offset of
    the log; then answer `Ok` to request `request_id` on `identity` when given. Answered
    by the subscription's `PersistCursor` as of the seek when asked."""

    TAG = 62
    offset: int
    identity: bytes | None = None
    request_id: int = 0


@wire
class ExpireBelow(Message):
    """Topic -> subscription (told): the messages below `end` are past the topic's
    message TTL; acknowledge those not acknowledged yet (actors/topic/message_ttl.py)."""

    TAG = 351
    end: int


@wire
class DelayedDue(Message):
    """A subscription's timer: the earliest delayed message it holds is due
    (actors/subscription/delayed.py)."""

    TAG = 353


@wire
class CompactTopicNow(Message):
    """Broker -> topic (asked): start compacting (`CompactTopic`); `Ok` once started."""

    TAG = 354


@wire
class CompactionFinished(Message):
    """A topic's compaction thread -> the topic: the new ledger (`path`, holding the
    compacted view below `horizon`), or why it failed (`error`)."""

    TAG = 355
    path: str | None
    horizon: int
    error: str | None = None
    records_kept: int = 0
    keys: int = 0


@wire
class ExpireMessages(Message):
    """Topic -> itself every `policies.message_expiry_check_interval_ms` while its
    message TTL is set: look for messages past it."""

    TAG = 352


@wire
class SetSubscriptionPolicy(Message):
    """Broker -> topic -> subscription (ask): apply and persist a new failure policy.
    The subscription answers with the `PersistCursor` to store (policy included)."""

    TAG = 63
    subscription: str
    policy: FailurePolicyState


@wire
class GetSubscriptionPolicy(Message):
    """Broker -> topic -> subscription (ask). Answered by `SubscriptionPolicy`."""

    TAG = 64
    subscription: str


@wire
class SubscriptionPolicy(Message):
    """A subscription's failure policy; `explicit`: set by an admin, not the defaults."""

    TAG = 65
    policy: FailurePolicyState
    explicit: bool


# Dispatch window of reliable subscriptions.


@wire
class SetSubscriptionDispatchConfig(Message):
    """Broker -> topic -> subscription (ask): apply and persist a new window
    (`max_unacked_messages` per consumer). The subscription answers with the
    `PersistCursor` to store (window included)."""

    TAG = 66
    subscription: str
    max_unacked_messages: int


@wire
class GetSubscriptionDispatchConfig(Message):
    """Broker -> topic -> subscription (ask). Answered by `SubscriptionDispatchConfig`."""

    TAG = 67
    subscription: str


@wire
class SubscriptionDispatchConfig(Message):
    """A subscription's window; `explicit`: set by an admin, not the broker's default."""

    TAG = 68
    max_unacked_messages: int
    explicit: bool


@wire
class TopicSchemaChanged(Message):
    """Gateway -> broker -> topic actors: the schema binding of `topic` (a base topic:
    its partitions follow) changed in the metadata store at `revision`; `state` None: it
    was removed."""

    TAG = 69
    topic: str
    revision: int
    state: TopicSchemaState | None


# WAL snapshots (tags from 70): the snapshot actor asks the broker for the reliable
# topics, each topic for a cut (subscriptions first, then the committed end, so no cursor
# is past it), exports the segments the cut names, then releases the topic's pin.


@wire
class SnapshotTopicRef(Struct):
    topic: str
    endpoint: str
    base_topic: str
    partition: int | None


@wire
class ListSnapshotTopics(Message):
    """Snapshot actor -> broker (ask): reliable topics served here whose name (or base
    topic's name) matches the glob `pattern` (None: all). Answered by `SnapshotTopics`."""

    TAG = 70
    pattern: str | None = None


@wire
class SnapshotTopics(Message):
    TAG = 71
    topics: list[SnapshotTopicRef]


@wire
class SubscriptionCutState(Struct):
    name: str
    sub_type: int
    cursor: int
    acked_above: list[int]
    unacked: int
    consumers: list[str]
    backlog_messages: int


@wire
class DescribeSubscriptionCut(Message):
    """Topic -> reliable subscription (ask). Answered by `SubscriptionCut`."""

    TAG = 72


@wire
class SubscriptionCut(Message):
    TAG = 73
    state: SubscriptionCutState


@wire
class SegmentRef(Struct):
    """Records `base_offset .. upto_offset - 1` of one segment: a local WAL file (`path`)
    or, when only the durable store has it, its durable copy. `sealed`: the whole segment
    (its export can be shared by later snapshots)."""

    base_offset: int
    upto_offset: int
    sealed: bool
    path: str | None
    durable: DurableSegment | None = None


@wire
class TakeSnapshotCut(Message):
    """Snapshot actor -> reliable topic (ask): the topic's state now, its files kept
    (no retention) until `ReleaseSnapshotCut(pin_id)` or `pin_ms` pass. Answered by
    `SnapshotCut`."""

    TAG = 74
    pin_id: int
    pin_ms: int


@wire
class SnapshotCut(Message):
    TAG = 75
    topic: str
    log_start_offset: int
    end_offset: int
    messages_in: int
    producers: list[str]
    segments: list[SegmentRef]
    subscriptions: list[SubscriptionCutState]


@wire
class ReleaseSnapshotCut(Message):
    TAG = 76
    pin_id: int


@wire
class AssignmentChanged(Message):
    """Broker's assignment watch -> broker: `topic` (a partition, or a topic without
    partitions) is now served by `broker_id` (None: by nobody, unassigned or deleted),
    as of metadata `revision`."""

    TAG = 77
    topic: str
    broker_id: int | None
    revision: int


@wire
class AssignmentsResync(Message):
    """Broker's assignment watch -> broker: every topic assigned to this broker as of
    `revision` (after a start, a lost history, or a regained lease)."""

    TAG = 78
    topics: list[str]
    revision: int


@wire
class LeaseChanged(Message):
    """Broker's lease keeper -> broker: the registration lease is held (serve, and
    never at or after `until_ms`, monotonic: told again at every renewal) or lost (stop
    serving: another broker may take the topics once it expires)."""

    TAG = 79
    held: bool
    until_ms: int = 0


@wire
class LeaseTick(Message):
    """Timer -> lease keeper: time passed (renew, or fence when the lease runs out).
    Tags 250+: past every tag of every protocol, so another branch's do not meet them."""

    TAG = 250


@wire
class LeaseRenewed(Message):
    """Lease keeper's renewal task -> lease keeper: the renewal sent at `sent_ms`
    (monotonic) was applied (`renewed`) or failed (`error`)."""

    TAG = 251
    sent_ms: int
    renewed: bool
    error: str = ""


@wire
class PublishLoad(Message):
    """Timer -> load reporter: publish this broker's load report."""

    TAG = 252


@wire
class ServedTopics(Message):
    """Load reporter -> broker (ask): the topic actors served here, and whether the
    broker serves at all (holds its lease). Answered with `ServedTopicsList`."""

    TAG = 253


@wire
class ServedTopicsList(Message):
    TAG = 254
    endpoints: list[str]
    serving: bool


@wire
class ReserveOffsetsFor(Message):
    """Broker -> offset reservations: a served topic's `ReserveOffsets`, with the topic
    actor to answer and the broker's lease end (monotonic ms; nothing is written after)."""

    TAG = 255
    topic: str
    until: int
    endpoint: str
    lease_until_ms: int


@wire
class TopicReleased(Message):
    """Broker -> offset reservations and policy keeper: the topic is no longer served
    here (its seal ends its reservation): what is pending for it is dropped, and it is
    told no more policy changes. `endpoint`: the topic's actor that stopped (a keeper told
    late, after the topic's next actor was served, keeps that one)."""

    TAG = 256
    topic: str
    endpoint: str | None = None


@wire
class WriteReservations(Message):
    """Offset reservations -> itself: write what is pending, in one transaction."""

    TAG = 257


@wire
class FlushCursors(Message):
    """Broker -> cursor flusher (ask): write every cursor and producer record told so
    far, now (before a seal, a hand-over, an admin answer). Answered `Done`, or the
    store's error (the records stay pending for the next flush)."""

    TAG = 258


@wire
class SubscriptionsOf(Message):
    """Reliable topic (at each start) or broker -> cursor flusher (ask): the topic's
    persisted subscriptions, with the cursors not written yet (newer than the store's).
    Answered `PersistedSubscriptions`."""

    TAG = 259
    topic: str


@wire
class PersistedSubscriptions(Message):
    TAG = 260
    states: list[SubscriptionState]


@wire
class ForgetTopicRecords(Message):
    """Broker -> cursor flusher: the topic was deleted; its unwritten cursors and
    producer records are dropped (its metadata went with it)."""

    TAG = 261
    topic: str


@wire
class ClearProducers(Message):
    """Broker -> cursor flusher: the topic is loaded here; the producer records its
    previous broker left are deleted with the next flush (its producers attach again)."""

    TAG = 262
    topic: str


@wire
class RecordDamage(Message):
    """Broker -> cursor flusher: the store refused the damage record of `topic`
    (an encoded `WalDamageRecord`); written again at each flush until it is there."""

    TAG = 263
    topic: str
    record: bytes


@wire
class ForgetDamage(Message):
    """Broker -> cursor flusher: `topic` is no longer damaged here (repaired, moved,
    deleted): a damage record not written yet is dropped."""

    TAG = 264
    topic: str


@wire
class WatchNext(Message):
    """Metadata watch -> itself: look for the next changes under its prefix (a timer
    message after a failed attempt)."""

    TAG = 265


@wire
class JoinCluster(Message):
    """Broker -> itself: try to join the cluster (a leader, the namespaces seeded); a
    failed attempt schedules the next as a timer message."""

    TAG = 266


@wire
class RemoteAdminFor(Message):
    """A broker's admin request task -> the broker (ask): the `RemoteAdmin` child that
    talks to the admin port at `admin_url` (spawned at the first ask). Answered
    `RemoteAdminAt`."""

    TAG = 300
    admin_url: str


@wire
class RemoteAdminAt(Message):
    TAG = 301
    endpoint: str


@wire
class RemoteAdminCall(Message):
    """-> a `RemoteAdmin` (ask): send the admin request `frame` (its request id is
    replaced) to its broker and answer with the reply's frame (`RemoteAdminAnswer`), or
    the error the broker answered. `timeout_ms` None: `cluster.request_timeout_ms`."""

    TAG = 302
    frame: bytes
    timeout_ms: int | None = None


@wire
class RemoteAdminAnswer(Message):
    TAG = 303
    frame: bytes


@wire
class RemoteAdminIdle(Message):
    """A `RemoteAdmin` -> itself, a while after a call: still no call since call
    number `calls`, so its connection is closed (`actors/cluster/remote_admin.py`)."""

    TAG = 307
    calls: int


@wire
class HandOverBegin(Message):
    """Hand-over -> itself: (begin again to) offer the WAL to the receiving broker,
    which says how much of each file it holds; a timer message after an interruption."""

    TAG = 304


@wire
class HandOverNextChunk(Message):
    """Hand-over -> itself: send the next chunk of the WAL (or commit after the last)."""

    TAG = 305


@wire
class JoinAttempted(Message):
    """The task of one attempt to join the cluster -> the broker: `error` None when the
    store answered (a leader, the namespaces seeded), else why not (tried again later);
    `failed`: not the store's answer but a bug of ours (the broker's handler raises it)."""

    TAG = 306
    error: str | None = None
    failed: bool = False


@wire
class ParkedExpired(Message):
    """Timer -> broker: answer the requests waiting for an assignment past their deadline."""

    TAG = 80


@wire
class LoadManagerRequest(Message):
    """Broker -> load manager (ask): an admin request for the cluster's leader (balance,
    rebalance, unload or activate a broker), as its admin-protocol frame. Answered by
    `LoadManagerReply` with the admin answer's frame."""

    TAG = 81
    frame: bytes


@wire
class LoadManagerReply(Message):
    TAG = 82
    frame: bytes


@wire
class ReserveOffsets(Message):
    """Reliable topic -> broker: record in the metadata store that this broker may give
    out the topic's offsets below `until` (see `cluster_records.TopicState`)."""

    TAG = 83
    topic: str
    until: int


@wire
class OffsetsReserved(Message):
    """Broker -> reliable topic: offsets below `until` are reserved (0 with `error`: the
    reservation could not be written; what waits for it is refused)."""

    TAG = 84
    until: int
    error: str | None = None


@wire
class SealTopic(Message):
    """Broker -> topic (ask), before it unloads a non-reliable topic: refuse sends from
    now on and say where the offsets stopped (`TopicSealed`)."""

    TAG = 85


@wire
class TopicSealed(Message):
    TAG = 86
    next_offset: int


@wire
class TopicStopped(Message):
    """Reliable topic -> broker, from its `on_stop` (not a restart): its log ends at
    `next_offset`. At a clean shutdown the broker ends the topic's reservation there."""

    TAG = 87
    topic: str
    next_offset: int


@wire
class ProducerRegistry(Message):
    """Topic -> broker: a producer attached (`attached`) or left; the broker records it
    in the metadata store with its next write of cursors."""

    TAG = 88
    topic: str
    producer_id: int
    producer_name: str
    access_mode: int
    attached: bool


@wire
class StopForHandOver(Message):
    """Broker, to itself (from the task moving `topic` in storage.mode local): stop
    serving it, keeping its assignment, until `HandOverEnded`. Answered `Ok`-like by
    `HandOverStopped`."""

    TAG = 190
    topic: str


@wire
class HandOverStopped(Message):
    TAG = 191
    topic: str


@wire
class HandOverEnded(Message):
    """The move of `topic` ended: `error` None when ownership switched (the local WAL
    goes), else why it was refused (the topic is served here again)."""

    TAG = 192
    topic: str
    error: str | None = None
    hand_over: str | None = None  # the `HandOver` actor that carried it out (stopped by the broker)


@wire
class DeliveryRefused(Message):
    """Gateway -> subscription: a `Deliver` of `offsets` to the consumer was refused by
    its connection's outbound byte budget (never sent): deliver them again when the
    consumer resumes, without counting an attempt."""

    TAG = 199
    identity: bytes
    consumer_id: int
    offsets: list[int]


@wire
class ConsumerPaused(Message):
    """Gateway -> subscription: the consumer's connection holds more unsent bytes than
    its budget allows (`paused`), or has drained enough to take deliveries again.
    A paused consumer gets no deliveries whatever its permits."""

    TAG = 193
    identity: bytes
    consumer_id: int
    paused: bool


@wire
class HolderLives(Message):
    """Topic or subscription -> gateway (ask), before refusing a producer or consumer
    name held by another connection: does the session of `identity` still hold
    `client_id` at `endpoint`? Answered by `HolderLiveness`. The gateway's departure
    notices (`DetachProducer`/`DetachConsumer`) are told, and lost to a full mailbox;
    this question is what keeps a lost one from holding the name for good."""

    TAG = 200
    identity: bytes
    client_kind: int  # client_protocol.ClientKind
    client_id: int
    endpoint: str


@wire
class HolderLiveness(Message):
    TAG = 201
    alive: bool


@wire
class HeldSendsDue(Message):
    """A reliable topic's own timer while it holds sends over its backlog quota
    (`producer_request_hold`): those held past `backlog_quota_hold_ms_max` are refused."""

    TAG = 202


@wire
class ApplyBacklogQuota(Message):
    """Broker -> reliable topic: the backlog quota in force for it now (its topic's,
    else its namespace's, else the broker's `policies`), after a change in the store."""

    TAG = 230
    limit_bytes: int
    policy: str


@wire
class BacklogQuotasChanged(Message):
    """The policy keeper's watch of `/policies/backlog-quota/`: a quota was set or
    removed (at `revision` of the store); the keeper tells the reliable topics served
    here the quota now in force."""

    TAG = 231
    revision: int = 0


@wire
class ApplyTopicPolicies(Message):
    """Broker -> topic (and topic -> its subscriptions): the topic policies in force for
    it now (its topic's, else its namespace's, else the broker's `policies`, each policy
    on its own), at spawn and after a change in the store. The names are the broker's
    `policies` keys, so a topic reads these where it read the config."""

    TAG = 276
    max_producers_per_topic: int
    max_subscriptions_per_topic: int
    max_consumers_per_topic: int
    max_consumers_per_subscription: int
    max_message_size: int
    max_publish_rate: int
    max_dispatch_rate: int
    retention_time_ms: int = 0  # 0: kept (storage.retention_time_ms null)
    retention_bytes_max: int = 0
    subscription_expiration_ms: int = 0  # 0: never
    message_ttl_s: int = 0  # 0: never
    deduplication: int = 0  # 1: on
    compaction_threshold_bytes: int = 0  # 0: never


@wire
class TopicPoliciesChanged(Message):
    """The policy keeper's watch of `/policies/topic-policies/`: policies were set or
    removed (at `revision` of the store); the keeper tells the topics served here those
    now in force."""

    TAG = 277
    revision: int = 0


@wire
class PublishTokensDue(Message):
    """Topic -> itself while it holds producers' batches over its `max_publish_rate`:
    the bucket has refilled enough for the first one."""

    TAG = 278


@wire
class ExpireSubscriptions(Message):
    """Topic -> itself when its first idle subscription falls due under the topic's
    `subscription_expiration_ms` (actors/topic/expiry.py)."""

    TAG = 345


@wire
class DispatchTokensDue(Message):
    """Subscription -> itself while deliveries wait on its `max_dispatch_rate`."""

    TAG = 279


@wire
class TopicPoliciesPending(Message):
    """Policy keeper -> itself while some topic's mailbox was full when it was told the topic
    policies in force: tell those topics again (what the store holds then)."""

    TAG = 280


@wire
class BacklogQuotasPending(Message):
    """Policy keeper -> itself while some reliable topic's mailbox was full when it was told
    the backlog quota in force: tell those topics again (what the store holds then)."""

    TAG = 342


@wire
class LoadTick(Message):
    """Load manager -> itself every half second (a timer message): take or give up the
    cluster's lead as the Raft peer's role says, and run a round when the idle period is
    over or the last round failed."""

    TAG = 349


@wire
class LoadRoundDue(Message):
    """The leading load manager's metadata watch -> the load manager: a change at
    `revision` needs a round (a topic, marker, assignment, move or broker changed); one
    that started after it has read it already."""

    TAG = 350
    revision: int


@wire
class TopicServed(Message):
    """Broker -> policy keeper: a topic (or partition) is served here now, by the actor
    at `endpoint`, spawned with the policies the local replica held at `revision` (or
    later): a change the keeper learned of past it is told to the topic."""

    TAG = 347
    topic: str
    dispatch_strategy: int
    endpoint: str
    revision: int


@wire
class BrokerJoined(Message):
    """Broker -> policy keeper: the broker joined the cluster (its bootstrap namespaces
    are written): the keeper starts following the policies in the store."""

    TAG = 348


@wire
class ResyncNext(Message):
    """Broker -> itself: follow the next slice of the resync `generation` (a resync of
    tens of thousands of topics is a series of these, so client requests queued in
    between are served between two slices; a newer resync makes older ones void)."""

    TAG = 89
    generation: int


@wire
class WalSyncDue(Message):
    """Reliable topic -> itself, every `storage.wal_sync_interval_ms` with `wal_sync:
    interval`: fsync what the WAL has written (acknowledged already, under the weaker
    promise interval mode documents)."""

    TAG = 270


@wire
class ClientRequests(Message):
    """Gateway -> topic: the `Send`s of one round of the client socket for one topic, in
    the order they arrived (`frames[i]` from connection `identities[i]`): one mailbox
    message and one wake-up for them all. The runtime hands each on as its own
    `ClientRequest` (the failure rule and the answer stay per request)."""

    TAG = 240
    identities: list[bytes]
    frames: list[bytes]


INTERNAL_PROTOCOL = Protocol(
    "internal",
    PROTOCOL_VERSION,
    (
        Request, Reply, Tick, ClientRequest, AdminRequest,
        ProducerAttached, ProducerDetached, ConsumerAttached, ConsumerDetached, OpenSubscriptions,
        DetachProducer, DetachConsumer, Publish, AttachConsumer, ConsumerCount,
        SubscriptionEnded, DeleteSubscription, DescribeSubscription, SubscriptionStats,
        DescribePartition, PartitionStats, Done, ChildStopped,
        FlushDone, ReadRequest, ReadResult, PersistCursor, ForgetSubscription, DeadLetter, AppendInternal,
        SegmentSealed, SegmentDurable, SubscriptionCursor, SegmentFetched, ForgetSegments,
        SeekCursor, ResolveSeek, SeekTo, SetSubscriptionPolicy, GetSubscriptionPolicy, SubscriptionPolicy,
        SetSubscriptionDispatchConfig, GetSubscriptionDispatchConfig, SubscriptionDispatchConfig,
        TopicSchemaChanged, ListSnapshotTopics, SnapshotTopics, DescribeSubscriptionCut, SubscriptionCut,
        TakeSnapshotCut, SnapshotCut, ReleaseSnapshotCut,
        AssignmentChanged, AssignmentsResync, LeaseChanged, ParkedExpired, LoadManagerRequest, LoadManagerReply,
        ReserveOffsets, OffsetsReserved, SealTopic, TopicSealed, TopicStopped,
        ProducerRegistry,
        StopForHandOver, HandOverStopped, HandOverEnded,
        ConsumerPaused, DeliveryRefused,
        HolderLives, HolderLiveness,
        HeldSendsDue,
        ApplyBacklogQuota, BacklogQuotasChanged, ApplyTopicPolicies, TopicPoliciesChanged,
        TopicPoliciesPending, BacklogQuotasPending, PublishTokensDue, DispatchTokensDue, ExpireSubscriptions,
        ExpireMessages, ExpireBelow, DelayedDue, CompactTopicNow, CompactionFinished,
        ResyncNext, TopicServed, BrokerJoined, LoadTick, LoadRoundDue,
        LeaseTick, LeaseRenewed, PublishLoad, ServedTopics, ServedTopicsList,
        ReserveOffsetsFor, TopicReleased, WriteReservations,
        FlushCursors, SubscriptionsOf, PersistedSubscriptions, ForgetTopicRecords, ClearProducers, RecordDamage,
        ForgetDamage, WatchNext, JoinCluster, WalSyncDue,
        RemoteAdminFor, RemoteAdminAt, RemoteAdminCall, RemoteAdminAnswer, RemoteAdminIdle, HandOverBegin, HandOverNextChunk,
        JoinAttempted,
        ClientRequests,
    ),
)


@wire
class SecurityResync(Message):
    """A gateway's security watch -> the gateway: every entry under `/security/` as of
    now (at the watch's start and after a gap), for its `Enforcer`."""

    TAG = 340
    keys: list[str]
    values: list[bytes]


@wire
class SecurityChanged(Message):
    """A gateway's security watch -> the gateway: one entry under `/security/` was put
    (`value`) or deleted (None)."""

    TAG = 341
    key: str
    value: bytes | None = None

"""The client <-> broker protocol (DEALER on the client, ROUTER on the broker).

Every request carries a `request_id` chosen by the client; the broker answers with a
message carrying the same id (or `Error`). `Flow` is fire-and-forget. `Deliver`,
`ProducerClosed` and `ConsumerClosed` are pushed by the broker unasked.

Messages travel in columnar batches: `Send` and `Deliver` carry one list per field
(payloads, publish times, keys, attributes), so the broker forwards whole lists and
never builds a Python object per message. See docs/protocol.md for the byte layout.
"""

from __future__ import annotations

from typing import Any

from danube_zmq.transport.codec import Message, Protocol, Struct, peek_ints, wire
from danube_zmq.transport.common import COMMON_MESSAGES, PROTOCOL_VERSION, Connect, Enum, Ping

# A publish time is ms since the epoch, stamped by the producer (its clock, not the
# broker's), at most the last ms of year 9999: the largest a `datetime` holds, and well
# inside the int64 microseconds of backlog reports and snapshot Parquet files. The topic
# refuses a `Send` with a time outside 0..PUBLISH_TIME_MS_MAX (INVALID_ARGUMENT).
PUBLISH_TIME_MS_MAX = 253_402_300_799_999


class DispatchStrategy(Enum):
    NON_RELIABLE = 0
    RELIABLE = 1


class SubType(Enum):
    """Subscription types; the values are Danube's."""

    EXCLUSIVE = 0
    SHARED = 1
    FAILOVER = 2
    KEY_SHARED = 3


class InitialPosition(Enum):
    """Where a *new* subscription starts; an existing one resumes where it was."""

    LATEST = 0
    EARLIEST = 1


class LookupKind(Enum):
    REDIRECT = 0
    CONNECT = 1


class ClientKind(Enum):
    PRODUCER = 0
    CONSUMER = 1


class HealthState(Enum):
    OK = 0
    CLOSE = 1


@wire
class Lookup(Message):
    """Which broker serves `topic`? Answered with `LookupResult` or NOT_FOUND."""

    TAG = 16
    request_id: int
    topic: str


@wire
class LookupResult(Message):
    TAG = 17
    request_id: int
    kind: int
    broker_url: str


@wire
class GetPartitions(Message):
    """The partition topics of `topic`: `[topic]` when it is not partitioned. With
    `create`, a missing topic is created first (when the broker auto-creates topics)
    with `partitions` partitions (0: not partitioned) and `dispatch_strategy`; an
    existing topic whose shape differs is FAILED_PRECONDITION. With `create` and
    `for_subscription` (a subscriber's, whose topic was NOT_FOUND): a missing topic is
    created as its namespace's auto topic creation policy says (`partitions` and
    `dispatch_strategy` unused; NOT_FOUND where the policy is off), an existing one
    returned whatever its shape. `create` needs Produce on the topic either way."""

    TAG = 18
    request_id: int
    topic: str
    create: bool = False
    partitions: int = 0
    dispatch_strategy: int = DispatchStrategy.NON_RELIABLE
    for_subscription: bool = False


@wire
class Partitions(Message):
    TAG = 19
    request_id: int
    topic: str
    partitions: list[str]


# Attributes a chunk of a chunked message carries (the client's `chunks.py`): the
# message's id, the chunk's number (0..count-1), the chunk count, the whole payload's
# bytes. A Shared subscription deals every chunk of one message to one consumer.
CHUNK_UUID = "__chunk_uuid"
CHUNK_ID = "__chunk_id"
CHUNK_COUNT = "__chunk_count"
CHUNK_TOTAL_BYTES = "__chunk_total_bytes"

# The attribute of a delayed message (`send(deliver_after_ms=)` / `deliver_at_ms=`): when
# to deliver it, ms since the epoch by the broker's clock, in decimal. Shared and
# Key-Shared subscriptions hold it until then; Exclusive and Failover deliver at once.
DELIVER_AT = "__deliver_at"


@wire
class CreateProducer(Message):
    """Attach a producer to one (partition) topic. Producers auto-create the topic when
    the broker allows it; the same `producer_name` on the same topic re-attaches.
    With `schema_subject` the producer writes that registered subject: version
    `schema_version` (pinned), the latest if it is at least `schema_min_version`, or the
    latest. The first producer naming a subject binds the topic to it; a producer naming
    another subject is refused with FAILED_PRECONDITION.

    `next_sequence`: the `Send.sequence` of the batch the producer sends next (its
    oldest unacknowledged one); a reliable topic refuses later batches until that one
    comes, so a batch that lost its answer on a previous attachment is not overtaken.
    None (an older client): the topic takes whichever batch comes first."""

    TAG = 20
    request_id: int
    topic: str
    producer_name: str
    dispatch_strategy: int = DispatchStrategy.NON_RELIABLE
    access_mode: int = 0
    schema_subject: str | None = None
    schema_version: int | None = None
    schema_min_version: int | None = None
    next_sequence: int | None = None


@wire
class ProducerCreated(Message):
    """`schema_id` and `schema_version`: the schema version the producer writes (None
    without a subject); the client stamps them on every `Send`.

    `last_sequence_id`: on a reliable topic with the `deduplication` policy, the highest
    `Send.sequence_ids` entry of this producer name the topic stored (-1: none); the
    producer numbers its next messages above it. None: the topic does not deduplicate."""

    TAG = 21
    request_id: int
    producer_id: int
    producer_name: str
    topic: str
    schema_id: int | None = None
    schema_version: int | None = None
    last_sequence_id: int | None = None

    def to_wire(self) -> list[Any]:
        # Written only when the topic deduplicates: a client from before the field
        # (6 fields, extra ones refused) still attaches everywhere else.
        out = Message.to_wire(self)
        return out[:-1] if self.last_sequence_id is None else out


@wire
class CloseProducer(Message):
    TAG = 22
    request_id: int
    producer_id: int


@wire
class Send(Message):
    """A batch of messages from one producer, column by column. `keys` and `attributes`
    are None when no message in the batch has one; otherwise one entry per message.
    Answered by `SendReceipt`.

    `sequence`: the batch's number among its producer's batches (0, 1, ...; a batch sent
    again keeps its number). A reliable topic accepts a batch only if no earlier batch
    of the producer was refused since (a refused batch must be sent again first), so a
    producer with several batches in flight keeps its order across retries.

    `sequence_ids`: the producer's own number for each message, increasing within the
    batch and from batch to batch (deduplication). On a reliable topic with the
    `deduplication` policy, messages whose number is at or below the highest this
    producer name stored are not stored again: the receipt gives their first offset
    (-1 when that is older than `policies.deduplication_window`). Stored with each
    message whatever the policy."""

    TAG = 23
    request_id: int  # `peek_send` reads these two first fields
    producer_id: int
    payloads: list[bytes]
    publish_times: list[int]
    keys: list[str | None] | None = None
    attributes: list[dict[str, str] | None] | None = None
    schema_id: int | None = None
    schema_version: int | None = None
    sequence: int | None = None
    sequence_ids: list[int] | None = None


def batch_bytes(payloads: list[bytes], keys: list[str | None] | None,
                attributes: list[dict[str, str] | None] | None) -> int:
    """The bytes a batch's messages carry: payloads, keys and attribute names and values
    (UTF-8 lengths counted as characters: the bound is what matters, not the last byte).
    What a topic counts as bytes in: attributes 700 times a payload's size are bytes
    published too."""
    size = sum(map(len, payloads))
    if keys is not None:
        size += sum(len(key) for key in keys if key is not None)
    if attributes is not None:
        size += sum(len(name) + len(value) for attrs in attributes if attrs for name, value in attrs.items())
    return size


def peek_send(frame: bytes | memoryview) -> tuple[int, int] | None:
    """(request_id, producer_id) of a `Send` frame without decoding its batch; None
    when the frame is not a `Send` in the usual shape."""
    ids = peek_ints(frame, Send.TAG, 2)
    return None if ids is None else (ids[0], ids[1])


@wire
class SendReceipt(Message):
    """One topic offset per message of the `Send`, in order. A message id is
    (topic, offset, producer_id)."""

    TAG = 24
    request_id: int
    producer_id: int
    offsets: list[int]


@wire
class Subscribe(Message):
    """Attach a consumer to a subscription of one (partition) topic. A new subscription
    starts at `initial_position`, or at `start_offset` when given (reliable topics).

    `durable` False (a reader's): the subscription is made new for this consumer (its
    name must be free), has one consumer (Exclusive), keeps no cursor in the store,
    holds no log back from retention or the backlog quota, and is gone when its
    consumer leaves (closed, disconnected, or the topic restarted or moved: a reader
    attaches again with `start_offset` after the last message it read)."""

    TAG = 25
    request_id: int
    topic: str
    subscription: str
    consumer_name: str
    sub_type: int = SubType.SHARED
    initial_position: int = InitialPosition.LATEST
    key_filters: list[str] | None = None
    start_offset: int | None = None
    durable: bool = True
    # Exclusive and Failover (and readers) of a reliable topic: below its compaction
    # horizon, the latest message per key only (`CompactTopic`), then the live tail.
    read_compacted: bool = False


@wire
class Subscribed(Message):
    TAG = 26
    request_id: int
    consumer_id: int
    consumer_name: str
    topic: str
    # Whether the topic stores messages (reliable dispatch). None: a broker from before
    # the field, which did not say.
    reliable: bool | None = None


@wire
class Flow(Message):
    """Grant the broker `permits` more messages for this consumer (no reply)."""

    TAG = 27
    consumer_id: int
    permits: int


@wire
class Deliver(Message):
    """Messages of one producer's batch for one consumer. Offsets run contiguously from
    `base_offset` unless `offsets` lists them one by one."""

    TAG = 28
    consumer_id: int
    topic: str
    producer_id: int
    producer_name: str
    base_offset: int
    payloads: list[bytes]
    publish_times: list[int]
    keys: list[str | None] | None = None
    attributes: list[dict[str, str] | None] | None = None
    offsets: list[int] | None = None
    redelivery_count: int = 0
    schema_id: int | None = None
    schema_version: int | None = None


@wire
class Ack(Message):
    """Acknowledge messages by topic offset. Answered by `Ok`."""

    TAG = 29
    request_id: int
    consumer_id: int
    offsets: list[int]


@wire
class Nack(Message):
    """Negative acknowledgement: redeliver these after `delay_ms`. Answered by `Ok`."""

    TAG = 30
    request_id: int
    consumer_id: int
    offsets: list[int]
    delay_ms: int | None = None


@wire
class Unsubscribe(Message):
    """Close the consumer and delete its subscription. Answered by `Ok`."""

    TAG = 31
    request_id: int
    consumer_id: int


@wire
class CloseConsumer(Message):
    TAG = 32
    request_id: int
    consumer_id: int


@wire
class HealthCheck(Message):
    """Is this producer or consumer still attached? Answered by `HealthStatus`."""

    TAG = 33
    request_id: int
    client_kind: int
    client_id: int


@wire
class HealthStatus(Message):
    TAG = 34
    request_id: int
    status: int


@wire
class ProducerClosed(Message):
    """The broker closed this producer. With `reattach` (the topic actor restarted or
    moved, or the broker is stopping) the client creates it again; without (topic deleted, name taken over by another
    connection) the producer is finished and its sends fail with `reason`."""

    TAG = 35
    producer_id: int
    reason: str
    reattach: bool = False


@wire
class ConsumerClosed(Message):
    """The broker closed this consumer. With `reattach` (the subscription actor
    restarted or moved, or the broker is stopping) the client subscribes again; without (topic or subscription deleted,
    consumer name taken over) the consumer is finished and `receive` raises `reason`."""

    TAG = 36
    consumer_id: int
    reason: str
    reattach: bool = False


@wire
class Seek(Message):
    """Move this consumer's subscription (reliable topics) to `offset`, or to the first
    message published at or after `publish_time` (ms since the epoch); exactly one of
    the two. Every consumer of the subscription then receives from there: each first
    gets `SeekReset`. Answered by `Ok` (after the `SeekReset` to this consumer)."""

    TAG = 37
    request_id: int
    consumer_id: int
    offset: int | None = None
    publish_time: int | None = None


@wire
class SeekReset(Message):
    """The consumer's subscription was moved to `offset` (a `Seek` or an admin
    `SeekSubscription`): drop every message of this consumer received before this frame
    and not yet processed, and grant their permits again; deliveries that follow start
    at `offset`."""

    TAG = 38
    consumer_id: int
    offset: int


@wire
class GetLastOffset(Message):
    """The offset of the last message the consumer's topic (partition) holds, as its
    subscription knows it, and the subscription's cursor: a reader's
    `has_message_available` (a message past the cursor). Reliable topics; answered by
    `LastOffset`."""

    TAG = 53
    request_id: int
    consumer_id: int


@wire
class LastOffset(Message):
    TAG = 54
    request_id: int
    offset: int  # -1: the topic holds none
    cursor: int  # every message up to it is acknowledged (-1: none)
    # The first offset the log still holds, as the subscription last read it (offsets
    # below were removed by retention); None from a broker before the field.
    log_start_offset: int | None = None


# One `TopicsOfNamespace` lists at most this many topics: 10,000 of the longest names
# (512 characters) take 5.2 MB, well inside the default 16 MiB frame. A broker whose
# `limits.frame_bytes_max` is smaller also ends a page before its names take half of it.
TOPICS_OF_NAMESPACE_PAGE_MAX = 10_000


@wire
class GetTopicsOfNamespace(Message):
    """The topics of `namespace` (Pulsar's CommandGetTopicsOfNamespace, which pattern
    subscriptions list and match): full names `/ns/topic`, a partitioned topic once by
    its base name, sorted, from the cluster's topic records (any broker answers the
    same). Answered by `TopicsOfNamespace`, a page of at most
    `TOPICS_OF_NAMESPACE_PAGE_MAX` names after `start_after` (None: from the first);
    `more` says to ask again from the page's last name. Needs Lookup on the namespace."""

    TAG = 55
    request_id: int
    namespace: str
    start_after: str | None = None


@wire
class TopicsOfNamespace(Message):
    TAG = 56
    request_id: int
    namespace: str
    topics: list[str]
    more: bool = False  # the namespace has topics after the last one listed


# ---------------------------------------------------------------- the schema registry
# Danube serves its SchemaRegistry on the client port; so do we. These requests need no
# session (no `Connect` first) and are answered by the gateway from the registry.


@wire
class RegisterSchema(Message):
    """Register `definition` under `subject`. Answered by `SchemaRegistered`;
    FAILED_PRECONDITION lists the reasons when it is incompatible."""

    TAG = 39
    request_id: int
    subject: str
    schema_type: str  # bytes, string, number, json_schema, avro, protobuf (aliases: json, proto, ...)
    definition: bytes
    description: str = ""


@wire
class SchemaRegistered(Message):
    TAG = 40
    request_id: int
    schema_id: int
    version: int
    is_new: bool
    fingerprint: str  # SHA-256 of the normalized definition, hex


@wire
class GetSchema(Message):
    """By `schema_id` (with `version`, else the latest live one) or by `subject` (with
    `version`, else the latest live one). Answered by `SchemaInfo`."""

    TAG = 41
    request_id: int
    schema_id: int | None = None
    subject: str | None = None
    version: int | None = None


@wire
class SchemaInfo(Message):
    TAG = 42
    request_id: int
    subject: str
    schema_id: int
    version: int
    schema_type: str
    definition: bytes  # normalized
    fingerprint: str
    compatibility: str
    deleted: bool
    created_ms: int
    description: str


@wire
class ListSchemaVersions(Message):
    TAG = 43
    request_id: int
    subject: str


@wire
class SchemaVersionInfo(Struct):
    version: int
    fingerprint: str
    deleted: bool
    created_ms: int
    description: str


@wire
class SchemaVersions(Message):
    TAG = 44
    request_id: int
    subject: str
    versions: list[SchemaVersionInfo]


@wire
class CheckSchema(Message):
    """Would `definition` be accepted under `subject`? `mode` overrides the subject's
    compatibility mode for this check. Answered by `SchemaCheck`."""

    TAG = 45
    request_id: int
    subject: str
    schema_type: str
    definition: bytes
    mode: str | None = None


@wire
class SchemaCheck(Message):
    TAG = 46
    request_id: int
    compatible: bool
    reasons: list[str]


@wire
class GetCompatibility(Message):
    TAG = 47
    request_id: int
    subject: str


@wire
class SetCompatibility(Message):
    """Set a subject's compatibility mode. Answered by `CompatibilityInfo`."""

    TAG = 48
    request_id: int
    subject: str
    mode: str


@wire
class CompatibilityInfo(Message):
    TAG = 49
    request_id: int
    subject: str
    mode: str


@wire
class DeleteSchemaVersion(Message):
    """Soft-delete a version (still readable by id and version). Answered by `Ok`."""

    TAG = 50
    request_id: int
    subject: str
    version: int


@wire
class ListSubjects(Message):
    TAG = 51
    request_id: int


@wire
class SubjectInfo(Struct):
    subject: str
    schema_id: int
    schema_type: str
    latest_version: int | None
    compatibility: str


@wire
class SubjectList(Message):
    TAG = 52
    request_id: int
    subjects: list[SubjectInfo]


SCHEMA_REQUESTS = (
    RegisterSchema, GetSchema, ListSchemaVersions, CheckSchema, GetCompatibility, SetCompatibility,
    DeleteSchemaVersion, ListSubjects,
)
"""Schema-registry requests: no session needed; answered by the gateway from the registry."""


CLIENT_PROTOCOL = Protocol(
    "client",
    PROTOCOL_VERSION,
    COMMON_MESSAGES
    + (
        Lookup, LookupResult, GetPartitions, Partitions,
        CreateProducer, ProducerCreated, CloseProducer, Send, SendReceipt,
        Subscribe, Subscribed, Flow, Deliver, Ack, Nack, Unsubscribe, CloseConsumer,
        HealthCheck, HealthStatus, ProducerClosed, ConsumerClosed, Seek, SeekReset, GetLastOffset, LastOffset,
        GetTopicsOfNamespace, TopicsOfNamespace,
        RegisterSchema, SchemaRegistered, GetSchema, SchemaInfo, ListSchemaVersions, SchemaVersions,
        CheckSchema, SchemaCheck, GetCompatibility, SetCompatibility, CompatibilityInfo, DeleteSchemaVersion,
        ListSubjects, SubjectList,
    ),
)

CLIENT_REQUESTS = (
    Connect, Ping, HealthCheck, Lookup, GetPartitions, CreateProducer, CloseProducer, Send,
    Subscribe, Flow, Ack, Nack, Unsubscribe, CloseConsumer, Seek, GetLastOffset, GetTopicsOfNamespace,
) + SCHEMA_REQUESTS
"""What a client may send: each has a `handle_<Type>` on the gateway, which reads it off
the socket, and on the actor that answers it."""

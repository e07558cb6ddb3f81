"""Messages between the actors inside one broker process (over `inproc://`).

Client frames cross actors unchanged inside `ClientRequest`: the gateway validates a
frame once, then the actor that owns the producer or consumer decodes it again. The
data path (`Publish` to subscriptions, `Deliver` frames to the gateway's outbox) moves
whole columnar batches. `Request`/`Reply` carry asks: a control-plane call whose
answer goes to the system's reply inbox, not through the asker's mailbox.
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
class ClientRequest(Message):
    """A validated client frame from connection `identity`, for the actor that owns it."""

    TAG = 16
    identity: bytes
    frame: bytes


@wire
class AdminRequest(Message):
    TAG = 17
    identity: bytes
    frame: bytes


@wire
class ProducerAttached(Message):
    """Topic -> gateway: route this producer's sends to `endpoint`, then send `reply`."""

    TAG = 18
    identity: bytes
    producer_id: int
    endpoint: str
    reply: bytes


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


@wire
class ReadRequest(Message):
    """Reliable subscription -> its topic: committed records from `start_offset`."""

    TAG = 37
    subscription: str
    start_offset: int
    max_bytes: int


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


@wire
class PersistCursor(Message):
    """Reliable subscription -> broker: its cursor and out-of-order acks, to persist."""

    TAG = 39
    topic: str
    subscription: str
    sub_type: int
    cursor: int
    acked_above: list[int]


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


INTERNAL_PROTOCOL = Protocol(
    "internal",
    PROTOCOL_VERSION,
    (
        Request, Reply, Tick, ClientRequest, AdminRequest,
        ProducerAttached, ProducerDetached, ConsumerAttached, ConsumerDetached,
        DetachProducer, DetachConsumer, Publish, AttachConsumer, ConsumerCount,
        SubscriptionEnded, DeleteSubscription, DescribeSubscription, SubscriptionStats,
        DescribePartition, PartitionStats, Done, ChildStopped,
        FlushDone, ReadRequest, ReadResult, PersistCursor, ForgetSubscription, DeadLetter, AppendInternal,
    ),
)

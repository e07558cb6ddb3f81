"""The interface between a topic's shell (`shell.TopicActor`) and its storage side, both
ways.

A storage side is a plain object, not an actor: the shell owns the mailbox and calls
`TopicStorage`'s methods from its handlers; the storage acts through the `TopicPort` the
shell binds it to (`port.ShellPort`), which lists all it may ask of its topic. Two exist,
chosen at spawn by `factory.make_topic`: `MemoryTail` (non-reliable) and `WalStorage`
(`wal/`, reliable), as Danube's dispatcher factory picks a non-reliable or reliable
dispatcher. Only a storage with a log has a `ReliableLog` (`TopicStorage.reliable_log`): the
messages of a WAL topic, which the shell passes to it.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import TYPE_CHECKING, Protocol

from danube_zmq.transport import client_protocol as cp
from danube_zmq.transport.admin_protocol import PartitionInfo
from danube_zmq.transport.errors import DanubeError
from danube_zmq.transport.internal_protocol import (
    AppendInternal,
    ApplyBacklogQuota,
    ApplyTopicPolicies,
    ClientRequest,
    CompactionFinished,
    FailurePolicyState,
    FlushDone,
    OffsetsReserved,
    PersistCursor,
    ReadRequest,
    ReleaseSnapshotCut,
    SegmentDurable,
    SegmentFetched,
    SubscriptionCursor,
    TakeSnapshotCut,
)

if TYPE_CHECKING:
    from danube_zmq.actors.subscription import Delivery
    from danube_zmq.clock import Clock
    from danube_zmq.runtime.mailbox import Frame
    from danube_zmq.transport.codec import Message


class Producer(Protocol):
    """A producer attached to the topic, as its storage sees it."""

    name: str
    # The batch `sequence` the topic accepts next (None: any); moved back to a refused
    # batch's number so that none pipelined behind it is stored first.
    next_sequence: int | None


def refused_first(producer: Producer, msg: cp.Send, error: DanubeError) -> DanubeError:
    """`error`, for a batch refused before the topic took it: the producer's later batches
    are refused until it comes again, so one pipelined behind it is not stored first."""
    if msg.sequence is not None:
        expected = producer.next_sequence
        producer.next_sequence = msg.sequence if expected is None else min(expected, msg.sequence)
    return error


class TopicPort(Protocol):
    """All a storage side may ask of its topic. Hot calls (`count_in`, `reply`,
    `attached_producer`, `schema_of`) are the callables themselves, bound once."""

    topic: str
    clock: Clock
    # The attached producers by id (read-only: a storage changes only `next_sequence`).
    producers: Mapping[int, Producer]
    # The subscriptions' names (a live view).
    subscription_names: Collection[str]
    # Those that keep a cursor (not a reader's): retention, the backlog quota, checkpoints.
    cursor_names: Collection[str]
    count_in: Callable[[int, int], None]  # (messages, bytes) accepted
    reply: Callable[[bytes, Message], bool]  # to a client connection (a producer), by its identity
    attached_producer: Callable[[int, bytes], Producer]  # by id and connection, else NotFound
    # The schema (id, version) a producer's batch is stored with, checked (InvalidArgument).
    schema_of: Callable[[Producer, cp.Send], tuple[int | None, int | None]]

    @property
    def policies(self) -> ApplyTopicPolicies:
        """The topic's policies in force."""

    @property
    def messages_in(self) -> int:
        """Messages the topic accepted since it started."""

    @property
    def restarting(self) -> bool:
        """The topic stops to be rebuilt (its clients come back)."""

    @property
    def moving(self) -> bool:
        """The topic stops to be served by another broker."""

    def count_dropped(self, messages: int) -> None:
        """Messages a subscription missed (its mailbox full) on a topic without a log."""

    def accepted_settings(self, name: str, policy: FailurePolicyState | None,
                          window: int | None) -> tuple[FailurePolicyState | None, int | None]:
        """The failure policy and dispatch window an admin set for subscription `name`
        since its actor was spawned, else `policy` and `window`."""

    def tell_subscriptions(self, frame: Frame) -> int:
        """Tell every subscription; returns how many missed it (a full mailbox)."""

    def tell_subscription(self, name: str, msg: Message) -> bool:
        """Tell subscription `name`; False when there is none or its mailbox is full."""

    async def ask_subscriptions(self, msg: Message) -> list[Message]:
        """Ask every subscription that keeps a cursor (not a reader's), one after the other."""

    async def spawn_subscription(self, name: str, sub_type: int, make_delivery: Callable[[], Delivery],
                                 durable: bool = True) -> None:
        """Spawn a subscription's actor with the delivery side `make_delivery` builds (at
        each restart of the subscription too)."""

    def tell_broker(self, msg: Message) -> bool:
        """Tell the broker (reservations, sealed segments, the topic stopped)."""

    def post_cursors(self, msg: Message) -> None:
        """To the broker's cursor flusher, never lost to a full mailbox."""

    async def ask_cursors(self, msg: Message) -> Message:
        """Ask the broker's cursor flusher."""

    def post(self, msg: Message) -> None:
        """To the topic itself (a completion from a worker thread), never lost."""

    def schedule_periodic(self, interval_ms: int, msg: Message) -> None:
        """A timer message to the topic every `interval_ms`."""

    def schedule_once(self, delay_ms: int, msg: Message) -> None:
        """A timer message to the topic once, after `delay_ms`."""


class ReliableLog(Protocol):
    """What only a storage with a log offers: the messages of a WAL topic (from its
    worker threads, the broker, its timers and its subscriptions), seeks made durable,
    snapshot cuts and backlog sizes."""

    # Subscriptions send their cursors to the topic (checkpoints in its log), not to
    # the broker's cursor flusher.
    cursors_in_wal: bool

    async def flush_done(self, msg: FlushDone) -> None: ...
    async def tick(self) -> None: ...
    async def sync_due(self) -> None: ...
    def offsets_reserved(self, msg: OffsetsReserved) -> None: ...
    def append_internal(self, msg: AppendInternal) -> None: ...
    def held_sends_due(self) -> None: ...
    def apply_backlog_quota(self, msg: ApplyBacklogQuota) -> None: ...
    def read(self, msg: ReadRequest) -> None: ...
    def persist_cursor(self, msg: PersistCursor) -> None: ...
    def subscription_cursor(self, msg: SubscriptionCursor) -> None: ...
    def segment_durable(self, msg: SegmentDurable) -> None: ...
    def segment_fetched(self, msg: SegmentFetched) -> None: ...
    def release_snapshot_cut(self, msg: ReleaseSnapshotCut) -> None: ...
    async def take_snapshot_cut(self, msg: TakeSnapshotCut) -> Message: ...
    def compact(self) -> None: ...
    async def compaction_finished(self, msg: CompactionFinished) -> None: ...

    async def seek_durable(self, record: PersistCursor) -> None:
        """A subscription sought: its checkpoint written and synced before the answer."""

    def settings_changed(self, record: PersistCursor) -> None:
        """An admin changed a subscription's policy or window (`record`: as accepted)."""

    def backlog_bytes_after(self, cursor: int, backlog_messages: int) -> int | None:
        """Bytes of the records after `cursor` (None: not known now)."""


class TopicStorage(Protocol):
    reliable: bool

    @property
    def reliable_log(self) -> ReliableLog | None:
        """The log side, None for a storage without one (its topic counts the log's
        messages as unrecognized and refuses snapshots)."""

    @property
    def next_offset(self) -> int:
        """The offset the next accepted message gets."""

    def bind(self, port: TopicPort) -> None:
        """Called once by the shell's `on_start`, before `start`."""

    async def start(self) -> None:
        """The shell's `on_start`: open what is stored, spawn the persisted subscriptions."""

    async def stop(self) -> None:
        """The shell's `on_stop`, after its producers were told: close, answer what is pending."""

    def send(self, req: ClientRequest, msg: cp.Send) -> None:
        """A producer's batch, its columns and sizes checked: store it (or refuse it with a
        `DanubeError`), acknowledge it and publish it to the subscriptions."""

    def seal(self) -> int:
        """The topic moves to another broker: returns the offset it stops at."""

    async def start_subscription(self, msg: cp.Subscribe) -> list[bytes]:
        """Spawn a new subscription (`TopicPort.spawn_subscription`) with its delivery side;
        returns the `Publish` frames it starts with."""

    async def resolve_seek(self, offset: int | None, publish_time: int | None) -> int:
        """Where a seek to `offset` or `publish_time` (one of them, checked) moves a subscription."""

    async def expired_end(self, cutoff_ms: int) -> int | None:
        """Message TTL: the offset below which every message was published before
        `cutoff_ms` (ms since the epoch), for every subscription to acknowledge; None:
        none to expire (or no log kept)."""

    def forget_subscription(self, name: str) -> None:
        """A subscription was deleted."""

    def last_sequence_id(self, producer_name: str) -> int | None:
        """Deduplication: the highest sequence id of `producer_name` stored (-1: none);
        None while the topic does not deduplicate (the policy is off, or no log kept)."""

    def describe(self, info: PartitionInfo) -> PartitionInfo:
        """The shell's description of the partition, with what the storage adds."""

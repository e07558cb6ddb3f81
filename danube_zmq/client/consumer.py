"""A consumer: one broker-side consumer per partition, one bounded receive queue, flow
control by permits, and batched acknowledgements.

Read path:
1. Each partition consumer is granted a window of permits (`receiver_queue_size` split
   over the partitions) with `Flow` right after `Subscribed`.
2. `Deliver` pushes land in the receive queue, which holds at most the sum of the
   windows: the broker never has more permits than the queue has room.
3. `receive` takes a message; once half a partition's window has been taken, its
   permits are given back with one `Flow` (in the background, so a cancelled `receive`
   never loses a message).
4. `ack` queues the offset; one `Ack` goes per ~10 ms or per 1000 offsets per
   partition. `close` sends what is left first.
5. After a reconnect (or a `ConsumerClosed`), each partition consumer subscribes again
   with the same name and grants `window - queued` permits. If that fails for good,
   `receive` raises the error once the queue is empty.
6. `seek` (reliable topics) sends queued acks, then `Seek` per partition. The broker
   first pushes `SeekReset` to every consumer of the subscription: its messages still
   in the queue are dropped and their permits granted again, so `receive` returns
   messages from the new position next. Messages already returned by `receive` are
   not recalled; acks for them are ignored unless their offset was delivered again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from itertools import repeat
from typing import TYPE_CHECKING

from danube_zmq.client.attachment import Attachment
from danube_zmq.client.chunks import CHUNK_UUID, ChunkAssembler
from danube_zmq.client.connection import Connection
from danube_zmq.client.errors import AlreadyClosed, copy_error
from danube_zmq.client.message import NO_ATTRIBUTES, Message, MessageId
from danube_zmq.client.retry import backoff_ms
from danube_zmq.transport.client_protocol import (
    Ack,
    CloseConsumer,
    Deliver,
    Flow,
    GetLastOffset,
    InitialPosition,
    LastOffset,
    Nack,
    Seek,
    Subscribe,
    Subscribed,
    SubType,
    Unsubscribe,
)
from danube_zmq.transport.codec import Message as TransportMessage
from danube_zmq.transport.compression import COMPRESSION, decompress
from danube_zmq.transport.errors import DanubeError, InternalError, InvalidArgument, Timeout

if TYPE_CHECKING:
    from danube_zmq.client.client import DanubeClient

log = logging.getLogger("danube_zmq.client")

_new = tuple.__new__

def split_window(receiver_queue_size: int, partitions: int) -> list[int]:
    """Share the receive queue among partitions, at least one permit each."""
    base, extra = divmod(receiver_queue_size, partitions)
    return [max(1, base + (1 if i < extra else 0)) for i in range(partitions)]


@dataclass(frozen=True, slots=True)
class ConsumerStatistics:
    topic: str
    subscription: str
    consumer_name: str
    partitions: int
    queued_messages: int
    receiver_queue_size: int
    messages_received: int
    messages_dropped: int
    pending_acks: int
    acks_sent: int
    acks_failed: int
    reattaches: int


class _Chunk:
    """The part of one `Deliver` still in the receive queue: messages `next` .. `end`-1."""

    __slots__ = ("deliver", "end", "next", "partition")

    def __init__(self, partition: _PartitionConsumer, deliver: Deliver, end: int) -> None:
        self.partition = partition
        self.deliver = deliver
        self.next = 0
        self.end = end

    def take(self, count: int) -> list[Message]:
        """The next `count` messages, built from the batch's columns."""
        d, start = self.deliver, self.next
        stop = start + count
        self.next = stop
        topic, producer_id, name, redelivery = self.partition.topic, d.producer_id, d.producer_name, d.redelivery_count
        schema_id, schema_version = d.schema_id, d.schema_version
        payloads, times = d.payloads[start:stop], d.publish_times[start:stop]
        offsets = d.offsets[start:stop] if d.offsets is not None else range(d.base_offset + start, d.base_offset + stop)
        keys = d.keys[start:stop] if d.keys is not None else repeat(None, count)
        attributes = (
            [a or NO_ATTRIBUTES for a in d.attributes[start:stop]] if d.attributes is not None
            else repeat(NO_ATTRIBUTES, count)
        )
        # Column lengths were checked on arrival; `repeat` stands in for absent columns.
        return [
            _new(Message, (payload, topic, offset, producer_id, time, name, key, attrs, redelivery, schema_id,
                           schema_version, None, None, None, None))
            for payload, offset, time, key, attrs in zip(payloads, offsets, times, keys, attributes, strict=False)
        ]


_EXPIRED = object()


def _expire(waiter: asyncio.Future[object]) -> None:
    if not waiter.done():
        waiter.set_result(_EXPIRED)


class _Inbox:
    """The bounded receive queue. It holds whole `Deliver` batches and hands their
    messages out one by one (or many at once), so a message costs one `Message` built
    when it is taken and nothing while it waits. `fail` makes takers raise once it is
    empty."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.size = 0  # messages in the queue
        self._chunks: deque[_Chunk] = deque()
        # Takers waiting for a message: a future each, woken by `put` or `fail` (an
        # `asyncio.Event` under `asyncio.timeout` cost a receive twice the objects).
        self._waiters: list[asyncio.Future[object]] = []
        self._error: DanubeError | None = None
        # The last `take` handed out a batch with attributes (maybe chunks to put together).
        self.took_attributes = False

    def __len__(self) -> int:
        return self.size

    def put(self, partition: _PartitionConsumer, deliver: Deliver, count: int) -> int:
        """Queue the first of `count` messages there is room for; returns how many."""
        if self._error is not None:
            return 0
        room = min(count, self.capacity - self.size)
        if room > 0:
            self._chunks.append(_Chunk(partition, deliver, room))
            self.size += room
            if self._waiters:
                self._wake()
        return max(room, 0)

    def _wake(self) -> None:
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def take_one(self) -> Message:
        """`take(1)` without the lists: the queue must not be empty."""
        chunk = self._chunks[0]
        d, i = chunk.deliver, chunk.next
        chunk.next = i + 1
        if chunk.next == chunk.end:
            self._chunks.popleft()
        msg = _new(Message, (
            d.payloads[i], chunk.partition.topic, d.offsets[i] if d.offsets is not None else d.base_offset + i,
            d.producer_id, d.publish_times[i], d.producer_name, d.keys[i] if d.keys is not None else None,
            (d.attributes[i] or NO_ATTRIBUTES) if d.attributes is not None else NO_ATTRIBUTES,
            d.redelivery_count, d.schema_id, d.schema_version, None, None, None, None,
        ))
        self.size -= 1
        chunk.partition.taken(1)
        return msg

    def take(self, most: int) -> list[Message]:
        """Up to `most` queued messages (at least one when the queue is not empty), in
        order; their partitions grant the permits back."""
        out: list[Message] = []
        chunks = self._chunks
        self.took_attributes = False
        while chunks and len(out) < most:
            chunk = chunks[0]
            if chunk.deliver.attributes is not None:
                self.took_attributes = True
            count = min(most - len(out), chunk.end - chunk.next)
            out.extend(chunk.take(count))
            if chunk.next == chunk.end:
                chunks.popleft()
            chunk.partition.taken(count)
        self.size -= len(out)
        return out

    async def wait(self, timeout: float | None, what: str) -> None:
        """Until a message is queued; raises the failure once the queue is empty, or
        `Timeout` after `timeout` seconds."""
        if self.size:
            return
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while not self.size:
            if self._error is not None:
                raise copy_error(self._error)
            waiter = loop.create_future()
            self._waiters.append(waiter)
            timer = None if deadline is None else loop.call_at(deadline, _expire, waiter)
            try:
                await waiter
            finally:
                if timer is not None:
                    timer.cancel()
                if waiter.cancelled() or waiter.result() is _EXPIRED:
                    with contextlib.suppress(ValueError):  # not woken: no longer a taker
                        self._waiters.remove(waiter)
            if waiter.result() is _EXPIRED and not self.size:
                raise Timeout(f"no message on {what} within {timeout} s")

    def discard(self, partition: _PartitionConsumer) -> int:
        """Drop the queued messages of `partition`, keeping the order of the rest;
        returns how many were dropped."""
        dropped = sum(c.end - c.next for c in self._chunks if c.partition is partition)
        if dropped:
            self._chunks = deque(c for c in self._chunks if c.partition is not partition)
            self.size -= dropped
        return dropped

    def fail(self, error: DanubeError, *, discard: bool = False) -> None:
        """From now on takers raise `error` once the queue is empty; with `discard` the
        queue is emptied first."""
        if discard:
            self._chunks.clear()
            self.size = 0
        if self._error is None:
            self._error = error
        self._wake()  # they raise once the queue is empty


class Consumer:
    """Receives from one subscription of one topic (all its partitions). Create with
    `DanubeClient.subscribe`; iterate with `async for`."""

    def __init__(
        self,
        client: DanubeClient,
        *,
        topic: str,
        subscription: str,
        consumer_name: str,
        sub_type: SubType,
        initial_position: InitialPosition,
        key_filters: list[str] | None,
        start_offset: int | None = None,
        partition_topics: list[str],
        receiver_queue_size: int,
        ack_batch_max: int,
        ack_delay_ms: int,
        pending_acks_max: int,
        reader_schema: bytes | None = None,
        durable: bool = True,
        max_pending_chunked_messages: int = 10,
        pending_chunked_bytes_max: int = 256 * 1024 * 1024,
        expire_incomplete_chunked_message_ms: int = 60_000,
        read_compacted: bool = False,
        decompressed_bytes_max: int = 256 * 1024 * 1024,
    ) -> None:
        assert partition_topics
        self._client = client
        self.topic = topic
        self.subscription = subscription
        self.consumer_name = consumer_name
        self.sub_type = sub_type
        self.initial_position = initial_position
        self.start_offset = start_offset
        self.key_filters = key_filters
        self.receiver_queue_size = receiver_queue_size
        self.ack_batch_max = ack_batch_max
        self.ack_delay_ms = ack_delay_ms
        self.pending_acks_max = pending_acks_max
        self.reader_schema = reader_schema
        self.durable = durable  # False: a reader's subscription (`Reader`)
        self.read_compacted = read_compacted
        self.decompressed_bytes_max = decompressed_bytes_max
        windows = split_window(receiver_queue_size, len(partition_topics))
        self._partitions = [_PartitionConsumer(self, t, w) for t, w in zip(partition_topics, windows, strict=True)]
        self._by_topic = {p.topic: p for p in self._partitions}
        self._inbox = _Inbox(sum(windows))
        self._what = f"{topic} ({subscription})"  # names the consumer in a Timeout
        self._close_started = False
        self._closing = False
        self._messages_received = 0
        self._messages_dropped = 0
        self._chunks = ChunkAssembler(max_pending=max_pending_chunked_messages, bytes_max=pending_chunked_bytes_max,
                                      expire_ms=expire_incomplete_chunked_message_ms,
                                      now_ms=client._clock.monotonic_ms)

    @property
    def partitions(self) -> list[str]:
        return [p.topic for p in self._partitions]

    @property
    def reliable(self) -> bool | None:
        """Whether the topic is reliable (its messages are stored and need acks), as the
        broker said when the consumer attached; None before that, or from a broker that
        does not say."""
        said = {p.reliable for p in self._partitions}
        return said.pop() if len(said) == 1 else None

    @property
    def queued(self) -> int:
        """Messages in the receive queue now: `receive` waits for none while this is > 0."""
        return self._inbox.size

    def statistics(self) -> ConsumerStatistics:
        return ConsumerStatistics(
            topic=self.topic,
            subscription=self.subscription,
            consumer_name=self.consumer_name,
            partitions=len(self._partitions),
            queued_messages=len(self._inbox),
            receiver_queue_size=self.receiver_queue_size,
            messages_received=self._messages_received,
            messages_dropped=self._messages_dropped,
            pending_acks=sum(len(p._acks) for p in self._partitions),
            acks_sent=sum(p.acks_sent for p in self._partitions),
            acks_failed=sum(p.acks_failed for p in self._partitions),
            reattaches=sum(p.reattaches for p in self._partitions),
        )

    async def _start(self) -> None:
        results = await asyncio.gather(*(p.start() for p in self._partitions), return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            self._close_started = self._closing = True
            await asyncio.gather(*(p.close(CloseConsumer) for p in self._partitions), return_exceptions=True)
            raise errors[0]

    # ---------------------------------------------------------------- receiving

    async def receive(self, timeout: float | None = None) -> Message:
        """The next message; waits at most `timeout` seconds (forever if None) and then
        raises `Timeout`. Raises `AlreadyClosed` after `close`, or the error that made
        re-subscribing impossible."""
        inbox = self._inbox
        if len(self._chunks):
            await self._ack_dropped(self._chunks.expire())
        if not inbox.size:
            await inbox.wait(timeout, self._what)
        msg = inbox.take_one()
        if msg.attributes:
            if CHUNK_UUID in msg.attributes:
                return await self._receive_chunked(msg, timeout)
            if COMPRESSION in msg.attributes:
                msg = self._decompressed(msg)
        if msg.schema_id is not None:
            return await self._with_schema(msg)
        return msg

    async def _receive_chunked(self, msg: Message, timeout: float | None) -> Message:
        """Chunks go to the assembler until a message is whole (or one that is no chunk
        comes), within what is left of `timeout`."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        inbox = self._inbox
        while msg.attributes and CHUNK_UUID in msg.attributes:
            whole, dropped = self._chunks.add(msg)
            await self._ack_dropped(dropped)
            if whole is not None:
                msg = whole
                break
            if not inbox.size:
                await inbox.wait(None if deadline is None else max(0.0, deadline - loop.time()), self._what)
            msg = inbox.take_one()
        if msg.attributes and COMPRESSION in msg.attributes:
            msg = self._decompressed(msg)
        if msg.schema_id is not None:
            return await self._with_schema(msg)
        return msg

    def _decompressed(self, msg: Message) -> Message:
        """`msg` with its payload decompressed and `__compression` gone; as it came (and
        an error logged) when its payload is not what the attribute says, or would grow
        past `decompressed_bytes_max`: nothing is lost, the application sees why."""
        attributes = dict(msg.attributes)
        codec = attributes.pop(COMPRESSION)
        try:
            payload = decompress(codec, msg.payload, self.decompressed_bytes_max)
        except InvalidArgument as exc:
            log.error("consumer %s: message %s not decompressed, delivered as it came: %s", self.consumer_name,
                      msg.message_id, exc.message)
            return msg
        return msg._replace(payload=payload, attributes=attributes or NO_ATTRIBUTES)

    async def _ack_dropped(self, chunks: list[Message]) -> None:
        """The chunks of messages that can never be whole (expired, past a bound)."""
        if chunks:
            await self.ack(chunks)

    async def batch_receive(self, max_messages: int | None = None, timeout: float | None = None) -> list[Message]:
        """The messages queued now, at most `max_messages` (all of them if None), once
        there is at least one: waits like `receive`. One call hands out a whole batch the
        broker delivered, which is how a consumer keeps up with hundreds of thousands of
        messages per second."""
        if max_messages is not None and (type(max_messages) is not int or max_messages < 1):
            raise InvalidArgument(f"max_messages must be a positive int, got {max_messages!r}")
        inbox = self._inbox
        if not inbox.size:
            await inbox.wait(timeout, self._what)
        if len(self._chunks):
            await self._ack_dropped(self._chunks.expire())
        messages = inbox.take(max_messages or inbox.size)
        if inbox.took_attributes:
            messages = await self._assembled(messages)
            loop = asyncio.get_running_loop()
            deadline = None if timeout is None else loop.time() + timeout
            while not messages:  # chunks only, none whole yet: more within the timeout
                await inbox.wait(None if deadline is None else max(0.0, deadline - loop.time()), self._what)
                messages = await self._assembled(inbox.take(max_messages or inbox.size))
        if any(msg.schema_id is not None for msg in messages):
            messages = [await self._with_schema(msg) if msg.schema_id is not None else msg for msg in messages]
        return messages

    async def _assembled(self, messages: list[Message]) -> list[Message]:
        """Chunks put together and payloads decompressed."""
        out = []
        for msg in messages:
            if msg.attributes and CHUNK_UUID in msg.attributes:
                whole, dropped = self._chunks.add(msg)
                await self._ack_dropped(dropped)
                if whole is None:
                    continue
                msg = whole
            if msg.attributes and COMPRESSION in msg.attributes:
                msg = self._decompressed(msg)
            out.append(msg)
        return out

    async def _with_schema(self, msg: Message) -> Message:
        """`msg` with its writer's schema attached for `value()`. A schema that cannot be
        fetched does not cost the message: `value()` then raises, `payload` stays."""
        assert msg.schema_id is not None
        if msg.schema_version is None:
            return msg._replace(schema_error="the message names no schema version")
        schemas = self._client.schemas
        schema = schemas.cached(msg.schema_id, msg.schema_version)
        if schema is None:
            try:
                schema = await schemas.get(msg.schema_id, msg.schema_version)
            except DanubeError as exc:
                log.warning("consumer %s: schema id %d version %d not fetched: %s", self.consumer_name,
                            msg.schema_id, msg.schema_version, exc)
                return msg._replace(schema_error=str(exc))
        return msg._replace(schema=schema, reader_schema=self.reader_schema)

    def __aiter__(self) -> Consumer:
        return self

    async def __anext__(self) -> Message:
        try:
            return await self.receive()
        except AlreadyClosed:
            if self._closing:
                raise StopAsyncIteration from None
            raise

    def _delivered(self, partition: _PartitionConsumer, deliver: Deliver, count: int) -> int:
        accepted = self._inbox.put(partition, deliver, count)
        self._messages_received += accepted
        # Only when the broker sent more than the permits allowed (or the consumer is
        # closing): a reliable topic redelivers them, a non-reliable one may drop anyway.
        self._messages_dropped += count - accepted
        return accepted

    # ---------------------------------------------------------------- acknowledging

    def _partition_of(self, message: Message | MessageId) -> tuple[_PartitionConsumer, int]:
        if self._closing:
            raise AlreadyClosed(f"consumer {self.consumer_name} is closed")
        if not isinstance(message, Message | MessageId):
            raise InvalidArgument(f"expected a Message or MessageId, not {type(message).__name__}")
        partition = self._by_topic.get(message.topic)
        if partition is None:
            raise InvalidArgument(f"message {message.topic}@{message.offset} is not from topic {self.topic}")
        return partition, message.offset

    async def ack(self, message: Message | MessageId | Iterable[Message | MessageId]) -> None:
        """Acknowledge a message, or every message of a list (as `batch_receive` returns).
        Returns once the acks are queued (sent within ~10 ms, or at once when
        `ack_batch_max` are queued); waits while `pending_acks_max` are. On a
        non-reliable topic (the broker said so at attach) nothing is kept to acknowledge,
        so nothing is sent: the call only checks its argument."""
        if isinstance(message, Message | MessageId):
            partition, offset = self._partition_of(message)
            if partition.reliable is not False:
                await partition.queue_acks(_offsets_of(message, offset))
            return
        if isinstance(message, str | bytes) or not isinstance(message, Iterable):
            raise InvalidArgument(f"expected a Message, a MessageId or a list of them, not {type(message).__name__}")
        by_partition: dict[_PartitionConsumer, list[int]] = {}
        for item in message:
            partition, offset = self._partition_of(item)
            if type(item) is Message and item.chunk_offsets is not None:
                by_partition.setdefault(partition, []).extend(item.chunk_offsets)
            else:
                by_partition.setdefault(partition, []).append(offset)
        for partition, offsets in by_partition.items():
            if partition.reliable is not False:
                await partition.queue_acks(offsets)

    async def nack(self, message: Message | MessageId, delay_ms: int | None = None) -> None:
        """Ask for redelivery of a message, after `delay_ms` (the broker's policy if None)."""
        if delay_ms is not None and (type(delay_ms) is not int or delay_ms < 0):
            raise InvalidArgument(f"delay_ms must be a non-negative int, got {delay_ms!r}")
        partition, offset = self._partition_of(message)
        await partition.nack(_offsets_of(message, offset), delay_ms)

    async def flush_acks(self) -> None:
        """Send every queued ack now."""
        await asyncio.gather(*(p.flush_acks() for p in self._partitions))

    async def seek(self, offset: int | None = None, publish_time: int | None = None) -> None:
        """Move the subscription (reliable topics) to `offset`, or to the first message
        published at or after `publish_time` (ms since the epoch); exactly one of them.

        The subscription moves for all its consumers, which stay attached: once this
        returns, `receive` gives messages from the new position (what was queued here
        is dropped). Everything before the position counts as consumed. An offset is
        per partition, so a partitioned topic seeks by `publish_time` (every
        partition), or subscribe to one partition topic to seek it by offset.
        Raises INVALID_ARGUMENT for an offset outside the topic's log (the message
        names the range) and FAILED_PRECONDITION on a non-reliable topic.
        """
        if (offset is None) == (publish_time is None):
            raise InvalidArgument("seek takes exactly one of offset and publish_time")
        for name, value in (("offset", offset), ("publish_time", publish_time)):
            if value is not None and (type(value) is not int or value < 0):
                raise InvalidArgument(f"{name} must be a non-negative int, got {value!r}")
        if offset is not None and len(self._partitions) > 1:
            raise InvalidArgument(
                f"{self.topic} has {len(self._partitions)} partitions and offsets are per partition:"
                " seek by publish_time, or subscribe to one partition topic"
            )
        if self._closing:
            raise AlreadyClosed(f"consumer {self.consumer_name} is closed")
        # Acks queued for messages before the seek go first, so they cannot settle a
        # delivery of the same offset after it.
        await self.flush_acks()
        await asyncio.gather(*(p.seek(offset, publish_time) for p in self._partitions))

    def _drop_queued(self, partition: _PartitionConsumer) -> int:
        """Drop the messages of `partition` still in the receive queue (a seek moved its
        subscription); returns how many."""
        self._chunks.forget(partition.topic)
        return self._inbox.discard(partition)

    # ---------------------------------------------------------------- lifecycle

    async def close(self) -> None:
        """Send queued acks, detach from the broker; `receive` then raises `AlreadyClosed`.
        The subscription stays (use `unsubscribe` to delete it)."""
        await self._close(CloseConsumer)

    async def unsubscribe(self) -> None:
        """Send queued acks, then delete the subscription on the broker and close."""
        await self._close(Unsubscribe)

    async def _close(self, request: type[CloseConsumer] | type[Unsubscribe]) -> None:
        if self._close_started:
            return
        self._close_started = True
        try:
            # Bounded: with the broker gone, closing must not wait out every retry.
            async with asyncio.timeout(self._client.request_timeout_ms / 1000):
                await asyncio.gather(*(p.flush_acks() for p in self._partitions), return_exceptions=True)
        except TimeoutError:
            log.warning("consumer %s: acks not sent before close", self.consumer_name)
        self._closing = True
        self._inbox.fail(AlreadyClosed(f"consumer {self.consumer_name} is closed"), discard=True)
        results = await asyncio.gather(*(p.close(request) for p in self._partitions), return_exceptions=True)
        self._client._forget(self)
        if request is Unsubscribe:
            errors = [r for r in results if isinstance(r, BaseException)]
            if errors:
                raise errors[0]

    async def __aenter__(self) -> Consumer:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    def _fail(self, error: DanubeError) -> None:
        self._inbox.fail(error)

    def __repr__(self) -> str:
        return f"<Consumer {self.consumer_name!r} on {self.topic!r} subscription={self.subscription!r}>"


class _PartitionConsumer(Attachment):
    """The broker-side consumer on one partition topic: permits and acks."""

    kind = "consumer"

    def __init__(self, consumer: Consumer, topic: str, window: int) -> None:
        super().__init__(consumer._client, topic, consumer.consumer_name)
        self._consumer = consumer
        self.window = window
        self.flow_threshold = max(1, window // 2)
        self.consumer_id: int | None = None
        self.reliable: bool | None = None  # as the broker said at the last attach
        # A reader's: where it attaches again (after the last message it read), since its
        # subscription is gone with the attachment that held it. None: the consumer's start.
        self.resume_offset: int | None = None
        # Permit accounting. Invariant (per attach): permits the broker holds + `queued`
        # <= window, because we only grant back what the application has taken.
        self.queued = 0
        self.unflowed = 0
        self.permits_granted = 0  # total since start, for statistics and tests
        self._flow_task: asyncio.Task[None] | None = None
        self._acks: list[int] = []
        self._ack_ready = asyncio.Event()  # acks are queued
        self._ack_full = asyncio.Event()  # a batch is full (or a flush asked): no delay
        self._ack_room = asyncio.Event()  # fewer than pending_acks_max queued
        self._ack_room.set()
        self._ack_lock = asyncio.Lock()
        self._ack_task: asyncio.Task[None] | None = None
        self.acks_sent = 0
        self.acks_failed = 0

    async def start(self) -> None:
        await super().start()
        self._ack_task = asyncio.get_running_loop().create_task(self._ack_loop(), name=f"danube-acks-{self.name}")

    # ---------------------------------------------------------------- attach

    async def _attach_on(self, connection: Connection) -> None:
        consumer = self._consumer
        reply = await connection.request(
            Subscribe(
                request_id=0,
                topic=self.topic,
                subscription=consumer.subscription,
                consumer_name=consumer.consumer_name,
                sub_type=int(consumer.sub_type),
                initial_position=int(consumer.initial_position),
                key_filters=consumer.key_filters,
                start_offset=consumer.start_offset if self.resume_offset is None else self.resume_offset,
                durable=consumer.durable,
                read_compacted=consumer.read_compacted,
            )
        )
        if not isinstance(reply, Subscribed):
            raise InternalError(f"broker answered Subscribe with {type(reply).__name__}")
        self.consumer_id = reply.consumer_id
        self.reliable = reply.reliable
        connection.register_consumer(reply.consumer_id, self)
        # A new broker-side consumer holds no permits: grant the room the queue has.
        self.unflowed = 0
        permits = self.window - self.queued
        if permits > 0:
            await connection.send_oneway(Flow(consumer_id=reply.consumer_id, permits=permits))
            self.permits_granted += permits

    def _forget_id(self) -> None:
        if self.consumer_id is not None:
            self.connection.unregister_consumer(self.consumer_id, self)
            self.consumer_id = None

    def _on_failed(self, error: DanubeError) -> None:
        self._consumer._fail(error)

    # ConsumerHandler
    def on_deliver(self, msg: Deliver) -> None:
        count = len(msg.payloads)
        if (
            len(msg.publish_times) != count
            or (msg.keys is not None and len(msg.keys) != count)
            or (msg.attributes is not None and len(msg.attributes) != count)
            or (msg.offsets is not None and len(msg.offsets) != count)
        ):
            log.warning("dropped a malformed Deliver on %s: column lengths differ", self.topic)
            self._consumer._messages_dropped += count
            return
        self.queued += self._consumer._delivered(self, msg, count)

    def on_consumer_closed(self, reason: str, reattach: bool) -> None:
        if not self._closing:
            self._broker_closed(reason, reattach)

    def on_seek_reset(self, offset: int) -> None:
        """The subscription was moved to `offset`: what we hold from before is stale."""
        dropped = self._consumer._drop_queued(self)
        if not self._consumer.durable:
            self.resume_offset = offset
        log.info("%s on %s: subscription moved to offset %d; %d queued messages dropped",
                 self.name, self.topic, offset, dropped)
        if dropped:
            # Given back as if taken: the broker spent permits on them.
            self.queued -= dropped
            self.left_queue(dropped)

    async def seek(self, offset: int | None, publish_time: int | None) -> None:
        await self._request_with_retries(
            lambda cid: Seek(request_id=0, consumer_id=cid, offset=offset, publish_time=publish_time)
        )

    # ---------------------------------------------------------------- permits

    def taken(self, count: int) -> None:
        """The application took `count` of our messages from the queue."""
        self.queued -= count
        self.left_queue(count)

    def left_queue(self, count: int) -> None:
        """`count` messages left the queue: their permits are granted back."""
        self.unflowed += count
        assert self.queued >= 0
        if self.unflowed >= self.flow_threshold and (self._flow_task is None or self._flow_task.done()):
            self._flow_task = asyncio.get_running_loop().create_task(self._flow(), name=f"danube-flow-{self.name}")

    async def _flow(self) -> None:
        while self.unflowed >= self.flow_threshold and not self._closing:
            if not self.attached or self.consumer_id is None:
                return  # re-attaching grants `window - queued` afresh
            permits, epoch = self.unflowed, self.epoch
            self.unflowed = 0
            try:
                await self.connection.send_oneway(Flow(consumer_id=self.consumer_id, permits=permits))
                self.permits_granted += permits
            except DanubeError as exc:
                if self.epoch == epoch:
                    self.unflowed += permits  # same broker-side consumer: try again later
                log.info("granting %d permits on %s failed: %s", permits, self.topic, exc)
                return

    # ---------------------------------------------------------------- acks

    async def queue_acks(self, offsets: list[int]) -> None:
        """Queue acks for sending, in slices that fit under `pending_acks_max` (waits
        for room)."""
        pending_max = self._consumer.pending_acks_max
        done = 0
        while done < len(offsets):
            while len(self._acks) >= pending_max:
                self._ack_room.clear()
                await self._ack_room.wait()
                if self._consumer._closing:
                    raise AlreadyClosed(f"consumer {self.name} is closed")
            room = pending_max - len(self._acks)
            self._acks.extend(offsets[done:done + room])
            done += room
            self._ack_ready.set()
            if len(self._acks) >= self._consumer.ack_batch_max:
                self._ack_full.set()

    async def _ack_loop(self) -> None:
        delay_s = self._consumer.ack_delay_ms / 1000
        while True:
            await self._ack_ready.wait()
            if len(self._acks) < self._consumer.ack_batch_max:
                try:
                    async with asyncio.timeout(delay_s):
                        await self._ack_full.wait()
                except TimeoutError:
                    pass
            await self._send_ack_batch()

    async def _send_ack_batch(self) -> None:
        async with self._ack_lock:
            batch_max = self._consumer.ack_batch_max
            offsets = self._acks[:batch_max]
            del self._acks[:batch_max]
            if not self._acks:
                self._ack_ready.clear()
            if len(self._acks) < batch_max:
                self._ack_full.clear()
            self._ack_room.set()
            if offsets:
                await self._send_acks(offsets)

    async def flush_acks(self) -> None:
        while self._acks:
            await self._send_ack_batch()
        async with self._ack_lock:  # and the batch the loop may be sending
            pass

    async def _send_acks(self, offsets: list[int]) -> None:
        try:
            await self._request_with_retries(lambda cid: Ack(request_id=0, consumer_id=cid, offsets=offsets))
            self.acks_sent += len(offsets)
        except DanubeError as exc:
            # `ack` already returned; a reliable topic redelivers what was not acked.
            self.acks_failed += len(offsets)
            log.warning("acknowledging %d messages on %s failed: %s", len(offsets), self.topic, exc)

    async def nack(self, offsets: list[int], delay_ms: int | None) -> None:
        await self._request_with_retries(
            lambda cid: Nack(request_id=0, consumer_id=cid, offsets=offsets, delay_ms=delay_ms)
        )

    async def last_offset(self) -> LastOffset:
        reply = await self._request_with_retries(lambda cid: GetLastOffset(request_id=0, consumer_id=cid))
        if not isinstance(reply, LastOffset):
            raise InternalError(f"broker answered GetLastOffset with {type(reply).__name__}")
        return reply

    async def _request_with_retries(self, build: Callable[[int], TransportMessage]) -> TransportMessage:
        attempt = 0
        while True:
            try:
                connection = await self.wait_attached()
                assert self.consumer_id is not None
                return await connection.request(build(self.consumer_id))
            except DanubeError as exc:
                if not exc.retriable or attempt >= self._client.operation_retries_max:
                    raise
            await asyncio.sleep(backoff_ms(attempt, self._client._rng) / 1000)
            attempt += 1

    # ---------------------------------------------------------------- close

    async def close(self, request: type[CloseConsumer] | type[Unsubscribe]) -> None:
        self._ack_room.set()  # wake acks waiting for room; they see the consumer closing
        tasks = [t for t in (self._ack_task, self._flow_task) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        connection = await self._stop_attachment()
        consumer_id = self.consumer_id
        if self.connection is not None:
            self._detach()
        if connection is None or consumer_id is None:
            if request is Unsubscribe:
                raise copy_error(self.failed) if self.failed else AlreadyClosed(
                    f"consumer {self.name} on {self.topic} is not attached; cannot unsubscribe"
                )
            return
        try:
            await connection.request(request(request_id=0, consumer_id=consumer_id))
        except DanubeError as exc:
            if request is Unsubscribe:
                raise
            # Detached on our side either way; the broker drops it with the session.
            log.info("closing consumer %s on %s: %s", self.name, self.topic, exc)


def _offsets_of(message: Message | MessageId, offset: int) -> list[int]:
    """A chunked message's every chunk; else its own offset."""
    if type(message) is Message and message.chunk_offsets is not None:
        return list(message.chunk_offsets)
    return [offset]

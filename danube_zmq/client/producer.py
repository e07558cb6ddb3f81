"""A producer: routes each message to a partition, batches per partition, and resolves
each message's `PendingSend` with its `MessageId` when the broker's receipt arrives.

Write path:
1. `send` / `send_nowait` checks the payload, picks a partition (`routing.py`) and takes
   one unit of the producer's `pending_messages_max` budget (waits, or raises
   `ProducerQueueFull`).
2. The partition's accumulator cuts a batch on the loop's next turn when nothing is in
   flight, else at `batch_messages_max`, `batch_bytes_max` (capped by the broker's
   `frame_bytes_max`), when the pipe drains, or after `batch_delay_ms` (if every
   in-flight slot is taken then, it keeps filling until a slot frees).
3. A cut batch takes a slot of the window (`inflight_batches_max` `Send` requests in
   flight; later batches wait in order) and goes on the socket from the call that cut
   it (`Connection.request_nowait`): no task and no loop turn between a receipt and
   the batch it lets go. Each batch has a sequence number (`Send.sequence`); a batch
   is (re)sent only after every earlier unacknowledged one, so a retried batch never
   lands behind a later one (a reliable topic refuses the later ones until the refused
   one comes again). A batch that must wait for an earlier one, or whose send failed,
   goes on in a task.
4. A `SendReceipt` resolves the batch (one future per batch: a message costs its
   payload, its publish time and a `PendingSend` handle, appended to the batch's
   columns); a failed batch fails all of its messages.
   Retriable failures are retried up to `operation_retries_max` times, after the
   partition's broker-side producer is re-created if the connection was lost.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import time
from collections import deque
from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass
from operator import itemgetter
from typing import TYPE_CHECKING, Any

from danube_zmq.client.attachment import Attachment
from danube_zmq.client.budget import Budget
from danube_zmq.client.chunks import CHUNK_ATTRIBUTE_BYTES, chunk_attributes, split
from danube_zmq.client.connection import Connection
from danube_zmq.client.errors import AlreadyClosed, ConnectionLost, ProducerQueueFull, copy_error
from danube_zmq.client.message import BatchReceipt, MessageId
from danube_zmq.client.retry import backoff_ms
from danube_zmq.client.routing import RoundRobin, partition_for_key
from danube_zmq.client.schema_cache import CachedSchema
from danube_zmq.transport.client_protocol import (
    DELIVER_AT,
    PUBLISH_TIME_MS_MAX,
    CloseProducer,
    CreateProducer,
    DispatchStrategy,
    ProducerCreated,
    Send,
    SendReceipt,
)
from danube_zmq.transport.codec import Message
from danube_zmq.transport.compression import COMPRESSION, compress
from danube_zmq.transport.errors import DanubeError, InternalError, InvalidArgument, NotFound, Timeout, Unavailable

if TYPE_CHECKING:
    from danube_zmq.client.client import DanubeClient

log = logging.getLogger("danube_zmq.client")

SendCallback = Callable[[DanubeError | None, MessageId | None], Any]
"""`callback(error, message_id)`: exactly one of them is None. Runs on the event loop."""

BatchCallback = Callable[[BatchReceipt], Any]
"""`on_batch(receipt)`: once per batch, in send order per partition. Runs on the event loop."""

_new = tuple.__new__

SEND_OVERHEAD_BYTES = 64
"""Upper bound of a `Send` frame's bytes besides its messages (tag, ids, list headers)."""

def entry_bytes(payload: bytes, key: str | None, attributes: Mapping[str, str] | None) -> int:
    """Upper bound of one message's bytes in a msgpack `Send` frame (5-byte headers, 9-byte ints)."""
    size = 5 + len(payload) + 9 + 5
    if key is None and not attributes:
        return size
    if key is not None:
        size += len(key.encode("utf-8"))
    if attributes:
        size += sum(10 + len(k.encode("utf-8")) + len(v.encode("utf-8")) for k, v in attributes.items())
    return size


def as_payload(payload: Any) -> bytes:
    if type(payload) is bytes:
        return payload
    if isinstance(payload, str):
        return payload.encode("utf-8")
    if isinstance(payload, bytes | bytearray | memoryview):
        return bytes(payload)
    raise InvalidArgument(f"payload must be bytes or str, not {type(payload).__name__}")


def check_attributes(attributes: Any) -> dict[str, str] | None:
    if attributes is None:
        return None
    if not isinstance(attributes, Mapping):
        raise InvalidArgument(f"attributes must be a mapping of str to str, not {type(attributes).__name__}")
    out = dict(attributes)
    for k, v in out.items():
        if type(k) is not str or type(v) is not str:
            raise InvalidArgument(f"attributes must map str to str, got {k!r}: {v!r}")
    if COMPRESSION in out:
        raise InvalidArgument(f"attribute {COMPRESSION} is the producer's: create it with compression=")
    return out or None


def _with_delivery_time(attributes: Any, deliver_after_ms: Any, deliver_at_ms: Any) -> Any:
    """`attributes` with `DELIVER_AT` for a delayed message (`send`)."""
    if deliver_after_ms is not None and deliver_at_ms is not None:
        raise InvalidArgument("give deliver_after_ms or deliver_at_ms, not both")
    value = deliver_after_ms if deliver_at_ms is None else deliver_at_ms
    name = "deliver_after_ms" if deliver_at_ms is None else "deliver_at_ms"
    if type(value) is not int or not 0 <= value <= PUBLISH_TIME_MS_MAX:
        raise InvalidArgument(f"{name} must be an integer 0..{PUBLISH_TIME_MS_MAX}, not {value!r}")
    at = value if deliver_at_ms is not None else time.time_ns() // 1_000_000 + value
    if attributes is not None and not isinstance(attributes, Mapping):
        return attributes  # refused by `check_attributes`
    return {**(attributes or {}), DELIVER_AT: str(at)}


@dataclass(frozen=True, slots=True)
class ProducerStatistics:
    topic: str
    name: str
    partitions: int
    pending_messages: int
    pending_messages_max: int
    messages_sent: int
    messages_failed: int
    batches_sent: int
    send_retries: int
    reattaches: int


def _check_publish_time(publish_time: int | None) -> int | None:
    """A given publish time, checked; None when none is given (0 too: stamp now)."""
    if publish_time is None:
        return None
    if type(publish_time) is not int or not 0 <= publish_time <= PUBLISH_TIME_MS_MAX:
        raise InvalidArgument(f"publish_time must be an int of ms since the epoch, 0..{PUBLISH_TIME_MS_MAX}"
                              f" (the end of year 9999), not {publish_time!r}")
    return publish_time or None


class _Batch:
    """One partition's batch: its columns while it fills, then the broker's receipt.
    `keys` and `attributes` stay None until a message has one."""

    __slots__ = ("_waiter", "attributes", "bytes", "callbacks", "error", "finished", "first_id", "keys", "offsets",
                 "on_batch", "payloads", "producer_id", "publish_times", "sequence", "sequence_ids", "topic")

    def __init__(self, topic: str, on_batch: BatchCallback | None, first_id: int = 0) -> None:
        self.topic = topic
        # The messages' sequence ids (deduplication): first_id, first_id + 1, ... unless
        # a message named its own (`send(sequence_id=)`), then one per message here.
        self.first_id = first_id
        self.sequence_ids: list[int] | None = None
        self.on_batch = on_batch
        self.payloads: list[bytes] = []
        self.publish_times: list[int] = []
        self.keys: list[str | None] | None = None
        self.attributes: list[dict[str, str] | None] | None = None
        self.callbacks: list[tuple[int, SendCallback]] | None = None
        self.bytes = 0
        self.finished = False  # offsets or error is set
        # Made only for someone who waits (an awaited send, `flush`): most batches of a
        # `send_nowait` producer are never waited on, and a future each cost it CPU.
        self._waiter: asyncio.Future[None] | None = None
        self.offsets: list[int] = []
        self.producer_id = 0
        self.error: DanubeError | None = None
        self.sequence = 0

    def __len__(self) -> int:
        return len(self.payloads)

    def message_id(self, index: int) -> MessageId:
        return MessageId(self.topic, self.offsets[index], self.producer_id)

    def ids(self) -> list[int]:
        return self.sequence_ids if self.sequence_ids is not None else \
            list(range(self.first_id, self.first_id + len(self.payloads)))

    def waiter(self) -> asyncio.Future[None]:
        """A future resolved (never with an exception) once the batch is finished."""
        if self._waiter is None:
            self._waiter = asyncio.get_running_loop().create_future()
            if self.finished:
                self._waiter.set_result(None)
        return self._waiter

    def settle(self) -> None:
        """Mark it finished and wake whoever waits (finishing calls this first)."""
        self.finished = True
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def finish(self, offsets: list[int], producer_id: int, error: DanubeError | None) -> None:
        if self.finished:
            return
        self.offsets, self.producer_id, self.error = offsets, producer_id, error
        self.settle()
        if self.on_batch is not None:
            try:
                self.on_batch(BatchReceipt(self.topic, producer_id, offsets, len(self.payloads), error))
            except Exception:
                log.exception("batch callback %r raised", self.on_batch)
        for index, callback in self.callbacks or ():
            try:
                if error is None:
                    callback(None, self.message_id(index))
                else:
                    callback(copy_error(error), None)
            except Exception:
                log.exception("send callback %r raised", callback)


class PendingSend(tuple):  # type: ignore[type-arg]
    """The receipt of one message queued with `send_nowait`: await it for the
    `MessageId` (or the error), or ask `done()` / `result()` / `exception()` /
    `add_done_callback(fn)` as of an `asyncio.Future`. The messages of a batch share
    one future, so a handle is a pair (its batch, its index) built in one C call: a
    class with `__init__` cost a sixth of `send_nowait`."""

    __slots__ = ()

    _batch: _Batch = property(itemgetter(0))  # type: ignore[assignment]
    _index: int = property(itemgetter(1))  # type: ignore[assignment]

    def done(self) -> bool:
        return self._batch.finished

    def cancelled(self) -> bool:
        return False

    def result(self) -> MessageId:
        batch = self._batch
        if not batch.finished:
            raise asyncio.InvalidStateError("the receipt has not arrived yet")
        if batch.error is not None:
            raise copy_error(batch.error)
        return batch.message_id(self._index)

    def exception(self) -> DanubeError | None:
        batch = self._batch
        if not batch.finished:
            raise asyncio.InvalidStateError("the receipt has not arrived yet")
        return copy_error(batch.error) if batch.error is not None else None

    def add_done_callback(self, fn: Callable[[PendingSend], Any]) -> None:
        self._batch.waiter().add_done_callback(lambda _: fn(self))

    def __await__(self) -> Generator[Any, None, MessageId]:
        batch = self._batch
        if not batch.finished:
            # Shielded: cancelling one awaiter must not cancel the batch's shared future.
            yield from asyncio.shield(batch.waiter()).__await__()
        return self.result()

    def __repr__(self) -> str:
        state = "pending" if not self.done() else "failed" if self._batch.error else "done"
        return f"<PendingSend {self._batch.topic} #{self._index} {state}>"


class Producer:
    """Publishes to one topic (all its partitions). Create with `DanubeClient.create_producer`."""

    def __init__(
        self,
        client: DanubeClient,
        *,
        topic: str,
        name: str,
        dispatch: DispatchStrategy,
        partition_topics: list[str],
        batching: bool,
        batch_messages_max: int,
        batch_bytes_max: int,
        batch_delay_ms: int,
        pending_messages_max: int,
        inflight_batches_max: int,
        schema_subject: str | None = None,
        schema_version: int | None = None,
        schema_min_version: int | None = None,
        on_batch: BatchCallback | None = None,
        chunking: bool = False,
        chunk_bytes_max: int | None = None,
        compression: str | None = None,
    ) -> None:
        assert partition_topics
        self._client = client
        self.topic = topic
        self.name = name
        self.dispatch = dispatch
        self.batching = batching
        self.batch_messages_max = batch_messages_max if batching else 1
        self.batch_bytes_max = batch_bytes_max
        self.batch_delay_ms = batch_delay_ms
        self.pending_messages_max = pending_messages_max
        self.inflight_batches_max = inflight_batches_max
        self.on_batch = on_batch
        self.chunking = chunking
        self.chunk_bytes_max = chunk_bytes_max
        self.compression = compression  # a codec of `transport/compression.py`, or None
        # Chunked messages' ids: unique to this producer object, whatever its name.
        self._chunk_prefix = f"{name}-{os.urandom(6).hex()}-"
        self._chunk_ids = itertools.count()
        self.schema_subject = schema_subject
        self.schema_min_version = schema_min_version
        # The version every partition attaches with: pinned, or the one the first attach resolved.
        self._schema_pin = schema_version
        self.schema: CachedSchema | None = None
        partitioned = len(partition_topics) > 1 or partition_topics[0] != topic
        self._partitions = [
            _PartitionProducer(self, i, t, f"{name}-{i}" if partitioned else name)
            for i, t in enumerate(partition_topics)
        ]
        self._round_robin = RoundRobin(len(partition_topics), client._rng.randrange(len(partition_topics)))
        self._budget = Budget(pending_messages_max)
        self._open_batches: set[_Batch] = set()
        self._closing = False
        self._closed = False
        self._messages_sent = 0
        self._messages_failed = 0
        self._batches_sent = 0
        self._send_retries = 0

    @property
    def partitions(self) -> list[str]:
        """The partition topics this producer writes to (just `[topic]` if not partitioned)."""
        return [p.topic for p in self._partitions]

    def statistics(self) -> ProducerStatistics:
        return ProducerStatistics(
            topic=self.topic,
            name=self.name,
            partitions=len(self._partitions),
            pending_messages=self._budget.used,
            pending_messages_max=self.pending_messages_max,
            messages_sent=self._messages_sent,
            messages_failed=self._messages_failed,
            batches_sent=self._batches_sent,
            send_retries=self._send_retries,
            reattaches=sum(p.reattaches for p in self._partitions),
        )

    async def _start(self) -> None:
        """Attach every partition (with retries); on failure detach the ones attached.
        With a schema subject the first partition attaches alone: the version it resolves
        is the one the others are pinned to."""
        rest = self._partitions
        errors: list[BaseException] = []
        if self.schema_subject is not None:
            try:
                await rest[0].start()
            except DanubeError as exc:
                errors.append(exc)
            rest = rest[1:]
        if not errors:
            results = await asyncio.gather(*(p.start() for p in rest), return_exceptions=True)
            errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            self._closing = True
            await asyncio.gather(*(p.close() for p in self._partitions), return_exceptions=True)
            self._closed = True
            raise errors[0]

    async def _schema_attached(self, reply: ProducerCreated) -> None:
        """A partition attached with the producer's subject: fix (first time) or check the version."""
        if reply.schema_id is None or reply.schema_version is None:
            raise InternalError(f"broker attached producer {self.name} without the schema {self.schema_subject!r}")
        if self.schema is None:
            self.schema = await self._client.schemas.get(reply.schema_id, reply.schema_version)
            self._schema_pin = reply.schema_version
        elif (reply.schema_id, reply.schema_version) != (self.schema.schema_id, self.schema.version):
            raise InternalError(f"producer {self.name} writes schema id {self.schema.schema_id} version"
                                f" {self.schema.version}; the broker attached it with id {reply.schema_id}"
                                f" version {reply.schema_version}")

    # ---------------------------------------------------------------- sending

    @property
    def last_sequence_id(self) -> int:
        """The highest sequence id the topic acknowledged for this producer (its name),
        known from the broker when it attached to a topic with deduplication on; -1:
        none. On a partitioned topic, the highest over its partitions (each numbers its
        own messages)."""
        return max(p.last_sequence_id for p in self._partitions)

    @property
    def deduplication(self) -> bool:
        """Whether the topic deduplicates this producer's messages (its `deduplication`
        policy was on when the producer attached), on every partition."""
        return all(p._dedup for p in self._partitions)

    async def send(
        self, payload: Any, *, key: str | None = None, attributes: Mapping[str, str] | None = None,
        publish_time: int | None = None, sequence_id: int | None = None, deliver_after_ms: int | None = None,
        deliver_at_ms: int | None = None,
    ) -> MessageId:
        """Publish one message and wait for the broker's receipt. Waits for room when
        `pending_messages_max` messages are already pending (backpressure). Without a
        schema `payload` is bytes or str (UTF-8); with one, bytes are sent as they are and
        any other value is encoded with the producer's schema version.

        `publish_time` (ms since the epoch, 0..`PUBLISH_TIME_MS_MAX`): the message's
        publish time when it was stamped elsewhere (a gateway passing on its own
        client's); None or 0 stamps it now, as every message is by default.

        `sequence_id`: the message's number for deduplication, above the previous
        message's (by default each message gets the next, and above `last_sequence_id`).
        On a topic with the `deduplication` policy a message whose number the topic
        stored before under this producer name (from this process or an earlier one:
        a resend) is not stored again: its `MessageId` is the first copy's (offset -1
        when that is older than the broker's `policies.deduplication_window`).

        `deliver_after_ms` (from now) or `deliver_at_ms` (ms since the epoch): a delayed
        message. Reliable Shared and Key-Shared subscriptions deliver it at that time, by
        the broker's clock, and not before; Exclusive and Failover ones at once, as in
        Pulsar. It travels as the attribute `__deliver_at`."""
        if deliver_after_ms is not None or deliver_at_ms is not None:
            attributes = _with_delivery_time(attributes, deliver_after_ms, deliver_at_ms)
        partition, payload_bytes, key, attrs = self._prepare(payload, key, attributes)
        stamped = _check_publish_time(publish_time)
        if sequence_id is not None:
            partition.check_sequence_id(sequence_id)
        if self.chunking and len(payload_bytes) > self._chunk_size(partition, key, attrs):
            return await self._send_chunked(partition, payload_bytes, key, attrs, stamped, sequence_id)
        await self._budget.take()
        if self._closing:
            self._budget.give(1)
            raise AlreadyClosed(f"producer {self.name} is closed")
        return await partition.add(payload_bytes, key, attrs, None, stamped, sequence_id)

    def send_nowait(
        self,
        payload: Any,
        *,
        key: str | None = None,
        attributes: Mapping[str, str] | None = None,
        callback: SendCallback | None = None,
        publish_time: int | None = None,
        sequence_id: int | None = None,
        deliver_after_ms: int | None = None,
        deliver_at_ms: int | None = None,
    ) -> PendingSend | asyncio.Future[MessageId]:
        """Queue one message and return its `PendingSend` at once (await it for the
        `MessageId`); raise `ProducerQueueFull` when `pending_messages_max` messages are
        already pending. `callback(error, message_id)`, if given, runs when the receipt
        (or the failure) arrives; a partition's callbacks run in send order. `publish_time`,
        `sequence_id`, `deliver_after_ms` and `deliver_at_ms` as for `send`. A chunked
        message (`chunking`) takes a place per chunk and gives an `asyncio.Future` of its
        id instead."""
        if deliver_after_ms is not None or deliver_at_ms is not None:
            attributes = _with_delivery_time(attributes, deliver_after_ms, deliver_at_ms)
        partition, payload_bytes, key, attrs = self._prepare(payload, key, attributes)
        stamped = _check_publish_time(publish_time)
        if sequence_id is not None:
            partition.check_sequence_id(sequence_id)
        if self.chunking and len(payload_bytes) > self._chunk_size(partition, key, attrs):
            return self._send_chunked_nowait(partition, payload_bytes, key, attrs, callback, stamped, sequence_id)
        if not self._budget.try_take():
            raise ProducerQueueFull(
                f"producer {self.name} has {self.pending_messages_max} messages pending (pending_messages_max)"
            )
        return partition.add(payload_bytes, key, attrs, callback, stamped, sequence_id)

    def _prepare(
        self, payload: Any, key: Any, attributes: Any
    ) -> tuple[_PartitionProducer, bytes, str | None, dict[str, str] | None]:
        if self._closing:
            raise AlreadyClosed(f"producer {self.name} is closed")
        if self.schema is not None:
            data = self.schema.encode(payload)
        elif type(payload) is bytes:
            data = payload
        else:
            data = as_payload(payload)
        if key is not None and type(key) is not str:
            raise InvalidArgument(f"key must be a str, not {type(key).__name__}")
        attrs = check_attributes(attributes) if attributes is not None else None
        if self.compression is not None and data:  # an empty payload stays one: a tombstone
            data = compress(self.compression, data)
            attrs = {**attrs, COMPRESSION: self.compression} if attrs else {COMPRESSION: self.compression}
        partitions = self._partitions
        if len(partitions) == 1:
            partition = partitions[0]
        elif key is None:
            partition = partitions[self._round_robin.next()]
        else:
            partition = partitions[partition_for_key(key, len(partitions))]
        if partition.failed is not None:
            raise copy_error(partition.failed)
        if self.chunking and len(data) > self._chunk_size(partition, key, attrs):
            return partition, data, key, attrs  # sent as chunks, each checked by `_chunks`
        if len(data) > partition.message_bytes_max:
            raise InvalidArgument(
                f"message of {len(data)} bytes is over the broker's message_bytes_max {partition.message_bytes_max}"
                " (its policies.max_message_size)"
            )
        if (key is not None or attrs) and entry_bytes(data, key, attrs) > partition.frame_room:
            raise InvalidArgument(
                "message with its key and attributes does not fit the broker's "
                f"frame_bytes_max {partition.connection.limits.frame_bytes_max} (its limits.frame_bytes_max)"
            )
        return partition, data, key, attrs

    # ---------------------------------------------------------------- chunking

    def _chunk_size(self, partition: _PartitionProducer, key: str | None, attrs: dict[str, str] | None) -> int:
        """The payload bytes of one chunk: the broker's message size (or
        `chunk_bytes_max`), within a frame with the key and every attribute."""
        room = partition.frame_room - CHUNK_ATTRIBUTE_BYTES - entry_bytes(b"", key, attrs)
        size = min(partition.message_bytes_max, room)
        return size if self.chunk_bytes_max is None else min(size, self.chunk_bytes_max)

    def _chunks(self, partition: _PartitionProducer, data: bytes, key: str | None, attrs: dict[str, str] | None,
                sequence_id: int | None) -> list[tuple[bytes, dict[str, str]]]:
        if sequence_id is not None:
            raise InvalidArgument("a chunked message takes automatic sequence ids (one per chunk)")
        size = self._chunk_size(partition, key, attrs)
        if size < 1:
            raise InvalidArgument("the key and attributes leave no room for a chunk in the broker's frame")
        parts = split(data, size)
        uuid = f"{self._chunk_prefix}{next(self._chunk_ids)}"
        return [(part, chunk_attributes(attrs, uuid, i, len(parts), len(data))) for i, part in enumerate(parts)]

    async def _send_chunked(self, partition: _PartitionProducer, data: bytes, key: str | None,
                            attrs: dict[str, str] | None, stamped: int | None,
                            sequence_id: int | None) -> MessageId:
        """Each chunk takes its place in `pending_messages_max` as it goes; the id is the
        first chunk's, once every chunk is acknowledged."""
        sends = []
        for part, chunk_attrs in self._chunks(partition, data, key, attrs, sequence_id):
            await self._budget.take()
            if self._closing:
                self._budget.give(1)
                raise AlreadyClosed(f"producer {self.name} is closed")
            sends.append(partition.add(part, key, chunk_attrs, None, stamped))
        ids = [await send for send in sends]
        return ids[0]

    def _send_chunked_nowait(self, partition: _PartitionProducer, data: bytes, key: str | None,
                             attrs: dict[str, str] | None, callback: SendCallback | None, stamped: int | None,
                             sequence_id: int | None) -> asyncio.Future[MessageId]:
        """All the chunks queued at once (room for each in `pending_messages_max`, or
        `ProducerQueueFull`); a future of the first chunk's id once all are acknowledged,
        or of the first failure; `callback` once, then."""
        chunks = self._chunks(partition, data, key, attrs, sequence_id)
        taken = 0
        while taken < len(chunks) and self._budget.try_take():
            taken += 1
        if taken < len(chunks):
            self._budget.give(taken)
            raise ProducerQueueFull(f"producer {self.name} has no room for the {len(chunks)} chunks of a"
                                    f" {len(data)}-byte message (pending_messages_max {self.pending_messages_max})")
        sends = [partition.add(part, key, chunk_attrs, None, stamped) for part, chunk_attrs in chunks]
        future: asyncio.Future[MessageId] = asyncio.get_running_loop().create_future()
        left = [len(sends)]

        def done(_: PendingSend) -> None:
            left[0] -= 1
            if left[0] or future.done():
                return
            error = next((e for send in sends if (e := send.exception()) is not None), None)
            if error is None:
                future.set_result(sends[0].result())
            else:
                future.set_exception(error)
            if callback is not None:
                callback(error, None if error is not None else future.result())

        for send in sends:
            send.add_done_callback(done)
        return future

    def _batch_cut(self, batch: _Batch) -> None:
        self._open_batches.add(batch)

    def _batch_finished(self, batch: _Batch, sent: bool) -> None:
        self._open_batches.discard(batch)
        batch.settle()
        if sent:
            self._messages_sent += len(batch)
            self._batches_sent += 1
        else:
            self._messages_failed += len(batch)
        self._budget.give(len(batch))

    async def flush(self, timeout: float | None = None) -> None:
        """Send what is batched now and wait until every message sent so far has its
        receipt or its error (errors are on the messages' handles, not raised here).
        With `timeout` (seconds), stop waiting then (raising `Timeout`)."""
        for partition in self._partitions:
            partition.cut()
        pending = [batch.waiter() for batch in self._open_batches]
        if pending:
            _, not_done = await asyncio.wait(pending, timeout=timeout)
            if not_done:
                raise Timeout(f"producer {self.name}: {len(not_done)} batches unsent after {timeout} s")

    async def close(self) -> None:
        """Flush (for at most the request timeout), then detach from the broker; what is
        still unsent then fails with `AlreadyClosed`. Later sends raise `AlreadyClosed`."""
        if self._closing:
            return
        self._closing = True
        try:
            await self.flush(timeout=self._client.request_timeout_ms / 1000)
        except Timeout as exc:
            log.warning("%s; closing anyway", exc)
        finally:
            await asyncio.gather(*(p.close() for p in self._partitions), return_exceptions=True)
            self._closed = True
            self._client._forget(self)

    async def __aenter__(self) -> Producer:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"<Producer {self.name!r} on {self.topic!r} partitions={len(self._partitions)}>"


class _PartitionProducer(Attachment):
    """The broker-side producer on one partition topic, its accumulator and its sender."""

    kind = "producer"

    def __init__(self, producer: Producer, index: int, topic: str, name: str) -> None:
        super().__init__(producer._client, topic, name)
        self._producer = producer
        self.index = index
        self.producer_id: int | None = None
        self._batch: _Batch | None = None  # the open batch
        self._now_ms = producer._client._clock.now_ms
        # The broker's limits, from the connection they were computed for (a redirect
        # moves the producer to another broker).
        self._limits_of: Connection | None = None
        self._message_bytes_max = 0
        self._frame_room = 0
        self._batch_bytes_max = 0
        self._timer: asyncio.Handle | None = None
        self._overdue = False  # the open batch's delay ran out while the window was full
        # Cut batches waiting for a slot of the window, in order. Bounded by the
        # producer's budget: a batch holds at least one pending message.
        self._waiting: deque[_Batch] = deque()
        self._window = producer.inflight_batches_max
        # Batches sent without a task (`_send_now`), by sequence: only these are failed
        # by `close`; the others have their task.
        self._fast: dict[int, _Batch] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._sequence = 0  # the next batch's number
        # Deduplication: the next automatic sequence id (above the last message's and
        # above what the topic stored under this name, from the broker at attach; while
        # a batch is open with implied ids, `_automatic_next` counts on from it); the
        # last id a message named itself and the next automatic id just after it (while
        # they are equal, that message was the last); the highest acknowledged (from the
        # broker at attach too, then receipts).
        self._next_id = 0
        self._named_id = -1
        self._next_after_named = 0
        self.last_sequence_id = -1
        # The topic deduplicates (its ProducerCreated said so): batches carry their ids.
        self._dedup = False
        # Numbers of the batches handed to the sender that are not on the wire (first
        # send, or again after a failure): only the lowest may be sent.
        self._unsent: set[int] = set()
        self._turns: list[asyncio.Future[None]] = []
        # Numbers of the batches holding a slot of the window (sent or to be sent, no
        # answer yet): how many are in flight, and the oldest is the one a re-attach
        # tells the broker to expect.
        self._outstanding: set[int] = set()
        # Their bytes: at most a frame's room (`_has_room`), whatever the window. The broker
        # cuts a connection holding more than limits.inbound_bytes_per_connection_max it has
        # not read yet, which its config keeps above frame_bytes_max: 16 batches of 20 MB
        # sent at once were cut, and sent again, and cut (issue 38).
        self._outstanding_bytes = 0

    async def _attach_on(self, connection: Connection) -> None:
        producer = self._producer
        pin = producer._schema_pin
        reply = await connection.request(
            CreateProducer(
                request_id=0,
                topic=self.topic,
                producer_name=self.name,
                dispatch_strategy=int(producer.dispatch),
                schema_subject=producer.schema_subject,
                schema_version=pin,
                schema_min_version=producer.schema_min_version if pin is None else None,
                next_sequence=min(self._outstanding, default=self._sequence),
            )
        )
        if not isinstance(reply, ProducerCreated):
            raise InternalError(f"broker answered CreateProducer with {type(reply).__name__}")
        if producer.schema_subject is not None:
            await producer._schema_attached(reply)
        self._dedup = reply.last_sequence_id is not None
        if reply.last_sequence_id is not None and reply.last_sequence_id > self.last_sequence_id:
            # Another process of this name stored these: new messages number on from there.
            self.last_sequence_id = reply.last_sequence_id
            if reply.last_sequence_id >= self._automatic_next():
                last = self._last_id()  # still the last message's: a resend may go below the stored
                self._listed()  # the open batch's next automatic id jumps
                self._next_id = reply.last_sequence_id + 1
                self._named_id, self._next_after_named = last, self._next_id
        self.producer_id = reply.producer_id
        connection.register_producer(reply.producer_id, self)
        # A batch still in flight on the previous attachment may yet fail and go again:
        # every later batch waits for its answer (or its re-send on this attachment), so
        # none is stored here before it. One acknowledged there is waited for no longer.
        self._unsent.update(self._outstanding)

    def _forget_id(self) -> None:
        if self.producer_id is not None:
            self.connection.unregister_producer(self.producer_id, self)
            self.producer_id = None

    def _on_failed(self, error: DanubeError) -> None:
        self.cut()  # what is batched fails now rather than at the next timer

    # ProducerHandler
    def on_producer_closed(self, reason: str, reattach: bool) -> None:
        self._broker_closed(reason, reattach)

    # ---------------------------------------------------------------- batching

    def _limits(self) -> None:
        connection = self.connection
        limits = connection.limits
        self._message_bytes_max = limits.message_bytes_max
        self._frame_room = limits.frame_bytes_max - SEND_OVERHEAD_BYTES
        self._batch_bytes_max = min(self._producer.batch_bytes_max, self._frame_room)
        self._limits_of = connection

    @property
    def message_bytes_max(self) -> int:
        if self.connection is not self._limits_of:
            self._limits()
        return self._message_bytes_max

    @property
    def frame_room(self) -> int:
        """The bytes of messages one `Send` frame can carry."""
        if self.connection is not self._limits_of:
            self._limits()
        return self._frame_room

    def add(self, payload: bytes, key: str | None, attributes: dict[str, str] | None,
            callback: SendCallback | None, publish_time: int | None = None,
            sequence_id: int | None = None) -> PendingSend:
        if self.connection is not self._limits_of:
            self._limits()
        size = entry_bytes(payload, key, attributes)
        batch = self._batch
        if batch is not None and batch.bytes + size > self._batch_bytes_max:
            self.cut()
            batch = None
        if batch is None:
            batch = self._batch = _Batch(self.topic, self._producer.on_batch, self._next_id)
            if self._pipe_idle():
                # Nothing in flight: the batch leaves at the end of this turn of the loop,
                # with what the turn added, so light traffic does not wait out the delay
                # (cut and sent in the connection's one end-of-turn callback). Under load
                # batches fill while earlier ones are in flight (`_deliver` cuts the open
                # one when the pipe drains), up to the size limits or the delay.
                self.connection.cut_soon(self, batch)
            else:
                loop = asyncio.get_running_loop()
                self._timer = loop.call_later(self._producer.batch_delay_ms / 1000, self._delay_over)
        if sequence_id is None:
            # Implied: the batch's automatic ids run on from `first_id`, no list kept.
            if batch.sequence_ids is not None:
                batch.sequence_ids.append(self._next_id)
                self._next_id += 1
        else:
            self._named(sequence_id)
        index = len(batch.payloads)
        batch.payloads.append(payload)
        batch.publish_times.append(publish_time or self._now_ms())
        if key is not None:
            if batch.keys is None:
                batch.keys = [None] * index
            batch.keys.append(key)
        elif batch.keys is not None:
            batch.keys.append(None)
        if attributes:
            if batch.attributes is None:
                batch.attributes = [None] * index
            batch.attributes.append(attributes)
        elif batch.attributes is not None:
            batch.attributes.append(None)
        if callback is not None:
            if batch.callbacks is None:
                batch.callbacks = []
            batch.callbacks.append((index, callback))
        batch.bytes += size
        if index + 1 >= self._producer.batch_messages_max or batch.bytes >= self._batch_bytes_max:
            self.cut()
        return _new(PendingSend, (batch, index))

    def _automatic_next(self) -> int:
        batch = self._batch
        if batch is not None and batch.sequence_ids is None:
            return batch.first_id + len(batch.payloads)
        return self._next_id

    def _listed(self) -> None:
        """The open batch keeps a list of its ids from now on; `_next_id` counts."""
        batch = self._batch
        if batch is not None and batch.sequence_ids is None:
            self._next_id = batch.first_id + len(batch.payloads)
            batch.sequence_ids = batch.ids()

    def _last_id(self) -> int:
        """The last message's sequence id (-1: none yet)."""
        following = self._automatic_next()
        return self._named_id if following == self._next_after_named else following - 1

    def check_sequence_id(self, sequence_id: int) -> None:
        last = self._last_id()
        if type(sequence_id) is not int or sequence_id <= last:
            raise InvalidArgument(f"sequence_id {sequence_id!r} is not above this producer's last"
                                  f" ({last}): sequence ids must increase")

    def _named(self, sequence_id: int) -> None:
        """A message with its own id (checked), added to the open batch: the batch keeps
        a list of its ids, and automatic ids go on above it (or above what was stored: a
        resend may be below)."""
        self._listed()
        assert self._batch is not None and self._batch.sequence_ids is not None
        self._batch.sequence_ids.append(sequence_id)
        self._next_id = max(self._next_id, sequence_id + 1)
        self._named_id, self._next_after_named = sequence_id, self._next_id

    def _pipe_idle(self) -> bool:
        """No batch waiting or in flight. (Only then does a new batch leave at once:
        cutting one whenever the window has room made reliable produce-ack p50 at 5k
        msg/s 5.0 ms instead of 3.0, the per-batch work outweighing the wait.)"""
        return not self._outstanding and not self._waiting

    def _delay_over(self) -> None:
        self._timer = None
        if not self._waiting and self._has_room(self._batch):
            self.cut()
        else:
            # The window is full: this batch could not leave now anyway. It keeps filling
            # and is cut when a batch in flight finishes with nothing queued (`_deliver`),
            # or at the size limits. Cutting it now queued a batch per turn of the loop
            # behind the window (with `batch_delay_ms=0`, one message each: a reliable
            # producer fell seconds behind at 5k msg/s).
            self._overdue = True

    def cut_if_open(self, batch: object) -> None:
        """Cut `batch` if it is still the open one (`Connection.cut_soon`)."""
        if self._batch is batch:
            self.cut()

    def cut(self) -> None:
        """Hand the open batch to the sender now."""
        self._overdue = False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        batch = self._batch
        if batch is None:
            return
        if batch.sequence_ids is None:
            self._next_id = batch.first_id + len(batch.payloads)
        self._batch = None
        self._producer._batch_cut(batch)
        if self._waiting or not self._has_room(batch):
            self._waiting.append(batch)
        else:
            self._launch(batch)

    def _has_room(self, batch: _Batch | None) -> bool:
        """Whether `batch` may go now: a slot of the window, and room for its bytes in a
        frame's worth in flight (one batch always goes alone)."""
        if not self._outstanding:
            return True
        size = batch.bytes if batch is not None else 0
        return len(self._outstanding) < self._window and self._outstanding_bytes + size <= self.frame_room

    def _launch(self, batch: _Batch) -> None:
        """Give `batch` a slot of the window and its sequence number, and send it: at
        once when nothing earlier waits to go on the wire and the connection takes it
        (`_send_now`), else from a task that also retries."""
        batch.sequence = sequence = self._sequence
        self._sequence += 1
        self._outstanding.add(sequence)
        self._outstanding_bytes += batch.bytes
        if not self._unsent and not self._closing and self._send_now(batch):
            self._fast[sequence] = batch
            return
        self._unsent.add(sequence)
        self._start_task(batch, None)

    def _send_now(self, batch: _Batch) -> bool:
        if not self._attached.is_set() or self.failed is not None or self.producer_id is None:
            return False
        sequence = batch.sequence
        return self.connection.request_nowait(
            self._send_builder(batch, self.producer_id),
            lambda reply, error: self._on_receipt(sequence, reply, error),
        )

    def _send_builder(self, batch: _Batch, producer_id: int) -> Callable[[int], Send]:
        schema = self._producer.schema
        schema_id = schema.schema_id if schema is not None else None
        schema_version = schema.version if schema is not None else None

        def build(request_id: int) -> Send:
            # Ids travel only to a deduplicating topic (or when a message named its own):
            # elsewhere they would cost a column per message for nothing.
            ids = batch.ids() if self._dedup or batch.sequence_ids is not None else None
            return Send(request_id=request_id, producer_id=producer_id, payloads=batch.payloads,
                        publish_times=batch.publish_times, keys=batch.keys, attributes=batch.attributes,
                        schema_id=schema_id, schema_version=schema_version, sequence=batch.sequence,
                        sequence_ids=ids)
        return build

    def _on_receipt(self, sequence: int, reply: Message | None, error: DanubeError | None) -> None:
        """The answer to a batch sent by `_send_now`, run from the connection's receive
        path; a failure goes on in a task, which retries as `_send_with_retries` does."""
        batch = self._fast.pop(sequence, None)
        if batch is None:  # closed meanwhile
            return
        if error is None:
            error = _receipt_error(batch, reply)
        if error is None:
            assert isinstance(reply, SendReceipt)
            batch.finish(reply.offsets, reply.producer_id, None)
            self._finished(batch, True)
            return
        try:
            self._after_failure(batch, error, 0)
        except DanubeError as exc:
            _fail_batch(batch, exc)
            self._finished(batch, False)
            return
        self._start_task(batch, 1)

    def _start_task(self, batch: _Batch, attempt: int | None) -> None:
        task = asyncio.get_running_loop().create_task(self._deliver(batch, attempt))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _deliver(self, batch: _Batch, attempt: int | None) -> None:
        """Send (or, with `attempt`, send again after a backoff) and wait for the receipt."""
        sent = False
        try:
            receipt = await self._send_with_retries(batch, attempt)
            batch.finish(receipt.offsets, receipt.producer_id, None)
            sent = True
        except DanubeError as exc:
            _fail_batch(batch, exc)
        except asyncio.CancelledError:
            _fail_batch(batch, AlreadyClosed(f"producer {self.name} closed before the receipt"))
            raise
        except Exception as exc:  # a bug of ours: report it on every future, never lose it
            log.exception("producer %s: batch delivery crashed", self.name)
            _fail_batch(batch, InternalError(f"batch delivery crashed: {exc!r}"))
        finally:
            self._finished(batch, sent)

    def _finished(self, batch: _Batch, sent: bool) -> None:
        if sent and batch.error is None:
            last = batch.sequence_ids[-1] if batch.sequence_ids is not None else batch.first_id + len(batch) - 1
            self.last_sequence_id = max(self.last_sequence_id, last)
        if batch.sequence in self._outstanding:
            self._outstanding.remove(batch.sequence)
            self._outstanding_bytes -= batch.bytes
        self._on_wire(batch.sequence)  # given up on (or done): later batches go on
        self._producer._batch_finished(batch, sent)
        # The freed slot goes to the oldest waiting batch, in order.
        waiting = self._waiting
        while waiting and self._has_room(waiting[0]):
            self._launch(waiting.popleft())
        # The pipe drained, or this batch's slot in the window is free for an overdue one.
        room = self._has_room(self._batch)
        if self._batch is not None and (self._pipe_idle() or (self._overdue and not waiting and room)):
            self.cut()

    def _on_wire(self, sequence: int) -> None:
        self._unsent.discard(sequence)
        turns, self._turns = self._turns, []
        for turn in turns:
            if not turn.done():
                turn.set_result(None)

    async def _my_turn(self, sequence: int) -> None:
        """Wait until every earlier batch not yet acknowledged is on the wire."""
        while min(self._unsent) < sequence:
            turn = asyncio.get_running_loop().create_future()
            self._turns.append(turn)
            await turn

    async def _send_with_retries(self, batch: _Batch, attempt: int | None = None) -> SendReceipt:
        """Send `batch` until its receipt comes; `attempt` (the tries so far) when an
        earlier try failed and the backoff is still to wait."""
        sequence = batch.sequence
        if attempt is None:
            attempt = 0
        else:
            await asyncio.sleep(backoff_ms(attempt - 1, self._client._rng) / 1000)
        while True:
            try:
                await self._my_turn(sequence)
                connection = await self.wait_attached()
                if min(self._unsent) < sequence:
                    continue  # an attach meanwhile put earlier batches still in flight before it
                producer_id = self.producer_id
                assert producer_id is not None
                reply = await connection.request(
                    self._send_builder(batch, producer_id),
                    on_sent=lambda: self._on_wire(sequence),
                )
                error = _receipt_error(batch, reply)
                if error is not None:
                    raise error
                assert isinstance(reply, SendReceipt)
                return reply
            except DanubeError as exc:
                self._after_failure(batch, exc, attempt)
            await asyncio.sleep(backoff_ms(attempt, self._client._rng) / 1000)
            attempt += 1

    def _after_failure(self, batch: _Batch, exc: DanubeError, attempt: int) -> None:
        """Raise `exc` if the batch is given up on, else make it the next to go again."""
        # NOT_FOUND on a Send: the broker dropped this producer id just before
        # (its topic moved or restarted): re-create it and send again.
        detached = isinstance(exc, NotFound)
        if not (exc.retriable or detached) or attempt >= self._client.operation_retries_max:
            if (exc.retriable or detached) and not isinstance(exc, ConnectionLost) and self.producer_id is not None:
                # Given up on a batch the broker may expect again (a reliable topic
                # refuses the later ones until it comes): re-attaching clears that.
                self._detach()
                self._schedule_reattach()
            raise exc
        self._unsent.add(batch.sequence)  # it goes again before any later batch
        if detached or (isinstance(exc, Unavailable) and not isinstance(exc, ConnectionLost)):
            # The broker no longer serves this producer here (unloaded, moved):
            # re-create it, following a redirect if there is one.
            self._detach()
            self._schedule_reattach()
        self._producer._send_retries += 1
        log.info("send of %d messages on %s failed (%s); retrying", len(batch), self.topic, exc)

    async def close(self) -> None:
        self._closing = True
        self.cut()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        closed = AlreadyClosed(f"producer {self.name} closed before the receipt")
        fast, self._fast = self._fast, {}
        for batch in fast.values():
            _fail_batch(batch, closed)
            self._producer._batch_finished(batch, False)
        while self._waiting:
            batch = self._waiting.popleft()
            _fail_batch(batch, AlreadyClosed(f"producer {self.name} closed"))
            self._producer._batch_finished(batch, False)
        connection = await self._stop_attachment()
        producer_id = self.producer_id
        if self.connection is not None:
            self._detach()
        if connection is not None and producer_id is not None:
            try:
                await connection.request(CloseProducer(request_id=0, producer_id=producer_id))
            except DanubeError as exc:
                # The producer is gone on our side either way, and the broker detaches it
                # when the session ends; a failed goodbye is not the caller's problem.
                log.info("closing producer %s on %s: %s", self.name, self.topic, exc)


def _fail_batch(batch: _Batch, error: DanubeError) -> None:
    batch.finish([], 0, error)


def _receipt_error(batch: _Batch, reply: Message | None) -> DanubeError | None:
    if not isinstance(reply, SendReceipt):
        return InternalError(f"broker answered Send with {type(reply).__name__}")
    if len(reply.offsets) != len(batch):
        return InternalError(f"broker sent {len(reply.offsets)} offsets for {len(batch)} messages")
    return None

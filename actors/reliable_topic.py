"""The topic actor of a reliable topic: store, then deliver.

1. Send -> encode the batch as WAL records at `next_offset` (offsets assigned now) and
   queue it for the next flush.
2. Flush (group commit): while one flush runs in a worker thread (write + fsync),
   sends keep queueing; when it finishes, the actor gets `FlushDone` and starts the
   next flush with everything queued meanwhile, so one fsync covers many batches and
   producers. With `storage.wal_sync: always` nothing is acknowledged before its fsync.
3. FlushDone -> `committed_offset` moves on -> `SendReceipt` to each producer ->
   one `Publish` per batch to every subscription (they deliver from it when caught
   up) -> the batch joins the in-memory cache of recent committed batches.
4. A write or fsync error fails the batches of that flush and those queued after it
   (RESOURCE_EXHAUSTED for a full disk, INTERNAL otherwise), reopens the log (recovery
   truncates a torn tail) and carries on from its end; nothing unwritten is
   acknowledged and reads keep working.
5. ReadRequest (a lagging subscription) -> committed records from the cache, else from
   the WAL files -> `ReadResult`.

The log object belongs to this actor; the worker thread writes the active segment
while this actor reads only committed offsets.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import random
from collections import deque
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path

from danube_zmq.actors.config import BrokerConfig
from danube_zmq.actors.gateway import reply_client
from danube_zmq.actors.reliable_subscription import ReliableSubscriptionActor
from danube_zmq.actors.topic import TopicActor, _Subscription
from danube_zmq.storage.wal import WalLog, encode_batch
from danube_zmq.transport import client_protocol as cp
from danube_zmq.transport.codec import Message
from danube_zmq.transport.common import Error
from danube_zmq.transport.errors import ErrorCode, InvalidArgument, NotFound
from danube_zmq.transport.internal_protocol import (
    INTERNAL_PROTOCOL,
    AppendInternal,
    ClientRequest,
    FlushDone,
    ForgetSubscription,
    Publish,
    ReadRequest,
    ReadResult,
    SubscriptionState,
)

log = logging.getLogger("danube_zmq.topic")

_READ_FRAMES_MAX = 64
_BROKER_PRODUCER_ID = 0


@dataclass(slots=True)
class _Batch:
    """One producer batch between encoding and acknowledgement."""

    encoded: bytes
    publish: Publish
    identity: bytes | None  # None: appended by the broker itself (dead letters)
    request_id: int


class ReliableTopicActor(TopicActor):
    def __init__(self, *, name: str, config: BrokerConfig, rng: random.Random, wal_dir: Path,
                 executor: Executor, subscriptions: list[SubscriptionState], broker_endpoint: str) -> None:
        super().__init__(name=name, dispatch_strategy=cp.DispatchStrategy.RELIABLE, config=config, rng=rng)
        self.wal_dir = wal_dir
        self.executor = executor
        self.persisted_subscriptions = subscriptions
        self.broker_endpoint = broker_endpoint
        self.wal: WalLog | None = None
        self.committed_offset = 0  # every offset below is durable (or written, in interval mode)
        self.queued: list[_Batch] = []
        self.flushing: list[_Batch] = []
        self.flush_id = 0
        self.failed_flushes = 0
        # Recent committed batches: (base offset, count, encoded Publish), oldest first.
        self.cache: deque[tuple[int, int, bytes]] = deque()
        self.cache_bytes = 0
        self._sync_always = config.storage.wal_sync == "always"

    async def on_start(self) -> None:
        storage = self.config.storage
        self.wal = await asyncio.to_thread(
            WalLog.open, self.wal_dir, segment_bytes_max=storage.wal_segment_bytes_max,
            segment_age_ms_max=storage.wal_segment_age_ms_max, clock=self.system.clock)
        self.next_offset = self.committed_offset = self.wal.next_offset
        for state in self.persisted_subscriptions:
            await self._spawn_reliable(state.name, state.sub_type, cursor=state.cursor, acked_above=state.acked_above)
        if not self._sync_always:
            self.system.schedule_periodic(self.endpoint, storage.wal_sync_interval_ms, FlushDone(flush_id=-1))

    async def on_stop(self) -> None:
        await super().on_stop()
        if self.wal is not None:
            wal, self.wal = self.wal, None
            # Let a flush in flight finish before the file is closed under it.
            await asyncio.get_running_loop().run_in_executor(self.executor, wal.close)

    # ------------------------------------------------------------- produce
    async def _send(self, req: ClientRequest, msg: cp.Send) -> Message | None:
        producer = self.producers.get(msg.producer_id)
        if producer is None or producer.identity != req.identity:
            raise NotFound(f"producer {msg.producer_id} is not attached to topic {self.topic}")
        self._enqueue(Publish(
            topic=self.topic, producer_id=msg.producer_id, producer_name=producer.name, base_offset=self.next_offset,
            payloads=msg.payloads, publish_times=msg.publish_times, keys=msg.keys, attributes=msg.attributes,
            schema_id=msg.schema_id, schema_version=msg.schema_version), req.identity, msg.request_id)
        return None

    def handle_AppendInternal(self, msg: AppendInternal) -> None:
        self._enqueue(Publish(
            topic=self.topic, producer_id=_BROKER_PRODUCER_ID, producer_name=msg.producer_name,
            base_offset=self.next_offset, payloads=msg.payloads, publish_times=msg.publish_times, keys=msg.keys,
            attributes=msg.attributes), None, 0)

    def _enqueue(self, publish: Publish, identity: bytes | None, request_id: int) -> None:
        count = len(publish.payloads)
        encoded = encode_batch(publish.base_offset, publish.payloads, publish.publish_times, publish.producer_id,
                               publish.producer_name, keys=publish.keys, attributes=publish.attributes,
                               schema_id=publish.schema_id, schema_version=publish.schema_version)
        self.next_offset += count
        size = sum(map(len, publish.payloads))
        self.messages_in += count
        self.bytes_in += size
        self._messages_in_metric.inc(count)
        self._bytes_in_metric.inc(size)
        self.queued.append(_Batch(encoded, publish, identity, request_id))
        if not self.flushing:
            self._start_flush()

    def _start_flush(self) -> None:
        assert not self.flushing and self.queued and self.wal is not None
        self.flushing, self.queued = self.queued, []
        self.flush_id += 1
        flush_id, wal, sync = self.flush_id, self.wal, self._sync_always
        chunks = [(b.encoded, len(b.publish.payloads)) for b in self.flushing]
        system, endpoint = self.system, self.endpoint

        def write() -> None:
            for encoded, count in chunks:
                wal.append(encoded, count)
            if sync:
                wal.sync()

        def done(future: asyncio.Future[None]) -> None:
            error = future.exception()
            if error is None:
                msg = FlushDone(flush_id=flush_id)
            else:
                code = ErrorCode.RESOURCE_EXHAUSTED if isinstance(error, OSError) and error.errno == errno.ENOSPC \
                    else ErrorCode.INTERNAL
                msg = FlushDone(flush_id=flush_id, error_code=code, error_message=f"{type(error).__name__}: {error}")
            # The completion must reach the actor even when its mailbox is momentarily full.
            system.post(endpoint, msg)

        future = asyncio.get_running_loop().run_in_executor(self.executor, write)
        future.add_done_callback(done)

    async def handle_FlushDone(self, msg: FlushDone) -> None:
        if msg.flush_id == -1:  # interval mode: the periodic fsync
            if self.wal is not None and not self.flushing:
                await asyncio.get_running_loop().run_in_executor(self.executor, self.wal.sync)
            return
        assert msg.flush_id == self.flush_id, (msg.flush_id, self.flush_id)
        batches, self.flushing = self.flushing, []
        if msg.error_code is not None:
            await self._flush_failed(batches, msg)
        else:
            self._committed(batches)
        if self.queued and not self.flushing:
            self._start_flush()

    def _committed(self, batches: list[_Batch]) -> None:
        for batch in batches:
            publish = batch.publish
            count = len(publish.payloads)
            assert publish.base_offset == self.committed_offset, (publish.base_offset, self.committed_offset)
            self.committed_offset += count
            if batch.identity is not None:
                reply_client(self.system, batch.identity, cp.SendReceipt(
                    request_id=batch.request_id, producer_id=publish.producer_id,
                    offsets=list(range(publish.base_offset, publish.base_offset + count))))
            frame = INTERNAL_PROTOCOL.encode(publish)
            for subscription in self.subscriptions.values():
                # A subscription that misses this notice reads the records from the log.
                self.system.tell_frame(subscription.endpoint, frame)
            self._cache(publish.base_offset, count, frame)

    async def _flush_failed(self, batches: list[_Batch], msg: FlushDone) -> None:
        self.failed_flushes += 1
        failed = batches + self.queued
        self.queued = []
        log.error("%s: WAL flush failed (%s); %d batches refused", self.topic, msg.error_message, len(failed))
        reason = "disk full" if msg.error_code == ErrorCode.RESOURCE_EXHAUSTED else "write failed"
        for batch in failed:
            if batch.identity is not None:
                reply_client(self.system, batch.identity, Error(
                    request_id=batch.request_id, code=msg.error_code or ErrorCode.INTERNAL,
                    message=f"topic {self.topic}: {reason}, the messages were not stored ({msg.error_message})"))
        # Start again from what the files really hold: recovery drops a torn tail; records
        # written whole but not acknowledged may stay (the producer retries: at-least-once).
        assert self.wal is not None
        wal = self.wal
        self.wal = None
        await asyncio.get_running_loop().run_in_executor(self.executor, wal.close)
        storage = self.config.storage
        self.wal = await asyncio.to_thread(
            WalLog.open, self.wal_dir, segment_bytes_max=storage.wal_segment_bytes_max,
            segment_age_ms_max=storage.wal_segment_age_ms_max, clock=self.system.clock)
        recovered = self.wal.next_offset
        if recovered > self.committed_offset:
            # Whole records past the acknowledged frontier survived: readable, never acknowledged.
            read = self.wal.read(self.committed_offset, max_bytes=1 << 30, upto_offset=recovered)
            for frame in _publish_frames(self.topic, read):
                for subscription in self.subscriptions.values():
                    self.system.tell_frame(subscription.endpoint, frame)
        self.next_offset = self.committed_offset = recovered

    def _cache(self, base_offset: int, count: int, frame: bytes) -> None:
        limit = self.config.storage.cache_bytes_max
        if limit == 0:
            return
        self.cache.append((base_offset, count, frame))
        self.cache_bytes += len(frame)
        while self.cache and self.cache_bytes > limit:
            _, _, old = self.cache.popleft()
            self.cache_bytes -= len(old)

    # ------------------------------------------------------------- read
    def handle_ReadRequest(self, msg: ReadRequest) -> None:
        subscription = self.subscriptions.get(msg.subscription)
        if subscription is None or self.wal is None:
            return
        start = msg.start_offset
        log_start = self.wal.log_start_offset
        frames: list[bytes] = []
        if start >= log_start and start < self.committed_offset:
            frames = self._read_cache(start, msg.max_bytes)
            if not frames:
                batch = self.wal.read(start, max_bytes=msg.max_bytes, upto_offset=self.committed_offset)
                frames = _publish_frames(self.topic, batch)
        self.system.tell(subscription.endpoint, ReadResult(
            start_offset=start, frames=frames, log_start_offset=log_start, committed_offset=self.committed_offset))

    def _read_cache(self, start: int, max_bytes: int) -> list[bytes]:
        if not self.cache or start < self.cache[0][0]:
            return []
        frames: list[bytes] = []
        size = 0
        for base, count, frame in self.cache:
            if base + count <= start:
                continue
            frames.append(frame)  # the subscription skips offsets below `start`
            size += len(frame)
            if size >= max_bytes or len(frames) >= _READ_FRAMES_MAX:
                break
        return frames

    # ------------------------------------------------------------- subscriptions
    async def _start_new_subscription(self, msg: cp.Subscribe) -> list[bytes]:
        if msg.start_offset is not None:
            assert self.wal is not None
            if not self.wal.log_start_offset <= msg.start_offset <= self.committed_offset:
                raise InvalidArgument(f"start offset {msg.start_offset} is outside {self.topic}'s log"
                                      f" [{self.wal.log_start_offset}, {self.committed_offset}]")
            start = msg.start_offset
        elif msg.initial_position == cp.InitialPosition.EARLIEST:
            assert self.wal is not None
            start = self.wal.log_start_offset
        else:
            start = self.committed_offset
        await self._spawn_reliable(msg.subscription, msg.sub_type, cursor=start - 1, acked_above=[])
        return []

    async def _spawn_subscription(self, name: str, sub_type: int) -> _Subscription:
        raise AssertionError("reliable subscriptions start through _spawn_reliable")

    async def _spawn_reliable(self, name: str, sub_type: int, *, cursor: int, acked_above: list[int]) -> _Subscription:
        topic, config, parent, broker = self.topic, self.config, self.endpoint, self.broker_endpoint
        endpoint = await self.system.spawn(
            lambda: ReliableSubscriptionActor(topic=topic, name=name, sub_type=sub_type, config=config,
                                              topic_endpoint=parent, broker_endpoint=broker, cursor=cursor,
                                              acked_above=acked_above, committed_offset=self.committed_offset),
            name=f"subscription {topic}:{name}", parent=self.endpoint)
        subscription = _Subscription(endpoint=endpoint, sub_type=sub_type)
        self.subscriptions[name] = subscription
        return subscription

    def _forget_subscription(self, name: str) -> None:
        self.system.tell(self.broker_endpoint, ForgetSubscription(topic=self.topic, subscription=name))


def _publish_frames(topic: str, batch: object) -> list[bytes]:
    """Encoded `Publish` frames for stored records, one per run of one producer."""
    frames: list[bytes] = []
    offsets = batch.offsets  # type: ignore[attr-defined]
    n = len(offsets)
    start = 0
    while start < n:
        producer_id = batch.producer_ids[start]  # type: ignore[attr-defined]
        end = start + 1
        while end < n and batch.producer_ids[end] == producer_id:  # type: ignore[attr-defined]
            end += 1
        keys = batch.keys[start:end]  # type: ignore[attr-defined]
        attributes = batch.attributes[start:end]  # type: ignore[attr-defined]
        frames.append(INTERNAL_PROTOCOL.encode(Publish(
            topic=topic, producer_id=producer_id, producer_name=batch.producer_names[start],  # type: ignore[attr-defined]
            base_offset=offsets[start], payloads=batch.payloads[start:end],  # type: ignore[attr-defined]
            publish_times=batch.publish_times[start:end],  # type: ignore[attr-defined]
            keys=keys if any(k is not None for k in keys) else None,
            attributes=attributes if any(attributes) else None,
            schema_id=batch.schema_ids[start], schema_version=batch.schema_versions[start])))  # type: ignore[attr-defined]
        start = end
    return frames

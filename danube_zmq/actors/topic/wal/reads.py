"""Reads of a reliable topic's log (`WalReads`): for subscriptions that lag behind the
live tail, and for seeks.

5. ReadRequest (a lagging subscription) -> committed records from the cache, else from
   the WAL files, else (older offsets, shared_fs and object_store modes) from a durable
   segment downloaded to `durable-cache/` -> `ReadResult`. The cache holds the recent
   committed batches as the `Publish` frames the subscriptions were told, at most
   `storage.cache_bytes_max`. A `read_compacted` subscription's reads below the
   compaction horizon come from the compacted ledger (`compacting.py`): one run of
   consecutive offsets, or the gap before the next one.
"""

from __future__ import annotations

import asyncio
import logging
import mmap
from collections import deque
from concurrent.futures import Executor
from pathlib import Path
from typing import TYPE_CHECKING

from danube_zmq.actors.topic.storage import TopicPort
from danube_zmq.actors.topic.wal.log import TopicLog
from danube_zmq.config.broker_config import BrokerConfig
from danube_zmq.storage.durable import DurableStore
from danube_zmq.storage.wal import CorruptRecord, RecordBatch, scan
from danube_zmq.storage.wal.compacted import Ledger
from danube_zmq.storage.wal.format import skip_to
from danube_zmq.transport.errors import InvalidArgument
from danube_zmq.transport.internal_protocol import (
    INTERNAL_PROTOCOL,
    DurableSegment,
    Publish,
    ReadRequest,
    ReadResult,
    SegmentFetched,
)

if TYPE_CHECKING:
    from danube_zmq.actors.topic.wal.compacting import WalCompaction

log = logging.getLogger("danube_zmq.topic")

_READ_FRAMES_MAX = 64
# Durable segments kept downloaded (and mapped) per topic for readers of old history.
_FETCHED_SEGMENTS_MAX = 4


class WalReads:
    def __init__(self, *, port: TopicPort, config: BrokerConfig, executor: Executor, topic_log: TopicLog,
                 store: DurableStore | None, cache_dir: Path) -> None:
        self.port = port
        self.topic = port.topic
        self.config = config
        self.executor = executor
        self.topic_log = topic_log
        self.store = store
        self.cache_dir = cache_dir
        # Recent committed batches: (base offset, count, encoded Publish), oldest first.
        self.cache: deque[tuple[int, int, bytes]] = deque()
        self.cache_bytes = 0
        self.fetching: dict[int, list[ReadRequest]] = {}
        self.fetched: dict[int, tuple[Path, mmap.mmap]] = {}
        # Below it, messages past the message TTL (found by `expired_end`): not read again.
        self._expired_end = 0
        self.compaction: WalCompaction  # set by the storage's `bind`


    def close(self) -> None:
        for _, mapped in self.fetched.values():
            mapped.close()
        self.fetched.clear()

    def keep(self, base_offset: int, count: int, frame: bytes) -> None:
        """A committed batch joins the cache."""
        limit = self.config.storage.cache_bytes_max
        if limit == 0:
            return
        self.cache.append((base_offset, count, frame))
        self.cache_bytes += len(frame)
        while self.cache and self.cache_bytes > limit:
            _, _, old = self.cache.popleft()
            self.cache_bytes -= len(old)

    def read(self, msg: ReadRequest) -> None:
        wal = self.topic_log.wal
        if msg.subscription not in self.port.subscription_names or wal is None:
            return
        if msg.compacted and (ledger := self.compaction.ledger) is not None and msg.start_offset < ledger.horizon:
            return self._read_compacted(msg, ledger)
        committed = self.topic_log.committed_offset
        start = msg.start_offset
        frames: list[bytes] = []
        gap_end = 0
        wal_start = wal.log_start_offset
        if wal_start <= start < committed:
            frames = self._read_cache(start, msg.max_bytes)
            if not frames:
                batch = wal.read(start, max_bytes=msg.max_bytes, upto_offset=committed)
                frames = publish_frames(self.topic, batch)
                if not frames:  # offsets an operator's repair gave up: the log goes on after them
                    gap_end = wal.gap_end(start) or 0
        elif start < wal_start:
            segment = next((s for s in self.topic_log.durable if s.end_offset >= start), None)
            if segment is not None and segment.base_offset <= start:
                if segment.base_offset not in self.fetched:
                    return self._fetch(segment, msg)
                batch = self._read_fetched(segment, start, msg.max_bytes)
                frames = publish_frames(self.topic, batch)
            elif start >= self.topic_log.log_start():
                # Offsets a dead owner reserved and never stored: the log goes on at the
                # next durable segment or at the local WAL.
                gap_end = min(segment.base_offset, wal_start) if segment is not None else wal_start
        self.port.tell_subscription(msg.subscription, ReadResult(
            start_offset=start, frames=frames, log_start_offset=self.topic_log.log_start(),
            committed_offset=committed, gap_end=gap_end, purpose=msg.purpose))

    def _read_compacted(self, msg: ReadRequest, ledger: Ledger) -> None:
        start = msg.start_offset
        batch = ledger.read(start, msg.max_bytes)
        frames: list[bytes] = []
        gap_end = 0
        if not batch.offsets:
            gap_end = ledger.horizon  # past the view's last key: the log itself goes on there
        elif batch.offsets[0] > start:
            gap_end = batch.offsets[0]  # keys compaction dropped
        else:
            offsets = batch.offsets
            run = next((i for i in range(1, len(offsets)) if offsets[i] != offsets[i - 1] + 1), len(offsets))
            frames = publish_frames(self.topic, batch.head(run))
        # `log_start_offset` is the request's: a view older than the log is no hole in it.
        self.port.tell_subscription(msg.subscription, ReadResult(
            start_offset=start, frames=frames, log_start_offset=start, committed_offset=self.topic_log.committed_offset,
            gap_end=gap_end, purpose=msg.purpose, compacted=True))

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

    def _fetch(self, segment: DurableSegment, request: ReadRequest) -> None:
        waiting = self.fetching.setdefault(segment.base_offset, [])
        waiting.append(request)
        if len(waiting) > 1:
            return  # already downloading
        store, dest = self.store, self.cache_dir / f"{segment.base_offset:020d}.seg"
        assert store is not None
        port, base = self.port, segment.base_offset

        def download() -> None:
            dest.parent.mkdir(parents=True, exist_ok=True)
            store.fetch(segment.object_key, dest, size_bytes=segment.size_bytes, crc32c=segment.crc32c)

        def done(future: asyncio.Future[None]) -> None:
            error = future.exception()
            port.post(SegmentFetched(base_offset=base, path=None if error else str(dest),
                                     error=None if error is None else f"{type(error).__name__}: {error}"))

        asyncio.get_running_loop().run_in_executor(self.executor, download).add_done_callback(done)

    def segment_fetched(self, msg: SegmentFetched) -> None:
        waiting = self.fetching.pop(msg.base_offset, [])
        if msg.path is None:
            log.error("%s: durable segment %d could not be fetched: %s", self.topic, msg.base_offset, msg.error)
            for request in waiting:  # answer with nothing: the subscription asks again later
                self.port.tell_subscription(request.subscription, ReadResult(
                    start_offset=request.start_offset, frames=[], log_start_offset=self.topic_log.log_start(),
                    committed_offset=self.topic_log.committed_offset, purpose=request.purpose))
            return
        while len(self.fetched) >= _FETCHED_SEGMENTS_MAX:
            oldest = next(iter(self.fetched))
            path, mapped = self.fetched.pop(oldest)
            mapped.close()
            path.unlink(missing_ok=True)
        path = Path(msg.path)
        with open(path, "rb") as file:
            self.fetched[msg.base_offset] = (path, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ))
        for request in waiting:
            self.read(request)

    def _read_fetched(self, segment: DurableSegment, start: int, max_bytes: int) -> RecordBatch:
        path, mapped = self.fetched[segment.base_offset]
        position, offset = skip_to(mapped, offset=segment.base_offset, start_offset=start)
        result = scan(memoryview(mapped)[position:], expected_offset=offset, upto_offset=segment.end_offset + 1,
                      max_bytes=max_bytes)
        if result.fault is not None and len(result.records) == 0:
            raise CorruptRecord(path, position + result.fault.position, result.fault.reason)
        return result.records

    async def resolve_seek(self, offset: int | None, publish_time: int | None) -> int:
        """Where a seek moves a subscription: `offset` if the topic holds it (the committed
        end included: nothing to redeliver, wait for new messages), else INVALID_ARGUMENT
        naming the range; or the first committed message with publish_time >=
        `publish_time`, found by reading the local WAL from its start in 1 MiB steps
        (linear; other actors run between steps), the committed end when there is none.
        History older than the local WAL (durable segments) is not scanned: a time at or
        before the first local message resolves to the log start, which may deliver more
        than asked, never less."""
        topic_log = self.topic_log
        assert topic_log.wal is not None
        log_start = topic_log.log_start()
        if offset is not None:
            if not log_start <= offset <= topic_log.committed_offset:
                raise InvalidArgument(f"offset {offset} is outside {self.topic}'s log: seek to"
                                      f" {log_start}..{topic_log.committed_offset}")
            return offset
        assert publish_time is not None
        local_start = topic_log.wal.log_start_offset
        found = await self._first_published_at(publish_time, local_start)
        return log_start if found == local_start else found

    async def expired_end(self, cutoff_ms: int) -> int | None:
        """Where the messages published before `cutoff_ms` end (message TTL); None: none
        to expire.

        In the local WAL: the first committed offset, from the last end found on, whose
        message was published at or after the cutoff (the committed end when there is
        none). History only in durable segments (a topic moved or restarted in a durable
        mode keeps it there) has no publish time read: a segment uploaded before the
        cutoff (`created_ms`, the broker's clock) holds only messages written before it,
        so it expires whole."""
        topic_log = self.topic_log
        assert topic_log.wal is not None
        local_start = topic_log.wal.log_start_offset
        found = await self._first_published_at(cutoff_ms, max(self._expired_end, local_start))
        if found <= local_start:
            uploaded = [segment.end_offset + 1 for segment in topic_log.durable if segment.created_ms < cutoff_ms]
            found = min(max(uploaded, default=0), local_start)
            if found <= topic_log.log_start():
                return None
        self._expired_end = max(self._expired_end, found)
        return found

    async def _first_published_at(self, publish_time: int, start: int) -> int:
        """The first committed offset from `start` whose message was published at or after
        `publish_time`, read from the local WAL in 1 MiB steps (linear; other actors run
        between steps); the committed end when there is none."""
        topic_log = self.topic_log
        position = start
        while position < topic_log.committed_offset:
            assert topic_log.wal is not None
            batch = topic_log.wal.read(position, max_bytes=1 << 20, upto_offset=topic_log.committed_offset)
            if not batch.offsets:
                break
            for found, published in zip(batch.offsets, batch.publish_times, strict=True):
                if published >= publish_time:
                    return found
            position = batch.offsets[-1] + 1
            await asyncio.sleep(0)
        return topic_log.committed_offset


def publish_frames(topic: str, batch: RecordBatch) -> list[bytes]:
    """Encoded `Publish` frames for stored records, one per run of one producer and schema."""
    frames: list[bytes] = []
    offsets = batch.offsets
    n = len(offsets)
    start = 0
    while start < n:
        producer_id, schema_id, schema_version = batch.producer_ids[start], batch.schema_ids[start], \
            batch.schema_versions[start]
        end = start + 1
        # A producer re-attached with another schema version starts a new run.
        while end < n and batch.producer_ids[end] == producer_id and batch.schema_ids[end] == schema_id \
                and batch.schema_versions[end] == schema_version:
            end += 1
        keys = batch.keys[start:end]
        attributes = batch.attributes[start:end]
        frames.append(INTERNAL_PROTOCOL.encode(Publish(
            topic=topic, producer_id=producer_id, producer_name=batch.producer_names[start],
            base_offset=offsets[start], payloads=batch.payloads[start:end],
            publish_times=batch.publish_times[start:end],
            keys=keys if any(k is not None for k in keys) else None,
            attributes=attributes if any(attributes) else None,
            schema_id=batch.schema_ids[start], schema_version=batch.schema_versions[start])))
        start = end
    return frames

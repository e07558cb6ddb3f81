"""Group commit for a reliable topic (`WalCommit`): batches in, receipts out.

1. Send -> encode the batch as WAL records at `next_offset` (offsets assigned now) and
   queue it for the next flush.
2. Flush (group commit): while one flush runs in a worker thread (write + fsync),
   sends keep queueing; its `FlushDone` starts the next flush with everything queued
   meanwhile: one fsync covers many batches and producers. With `storage.wal_sync:
   always` nothing is acknowledged before its fsync; with `interval`, a flush writes
   without an fsync and `WalSyncDue` (every `wal_sync_interval_ms`; owed while a flush
   runs) fsyncs what was written; a flush starting when the interval has passed syncs
   too, so under load (the timer's message late) the gap stays within the interval
   plus one flush. A flush also writes the cursor checkpoints told since the last one
   (`cursors.py`) and the deduplication table's (`dedup.py`), after its batches.
3. FlushDone -> `committed_offset` moves on -> `SendReceipt` to each producer ->
   one `Publish` per batch to every subscription (they deliver from it when caught
   up) -> the batch joins the in-memory cache of recent committed batches (`reads.py`).
   Offsets are reserved before they are acknowledged: the broker records in the
   metadata store that this topic may give out offsets below `reserved_until`
   (`ReserveOffsets`, a block sized to about two seconds of sends, asked for when half
   of the last is used). Batches past the reservation wait for it; a broker taking the
   topic over from a dead one starts past it, so no acknowledged offset is ever given
   out again. The gap this leaves is skipped by readers (`ReadResult.gap_end`).
   With `storage.seal_every_flush` (durable modes) a receipt waits until its flush's
   segment is in the durable store (`segments.py`).
   With the `deduplication` policy messages sent again are answered, not stored.
4. A write or fsync error fails the batches of that flush and those queued after it
   (RESOURCE_EXHAUSTED for a full disk, INTERNAL otherwise), reopens the log (recovery
   truncates a torn tail) and carries on from its end; nothing unwritten is
   acknowledged and reads keep working.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import errno
import itertools
import logging
import time
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from danube_zmq.actors.metrics import METRICS
from danube_zmq.actors.topic.storage import TopicPort
from danube_zmq.actors.topic.wal.cursors import WalCursors
from danube_zmq.actors.topic.wal.dedup import WalDedup
from danube_zmq.actors.topic.wal.log import TopicLog
from danube_zmq.actors.topic.wal.reads import WalReads, publish_frames
from danube_zmq.actors.topic.wal.writer import timed_sync, to_loop, write_flush
from danube_zmq.config.broker_config import BrokerConfig
from danube_zmq.storage.wal import WalLog, encode_batch
from danube_zmq.transport import client_protocol as cp
from danube_zmq.transport.common import Error
from danube_zmq.transport.errors import ErrorCode, Unavailable
from danube_zmq.transport.internal_protocol import (
    INTERNAL_PROTOCOL,
    AppendInternal,
    ClientRequest,
    FlushDone,
    OffsetsReserved,
    Publish,
    ReserveOffsets,
    WalSyncDue,
)

if TYPE_CHECKING:
    from danube_zmq.actors.topic.wal.quota import BacklogQuota
    from danube_zmq.actors.topic.wal.segments import DurableSegments

log = logging.getLogger("danube_zmq.topic")

_BROKER_PRODUCER_ID = 0
# Offsets reserved at a time: about two seconds of the topic's recent send rate, within
# these bounds (the gap a broker taking over from a dead one leaves is at most one block).
_RESERVE_MIN = 4096
_RESERVE_MAX = 1 << 22
_RESERVE_AHEAD_S = 2.0
# Flush ids are unique in the process, rising: a `FlushDone` below this instance's first
# id is for a flush of the instance a restart replaced (its stop waited for the write;
# a subscription's creation checkpoint can be in flight then), not a broken count.
_FLUSH_IDS = itertools.count(1)


@dataclass(slots=True)
class _Batch:
    """One producer batch between encoding and acknowledgement."""

    encoded: bytes
    publish: Publish
    identity: bytes | None  # None: appended by the broker itself (dead letters)
    request_id: int
    sequence: int | None = None  # the producer's batch number (`Send.sequence`)
    sequence_ids: list[int] | None = None  # its messages' (`Send.sequence_ids`), stored with them
    prefix_offsets: list[int] | None = None  # where its leading duplicates were stored: the receipt's start
    # time.perf_counter() when the topic accepted it: the receipt's latency metric. A
    # measurement, not a decision, so the real clock (the injected one counts whole ms).
    accepted_s: float = 0.0


class WalCommit:
    # Set by `WalStorage.bind`: each calls the other (a commit grows the backlog, which
    # accepts held sends; a receipt waits for its segment in the durable store).
    quota: BacklogQuota
    segments: DurableSegments

    def __init__(self, *, port: TopicPort, config: BrokerConfig, executor: Executor, topic_log: TopicLog,
                 reads: WalReads, cursors: WalCursors, dedup: WalDedup, wal_dir: Path, start_offset: int | None,
                 durable_mode: bool) -> None:
        self.port = port
        self.topic = port.topic
        self.config = config
        self.executor = executor
        self.topic_log = topic_log
        self.reads = reads
        self.cursors = cursors
        self.dedup = dedup
        self._dedup_checkpoint = False  # the flush in flight carries the `#dedup` checkpoint
        self.wal_dir = wal_dir
        # Where the topic's previous owner stopped (the broker read it from the metadata
        # store): offsets continue from there, never below.
        self.start_offset = start_offset
        self.durable_mode = durable_mode
        self.next_offset = 0  # the offset the next accepted batch gets: the log's end at start
        # seal_every_flush: a receipt waits until its flush's segment is in the durable
        # store (uploaded, its descriptor committed by a Raft majority), so an owner cut
        # off from the majority acknowledges nothing a successor could not read (chaos
        # B4 lost receipts answered at the local fsync, during the partition).
        self.ack_when_durable = durable_mode and config.storage.seal_every_flush
        self.queued: list[_Batch] = []
        self.flushing: list[_Batch] = []
        self.flush_id = self.first_flush_id = next(_FLUSH_IDS)
        self.failed_flushes = 0
        self.flush_future: concurrent.futures.Future[None] | None = None  # the write of the flush in flight
        # From a flush's start to its FlushDone. Not read off what the flush carries: a seek
        # takes its checkpoint out of the flush in flight, which may then carry nothing.
        self._awaiting_done = False
        self._sync_always = config.storage.wal_sync == "always"
        # Interval mode: a `WalSyncDue` came while a flush held the WAL; the sync runs as
        # soon as that flush is done, so under load it is late by one flush, never skipped.
        self._sync_owed = False
        # And a flush fsyncs itself once the interval has passed since the last sync: at
        # full rate the topic's mailbox is full of sends, so the timer's message can come
        # late or not at all (a periodic message finding the mailbox full is dropped).
        self._synced_at_ms = 0
        self._sync_interval_ms = config.storage.wal_sync_interval_ms
        self.reserved_until = 0  # nothing at or above is committed before the broker reserves it
        self.reserving = 0  # the `until` asked for and not answered yet (0: none)
        self.reserve_block = _RESERVE_MIN
        self.reserve_since = (0, 0)  # (next_offset, monotonic ms) when the last block was asked for

    async def open(self) -> None:
        """Open the log: a topic whose local WAL is gone (a new disk, a move) resumes
        after its durable history, or where its previous owner stopped."""
        self.ack_latency = METRICS.produce_ack_latency.labels(topic=self.topic)  # after the shell's label
        durable = self.topic_log.durable
        floors = [durable[-1].end_offset + 1] if durable else []
        if self.start_offset is not None:
            floors.append(self.start_offset)
        wal = self.topic_log.wal = await self._open_wal(max(floors) if floors else None)
        self.next_offset = self.topic_log.committed_offset = wal.next_offset
        self._synced_at_ms = self.port.clock.monotonic_ms()  # what recovery kept is synced
        self._reserve_ahead()

    def start_sync_timer(self) -> None:
        if not self._sync_always:
            self.port.schedule_periodic(self.config.storage.wal_sync_interval_ms, WalSyncDue())

    def seal(self) -> int:
        # Its log is the topic's record: the next owner reads where it ends.
        return self.next_offset

    # ------------------------------------------------------------- produce
    def accept(self, req: ClientRequest, msg: cp.Send) -> None:
        port = self.port
        producer = port.attached_producer(msg.producer_id, req.identity)
        sequence = msg.sequence
        if sequence is not None:
            expected = producer.next_sequence
            if expected is not None and sequence > expected:
                raise Unavailable(f"topic {self.topic}: batch {sequence} of producer '{producer.name}' follows batch"
                                  f" {expected}, which was refused or has not come yet; send from batch {expected} again")
            producer.next_sequence = sequence + 1 if expected is None else max(expected, sequence + 1)
        schema_id, schema_version = port.schema_of(producer, msg)
        prefix = None
        if msg.sequence_ids is not None:
            fresh, prefix = self.dedup.admit(producer.name, msg)
            if fresh is None:
                self.dedup.answer(req.identity, msg, prefix or [])
                return
            msg = fresh
        self._enqueue(Publish(
            topic=self.topic, producer_id=msg.producer_id, producer_name=producer.name, base_offset=self.next_offset,
            payloads=msg.payloads, publish_times=msg.publish_times, keys=msg.keys, attributes=msg.attributes,
            schema_id=schema_id, schema_version=schema_version), req.identity, msg.request_id, sequence=sequence,
            sequence_ids=msg.sequence_ids, prefix_offsets=prefix)


    def _refused(self, batch: _Batch) -> None:
        """A producer's batch accepted earlier is refused: its later batches are refused
        until it is sent again, so that none lands before it."""
        producer = self.port.producers.get(batch.publish.producer_id)
        if producer is not None and batch.sequence is not None and producer.next_sequence is not None:
            producer.next_sequence = min(producer.next_sequence, batch.sequence)

    def append_internal(self, msg: AppendInternal) -> None:
        self._enqueue(Publish(
            topic=self.topic, producer_id=_BROKER_PRODUCER_ID, producer_name=msg.producer_name,
            base_offset=self.next_offset, payloads=msg.payloads, publish_times=msg.publish_times, keys=msg.keys,
            attributes=msg.attributes), None, 0)

    def _enqueue(self, publish: Publish, identity: bytes | None, request_id: int, *, start: bool = True,
                 sequence: int | None = None, sequence_ids: list[int] | None = None,
                 prefix_offsets: list[int] | None = None) -> None:
        count = len(publish.payloads)
        encoded = encode_batch(publish.base_offset, publish.payloads, publish.publish_times, publish.producer_id,
                               publish.producer_name, keys=publish.keys, attributes=publish.attributes,
                               schema_id=publish.schema_id, schema_version=publish.schema_version,
                               sequence_ids=sequence_ids)
        self.next_offset += count
        self.port.count_in(count, cp.batch_bytes(publish.payloads, publish.keys, publish.attributes))
        self.queued.append(_Batch(encoded, publish, identity, request_id, sequence, sequence_ids, prefix_offsets,
                                  time.perf_counter()))
        if self.next_offset > self.reserved_until - self.reserve_block // 2:
            self._reserve_ahead()
        if start and not self.in_flight() and self.next_offset <= self.reserved_until:
            self.start_flush()

    # ------------------------------------------------------------- offset reservations
    def _reserve_ahead(self) -> None:
        """Ask the broker for the next block of offsets (one request at a time), sized
        to the rate since the last block was asked for."""
        if self.reserving:
            return
        now = self.port.clock.monotonic_ms()
        since_offset, since_ms = self.reserve_since
        if since_ms and now > since_ms:
            rate = (self.next_offset - since_offset) * 1000 / (now - since_ms)
            wanted = max(_RESERVE_MIN, min(_RESERVE_MAX, int(rate * _RESERVE_AHEAD_S)))
            self.reserve_block = 1 << (wanted - 1).bit_length()
        self.reserve_since = (self.next_offset, now)
        self.reserving = max(self.next_offset, self.reserved_until) + self.reserve_block
        self.port.tell_broker(ReserveOffsets(topic=self.topic, until=self.reserving))

    def retry_reservation(self) -> None:
        """The retention timer: an earlier reservation failed; the broker's own batches wait."""
        if self.queued and self.next_offset > self.reserved_until:
            self._reserve_ahead()

    def offsets_reserved(self, msg: OffsetsReserved) -> None:
        self.reserving = 0
        if msg.error is not None:
            log.error("%s: offsets not reserved (%s); %d waiting batches refused", self.topic, msg.error,
                      len(self.queued))
            self._refuse_queued(ErrorCode.UNAVAILABLE, f"topic {self.topic}: offsets could not be reserved in the"
                                                       f" metadata store ({msg.error}); send again")
            return
        self.reserved_until = max(self.reserved_until, msg.until)
        if self.queued and not self.in_flight() and self.next_offset <= self.reserved_until:
            self.start_flush()
        if self.next_offset > self.reserved_until - self.reserve_block // 2:
            self._reserve_ahead()

    def _refuse_queued(self, code: int, message: str) -> None:
        """Answer the producers' batches not yet flushing with an error and take their
        offsets back; the broker's own (dead letters) stay queued for the next try."""
        if not self.queued:
            return
        self.next_offset = self.queued[0].publish.base_offset
        queued, self.queued = self.queued, []
        self.dedup.rollback(self.flushing)
        for batch in queued:
            publish = batch.publish
            if batch.identity is None:
                self._enqueue(dataclasses.replace(publish, base_offset=self.next_offset), None, 0, start=False)
            else:
                self._refused(batch)
                self.port.reply(batch.identity, Error(request_id=batch.request_id, code=code, message=message))

    # ------------------------------------------------------------- flush
    def in_flight(self) -> bool:
        """A flush (of batches, checkpoints or both) is running: its FlushDone is to come."""
        return self._awaiting_done

    def start_flush(self) -> None:
        cursors = self.cursors
        assert not self._awaiting_done and (self.queued or cursors.pending_checkpoints or self.dedup.owed)
        assert self.topic_log.wal is not None
        self.flushing, self.queued = self.queued, []
        # After this flush's batches: a cursor is never durable before what it covers.
        checkpoints, settled, publish, published = cursors.take_flush()
        dedup = self.dedup.checkpoint()
        self._dedup_checkpoint = dedup is not None
        if dedup is not None:
            checkpoints = [*checkpoints, dedup]
        self.flush_id = next(_FLUSH_IDS)
        self._awaiting_done = True
        flush_id, wal, sync = self.flush_id, self.topic_log.wal, self._sync_always or self._sync_in_flush()
        seal = self.durable_mode and self.config.storage.seal_every_flush
        chunks = [(b.encoded, len(b.publish.payloads)) for b in self.flushing]
        port = self.port

        def done(written: concurrent.futures.Future[None]) -> None:
            error = written.exception()
            if error is None:
                msg = FlushDone(flush_id=flush_id)
            else:
                code = ErrorCode.RESOURCE_EXHAUSTED if isinstance(error, OSError) and error.errno == errno.ENOSPC \
                    else ErrorCode.INTERNAL
                msg = FlushDone(flush_id=flush_id, error_code=code, error_message=f"{type(error).__name__}: {error}")
            # The completion must reach the actor even when its mailbox is momentarily full.
            port.post(msg)

        # The write thread hands its outcome straight to the loop: through
        # `run_in_executor` it went to an asyncio future whose callbacks ran a loop turn
        # later, then to the mailbox (two turns between the fsync and the receipts).
        loop = asyncio.get_running_loop()
        future = self.executor.submit(write_flush, wal, chunks, checkpoints, settled, sync, seal, publish, published,
                                      self.topic)
        future.add_done_callback(lambda written: to_loop(loop, done, written))
        self.flush_future = future

    async def sync_due(self) -> None:
        """Interval mode's periodic fsync (`WalSyncDue`). While a flush is writing (the
        WAL belongs to the flush's thread until its `FlushDone`) it is owed, and runs
        when that flush is done, before the next one starts: at full rate, when a flush
        is nearly always running, the gap between fsyncs stays within the interval plus
        one flush (skipping it let the gap grow to seconds)."""
        if self.in_flight():
            self._sync_owed = True
            return
        self._sync_owed = False
        self._synced_at_ms = self.port.clock.monotonic_ms()
        if self.topic_log.wal is not None:
            try:
                await asyncio.get_running_loop().run_in_executor(self.executor, timed_sync, self.topic_log.wal)
            except OSError as exc:
                # Interval mode already acknowledged these records: the weaker promise
                # it documents. Say so loudly; the next flush retries the sync.
                log.error("%s: periodic WAL fsync failed (%s); acknowledged records may not be durable",
                          self.topic, exc)

    def _sync_in_flush(self) -> bool:
        """Interval mode: whether the flush starting now fsyncs (the interval has passed
        since the last sync)."""
        now = self.port.clock.monotonic_ms()
        if now - self._synced_at_ms < self._sync_interval_ms:
            return False
        self._synced_at_ms = now
        return True

    async def flush_done(self, msg: FlushDone) -> None:
        if msg.flush_id < self.first_flush_id:
            return  # the replaced instance's: what it wrote is in the WAL this one recovered
        assert msg.flush_id == self.flush_id and self.in_flight(), (msg.flush_id, self.flush_id)
        self._awaiting_done = False
        cursors = self.cursors
        batches, self.flushing = self.flushing, []
        checkpoints, store = cursors.end_flush()
        receipts = False
        if msg.error_code is not None:
            cursors.flush_failed(checkpoints, store)
            if self._dedup_checkpoint:
                self.dedup.checkpoint_failed()
            await self._flush_failed(batches, msg)
        else:
            cursors.to_store(store)
            receipts = self._committed(batches)
            self.segments.report_sealed()
            cursors.tail_published()
        if self._sync_owed and not self.in_flight():
            await self.sync_due()
        if self.queued and not self.in_flight() and self.next_offset <= self.reserved_until:
            self.start_flush()
        elif cursors.pending_checkpoints and not self.in_flight() and not self.queued:
            self.start_flush()
        if msg.error_code is None:
            if receipts:
                # The gateway's turn first: the receipts leave before the subscriptions
                # deal the batches (a producer waits on its receipt to send its next
                # batch: at 5k msg/s, produce-ack p50 2.1 -> 1.8 ms).
                await asyncio.sleep(0)
            tell_subscriptions = self.port.tell_subscriptions
            for batch in batches:
                # A subscription that misses this notice reads the records from the log.
                tell_subscriptions(batch.publish)

    def _committed(self, batches: list[_Batch]) -> bool:
        """The batches written: offsets committed, receipts to their producers (or held
        for durability), the cache fed. True when a receipt was sent."""
        METRICS.wal_flushes.inc()
        METRICS.wal_records.inc(sum(len(b.publish.payloads) for b in batches))
        size = sum(len(b.encoded) for b in batches)
        METRICS.wal_bytes.inc(size)
        now_s = time.perf_counter()
        receipts = False
        topic_log, reply, keep = self.topic_log, self.port.reply, self.reads.keep
        dedup = self.dedup
        for batch in batches:
            publish = batch.publish
            count = len(publish.payloads)
            assert publish.base_offset == topic_log.committed_offset, (publish.base_offset, topic_log.committed_offset)
            topic_log.committed_offset += count
            if batch.sequence_ids is not None:
                dedup.committed(publish.producer_name, batch.sequence_ids, publish.base_offset)
            if batch.identity is not None:
                offsets = [*(batch.prefix_offsets or ()), *range(publish.base_offset, publish.base_offset + count)]
                if self.ack_when_durable:
                    self.segments.hold_receipt(publish.base_offset, publish.base_offset + count - 1,
                                               batch.identity, batch.request_id, publish.producer_id,
                                               batch.accepted_s, None if batch.prefix_offsets is None else offsets)
                else:
                    reply(batch.identity, cp.SendReceipt(
                        request_id=batch.request_id, producer_id=publish.producer_id, offsets=offsets))
                    self.ack_latency.observe(now_s - batch.accepted_s)
                    receipts = True
            keep(publish.base_offset, count, INTERNAL_PROTOCOL.encode(publish))
        self.quota.committed(size)
        return receipts

    async def _flush_failed(self, batches: list[_Batch], msg: FlushDone) -> None:
        self.failed_flushes += 1
        failed = batches + self.queued
        self.queued = []
        log.error("%s: WAL flush failed (%s); %d batches refused", self.topic, msg.error_message, len(failed))
        reason = "disk full" if msg.error_code == ErrorCode.RESOURCE_EXHAUSTED else "write failed"
        retry_internal = []
        for batch in failed:
            if batch.identity is None:
                retry_internal.append(batch)  # dead letters: the broker's own, kept and retried
            else:
                if msg.error_code == ErrorCode.RESOURCE_EXHAUSTED:
                    self._refused(batch)  # the producer sends it again (INTERNAL is final: not waited for)
                self.port.reply(batch.identity, Error(
                    request_id=batch.request_id, code=msg.error_code or ErrorCode.INTERNAL,
                    message=f"topic {self.topic}: {reason}, the messages may not have been stored"
                            f" ({msg.error_message})"))
        wal = self.topic_log.wal
        assert wal is not None
        if wal.writable:
            recovered = wal.next_offset  # the worker cut back to the last good fsync
        else:
            recovered = await self._reopen_wal()
        if recovered > self.topic_log.committed_offset:
            # Records fsynced in this flush before it failed (a roll syncs the segment it
            # seals): stored, readable, never acknowledged; the producer retries.
            assert self.topic_log.wal is not None
            read = self.topic_log.wal.read(self.topic_log.committed_offset, max_bytes=1 << 30, upto_offset=recovered)
            for frame in publish_frames(self.topic, read):
                self.port.tell_subscriptions(frame)
            self.dedup.replay(read)
        self.next_offset = self.topic_log.committed_offset = recovered
        self.dedup.rollback([])
        for batch in retry_internal:
            publish = batch.publish
            self._enqueue(Publish(
                topic=self.topic, producer_id=publish.producer_id, producer_name=publish.producer_name,
                base_offset=self.next_offset, payloads=publish.payloads, publish_times=publish.publish_times,
                keys=publish.keys, attributes=publish.attributes), None, 0, start=False)

    async def _reopen_wal(self) -> int:
        """The active segment is unusable (even the rollback failed): reopen the log, whose
        recovery fsyncs what it keeps."""
        topic_log = self.topic_log
        assert topic_log.wal is not None
        wal, topic_log.wal = topic_log.wal, None
        try:
            await asyncio.get_running_loop().run_in_executor(self.executor, wal.close)
        except OSError:
            log.exception("%s: closing the failed WAL", self.topic)
        topic_log.wal = await self._open_wal(None)
        return topic_log.wal.next_offset

    async def _open_wal(self, start_offset: int | None) -> WalLog:
        storage = self.config.storage
        return await asyncio.to_thread(
            WalLog.open, self.wal_dir, segment_bytes_max=storage.wal_segment_bytes_max,
            segment_age_ms_max=storage.wal_segment_age_ms_max, clock=self.port.clock, start_offset=start_offset)

    def dedup_tick(self) -> None:
        """The retention tick: the deduplication table of an idle topic is written (no
        flush came to carry it)."""
        if self.dedup.tick() and not self.in_flight() and not self.queued and self.topic_log.wal is not None:
            self.start_flush()

    def refuse_unacknowledged(self, state: str) -> None:
        """The topic stops (`state`: moved, restarted, closed): the batches not yet
        acknowledged are answered now rather than left to the client's timeout: it sends
        them again (a batch written just before the stop may then be stored twice: at
        least once, never lost)."""
        for batch in self.flushing + self.queued:
            if batch.identity is not None:
                self.port.reply(batch.identity, Error(
                    request_id=batch.request_id, code=ErrorCode.UNAVAILABLE,
                    message=f"topic {self.topic} {state} before this batch was acknowledged; send it again"))
        self.flushing, self.queued = [], []


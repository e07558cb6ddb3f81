"""Producer deduplication on a reliable topic's WAL (`WalDedup`): the topic's
`DedupTable` (`actors/topic/dedup.py`), made from the log when the `deduplication`
policy is on, fed by each commit, and written back as the `#dedup` checkpoint.

- On: the first batch (or producer) after the policy turned on builds the table from
  the newest `#dedup` checkpoint (the table as of its `as_of` offset) and the records
  the local log holds after it, plus the last `window` records before it (for the
  offsets a duplicate is answered with). The records carry their ids whether the policy
  is on or not, so a table made later knows what was stored meanwhile.
- A flush after a commit that changed the table carries its checkpoint, after the
  flush's batches (as cursors: never durable ahead of the records it covers); an idle
  topic writes it at the next retention tick. So the newest checkpoint is at most a
  flush (or a tick) behind the log, and recovery reads only that much past it.
- Off: the table is dropped and a deletion marker written, so a later start never
  takes an old table over records stored while the policy was off.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from concurrent.futures import Executor
from pathlib import Path
from typing import TYPE_CHECKING

from danube_zmq.actors.metrics import METRICS
from danube_zmq.actors.topic.dedup import DedupTable
from danube_zmq.actors.topic.storage import TopicPort
from danube_zmq.config.broker_config import BrokerConfig
from danube_zmq.storage.durable import DurableStore
from danube_zmq.storage.wal import CorruptRecord, RecordBatch, scan, segment_file_name
from danube_zmq.storage.wal.checkpoints import DEDUP_CHECKPOINT
from danube_zmq.transport import client_protocol as cp
from danube_zmq.transport.errors import DanubeError
from danube_zmq.transport.internal_protocol import DurableSegment

if TYPE_CHECKING:
    from danube_zmq.actors.topic.wal.commit import _Batch
    from danube_zmq.actors.topic.wal.log import TopicLog
    from danube_zmq.actors.topic.wal.segments import DurableSegments

log = logging.getLogger("danube_zmq.topic")

_READ_BYTES = 8 << 20  # per read while rebuilding the table


class WalDedup:
    segments: DurableSegments  # set by `WalStorage.bind`: a receipt may wait for its segment

    def __init__(self, *, port: TopicPort, config: BrokerConfig, topic_log: TopicLog, store: DurableStore | None,
                 executor: Executor, cache_dir: Path) -> None:
        self.port = port
        self.topic = port.topic
        policies = config.policies
        self.window = policies.deduplication_window
        self.producers_max = policies.deduplication_producers_max
        self.inactivity_ms = policies.deduplication_producer_inactivity_s * 1000
        self.topic_log = topic_log
        self.store = store  # durable modes: a topic moved here finds its table in the newest segments
        self.executor = executor
        self.cache_dir = cache_dir
        self.ack_when_durable = store is not None and config.storage.seal_every_flush
        self.table: DedupTable | None = None
        self._marker_owed = False  # the policy went off: a deletion marker is to be written

    def current(self) -> DedupTable | None:
        """The table while the policy is on (made from the log the first time), else None."""
        if not self.port.policies.deduplication:
            if self.table is not None:
                self.table = None
                self._marker_owed = True
                log.info("%s: deduplication off: the table of sequence ids is dropped", self.topic)
            return None
        if self.table is None:
            self.table = self._from_log()
            self._marker_owed = False
        return self.table

    def admit(self, producer_name: str, msg: cp.Send) -> tuple[cp.Send | None, list[int] | None]:
        """(the batch to store, the offsets its leading duplicates were stored at): the
        batch whole when the topic does not deduplicate or none was sent before, None
        when all were. Raises for ids that do not increase, or a duplicate of a batch
        still being written (Unavailable: sent again, it is answered)."""
        ids = msg.sequence_ids
        table = self.current()
        if table is None or ids is None:
            return msg, None
        duplicates = table.duplicates(producer_name, ids)
        prefix = None
        if duplicates:
            METRICS.duplicates.labels(topic=self.topic).inc(duplicates)
            prefix = table.offsets_of(producer_name, ids[:duplicates])
            if duplicates == len(ids):
                return None, prefix
            msg = _without_first(msg, duplicates)
        evicted = table.evicted
        table.pushed(producer_name, ids[-1], self.port.clock.now_ms())
        if table.evicted != evicted:  # a new name past deduplication_producers_max
            log.warning("%s: deduplication table full (%d producer names, policies.deduplication_producers_max):"
                        " the least recently active name is forgotten; its resends are stored again",
                        self.topic, self.producers_max)
        return msg, prefix

    def answer(self, identity: bytes, msg: cp.Send, offsets: list[int]) -> None:
        """Every message of the batch was stored before: its receipt names where. With
        `seal_every_flush` it waits, as the first receipt did, until they are durable."""
        stored = [offset for offset in offsets if offset >= 0]
        if self.ack_when_durable and stored:
            self.segments.hold_receipt(min(stored), max(stored), identity, msg.request_id, msg.producer_id,
                                       time.perf_counter(), offsets)
        else:
            self.port.reply(identity, cp.SendReceipt(request_id=msg.request_id, producer_id=msg.producer_id,
                                                     offsets=offsets))

    def rollback(self, in_flight: list[_Batch]) -> None:
        """Batches were refused: their ids count as sent no more (they are sent again);
        those of the batches still `in_flight` do."""
        if self.table is not None:
            self.table.rollback((b.publish.producer_name, b.sequence_ids[-1]) for b in in_flight if b.sequence_ids)

    def committed(self, producer_name: str, ids: list[int], base_offset: int) -> None:
        if self.table is not None:
            self.table.persisted(producer_name, ids, base_offset, self.port.clock.now_ms())

    def replay(self, records: RecordBatch) -> None:
        """Records a failed flush left in the log (never acknowledged, read as stored)."""
        if self.table is not None:
            self.table.replay(records.producer_names, records.sequence_ids, records.offsets,
                              self.port.clock.now_ms())

    def tick(self) -> bool:
        """The retention tick: the policy's change is taken, producers gone past the
        inactivity timeout are forgotten. True: a checkpoint waits for a flush."""
        self.current()
        self._expire({p.name for p in self.port.producers.values()})
        return self.owed

    def checkpoint(self) -> tuple[str, bytes | None] | None:
        """The `#dedup` checkpoint a flush starting now carries (None: nothing new)."""
        if self._marker_owed:
            self._marker_owed = False
            return (DEDUP_CHECKPOINT, None)
        table = self.table
        if table is None or not table.changed:
            return None
        return (DEDUP_CHECKPOINT, table.encode(self.topic_log.committed_offset))

    def checkpoint_failed(self) -> None:
        """The flush carrying it failed: written again with the next one."""
        if self.table is not None:
            self.table.changed = True
        elif not self.port.policies.deduplication:
            self._marker_owed = True

    @property
    def owed(self) -> bool:
        """A checkpoint waits for a flush (an idle topic starts one at its tick)."""
        return self._marker_owed or (self.table is not None and self.table.changed)

    def _expire(self, attached: set[str]) -> None:
        table = self.table
        if table is not None:
            gone = table.expire(self.port.clock.now_ms(), attached)
            if gone:
                log.info("%s: deduplication forgets %d producers silent for %d s: %s", self.topic, len(gone),
                         self.inactivity_ms // 1000, ", ".join(sorted(gone)[:10]))

    async def load(self) -> None:
        """At the topic's start, with the policy on: the table from the log. In durable
        modes, where the local WAL holds no table (a move, a failover, a new disk), from
        the newest durable segments too: the table moved with the topic."""
        if not self.port.policies.deduplication:
            return
        wal = self.topic_log.wal
        durable = self.topic_log.durable
        carried = None
        if (self.store is not None and wal is not None and wal.topic_checkpoint(DEDUP_CHECKPOINT) is None
                and durable and durable[-1].base_offset < wal.log_start_offset):
            store, cache_dir, window = self.store, self.cache_dir, self.window
            try:
                carried = await asyncio.get_running_loop().run_in_executor(
                    self.executor, lambda: durable_tail(store, durable, cache_dir, window))
            except (OSError, DanubeError, ValueError) as exc:
                log.error("%s: the durable segments' deduplication table is unreadable (%s); the table is made"
                          " from the local WAL only", self.topic, exc)
        self.table = self._from_log(carried)

    def _from_log(self, carried: tuple[bytes | None, list[RecordBatch]] | None = None) -> DedupTable:
        """The table from the newest checkpoint and the records after it (and the last
        `window` before it) that the local log holds, after those `carried` in from the
        durable store (its newest checkpoint, and the records of its newest segments)."""
        table = DedupTable(window=self.window, producers_max=self.producers_max, inactivity_ms=self.inactivity_ms)
        wal = self.topic_log.wal
        if wal is None:
            return table
        now_ms = self.port.clock.now_ms()
        end = self.topic_log.committed_offset
        state = wal.topic_checkpoint(DEDUP_CHECKPOINT)
        replayed = 0
        if carried is not None:
            state = state or carried[0]
            for records in carried[1]:
                table.replay(records.producer_names, records.sequence_ids, records.offsets, now_ms)
                replayed += len(records)
        as_of, entries = end, {}
        if state is not None:
            try:
                as_of, entries = DedupTable.decode(state)
            except ValueError as exc:
                log.error("%s: %s; the table is made from the log's last %d records only", self.topic, exc,
                          self.window)
        start = max(wal.log_start_offset, min(as_of, end - self.window), 0)
        try:
            while start < end:
                batch = wal.read(start, max_bytes=_READ_BYTES, upto_offset=end)
                if not batch.offsets:
                    break
                table.replay(batch.producer_names, batch.sequence_ids, batch.offsets, now_ms)
                replayed += len(batch.offsets)
                start = batch.offsets[-1] + 1
        except (DanubeError, OSError) as exc:
            log.error("%s: deduplication table: the log from offset %d is unreadable (%s); the table holds what"
                      " was read before it", self.topic, start, exc)
        table.restore(entries, now_ms)
        table.changed = True  # written with the next flush: the next start reads from here
        log.info("%s: deduplication on: %d producers known (checkpoint as of offset %s, %d records read)",
                 self.topic, len(table), as_of if state is not None else "none", replayed)
        return table


def durable_tail(store: DurableStore, durable: list[DurableSegment], cache_dir: Path,
                 window: int) -> tuple[bytes | None, list[RecordBatch]]:
    """(the newest `#dedup` checkpoint, the records to replay) from the newest durable
    segments: the newest, and the one before it while the checkpoint's `as_of` or the
    last `window` records lie there (a roll carries the table at most a flush behind)."""
    state: bytes | None = None
    found: list[RecordBatch] = []
    need = durable[-1].end_offset + 1 - window
    for segment in reversed(durable[-2:]):
        path = cache_dir / "dedup" / segment_file_name(segment.base_offset)
        store.fetch(segment.object_key, path, size_bytes=segment.size_bytes, crc32c=segment.crc32c)
        try:
            result = scan(path.read_bytes(), expected_offset=segment.base_offset)
        finally:
            path.unlink(missing_ok=True)
        if result.fault is not None:
            raise CorruptRecord(str(path), result.fault.position, f"{result.fault.kind}: {result.fault.reason}")
        found.insert(0, result.records)
        if state is None:
            tables = [c.state for c in result.checkpoints if c.subscription == DEDUP_CHECKPOINT]
            state = tables[-1] if tables else None
        as_of = DedupTable.decode(state)[0] if state is not None else need
        if min(as_of, need) >= segment.base_offset:
            break
    return state, found


def _without_first(msg: cp.Send, count: int) -> cp.Send:
    """The batch without its first `count` messages (sent before: deduplicated)."""
    return dataclasses.replace(
        msg, payloads=msg.payloads[count:], publish_times=msg.publish_times[count:],
        keys=None if msg.keys is None else msg.keys[count:],
        attributes=None if msg.attributes is None else msg.attributes[count:],
        sequence_ids=None if msg.sequence_ids is None else msg.sequence_ids[count:])

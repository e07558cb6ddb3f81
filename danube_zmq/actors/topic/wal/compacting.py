"""Compaction of a reliable topic (`WalCompaction`): the latest message per key, kept
in a ledger file beside the WAL, read by `read_compacted` subscriptions and readers.

10. `CompactTopicNow` (an admin's `CompactTopic`), or the retention timer's `Tick` once
    the log holds `compaction_threshold_bytes` past the last horizon (a topic policy,
    Pulsar's compactionThreshold) -> the horizon is the committed end;
    a worker thread (`compactor.compact`) reads the previous ledger and the log from
    that ledger's horizon (the local WAL, else the durable segments, downloaded) up to
    the horizon, twice (Pulsar's two phases), and writes `{horizon}.compacted`
    (`storage/wal/compacted.py`). The topic goes on taking sends and serving reads
    meanwhile: only committed records are read, the WAL's reads are thread-safe, and
    retention is held off (a pin, as a snapshot's) so the files it reads stay.
    `CompactionFinished` -> the new ledger replaces the old one, which is deleted.
    The newest ledger is opened at start (its records' CRCs checked: damage is an
    error in the log and in `topics describe`, never silent).
    Durable modes (`ledger_store.py`): the compaction's thread uploads the new ledger
    under the topic's prefix before the compaction is done, and a topic starting on
    another broker (a move, a failover, a new disk) downloads the store's newest, so
    the view survives them. storage.mode local: a move hands the newest ledger over
    with the WAL (`storage/wal/handover.py`).
"""

from __future__ import annotations

import asyncio
import logging
import mmap
import shutil
import tempfile
from collections.abc import Callable
from concurrent.futures import Executor
from pathlib import Path

from danube_zmq.actors.topic.storage import TopicPort
from danube_zmq.actors.topic.wal.compactor import CompactionResult, compact
from danube_zmq.actors.topic.wal.ledger_store import (
    SCRATCH_PREFIX,
    fetch_newer_ledger,
    publish_ledger,
    publish_new_ledger,
)
from danube_zmq.actors.topic.wal.log import TopicLog
from danube_zmq.actors.topic.wal.retention import WalRetention
from danube_zmq.config.broker_config import BrokerConfig
from danube_zmq.storage.durable import DurableStore
from danube_zmq.storage.wal import CorruptRecord, RecordBatch, WalLog, scan
from danube_zmq.storage.wal.compacted import Ledger, ledgers_in, remove_ledgers_except
from danube_zmq.storage.wal.format import skip_to
from danube_zmq.transport.errors import DanubeError, FailedPrecondition
from danube_zmq.transport.internal_protocol import CompactionFinished, DurableSegment

log = logging.getLogger("danube_zmq.topic")

# The retention pin a compaction holds (snapshot pins are positive ids).
_PIN = -1
_PIN_MS = 1 << 62


class _Aborted(Exception):
    """The topic stops: the compaction thread gives up at its next read."""


class WalCompaction:
    def __init__(self, *, port: TopicPort, config: BrokerConfig, executor: Executor, topic_log: TopicLog,
                 retention: WalRetention, wal_dir: Path, store: DurableStore | None) -> None:
        self.port = port
        self.topic = port.topic
        self.config = config
        self.executor = executor
        self.topic_log = topic_log
        self.retention = retention
        self.wal_dir = wal_dir
        self.store = store
        self.ledger: Ledger | None = None
        self.status = "never"
        self._running: asyncio.Future[CompactionResult] | None = None
        self._stopping = False
        # Where the log ended when the last compaction failed: the threshold counts from
        # there, so a failing one (too many keys) is not tried again at every tick.
        self._failed_end = 0

    @property
    def horizon(self) -> int | None:
        return None if self.ledger is None else self.ledger.horizon

    async def load(self) -> None:
        """The newest ledger, opened (and checked) in a worker thread. Durable modes:
        the store's newest first when it is newer than this disk's (downloaded, checked),
        and this disk's uploaded when it is the newer one (a crash cut its upload short)."""
        for scratch in self.wal_dir.glob(f"{SCRATCH_PREFIX}*"):  # a compaction's or a download's, cut short
            shutil.rmtree(scratch, ignore_errors=True)
        loop = asyncio.get_running_loop()
        stored, fetch_error = await self._fetch_stored()
        found = ledgers_in(self.wal_dir)
        if not found:
            remove_ledgers_except(self.wal_dir, None)  # the .tmp of a writer killed mid-way
            if fetch_error is not None:
                self.status = f"failed: {fetch_error}; compact again to rebuild it"
            return
        path = found[-1][1]
        try:
            self.ledger = await loop.run_in_executor(self.executor, Ledger.open, path)
        except CorruptRecord as exc:
            self.status = f"failed: {exc.message}; compact again to rebuild it"
            log.error("%s: compacted ledger not used: %s", self.topic, exc.message)
            return
        self.status = "done"
        remove_ledgers_except(self.wal_dir, path)
        store, horizon = self.store, self.ledger.horizon
        if store is not None and fetch_error is None and (stored is None or horizon > stored):
            try:
                await loop.run_in_executor(self.executor, publish_ledger, store, self.topic, path, horizon)
            except (OSError, DanubeError) as exc:  # the view here stands; a move would find the store's older one
                log.error("%s: compacted ledger %d not uploaded to the durable store: %s", self.topic, horizon, exc)

    async def _fetch_stored(self) -> tuple[int | None, str | None]:
        """Durable modes: the store's newest ledger downloaded beside the WAL when it is
        newer than the newest here. Returns the store's newest horizon (None: none) and,
        when the store could not be read or its ledger is damaged, why."""
        if self.store is None:
            return None, None
        try:
            stored = await asyncio.get_running_loop().run_in_executor(
                self.executor, fetch_newer_ledger, self.store, self.topic, self.wal_dir)
        except (OSError, DanubeError) as exc:  # CorruptRecord too: a damaged object is never used
            why = exc.message if isinstance(exc, DanubeError) else f"{type(exc).__name__}: {exc}"
            log.error("%s: the compacted ledger in the durable store not fetched: %s", self.topic, why)
            return None, f"the compacted ledger in the durable store not fetched: {why}"
        return stored, None

    def request(self) -> None:
        """Start a compaction up to the committed end (FAILED_PRECONDITION while one runs)."""
        if self._running is not None:
            raise FailedPrecondition(f"topic {self.topic} is being compacted already; see topics describe")
        topic_log = self.topic_log
        wal = topic_log.wal
        assert wal is not None
        horizon = topic_log.committed_offset
        previous = self.ledger
        start = max(previous.horizon if previous is not None else 0, topic_log.log_start())
        if previous is not None and horizon <= previous.horizon:
            return  # nothing committed since: the view is current
        durable = list(topic_log.durable)
        keys_max = self.config.storage.compaction_keys_max
        store, topic = self.store, self.topic

        def run() -> CompactionResult:
            with tempfile.TemporaryDirectory(dir=self.wal_dir, prefix=SCRATCH_PREFIX) as scratch:
                history = _History(wal, durable, store, Path(scratch), horizon, lambda: self._stopping)
                try:
                    result = compact(history.read, start=start, horizon=horizon, previous=previous,
                                     directory=self.wal_dir, keys_max=keys_max)
                finally:
                    history.close()
            if store is not None:  # durable modes: done once the store holds it (a stop waits for it)
                publish_new_ledger(store, topic, result.path, result.horizon)
            return result

        self.retention.snapshot_pins[_PIN] = _PIN_MS
        self.status = "running"
        future = self._running = asyncio.get_running_loop().run_in_executor(self.executor, run)
        port = self.port

        def done(finished: asyncio.Future[CompactionResult]) -> None:
            if finished.cancelled():
                return
            error = finished.exception()
            if error is not None:
                why = error.message if isinstance(error, DanubeError) else f"{type(error).__name__}: {error}"
                port.post(CompactionFinished(path=None, horizon=horizon, error=why))
                return
            result = finished.result()
            port.post(CompactionFinished(path=str(result.path), horizon=result.horizon,
                                         records_kept=result.records_kept, keys=result.keys))

        future.add_done_callback(done)

    def tick(self) -> None:
        """Compact once the log past the horizon reaches the threshold policy."""
        threshold = self.port.policies.compaction_threshold_bytes
        topic_log = self.topic_log
        if not threshold or self._running is not None or topic_log.wal is None:
            return
        start = max(self.horizon or 0, self._failed_end, topic_log.log_start())
        if topic_log.committed_offset > start and topic_log.log_bytes(start, topic_log.committed_offset) >= threshold:
            log.info("%s: compacting: the log holds %d bytes or more past offset %d (compaction_threshold_bytes)",
                     self.topic, threshold, start)
            self.request()

    async def finished(self, msg: CompactionFinished) -> None:
        self._running = None
        self.retention.snapshot_pins.pop(_PIN, None)
        if msg.path is None:
            self._failed_end = msg.horizon
            self.status = f"failed: {msg.error}"
            log.error("%s: compaction up to offset %d failed: %s", self.topic, msg.horizon, msg.error)
            return
        path = Path(msg.path)
        try:
            ledger = await asyncio.get_running_loop().run_in_executor(self.executor, Ledger.open, path)
        except CorruptRecord as exc:
            self.status = f"failed: {exc.message}"
            log.error("%s: the new compacted ledger is damaged: %s", self.topic, exc.message)
            return
        old, self.ledger = self.ledger, ledger
        if old is not None:
            old.close()
        remove_ledgers_except(self.wal_dir, path)
        self.status = "done"
        log.info("%s: compacted up to offset %d: %d messages kept, %d keys", self.topic, msg.horizon,
                 msg.records_kept, msg.keys)

    async def stop(self) -> None:
        running = self._running
        if running is not None:
            self._stopping = True
            await asyncio.wait([running])
            self._running = None
        if self.ledger is not None:
            self.ledger.close()
            self.ledger = None

    def describe(self) -> tuple[str, int | None]:
        return self.status, self.horizon


class _History:
    """The topic's records for a compaction thread, from offset `start` on, below
    `horizon`: the local WAL's, else a durable segment's (downloaded to `scratch`)."""

    def __init__(self, wal: WalLog, durable: list[DurableSegment], store: DurableStore | None, scratch: Path,
                 horizon: int, stopping: Callable[[], bool]) -> None:
        self.wal = wal
        self.durable = durable
        self.store = store
        self.scratch = scratch
        self.horizon = horizon
        self.stopping = stopping
        self._mapped: tuple[DurableSegment, mmap.mmap] | None = None

    def read(self, start: int, max_bytes: int) -> RecordBatch:
        if self.stopping():
            raise _Aborted("the topic stopped")
        wal_start = self.wal.log_start_offset
        if start >= wal_start:
            return self.wal.read(start, max_bytes=max_bytes, upto_offset=self.horizon)
        segment = next((s for s in self.durable if s.end_offset >= start), None)
        if segment is None or segment.base_offset >= wal_start:
            return self.read(wal_start, max_bytes)  # a gap the log never held
        mapped = self._map(segment)
        begin = max(start, segment.base_offset)
        position, offset = skip_to(mapped, offset=segment.base_offset, start_offset=begin)
        found = scan(memoryview(mapped)[position:], expected_offset=offset,
                     upto_offset=min(segment.end_offset + 1, self.horizon), max_bytes=max_bytes)
        if found.fault is not None and not len(found.records):
            raise CorruptRecord(segment.object_key, position + found.fault.position, found.fault.reason)
        return found.records

    def _map(self, segment: DurableSegment) -> mmap.mmap:
        if self._mapped is not None and self._mapped[0] is segment:
            return self._mapped[1]
        self.close()
        assert self.store is not None
        dest = self.scratch / f"{segment.base_offset:020d}.seg"
        self.store.fetch(segment.object_key, dest, size_bytes=segment.size_bytes, crc32c=segment.crc32c)
        with open(dest, "rb") as file:
            mapped = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
        dest.unlink()  # mapped: gone from the disk once unmapped
        self._mapped = (segment, mapped)
        return mapped

    def close(self) -> None:
        if self._mapped is not None:
            self._mapped[1].close()
            self._mapped = None

"""The storage side of a reliable topic (`WalStorage`): store, then deliver. Its topic
actor (`shell.TopicActor`) calls it from its handlers; it has no mailbox of its own,
and it reaches its topic only through the `TopicPort` it is bound to.

`WalStorage` is the facade the shell holds; the work is done by parts, one job each,
which share the `TopicLog` (`log.py`: the WAL, the durable segments, the committed end):

    send -> BacklogQuota (quota.py)    bounds: disk free space, backlog quota, held sends
              -> WalCommit (commit.py)  offsets, reservations, group commit, FlushDone, receipts
                   writer.py            what runs in the WAL's worker thread
              -> WalReads (reads.py)    the cache of committed batches, reads, durable fetches
    WalCursors (cursors.py)             subscriptions, cursor checkpoints, the store's records
    DurableSegments (segments.py)       sealed segments to the durable store, receipts waiting on them
    WalRetention (retention.py)         retention, local retention, snapshot cuts and their pins
    WalCompaction (compacting.py)       the compacted view: latest message per key, in a ledger

The numbered steps of the write and read paths are in those modules' docstrings (1-4
commit.py, 5 reads.py, 6 segments.py, 7 and 9 retention.py, 8 quota.py, 10
compacting.py; the cursors' own in cursors.py). The log object belongs to this storage (so to its topic actor); the
worker thread writes the active segment while the actor reads only committed offsets.

The messages the shell passes on are bound once, at `bind`, to the part that handles
them: the facade adds no call to the send -> flush -> FlushDone -> receipts path.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor
from pathlib import Path

from danube_zmq.actors.topic.storage import TopicPort
from danube_zmq.actors.topic.wal.commit import WalCommit
from danube_zmq.actors.topic.wal.compacting import WalCompaction
from danube_zmq.actors.topic.wal.cursors import WalCursors
from danube_zmq.actors.topic.wal.dedup import WalDedup
from danube_zmq.actors.topic.wal.log import TopicLog
from danube_zmq.actors.topic.wal.quota import BacklogQuota
from danube_zmq.actors.topic.wal.reads import WalReads
from danube_zmq.actors.topic.wal.retention import WalRetention
from danube_zmq.actors.topic.wal.segments import DurableSegments
from danube_zmq.actors.topic.wal.writer import publish_cursor_tail
from danube_zmq.config.broker_config import BrokerConfig
from danube_zmq.storage.durable import DurableStore
from danube_zmq.storage.wal import SegmentInfo, WalLog
from danube_zmq.transport import client_protocol as cp
from danube_zmq.transport.admin_protocol import PartitionInfo, SubscriptionInfo
from danube_zmq.transport.codec import Message
from danube_zmq.transport.errors import DanubeError
from danube_zmq.transport.internal_protocol import (
    AppendInternal,
    ApplyBacklogQuota,
    ClientRequest,
    CompactionFinished,
    DurableSegment,
    FlushDone,
    OffsetsReserved,
    PersistCursor,
    PersistedSubscriptions,
    ReadRequest,
    ReleaseSnapshotCut,
    SegmentDurable,
    SegmentFetched,
    SubscriptionCursor,
    SubscriptionsOf,
    TakeSnapshotCut,
    TopicStopped,
)

log = logging.getLogger("danube_zmq.topic")

__all__ = ["WalStorage"]


class WalStorage:
    reliable = True

    # Bound at `bind` to the parts' own methods (one call from the shell's handler).
    send: Callable[[ClientRequest, cp.Send], None]
    flush_done: Callable[[FlushDone], Awaitable[None]]
    sync_due: Callable[[], Awaitable[None]]
    tick: Callable[[], Awaitable[None]]
    offsets_reserved: Callable[[OffsetsReserved], None]
    append_internal: Callable[[AppendInternal], None]
    held_sends_due: Callable[[], None]
    apply_backlog_quota: Callable[[ApplyBacklogQuota], None]
    read: Callable[[ReadRequest], None]
    resolve_seek: Callable[[int | None, int | None], Awaitable[int]]
    expired_end: Callable[[int], Awaitable[int | None]]
    persist_cursor: Callable[[PersistCursor], None]
    seek_durable: Callable[[PersistCursor], Awaitable[None]]
    settings_changed: Callable[[PersistCursor], None]
    start_subscription: Callable[[cp.Subscribe], Awaitable[list[bytes]]]
    subscription_cursor: Callable[[SubscriptionCursor], None]
    segment_durable: Callable[[SegmentDurable], None]
    segment_fetched: Callable[[SegmentFetched], None]
    take_snapshot_cut: Callable[[TakeSnapshotCut], Awaitable[Message]]
    release_snapshot_cut: Callable[[ReleaseSnapshotCut], None]
    backlog_bytes_after: Callable[[int, int], int | None]

    def __init__(self, *, name: str, config: BrokerConfig, wal_dir: Path, executor: Executor,
                 durable: list[DurableSegment] | None = None, cache_dir: Path | None = None,
                 start_offset: int | None = None, backlog_quota: tuple[int, str] | None = None) -> None:
        self.topic = name
        self.config = config
        self.wal_dir = wal_dir
        self.executor = executor
        self.start_offset = start_offset
        self.backlog_quota = backlog_quota
        self.durable_mode = config.storage.mode != "local"
        self.store = DurableStore(config.storage.durable_url) if self.durable_mode else None  # type: ignore[arg-type]
        self.cache_dir = cache_dir or wal_dir.parent / "durable-cache"
        # storage.mode local (and durable modes with `storage.cursors_in_segments`):
        # reliable cursors are checkpoints in this WAL, not Raft keys (cursors.py).
        self.cursors_in_wal = not self.durable_mode or config.storage.cursors_in_segments
        self.topic_log = TopicLog(durable or [])
        # It is its own log side (`storage.ReliableLog`): an attribute, read per WAL message.
        self.reliable_log: WalStorage = self

    @property
    def wal(self) -> WalLog | None:
        return self.topic_log.wal

    @property
    def committed_offset(self) -> int:
        return self.topic_log.committed_offset

    @property
    def next_offset(self) -> int:
        return self.commit.next_offset

    def bind(self, port: TopicPort) -> None:
        self.port = port
        config, executor, topic_log, store = self.config, self.executor, self.topic_log, self.store
        reads = self.reads = WalReads(port=port, config=config, executor=executor, topic_log=topic_log,
                                      store=store, cache_dir=self.cache_dir)
        cursors = self.cursors = WalCursors(port=port, config=config, executor=executor, topic_log=topic_log,
                                            store=store, cache_dir=self.cache_dir, cursors_in_wal=self.cursors_in_wal)
        dedup = self.dedup = WalDedup(port=port, config=config, topic_log=topic_log, store=store, executor=executor,
                                      cache_dir=self.cache_dir)
        commit = self.commit = WalCommit(port=port, config=config, executor=executor, topic_log=topic_log,
                                         reads=reads, cursors=cursors, dedup=dedup, wal_dir=self.wal_dir,
                                         start_offset=self.start_offset, durable_mode=self.durable_mode)
        segments = self.segments = DurableSegments(port=port, config=config, topic_log=topic_log, cursors=cursors,
                                                   durable_mode=self.durable_mode)
        quota = self.quota = BacklogQuota(port=port, config=config, topic_log=topic_log, commit=commit, segments=segments,
                                          wal_dir=self.wal_dir, backlog_quota=self.backlog_quota)
        retention = self.retention = WalRetention(port=port, config=config, executor=executor, topic_log=topic_log,
                                                  store=store, commit=commit, segments=segments, quota=quota)
        self.compaction = WalCompaction(port=port, config=config, executor=executor, topic_log=topic_log,
                                        retention=retention, wal_dir=self.wal_dir, store=store)
        reads.compaction = cursors.compaction = self.compaction
        # The parts that call each other: a checkpoint starts a flush, a flush carries
        # checkpoints; a commit grows the backlog and may wait for a durable segment.
        cursors.commit = commit
        commit.quota, commit.segments = quota, segments
        dedup.segments = segments
        self.send = quota.send
        self.flush_done, self.sync_due = commit.flush_done, commit.sync_due
        self.offsets_reserved, self.append_internal = commit.offsets_reserved, commit.append_internal
        self.take_snapshot_cut = retention.take_snapshot_cut
        self.release_snapshot_cut = retention.release_snapshot_cut
        self.held_sends_due, self.apply_backlog_quota = quota.held_sends_due, quota.apply_backlog_quota
        self.subscription_cursor = quota.subscription_cursor
        self.read, self.segment_fetched, self.resolve_seek = reads.read, reads.segment_fetched, reads.resolve_seek
        self.expired_end = reads.expired_end
        self.persist_cursor, self.seek_durable = cursors.persist_cursor, cursors.seek_durable
        self.settings_changed, self.start_subscription = cursors.settings_changed, cursors.start_subscription
        self.segment_durable = segments.segment_durable
        self.backlog_bytes_after = topic_log.backlog_bytes_after

    async def start(self) -> None:
        # Asked at each start, not given at spawn: a topic restarted (or loaded again)
        # before the flusher wrote its cursors resumes from them, not from the store's.
        persisted = await self.port.ask_cursors(SubscriptionsOf(topic=self.topic))
        assert isinstance(persisted, PersistedSubscriptions)
        self.segments.start()
        await self.commit.open()
        await self.compaction.load()
        await self.dedup.load()
        await self.cursors.resume(persisted.states)
        self.commit.start_sync_timer()
        self.retention.start_timer()
        self.segments.report_sealed(again=True)
        if self.cursors.pending_checkpoints and not self.commit.in_flight() and not self.commit.queued:
            self.commit.start_flush()

    async def tick(self) -> None:
        self.commit.dedup_tick()
        await self.retention.tick()
        self.compaction.tick()

    def last_sequence_id(self, producer_name: str) -> int | None:
        table = self.dedup.current()
        return None if table is None else table.last_sequence_id(producer_name)

    def compact(self) -> None:
        self.compaction.request()

    async def compaction_finished(self, msg: CompactionFinished) -> None:
        await self.compaction.finished(msg)

    async def stop(self) -> None:
        self.reads.close()
        await self.compaction.stop()  # its thread reads the WAL closed below
        commit, cursors, port = self.commit, self.cursors, self.port
        flush = commit.flush_future
        if self.topic_log.wal is not None and flush is not None and not flush.done():
            # The WAL is the flush's thread's until it is done (the executor has several
            # threads: closing under it lost the checkpoints the subscriptions told as
            # they stopped, which started that flush).
            await asyncio.wait([asyncio.wrap_future(flush)])
        if self.topic_log.wal is not None:
            wal, self.topic_log.wal = self.topic_log.wal, None
            # Records whose checkpoints a finished flush wrote (its FlushDone is never
            # handled now), then those waiting for the next flush (written by close).
            flushed = flush is not None and flush.done() and not flush.cancelled() and flush.exception() is None
            last, store, publish = cursors.take_last(flushed)
            # A clean stop seals the active segment so that all of the topic reaches the
            # durable store (the broker waits for its uploads before it stops), its last
            # checkpoints in it: the next broker reads the cursors there.
            seal = self.durable_mode and not port.restarting
            topic = self.topic

            def close() -> tuple[bool, list[SegmentInfo]]:
                written = True
                if last and wal.writable:  # the cursors told since the last flush: synced by close
                    try:
                        wal.append_checkpoints(last)
                    except OSError as exc:
                        written = False
                        log.error("%s: last cursor checkpoints not written (%s): redelivery from older ones",
                                  wal.directory, exc)
                segments = []
                if seal and wal.writable:
                    try:
                        rolled = wal.seal_active()
                        segments = wal.segments()
                        if rolled is None and publish is not None:  # checkpoints only: published as they are
                            publish_cursor_tail(wal, publish, topic)
                    except (OSError, DanubeError) as exc:  # the broker's seal (`_seal_wal`) tries again
                        log.error("%s: active segment not sealed or published at stop (%s)", wal.directory, exc)
                wal.close()
                return written and (wal.writable or not last), segments

            # Let a flush in flight finish before the file is closed under it.
            written, sealed = await asyncio.get_running_loop().run_in_executor(self.executor, close)
            if written:
                for record in store:  # the flusher stops after the topics: still written
                    port.post_cursors(record)
            self.segments.report_sealed(segments=sealed)
            if not port.restarting:
                port.tell_broker(TopicStopped(topic=self.topic, next_offset=wal.next_offset))
        # Sends not yet acknowledged are answered now rather than left to the client's
        # timeout: it sends them again.
        state = "moved" if port.moving else "restarted" if port.restarting else "closed"
        self.quota.refuse_held(state)
        commit.refuse_unacknowledged(state)
        self.segments.refuse_held(state)

    def seal(self) -> int:
        return self.commit.seal()

    def forget_subscription(self, name: str) -> None:
        self.quota.forget_subscription(name)
        self.cursors.forget_subscription(name)

    def describe(self, info: PartitionInfo) -> PartitionInfo:
        subscriptions = [dataclasses.replace(s, backlog_bytes=self._backlog_bytes(s)) for s in info.subscriptions]
        compaction, horizon = self.compaction.describe()
        return dataclasses.replace(info, subscriptions=subscriptions, evicted_messages=self.quota.evicted_messages,
                                   compaction=compaction, compaction_horizon=horizon)

    def _backlog_bytes(self, info: SubscriptionInfo) -> int | None:
        if info.cursor is None or info.backlog_messages is None:
            return None
        return self.topic_log.backlog_bytes_after(info.cursor, info.backlog_messages)

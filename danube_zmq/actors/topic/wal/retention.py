"""What a reliable topic lets go of, and when (`WalRetention`): retention of whole
segments, local copies of durable segments, and the snapshot cuts that hold both back.

7. Retention (`retention_time_ms`, `retention_bytes_max`: the topic's policies, else its
   namespace's, else `storage.retention_*`): whole sealed segments, oldest first, once
   every subscription's cursor has passed them; in durable modes the durable segments
   (their objects and descriptors), then the local files below them. Local WAL files
   covered by durable segments go after `storage.local_retention_ms` or once the
   local files exceed `local_retention_bytes_max`. Checked on a timer (`Tick`, every
   `retention_check_interval_ms`), which also retries what may have failed since:
   a reservation, reports of sealed segments, the backlog's measure and eviction.
9. Snapshots: a snapshot export takes a cut (the subscriptions' states, then the
   committed end and the files below it) and pins the topic for `pin_ms`: no retention
   meanwhile, so the files it names stay until it has read them or the pin expires.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import Executor
from pathlib import Path

from danube_zmq.actors.topic.storage import TopicPort
from danube_zmq.actors.topic.wal.commit import WalCommit
from danube_zmq.actors.topic.wal.log import TopicLog
from danube_zmq.actors.topic.wal.quota import BacklogQuota
from danube_zmq.actors.topic.wal.segments import DurableSegments
from danube_zmq.config.broker_config import BrokerConfig
from danube_zmq.storage.durable import DurableStore
from danube_zmq.transport.codec import Message
from danube_zmq.transport.internal_protocol import (
    DescribeSubscriptionCut,
    ForgetSegments,
    ReleaseSnapshotCut,
    SegmentRef,
    SnapshotCut,
    SubscriptionCut,
    TakeSnapshotCut,
    Tick,
)


class WalRetention:
    def __init__(self, *, port: TopicPort, config: BrokerConfig, executor: Executor, topic_log: TopicLog,
                 store: DurableStore | None, commit: WalCommit, segments: DurableSegments,
                 quota: BacklogQuota) -> None:
        self.port = port
        self.topic = port.topic
        self.config = config
        self.executor = executor
        self.topic_log = topic_log
        self.store = store
        self.commit = commit
        self.segments = segments
        self.quota = quota
        # Snapshot exports in progress: pin id -> deadline (monotonic ms); no retention meanwhile.
        self.snapshot_pins: dict[int, int] = {}

    def start_timer(self) -> None:
        self.port.schedule_periodic(self.config.storage.retention_check_interval_ms, Tick())

    async def tick(self) -> None:
        topic_log = self.topic_log
        if topic_log.wal is None:
            return
        self.commit.retry_reservation()
        self.segments.report_sealed(again=True)
        self.quota.tick()
        if self._pinned():
            return  # a snapshot is reading these files: retention waits for the next tick
        now_ms = self.port.clock.now_ms()
        # Offsets below `floor` are acknowledged by every subscription.
        floor = self.quota.acked_floor()
        if self.store is not None:
            await self._durable_retention(now_ms, floor)
        elif (retention := self._retention()) != (None, None):
            wal = topic_log.wal
            segments = [(i.base_offset, i.next_offset, i.size_bytes, _mtime_ms(i.path))
                        for i in wal.segments() if i.sealed]
            upto = expired(segments, floor, now_ms, *retention, sum(i.size_bytes for i in wal.segments()))
            if upto is not None:
                await asyncio.get_running_loop().run_in_executor(self.executor, wal.delete_segments_before, upto)

    def _retention(self) -> tuple[int | None, int | None]:
        """(retention_time_ms, retention_bytes_max) in force for this topic (its policies,
        else its namespace's, else `storage.retention_*`); None: no limit."""
        policies = self.port.policies
        return policies.retention_time_ms or None, policies.retention_bytes_max or None

    async def _durable_retention(self, now_ms: int, floor: int) -> None:
        topic_log = self.topic_log
        assert topic_log.wal is not None and self.store is not None
        storage, loop = self.config.storage, asyncio.get_running_loop()
        if (retention := self._retention()) != (None, None):
            segments = [(s.base_offset, s.end_offset + 1, s.size_bytes, s.created_ms) for s in topic_log.durable]
            upto = expired(segments, floor, now_ms, *retention, sum(s.size_bytes for s in topic_log.durable))
            if upto is not None:
                gone = [s for s in topic_log.durable if s.end_offset < upto]
                for segment in gone:
                    await loop.run_in_executor(self.executor, self.store.delete, segment.object_key)
                topic_log.durable = [s for s in topic_log.durable if s.end_offset >= upto]
                self.port.tell_broker(ForgetSegments(topic=self.topic, base_offsets=[s.base_offset for s in gone]))
                await loop.run_in_executor(self.executor, topic_log.wal.delete_segments_before, upto)
        # Local WAL files go once durable segments cover them and local retention is exceeded.
        durable_end = topic_log.durable[-1].end_offset + 1 if topic_log.durable else 0
        local = [i for i in topic_log.wal.segments() if i.sealed and i.next_offset <= durable_end]
        local_bytes = sum(i.size_bytes for i in topic_log.wal.segments())
        upto = None
        for info in local:
            if now_ms - _mtime_ms(info.path) >= storage.local_retention_ms \
                    or local_bytes > storage.local_retention_bytes_max:
                upto = info.next_offset
                local_bytes -= info.size_bytes
            else:
                break
        if upto is not None:
            await loop.run_in_executor(self.executor, topic_log.wal.delete_segments_before, upto)

    # ------------------------------------------------------------- snapshots
    async def take_snapshot_cut(self, msg: TakeSnapshotCut) -> Message:
        """The topic as of now: subscriptions first, then the committed end (so no
        cursor is past it), and the files holding everything below the end."""
        subscriptions = []
        for reply in await self.port.ask_subscriptions(DescribeSubscriptionCut()):
            assert isinstance(reply, SubscriptionCut)
            subscriptions.append(reply.state)
        topic_log = self.topic_log
        assert topic_log.wal is not None
        end = topic_log.committed_offset
        self.snapshot_pins[msg.pin_id] = self.port.clock.monotonic_ms() + msg.pin_ms
        wal_start = topic_log.wal.log_start_offset
        segments = [SegmentRef(base_offset=d.base_offset, upto_offset=min(d.end_offset + 1, end), sealed=True, path=None,
                               durable=d)
                    for d in topic_log.durable if d.base_offset < min(wal_start, end)]
        for info in topic_log.wal.segments():
            upto = min(info.next_offset, end)
            if upto > info.base_offset:
                segments.append(SegmentRef(base_offset=info.base_offset, upto_offset=upto,
                                           sealed=info.sealed and upto == info.next_offset, path=str(info.path)))
        return SnapshotCut(topic=self.topic, log_start_offset=topic_log.log_start(), end_offset=end,
                           messages_in=self.port.messages_in,
                           producers=sorted(p.name for p in self.port.producers.values()),
                           segments=segments, subscriptions=subscriptions)

    def release_snapshot_cut(self, msg: ReleaseSnapshotCut) -> None:
        self.snapshot_pins.pop(msg.pin_id, None)

    def _pinned(self) -> bool:
        now = self.port.clock.monotonic_ms()
        for pin_id, deadline in list(self.snapshot_pins.items()):
            if deadline <= now:
                del self.snapshot_pins[pin_id]
        return bool(self.snapshot_pins)


def _mtime_ms(path: Path) -> int:
    try:
        return int(path.stat().st_mtime * 1000)
    except FileNotFoundError:
        return 0


def expired(segments: list[tuple[int, int, int, int]], floor: int, now_ms: int, time_ms: int | None,
            bytes_max: int | None, total_bytes: int) -> int | None:
    """Retention's pure rule. `segments` are sealed (base, next, size, written_ms), oldest
    first. Returns the offset below which whole segments may go (or None): only segments
    every subscription has passed (next <= floor), while the oldest is older than
    `time_ms` or the topic holds more than `bytes_max`."""
    upto = None
    for _base, next_offset, size, written_ms in segments:
        if next_offset > floor:
            break
        too_old = time_ms is not None and now_ms - written_ms >= time_ms
        too_big = bytes_max is not None and total_bytes > bytes_max
        if not (too_old or too_big):
            break
        upto = next_offset
        total_bytes -= size
    return upto

"""Subscriptions and their cursors on a reliable topic (`WalCursors`): spawning them,
checkpoints in the WAL, the records the metadata store keeps, seeks made durable.

storage.mode local (and durable modes with `storage.cursors_in_segments`): reliable
cursors are checkpoints in this WAL, not Raft keys (docs/scaling.md). The metadata
store keeps each subscription's record (type, policy, window), written when it is
created, its settings change or its cursor goes back (a seek); its cursor there is a
floor, never newer than the WAL's. In durable modes the sealed segments carry the
checkpoints to the topic's next broker.

1. PersistCursor (a subscription's cursor moved) -> a checkpoint coalesced per
   subscription, written by the next flush after that flush's batches (a cursor is
   never durable before what it covers); a flush starts for it when none runs.
2. The flush done -> the store's records it carried go to the broker's cursor flusher:
   the store never knows of a subscription, a deletion or a cursor the WAL does not hold
   first, so at load the WAL's word is the newest (`resume_from_checkpoints`).
3. A seek -> its checkpoint written and synced before the seek is answered
   (`seek_durable`), so that no crash undoes an answered seek.
4. Durable modes: checkpoints written to an active segment that holds no record are
   published as that segment is (`publish_cursor_tail`, `cursors_key`), so that the
   next broker finds them; deleted once a sealed segment covers them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from concurrent.futures import Executor
from pathlib import Path
from typing import TYPE_CHECKING

from danube_zmq.actors.subscription import TrackedDelivery
from danube_zmq.actors.topic.storage import TopicPort
from danube_zmq.actors.topic.wal.log import TopicLog
from danube_zmq.actors.topic.wal.writer import PUBLISH_FAILED
from danube_zmq.config.broker_config import BrokerConfig
from danube_zmq.storage.durable import DurableStore, cursors_key
from danube_zmq.storage.wal import segment_checkpoints, segment_file_name
from danube_zmq.transport import client_protocol as cp
from danube_zmq.transport import cluster_records as cr
from danube_zmq.transport.errors import DanubeError, InvalidArgument, Unavailable
from danube_zmq.transport.internal_protocol import (
    DelayedState,
    FailurePolicyState,
    ForgetSubscription,
    PersistCursor,
    SubscriptionState,
)

if TYPE_CHECKING:
    from danube_zmq.actors.topic.wal.commit import WalCommit
    from danube_zmq.actors.topic.wal.compacting import WalCompaction

log = logging.getLogger("danube_zmq.topic")

class WalCursors:
    # Set by `WalStorage.bind`: a checkpoint starts a flush, and a flush carries checkpoints.
    commit: WalCommit

    def __init__(self, *, port: TopicPort, config: BrokerConfig, executor: Executor, topic_log: TopicLog,
                 store: DurableStore | None, cache_dir: Path, cursors_in_wal: bool) -> None:
        self.port = port
        self.topic = port.topic
        self.config = config
        self.executor = executor
        self.topic_log = topic_log
        self.store = store
        self.cache_dir = cache_dir
        self.cursors_in_wal = cursors_in_wal
        # Checkpoints to append at the next flush, coalesced per subscription (bounded
        # by the topic's subscriptions): name -> encoded CursorRecord, None: deleted.
        self.pending_checkpoints: dict[str, bytes | None] = {}
        self.checkpointing: dict[str, bytes | None] = {}  # in the flush running now
        # What the metadata store was last sent per subscription: (settings, cursor).
        self.recorded: dict[str, tuple[tuple[object, ...], int]] = {}
        # Records for the metadata store (PersistCursor / ForgetSubscription), sent only
        # once the flush carrying their checkpoints is done (step 2).
        self.store_pending: list[PersistCursor | ForgetSubscription] = []
        self.store_flushing: list[PersistCursor | ForgetSubscription] = []
        self.settled: list[str] = []  # deletions the store was sent (`WalLog.settle_deletions`)
        # A seek's checkpoint is written and synced before it is answered (`seek_durable`);
        # records a subscription sent before that seek (fewer `seeks`) are dropped after it.
        self.seek_epochs: dict[str, int] = {}
        # Step 4. Bases of the checkpoints-only objects known to exist (published here or
        # listed at load): deleted once a sealed segment covers them.
        self.publish_cursor_tail = store is not None and cursors_in_wal
        self.cursor_objects: set[int] = set()
        self.cursor_tail_unpublished = False  # a publish failed: tried again at the next flush or stop
        self.flush_published: list[int | None] = []  # what the flush in flight published (its thread's)
        self.compaction: WalCompaction  # set by the storage's `bind`: where read_compacted ones start

    # ------------------------------------------------------------- subscriptions
    async def start_subscription(self, msg: cp.Subscribe) -> list[bytes]:
        topic_log = self.topic_log
        # A read_compacted one starts in the compacted view, older than the log may be.
        ledger = self.compaction.ledger if msg.read_compacted else None
        first = ledger.first_offset_at_or_after(0) if ledger is not None else None
        log_start = topic_log.log_start() if first is None else min(first, topic_log.log_start())
        if msg.start_offset is not None:
            assert topic_log.wal is not None
            if not log_start <= msg.start_offset <= topic_log.committed_offset:
                raise InvalidArgument(f"start offset {msg.start_offset} is outside {self.topic}'s log"
                                      f" [{log_start}, {topic_log.committed_offset}]")
            start = msg.start_offset
        elif msg.initial_position == cp.InitialPosition.EARLIEST:
            start = log_start
        else:
            start = topic_log.committed_offset
        await self.spawn(msg.subscription, msg.sub_type, cursor=start - 1, acked_above=[], durable=msg.durable,
                         read_compacted=msg.read_compacted)
        if self.cursors_in_wal and msg.durable:  # its existence and start, durable with the next flush
            self.persist_cursor(PersistCursor(topic=self.topic, subscription=msg.subscription, sub_type=msg.sub_type,
                                              cursor=start - 1, acked_above=[]))
        return []

    async def spawn(self, name: str, sub_type: int, *, cursor: int, acked_above: list[int],
                    policy: FailurePolicyState | None = None, max_unacked_messages: int | None = None,
                    durable: bool = True, delayed: DelayedState | None = None, read_compacted: bool = False) -> None:
        config, port, topic_log = self.config, self.port, self.topic_log

        def delivery() -> TrackedDelivery:
            # Evaluated at each (re)start of the subscription: it resumes at the committed
            # end as it is then, with the policy and window an admin set since.
            accepted_policy, window = port.accepted_settings(name, policy, max_unacked_messages)
            made = TrackedDelivery(
                topic=self.topic, name=name, sub_type=sub_type, config=config, cursor=cursor, acked_above=acked_above,
                committed_offset=topic_log.committed_offset, policy=accepted_policy, max_unacked_messages=window,
                seeks=self.seek_epochs.get(name, 0), durable=durable, delayed=delayed,
                spill_dir=self.cache_dir / "delayed" / name)
            made.read_compacted = read_compacted  # its first reads, before its consumer attaches
            return made

        await port.spawn_subscription(name, sub_type, delivery, durable)

    def forget_subscription(self, name: str) -> None:
        """A subscription was deleted (after the backlog quota forgot it: a send it
        releases is flushed before the deletion's checkpoint): its deletion goes to the
        store, through the WAL first when cursors are there."""
        self.seek_epochs.pop(name, None)
        forget = ForgetSubscription(topic=self.topic, subscription=name)
        if self.cursors_in_wal:
            self.recorded.pop(name, None)
            self.store_pending.append(forget)
            self._checkpoint(name, None)
        else:
            self.port.post_cursors(forget)

    # ------------------------------------------------------------- checkpoints
    def persist_cursor(self, msg: PersistCursor) -> None:
        """A subscription's cursor (storage.mode local): a checkpoint at the next flush;
        its record in the metadata store only when that must change (see `recorded`)."""
        if msg.subscription not in self.port.cursor_names:
            return  # deleted meanwhile
        if msg.seeks < self.seek_epochs.get(msg.subscription, 0):
            return  # sent before a seek whose checkpoint is newer
        self._checkpoint(msg.subscription, self._recorded(self._with_accepted_settings(msg)))

    def _with_accepted_settings(self, record: PersistCursor) -> PersistCursor:
        """`record` with the failure policy and dispatch window the topic last accepted
        for its subscription. A record the subscription sent before an admin's change,
        or one queued for the store before it, carries the old settings; reaching the
        store after the change's own record, it put them back there, and the change was
        gone after a restart."""
        policy, window = self.port.accepted_settings(record.subscription, record.policy, record.max_unacked_messages)
        if policy is record.policy and window == record.max_unacked_messages:
            return record
        return dataclasses.replace(record, policy=policy, max_unacked_messages=window)

    def _recorded(self, msg: PersistCursor) -> bytes:
        """`msg` as a checkpoint; queued for the metadata store when its record there
        must change (created, new settings, or a cursor moved back)."""
        settings = (msg.sub_type, msg.policy, msg.max_unacked_messages)
        recorded = self.recorded.get(msg.subscription)
        if recorded is None or recorded[0] != settings or msg.cursor < recorded[1]:
            self.store_pending.append(msg)
            self.recorded[msg.subscription] = (settings, msg.cursor)
        return cr.encode(cr.CursorRecord(
            sub_type=msg.sub_type, cursor=msg.cursor, acked_above=msg.acked_above, policy=msg.policy,
            max_unacked_messages=msg.max_unacked_messages, delayed=msg.delayed))

    async def seek_durable(self, record: PersistCursor) -> None:
        """A subscription has just sought (`record` is its state as of the seek): its
        checkpoint is written and synced now, before the seek is answered, so that no
        crash undoes an answered seek. The topic waits for the flush in flight (the WAL
        is its thread's until then) and writes this one checkpoint itself."""
        name = record.subscription
        if name not in self.port.cursor_names or self.topic_log.wal is None:
            return  # deleted meanwhile, or stopping
        self.seek_epochs[name] = record.seeks
        encoded = self._recorded(record)  # the store's record too (a cursor moved back)
        self.pending_checkpoints.pop(name, None)  # older
        flush_future = self.commit.flush_future
        if flush_future is not None and not flush_future.done():
            await asyncio.wait([asyncio.wrap_future(flush_future)])  # its outcome is its FlushDone's
        # Not re-written from the flush that was in flight if that one failed: older.
        self.checkpointing.pop(name, None)
        wal = self.topic_log.wal
        if wal is None:
            return

        def write() -> None:
            wal.append_checkpoints([(name, encoded)])
            wal.sync()

        try:
            await asyncio.get_running_loop().run_in_executor(self.executor, write)
        except OSError as exc:
            self._checkpoint(name, encoded)  # tried again at the next flush
            raise Unavailable(f"subscription '{name}' of {self.topic} moved, but its cursor could not be written"
                              f" to the WAL ({exc}); a restart now resumes from the previous one: seek again") \
                from exc

    def settings_changed(self, record: PersistCursor) -> None:
        """An admin changed a subscription's policy or window: its record goes to the
        store at once (the broker flushes the store before answering), as settings come
        from the store at load; the cursor in it is the subscription's now."""
        if self.cursors_in_wal:
            self.recorded[record.subscription] = ((record.sub_type, record.policy, record.max_unacked_messages),
                                                  record.cursor)
            self.port.post_cursors(record)

    def _checkpoint(self, name: str, state: bytes | None) -> None:
        self.pending_checkpoints[name] = state
        commit = self.commit
        if self.topic_log.wal is not None and not commit.in_flight() and not commit.queued:
            commit.start_flush()

    # ------------------------------------------------------------- what a flush carries
    def take_flush(self) -> tuple[list[tuple[str, bytes | None]], list[str], DurableStore | None, list[int | None]]:
        """A flush starts: the checkpoints it writes (after its batches), the deletions it
        settles, the store it publishes the cursor tail to (None: not this time) and the
        list its thread fills with what it published."""
        self.checkpointing, self.pending_checkpoints = self.pending_checkpoints, {}
        self.store_flushing, self.store_pending = self.store_pending, []
        checkpoints = sorted(self.checkpointing.items())
        settled, self.settled = self.settled, []
        publish = self.store if self.publish_cursor_tail and (checkpoints or self.cursor_tail_unpublished) else None
        published: list[int | None] = []
        self.flush_published = published
        return checkpoints, settled, publish, published

    def end_flush(self) -> tuple[dict[str, bytes | None], list[PersistCursor | ForgetSubscription]]:
        """The flush is done: what it carried (checkpoints, the store's records)."""
        checkpoints, self.checkpointing = self.checkpointing, {}
        store, self.store_flushing = self.store_flushing, []
        return checkpoints, store

    def flush_failed(self, checkpoints: dict[str, bytes | None],
                     store: list[PersistCursor | ForgetSubscription]) -> None:
        """Written again at the next flush, unless a newer one came meanwhile."""
        self.pending_checkpoints = {**checkpoints, **self.pending_checkpoints}
        self.store_pending = store + self.store_pending

    def to_store(self, records: list[PersistCursor | ForgetSubscription]) -> None:
        """Their checkpoints are in the WAL now: the metadata store may know them."""
        # Their markers need not be carried into new segments any more: dropped by the
        # next flush's thread (the log is the flushes' to change).
        self.settled += [r.subscription for r in records if isinstance(r, ForgetSubscription)]
        for record in records:
            if isinstance(record, PersistCursor):
                record = self._with_accepted_settings(record)
            self.port.post_cursors(record)

    def tail_published(self) -> None:
        """What the flush just done published of the cursor tail."""
        for base in self.flush_published:
            self.cursor_tail_unpublished = base == PUBLISH_FAILED
            if base is not None and base != PUBLISH_FAILED:
                self.cursor_objects.add(base)

    def drop_covered_tails(self, base_offset: int) -> None:
        """A sealed segment at `base_offset` is durable: it begins with newer cursors
        than the checkpoints-only objects at or before it, which go."""
        covered = sorted(base for base in self.cursor_objects if base <= base_offset)
        if covered and self.store is not None:
            self.cursor_objects.difference_update(covered)
            store, topic = self.store, self.topic

            def delete() -> None:
                for base in covered:
                    store.delete(cursors_key(topic, base))

            def done(future: asyncio.Future[None]) -> None:
                if future.exception() is not None:  # left behind; the topic's deletion lists them
                    log.warning("%s: checkpoints-only segments %s not deleted: %s", topic, covered, future.exception())

            asyncio.get_running_loop().run_in_executor(self.executor, delete).add_done_callback(done)

    # ------------------------------------------------------------- at start and stop
    async def resume(self, states: list[SubscriptionState]) -> None:
        """Spawn the persisted subscriptions (`states`: the cursor flusher's), each where
        the newest word on it says."""
        if self.cursors_in_wal:
            carried = await self._durable_checkpoints()
            states = self.resume_from_checkpoints(states, carried)
        for state in states:
            await self.spawn(state.name, state.sub_type, cursor=state.cursor, acked_above=state.acked_above,
                             policy=state.policy, max_unacked_messages=state.max_unacked_messages,
                             delayed=state.delayed)

    def take_last(self, flushed: bool) -> tuple[list[tuple[str, bytes | None]],
                                                list[PersistCursor | ForgetSubscription], DurableStore | None]:
        """The topic stops, no flush running (`flushed`: the last one wrote what it
        carried, and its FlushDone is never handled now): the checkpoints told since
        (the close writes them), the store's records to send once they are written, and
        the store to publish the cursor tail to (None: no need)."""
        last = sorted(self.pending_checkpoints.items())
        self.pending_checkpoints = {}
        store = (self.store_flushing if flushed else []) + self.store_pending
        self.store_flushing, self.store_pending = [], []
        publish = self.store if self.publish_cursor_tail and (last or self.cursor_tail_unpublished
                                                              or self.checkpointing) else None
        return last, store, publish

    async def _durable_checkpoints(self) -> dict[str, bytes | None]:
        """Durable modes: the checkpoints the durable store carries that the local WAL
        does not hold (a broker taking the topic over: a move, a failover, a new disk):
        those of the newest checkpoints-only segment (`cursors_key`) when it is newer
        than the newest sealed segment, else the newest sealed segment's. Every segment
        begins with every cursor (a roll carries them; a broker loading the topic
        checkpoints each at once), so either holds each subscription's newest
        checkpoint the store has. {}: none, or unreadable (logged:
        the metadata store's records count, the cursors go back: redelivery)."""
        wal = self.topic_log.wal
        assert wal is not None
        if self.store is None:
            return {}
        store, topic, clock = self.store, self.topic, self.port.clock
        local_start = wal.log_start_offset
        # A WAL created empty here (at the store's end) holds none of the published tail.
        local_empty = not wal.checkpoints() and not wal.deleted_subscriptions()
        newest = self.topic_log.durable[-1] if self.topic_log.durable else None
        directory = self.cache_dir / "checkpoints"

        def read() -> dict[str, bytes | None]:
            bases = store.cursor_bases(topic)
            self.cursor_objects.update(bases)  # a set the loop does not touch before this returns
            fetched = []
            try:
                tail = bases[-1] if bases else None
                if tail is not None and (newest is None or tail > newest.base_offset):
                    # Newer than the sealed segment, and it begins with every cursor (a
                    # roll, or a broker loading the topic, checkpoints each first): it
                    # alone is enough, no segment of up to wal_segment_bytes_max to read.
                    if local_start > tail or local_empty:
                        path = directory / "tail" / segment_file_name(tail)
                        store.fetch(cursors_key(topic, tail), path)
                        fetched.append(path)
                elif newest is not None and local_start > newest.base_offset:
                    path = directory / "segment" / segment_file_name(newest.base_offset)
                    store.fetch(newest.object_key, path, size_bytes=newest.size_bytes, crc32c=newest.crc32c)
                    fetched.append(path)
                return segment_checkpoints(fetched, clock)
            finally:
                for path in fetched:
                    path.unlink(missing_ok=True)

        try:
            return await asyncio.get_running_loop().run_in_executor(self.executor, read)
        except (OSError, DanubeError) as exc:
            log.error("%s: cursor checkpoints in the durable store unreadable (%s); subscriptions resume from the"
                      " metadata store's records (redelivery)", self.topic, exc)
            return {}

    def resume_from_checkpoints(self, states: list[SubscriptionState],
                                carried: dict[str, bytes | None] | None = None) -> list[SubscriptionState]:
        """The subscriptions to resume: the WAL's word first (its local files over the
        checkpoints `carried` in from the newest durable segment). The store is sent nothing
        the WAL does not hold first (`store_pending`), so a subscription the WAL names
        resumes from its newest checkpoint (one the store does not list yet too: killed
        before the store heard of it), one whose newest checkpoint is a deletion stays
        deleted (and is forgotten in the store again), and only one the WAL never named
        (its cursor written before cursors moved to the WAL, or under another storage
        mode) resumes from the store's record. Every cursor is checkpointed at once (the
        migration: from then on the WAL has each one)."""
        wal = self.topic_log.wal
        assert wal is not None
        # From the durable store: only for names the metadata store lists (existence is
        # its word: a deletion settled after that segment must not bring one back).
        listed_names = {state.name for state in states}
        newest = {name: state for name, state in (carried or {}).items() if name in listed_names}
        newest.update(wal.checkpoints())
        newest.update(dict.fromkeys(wal.deleted_subscriptions()))
        from_wal: dict[str, SubscriptionState] = {}
        for name, checkpoint in newest.items():
            if checkpoint is None:
                continue
            try:
                record = cr.decode_cursor(checkpoint)
            except InvalidArgument as exc:
                log.error("%s:%s: WAL cursor checkpoint unreadable (%s); resuming from the metadata store's",
                          self.topic, name, exc)
                continue
            from_wal[name] = SubscriptionState(
                name=name, sub_type=record.sub_type, cursor=record.cursor, acked_above=record.acked_above,
                policy=record.policy, max_unacked_messages=record.max_unacked_messages, delayed=record.delayed)
        deleted = {name for name, checkpoint in newest.items() if checkpoint is None}
        resumed = dict(from_wal)
        for state in states:
            if state.name in deleted:
                self.store_pending.append(ForgetSubscription(topic=self.topic, subscription=state.name))
            elif state.name not in resumed:
                resumed[state.name] = state
            else:  # settings from the store: an admin's change is written there before its answer
                resumed[state.name] = dataclasses.replace(
                    resumed[state.name], sub_type=state.sub_type, policy=state.policy,
                    max_unacked_messages=state.max_unacked_messages)
        listed = {state.name: state for state in states}
        for name, state in sorted(resumed.items()):
            settings = (state.sub_type, state.policy, state.max_unacked_messages)
            stored = listed.get(name)
            if stored is None or (stored.sub_type, stored.policy, stored.max_unacked_messages) != settings:
                self.store_pending.append(PersistCursor(
                    topic=self.topic, subscription=name, sub_type=state.sub_type, cursor=state.cursor,
                    acked_above=list(state.acked_above), policy=state.policy,
                    max_unacked_messages=state.max_unacked_messages, delayed=state.delayed))
            self.recorded[name] = (settings, state.cursor if stored is None else stored.cursor)
            self.pending_checkpoints[name] = cr.encode(cr.CursorRecord(
                sub_type=state.sub_type, cursor=state.cursor, acked_above=state.acked_above, policy=state.policy,
                max_unacked_messages=state.max_unacked_messages, delayed=state.delayed))
        return [resumed[name] for name in sorted(resumed)]

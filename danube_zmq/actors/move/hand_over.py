"""Moving a reliable topic in storage.mode local: the `HandOver` actor, and the broker's
decisions around it (module functions below).

In `local` mode a reliable topic's WAL is on its broker's disk only, so a move cannot
leave the next broker to read it from a durable store. `topics unload` of such a topic
is carried out by the broker serving it, through a `HandOver` child actor (below: the
move's steps and its resume pause are messages to itself):

1. It picks the next broker (an ACTIVE, live one with the fewest topics) and stops
   serving the topic, keeping its assignment (`StopForHandOver`): clients that come
   back wait here (parked) until the move ends.
2. It offers the WAL segments its subscriptions still need (from the oldest cursor, or
   the compacted view's horizon when lower, to the end) and the newest compacted ledger
   (`storage/wal/handover.py`) to the next broker over its admin port
   (`BeginHandOver`), sends them in chunks of `cluster.move_chunk_bytes_max` with a
   CRC32C each (`HandOverChunk`; after a lost connection it begins again and the
   receiver says how many bytes of each file it holds), then `CommitHandOver`: the
   receiver scans every record (the ledger's too) and puts the files in place of its
   own WAL of the topic.
3. Cursors are written, then one metadata transaction records where the offsets stop
   (`TopicState`) and gives the assignment to the next broker, which loads the topic
   from the WAL it received. The local WAL goes.
4. Anything short of that (no other broker, more than `cluster.move_bytes_max`, the
   receiver refuses, `cluster.move_timeout_ms` passes, the assignment changed
   meanwhile) refuses the unload with the reason and the topic is served here again.

The receiving side (`hand_over_incoming.py`) writes into `data_dir/handover/<topic>/`,
bounded by `cluster.move_bytes_max` per move and `_INCOMING_MAX` moves at once.

A topic whose WAL is on a dead broker's disk only waits for it (`held_by_dead_broker`),
or for `topics reassign --force` (`topic_admin.py`), never orphaned.

The `HandOver` actor, a child of the broker actor for the time of the move. The broker
stops serving the topic (keeping its assignment) and spawns it; each step
is a message to itself, so the move's state and timers are its own:

1. `HandOverBegin`: the offer (the WAL files the subscriptions still need, from the
   oldest cursor, and the compacted ledger, `storage/wal/handover.py`), then
   `BeginHandOver` to the receiver's
   admin port, which answers how many bytes of each file it holds already.
2. `HandOverNextChunk`, once a chunk: one chunk (`cluster.move_chunk_bytes_max`, with
   its CRC32C) sent, then the next message; after the last, `CommitHandOver` (the
   receiver scans every record and installs the files) and the switch: cursors
   written, then one metadata transaction gives the assignment to the receiver and
   records where the offsets stop (`TopicState`).
3. An interruption the receiver may recover from (a lost connection: a retriable
   error) begins again by a timer message after `_RESUME_PAUSE_MS`, at most
   `_RESUMES_MAX` times; anything else, or `cluster.move_timeout_ms` passing, aborts:
   the receiver is told (`AbortHandOver`), a move the load manager asked for (an
   unsealed marker) is assigned back here, and the broker serves the topic again.

Either way the broker is told `HandOverEnded` (and stops this actor), and `done`
(the admin request's future, for an unload asked here) gets the refusal (the
`DanubeError`) or None.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from pathlib import Path
from typing import Any

import crc32c

from danube_zmq.actors.broker.topic_registry import Registry
from danube_zmq.actors.cluster.peer_link import PeerLink
from danube_zmq.config.broker_config import BrokerConfig
from danube_zmq.consensus.metadata_store import RaftMetadataStore
from danube_zmq.runtime.actor import Actor
from danube_zmq.security.curve import ClusterCurve
from danube_zmq.storage.wal.handover import Offer, offered_files, read_chunk
from danube_zmq.transport import admin_protocol as ap
from danube_zmq.transport import client_protocol as cp
from danube_zmq.transport import cluster_records as cr
from danube_zmq.transport.codec import Message
from danube_zmq.transport.errors import DanubeError, FailedPrecondition, InternalError, Unavailable
from danube_zmq.transport.internal_protocol import (
    FlushCursors,
    HandOverBegin,
    HandOverEnded,
    HandOverNextChunk,
    PersistedSubscriptions,
    SubscriptionsOf,
)
from danube_zmq.transport.topic_name import parse_topic

__all__ = ["HandOver", "held_by_dead_broker", "held_by_dead_broker_text", "marked_move", "move_target", "moves_by_handover"]

log = logging.getLogger("danube_zmq.broker")

# A lost connection during a move is resumed this many times (within the deadline).
_RESUMES_MAX = 5
_RESUME_PAUSE_MS = 200


class HandOver(Actor):
    def __init__(self, *, topic: str, target: cr.BrokerRegistration | None, refusal: str | None,
                 marker: cr.Unassigned | None, handover_id: int, broker_id: int, broker_endpoint: str,
                 flusher_endpoint: str, metadata: RaftMetadataStore, config: BrokerConfig, wal_dir: Path,
                 done: asyncio.Future[DanubeError | None] | None, curve: ClusterCurve | None = None) -> None:
        self.topic = topic
        self.curve = curve  # security.mode curve: the receiver's admin port is dialed with the cluster pair
        self.target = target
        self.refusal = refusal  # no receiver could be chosen: refused at the first step
        self.marker = marker  # the load manager's unsealed marker; None: an unload asked here
        self.handover_id = handover_id
        self.broker_id = broker_id
        self.broker_endpoint = broker_endpoint
        self.flusher_endpoint = flusher_endpoint
        self.metadata = metadata
        self.config = config
        self.wal_dir = wal_dir
        self.done = done
        self.deadline_ms = 0
        self.started_ms = 0
        self.offer: Offer | None = None
        self.held: list[int] = []  # bytes of each offered file the receiver holds
        self.file_index = 0
        self.resumes = 0
        self.client: PeerLink | None = None  # to the receiver's admin port, while connected
        self.ended = False

    async def on_start(self) -> None:
        self.started_ms = self.system.clock.monotonic_ms()
        self.deadline_ms = self.started_ms + self.config.cluster.move_timeout_ms
        self.system.post(self.endpoint, HandOverBegin())

    async def on_stop(self) -> None:
        self._close()
        if self.ended or self.restarting:
            return
        if self.system.is_alive(self.broker_endpoint):  # it gave up after repeated failures
            await self._abort(InternalError(f"topic {self.topic}: its hand-over failed; it stays on broker"
                                            f" {self.broker_id}"))
        elif self.done is not None and not self.done.done():  # the broker stops
            self.done.set_result(Unavailable(f"broker {self.broker_id} stopped during the move of {self.topic}"))

    # ------------------------------------------------------------- the steps
    async def handle_HandOverBegin(self, msg: HandOverBegin) -> None:
        if self.ended:
            return
        if self.target is None:
            await self._abort(FailedPrecondition(self.refusal or f"topic {self.topic}: no broker to move it to"))
            return
        if self._past_deadline():
            await self._abort(self._too_late())
            return
        try:
            if self.offer is None:
                # Cursors still in the topics' mailboxes are newer, so never lower: these hand over enough.
                answer = await self.system.ask(self.flusher_endpoint, SubscriptionsOf(topic=self.topic))
                assert isinstance(answer, PersistedSubscriptions)
                # Delayed messages a subscription holds keep the log from the lowest of them.
                cursors = [s.retained_cursor() for s in answer.states]
                self.offer = await asyncio.to_thread(self._make_offer, min(cursors) if cursors else None)
            offer = self.offer
            files = [ap.HandOverFile(name=f.name, size_bytes=f.size_bytes) for f in offer.files]
            progress = await self._call(lambda rid: ap.BeginHandOver(
                request_id=rid, topic=self.topic, handover_id=self.handover_id, files=files,
                next_offset=offer.next_offset))
            assert isinstance(progress, ap.HandOverProgress)
            self.held = list(progress.held_bytes)
            self.file_index = 0
        except DanubeError as exc:
            await self._interrupted(exc)
            return
        self.system.post(self.endpoint, HandOverNextChunk())

    async def handle_HandOverNextChunk(self, msg: HandOverNextChunk) -> None:
        if self.ended:
            return
        if self._past_deadline():
            await self._abort(self._too_late())
            return
        offer = self.offer
        assert offer is not None
        while self.file_index < len(offer.files) and self.held[self.file_index] >= offer.files[self.file_index].size_bytes:
            self.file_index += 1
        try:
            if self.file_index == len(offer.files):
                await self._call(lambda rid: ap.CommitHandOver(
                    request_id=rid, topic=self.topic, handover_id=self.handover_id))
            else:
                index, offered = self.file_index, offer.files[self.file_index]
                position = self.held[index]
                data = await asyncio.to_thread(read_chunk, offered.path, position, min(
                    self.config.cluster.move_chunk_bytes_max, offered.size_bytes - position))
                if not data:
                    raise FailedPrecondition(f"{offered.path} shrank while it was handed over")
                await self._call(lambda rid: ap.HandOverChunk(
                    request_id=rid, topic=self.topic, handover_id=self.handover_id, file_index=index,
                    position=position, data=data, crc32c=crc32c.crc32c(data)))
                self.held[index] = position + len(data)
                self.system.post(self.endpoint, HandOverNextChunk())
                return
        except DanubeError as exc:
            await self._interrupted(exc)
            return
        try:
            await self._switch(offer)
        except DanubeError as exc:
            await self._abort(exc)
            return
        self._end(None)
        assert self.target is not None
        log.info("topic %s moved to broker %d: %d WAL files, %d bytes handed over in %.3f s", self.topic,
                 self.target.broker_id, len(offer.files), offer.total_bytes,
                 (self.system.clock.monotonic_ms() - self.started_ms) / 1000)

    # ------------------------------------------------------------- helpers
    def _make_offer(self, needed_from: int | None) -> Offer:
        """The WAL files to hand over (runs in a thread, the topic stopped)."""
        offer = offered_files(self.wal_dir, needed_from, segment_bytes_max=self.config.storage.wal_segment_bytes_max,
                              clock=self.system.clock)
        limit = self.config.cluster.move_bytes_max
        if offer.total_bytes > limit:
            raise FailedPrecondition(f"topic {self.topic}: its subscriptions and compacted view need"
                                     f" {offer.total_bytes} bytes of WAL,"
                                     f" more than cluster.move_bytes_max ({limit}) a move hands over;"
                                     f" it stays on broker {self.broker_id}")
        return offer

    async def _call(self, build: Any, *, bounded: bool = True) -> Message:
        """One request to the receiver's admin port, within what is left of the deadline
        (`bounded`; else within `cluster.request_timeout_ms`)."""
        assert self.target is not None
        request_ms = self.config.cluster.request_timeout_ms
        timeout_ms = max(1, min(request_ms, self.deadline_ms - self.system.clock.monotonic_ms())) if bounded \
            else request_ms
        client = self.client
        try:
            if client is None:
                client = self.client = PeerLink(self.target.admin_url, timeout_ms=request_ms,
                                                client_name=f"broker-{self.broker_id}", curve=self.curve)
                await client.connect()
            return await client.call(build, timeout_ms=timeout_ms)
        except DanubeError as exc:
            if isinstance(exc, Unavailable) or client.connected is None:
                self._close()  # a fresh connection next time
            raise

    def _close(self) -> None:
        if self.client is not None:
            self.client.close()
            self.client = None

    def _past_deadline(self) -> bool:
        return self.system.clock.monotonic_ms() >= self.deadline_ms

    def _too_late(self) -> DanubeError:
        assert self.target is not None
        return Unavailable(f"topic {self.topic}: its WAL was not handed over to broker {self.target.broker_id} within"
                           f" cluster.move_timeout_ms ({self.config.cluster.move_timeout_ms} ms);"
                           f" it stays on broker {self.broker_id}")

    async def _interrupted(self, exc: DanubeError) -> None:
        """Begin again after a pause (a timer message) if the receiver may recover, else abort."""
        if not exc.retriable or self.resumes >= _RESUMES_MAX:
            await self._abort(exc)
            return
        self.resumes += 1
        assert self.target is not None
        log.warning("hand-over of %s to broker %d interrupted (%s); resuming", self.topic, self.target.broker_id,
                    exc.message)
        self.system.schedule_once(self.endpoint, _RESUME_PAUSE_MS, HandOverBegin())

    async def _switch(self, offer: Offer) -> None:
        """Cursors written, then where the offsets stop and the new owner in one transaction."""
        assert self.target is not None
        await self.system.ask(self.flusher_endpoint, FlushCursors(),
                              timeout_ms=2 * self.config.cluster.request_timeout_ms)
        topic, store, target = self.topic, self.metadata, self.target.broker_id
        key, state_key, marker_key = cr.assignment_key(topic), cr.topic_state_key(topic), cr.unassigned_key(topic)
        now_ms = self.system.clock.now_ms()
        state = cr.encode(cr.TopicState(next_offset=offer.next_offset, broker_id=self.broker_id, sealed_ms=now_ms,
                                        reserved_until=offer.next_offset))
        if self.marker is not None:  # the load manager's move: its marker gives way to the assignment
            current = await store.get(marker_key)
            if current is None or not await store.transaction(
                    {marker_key: current.version, key: 0},
                    {key: cr.encode(cr.Assignment(broker_id=target, epoch=self.marker.epoch + 1, assigned_ms=now_ms)),
                     state_key: state}, [marker_key]):
                raise FailedPrecondition(f"topic {topic}: its move changed meanwhile")
            return
        current = await store.get(key)  # linearizable
        if current is None or cr.decode(current.value, cr.Assignment).broker_id != self.broker_id:
            raise FailedPrecondition(f"topic {topic} was reassigned during its move; retry")
        assignment = cr.decode(current.value, cr.Assignment)
        state_value = store.local_get(state_key)
        puts = {key: cr.encode(cr.Assignment(broker_id=target, epoch=assignment.epoch + 1, assigned_ms=now_ms)),
                state_key: state}
        try:
            switched = await store.transaction(
                {key: current.version, state_key: state_value.version if state_value is not None else 0}, puts)
        except DanubeError:
            # The answer was lost, not necessarily the write: the store says which.
            after = await store.get(key)
            switched = after is not None and cr.decode(after.value, cr.Assignment).broker_id == target
        if not switched:
            raise FailedPrecondition(f"topic {topic}: its assignment or offsets changed during its move; retry")

    async def _abort(self, exc: DanubeError) -> None:
        """The receiver drops what it got; a marked move is assigned back here; the topic
        is served here again."""
        target = self.target
        log.error("topic %s not moved to broker %s: %s", self.topic, target.broker_id if target else "-", exc.message)
        if target is not None:
            with contextlib.suppress(DanubeError):
                await self._call(lambda rid: ap.AbortHandOver(request_id=rid, topic=self.topic,
                                                               handover_id=self.handover_id), bounded=False)
        if self.marker is not None:
            key, marker_key = cr.assignment_key(self.topic), cr.unassigned_key(self.topic)
            current = self.metadata.local_get(marker_key)
            try:
                if current is not None and await self.metadata.transaction(
                        {marker_key: current.version, key: 0},
                        {key: cr.encode(cr.Assignment(broker_id=self.broker_id, epoch=self.marker.epoch + 1,
                                                      assigned_ms=self.system.clock.now_ms()))}, [marker_key]):
                    log.error("topic %s stays on broker %d: %s", self.topic, self.broker_id, exc.message)
            except DanubeError as again:
                log.error("topic %s: its move failed (%s) and it was not assigned back here (%s)", self.topic,
                          exc.message, again.message)
        self._end(exc)

    def _end(self, error: DanubeError | None) -> None:
        self.ended = True
        self._close()
        self.system.post(self.broker_endpoint, HandOverEnded(
            topic=self.topic, error=None if error is None else error.message, hand_over=self.endpoint))
        if self.done is not None and not self.done.done():
            self.done.set_result(error)


def moves_by_handover(config: BrokerConfig, registry: Registry, topic: str) -> bool:
    """Whether unloading `topic` hands its WAL over (reliable, storage.mode local)."""
    if config.storage.mode != "local":
        return False
    resolved = registry.resolve_local(parse_topic(topic))
    return resolved is not None and resolved.record.dispatch_strategy == cp.DispatchStrategy.RELIABLE


def move_target(metadata: RaftMetadataStore, broker_id: int, topic: str) -> cr.BrokerRegistration:
    """The live ACTIVE broker other than `broker_id` with the fewest topics."""
    store = metadata
    topics = Counter(_owner_id(value.value) for _, value in store.local_scan(cr.ASSIGNMENTS))
    candidates = []
    for key, value in store.local_scan(cr.REGISTER):
        registration = cr.decode(value.value, cr.BrokerRegistration)
        mode = store.local_get(cr.state_key(registration.broker_id))
        if registration.broker_id == broker_id or (
                mode is not None and cr.decode(mode.value, cr.BrokerStateRecord).mode != cr.BrokerMode.ACTIVE):
            continue
        if store.stopped_renewing(key):
            continue  # missed its last renewal: may be dead
        candidates.append(registration)
    if not candidates:
        raise FailedPrecondition(f"topic {topic}: no other live active broker to move it to;"
                                 f" it stays on broker {broker_id}")
    return min(candidates, key=lambda r: (topics[r.broker_id], r.broker_id))


def marked_move(config: BrokerConfig, registry: Registry, broker_id: int, topic: str) -> tuple[
        cr.Unassigned, cr.BrokerRegistration | None, str | None] | None:
    """A rebalance or drain (an unsealed marker from `broker_id`) of `topic` that moves by
    hand-over: the load manager's marker, the receiver (the marker's, else the least
    loaded other broker) and, when there is none, why (the actor's first step refuses
    it: the topic is assigned back here). None: no such move."""
    if not moves_by_handover(config, registry, topic):
        return None
    value = registry.metadata.local_get(cr.unassigned_key(topic))
    marker = None if value is None else cr.decode(value.value, cr.Unassigned)
    if marker is None or marker.sealed or marker.from_broker != broker_id:
        return None
    target = registry.registration(marker.to_broker) if marker.to_broker is not None else None
    refusal = None
    if target is None or target.broker_id == broker_id:
        try:
            target = move_target(registry.metadata, broker_id, topic)
        except DanubeError as exc:
            target, refusal = None, exc.message
    return marker, target, refusal


def held_by_dead_broker(config: BrokerConfig, registry: Registry, broker_id: int, topic: str) -> int | None:
    """The broker whose disk alone holds `topic`'s WAL, when its registration ended:
    the topic waits for it, or for `topics reassign --force` (never orphaned)."""
    if not moves_by_handover(config, registry, topic):
        return None
    assignment = registry.assignment(topic)
    if assignment is not None:
        holder: int | None = assignment.broker_id
    else:
        value = registry.metadata.local_get(cr.unassigned_key(topic))
        marker = None if value is None else cr.decode(value.value, cr.Unassigned)
        holder = None if marker is None or marker.sealed else marker.from_broker
    if holder is None or holder == broker_id or registry.registration(holder) is not None:
        return None
    return holder


def held_by_dead_broker_text(topic: str, holder: int) -> str:
    return (f"topic {topic} is not served: its WAL is on broker {holder}'s disk only (storage.mode local) and"
            f" broker {holder} is gone; it is served again when broker {holder} comes back, or after"
            f" `danube admin topics reassign {topic} --force` gives up what only that WAL holds")


def _owner_id(value: bytes) -> int | None:
    with contextlib.suppress(DanubeError):
        return cr.decode(value, cr.Assignment).broker_id
    return None

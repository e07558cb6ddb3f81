"""Moving a reliable topic in storage.mode local, a part of `BrokerActor`.

In `local` mode a reliable topic's WAL is on its broker's disk only, so a move cannot
leave the next broker to read it from a durable store. `topics unload` of such a topic
is carried out by the broker serving it, through a `HandOver` child actor (`hand_over.py`:
the move's steps and its resume pause are messages to itself):

1. It picks the next broker (an ACTIVE, live one with the fewest topics) and stops
   serving the topic, keeping its assignment (`StopForHandOver`): clients that come
   back wait here (parked) until the move ends.
2. It offers the WAL segments its subscriptions still need (from the oldest cursor to
   the end, `storage/wal/handover.py`) to the next broker over its admin port
   (`BeginHandOver`), sends them in chunks of `cluster.move_chunk_bytes_max` with a
   CRC32C each (`HandOverChunk`; after a lost connection it begins again and the
   receiver says how many bytes of each file it holds), then `CommitHandOver`: the
   receiver scans every record and puts the files in place of its own WAL of the topic.
3. Cursors are written, then one metadata transaction records where the offsets stop
   (`TopicState`) and gives the assignment to the next broker, which loads the topic
   from the WAL it received. The local WAL goes.
4. Anything short of that (no other broker, more than `cluster.move_bytes_max`, the
   receiver refuses, `cluster.move_timeout_ms` passes, the assignment changed
   meanwhile) refuses the unload with the reason and the topic is served here again.

The receiving side (`handle_BeginHandOver` ...) writes into `data_dir/handover/<topic>/`,
bounded by `cluster.move_bytes_max` per move and `_INCOMING_MAX` moves at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import shutil
from collections import Counter
from pathlib import Path

from danube_zmq.actors.hand_over import HandOver
from danube_zmq.runtime.actor import Origin
from danube_zmq.storage.wal.handover import Incoming
from danube_zmq.transport import admin_protocol as ap
from danube_zmq.transport import client_protocol as cp
from danube_zmq.transport import cluster_records as cr
from danube_zmq.transport.codec import Message
from danube_zmq.transport.common import Ok
from danube_zmq.transport.errors import DanubeError, FailedPrecondition, NotFound, ResourceExhausted, Unavailable
from danube_zmq.transport.internal_protocol import HandOverEnded, HandOverStopped, StopForHandOver
from danube_zmq.transport.topic_name import parse_topic

log = logging.getLogger("danube_zmq.broker")

# Moves this broker receives at once.
_INCOMING_MAX = 16


class BrokerHandOver:
    """Mixed into `BrokerActor`; uses its topics, metadata store and admin clients."""

    # ------------------------------------------------------------- the sending side
    def _moves_by_handover(self, topic: str) -> bool:
        """Whether unloading `topic` hands its WAL over (reliable, storage.mode local)."""
        if self.config.storage.mode != "local":
            return False
        resolved = self._resolve_local(parse_topic(topic))
        return resolved is not None and resolved.record.dispatch_strategy == cp.DispatchStrategy.RELIABLE

    async def _unload_by_handover(self, topic: str, msg: ap.UnloadTopic) -> None:
        """Move `topic` here, or ask the broker serving it to (it answers once moved)."""
        if topic in self.topics:
            await self._hand_over(topic)
            return
        owner = self._elsewhere(topic)
        if owner is None:
            raise Unavailable(f"topic {topic} is not served by a live broker right now; retry")
        timeout_ms = self.config.cluster.move_timeout_ms + 2 * self.config.cluster.request_timeout_ms
        await self._remote(owner.admin_url, lambda rid: dataclasses.replace(msg, request_id=rid, topic=topic),
                           timeout_ms=timeout_ms)

    async def _hand_over(self, topic: str) -> None:
        """Carry out an unload asked here (in the admin request's task): the topic stops,
        a `HandOver` child moves it, and the task waits for its end."""
        target = self._move_target(topic)
        await self.system.ask(self.endpoint, StopForHandOver(topic=topic))
        done: asyncio.Future[DanubeError | None] = asyncio.get_running_loop().create_future()
        await self._spawn_hand_over(topic, target, None, None, done)
        error = await done
        if error is not None:
            raise error

    async def _start_marked_hand_over(self, topic: str) -> bool:
        """A rebalance or drain (an unsealed marker from this broker) of a topic just
        stopped here that moves by hand-over: carried out by a `HandOver` child; True if
        started."""
        if not self._moves_by_handover(topic):
            return False
        value = self.metadata.local_get(cr.unassigned_key(topic))
        marker = None if value is None else cr.decode(value.value, cr.Unassigned)
        if marker is None or marker.sealed or marker.from_broker != self.broker_id:
            return False
        self.moving_topics.add(topic)
        target = self._registration(marker.to_broker) if marker.to_broker is not None else None
        refusal = None
        if target is None or target.broker_id == self.broker_id:
            try:
                target = self._move_target(topic)
            except DanubeError as exc:  # refused by the actor's first step: assigned back here
                target, refusal = None, exc.message
        await self._spawn_hand_over(topic, target, refusal, marker, None)
        return True

    async def _spawn_hand_over(self, topic: str, target: cr.BrokerRegistration | None, refusal: str | None,
                               marker: cr.Unassigned | None, done: asyncio.Future[DanubeError | None] | None) -> None:
        config, metadata, broker_id, broker = self.config, self.metadata, self.broker_id, self.endpoint
        flusher, wal_dir, handover_id = self.flusher_endpoint, self._wal_dir(parse_topic(topic)), self.rng.getrandbits(63)
        curve = self.curve
        await self.system.spawn(lambda: HandOver(
            topic=topic, target=target, refusal=refusal, marker=marker, handover_id=handover_id, broker_id=broker_id,
            broker_endpoint=broker, flusher_endpoint=flusher, metadata=metadata, config=config, wal_dir=wal_dir,
            done=done, curve=curve), name=f"hand-over {topic}", parent=broker)

    def _move_target(self, topic: str) -> cr.BrokerRegistration:
        """The live ACTIVE broker other than this one with the fewest topics."""
        store = self.metadata
        topics = Counter(_owner_id(value.value) for _, value in store.local_scan(cr.ASSIGNMENTS))
        candidates = []
        for key, value in store.local_scan(cr.REGISTER):
            registration = cr.decode(value.value, cr.BrokerRegistration)
            mode = store.local_get(cr.state_key(registration.broker_id))
            if registration.broker_id == self.broker_id or (
                    mode is not None and cr.decode(mode.value, cr.BrokerStateRecord).mode != cr.BrokerMode.ACTIVE):
                continue
            if store.stopped_renewing(key):
                continue  # missed its last renewal: may be dead
            candidates.append(registration)
        if not candidates:
            raise FailedPrecondition(f"topic {topic}: no other live active broker to move it to;"
                                     f" it stays on broker {self.broker_id}")
        return min(candidates, key=lambda r: (topics[r.broker_id], r.broker_id))

    async def handle_StopForHandOver(self, msg: StopForHandOver) -> Message:
        if msg.topic in self.moving_topics:
            raise FailedPrecondition(f"topic {msg.topic} is being moved already")
        if msg.topic not in self.topics or not self.lease_held:
            raise FailedPrecondition(f"topic {msg.topic} is not served by broker {self.broker_id}; retry")
        self.moving_topics.add(msg.topic)
        await self._stop_topic(msg.topic)
        return HandOverStopped(topic=msg.topic)

    async def handle_HandOverEnded(self, msg: HandOverEnded) -> None:
        if msg.hand_over is not None:
            await self.system.stop(msg.hand_over)
        self.moving_topics.discard(msg.topic)
        if msg.error is None:
            await asyncio.to_thread(shutil.rmtree, self._wal_dir(parse_topic(msg.topic)), True)
        elif (assignment := self._assignment(msg.topic)) is not None and assignment.broker_id == self.broker_id:
            await self._load(msg.topic)  # else its assignment, when it comes back here, loads it
        await self._wake(msg.topic)

    # ------------------------------------------------------------- the receiving side
    def _incoming_for(self, topic: str, handover_id: int) -> Incoming:
        incoming = self.incoming_moves.get(topic)
        if incoming is None or incoming.directory.name != f"{handover_id:020d}":
            raise FailedPrecondition(f"no hand-over {handover_id} of {topic} is under way here; begin it again")
        return incoming

    def _handover_staging(self, topic: str) -> Path:
        name = parse_topic(topic)
        return self.data_dir / "handover" / name.namespace / name.topic

    def _handed_topic(self, topic: str) -> str:
        """The full name of a topic a hand-over message names: an existing one only, so a
        stray or hostile message never makes a staging directory for any name."""
        resolved = self._resolve_local(parse_topic(topic))
        if resolved is None or resolved.partitioned_base:
            raise NotFound(f"topic {topic} does not exist here: nothing to hand over")
        return resolved.name.full

    async def handle_BeginHandOver(self, msg: ap.BeginHandOver, origin: Origin) -> Message:
        topic = self._handed_topic(msg.topic)
        incoming = Incoming(self._handover_staging(topic), msg.handover_id,  # checks every file name first
                            [(f.name, f.size_bytes) for f in msg.files], msg.next_offset)
        if topic in self.topics or topic in self.moving_topics:
            raise FailedPrecondition(f"topic {topic} is served by broker {self.broker_id}: it cannot be handed here")
        total = sum(f.size_bytes for f in msg.files)
        limit = self.config.cluster.move_bytes_max
        if total > limit:
            raise FailedPrecondition(f"topic {topic}: {total} bytes of WAL offered, more than broker {self.broker_id}"
                                     f" takes in one move (cluster.move_bytes_max {limit})")
        if topic not in self.incoming_moves and len(self.incoming_moves) >= _INCOMING_MAX:
            raise ResourceExhausted(f"broker {self.broker_id} receives {_INCOMING_MAX} moves already; retry")
        held = await asyncio.to_thread(incoming.begin)
        self.incoming_moves[topic] = incoming
        return ap.HandOverProgress(request_id=msg.request_id, held_bytes=held)

    async def handle_HandOverChunk(self, msg: ap.HandOverChunk, origin: Origin) -> Message:
        incoming = self._incoming_for(self._handed_topic(msg.topic), msg.handover_id)
        await asyncio.to_thread(incoming.write, msg.file_index, msg.position, msg.data, msg.crc32c)
        return Ok(request_id=msg.request_id)

    async def handle_CommitHandOver(self, msg: ap.CommitHandOver, origin: Origin) -> Message:
        topic = self._handed_topic(msg.topic)
        incoming = self._incoming_for(topic, msg.handover_id)
        if topic in self.topics:
            raise FailedPrecondition(f"topic {topic} is served by broker {self.broker_id}: it cannot be handed here")
        try:
            next_offset = await asyncio.to_thread(incoming.verify_and_install, self._wal_dir(parse_topic(topic)),
                                                  clock=self.system.clock)
        except DanubeError:
            self.incoming_moves.pop(topic, None)
            await asyncio.to_thread(incoming.abort)
            raise
        self.incoming_moves.pop(topic, None)
        log.info("topic %s: WAL received up to offset %d; served here once its assignment arrives", topic,
                 next_offset)
        return Ok(request_id=msg.request_id)

    async def handle_AbortHandOver(self, msg: ap.AbortHandOver, origin: Origin) -> Message:
        topic = self._handed_topic(msg.topic)
        incoming = self.incoming_moves.get(topic)
        if incoming is not None and incoming.directory.name == f"{msg.handover_id:020d}":
            del self.incoming_moves[topic]
            await asyncio.to_thread(incoming.abort)
        return Ok(request_id=msg.request_id)


    # -------------------------------------------- a dead broker's topics (operator forced)
    def _held_by_dead_broker(self, topic: str) -> int | None:
        """The broker whose disk alone holds `topic`'s WAL, when its registration ended:
        the topic waits for it, or for `topics reassign --force` (never orphaned)."""
        if not self._moves_by_handover(topic):
            return None
        assignment = self._assignment(topic)
        if assignment is not None:
            holder: int | None = assignment.broker_id
        else:
            value = self.metadata.local_get(cr.unassigned_key(topic))
            marker = None if value is None else cr.decode(value.value, cr.Unassigned)
            holder = None if marker is None or marker.sealed else marker.from_broker
        if holder is None or holder == self.broker_id or self._registration(holder) is not None:
            return None
        return holder

    def _held_by_dead_broker_text(self, topic: str, holder: int) -> str:
        return (f"topic {topic} is not served: its WAL is on broker {holder}'s disk only (storage.mode local) and"
                f" broker {holder} is gone; it is served again when broker {holder} comes back, or after"
                f" `danube admin topics reassign {topic} --force` gives up what only that WAL holds")

    async def handle_ReassignTopic(self, msg: ap.ReassignTopic, origin: Origin) -> Message:
        """What forcing a dead broker's local-mode topic elsewhere gives up (from the
        oldest cursor to the end of that broker's reservation); with `force`, a sealed
        failover marker hands it to the load manager, which places it on a live broker
        that continues past every offset the dead one reserved."""
        resolved = await self._existing(parse_topic(msg.topic))
        topic = resolved.name.full
        if resolved.partitioned_base:
            raise FailedPrecondition(f"topic {topic} has partitions: reassign each partition ({topic}-part-0 ...)")
        if not self._moves_by_handover(topic):
            raise FailedPrecondition(f"topic {topic} needs no forced reassignment: only a reliable topic in"
                                     f" storage.mode local waits for its broker; the others fail over by themselves")
        key, marker_key = cr.assignment_key(topic), cr.unassigned_key(topic)
        current = await self.metadata.get(key)  # linearizable
        marker_value = await self.metadata.get(marker_key)
        if current is not None:
            assignment = cr.decode(current.value, cr.Assignment)
            holder, epoch = assignment.broker_id, assignment.epoch
            expected, deletes = {key: current.version, marker_key: 0}, [key]
        else:
            marker = None if marker_value is None else cr.decode(marker_value.value, cr.Unassigned)
            if marker is None or marker.sealed or marker.from_broker is None:
                raise FailedPrecondition(f"topic {topic} is held by no broker (the load manager is placing it):"
                                         f" nothing to reassign")
            assert marker_value is not None
            holder, epoch = marker.from_broker, marker.epoch
            expected, deletes = {marker_key: marker_value.version}, []
        if await self.metadata.get(cr.register_key(holder)) is not None:
            raise FailedPrecondition(f"topic {topic} is held by broker {holder}, which is alive: move it with"
                                     f" `danube admin topics unload {topic}` (its WAL is handed over, nothing lost)")
        state_value = await self.metadata.get(cr.topic_state_key(topic))
        state = None if state_value is None else cr.decode(state_value.value, cr.TopicState)
        next_offset = 0 if state is None else max(state.next_offset, state.reserved_until)
        subscriptions = await self._subscriptions_of(resolved.name)
        oldest = min(subscriptions, key=lambda s: s.cursor, default=None)
        lost_start = None if oldest is None or oldest.cursor + 1 >= next_offset else oldest.cursor + 1
        reason = (f"broker {holder} is gone and its disk alone holds the topic's WAL; offsets up to its reservation"
                  f" ({next_offset}) may have been given out")
        if msg.force:
            now_ms = self.system.clock.now_ms()
            failover = cr.Unassigned(reason=cr.UnassignedReason.FAILOVER, from_broker=holder, epoch=epoch,
                                     since_ms=now_ms, sealed=True)
            if not await self.metadata.transaction(expected, {marker_key: cr.encode(failover)}, deletes):
                raise FailedPrecondition(f"topic {topic} changed hands meanwhile: run the reassignment again")
            log.error("topic %s forced off dead broker %d: offsets %s are given up; the next broker starts at %d",
                      topic, holder, "none" if lost_start is None else f"{lost_start}..{next_offset - 1}", next_offset)
        return ap.TopicReassignment(
            request_id=msg.request_id, topic=topic, reassigned=msg.force, from_broker=holder, reason=reason,
            lost_start=lost_start, lost_end=None if lost_start is None else next_offset,
            subscription=None if lost_start is None or oldest is None else oldest.name, next_offset=next_offset)


def _owner_id(value: bytes) -> int | None:
    with contextlib.suppress(DanubeError):
        return cr.decode(value, cr.Assignment).broker_id
    return None


"""The receiving side of a hand-over (storage.mode local): a helper of the broker
actor, which hands it `BeginHandOver`, `HandOverChunk`, `CommitHandOver` and
`AbortHandOver` from the sending broker (`hand_over.py` has the sending side).

1. Begin: the topic must exist and be neither served nor moving here; what is offered
   must fit `cluster.move_bytes_max`; at most `_INCOMING_MAX` moves at once. The staging
   directory `data_dir/handover/<topic>/` says how many bytes of each file it holds
   already (a resumed move sends the rest).
2. Chunk: written at its position, checked against its CRC32C.
3. Commit: every record is scanned (the segments' and the compacted ledger's, whose
   damage refuses the move) and the files put in place of the topic's WAL here;
   the topic is served here once the sender gives its assignment to this broker.
4. Abort: what was received goes.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path

from danube_zmq.actors.broker.topic_registry import Registry, TopicEntry
from danube_zmq.clock import Clock
from danube_zmq.config.broker_config import BrokerConfig
from danube_zmq.storage.wal.handover import Incoming
from danube_zmq.transport import admin_protocol as ap
from danube_zmq.transport.codec import Message
from danube_zmq.transport.common import Ok
from danube_zmq.transport.errors import DanubeError, FailedPrecondition, NotFound, ResourceExhausted
from danube_zmq.transport.topic_name import TopicName, parse_topic

__all__ = ["IncomingMoves"]

log = logging.getLogger("danube_zmq.broker")

# Moves this broker receives at once.
_INCOMING_MAX = 16


class IncomingMoves:
    def __init__(self, *, registry: Registry, config: BrokerConfig, broker_id: int, data_dir: Path, clock: Clock,
                 topics: dict[str, TopicEntry], moving: set[str], wal_dir: Callable[[TopicName], Path]) -> None:
        self.registry = registry
        self.config = config
        self.broker_id = broker_id
        self.data_dir = data_dir
        self.clock = clock
        self.topics = topics  # the broker's own: served here (read only)
        self.moving = moving  # the broker's own: stopped here while handed elsewhere (read only)
        self.wal_dir = wal_dir
        self.moves: dict[str, Incoming] = {}  # topic -> the WAL being handed here

    def _incoming_for(self, topic: str, handover_id: int) -> Incoming:
        incoming = self.moves.get(topic)
        if incoming is None or incoming.directory.name != f"{handover_id:020d}":
            raise FailedPrecondition(f"no hand-over {handover_id} of {topic} is under way here; begin it again")
        return incoming

    def _handover_staging(self, topic: str) -> Path:
        name = parse_topic(topic)
        return self.data_dir / "handover" / name.namespace / name.topic

    def _handed_topic(self, topic: str) -> str:
        """The full name of a topic a hand-over message names: an existing one only, so a
        stray or hostile message never makes a staging directory for any name."""
        resolved = self.registry.resolve_local(parse_topic(topic))
        if resolved is None or resolved.partitioned_base:
            raise NotFound(f"topic {topic} does not exist here: nothing to hand over")
        return resolved.name.full

    async def begin(self, msg: ap.BeginHandOver) -> Message:
        topic = self._handed_topic(msg.topic)
        incoming = Incoming(self._handover_staging(topic), msg.handover_id,  # checks every file name first
                            [(f.name, f.size_bytes) for f in msg.files], msg.next_offset)
        if topic in self.topics or topic in self.moving:
            raise FailedPrecondition(f"topic {topic} is served by broker {self.broker_id}: it cannot be handed here")
        total = sum(f.size_bytes for f in msg.files)
        limit = self.config.cluster.move_bytes_max
        if total > limit:
            raise FailedPrecondition(f"topic {topic}: {total} bytes of WAL offered, more than broker {self.broker_id}"
                                     f" takes in one move (cluster.move_bytes_max {limit})")
        if topic not in self.moves and len(self.moves) >= _INCOMING_MAX:
            raise ResourceExhausted(f"broker {self.broker_id} receives {_INCOMING_MAX} moves already; retry")
        held = await asyncio.to_thread(incoming.begin)
        self.moves[topic] = incoming
        return ap.HandOverProgress(request_id=msg.request_id, held_bytes=held)

    async def chunk(self, msg: ap.HandOverChunk) -> Message:
        incoming = self._incoming_for(self._handed_topic(msg.topic), msg.handover_id)
        await asyncio.to_thread(incoming.write, msg.file_index, msg.position, msg.data, msg.crc32c)
        return Ok(request_id=msg.request_id)

    async def commit(self, msg: ap.CommitHandOver) -> Message:
        topic = self._handed_topic(msg.topic)
        incoming = self._incoming_for(topic, msg.handover_id)
        if topic in self.topics:
            raise FailedPrecondition(f"topic {topic} is served by broker {self.broker_id}: it cannot be handed here")
        try:
            next_offset = await asyncio.to_thread(incoming.verify_and_install, self.wal_dir(parse_topic(topic)),
                                                  clock=self.clock)
        except DanubeError:
            self.moves.pop(topic, None)
            await asyncio.to_thread(incoming.abort)
            raise
        self.moves.pop(topic, None)
        log.info("topic %s: WAL received up to offset %d; served here once its assignment arrives", topic,
                 next_offset)
        return Ok(request_id=msg.request_id)

    async def abort(self, msg: ap.AbortHandOver) -> Message:
        topic = self._handed_topic(msg.topic)
        incoming = self.moves.get(topic)
        if incoming is not None and incoming.directory.name == f"{msg.handover_id:020d}":
            del self.moves[topic]
            await asyncio.to_thread(incoming.abort)
        return Ok(request_id=msg.request_id)

"""Offset reservations: the actor that writes them to the metadata store.

Reliable topics reserve their offsets in `TopicState.reserved_until`
(`cluster_records.py`) before they acknowledge any of them, so a broker taking a topic
over from a dead one never gives out an offset the dead one may have acknowledged. A
topic asks its broker (`ReserveOffsets`); the broker forwards the asks of topics it
serves here (`ReserveOffsetsFor`: the topic actor to answer, the lease's end).

One mailbox serializes the writes: the asks that arrive while a transaction is on its
way are written together in the next one (`WriteReservations`, posted behind them).
A write that fails is retried every `_RETRY_MS` for `_GIVE_UP_MS`; then each topic is
told `OffsetsReserved(until=0, error)`. Nothing is written once the lease has ended, nor
for a topic the broker released (`TopicReleased`: its seal ended the reservation).
"""

from __future__ import annotations

import asyncio
import logging

from danube_zmq.actors.broker.topic_registry import TopicEntry
from danube_zmq.actors.cluster.ownership import seal_state
from danube_zmq.consensus.metadata_store import RaftMetadataStore
from danube_zmq.runtime.actor import Actor
from danube_zmq.transport import client_protocol as cp
from danube_zmq.transport import cluster_records as cr
from danube_zmq.transport.errors import DanubeError, Unavailable
from danube_zmq.transport.internal_protocol import (
    OffsetsReserved,
    ReserveOffsetsFor,
    TopicReleased,
    WriteReservations,
)

__all__ = ["OffsetReservations", "end_reservations", "write_topic_state"]

log = logging.getLogger("danube_zmq.broker")

_RETRY_MS = 200
# How long a reservation is retried before the topic is told it failed (and how long a
# shutdown waits to end the reservations).
_GIVE_UP_MS = 3_000


class OffsetReservations(Actor):
    def __init__(self, *, metadata: RaftMetadataStore, broker_id: int) -> None:
        self.metadata = metadata
        self.broker_id = broker_id
        self.pending: dict[str, int] = {}  # topic -> the `until` to write
        self.endpoints: dict[str, str] = {}  # topic -> its actor, for the answer
        self.lease_until_ms = 0
        self.failing_since_ms: int | None = None
        self.write_queued = False

    def handle_ReserveOffsetsFor(self, msg: ReserveOffsetsFor) -> None:
        self.endpoints[msg.topic] = msg.endpoint
        self.pending[msg.topic] = max(self.pending.get(msg.topic, 0), msg.until)
        self.lease_until_ms = max(self.lease_until_ms, msg.lease_until_ms)
        self._queue_write()

    def handle_TopicReleased(self, msg: TopicReleased) -> None:
        self.pending.pop(msg.topic, None)
        self.endpoints.pop(msg.topic, None)

    def _queue_write(self) -> None:
        if not self.write_queued:
            self.write_queued = True
            self.system.post(self.endpoint, WriteReservations())

    async def handle_WriteReservations(self, msg: WriteReservations) -> None:
        self.write_queued = False
        if not self.pending:
            return
        wanted, self.pending = self.pending, {}
        try:
            granted = await self._reserve(wanted)
        except DanubeError as exc:
            now_ms = self.system.clock.monotonic_ms()
            if self.failing_since_ms is None:
                self.failing_since_ms = now_ms
            if now_ms - self.failing_since_ms < _GIVE_UP_MS:
                for topic, until in wanted.items():
                    self.pending[topic] = max(self.pending.get(topic, 0), until)
                self.write_queued = True
                self.system.schedule_once(self.endpoint, _RETRY_MS, WriteReservations())
                return
            log.error("offsets of %d topics not reserved: %s", len(wanted), exc)
            for topic in wanted:
                endpoint = self.endpoints.get(topic)
                if endpoint is not None:
                    self.system.post(endpoint, OffsetsReserved(until=0, error=str(exc)))
            self.failing_since_ms = None
            if self.pending:
                self._queue_write()
            return
        self.failing_since_ms = None
        for topic, until in granted.items():
            endpoint = self.endpoints.get(topic)
            if endpoint is not None:
                self.system.post(endpoint, OffsetsReserved(until=until))

    async def _reserve(self, wanted: dict[str, int]) -> dict[str, int]:
        if self.system.clock.monotonic_ms() >= self.lease_until_ms:
            raise Unavailable(f"broker {self.broker_id} holds no lease")
        expect: dict[str, int] = {}
        puts: dict[str, bytes] = {}
        granted: dict[str, int] = {}
        for topic, until in wanted.items():
            if topic not in self.endpoints:
                continue  # released meanwhile: its seal ended the reservation
            key = cr.topic_state_key(topic)
            current = self.metadata.local_get(key)
            state = cr.decode(current.value, cr.TopicState) if current is not None else None
            if state is not None and state.broker_id == self.broker_id:
                until = max(until, state.reserved_until)  # a restarted topic actor asks from its WAL's end
            expect[key] = current.version if current is not None else 0
            puts[key] = cr.encode(cr.TopicState(
                next_offset=state.next_offset if state is not None else 0, broker_id=self.broker_id,
                sealed_ms=state.sealed_ms if state is not None else 0, reserved_until=until))
            granted[topic] = until
        if puts and not await self.metadata.transaction(expect, puts):
            raise Unavailable("a topic's offsets record changed meanwhile")  # re-read and retried
        return granted


async def end_reservations(metadata: RaftMetadataStore, broker_id: int, stopped: dict[str, int], now_ms: int) -> None:
    """At a clean shutdown: each reliable topic's reservation ends where its log ends
    (`stopped`: topic -> its log's end), so that whichever broker serves it next
    continues without a gap (even if this disk is then lost: the durable store has
    everything, the uploads are done). Only the reservations `broker_id` holds."""
    expect: dict[str, int] = {}
    puts: dict[str, bytes] = {}
    for topic, next_offset in stopped.items():
        key = cr.topic_state_key(topic)
        current = metadata.local_get(key)
        if current is None or cr.decode(current.value, cr.TopicState).broker_id != broker_id:
            continue
        expect[key] = current.version
        puts[key] = cr.encode(cr.TopicState(next_offset=next_offset, broker_id=broker_id, sealed_ms=now_ms,
                                            reserved_until=next_offset))
    if not puts:
        return
    async with asyncio.timeout(_GIVE_UP_MS / 1000):
        ended = await metadata.transaction(expect, puts)
    if not ended:
        log.warning("offset reservations changed meanwhile; not ended at shutdown")


async def write_topic_state(metadata: RaftMetadataStore, broker_id: int, entry: TopicEntry, next_offset: int,
                            now_ms: int) -> None:
    """Record where a topic this broker stopped serving stopped its offsets (its
    reservation ends there), unless another broker reserved its offsets since (it took
    the topic over from this one: its record stands)."""
    key = cr.topic_state_key(entry.name.full)
    current = metadata.local_get(key)
    recorded = cr.decode(current.value, cr.TopicState) if current is not None else None
    state = seal_state(me=broker_id, reliable=entry.dispatch_strategy == cp.DispatchStrategy.RELIABLE,
                       current=recorded, next_offset=next_offset, now_ms=now_ms)
    if state is None:
        assert recorded is not None
        log.warning("topic %s: broker %d reserved its offsets since; not sealed here", entry.name.full,
                    recorded.broker_id)
        return
    result = await metadata.compare_and_swap(key, current.version if current is not None else 0, cr.encode(state))
    if not result.succeeded:
        log.warning("topic %s: its offsets record changed meanwhile; not sealed here", entry.name.full)

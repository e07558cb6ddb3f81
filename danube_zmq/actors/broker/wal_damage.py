"""Reliable topics assigned to this broker and not served because their WAL is
damaged, a helper of the broker actor: served again when an operator repairs them
(`topics repair`, `topic_admin.py`), or when they move or are deleted.

A damaged topic is recorded in the metadata store (`/cluster/damaged/{topic}`) before
this broker shows the damage, so no broker moves it elsewhere (where it would be
served from an empty log) and any broker refuses its unload; a record the store did
not take is written again by the cursor flusher. Clients and `topics describe` are
told why the topic is not served (`damage_text`).
"""

from __future__ import annotations

import logging

from danube_zmq.actors.metrics import METRICS
from danube_zmq.clock import Clock
from danube_zmq.consensus.metadata_store import RaftMetadataStore
from danube_zmq.runtime.system import ActorSystem
from danube_zmq.storage.wal.errors import WalDamaged
from danube_zmq.transport import cluster_records as cr
from danube_zmq.transport.errors import DanubeError
from danube_zmq.transport.internal_protocol import ForgetDamage, RecordDamage

__all__ = ["DamagedTopics", "damage_text"]

log = logging.getLogger("danube_zmq.broker")


def damage_text(topic: str, damage: WalDamaged) -> str:
    return (f"topic {topic} is not served: its WAL is damaged ({damage}); offsets from {damage.valid_end} on"
            f" cannot be read. An operator can serve it again, giving them up:"
            f" danube admin topics repair {topic} --accept-loss")


class DamagedTopics:
    def __init__(self, *, system: ActorSystem, metadata: RaftMetadataStore, broker_id: int, clock: Clock,
                 flusher_endpoint: str, flush_interval_ms: int) -> None:
        self.system = system
        self.metadata = metadata
        self.broker_id = broker_id
        self.clock = clock
        self.flusher_endpoint = flusher_endpoint  # the broker's cursor flusher, which writes a record again
        self.flush_interval_ms = flush_interval_ms
        self.topics: dict[str, WalDamaged] = {}

    def get(self, topic: str) -> WalDamaged | None:
        return self.topics.get(topic)

    def __contains__(self, topic: str) -> bool:
        return topic in self.topics

    async def mark(self, topic: str, damage: WalDamaged) -> None:
        log.error("%s", damage_text(topic, damage))
        # Recorded in the store so no broker moves the topic elsewhere, where it would be
        # served from an empty log (actors/load/assign.py), and any broker refuses its unload.
        # Recorded before this broker shows the damage (`topics describe`, UNAVAILABLE): an
        # operator who sees it and then drains this broker must find the record there.
        record = cr.WalDamageRecord(broker_id=self.broker_id, reason=str(damage), valid_end=damage.valid_end,
                                    since_ms=self.clock.now_ms())
        try:
            await self.metadata.put(cr.damaged_key(topic), cr.encode(record))
        except DanubeError as exc:
            # Not left to the topic's next load: an assigned damaged topic is not loaded
            # again, and until the record is there a drain or rebalance would move it.
            log.error("topic %s: its damage not recorded in the metadata store (%s); the cursor flusher writes it"
                      " again every %d ms", topic, exc, self.flush_interval_ms)
            self.system.post(self.flusher_endpoint, RecordDamage(topic=topic, record=cr.encode(record)))
        if topic not in self.topics:
            METRICS.wal_damage.inc()
        self.topics[topic] = damage
        METRICS.wal_damaged_topics.set(len(self.topics))

    async def clear_record(self, topic: str) -> None:
        """A topic served again (repaired, or recovered): its damage record goes."""
        if self.metadata.local_get(cr.damaged_key(topic)) is None:
            return
        try:
            await self.metadata.delete(cr.damaged_key(topic))
        except DanubeError as exc:  # it only holds the topic here: cleared at a next load
            log.error("topic %s: its damage record not cleared (%s)", topic, exc)

    def forget(self, topic: str) -> None:
        if self.topics.pop(topic, None) is not None:
            self.system.post(self.flusher_endpoint, ForgetDamage(topic=topic))  # a record not written yet
            METRICS.wal_damaged_topics.set(len(self.topics))

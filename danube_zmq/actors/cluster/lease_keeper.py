"""The lease keeper: the actor that holds this broker's registration lease.

A child of the broker actor, spawned once the broker has joined the cluster. Its
decisions are `lease.step` (pure); this shell feeds it a `LeaseTick` timer message (a
twelfth of the TTL, at most 50 ms) and the outcome of each renewal, runs the renewals
(`put_with_ttl` of `/cluster/register/{id}`, each in a task that posts `LeaseRenewed`
back, so a metadata store out of reach never holds the fence), and tells the broker
`LeaseChanged`: held until a time (at each renewal), or lost.
"""

from __future__ import annotations

import asyncio
import logging

from danube_zmq.actors.cluster.lease import Lease, Renew, RenewalFailed, Renewed, Serve, Tick, step
from danube_zmq.actors.metrics import METRICS
from danube_zmq.consensus.metadata_store import RaftMetadataStore
from danube_zmq.runtime.actor import Actor
from danube_zmq.runtime.request_tasks import RequestTasks
from danube_zmq.runtime.system import ActorSystem
from danube_zmq.transport.cluster_records import register_key
from danube_zmq.transport.errors import DanubeError
from danube_zmq.transport.internal_protocol import LeaseChanged, LeaseRenewed, LeaseTick

__all__ = ["LeaseKeeper"]

log = logging.getLogger("danube_zmq.broker")

# Renewals in flight at most: one normally; a second while a late one finishes.
_RENEWALS_MAX = 2
# How long the broker may take to make room for a LeaseChanged: as long as `post`.
_TELL_BROKER_MS = 3_600_000


class LeaseKeeper(Actor):
    def __init__(self, *, metadata: RaftMetadataStore, broker_endpoint: str, broker_id: int, key: str,
                 registration: bytes, ttl_ms: int) -> None:
        self.metadata = metadata
        self.broker_endpoint = broker_endpoint
        self.broker_id = broker_id
        self.key = key
        self.registration = registration
        self.ttl_ms = ttl_ms
        self.lease = Lease(ttl_ms=ttl_ms)
        self._renewals = RequestTasks(_RENEWALS_MAX)

    async def on_start(self) -> None:
        self.system.schedule_periodic(self.endpoint, max(1, min(50, self.ttl_ms // 12)), LeaseTick())
        await self._step(Tick(now_ms=self.system.clock.monotonic_ms()))

    async def on_stop(self) -> None:
        await self._renewals.cancel_all()

    async def handle_LeaseTick(self, msg: LeaseTick) -> None:
        await self._step(Tick(now_ms=self.system.clock.monotonic_ms()))

    async def handle_LeaseRenewed(self, msg: LeaseRenewed) -> None:
        now_ms = self.system.clock.monotonic_ms()
        METRICS.lease_renewals.labels("renewed" if msg.renewed else "failed").inc()
        if msg.renewed:
            await self._step(Renewed(sent_ms=msg.sent_ms, now_ms=now_ms))
        else:
            log.warning("broker %d could not renew its lease (%s)", self.broker_id, msg.error)
            await self._step(RenewalFailed(sent_ms=msg.sent_ms, now_ms=now_ms))

    async def _step(self, event: Tick | Renewed | RenewalFailed) -> None:
        self.lease, actions = step(self.lease, event)
        for action in actions:
            if isinstance(action, Renew):
                if not self._renewals.start(self._renew(action.sent_ms)):
                    self.system.post(self.endpoint, LeaseRenewed(sent_ms=action.sent_ms, renewed=False,
                                                                 error="earlier renewals still in flight"))
            elif isinstance(action, Serve):
                await self._tell_broker(LeaseChanged(held=True, until_ms=action.until_ms))
            else:
                log.error("broker %d: its lease may run out: it stops serving", self.broker_id)
                await self._tell_broker(LeaseChanged(held=False))

    async def _tell_broker(self, msg: LeaseChanged) -> None:
        # Waited for, not posted: lost and regained must reach the broker in order.
        await self.system.send(self.broker_endpoint, msg, timeout_ms=_TELL_BROKER_MS)

    async def _renew(self, sent_ms: int) -> None:
        try:
            async with asyncio.timeout(self.ttl_ms / 1000):
                await self.metadata.put_with_ttl(self.key, self.registration, self.ttl_ms)
            outcome = LeaseRenewed(sent_ms=sent_ms, renewed=True)
        except (DanubeError, TimeoutError) as exc:
            outcome = LeaseRenewed(sent_ms=sent_ms, renewed=False, error=str(exc) or "timeout")
        self.system.post(self.endpoint, outcome)


async def spawn_lease_keeper(system: ActorSystem, *, metadata: RaftMetadataStore, broker_endpoint: str,
                             broker_id: int, registration: bytes, ttl_ms: int) -> str:
    """The broker's registration lease, held by a child of the broker, which it tells
    `LeaseChanged`."""
    return await system.spawn(lambda: LeaseKeeper(
        metadata=metadata, broker_endpoint=broker_endpoint, broker_id=broker_id, key=register_key(broker_id),
        registration=registration, ttl_ms=ttl_ms), name=f"lease keeper {broker_id}", parent=broker_endpoint)

"""The lease keeper actor (`actors/cluster/lease_keeper.py`) in a real actor system over a real
single-voter metadata store: it registers the broker with a TTL, tells the broker it
holds the lease until a time that keeps moving, and tells it the lease is lost once
renewals fail (the store stopped)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import zmq.asyncio

from danube_zmq.actors.cluster.lease_keeper import LeaseKeeper
from danube_zmq.clock import SystemClock
from danube_zmq.consensus.metadata_store import embedded_store
from danube_zmq.runtime.actor import Actor
from danube_zmq.runtime.system import ActorSystem
from danube_zmq.transport.internal_protocol import LeaseChanged
from tests.waiting import until

TTL_MS = 600
KEY = "/cluster/register/7"


class BrokerProbe(Actor):
    """Stands where the broker actor is: keeps the LeaseChanged it is told."""

    def __init__(self, told: list[LeaseChanged]) -> None:
        self.told = told

    def handle_LeaseChanged(self, msg: LeaseChanged) -> None:
        self.told.append(msg)



def test_the_keeper_holds_the_lease_then_fences_when_renewals_fail(tmp_path: Path) -> None:
    """Held: the registration is written with the TTL and the broker is told
    `held=True` with an `until_ms` in the future, then again with a later one (renewals
    go on). Once the store stops, renewals fail and the broker is told `held=False`
    once the last `until_ms` has passed, and never `held=True` after."""

    async def run() -> None:
        told: list[LeaseChanged] = []
        store = embedded_store(tmp_path)
        await store.start()
        ctx = zmq.asyncio.Context()
        clock = SystemClock()
        system = ActorSystem(ctx, clock=clock, mailbox_messages_max=1_000, restarts_max=2, restart_window_ms=60_000)
        try:
            broker = await system.spawn(lambda: BrokerProbe(told), name="broker")
            await system.spawn(lambda: LeaseKeeper(metadata=store, broker_endpoint=broker, broker_id=7, key=KEY,
                                                   registration=b"me", ttl_ms=TTL_MS), name="lease keeper",
                               parent=broker)
            await until(lambda: len(told) >= 2, "two renewals told")
            assert all(t.held for t in told) and told[0].until_ms > 0 and told[1].until_ms > told[0].until_ms
            value = store.local_get(KEY)
            assert value is not None and value.value == b"me" and value.ttl_ms == TTL_MS
            await store.stop()
            await until(lambda: not told[-1].held, "the lease lost")
            last_until = max(t.until_ms for t in told if t.held)
            assert clock.monotonic_ms() >= last_until  # served up to the lease it held, not cut short
            count = len(told)
            await asyncio.sleep(3 * TTL_MS / 1000)
            assert len(told) == count  # no renewal succeeds against a stopped store
        finally:
            await system.shutdown()
            ctx.term()
            await store.stop()

    asyncio.run(run())

"""The load manager's absence grace runs on the monotonic clock: a broker whose
registration is gone is failed over once it has been absent for `grace_ms` of this
node's monotonic time, whatever the wall clock does meanwhile (found by chaos R4's
review: `absent_since_ms` was stamped and compared on the wall clock, so a 30 s step
back kept a dead broker's topics unserved 30 s longer, and a step forward skipped the
grace that covers a fresh leader not yet seeing a restarted broker renew)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from danube_zmq.actors.load.load_manager import LoadManagerActor
from danube_zmq.clock import ManualClock
from danube_zmq.config.broker_config import BrokerConfig
from danube_zmq.consensus.metadata_store import embedded_store
from danube_zmq.transport import client_protocol as cp
from danube_zmq.transport import cluster_records as cr

TOPIC = "/default/orphan"
DEAD = 2


@pytest.mark.parametrize("step_ms", [-30_000, 30_000])
async def test_a_gone_brokers_topic_is_failed_over_after_the_grace_on_the_monotonic_clock(
        tmp_path: Path, step_ms: int) -> None:
    """Broker 2 holds the topic and has no registration. One round notes it absent; the
    wall clock steps by `step_ms`; a round just before the grace has passed on the
    monotonic clock leaves the assignment, one just after posts the topic unassigned
    (failover)."""
    async with embedded_store(tmp_path / "raft") as store:
        await store.put(cr.topic_record_key(TOPIC), cr.encode(cr.TopicRecord(
            dispatch_strategy=cp.DispatchStrategy.NON_RELIABLE, partitions=0, created_ms=0)))
        await store.put(cr.assignment_key(TOPIC), cr.encode(cr.Assignment(broker_id=DEAD, epoch=1, assigned_ms=0)))
        actor = LoadManagerActor(config=BrokerConfig(), broker_id=1, metadata=store)
        clock = ManualClock()
        actor.system = SimpleNamespace(clock=clock)  # type: ignore[assignment]
        await actor._round()
        assert DEAD in actor.absent_since_ms
        clock.step_wall(step_ms)
        clock.advance(actor.grace_ms - 1)
        await actor._round()
        assert store.local_get(cr.assignment_key(TOPIC)) is not None, "failed over before the grace"
        clock.advance(2)
        await actor._round()
        assert store.local_get(cr.assignment_key(TOPIC)) is None, "not failed over after the grace"
        marker = store.local_get(cr.unassigned_key(TOPIC))
        assert marker is not None
        assert cr.decode(marker.value, cr.Unassigned).from_broker == DEAD

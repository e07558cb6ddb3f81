"""A real `BrokerActor` joined to a real single-voter metadata store in a real
`ActorSystem`, holding its lease, with the other end of one gateway outbox (an inproc
PULL standing in for the gateway that would read it): for tests that tell the broker
requests as a gateway does and read its answers."""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import zmq
import zmq.asyncio

from danube_zmq.actors.broker.broker import BrokerActor
from danube_zmq.clock import SystemClock
from danube_zmq.config.broker_config import BrokerConfig, BrokerSection, ClusterSection
from danube_zmq.consensus.metadata_store import RaftMetadataStore
from danube_zmq.consensus.peer import RaftPeer
from danube_zmq.consensus.raft import RaftConfig
from danube_zmq.runtime.system import ActorSystem
from danube_zmq.transport import cluster_records as cr

BROKER_ID = 1
DEADLINE_S = 60.0  # generous: a loaded machine only makes the waits longer


@contextlib.asynccontextmanager
async def joined_broker(tmp_path: Path, outbox_address: str, cluster: ClusterSection | None = None,
                        ) -> AsyncIterator[tuple[RaftMetadataStore, ActorSystem, BrokerActor, zmq.asyncio.Socket]]:
    """The store, the system, the broker (joined, lease held, namespace `default`
    written) and the PULL bound at `outbox_address`; all stopped on the way out."""
    ctx = zmq.asyncio.Context()
    peer = RaftPeer(1, tmp_path / "raft", None, {}, RaftConfig(node_id=1), 10, ttl_check_interval_s=0.5,
                    context=ctx)
    store = RaftMetadataStore(peer, owns_peer=True)
    await store.start()
    system = ActorSystem(ctx, clock=SystemClock(), mailbox_messages_max=1_000)
    outbox = ctx.socket(zmq.PULL)
    outbox.setsockopt(zmq.LINGER, 0)
    outbox.bind(outbox_address)
    executor = ThreadPoolExecutor(2)
    try:
        config = BrokerConfig(broker=BrokerSection(data_dir=str(tmp_path / "data")),
                              cluster=cluster if cluster is not None else ClusterSection())
        endpoint = await system.spawn(lambda: BrokerActor(
            config=config, broker_id=BROKER_ID, broker_url="tcp://127.0.0.1:1", admin_url="tcp://127.0.0.1:2",
            metrics_url=None, rng=random.Random(7), executor=executor, metadata=store), name="broker")
        system.broker_endpoint = endpoint
        broker = system.actor(endpoint)
        assert isinstance(broker, BrokerActor)
        deadline = time.monotonic() + DEADLINE_S
        while not (broker.registry.joined and broker.lease_held):
            assert time.monotonic() < deadline, "the broker never joined and held its lease"
            await asyncio.sleep(0.01)
        await store.compare_and_swap(cr.namespace_key("default"), 0, b"")  # bootstrapped already, or now
        yield store, system, broker, outbox
    finally:
        await system.shutdown()
        await store.stop()
        outbox.close()
        executor.shutdown()
        ctx.term()

"""The broker actor joining a cluster that has no leader (`actors/broker/broker.py`
`handle_JoinCluster`): the attempt waits on the metadata store in a task of its own, so
the broker keeps answering its other messages meanwhile."""

from __future__ import annotations

import asyncio
import random
import socket
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import zmq.asyncio

from danube_zmq.actors.broker.broker import BrokerActor
from danube_zmq.clock import SystemClock
from danube_zmq.config.broker_config import BrokerConfig, BrokerSection
from danube_zmq.consensus.metadata_store import RaftMetadataStore
from danube_zmq.consensus.peer import RaftPeer
from danube_zmq.consensus.raft.core import RaftConfig
from danube_zmq.runtime.system import ActorSystem
from danube_zmq.transport.internal_protocol import ServedTopics, ServedTopicsList

# A store read without a leader waits this long: far beyond the ask below.
STORE_WAIT_S = 120.0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_a_broker_waiting_for_a_leader_still_answers_its_other_messages(tmp_path: Path) -> None:
    """A two-voter store whose other voter never starts has no leader, and each of its
    reads waits 120 s. The broker's first join attempt is under way, yet it answers the
    load reporter's `ServedTopics` ask (not serving: no lease) within the ask's 30 s,
    where an attempt awaited in the handler held its mailbox for the whole 120 s."""

    async def run() -> None:
        me, other = f"tcp://127.0.0.1:{_free_port()}", f"tcp://127.0.0.1:{_free_port()}"
        ctx = zmq.asyncio.Context()
        peer = RaftPeer(1, tmp_path / "raft", me, {1: me, 2: other}, RaftConfig(node_id=1), 10,
                        request_timeout_s=STORE_WAIT_S, context=ctx)
        store = RaftMetadataStore(peer, owns_peer=True, wait_for_leader=False)
        await store.start()
        system = ActorSystem(ctx, clock=SystemClock(), mailbox_messages_max=1_000)
        executor = ThreadPoolExecutor(2)
        try:
            config = BrokerConfig(broker=BrokerSection(data_dir=str(tmp_path / "data")))
            broker = await system.spawn(lambda: BrokerActor(
                config=config, broker_id=1, broker_url="tcp://127.0.0.1:1", admin_url="tcp://127.0.0.1:2",
                metrics_url=None, rng=random.Random(7), executor=executor, metadata=store), name="broker")
            instance = system.actor(broker)
            assert isinstance(instance, BrokerActor)
            for _ in range(3_000):  # the first attempt has started
                if instance._joining:
                    break
                await asyncio.sleep(0.01)
            assert instance._joining and not instance.registry.joined
            answer = await system.ask(broker, ServedTopics(), timeout_ms=30_000)
            assert answer == ServedTopicsList(endpoints=[], serving=False)
            assert not instance.registry.joined, "no leader: not joined"
        finally:
            await system.shutdown()
            await store.stop()
            executor.shutdown()
            ctx.term()

    asyncio.run(run())

"""A broker restarting with thousands of topics assigned to it loads them in slices:
client requests queued meanwhile are answered between two slices, not after the last.
The broker runs in this process (a real `BrokerService`: gateway, broker actor, embedded
Raft store, topic actors) so the test can see how many topics were loaded when an answer
came, and the client is the real one over ZeroMQ."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from danube_zmq import DanubeClient
from danube_zmq.actors.broker.broker import BrokerActor
from danube_zmq.actors.service import BrokerService
from danube_zmq.config.broker_config import BrokerConfig, BrokerSection

pytestmark = pytest.mark.slow

PARTITIONS = 1_000  # the default policies.partitions_per_topic_max
TOPICS = 3
LOADED_S_MAX = 300.0


def _config(tmp_path: Path) -> BrokerConfig:
    return BrokerConfig(broker=BrokerSection(listen="tcp://127.0.0.1:0", admin_listen="tcp://127.0.0.1:0",
                                             metrics_port=0, data_dir=str(tmp_path / "data")))


def _broker(service: BrokerService) -> BrokerActor:
    system = service._system
    assert system is not None and system.broker_endpoint is not None
    broker = system.actor(system.broker_endpoint)
    assert isinstance(broker, BrokerActor)
    return broker


async def _until(condition: object, what: str) -> None:
    deadline = time.monotonic() + LOADED_S_MAX
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"{what} not within {LOADED_S_MAX} s"
        await asyncio.sleep(0.001)


async def test_a_lookup_during_a_restart_resync_is_answered_before_the_resync_ends(tmp_path: Path) -> None:
    """3,000 partitions served, the broker stopped and started again on the same data
    dir: once its resync has loaded its first topic, a client's `Lookup` of a
    partitioned topic (answered by the broker actor) comes back while topics are still
    left to load. Before, the resync was one handler of the broker actor: every
    request waited for the last of the 3,000 topics."""
    total = PARTITIONS * TOPICS
    async with BrokerService(_config(tmp_path)) as service:
        async with DanubeClient(service.client_url) as client:
            for n in range(TOPICS):
                await client._get_partitions(f"/default/wide-{n}", create=True, partitions=PARTITIONS)
        broker = _broker(service)
        await _until(lambda: len(broker.topics) == total, "every partition served")

    async with BrokerService(_config(tmp_path)) as service:
        broker = _broker(service)
        await _until(lambda: len(broker.topics) > 0, "the resync's first topic")
        async with DanubeClient(service.client_url) as client:
            await client.lookup("/default/wide-0")
            loaded_at_answer = len(broker.topics)
        assert loaded_at_answer < total, "the lookup waited for the whole resync"
        await _until(lambda: len(broker.topics) == total, "every partition served again")

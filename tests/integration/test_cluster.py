"""Three broker processes on loopback as one cluster: topics are assigned by the
leader's load manager, every broker answers lookups (served here, or a redirect to the
owner), clients connected to any broker reach the owner, partitions spread across the
brokers, and a killed broker's topics (or a killed leader's load manager) are taken
over by the others."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from danube_zmq import DanubeClient
from danube_zmq.client.admin import AdminClient
from danube_zmq.transport.client_protocol import DispatchStrategy
from danube_zmq.transport.errors import DanubeError
from tests.integration.test_metadata_cluster import Node, agreed_leader, start_cluster

pytestmark = pytest.mark.cluster

# Short leases so a dead broker's topics move within seconds.
LEASE_ENV = {"DANUBE_CLUSTER__LEASE_TTL_MS": "3000"}
TAKEOVER_S_MAX = 10.0


@pytest.fixture
def cluster(tmp_path: Path):
    nodes = start_cluster(tmp_path, 3, env=LEASE_ENV)
    try:
        asyncio.run(agreed_leader(nodes))
        asyncio.run(_registered(nodes, 3))
        yield nodes
    finally:
        for node in nodes:
            if node.process is not None:
                node.stop()


async def _registered(nodes: list[Node], count: int, timeout_s: float = 15.0) -> list[object]:
    deadline = time.monotonic() + timeout_s
    brokers: list[object] = []
    while time.monotonic() < deadline:
        live = next(n for n in nodes if n.process is not None)
        try:
            async with AdminClient(live.admin_url) as admin:
                brokers = await admin.list_brokers()
            if len(brokers) == count:
                return brokers
        except DanubeError:
            pass
        await asyncio.sleep(0.2)
    raise AssertionError(f"expected {count} registered brokers, got {brokers}")


async def _owners(node: Node, topics: list[str]) -> dict[str, str]:
    async with DanubeClient(node.url) as client:
        return {topic: await client.lookup(topic) for topic in topics}


def test_every_broker_answers_lookups_with_the_same_owner(cluster: list[Node]) -> None:
    async def run() -> None:
        async with AdminClient(cluster[0].admin_url) as admin:
            await admin.create_topic("/default/orders")
            roles = {b.broker_url: b.role for b in await admin.list_brokers()}
        assert sorted(roles.values()) == ["follower", "follower", "leader"]
        seen = [await _owners(node, ["/default/orders"]) for node in cluster]
        owner = seen[0]["/default/orders"]
        assert all(s["/default/orders"] == owner for s in seen), seen
        assert owner in {node.url for node in cluster}
        async with AdminClient(cluster[2].admin_url) as admin:
            [info] = await admin.list_topics("default")
            description = await admin.describe_topic("/default/orders")
        assert info.name == "/default/orders" and info.broker_id != 0
        assert description.broker_id == info.broker_id

    asyncio.run(run())


def test_partitions_spread_across_brokers(cluster: list[Node]) -> None:
    async def run() -> None:
        async with DanubeClient(cluster[1].url) as client:
            producer = await client.create_producer("/default/spread", partitions=6)
            for i in range(60):
                await producer.send(f"m{i}".encode(), key=f"k{i}")
            partitions = [f"/default/spread-part-{i}" for i in range(6)]
            owners = {topic: await client.lookup(topic) for topic in partitions}
        assert set(owners.values()) == {node.url for node in cluster}, owners
        # Describe gathers every partition from the broker serving it.
        async with AdminClient(cluster[0].admin_url) as admin:
            description = await admin.describe_topic("/default/spread")
        assert len(description.partitions) == 6
        assert sum(p.messages_in for p in description.partitions) == 60

    asyncio.run(run())


def test_clients_on_non_owners_reach_the_owner(cluster: list[Node]) -> None:
    async def run() -> None:
        async with AdminClient(cluster[0].admin_url) as admin:
            await admin.create_topic("/default/relay", dispatch_strategy=DispatchStrategy.RELIABLE)
        owner_url = (await _owners(cluster[0], ["/default/relay"]))["/default/relay"]
        others = [node for node in cluster if node.url != owner_url]
        async with DanubeClient(others[0].url) as producing, DanubeClient(others[1].url) as consuming:
            consumer = await consuming.subscribe("/default/relay", "audit", initial_position="earliest")
            producer = await producing.create_producer("/default/relay", dispatch="reliable")
            sent = [await producer.send(f"r{i}".encode()) for i in range(50)]
            assert [m.offset for m in sent] == list(range(50))
            got = []
            while len(got) < 50:
                message = await consumer.receive(timeout=10)
                await consumer.ack(message)
                got.append(message.payload)
        assert got == [f"r{i}".encode() for i in range(50)]

    asyncio.run(run())


def test_a_killed_brokers_topics_are_served_by_another(cluster: list[Node]) -> None:
    async def run() -> None:
        topics = [f"/default/orphan-{i}" for i in range(6)]
        async with AdminClient(cluster[0].admin_url) as admin:
            for topic in topics:
                await admin.create_topic(topic)
        owners = await _owners(cluster[0], topics)
        victim = next(node for node in cluster if node.url in owners.values())
        victim.kill()
        killed_at = time.monotonic()
        survivors = [node for node in cluster if node.process is not None]
        orphaned = [t for t, url in owners.items() if url == victim.url]
        while True:
            now = await _owners(survivors[0], orphaned)
            if all(url != victim.url for url in now.values()):
                break
            assert time.monotonic() - killed_at < TAKEOVER_S_MAX, f"still on the killed broker: {now}"
            await asyncio.sleep(0.2)
        # The new owner serves it: a round trip through a survivor.
        async with DanubeClient(survivors[1].url) as client:
            consumer = await client.subscribe(orphaned[0], "after")
            producer = await client.create_producer(orphaned[0])
            await producer.send(b"still here")
            message = await consumer.receive(timeout=10)
        assert message.payload == b"still here"
        print(f"kill -9 -> served by another broker and round trip done: {time.monotonic() - killed_at:.2f} s")

    asyncio.run(run())


def test_new_topics_are_assigned_after_the_leader_is_killed(cluster: list[Node]) -> None:
    async def run() -> None:
        leader_id, term = await agreed_leader(cluster)
        leader = next(node for node in cluster if node.node_id == leader_id)
        leader.kill()
        survivors = [node for node in cluster if node.process is not None]
        await agreed_leader(survivors, term_above=term)
        async with DanubeClient(survivors[0].url) as client:
            producer = await client.create_producer("/default/after-leader")
            await producer.send(b"assigned")
            owner = await client.lookup("/default/after-leader")
        assert owner in {node.url for node in survivors}

    asyncio.run(run())

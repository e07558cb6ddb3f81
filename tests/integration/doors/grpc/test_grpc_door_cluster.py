"""The gRPC door on a 3-broker cluster: Danube's client pointed at a broker that does
not serve a topic is redirected to the owner's door, and produces and consumes there
(docs/danube-compat.md)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from danube_zmq.client import DanubeClient as NativeClient
from danube_zmq.client.admin import AdminClient
from danube_zmq.transport.client_protocol import DispatchStrategy
from tests.integration.actors.test_cluster import LEASE_ENV, _registered
from tests.integration.conftest import free_port
from tests.integration.consensus.test_metadata_cluster import Node, agreed_leader

danube = pytest.importorskip("danube", reason="danube-client (the test extra) is not installed")

pytestmark = pytest.mark.cluster

RECEIVE_TIMEOUT_S = 10.0


def test_lookup_on_a_non_owner_redirects_to_the_owners_door(tmp_path: Path) -> None:
    nodes = [Node(tmp_path, i) for i in range(1, 4)]
    doors = {node.url: f"http://127.0.0.1:{free_port()}" for node in nodes}
    try:
        for node in nodes:
            node.start(nodes, env=LEASE_ENV, extra=("--grpc-listen", doors[node.url]))
        asyncio.run(agreed_leader(nodes))
        asyncio.run(_registered(nodes, 3))
        asyncio.run(_redirected_and_served(nodes, doors))
    finally:
        for node in nodes:
            node.stop()


async def _redirected_and_served(nodes: list[Node], doors: dict[str, str]) -> None:
    topic = "/default/door-redirect"
    async with AdminClient(nodes[0].admin_url) as admin:
        await admin.create_topic(topic, dispatch_strategy=DispatchStrategy.RELIABLE)
    async with NativeClient(nodes[0].url) as ours:
        owner = await ours.lookup(topic)
    elsewhere = next(door for url, door in doors.items() if url != owner)

    theirs = await danube.DanubeClientBuilder().service_url(elsewhere).build()
    answer = await theirs.lookup_service.lookup_topic(elsewhere, topic)
    assert (answer.response_type, answer.connect_url, answer.broker_url) == (0, doors[owner], doors[owner])

    producer = (theirs.new_producer().with_topic(topic).with_name("p1")
                .with_dispatch_strategy(danube.DispatchStrategy.RELIABLE).build())
    await producer.create()
    assert producer._producers[0].connect_url == doors[owner]
    consumer = (theirs.new_consumer().with_topic(topic).with_consumer_name("c1").with_subscription("s1")
                .with_subscription_type(danube.SubType.EXCLUSIVE).build())
    await consumer.subscribe()
    assert consumer._consumers[topic].connect_url == doors[owner]
    queue = await consumer.receive()
    await asyncio.sleep(0.3)  # the stream is open before the first message
    for i in range(10):
        await producer.send(f"r{i}".encode())
    got = []
    async with asyncio.timeout(RECEIVE_TIMEOUT_S):
        while len(got) < 10:
            got.append(await queue.get())
    assert [m.payload for m in got] == [f"r{i}".encode() for i in range(10)]
    assert [m.msg_id.topic_offset for m in got] == list(range(10))
    assert {m.msg_id.broker_addr for m in got} == {doors[owner]}
    for message in got:
        await consumer.ack(message)
    await consumer.close()
    await producer.close()

"""The client port's GetTopicsOfNamespace (`client.get_topics`, Pulsar's
getTopicsOfNamespace for pattern subscriptions) against real broker processes: a
namespace's topics, each once and sorted, whatever records lie under them; NOT_FOUND
and INVALID_ARGUMENT; the bytes docs/protocol.md gives, paging with `start_after`
included; and in a 3-broker cluster every broker's answer, right after a change made
through another. Who may list is test_security_enforce.py's."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest
import zmq

from danube_zmq import DanubeClient, SyncClient
from danube_zmq.client.admin import AdminClient
from danube_zmq.transport.client_protocol import DispatchStrategy
from danube_zmq.transport.errors import InvalidArgument, NotFound
from tests.integration.conftest import BrokerProcess

# One broker for the module (tests/integration/conftest.py): each test has namespaces of its own.
SHARED_BROKER = True

DEADLINE_S = 30.0
RECV_TIMEOUT_MS = 5_000
CONNECT, CONNECTED, ERROR = 1, 2, 3
GET_TOPICS_OF_NAMESPACE, TOPICS_OF_NAMESPACE = 55, 56
INVALID_ARGUMENT, NOT_FOUND = 1, 2


async def _sub_keys_written(admin: AdminClient, topic: str) -> None:
    """Wait until the metadata store holds a record under `topic`'s own key (a producer's
    or a cursor), so a listing has something beside the topic record to leave out."""
    deadline = time.monotonic() + DEADLINE_S
    while not [e for e in (await admin.metadata_list(f"/topics{topic}/")).entries]:
        assert time.monotonic() < deadline, f"no record under {topic} within {DEADLINE_S} s"
        await asyncio.sleep(0.05)


async def test_a_namespaces_topics_are_listed_once_each_sorted(broker: BrokerProcess) -> None:
    """A reliable topic with a producer and a subscription (their records lie under its
    key), a partitioned topic (listed once, by its base name), a topic of another
    namespace whose name starts with this one's (not listed), a deleted topic (gone from
    the next listing); the sync client lists the same; an empty namespace lists none."""
    async with AdminClient(broker.admin_url) as admin:
        for namespace in ("tons", "tons2", "tons-empty"):
            await admin.create_namespace(namespace)
        await admin.create_topic("/tons/plain", dispatch_strategy=DispatchStrategy.RELIABLE)
        await admin.create_topic("/tons/parted", partitions=3)
        await admin.create_topic("/tons/doomed")
        await admin.create_topic("/tons2/elsewhere")
        async with DanubeClient(broker.url) as client:
            producer = await client.create_producer("/tons/plain", dispatch="reliable")
            await producer.send(b"x")
            await client.subscribe("/tons/plain", "audit", initial_position="earliest")
            await _sub_keys_written(admin, "/tons/plain")
            assert await client.get_topics("tons") == ["/tons/doomed", "/tons/parted", "/tons/plain"]
            assert await client.get_topics("tons2") == ["/tons2/elsewhere"]
            assert await client.get_topics("tons-empty") == []
            await admin.delete_topic("/tons/doomed")
            assert await client.get_topics("tons") == ["/tons/parted", "/tons/plain"]
    with SyncClient(broker.url) as sync:
        assert sync.get_topics("tons") == ["/tons/parted", "/tons/plain"]


async def test_an_unknown_namespace_is_not_found_and_a_bad_name_invalid(broker: BrokerProcess) -> None:
    """NOT_FOUND names the namespace; a name the broker's name rules refuse (a slash, a
    leading slash, 256 characters, a space) is INVALID_ARGUMENT naming it."""
    async with DanubeClient(broker.url) as client:
        with pytest.raises(NotFound, match="namespace 'tons-nope' does not exist"):
            await client.get_topics("tons-nope")
        for bad in ("a/b", "/default", "n" * 256, "sp ace"):
            with pytest.raises(InvalidArgument, match="invalid namespace name"):
                await client.get_topics(bad)


class _Raw:
    """A DEALER speaking msgpack arrays by hand, as docs/protocol.md states them."""

    def __init__(self, url: str) -> None:
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.RCVTIMEO, RECV_TIMEOUT_MS)
        self.sock.setsockopt(zmq.ROUTING_ID, b"\x01" + os.urandom(15))
        self.sock.connect(url)
        self.next_id = 1

    def request(self, tag: int, *fields: Any) -> list[Any]:
        request_id, self.next_id = self.next_id, self.next_id + 1
        self.sock.send(msgpack.packb([tag, request_id, *fields], use_bin_type=True))
        while True:
            reply = msgpack.unpackb(self.sock.recv(), raw=False)
            if reply[1] == request_id:
                return reply

    def close(self) -> None:
        self.sock.close(linger=0)
        self.ctx.term()


@pytest.fixture
def raw(broker: BrokerProcess) -> Iterator[_Raw]:
    client = _Raw(broker.url)
    assert client.request(CONNECT, 1, "raw-topics")[0] == CONNECTED
    yield client
    client.close()


async def test_the_wire_layout_and_start_after(broker: BrokerProcess, raw: _Raw) -> None:
    """`[55, id, namespace]` (start_after left out) answers `[56, id, namespace, topics,
    more]`; `start_after` lists the names after it; one of another namespace, or not a
    topic name, is INVALID_ARGUMENT; an unknown namespace NOT_FOUND."""
    async with AdminClient(broker.admin_url) as admin:
        await admin.create_namespace("tons-wire")
        for topic in ("b", "a", "c"):
            await admin.create_topic(f"/tons-wire/{topic}")
    names = ["/tons-wire/a", "/tons-wire/b", "/tons-wire/c"]
    assert raw.request(GET_TOPICS_OF_NAMESPACE, "tons-wire")[2:] == ["tons-wire", names, False]
    assert raw.request(GET_TOPICS_OF_NAMESPACE, "tons-wire", None)[2:] == ["tons-wire", names, False]
    assert raw.request(GET_TOPICS_OF_NAMESPACE, "tons-wire", "/tons-wire/a")[2:] == ["tons-wire", names[1:], False]
    assert raw.request(GET_TOPICS_OF_NAMESPACE, "tons-wire", "/tons-wire/c")[2:] == ["tons-wire", [], False]
    for start_after, words in (("/default/a", "not in namespace 'tons-wire'"), ("nope", "invalid topic name")):
        reply = raw.request(GET_TOPICS_OF_NAMESPACE, "tons-wire", start_after)
        assert reply[0] == ERROR and reply[2] == INVALID_ARGUMENT and words in reply[3], reply
    reply = raw.request(GET_TOPICS_OF_NAMESPACE, "tons-none")
    assert reply[0] == ERROR and reply[2] == NOT_FOUND and "tons-none" in reply[3], reply


@pytest.mark.cluster
def test_every_broker_of_a_cluster_lists_the_same_topics_at_once(tmp_path: Path) -> None:
    """Three brokers: topics created through one broker's admin port are listed by
    every broker as soon as the create returns (a linearizable read, no waiting), and a
    topic deleted through another is gone from each broker's next answer."""
    from tests.integration.actors.test_cluster import running_cluster

    async def listings(nodes: list[Any], namespace: str) -> list[list[str]]:
        found = []
        for node in nodes:
            async with DanubeClient(node.url) as client:
                found.append(await client.get_topics(namespace))
        return found

    async def run(nodes: list[Any]) -> None:
        async with AdminClient(nodes[0].admin_url) as admin:
            await admin.create_namespace("tons-cluster")
            await admin.create_topic("/tons-cluster/orders", partitions=4)
            await admin.create_topic("/tons-cluster/audit")
        assert await listings(nodes, "tons-cluster") == [["/tons-cluster/audit", "/tons-cluster/orders"]] * 3
        async with AdminClient(nodes[1].admin_url) as admin:
            await admin.delete_topic("/tons-cluster/audit")
        assert await listings(nodes, "tons-cluster") == [["/tons-cluster/orders"]] * 3

    with running_cluster(tmp_path) as nodes:
        asyncio.run(run(nodes))

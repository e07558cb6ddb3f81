"""The `message_ttl_s` policy (Pulsar's message TTL) against a real broker process, the
client, the CLI and /metrics: messages published longer ago than the TTL are
acknowledged for every subscription, counted per subscription, and stay acknowledged
after a restart."""

from __future__ import annotations

import asyncio
import json
import shutil
import signal
import time

import pytest

from danube_zmq import DanubeClient, DispatchStrategy, SubType
from danube_zmq.client.admin import AdminClient
from danube_zmq.transport.errors import Timeout
from tests.integration.actors.test_metrics_endpoint import get, series
from tests.integration.actors.test_topic_policies import _cli
from tests.integration.conftest import free_port
from tests.integration.storage.test_durable_topics import broker_env
from tests.integration.storage.test_reliable import describe_subscription

TOPIC = "/default/ttl"
# Checked every 100 ms (the default, 1 s, would only make the test longer).
ENV = {"DANUBE_POLICIES__MESSAGE_EXPIRY_CHECK_INTERVAL_MS": "100"}


async def _backlog(broker, name: str) -> int | None:
    return (await describe_subscription(broker, TOPIC, name)).backlog_messages


async def test_messages_past_the_ttl_are_acknowledged_for_every_subscription_and_stay_so(broker_factory) -> None:
    """Five reliable messages; `slow` received them and acks none, `idle` has no
    consumer. `topics policies set --message-ttl-s 1`: within the TTL and a check both
    backlogs are 0, /metrics counts 5 expired for each. After a restart
    `idle`'s new consumer gets only what is sent since."""
    port = free_port()
    broker = broker_factory("--metrics-port", str(port), env=ENV)
    async with DanubeClient(broker.url) as client:
        producer = await client.create_producer(TOPIC, dispatch="reliable")
        slow = await client.subscribe(TOPIC, "slow", sub_type=SubType.SHARED)
        idle = await client.subscribe(TOPIC, "idle", sub_type=SubType.EXCLUSIVE)
        await idle.close()
        for i in range(5):
            await producer.send(f"m{i}".encode())
        assert (await slow.receive(timeout=10)).payload == b"m0"
        assert await _backlog(broker, "idle") == 5
        sent = time.time()

        out = await _cli(broker.admin_url, "topics", "policies", "set", TOPIC, "--message-ttl-s", "1")
        assert "message_ttl_s 1" in out, out
        shown = json.loads(await _cli(broker.admin_url, "topics", "policies", "get", TOPIC, "-o", "json"))
        assert shown["message_ttl_s"] == {"value": 1, "source": "topic"}, shown

        deadline = time.monotonic() + 15
        while (await _backlog(broker, "slow"), await _backlog(broker, "idle")) != (0, 0):
            assert time.monotonic() < deadline, "the messages never expired"
            await asyncio.sleep(0.1)
        assert time.time() - sent >= 1.0 - 0.05, "expired before their time"

        _, body = await asyncio.to_thread(get, f"http://127.0.0.1:{port}/metrics")
        expired = series(body, "danube_subscription_messages_expired_total")
        assert expired == {f'{{subscription="slow",topic="{TOPIC}"}}': 5.0,
                           f'{{subscription="idle",topic="{TOPIC}"}}': 5.0}, expired
        await producer.close()
        await slow.close()
    assert broker.stop(signal.SIGTERM) == 0

    again = broker_factory(env=ENV)
    async with DanubeClient(again.url) as client:
        idle = await client.subscribe(TOPIC, "idle", sub_type=SubType.EXCLUSIVE)
        producer = await client.create_producer(TOPIC, dispatch="reliable")
        await producer.send(b"fresh")
        assert (await idle.receive(timeout=10)).payload == b"fresh"
        try:
            extra = await idle.receive(timeout=0.5)
        except Timeout:
            extra = None
        assert extra is None, extra


async def test_history_only_in_durable_segments_expires_by_the_time_it_was_uploaded(broker_factory,
                                                                                     tmp_path) -> None:
    """storage.mode shared_fs: 300 messages uploaded, then the local WAL is lost (a new
    disk, or the topic moved): the topic's publish times are in durable segments only.
    With `message_ttl_s 1` set after the restart, the segments uploaded more than 1 s
    ago expire whole for the idle subscription."""
    env = {**broker_env("shared_fs", str(tmp_path / "shared"), {}), **ENV}
    broker = broker_factory(env=env)
    topic = "/default/ttl-durable"
    async with DanubeClient(broker.url) as client:
        idle = await client.subscribe(topic, "idle", sub_type=SubType.EXCLUSIVE)
        await idle.close()
        producer = await client.create_producer(topic, dispatch="reliable")
        for i in range(300):
            producer.send_nowait(f"m{i:03d}".encode() + b"x" * 90)
        await producer.flush()
    # A clean stop seals and uploads the active segment; then the local WAL is lost.
    assert broker.stop(signal.SIGTERM) == 0
    shutil.rmtree(tmp_path / "data" / "wal" / "default" / "ttl-durable")
    broker = broker_factory(env=env, url=broker.url, admin_url=broker.admin_url)
    async with AdminClient(broker.admin_url) as admin:
        assert (await _subscription(admin, topic, "idle")).backlog_messages == 300
        await admin.set_topic_policies(topic, message_ttl_s=1)
        deadline = time.monotonic() + 15
        while (await _subscription(admin, topic, "idle")).backlog_messages != 0:
            assert time.monotonic() < deadline, "the durable history never expired"
            await asyncio.sleep(0.1)


async def _subscription(admin: AdminClient, topic: str, name: str):
    info = await admin.describe_topic(topic)
    return next(s for p in info.partitions for s in p.subscriptions if s.name == name)


@pytest.mark.cluster
def test_in_a_cluster_the_owner_expires_and_so_does_the_next_one_after_a_move(tmp_path) -> None:
    """3 brokers: `message_ttl_s` set through a broker that does not serve the topic
    is applied by the one that does; after `topics unload` the next owner (which has
    the topic's WAL handed over) expires what is sent since."""
    from tests.integration.actors.test_cluster import _owners, running_cluster

    topic = "/default/ttl-moved"

    async def idle_backlog(admin: AdminClient) -> int | None:
        return (await _subscription(admin, topic, "idle")).backlog_messages

    async def expired_within(admin: AdminClient, what: str) -> None:
        deadline = time.monotonic() + 30
        while await idle_backlog(admin) != 0:
            assert time.monotonic() < deadline, what
            await asyncio.sleep(0.2)

    async def run(nodes) -> None:  # type: ignore[no-untyped-def]
        async with AdminClient(nodes[0].admin_url) as admin:
            await admin.create_topic(topic, dispatch_strategy=DispatchStrategy.RELIABLE)
        owner_url = (await _owners(nodes[0], [topic]))[topic]
        others = [node for node in nodes if node.url != owner_url]
        async with DanubeClient(others[0].url, operation_retries_max=3) as client, \
                AdminClient(others[1].admin_url) as admin:
            idle = await client.subscribe(topic, "idle", sub_type=SubType.EXCLUSIVE)
            await idle.close()
            producer = await client.create_producer(topic, dispatch="reliable")
            for i in range(5):
                await producer.send(f"before{i}".encode())
            await admin.set_topic_policies(topic, message_ttl_s=1)
            await expired_within(admin, "the owner never expired the messages")

            await admin.unload_topic(topic)
            deadline = time.monotonic() + 30
            while (await _owners(nodes[0], [topic]))[topic] == owner_url:
                assert time.monotonic() < deadline, "the topic did not move"
                await asyncio.sleep(0.2)
            for i in range(5):
                await producer.send(f"after{i}".encode())
            await expired_within(admin, "the next owner never expired the messages sent after the move")

    with running_cluster(tmp_path, env=ENV) as nodes:
        asyncio.run(run(nodes))


async def test_after_kill_9_what_expired_stays_expired(broker_factory) -> None:
    """The broker's own default `policies.message_ttl_s` 1: five messages expire for
    `idle`; kill -9 and a restart: its backlog is 0 again at the first check (a cursor
    the kill lost is moved again), and its consumer gets only what is sent since."""
    env = {**ENV, "DANUBE_POLICIES__MESSAGE_TTL_S": "1"}
    broker = broker_factory(env=env)
    topic = "/default/ttl-killed"
    async with DanubeClient(broker.url) as client, AdminClient(broker.admin_url) as admin:
        idle = await client.subscribe(topic, "idle", sub_type=SubType.EXCLUSIVE)
        await idle.close()
        producer = await client.create_producer(topic, dispatch="reliable")
        for i in range(5):
            await producer.send(f"m{i}".encode())
        await _expired(admin, topic, "the messages never expired")
    broker.stop(signal.SIGKILL)
    again = broker_factory(env=env)
    async with DanubeClient(again.url) as client, AdminClient(again.admin_url) as admin:
        await _expired(admin, topic, "the messages came back after kill -9")
        idle = await client.subscribe(topic, "idle", sub_type=SubType.EXCLUSIVE)
        producer = await client.create_producer(topic, dispatch="reliable")
        await producer.send(b"fresh")
        assert (await idle.receive(timeout=10)).payload == b"fresh"


async def _expired(admin: AdminClient, topic: str, what: str) -> None:
    deadline = time.monotonic() + 15
    while (await _subscription(admin, topic, "idle")).backlog_messages != 0:
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.1)

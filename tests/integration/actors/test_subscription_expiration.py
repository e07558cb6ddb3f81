"""The `subscription_expiration_ms` policy (Pulsar's subscriptionExpirationTimeMinutes,
issue 37 item 6: abandoned subscriptions hold retention), against real broker
processes, the client, the admin client and CLI, and /metrics: a subscription without
a consumer for the policy's time is removed with its cursor; one with a consumer never.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time

from danube_zmq import DanubeClient, SubType
from danube_zmq.client.admin import AdminClient
from tests.integration.actors.test_metrics_endpoint import get, series
from tests.integration.actors.test_subscriptions import drain
from tests.integration.actors.test_topic_policies import _cli
from tests.integration.conftest import free_port

EXPIRATION_MS = 2000


async def _subscriptions(admin: AdminClient, topic: str) -> set[str]:
    return set(await admin.list_subscriptions(topic))


async def _wait_for(condition, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not await condition():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.1)


async def test_an_idle_subscription_expires_and_one_with_a_consumer_never_does(broker_factory) -> None:
    """`topics policies set --subscription-expiration-ms 2000` on a reliable topic with
    three subscriptions: `gone` loses its consumer and is removed about 2 s later (gone
    from the listing and from /metrics, logged with topic and subscription, counted in
    danube_subscriptions_expired_total); `kept` keeps its consumer for three periods and
    stays; `back` loses its consumer, gets one again within the period, and stays. After
    a restart `gone` does not come back: its cursor was forgotten too."""
    port = free_port()
    broker = broker_factory("--metrics-port", str(port))
    topic = "/default/expiring"
    async with DanubeClient(broker.url) as client, AdminClient(broker.admin_url) as admin:
        await client.create_producer(topic, dispatch="reliable")
        consumers = {name: await client.subscribe(topic, name, sub_type=SubType.EXCLUSIVE)
                     for name in ("gone", "kept", "back")}
        out = await _cli(broker.admin_url, "topics", "policies", "set", topic,
                         "--subscription-expiration-ms", str(EXPIRATION_MS))
        assert f"subscription_expiration_ms {EXPIRATION_MS}" in out, out
        shown = json.loads(await _cli(broker.admin_url, "topics", "policies", "get", topic, "-o", "json"))
        assert shown["subscription_expiration_ms"] == {"value": EXPIRATION_MS, "source": "topic"}, shown
        await consumers["gone"].close()
        await consumers["back"].close()
        closed = time.monotonic()
        await asyncio.sleep(EXPIRATION_MS / 2000)
        consumers["back"] = await client.subscribe(topic, "back", sub_type=SubType.EXCLUSIVE)

        async def gone_expired() -> bool:
            return "gone" not in await _subscriptions(admin, topic)

        await _wait_for(gone_expired, 15, "the idle subscription never expired")
        assert time.monotonic() - closed >= EXPIRATION_MS / 1000 - 0.1, "expired before its time"
        await asyncio.sleep(3 * EXPIRATION_MS / 1000)
        assert await _subscriptions(admin, topic) == {"kept", "back"}

        _, body = await asyncio.to_thread(get, f"http://127.0.0.1:{port}/metrics")
        assert 'subscription="gone"' not in body and 'subscription="kept"' in body
        assert series(body, "danube_subscriptions_expired_total") == {"": 1.0}, body
        assert f"{topic}: subscription 'gone' expired" in broker.log()
        for consumer in consumers.values():
            await consumer.close()
    assert broker.stop(signal.SIGTERM) == 0
    again = broker_factory()
    async with AdminClient(again.admin_url) as admin:
        assert "gone" not in await _subscriptions(admin, topic)


async def test_an_expired_subscription_releases_the_retention_it_held(broker_factory, tmp_path) -> None:
    """A reliable topic with 16 KiB segments and retention_time_ms 1: `reader` consumes
    and acknowledges 600 messages, `abandoned` was made and left without reading one, so
    every sealed segment is kept for it. The namespace's subscription_expiration_ms of
    2 s removes `abandoned`, and retention then deletes the segments `reader` has passed."""
    broker = broker_factory(env={"DANUBE_STORAGE__WAL_SEGMENT_BYTES_MAX": str(16 * 1024),
                                 "DANUBE_STORAGE__RETENTION_CHECK_INTERVAL_MS": "200"})
    wal = tmp_path / "data" / "wal" / "default" / "held"
    async with DanubeClient(broker.url) as client, AdminClient(broker.admin_url) as admin:
        producer = await client.create_producer("/default/held", dispatch="reliable", batch_messages_max=50)
        reader = await client.subscribe("/default/held", "reader", sub_type=SubType.EXCLUSIVE)
        abandoned = await client.subscribe("/default/held", "abandoned", sub_type=SubType.EXCLUSIVE)
        await abandoned.close()
        for i in range(600):
            producer.send_nowait(f"{i:04d}".encode() + b"x" * 96)
        await producer.flush()
        await drain(reader, 600)
        await reader.flush_acks()
        await admin.set_topic_policies("/default/held", retention_time_ms=1)
        files = set(wal.glob("*.wal"))
        assert len(files) > 3
        await asyncio.sleep(1.0)  # several retention ticks: the abandoned cursor holds every segment
        assert files <= set(wal.glob("*.wal")), "segments went while a subscription had not read them"

        await admin.set_namespace_policies("default", subscription_expiration_ms=EXPIRATION_MS)
        deadline = time.monotonic() + 15
        while files <= set(wal.glob("*.wal")):
            assert time.monotonic() < deadline, "the expired subscription's segments were never released"
            await asyncio.sleep(0.1)
        assert await _subscriptions(admin, "/default/held") == {"reader"}
        await reader.close()


async def test_the_broker_default_expires_subscriptions_of_a_non_reliable_topic(broker_factory) -> None:
    """policies.subscription_expiration_ms 2000 in the broker's config and no namespace
    or topic policy: an abandoned subscription of a non-reliable topic is removed (its
    place under max_subscriptions_per_topic free again), and `policies get` says
    where the value comes from."""
    broker = broker_factory(env={"DANUBE_POLICIES__SUBSCRIPTION_EXPIRATION_MS": str(EXPIRATION_MS),
                                 "DANUBE_POLICIES__MAX_SUBSCRIPTIONS_PER_TOPIC": "1"})
    async with DanubeClient(broker.url, operation_retries_max=0) as client, \
            AdminClient(broker.admin_url) as admin:
        await client.create_producer("/default/plain")
        consumer = await client.subscribe("/default/plain", "first", sub_type=SubType.EXCLUSIVE)
        info = await admin.get_topic_policies("/default/plain")
        assert (info.values["subscription_expiration_ms"], info.sources["subscription_expiration_ms"]) == \
            (EXPIRATION_MS, "broker")
        await consumer.close()

        async def freed() -> bool:
            return not await _subscriptions(admin, "/default/plain")

        await _wait_for(freed, 15, "the abandoned subscription never expired")
        second = await client.subscribe("/default/plain", "second", sub_type=SubType.EXCLUSIVE)
        await second.close()

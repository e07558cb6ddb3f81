"""A consumer that stops reading must not make the broker's memory grow without bound."""

from __future__ import annotations

import asyncio

import psutil

from danube_zmq import DanubeClient, SubType
from danube_zmq.client.admin import AdminClient


async def test_slow_consumer_does_not_grow_broker_memory(broker) -> None:
    """Publish 120 MiB to a subscription whose consumer never reads (10 permits): the
    broker holds at most its pending bounds (16 MiB), drops and counts the rest, and
    its RSS stays flat while the producer is never blocked."""
    process = psutil.Process(broker.process.pid)
    async with DanubeClient(broker.url) as client:
        producer = await client.create_producer("/default/slow")
        await client.subscribe("/default/slow", "stuck", sub_type=SubType.EXCLUSIVE, receiver_queue_size=10)
        payload = b"x" * 1024
        await producer.send(payload)
        rss_before = process.memory_info().rss
        for _ in range(120):
            for _ in range(1024):
                producer.send_nowait(payload)
            await producer.flush()
        await asyncio.sleep(0.5)
        rss_growth_mib = (process.memory_info().rss - rss_before) / 2**20
    async with AdminClient(broker.admin_url) as admin:
        info = await admin.describe_topic("/default/slow")
    subscription = info.partitions[0].subscriptions[0]
    assert subscription.delivered_messages == 10
    assert subscription.dropped_messages > 100_000
    assert subscription.pending_messages <= 10_000
    assert rss_growth_mib < 80, f"broker RSS grew by {rss_growth_mib:.0f} MiB"

"""Backlog quotas and the disk reserve keep a reliable topic whose consumers never ack
from filling the disk, with Pulsar's three policies. Real broker processes, the client.

The backlog is what the slowest subscription has not acknowledged (its cursor to the
committed end of the log). The quotas here are tiny (64 KiB) so that a few hundred
1 KiB sends cross them.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import time

import pytest

from danube_zmq import DanubeClient, SubType
from danube_zmq.client.admin import AdminClient
from danube_zmq.transport.errors import ResourceExhausted, Timeout
from tests.integration.conftest import start_broker
from tests.integration.storage.test_reliable import describe_subscription

QUOTA = 64 * 1024
PAYLOAD = b"q" * 1024
SENDS_MAX = 2_000  # 2 MiB: far past the quota; the loops stop well before


def _env(policy: str, **extra: str) -> dict[str, str]:
    return {"DANUBE_POLICIES__BACKLOG_QUOTA_BYTES_MAX": str(QUOTA),
            "DANUBE_POLICIES__BACKLOG_QUOTA_POLICY": policy, **extra}


async def _ack_all(consumer, deadline_s: float = 30.0) -> int:
    """Receive and ack until nothing arrives for a second; returns how many."""
    count = 0
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        try:
            msg = await consumer.receive(timeout=1.0)
        except Timeout:
            return count
        await consumer.ack(msg)
        count += 1
    return count


async def _wait_accepted(producer, deadline_s: float = 30.0) -> None:
    deadline = time.monotonic() + deadline_s
    while True:
        try:
            await producer.send(PAYLOAD)
            return
        except ResourceExhausted:
            assert time.monotonic() < deadline, "sends still refused after the consumer acked everything"
            await asyncio.sleep(0.2)


async def test_producer_exception_refuses_sends_over_the_backlog_quota(broker_factory) -> None:
    """producer_exception: once the unacked backlog passes the quota, a send is
    RESOURCE_EXHAUSTED naming the topic, the backlog and the quota; after the consumer
    acks everything, sends are accepted again."""
    broker = broker_factory(env=_env("producer_exception"))
    async with DanubeClient(broker.url, operation_retries_max=0) as client:
        producer = await client.create_producer("/default/quota", dispatch="reliable")
        consumer = await client.subscribe("/default/quota", "slow", sub_type=SubType.EXCLUSIVE)
        accepted = 0
        with pytest.raises(ResourceExhausted) as refused:
            for _ in range(SENDS_MAX):
                await producer.send(PAYLOAD)
                accepted += 1
        text = str(refused.value)
        assert "/default/quota" in text and "backlog" in text and str(QUOTA) in text, text
        assert accepted * len(PAYLOAD) >= QUOTA // 2, accepted
        assert await _ack_all(consumer) >= accepted
        await _wait_accepted(producer)


async def test_producer_request_hold_completes_a_send_once_acks_free_the_backlog(broker_factory) -> None:
    """producer_request_hold: a send over the quota is held, not answered; it completes
    (acknowledged with its offset) once the consumer acks the backlog."""
    broker = broker_factory(env=_env("producer_request_hold", DANUBE_POLICIES__BACKLOG_QUOTA_HOLD_MS_MAX="120000"))
    async with DanubeClient(broker.url, operation_retries_max=0, request_timeout_ms=120_000) as client:
        producer = await client.create_producer("/default/hold", dispatch="reliable")
        consumer = await client.subscribe("/default/hold", "slow", sub_type=SubType.EXCLUSIVE)
        held = None
        for _ in range(SENDS_MAX):
            send = asyncio.ensure_future(producer.send(PAYLOAD))
            done, _ = await asyncio.wait([send], timeout=3.0)
            if not done:
                held = send
                break
            send.result()
        assert held is not None, "no send was held although the backlog passed the quota"
        assert await _ack_all(consumer) > 0
        message_id = await asyncio.wait_for(held, timeout=60.0)
        assert message_id.offset >= QUOTA // len(PAYLOAD) // 2


async def test_producer_request_hold_fails_a_send_after_the_hold_timeout(broker_factory) -> None:
    """producer_request_hold: a send held past `backlog_quota_hold_ms_max` is
    RESOURCE_EXHAUSTED (retriable) saying it was held, not dropped silently."""
    broker = broker_factory(env=_env("producer_request_hold", DANUBE_POLICIES__BACKLOG_QUOTA_HOLD_MS_MAX="500"))
    async with DanubeClient(broker.url, operation_retries_max=0, request_timeout_ms=60_000) as client:
        producer = await client.create_producer("/default/hold", dispatch="reliable")
        await client.subscribe("/default/hold", "slow", sub_type=SubType.EXCLUSIVE)
        with pytest.raises(ResourceExhausted, match="held") as refused:
            for _ in range(SENDS_MAX):
                await producer.send(PAYLOAD)
        assert refused.value.retriable


async def test_consumer_backlog_eviction_moves_the_slowest_cursor_and_counts_it(broker_factory) -> None:
    """consumer_backlog_eviction: sends are never refused; the slowest subscription's
    cursor is moved past the oldest messages so its backlog fits the quota, and the
    evicted messages are counted in `topics describe`."""
    broker = broker_factory(env=_env("consumer_backlog_eviction"))
    total = 400  # 400 KiB: six times the quota
    async with DanubeClient(broker.url, operation_retries_max=0) as client:
        producer = await client.create_producer("/default/evict", dispatch="reliable")
        await client.subscribe("/default/evict", "slow", sub_type=SubType.EXCLUSIVE)
        for _ in range(total):
            await producer.send(PAYLOAD)
    deadline = time.monotonic() + 30
    while True:
        info = await describe_subscription(broker, "/default/evict", "slow")
        if info.backlog_bytes is not None and info.backlog_bytes <= QUOTA:
            break
        assert time.monotonic() < deadline, f"backlog stayed at {info.backlog_bytes} bytes"
        await asyncio.sleep(0.2)
    assert info.cursor is not None and info.cursor > 0
    async with AdminClient(broker.admin_url) as admin:
        partition = (await admin.describe_topic("/default/evict")).partitions[0]
    assert partition.evicted_messages >= total - QUOTA // len(PAYLOAD) - 1, partition.evicted_messages
    assert partition.evicted_messages <= info.cursor + 1


async def test_disk_reserve_refuses_reliable_sends_until_it_is_met(tmp_path) -> None:
    """With `storage.disk_free_bytes_min` above the WAL filesystem's free space, a
    reliable send is RESOURCE_EXHAUSTED naming the free bytes and the reserve (before
    ENOSPC); the same data dir with a reserve below the free space takes sends."""
    (tmp_path / "data").mkdir()
    free = shutil.disk_usage(tmp_path / "data").free
    broker = start_broker(tmp_path, env={"DANUBE_STORAGE__DISK_FREE_BYTES_MIN": str(free + (1 << 40))})
    try:
        async with DanubeClient(broker.url, operation_retries_max=0) as client:
            producer = await client.create_producer("/default/disk", dispatch="reliable")
            with pytest.raises(ResourceExhausted, match="disk_free_bytes_min") as refused:
                await producer.send(PAYLOAD)
            assert "/default/disk" in str(refused.value)
    finally:
        broker.stop(signal.SIGTERM)
    broker = start_broker(tmp_path, env={"DANUBE_STORAGE__DISK_FREE_BYTES_MIN": str(1 << 20)})
    try:
        async with DanubeClient(broker.url, operation_retries_max=0) as client:
            producer = await client.create_producer("/default/disk", dispatch="reliable")
            assert (await producer.send(PAYLOAD)).offset >= 0
    finally:
        assert broker.stop() == 0, broker.log()
    assert os.path.isdir(tmp_path / "data")

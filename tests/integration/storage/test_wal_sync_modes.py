"""`storage.wal_sync` against real broker processes: `interval` works end to end and
keeps everything over a clean restart; `always` group-commits (fewer fsyncs than
records, seen in the broker's Prometheus counters)."""

from __future__ import annotations

import asyncio
import re
import urllib.request

from danube_zmq import DanubeClient, SubType
from tests.integration.actors.test_subscriptions import drain
from tests.integration.conftest import free_port

INTERVAL = {"DANUBE_STORAGE__WAL_SYNC": "interval", "DANUBE_STORAGE__WAL_SYNC_INTERVAL_MS": "200"}


async def test_interval_sync_serves_and_keeps_messages_over_a_clean_restart(broker_factory) -> None:
    """With wal_sync interval, sends are acknowledged with consecutive offsets and
    delivered; after SIGTERM (which syncs and closes the WAL) a restarted broker replays
    every message from earliest and continues the offsets."""
    first = broker_factory(env=INTERVAL)
    async with DanubeClient(first.url) as client:
        producer = await client.create_producer("/default/ws1", dispatch="reliable")
        consumer = await client.subscribe("/default/ws1", "live", sub_type=SubType.EXCLUSIVE)
        futures = [producer.send_nowait(f"m{i}".encode()) for i in range(300)]
        await producer.flush()
        assert [(await f).offset for f in futures] == list(range(300))
        got = await drain(consumer, 300)
        assert [m.payload for m in got] == [f"m{i}".encode() for i in range(300)]
    assert first.stop() == 0, first.log()

    second = broker_factory(url=first.url, admin_url=first.admin_url, env=INTERVAL)
    async with DanubeClient(second.url) as client:
        producer = await client.create_producer("/default/ws1", dispatch="reliable")
        assert (await producer.send(b"after")).offset == 300
        replay = await client.subscribe("/default/ws1", "replay", initial_position="earliest")
        got = await drain(replay, 301)
        assert [m.message_id.offset for m in got] == list(range(301))
        assert [m.payload for m in got] == [f"m{i}".encode() for i in range(300)] + [b"after"]


def _counter(metrics: str, name: str) -> float:
    match = re.search(rf"^{name} ([0-9.e+]+)$", metrics, re.MULTILINE)
    assert match, f"{name} is not in the metrics:\n{metrics}"
    return float(match.group(1))


async def test_always_sync_group_commits_concurrent_producers(broker_factory) -> None:
    """With wal_sync always, 4 producers each sending 2000 messages without waiting get
    every message acknowledged, with fewer WAL flushes (one fsync each) than records.

    Client batching is off (one message per Send), so every record arrives as its own
    batch: records/flushes > 1 can only come from the broker's group commit folding
    batches that queued during an fsync into the next one, not from client batches."""
    port = free_port()
    broker = broker_factory("--metrics-port", str(port), env={"DANUBE_STORAGE__WAL_SYNC": "always"})
    async with DanubeClient(broker.url) as client:
        producers = [await client.create_producer("/default/ws2", dispatch="reliable", batching=False,
                                                  inflight_batches_max=4) for _ in range(4)]
        futures = [p.send_nowait(f"p{n}-{i}".encode()) for i in range(2000) for n, p in enumerate(producers)]
        await asyncio.gather(*(p.flush(timeout=120) for p in producers))
        offsets = sorted([(await f).offset for f in futures])
        assert offsets == list(range(8000))

    def scrape() -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            return response.read().decode()

    metrics = await asyncio.to_thread(scrape)
    records = _counter(metrics, "danube_wal_records_total")
    flushes = _counter(metrics, "danube_wal_flushes_total")
    assert records == 8000, metrics
    assert 0 < flushes < records, (records, flushes)
    assert records / flushes > 1, (records, flushes)

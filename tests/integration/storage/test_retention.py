"""Topic retention deletes whole sealed segments only once every subscription's cursor
has passed them (local mode: the WAL files are the durable segments)."""

from __future__ import annotations

import asyncio
import time

from danube_zmq import DanubeClient, SubType
from tests.integration.actors.test_subscriptions import drain

RETAIN_NOTHING_OLD = {
    "DANUBE_STORAGE__WAL_SEGMENT_BYTES_MAX": str(16 * 1024),
    "DANUBE_STORAGE__RETENTION_TIME_MS": "0",
    "DANUBE_STORAGE__RETENTION_CHECK_INTERVAL_MS": "200",
}


async def test_retention_waits_for_every_cursor(broker_factory, tmp_path) -> None:
    """With time retention 0, segments stay while a subscription still needs them, and
    the ones below the slowest cursor are deleted; a new earliest reader starts there."""
    broker = broker_factory(env=RETAIN_NOTHING_OLD)
    wal_dir = tmp_path / "data" / "wal" / "default" / "kept"
    async with DanubeClient(broker.url) as client:
        producer = await client.create_producer("/default/kept", dispatch="reliable", batch_messages_max=50)
        fast = await client.subscribe("/default/kept", "fast", sub_type=SubType.EXCLUSIVE)
        slow = await client.subscribe("/default/kept", "slow", sub_type=SubType.EXCLUSIVE)
        for i in range(1000):
            producer.send_nowait(f"{i:04d}".encode() + b"x" * 96)
        await producer.flush()
        files_before = set(wal_dir.glob("*.wal"))
        assert len(files_before) > 4
        await drain(fast, 1000)
        await fast.flush_acks()
        await asyncio.sleep(1.0)
        # (Cursor checkpoints may roll a new file meanwhile: none of the old ones goes.)
        assert files_before <= set(wal_dir.glob("*.wal")), "deleted while 'slow' still needs them"
        await drain(slow, 500)
        await slow.flush_acks()
        deadline = time.monotonic() + 10
        while files_before <= set(wal_dir.glob("*.wal")):
            assert time.monotonic() < deadline, "retention never deleted the consumed segments"
            await asyncio.sleep(0.1)
        late = await client.subscribe("/default/kept", "late", initial_position="earliest")
        first = await late.receive(timeout=5)
        assert 0 < first.message_id.offset <= 500

"""Non-reliable subscriptions left without a consumer do not hold memory: a real broker,
the client, psutil on the broker process.

Non-reliable delivery is fire-and-forget (Danube): nothing is owed to a subscription
with no consumer, so it keeps no pending messages; only subscriptions with consumers
hold up to `dispatch.pending_bytes_max` each for them.
"""

from __future__ import annotations

import psutil
import pytest

from danube_zmq import DanubeClient, SubType
from danube_zmq.client.admin import AdminClient

pytestmark = pytest.mark.slow

MIB = 1 << 20
SUBSCRIPTIONS = 40
MESSAGES = 300  # 1 MiB each: far more than one subscription's 16 MiB pending bound
# Without consumers nothing is pending; this is the broker's own overhead of moving
# 1 MiB messages (mailboxes, allocator slack). Abandoned subscriptions each keeping
# their 16 MiB would add 640 MiB.
GROWTH_MAX = 256 * MIB


async def test_abandoned_non_reliable_subscriptions_keep_no_pending_messages(broker) -> None:
    """40 subscriptions of a non-reliable topic are made and their consumers closed;
    300 messages of 1 MiB then flow. The broker's RSS grows by less than 256 MiB
    (40 subscriptions x 16 MiB pending would be 640 MiB), `topics describe` shows no
    subscription holding pending messages, and a consumer that attaches afterwards
    still gets new messages."""
    process = psutil.Process(broker.process.pid)
    async with DanubeClient(broker.url) as client, AdminClient(broker.admin_url) as admin:
        await admin.create_topic("/default/abandoned")
        for i in range(SUBSCRIPTIONS):
            consumer = await client.subscribe("/default/abandoned", f"gone-{i}", sub_type=SubType.EXCLUSIVE)
            await consumer.close()
        producer = await client.create_producer("/default/abandoned")
        await producer.send(b"warm-up")
        before = process.memory_info().rss
        peak = before
        for i in range(MESSAGES):
            await producer.send(bytes([i % 251]) * MIB)
            if i % 10 == 0:
                peak = max(peak, process.memory_info().rss)
        peak = max(peak, process.memory_info().rss)
        description = await admin.describe_topic("/default/abandoned")
        pending = {s.name: s.pending_messages for p in description.partitions for s in p.subscriptions}
        assert len(pending) == SUBSCRIPTIONS and not any(pending.values()), pending
        assert peak - before < GROWTH_MAX, f"RSS grew {(peak - before) / MIB:.0f} MiB"

        late = await client.subscribe("/default/abandoned", "gone-0", sub_type=SubType.EXCLUSIVE)
        await producer.send(b"after")
        assert (await late.receive(timeout=10)).payload == b"after"

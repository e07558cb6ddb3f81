"""Replay with seek, and a per-subscription failure policy, on a reliable topic.

A consumer reads and acknowledges ten orders, then seeks back to offset 4 and gets
orders 4..9 again (by publish time works too: `seek(publish_time=ms)`). Then the
admin sets the subscription's failure policy to one redelivery and "drop": an order
the consumer keeps rejecting is delivered twice, then skipped, and the next order
arrives. The policy is stored with the subscription and survives broker restarts.

Run against a broker (`.venv/bin/danube broker start`):

    python examples/seek_and_failure_policy.py [tcp://127.0.0.1:6650]

The broker URL comes from argv[1], else $DANUBE_SERVICE_URL, else tcp://127.0.0.1:6650;
the admin endpoint from $DANUBE_ADMIN_ENDPOINT, else tcp://127.0.0.1:50051. The same
from a shell:

    danube admin topics seek /default/example-seek -s orders --offset 4
    danube admin topics set-failure-policy /default/example-seek -s orders \\
        --max-redelivery-count 1 --poison-policy drop
"""

from __future__ import annotations

import asyncio
import os
import sys
import uuid

from danube_zmq import DanubeClient, SubType, Timeout
from danube_zmq.client.admin import AdminClient

SERVICE_URL = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("DANUBE_SERVICE_URL", "tcp://127.0.0.1:6650")
ADMIN_ENDPOINT = os.environ.get("DANUBE_ADMIN_ENDPOINT", "tcp://127.0.0.1:50051")
# A fresh topic per run: a reliable topic keeps its messages across runs.
TOPIC = f"/default/example-seek-{uuid.uuid4().hex[:8]}"


class ExampleFailed(Exception):
    """What the example expected did not happen."""


def check(condition: bool, message: str) -> None:
    if not condition:
        raise ExampleFailed(message)


async def main() -> None:
    async with DanubeClient(SERVICE_URL, request_timeout_ms=3000) as client, AdminClient(ADMIN_ENDPOINT) as admin:
        producer = await client.create_producer(TOPIC, dispatch="reliable")
        consumer = await client.subscribe(TOPIC, "orders", sub_type=SubType.EXCLUSIVE)
        for i in range(10):
            await producer.send(f"order-{i}".encode())
        for _ in range(10):
            await consumer.ack(await consumer.receive(timeout=5))
        print("consumed and acknowledged orders 0..9")

        await consumer.seek(offset=4)
        replayed = []
        for _ in range(6):
            msg = await consumer.receive(timeout=5)
            replayed.append(msg.message_id.offset)
            await consumer.ack(msg)
        check(replayed == list(range(4, 10)), f"expected offsets 4..9 again, got {replayed}")
        print(f"after seek(offset=4): offsets {replayed}")

        policy = await admin.set_failure_policy(TOPIC, "orders", max_redelivery_count=1, poison_policy="drop",
                                                base_redelivery_delay_ms=50)
        print(f"failure policy: {policy.max_redelivery_count} redelivery, then {policy.poison_policy}")
        await producer.send(b"bad-order")
        await producer.send(b"good-order")
        rejected = 0
        while True:
            msg = await consumer.receive(timeout=5)
            if msg.payload == b"bad-order":
                rejected += 1
                await consumer.nack(msg)
                continue
            await consumer.ack(msg)
            break
        # good-order may overtake the redelivery; wait out the last one.
        await asyncio.sleep(0.5)
        while True:
            try:
                msg = await consumer.receive(timeout=0.5)
            except Timeout:
                break
            check(msg.payload == b"bad-order", f"unexpected {msg.payload!r}")
            rejected += 1
            await consumer.nack(msg)
        check(rejected == 2, f"bad-order should be delivered twice (1 + max_redelivery_count), was {rejected}")
        print("bad-order was delivered twice, then dropped; good-order was consumed")
        await consumer.close()
        await admin.unsubscribe(TOPIC, "orders")
        await admin.delete_topic(TOPIC)


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except ExampleFailed as exc:
        print(f"example failed: {exc}", file=sys.stderr)
        sys.exit(1)

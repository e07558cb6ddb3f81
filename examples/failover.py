"""Failover: one active consumer, a standby that takes over.

Two consumers attach to the Failover subscription "ha": "primary" first, so it is
active and receives everything while "standby" gets nothing. When the primary closes,
the broker promotes the standby (next in attach order), which receives what follows.
The admin API shows which consumer is active at each step.

    python examples/failover.py [tcp://127.0.0.1:6650]

The broker URL comes from argv[1], else $DANUBE_SERVICE_URL, else tcp://127.0.0.1:6650;
the admin URL from $DANUBE_ADMIN_ENDPOINT, else tcp://127.0.0.1:50051.
"""

from __future__ import annotations

import asyncio
import os
import sys

from danube_zmq import Consumer, DanubeClient, DanubeError, SubType, Timeout
from danube_zmq.client.admin import AdminClient

SERVICE_URL = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("DANUBE_SERVICE_URL", "tcp://127.0.0.1:6650")
ADMIN_URL = os.environ.get("DANUBE_ADMIN_ENDPOINT", "tcp://127.0.0.1:50051")
TOPIC = "/default/example-failover"


class ExampleFailed(Exception):
    """What the example expected did not happen."""


def check(condition: bool, message: str) -> None:
    if not condition:
        raise ExampleFailed(message)


async def active_consumer(admin: AdminClient) -> str | None:
    description = await admin.describe_topic(TOPIC)
    for subscription in description.partitions[0].subscriptions:
        if subscription.name == "ha":
            return subscription.active_consumer
    return None


async def receive_some(consumer: Consumer, count: int) -> list[bytes]:
    received = []
    for _ in range(count):
        message = await consumer.receive(timeout=5)
        await consumer.ack(message)
        received.append(message.payload)
    return received


async def main() -> None:
    async with DanubeClient(SERVICE_URL, request_timeout_ms=3000) as client, AdminClient(ADMIN_URL) as admin:
        producer = await client.create_producer(TOPIC)
        primary = await client.subscribe(TOPIC, "ha", sub_type=SubType.FAILOVER, consumer_name="primary")
        standby = await client.subscribe(TOPIC, "ha", sub_type=SubType.FAILOVER, consumer_name="standby")
        print(f"active consumer: {await active_consumer(admin)}")

        before = [f"before-{i}".encode() for i in range(5)]
        for payload in before:
            await producer.send(payload)
        got = await receive_some(primary, len(before))
        print(f"primary received {b' '.join(got).decode()}")
        check(got == before, f"primary got {got}, expected {before}")
        try:
            message = await standby.receive(timeout=0.5)
        except Timeout:
            print("standby received nothing while the primary was active")
        else:
            check(False, f"the standby received {message.payload!r} while the primary was active")

        await primary.close()
        print("primary closed")
        now_active = await active_consumer(admin)
        print(f"active consumer: {now_active}")
        check(now_active == "standby", f"the active consumer is {now_active!r}, not 'standby'")

        after = [f"after-{i}".encode() for i in range(5)]
        for payload in after:
            await producer.send(payload)
        got = await receive_some(standby, len(after))
        print(f"standby received {b' '.join(got).decode()}")
        check(got == after, f"standby got {got}, expected {after}")
    print("OK")


if __name__ == "__main__":
    try:
        asyncio.run(asyncio.wait_for(main(), 30))
    except ExampleFailed as exc:
        raise SystemExit(f"FAILED: {exc}") from None
    except (DanubeError, TimeoutError) as exc:
        raise SystemExit(f"FAILED: {type(exc).__name__}: {exc}") from None

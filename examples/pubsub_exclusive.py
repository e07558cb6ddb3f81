"""Publish/subscribe with Exclusive subscriptions.

One producer publishes ten events to a topic with two Exclusive subscriptions,
"audit" and "billing". Each subscription is its own independent cursor, so both
receive every event, in order. An Exclusive subscription admits only one consumer:
a second consumer asking for "audit" is refused (ConsumerBusy).

Run against a broker (`.venv/bin/danube broker start`):

    python examples/pubsub_exclusive.py [tcp://127.0.0.1:6650]

The broker URL comes from argv[1], else $DANUBE_SERVICE_URL, else tcp://127.0.0.1:6650.
"""

from __future__ import annotations

import asyncio
import os
import sys

from danube_zmq import ConsumerBusy, DanubeClient, DanubeError, SubType

SERVICE_URL = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("DANUBE_SERVICE_URL", "tcp://127.0.0.1:6650")
TOPIC = "/default/example-pubsub-exclusive"


class ExampleFailed(Exception):
    """What the example expected did not happen."""


def check(condition: bool, message: str) -> None:
    if not condition:
        raise ExampleFailed(message)


async def main() -> None:
    async with DanubeClient(SERVICE_URL, request_timeout_ms=3000) as client:
        producer = await client.create_producer(TOPIC)  # creates the topic if needed
        subscriptions = {
            name: await client.subscribe(TOPIC, name, sub_type=SubType.EXCLUSIVE, consumer_name=f"{name}-1")
            for name in ("audit", "billing")
        }
        sent = [f"event-{i}".encode() for i in range(10)]
        for payload in sent:
            await producer.send(payload)
        print(f"published {len(sent)} messages to {TOPIC}")

        for name, consumer in subscriptions.items():
            received = []
            for _ in sent:
                message = await consumer.receive(timeout=5)
                await consumer.ack(message)
                received.append(message.payload)
            print(f"subscription {name!r} received {len(received)}: {b' '.join(received).decode()}")
            check(received == sent, f"subscription {name!r} got {received}, expected {sent}")

        try:
            await client.subscribe(TOPIC, "audit", sub_type=SubType.EXCLUSIVE, consumer_name="audit-2")
        except ConsumerBusy as exc:  # Pulsar's ConsumerBusy
            print(f"a second consumer on the Exclusive subscription 'audit' is refused: {exc}")
        else:
            check(False, "a second consumer was admitted to an Exclusive subscription")
    print("OK")


if __name__ == "__main__":
    try:
        asyncio.run(asyncio.wait_for(main(), 30))
    except ExampleFailed as exc:
        raise SystemExit(f"FAILED: {exc}") from None
    except (DanubeError, TimeoutError) as exc:
        raise SystemExit(f"FAILED: {type(exc).__name__}: {exc}") from None

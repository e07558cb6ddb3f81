"""Message metadata: keys, attributes, publish time and message ids.

A producer named "order-service" sends messages with a routing key and string
attributes (headers), and one with neither. The consumer prints what arrives with
each message: its `MessageId` (topic, offset, producer id; the same id `send`
returned), `publish_time` (milliseconds since the epoch, stamped by the producer),
the producer's name, the key and the attributes.

    python examples/attributes_and_keys.py [tcp://127.0.0.1:6650]

The broker URL comes from argv[1], else $DANUBE_SERVICE_URL, else tcp://127.0.0.1:6650.
"""

from __future__ import annotations

import asyncio
import datetime
import os
import sys
import time

from danube_zmq import DanubeClient, DanubeError, SubType

SERVICE_URL = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("DANUBE_SERVICE_URL", "tcp://127.0.0.1:6650")
TOPIC = "/default/example-attributes"


class ExampleFailed(Exception):
    """What the example expected did not happen."""


def check(condition: bool, message: str) -> None:
    if not condition:
        raise ExampleFailed(message)


async def main() -> None:
    async with DanubeClient(SERVICE_URL, request_timeout_ms=3000) as client:
        producer = await client.create_producer(TOPIC, name="order-service")
        consumer = await client.subscribe(TOPIC, "inspector", sub_type=SubType.EXCLUSIVE)

        outgoing = [
            (b'{"order": 1}', "customer-42", {"content-type": "application/json", "trace-id": "a1b2"}),
            (b'{"order": 2}', "customer-7", {"content-type": "application/json", "priority": "high"}),
            (b"plain bytes", None, None),
        ]
        before_ms = time.time_ns() // 1_000_000
        sent_ids = [await producer.send(payload, key=key, attributes=attrs) for payload, key, attrs in outgoing]
        after_ms = time.time_ns() // 1_000_000

        for (payload, key, attrs), sent_id in zip(outgoing, sent_ids, strict=True):
            message = await consumer.receive(timeout=5)
            await consumer.ack(message)
            published = datetime.datetime.fromtimestamp(message.publish_time / 1000, datetime.UTC)
            print(f"message {message.message_id}")
            print(f"  topic={message.message_id.topic} offset={message.offset} "
                  f"producer_id={message.message_id.producer_id} producer_name={message.producer_name!r}")
            print(f"  publish_time={message.publish_time} ({published.isoformat(timespec='milliseconds')})")
            print(f"  key={message.key!r} attributes={dict(message.attributes)} payload={message.payload!r}")
            check(message.payload == payload, f"payload {message.payload!r}, expected {payload!r}")
            check(message.key == key, f"key {message.key!r}, expected {key!r}")
            check(dict(message.attributes) == (attrs or {}), f"attributes {message.attributes}, expected {attrs}")
            check(message.message_id == sent_id, f"received id {message.message_id}, send returned {sent_id}")
            check(message.producer_name == "order-service", f"producer name {message.producer_name!r}")
            check(before_ms <= message.publish_time <= after_ms, f"publish_time {message.publish_time} out of range")
        offsets = [m.offset for m in sent_ids]
        check(offsets == sorted(offsets) and len(set(offsets)) == len(offsets), f"offsets {offsets} not increasing")
    print("OK")


if __name__ == "__main__":
    try:
        asyncio.run(asyncio.wait_for(main(), 30))
    except ExampleFailed as exc:
        raise SystemExit(f"FAILED: {exc}") from None
    except (DanubeError, TimeoutError) as exc:
        raise SystemExit(f"FAILED: {type(exc).__name__}: {exc}") from None

"""Key-Shared subscriptions: per-key affinity, and key filters.

Part 1: three consumers on the Key-Shared subscription "by-customer". Messages carry
a key (a customer id); the broker hashes keys onto consumers, so all messages of one
key go to the same consumer, in order, while different keys spread over consumers.

Part 2: key filters. On another topic, consumer "payments" asks for keys matching
`payment-*` and consumer "orders" for `order-*` (glob patterns); each receives
exactly the keys it asked for.

    python examples/key_shared.py [tcp://127.0.0.1:6650]

The broker URL comes from argv[1], else $DANUBE_SERVICE_URL, else tcp://127.0.0.1:6650.
"""

from __future__ import annotations

import asyncio
import collections
import os
import sys

from danube_zmq import Consumer, DanubeClient, DanubeError, Message, SubType, Timeout

SERVICE_URL = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("DANUBE_SERVICE_URL", "tcp://127.0.0.1:6650")
AFFINITY_TOPIC = "/default/example-key-shared"
FILTER_TOPIC = "/default/example-key-filters"


class ExampleFailed(Exception):
    """What the example expected did not happen."""


def check(condition: bool, message: str) -> None:
    if not condition:
        raise ExampleFailed(message)


async def receive_until_idle(consumer: Consumer, idle_s: float = 1.0) -> list[Message]:
    received = []
    while True:
        try:
            message = await consumer.receive(timeout=idle_s)
        except Timeout:
            return received
        await consumer.ack(message)
        received.append(message)


async def affinity(client: DanubeClient) -> None:
    producer = await client.create_producer(AFFINITY_TOPIC)
    consumers = [
        await client.subscribe(AFFINITY_TOPIC, "by-customer", sub_type=SubType.KEY_SHARED, consumer_name=f"c{i}")
        for i in range(3)
    ]
    keys = [f"customer-{i}" for i in range(8)]
    for seq in range(5):
        for key in keys:
            producer.send_nowait(f"{key}:{seq}", key=key)
    await producer.flush()
    print(f"published 5 messages for each of {len(keys)} keys to {AFFINITY_TOPIC}")

    results = await asyncio.gather(*(receive_until_idle(c) for c in consumers))
    owner: dict[str, str] = {}
    sequences: dict[str, list[int]] = collections.defaultdict(list)
    for consumer, messages in zip(consumers, results, strict=True):
        its_keys = sorted({m.key for m in messages if m.key is not None})
        print(f"  {consumer.consumer_name} got {len(messages)} messages, keys {', '.join(its_keys)}")
        for message in messages:
            assert message.key is not None
            check(owner.setdefault(message.key, consumer.consumer_name) == consumer.consumer_name,
                  f"key {message.key} went to two consumers")
            sequences[message.key].append(int(message.payload.decode().rsplit(":", 1)[1]))
    check(sorted(sequences) == sorted(keys), f"got keys {sorted(sequences)}, expected {keys}")
    check(all(seqs == list(range(5)) for seqs in sequences.values()), f"out of order or missing: {dict(sequences)}")
    check(len(set(owner.values())) >= 2, "all keys went to a single consumer")
    print("  every key stayed on one consumer, in order")


async def filters(client: DanubeClient) -> None:
    producer = await client.create_producer(FILTER_TOPIC)
    payments = await client.subscribe(FILTER_TOPIC, "routing", sub_type=SubType.KEY_SHARED,
                                      consumer_name="payments", key_filters=["payment-*"])
    orders = await client.subscribe(FILTER_TOPIC, "routing", sub_type=SubType.KEY_SHARED,
                                    consumer_name="orders", key_filters=["order-*"])
    for i in range(5):
        producer.send_nowait(b"pay", key=f"payment-{i}")
        producer.send_nowait(b"order", key=f"order-{i}")
    await producer.flush()
    print(f"published 5 payment-* and 5 order-* messages to {FILTER_TOPIC}")

    got_payments, got_orders = await asyncio.gather(receive_until_idle(payments), receive_until_idle(orders))
    for consumer, messages, prefix in ((payments, got_payments, "payment-"), (orders, got_orders, "order-")):
        keys = [m.key or "" for m in messages]
        print(f"  {consumer.consumer_name} (filter {consumer.key_filters}) got keys {keys}")
        check(sorted(keys) == [f"{prefix}{i}" for i in range(5)], f"{consumer.consumer_name} got keys {keys}")


async def main() -> None:
    async with DanubeClient(SERVICE_URL, request_timeout_ms=3000) as client:
        print("Key-Shared affinity:")
        await affinity(client)
        print("Key-Shared filters:")
        await filters(client)
    print("OK")


if __name__ == "__main__":
    try:
        asyncio.run(asyncio.wait_for(main(), 30))
    except ExampleFailed as exc:
        raise SystemExit(f"FAILED: {exc}") from None
    except (DanubeError, TimeoutError) as exc:
        raise SystemExit(f"FAILED: {type(exc).__name__}: {exc}") from None

"""Partitioned topics: keyed routing and a consumer that merges partitions.

The producer creates `/default/example-partitioned` with 3 partitions
(`...-part-0` to `...-part-2`). Messages with a key are routed by the key's hash, so
every message of one key lands on the same partition, in order; messages without a
key go round robin over the partitions. One consumer subscribes to the topic itself
and receives from all partitions, merged; `message.topic` says which partition each
message came from.

    python examples/partitioned_topic.py [tcp://127.0.0.1:6650]

The broker URL comes from argv[1], else $DANUBE_SERVICE_URL, else tcp://127.0.0.1:6650.
"""

from __future__ import annotations

import asyncio
import collections
import os
import sys

from danube_zmq import DanubeClient, DanubeError, SubType

SERVICE_URL = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("DANUBE_SERVICE_URL", "tcp://127.0.0.1:6650")
TOPIC = "/default/example-partitioned"


class ExampleFailed(Exception):
    """What the example expected did not happen."""


def check(condition: bool, message: str) -> None:
    if not condition:
        raise ExampleFailed(message)


async def main() -> None:
    async with DanubeClient(SERVICE_URL, request_timeout_ms=3000) as client:
        producer = await client.create_producer(TOPIC, partitions=3)
        partitions = await client.get_partitions(TOPIC)
        print(f"{TOPIC} has partitions {partitions}")
        check(len(partitions) == 3, f"expected 3 partitions, got {partitions}")
        consumer = await client.subscribe(TOPIC, "all-partitions", sub_type=SubType.EXCLUSIVE)
        print(f"one consumer attached to {len(consumer.partitions)} partitions")

        # Keyed: each customer's messages go to one partition.
        placement: dict[str, set[str]] = collections.defaultdict(set)
        for seq in range(4):
            for customer in ("alice", "bob", "carol", "dave"):
                message_id = await producer.send(f"{customer}:{seq}", key=customer)
                placement[customer].add(message_id.topic)
        for customer, topics in sorted(placement.items()):
            print(f"  key {customer!r} -> {', '.join(sorted(topics))}")
            check(len(topics) == 1, f"key {customer!r} landed on {len(topics)} partitions")

        # Unkeyed: round robin over all partitions.
        unkeyed = collections.Counter()
        for i in range(6):
            unkeyed[(await producer.send(f"tick:{i}")).topic] += 1
        print(f"  6 unkeyed messages -> {dict(sorted(unkeyed.items()))}")
        check(set(unkeyed) == set(partitions), "unkeyed messages did not reach every partition")

        # The consumer merges all partitions.
        received = []
        for _ in range(16 + 6):
            message = await consumer.receive(timeout=5)
            await consumer.ack(message)
            received.append(message)
        from_partitions = collections.Counter(m.topic for m in received)
        print(f"consumer received {len(received)} messages from {dict(sorted(from_partitions.items()))}")
        for customer in placement:
            seqs = [m.payload.decode() for m in received if m.key == customer]
            check(seqs == [f"{customer}:{i}" for i in range(4)], f"{customer}'s messages arrived as {seqs}")
            check({m.topic for m in received if m.key == customer} == placement[customer],
                  f"{customer}'s messages came from the wrong partition")
        print("each key's messages arrived in order, from its partition")
    print("OK")


if __name__ == "__main__":
    try:
        asyncio.run(asyncio.wait_for(main(), 30))
    except ExampleFailed as exc:
        raise SystemExit(f"FAILED: {exc}") from None
    except (DanubeError, TimeoutError) as exc:
        raise SystemExit(f"FAILED: {type(exc).__name__}: {exc}") from None

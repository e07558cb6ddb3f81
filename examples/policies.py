"""Topic policies (`AdminClient.set_namespace_policies` / `set_topic_policies`): a
namespace's limits and rates, a topic's own over them, applied to live topics.

In a namespace of its own this example sets a 1 KiB max_message_size and a publish rate
of 100 messages/s, shows a larger message refused, gives one topic a single-producer
limit and a 4 KiB message size of its own, shows where each policy in force comes from,
then times 300 messages at 100/s (about 2 s after the first second's burst).

    DANUBE_ADMIN_ENDPOINT=tcp://127.0.0.1:50051 python examples/policies.py [tcp://127.0.0.1:6650]

The admin URL comes from $DANUBE_ADMIN_ENDPOINT, else tcp://127.0.0.1:50051; the broker
URL from argv[1], else $DANUBE_SERVICE_URL, else tcp://127.0.0.1:6650.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
import uuid

from danube_zmq import DanubeClient, InvalidArgument, ResourceExhausted
from danube_zmq.client.admin import AdminClient

SERVICE_URL = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("DANUBE_SERVICE_URL", "tcp://127.0.0.1:6650")
ADMIN_URL = os.environ.get("DANUBE_ADMIN_ENDPOINT", "tcp://127.0.0.1:50051")
NAMESPACE = f"example-policies-{uuid.uuid4().hex[:8]}"  # unique, so reruns never collide
TOPIC = f"/{NAMESPACE}/orders"


class ExampleFailed(Exception):
    """What the example expected did not happen."""


def check(condition: bool, message: str) -> None:
    if not condition:
        raise ExampleFailed(message)


async def main() -> None:
    async with AdminClient(ADMIN_URL) as admin, DanubeClient(SERVICE_URL, operation_retries_max=0) as client:
        await admin.create_namespace(NAMESPACE)
        await admin.create_topic(TOPIC)
        await admin.set_namespace_policies(NAMESPACE, max_message_size=1024, max_publish_rate=100)
        producer = await client.create_producer(TOPIC, name="first")
        try:
            await producer.send(b"x" * 2048)
            raise ExampleFailed("a 2 KiB message passed the namespace's 1 KiB max_message_size")
        except InvalidArgument as exc:
            print(f"refused as expected: {exc}")

        await admin.set_topic_policies(TOPIC, max_producers_per_topic=1, max_message_size=4096)
        await producer.send(b"x" * 2048)  # the topic's own size applies now
        try:
            await client.create_producer(TOPIC, name="second")
            raise ExampleFailed("a second producer passed max_producers_per_topic 1")
        except ResourceExhausted as exc:
            print(f"refused as expected: {exc}")

        info = await admin.get_topic_policies(TOPIC)
        for name, value in info.values.items():
            print(f"  {name:32} {value:>10}  {info.sources[name]}")
        check(info.sources["max_publish_rate"] == "namespace", f"max_publish_rate from {info.sources}")
        check(info.sources["max_message_size"] == "topic", f"max_message_size from {info.sources}")

        started = time.monotonic()
        await asyncio.gather(*[producer.send_nowait(b"m") for _ in range(300)])
        elapsed = time.monotonic() - started
        print(f"300 messages at max_publish_rate 100 took {elapsed:.1f} s")
        check(elapsed >= 1.5, f"300 messages at 100/s took only {elapsed:.2f} s")

        await producer.close()
        await admin.delete_topic(TOPIC)
        await admin.delete_namespace(NAMESPACE)


if __name__ == "__main__":
    asyncio.run(main())

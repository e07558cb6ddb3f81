"""The admin API (`AdminClient`): namespaces, topics, subscriptions.

Against the broker's admin endpoint this example lists the brokers, creates a
namespace and a 3-partition topic in it, attaches a producer and a consumer so the
description has something to show, describes and lists the topic, lists and deletes
its subscription, then deletes the topic and the namespace.

    DANUBE_ADMIN_ENDPOINT=tcp://127.0.0.1:50051 python examples/admin.py [tcp://127.0.0.1:6650]

The admin URL comes from $DANUBE_ADMIN_ENDPOINT, else tcp://127.0.0.1:50051; the broker
URL (for the producer and consumer) from argv[1], else $DANUBE_SERVICE_URL, else
tcp://127.0.0.1:6650.
"""

from __future__ import annotations

import asyncio
import os
import sys
import uuid

from danube_zmq import DanubeClient, DanubeError, DispatchStrategy, NotFound, SubType
from danube_zmq.client.admin import AdminClient

SERVICE_URL = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("DANUBE_SERVICE_URL", "tcp://127.0.0.1:6650")
ADMIN_URL = os.environ.get("DANUBE_ADMIN_ENDPOINT", "tcp://127.0.0.1:50051")
NAMESPACE = f"example-admin-{uuid.uuid4().hex[:8]}"  # unique, so reruns never collide
TOPIC = f"/{NAMESPACE}/orders"


class ExampleFailed(Exception):
    """What the example expected did not happen."""


def check(condition: bool, message: str) -> None:
    if not condition:
        raise ExampleFailed(message)


async def main() -> None:
    async with AdminClient(ADMIN_URL) as admin:
        for broker in await admin.list_brokers():
            print(f"broker: {broker}")

        await admin.create_namespace(NAMESPACE)
        print(f"created namespace {NAMESPACE}")
        check(NAMESPACE in await admin.list_namespaces(), "the new namespace is not listed")

        await admin.create_topic(TOPIC, partitions=3, dispatch_strategy=DispatchStrategy.NON_RELIABLE)
        print(f"created topic {TOPIC} with 3 partitions")
        topics = await admin.list_topics(NAMESPACE)
        for topic in topics:
            strategy = DispatchStrategy(topic.dispatch_strategy).name.lower()
            print(f"  listed: {topic.name} partitions={topic.partitions} dispatch={strategy}")
        check([t.name for t in topics] == [TOPIC], f"listed {topics}, expected only {TOPIC}")

        async with DanubeClient(SERVICE_URL, request_timeout_ms=3000) as client:
            producer = await client.create_producer(TOPIC, name="admin-demo")
            consumer = await client.subscribe(TOPIC, "audit", sub_type=SubType.SHARED, consumer_name="auditor")
            for i in range(6):
                await producer.send(f"m{i}")
            for _ in range(6):
                await consumer.ack(await consumer.receive(timeout=5))

            description = await admin.describe_topic(TOPIC)
            print(f"describe {description.name}: broker {description.broker_id}, "
                  f"{len(description.partitions)} partitions")
            for partition in description.partitions:
                print(f"  {partition.name}: next_offset={partition.next_offset} messages_in={partition.messages_in} "
                      f"producers={partition.producers}")
                for sub in partition.subscriptions:
                    print(f"    subscription {sub.name!r} ({SubType(sub.sub_type).name.lower()}): "
                          f"consumers={sub.consumers} delivered={sub.delivered_messages}")
            check(len(description.partitions) == 3, "the description does not show 3 partitions")
            check(sum(p.messages_in for p in description.partitions) == 6, "the description does not count 6 in")

            # Close the consumer first: a live consumer whose subscription is deleted
            # re-subscribes (the client re-attaches whatever the broker closes).
            await consumer.close()
            subscriptions = await admin.list_subscriptions(TOPIC)
            print(f"subscriptions of {TOPIC}: {subscriptions}")
            check(subscriptions == ["audit"], f"subscriptions {subscriptions}, expected ['audit']")
            await admin.unsubscribe(TOPIC, "audit")
            check(await admin.list_subscriptions(TOPIC) == [], "the subscription is still listed")
            print("deleted subscription 'audit'")

        await admin.delete_topic(TOPIC)
        print(f"deleted topic {TOPIC}")
        check(await admin.list_topics(NAMESPACE) == [], "the topic is still listed")
        try:
            await admin.describe_topic(TOPIC)
        except NotFound as exc:
            print(f"describing it now: NotFound: {exc}")
        else:
            check(False, "a deleted topic can still be described")

        await admin.delete_namespace(NAMESPACE)
        print(f"deleted namespace {NAMESPACE}")
        check(NAMESPACE not in await admin.list_namespaces(), "the namespace is still listed")
    print("OK")


if __name__ == "__main__":
    try:
        asyncio.run(asyncio.wait_for(main(), 30))
    except ExampleFailed as exc:
        raise SystemExit(f"FAILED: {exc}") from None
    except (DanubeError, TimeoutError) as exc:
        raise SystemExit(f"FAILED: {type(exc).__name__}: {exc}") from None

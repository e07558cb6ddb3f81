"""Topic policies and connection limits are enforced with clear errors; ipc:// works."""

from __future__ import annotations

import pytest

from danube_zmq import DanubeClient, SubType
from danube_zmq.transport.errors import FailedPrecondition, NotFound, ResourceExhausted

LIMITS = {
    "DANUBE_POLICIES__MAX_PRODUCERS_PER_TOPIC": "2",
    "DANUBE_POLICIES__MAX_SUBSCRIPTIONS_PER_TOPIC": "2",
    "DANUBE_POLICIES__MAX_CONSUMERS_PER_TOPIC": "3",
    "DANUBE_POLICIES__MAX_CONSUMERS_PER_SUBSCRIPTION": "2",
}


@pytest.fixture
def limited(broker_factory):
    return broker_factory(env=LIMITS)


async def test_max_producers_per_topic(limited) -> None:
    """A third producer on a topic limited to two is RESOURCE_EXHAUSTED naming the policy."""
    async with DanubeClient(limited.url) as client:
        await client.create_producer("/default/p", name="a")
        await client.create_producer("/default/p", name="b")
        with pytest.raises(ResourceExhausted, match="max_producers_per_topic"):
            await client.create_producer("/default/p", name="c")
        await client.create_producer("/default/p", name="a")  # re-attaching a name is no new producer


async def test_max_subscriptions_per_topic(limited) -> None:
    """A third subscription on a topic limited to two is refused."""
    async with DanubeClient(limited.url) as client:
        await client.create_producer("/default/s")
        await client.subscribe("/default/s", "one")
        await client.subscribe("/default/s", "two")
        with pytest.raises(ResourceExhausted, match="max_subscriptions_per_topic"):
            await client.subscribe("/default/s", "three")


async def test_max_consumers_per_subscription_and_topic(limited) -> None:
    """Consumers are capped per subscription (2) and per topic (3)."""
    async with DanubeClient(limited.url) as client:
        await client.create_producer("/default/c")
        for name in ("c1", "c2"):
            await client.subscribe("/default/c", "work", sub_type=SubType.SHARED, consumer_name=name)
        with pytest.raises(ResourceExhausted, match="max_consumers_per_subscription"):
            await client.subscribe("/default/c", "work", sub_type=SubType.SHARED, consumer_name="c3")
        await client.subscribe("/default/c", "other", sub_type=SubType.SHARED, consumer_name="d1")
        with pytest.raises(ResourceExhausted, match="max_consumers_per_topic"):
            await client.subscribe("/default/c", "other", sub_type=SubType.SHARED, consumer_name="d2")


async def test_dispatch_strategy_and_subscription_type_mismatches(broker) -> None:
    """A subscription keeps its type; reliable producers are refused with a clear reason."""
    async with DanubeClient(broker.url) as client:
        await client.create_producer("/default/m")
        await client.subscribe("/default/m", "s", sub_type=SubType.SHARED)
        with pytest.raises(FailedPrecondition, match="shared"):
            await client.subscribe("/default/m", "s", sub_type=SubType.EXCLUSIVE)
        with pytest.raises(FailedPrecondition, match="reliable"):
            await client.create_producer("/default/m", dispatch="reliable")


async def test_auto_create_off_refuses_unknown_topics(broker_factory) -> None:
    """With auto_create_topics off, producing to a missing topic is NOT_FOUND."""
    strict = broker_factory(env={"DANUBE_AUTO_CREATE_TOPICS": "false"})
    async with DanubeClient(strict.url) as client:
        with pytest.raises(NotFound, match="auto_create_topics"):
            await client.create_producer("/default/nope")


async def test_ipc_transport_round_trip(broker_factory, tmp_path) -> None:
    """A broker listening on ipc:// serves the client like tcp://."""
    url = f"ipc://{tmp_path}/danube.sock"
    ipc = broker_factory(url=url)
    async with DanubeClient(ipc.url) as client:
        producer = await client.create_producer("/default/ipc")
        consumer = await client.subscribe("/default/ipc", "s", initial_position="earliest")
        await producer.send(b"over ipc")
        assert (await consumer.receive(timeout=5)).payload == b"over ipc"

"""Limits on metadata a client can create, on a real broker process: partitions per
topic and topics per namespace are policies with errors naming them, and a topic with
more partitions than one metadata batch holds (4,096 keys) is created in several."""

from __future__ import annotations

import asyncio

import pytest

from danube_zmq import DanubeClient
from danube_zmq.client.admin import AdminClient
from danube_zmq.transport.errors import InvalidArgument, ResourceExhausted


def test_a_topic_over_the_partition_limit_is_refused_naming_the_limit(broker_factory) -> None:
    """With the default `policies.partitions_per_topic_max` (1,000), an anonymous
    `GetPartitions(create=true, partitions=4000)` and an admin create of 1,001
    partitions get INVALID_ARGUMENT naming the key, and nothing is created; 1,000 is
    fine."""
    broker = broker_factory()

    async def run() -> None:
        async with DanubeClient(broker.url) as client:
            with pytest.raises(InvalidArgument, match="partitions_per_topic_max"):
                await client._get_partitions("/default/wide", create=True, partitions=4000)
            with pytest.raises(Exception, match="does not exist"):
                await client.get_partitions("/default/wide")
        async with AdminClient(broker.admin_url) as admin:
            with pytest.raises(InvalidArgument, match="partitions_per_topic_max"):
                await admin.create_topic("/default/wide", partitions=1001)
            await admin.create_topic("/default/wide", partitions=1000)
        async with DanubeClient(broker.url) as client:
            assert len(await client.get_partitions("/default/wide")) == 1000

    asyncio.run(run())


def test_a_namespace_full_of_topics_refuses_one_more_naming_the_limit(broker_factory) -> None:
    """`policies.topics_per_namespace_max: 5` counts partitions one by one: a 3-partition
    topic and a 2-partition one fill the namespace; a producer's auto-create of one more
    topic and an admin create both get RESOURCE_EXHAUSTED naming the key; another
    namespace is not affected."""
    broker = broker_factory(env={"DANUBE_POLICIES__TOPICS_PER_NAMESPACE_MAX": "5",
                                 "DANUBE_BOOTSTRAP_NAMESPACES": "[default, other]"})

    async def run() -> None:
        async with AdminClient(broker.admin_url) as admin:
            await admin.create_topic("/default/three", partitions=3)
            with pytest.raises(ResourceExhausted, match="topics_per_namespace_max"):
                await admin.create_topic("/default/three-more", partitions=3)
            await admin.create_topic("/default/two", partitions=2)
            with pytest.raises(ResourceExhausted, match="topics_per_namespace_max"):
                await admin.create_topic("/default/one")
        async with DanubeClient(broker.url) as client:
            with pytest.raises(ResourceExhausted, match="topics_per_namespace_max"):
                await client._get_partitions("/default/auto", create=True)
            assert await client._get_partitions("/other/auto", create=True) == ["/other/auto"]

    asyncio.run(run())


def test_a_topic_with_more_partitions_than_one_metadata_batch_is_created(broker_factory) -> None:
    """Under a raised limit, `GetPartitions(create=true, partitions=5000)` (5,001 keys:
    more than the 4,096 one metadata batch may touch) creates the topic and answers
    all 5,000 partition names; deleting it (more keys still) works the same way."""
    broker = broker_factory(env={"DANUBE_POLICIES__PARTITIONS_PER_TOPIC_MAX": "5000"})

    async def run() -> None:
        async with DanubeClient(broker.url) as client:
            names = await client._get_partitions("/default/wide", create=True, partitions=5000)
            assert names == [f"/default/wide-part-{i}" for i in range(5000)]
        async with AdminClient(broker.admin_url) as admin:
            assert [t.name for t in await admin.list_topics("default")] == ["/default/wide"]
            await admin.delete_topic("/default/wide")  # 5,000 x (assignment, marker, state) keys, in batches too
            assert await admin.list_topics("default") == []

    asyncio.run(run())

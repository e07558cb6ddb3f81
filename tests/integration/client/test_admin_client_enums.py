"""AdminClient takes an enum argument as the producer and the CLI do: the enum, its int
value or its name in any case; a bad one is INVALID_ARGUMENT naming the choices, and
nothing reaches the broker."""

from __future__ import annotations

import pytest

from danube_zmq.client.admin import AdminClient
from danube_zmq.transport.client_protocol import DispatchStrategy
from danube_zmq.transport.errors import InvalidArgument


async def test_create_topic_takes_the_dispatch_strategy_by_name_in_any_case(broker) -> None:
    """"reliable", "RELIABLE", "non-reliable" and the enum each create the topic they
    name; "durable" is refused naming both strategies and creates nothing."""
    async with AdminClient(broker.admin_url) as admin:
        await admin.create_topic("/default/by-name", dispatch_strategy="reliable")
        await admin.create_topic("/default/by-upper", dispatch_strategy="RELIABLE")
        await admin.create_topic("/default/by-hyphen", 2, dispatch_strategy="non-reliable")
        await admin.create_topic("/default/by-enum", dispatch_strategy=DispatchStrategy.RELIABLE)
        with pytest.raises(InvalidArgument, match="dispatch_strategy must be one of 'non_reliable', 'reliable',"
                                                  " got 'durable'"):
            await admin.create_topic("/default/bad", dispatch_strategy="durable")
        with pytest.raises(InvalidArgument, match="partitions must be an int >= 0"):
            await admin.create_topic("/default/bad", partitions=-1)
        topics = {t.name: (t.dispatch_strategy, t.partitions) for t in await admin.list_topics("default")}
    assert topics == {"/default/by-name": (DispatchStrategy.RELIABLE, 0),
                      "/default/by-upper": (DispatchStrategy.RELIABLE, 0),
                      "/default/by-hyphen": (DispatchStrategy.NON_RELIABLE, 2),
                      "/default/by-enum": (DispatchStrategy.RELIABLE, 0)}


async def test_the_auto_topic_creation_dispatch_takes_the_enum_or_its_name(broker) -> None:
    """set_namespace_auto_topic_creation: the enum, or the name in any case, stored as
    the policy's name; the type in Pulsar's or our spelling."""
    async with AdminClient(broker.admin_url) as admin:
        await admin.set_namespace_auto_topic_creation("default", auto_topic_creation_dispatch=DispatchStrategy.RELIABLE,
                                                      allow_auto_topic_creation_type="NON_PARTITIONED")
        info = await admin.get_namespace_auto_topic_creation("default")
        assert (info.auto_topic_creation_dispatch, info.allow_auto_topic_creation_type) == ("reliable",
                                                                                          "non-partitioned")
        await admin.set_namespace_auto_topic_creation("default", auto_topic_creation_dispatch="Non-Reliable")
        info = await admin.get_namespace_auto_topic_creation("default")
        assert info.auto_topic_creation_dispatch == "non_reliable"
        assert info.sources["auto_topic_creation_dispatch"] == "namespace"

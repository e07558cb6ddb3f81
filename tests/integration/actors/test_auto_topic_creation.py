"""Auto topic creation by subscribers (Pulsar's allowAutoTopicCreation), against real
broker processes, the client and the CLI: subscribing to a missing topic creates it as
its namespace's policy says (shape and dispatch), `namespaces policies set
--no-allow-auto-topic-creation` or the broker's `policies.allow_auto_topic_creation`
false bring back Danube's NOT_FOUND (producers still create), and a dead-letter topic
(created reliable when a failure policy names it) can be subscribed before its first
dead letter.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
import subprocess
import sys

import pytest

from danube_zmq import DanubeClient, SubType
from danube_zmq.client.admin import AdminClient
from danube_zmq.transport.client_protocol import DispatchStrategy
from danube_zmq.transport.errors import FailedPrecondition, InvalidArgument, NotFound
from tests.integration.cli.test_cli_e2e import danube
from tests.paths import ROOT


async def _cli(admin_url: str, *args: str) -> str:
    done = await asyncio.to_thread(danube, "admin", "--endpoint", admin_url, *args)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


async def test_subscribing_creates_the_topic_the_namespace_policy_describes(broker) -> None:
    """With the namespace set to partitioned x3, reliable: a subscriber's missing topic
    gets 3 reliable partitions; a reliable producer attaches and its messages arrive;
    a default (non-reliable) producer is refused by the topic's shape, as it would be
    on any reliable topic."""
    out = await _cli(broker.admin_url, "namespaces", "policies", "set", "default", "--allow-auto-topic-creation-type",
                     "partitioned", "--default-num-partitions", "3", "--auto-topic-creation-dispatch", "reliable")
    assert "default_num_partitions 3" in out
    shown = json.loads(await _cli(broker.admin_url, "namespaces", "policies", "get", "default", "-o", "json"))
    assert shown["allow_auto_topic_creation"] == {"value": True, "source": "broker"}
    assert shown["default_num_partitions"] == {"value": 3, "source": "namespace"}
    assert shown["auto_topic_creation_dispatch"] == {"value": "reliable", "source": "namespace"}
    async with DanubeClient(broker.url) as client:
        consumer = await client.subscribe("/default/made-by-sub", "s", sub_type=SubType.SHARED,
                                          initial_position="earliest")
        async with AdminClient(broker.admin_url) as admin:
            info = next(t for t in await admin.list_topics("default") if t.name == "/default/made-by-sub")
        assert (info.partitions, info.dispatch_strategy) == (3, DispatchStrategy.RELIABLE)
        producer = await client.create_producer("/default/made-by-sub", dispatch="reliable", partitions=3)
        for i in range(6):
            await producer.send(f"m{i}".encode(), key=str(i))
        got = sorted([(await consumer.receive(timeout=10)).payload for _ in range(6)])
        assert got == [f"m{i}".encode() for i in range(6)]
        with pytest.raises(FailedPrecondition, match="reliable"):
            await client.create_producer("/default/made-by-sub")


async def test_the_first_producer_gives_a_subscriber_made_topic_its_dispatch(broker) -> None:
    """Consumers first, as a pipeline starts: the topic they made (non-reliable by the
    default policy) takes the first producer's dispatch. A reliable producer gets acks
    and the consumers that subscribed before it get every message, on the subscriptions
    they made; once a producer attached, the dispatch is fixed. The reverse too: with
    the namespace's dispatch reliable, a default producer makes the topic non-reliable."""
    async with DanubeClient(broker.url) as client, AdminClient(broker.admin_url) as admin:
        shared = await client.subscribe("/default/consumers-first", "jobs", sub_type=SubType.SHARED)
        exclusive = await client.subscribe("/default/consumers-first", "audit")
        producer = await client.create_producer("/default/consumers-first", dispatch="reliable")
        for i in range(5):
            await producer.send(f"m{i}".encode())
        for consumer in (shared, exclusive):
            got = [await consumer.receive(timeout=10) for _ in range(5)]
            assert [m.payload for m in got] == [f"m{i}".encode() for i in range(5)]
            for message in got:
                await consumer.ack(message)
            assert consumer.reliable is True
        info = next(t for t in await admin.list_topics("default") if t.name == "/default/consumers-first")
        assert info.dispatch_strategy == DispatchStrategy.RELIABLE
        assert set(await admin.list_subscriptions("/default/consumers-first")) == {"jobs", "audit"}
        with pytest.raises(FailedPrecondition, match="is reliable; a non_reliable producer cannot attach"):
            await client.create_producer("/default/consumers-first")

        await admin.set_namespace_auto_topic_creation("default", auto_topic_creation_dispatch="reliable")
        consumer = await client.subscribe("/default/plain-first", "s")
        producer = await client.create_producer("/default/plain-first")
        await producer.send(b"plain")
        assert (await consumer.receive(timeout=10)).payload == b"plain"
        info = next(t for t in await admin.list_topics("default") if t.name == "/default/plain-first")
        assert info.dispatch_strategy == DispatchStrategy.NON_RELIABLE


async def test_an_unknown_dispatch_strategy_is_refused_and_adopts_nothing(broker) -> None:
    """A producer naming a dispatch strategy that does not exist, on a topic a subscriber
    made: INVALID_ARGUMENT for each request that names it, the topic stays adoptable,
    and the broker keeps serving (the fuzzer's 7 and 2**64-1 stopped the broker actor)."""
    from danube_zmq.transport import client_protocol as cp

    async with DanubeClient(broker.url) as client:
        consumer = await client.subscribe("/default/odd-dispatch", "s")
        connection = await client._connection(broker.url)
        for strategy in (7, 2**64 - 1):
            with pytest.raises(InvalidArgument, match=f"unknown dispatch strategy {strategy}"):
                await connection.request(lambda rid, s=strategy: cp.GetPartitions(
                    request_id=rid, topic="/default/odd-dispatch", create=True, dispatch_strategy=s))
            with pytest.raises(InvalidArgument, match=f"unknown dispatch strategy {strategy}"):
                await connection.request(lambda rid, s=strategy: cp.CreateProducer(
                    request_id=rid, topic="/default/odd-dispatch", producer_name="odd", dispatch_strategy=s))
        producer = await client.create_producer("/default/odd-dispatch", dispatch="reliable")
        await producer.send(b"after")
        assert (await consumer.receive(timeout=10)).payload == b"after"


async def test_a_namespace_with_auto_creation_off_answers_not_found_until_removed(broker) -> None:
    """--no-allow-auto-topic-creation: Danube's behaviour, NOT_FOUND naming the
    namespace's setting, and nothing is created; a producer still creates the topic.
    `policies remove` gives the broker's policy (on) back."""
    await _cli(broker.admin_url, "namespaces", "policies", "set", "default", "--no-allow-auto-topic-creation")
    async with DanubeClient(broker.url) as client:
        with pytest.raises(NotFound, match=r"auto topic creation is off in namespace 'default'"):
            await client.subscribe("/default/strict", "s")
        async with AdminClient(broker.admin_url) as admin:
            assert "/default/strict" not in [t.name for t in await admin.list_topics("default")]
        await client.create_producer("/default/strict")
        await client.subscribe("/default/strict", "s")  # it exists now
        await _cli(broker.admin_url, "namespaces", "policies", "remove", "default")
        await client.subscribe("/default/after-remove", "s")


async def test_the_broker_setting_turns_it_off_and_bad_policies_are_refused(broker_factory) -> None:
    """`policies.allow_auto_topic_creation: false` (here from the environment): NOT_FOUND
    naming it; a namespace may turn it back on. A bad type, dispatch or partition
    count is INVALID_ARGUMENT naming the policy."""
    broker = broker_factory(env={"DANUBE_POLICIES__ALLOW_AUTO_TOPIC_CREATION": "false"})
    async with DanubeClient(broker.url) as client, AdminClient(broker.admin_url) as admin:
        with pytest.raises(NotFound, match=r"policies\.allow_auto_topic_creation"):
            await client.subscribe("/default/off", "s")
        await admin.set_namespace_auto_topic_creation("default", allow_auto_topic_creation=True)
        await client.subscribe("/default/off", "s")
        with pytest.raises(InvalidArgument, match="allow_auto_topic_creation_type"):
            await admin.set_namespace_auto_topic_creation("default", allow_auto_topic_creation_type="sharded")
        with pytest.raises(InvalidArgument, match="auto_topic_creation_dispatch"):
            await admin.set_namespace_auto_topic_creation("default", auto_topic_creation_dispatch="durable")
        with pytest.raises(InvalidArgument, match="default_num_partitions"):
            await admin.set_namespace_auto_topic_creation("default", default_num_partitions=0)


async def test_a_dead_letter_topic_is_subscribed_before_its_first_dead_letter(broker) -> None:
    """Naming a dead-letter topic in a failure policy creates it, reliable as the first
    dead letter would (whatever the namespace's auto topic creation says): its consumer
    subscribes before any letter and receives the first one. A dead-letter topic in a
    missing namespace is refused when the policy is set, not found out at the first
    letter."""
    async with DanubeClient(broker.url) as client, AdminClient(broker.admin_url) as admin:
        producer = await client.create_producer("/default/orders-dl", dispatch="reliable")
        consumer = await client.subscribe("/default/orders-dl", "billing", initial_position="earliest")
        await admin.set_failure_policy("/default/orders-dl", "billing", max_redelivery_count=0,
                                       poison_policy="dead_letter", dead_letter_topic="/default/orders-dlq")
        info = next(t for t in await admin.list_topics("default") if t.name == "/default/orders-dlq")
        assert info.dispatch_strategy == DispatchStrategy.RELIABLE
        dead = await client.subscribe("/default/orders-dlq", "audit", initial_position="earliest")
        await producer.send(b"poison")
        message = await consumer.receive(timeout=10)
        await consumer.nack(message)
        letter = await dead.receive(timeout=20)
        assert letter.payload == b"poison"
        with pytest.raises(NotFound, match="namespace 'nowhere' does not exist"):
            await admin.set_failure_policy("/default/orders-dl", "billing", dead_letter_topic="/nowhere/dlq")


def test_the_operations_guide_commands_run_as_written(broker) -> None:
    """docs/operations.md's auto topic creation commands, as written (the admin endpoint
    from DANUBE_ADMIN_ENDPOINT): the namespace ends with creation off, its type,
    partitions and dispatch as the first command set them."""
    text = (ROOT / "docs" / "operations.md").read_text()
    section = text.split("**Auto topic creation**", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    assert block is not None, "operations.md's auto topic creation has no bash block"
    env = {**os.environ, "DANUBE_ADMIN_ENDPOINT": broker.admin_url}
    for line in block.group(1).replace("\\\n", " ").splitlines():
        argv = shlex.split(line, comments=True)
        assert argv[0] == "danube", line
        done = subprocess.run([sys.executable, "-m", "danube_zmq.cli.main", *argv[1:]], capture_output=True,
                              text=True, env=env, timeout=30)
        assert done.returncode == 0, done.stdout + done.stderr
    shown = json.loads(danube("admin", "--endpoint", broker.admin_url, "namespaces", "policies", "get", "default",
                              "-o", "json").stdout)
    assert {name: shown[name]["value"] for name in ("allow_auto_topic_creation", "allow_auto_topic_creation_type",
                                                      "default_num_partitions", "auto_topic_creation_dispatch")} \
        == {"allow_auto_topic_creation": False, "allow_auto_topic_creation_type": "partitioned",
            "default_num_partitions": 4, "auto_topic_creation_dispatch": "reliable"}

"""Subscription semantics against a real broker process, through the Python client."""

from __future__ import annotations

import asyncio
import collections
import signal
import subprocess
import sys
import time

import pytest

from danube_zmq import DanubeClient, SubType
from danube_zmq.client.message import Message
from danube_zmq.transport.errors import ConsumerBusy, InvalidArgument, NotFound, Timeout

# One broker for the module (tests/integration/conftest.py): each test has topics of its own.
SHARED_BROKER = True


async def drain(consumer, count: int, timeout_s: float = 10.0) -> list[Message]:
    """Receive exactly `count` messages (acking each), failing after `timeout_s`."""
    received = []
    deadline = time.monotonic() + timeout_s
    while len(received) < count:
        remaining = deadline - time.monotonic()
        assert remaining > 0, f"got {len(received)} of {count} messages"
        msg = await consumer.receive(timeout=remaining)
        await consumer.ack(msg)
        received.append(msg)
    return received


async def receive_all(consumers, idle_s: float = 0.7) -> dict[int, list[Message]]:
    """Receive from every consumer until none gets anything for `idle_s`."""
    got: dict[int, list[Message]] = {i: [] for i in range(len(consumers))}

    async def pull(i: int, consumer) -> None:
        while True:
            try:
                msg = await consumer.receive(timeout=idle_s)
            except Timeout:
                return
            await consumer.ack(msg)
            got[i].append(msg)

    await asyncio.gather(*(pull(i, c) for i, c in enumerate(consumers)))
    return got


def payloads(messages: list[Message]) -> list[bytes]:
    return [m.payload for m in messages]


async def test_fanout_to_three_exclusive_subscriptions_each_gets_all(broker) -> None:
    """Three Exclusive subscriptions on one topic each receive all 24 messages, in order."""
    async with DanubeClient(broker.url) as client:
        producer = await client.create_producer("/default/fanout")
        consumers = [await client.subscribe("/default/fanout", f"sub-{i}", sub_type=SubType.EXCLUSIVE)
                     for i in range(3)]
        sent = [f"m{i}".encode() for i in range(24)]
        for payload in sent:
            producer.send_nowait(payload)
        await producer.flush()
        for consumer in consumers:
            assert payloads(await drain(consumer, 24)) == sent


async def test_shared_round_robin_over_three_consumers(broker) -> None:
    """36 messages over 3 Shared consumers: about a third each, none delivered twice."""
    async with DanubeClient(broker.url) as client:
        producer = await client.create_producer("/default/queue")
        consumers = [await client.subscribe("/default/queue", "work", sub_type=SubType.SHARED,
                                            consumer_name=f"c{i}") for i in range(3)]
        for i in range(36):
            await producer.send(f"m{i}".encode())
        got = await receive_all(consumers)
        all_payloads = [p for msgs in got.values() for p in payloads(msgs)]
        assert sorted(all_payloads) == sorted(f"m{i}".encode() for i in range(36))
        assert len(set(all_payloads)) == 36
        assert all(10 <= len(msgs) <= 14 for msgs in got.values()), {i: len(m) for i, m in got.items()}


async def test_shared_consumer_churn_delivers_each_message_once(broker) -> None:
    """A Shared consumer joining mid-stream gets some messages; overall each arrives once."""
    async with DanubeClient(broker.url) as client:
        producer = await client.create_producer("/default/churn")
        first = [await client.subscribe("/default/churn", "work", sub_type=SubType.SHARED, consumer_name=f"c{i}")
                 for i in range(2)]
        for i in range(15):
            await producer.send(f"a{i}".encode())
        got_before = await receive_all(first)
        late = await client.subscribe("/default/churn", "work", sub_type=SubType.SHARED, consumer_name="c2")
        for i in range(30):
            await producer.send(f"b{i}".encode())
        got_after = await receive_all([*first, late])
        everything = [p for g in (got_before, got_after) for msgs in g.values() for p in payloads(msgs)]
        assert len(everything) == 45 and len(set(everything)) == 45
        assert got_after[2], "the late consumer received nothing"


async def test_second_exclusive_consumer_is_rejected(broker) -> None:
    """A different consumer name on a held Exclusive subscription gets CONSUMER_BUSY
    (Pulsar's ConsumerBusy), not a security refusal."""
    async with DanubeClient(broker.url) as client:
        await client.create_producer("/default/excl")
        await client.subscribe("/default/excl", "only", sub_type=SubType.EXCLUSIVE, consumer_name="first")
        with pytest.raises(ConsumerBusy, match="exclusive and consumer 'first' holds it"):
            await client.subscribe("/default/excl", "only", sub_type=SubType.EXCLUSIVE, consumer_name="second")


async def test_a_consumer_knows_whether_its_topic_is_reliable(broker) -> None:
    """The broker says at attach whether the topic stores messages (the gRPC door hands
    Danube's clients topic offset 0 for the ones it does not)."""
    async with DanubeClient(broker.url) as client:
        await client.create_producer("/default/stored", dispatch="reliable")
        await client.create_producer("/default/unstored")
        stored = await client.subscribe("/default/stored", "s")
        unstored = await client.subscribe("/default/unstored", "s")
        assert (stored.reliable, unstored.reliable) == (True, False)


async def test_key_shared_keeps_each_key_on_one_consumer(broker) -> None:
    """With Key-Shared, every message of a key goes to the same consumer, in order."""
    async with DanubeClient(broker.url) as client:
        producer = await client.create_producer("/default/keys")
        consumers = [await client.subscribe("/default/keys", "ks", sub_type=SubType.KEY_SHARED,
                                            consumer_name=f"c{i}") for i in range(3)]
        for round_ in range(10):
            for key in range(12):
                producer.send_nowait(f"{key}:{round_}".encode(), key=f"key-{key}")
        await producer.flush()
        got = await receive_all(consumers)
        owner: dict[str, int] = {}
        per_key: dict[str, list[int]] = collections.defaultdict(list)
        for i, msgs in got.items():
            for msg in msgs:
                assert owner.setdefault(msg.key, i) == i, f"{msg.key} went to two consumers"
                per_key[msg.key].append(int(msg.payload.decode().split(":")[1]))
        assert sum(len(v) for v in per_key.values()) == 120
        assert all(rounds == list(range(10)) for rounds in per_key.values())
        assert len(set(owner.values())) >= 2, "keys were not spread over consumers"


async def test_key_shared_filters_route_by_glob(broker) -> None:
    """Key filters send matching keys to the consumer that asked for them."""
    async with DanubeClient(broker.url) as client:
        producer = await client.create_producer("/default/kf")
        payments = await client.subscribe("/default/kf", "ks", sub_type=SubType.KEY_SHARED,
                                          consumer_name="pay", key_filters=["payment-*"])
        orders = await client.subscribe("/default/kf", "ks", sub_type=SubType.KEY_SHARED,
                                        consumer_name="ord", key_filters=["order-*"])
        for i in range(10):
            producer.send_nowait(b"p", key=f"payment-{i}")
            producer.send_nowait(b"o", key=f"order-{i}")
        await producer.flush()
        got = await receive_all([payments, orders])
        assert {m.key.split("-")[0] for m in got[0]} == {"payment"} and len(got[0]) == 10
        assert {m.key.split("-")[0] for m in got[1]} == {"order"} and len(got[1]) == 10


async def test_partitioned_topic_with_exclusive_and_shared(broker) -> None:
    """A 3-partition topic: one Exclusive consumer sees every partition; 3 Shared share it."""
    async with DanubeClient(broker.url) as client:
        producer = await client.create_producer("/default/parts", partitions=3)
        exclusive = await client.subscribe("/default/parts", "all", sub_type=SubType.EXCLUSIVE)
        shared = [await client.subscribe("/default/parts", "work", sub_type=SubType.SHARED, consumer_name=f"c{i}")
                  for i in range(3)]
        for i in range(60):
            await producer.send(f"m{i}".encode())
        got_all = await drain(exclusive, 60)
        assert {m.message_id.topic for m in got_all} == {f"/default/parts-part-{i}" for i in range(3)}
        got = await receive_all(shared)
        everything = [p for msgs in got.values() for p in payloads(msgs)]
        assert sorted(everything) == sorted(f"m{i}".encode() for i in range(60))
        assert all(msgs for msgs in got.values())


async def test_keyed_messages_stay_on_one_partition(broker) -> None:
    """Messages with the same key land on the same partition, in order."""
    async with DanubeClient(broker.url) as client:
        producer = await client.create_producer("/default/kparts", partitions=4)
        ids = [await producer.send(b"x", key="customer-7") for _ in range(10)]
        assert len({mid.topic for mid in ids}) == 1
        assert [mid.offset for mid in ids] == sorted(mid.offset for mid in ids)


async def test_initial_position_earliest_reads_the_tail(broker) -> None:
    """A new subscription at `earliest` starts from messages sent before it existed."""
    async with DanubeClient(broker.url) as client:
        producer = await client.create_producer("/default/early")
        for i in range(5):
            await producer.send(f"m{i}".encode())
        latest = await client.subscribe("/default/early", "late", initial_position="latest")
        earliest = await client.subscribe("/default/early", "early", initial_position="earliest")
        assert payloads(await drain(earliest, 5)) == [f"m{i}".encode() for i in range(5)]
        with pytest.raises(Timeout):
            await latest.receive(timeout=0.5)


async def test_consumer_on_missing_topic_is_not_found_where_auto_creation_is_off(broker_factory) -> None:
    """With policies.allow_auto_topic_creation false (Danube's behaviour) consumers create
    no topics: a missing one is NOT_FOUND naming it, as a missing namespace is."""
    strict = broker_factory(env={"DANUBE_POLICIES__ALLOW_AUTO_TOPIC_CREATION": "false"})
    async with DanubeClient(strict.url) as client:
        with pytest.raises(NotFound, match="/default/absent"):
            await client.subscribe("/default/absent", "s")
        with pytest.raises(NotFound, match="namespace 'nowhere' does not exist"):
            await client.subscribe("/nowhere/absent", "s")


async def test_oversized_message_rejected(broker_factory) -> None:
    """A payload over max_message_size is refused with INVALID_ARGUMENT."""
    small = broker_factory(env={"DANUBE_POLICIES__MAX_MESSAGE_SIZE": "1000"})
    async with DanubeClient(small.url) as client:
        producer = await client.create_producer("/default/big")
        with pytest.raises(InvalidArgument, match="1000"):
            await producer.send(b"x" * 1001)
        assert (await producer.send(b"x" * 1000)).offset == 0


def test_failover_promotes_standby_when_active_consumer_is_killed(broker, tmp_path) -> None:
    """Kill -9 the active Failover consumer (a `danube consume` process): the standby,
    next in attach order, takes over within the session timeout and gets what follows."""
    active = subprocess.Popen(
        [sys.executable, "-m", "danube_zmq.cli.main", "consume", "-s", broker.url, "-t", "/default/fo",
         "-m", "fo", "-n", "active", "--sub-type", "failover", "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    async def scenario() -> None:
        async with DanubeClient(broker.url) as client:
            producer = await client.create_producer("/default/fo")
            deadline = time.monotonic() + 10
            while True:  # wait until the subprocess's consumer is attached and active
                stats = (await _describe(broker, "/default/fo"))
                subs = stats.partitions[0].subscriptions
                if subs and subs[0].active_consumer == "active":
                    break
                assert time.monotonic() < deadline, "the active consumer never attached"
                await asyncio.sleep(0.1)
            standby = await client.subscribe("/default/fo", "fo", sub_type=SubType.FAILOVER, consumer_name="standby")
            await producer.send(b"before")
            with pytest.raises(Timeout):
                await standby.receive(timeout=0.5)  # the standby gets nothing while active lives
            line = active.stdout.readline()
            assert b"before" in line
            active.send_signal(signal.SIGKILL)
            active.wait(5)
            for i in range(5):
                await producer.send(f"after-{i}".encode())
                await asyncio.sleep(0.5)  # non-reliable: messages before promotion may be lost
            got = await receive_all([standby], idle_s=1.0)
            received = payloads(got[0])
            assert received, "the standby was never promoted"
            assert received == sorted(received, key=lambda p: int(p.split(b"-")[1]))

    try:
        asyncio.run(scenario())
    finally:
        if active.poll() is None:
            active.kill()


async def _describe(broker, topic: str):
    from danube_zmq.client.admin import AdminClient

    async with AdminClient(broker.admin_url) as admin:
        return await admin.describe_topic(topic)


async def test_producer_reconnects_after_broker_restart(broker_factory) -> None:
    """The broker is killed and restarted on the same port: the producer carries on."""
    first = broker_factory()
    async with DanubeClient(first.url) as client:
        producer = await client.create_producer("/default/restart")
        assert (await producer.send(b"one")).offset == 0
        first.stop(signal.SIGKILL)
        loop = asyncio.get_running_loop()
        second = await loop.run_in_executor(None, lambda: broker_factory(url=first.url, admin_url=first.admin_url))
        assert second.url == first.url
        message_id = await asyncio.wait_for(producer.send(b"two"), 30)
        assert message_id.topic == "/default/restart"


@pytest.mark.own_broker  # it checks the namespace holds no topic at the end
async def test_admin_unsubscribe_and_delete_close_clients_for_good(broker) -> None:
    """An admin unsubscribe closes the live consumer without it re-creating the
    subscription; deleting the topic finishes its producer instead of re-creating it."""
    from danube_zmq.client.admin import AdminClient
    from danube_zmq.transport.errors import FailedPrecondition

    async with DanubeClient(broker.url) as client, AdminClient(broker.admin_url) as admin:
        producer = await client.create_producer("/default/gone")
        consumer = await client.subscribe("/default/gone", "s", sub_type=SubType.EXCLUSIVE)
        await admin.unsubscribe("/default/gone", "s")
        with pytest.raises(FailedPrecondition, match="closed"):
            await consumer.receive(timeout=3)
        assert await admin.list_subscriptions("/default/gone") == []
        await admin.delete_topic("/default/gone")
        await asyncio.sleep(0.3)
        with pytest.raises(FailedPrecondition, match="closed"):
            await producer.send(b"after delete")
        assert [t.name for t in await admin.list_topics("default")] == []

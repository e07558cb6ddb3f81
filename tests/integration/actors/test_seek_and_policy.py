"""Seek and per-subscription failure policies on reliable topics, against real broker
processes: the client's `Consumer.seek`, the admin's `seek_subscription`,
`set_failure_policy` / `get_failure_policy`, and the same through `danube admin`."""

from __future__ import annotations

import asyncio
import json
import signal
from datetime import UTC, datetime

import pytest

from danube_zmq import DanubeClient, SubType
from danube_zmq.client.admin import AdminClient
from danube_zmq.transport.errors import FailedPrecondition, InvalidArgument, NotFound, Timeout
from tests.integration.actors.test_subscriptions import drain
from tests.integration.cli.test_cli_e2e import danube
from tests.integration.storage.test_reliable import FAST_REDELIVERY, describe_subscription

# One broker for the module (tests/integration/conftest.py): each test has topics of its own.
SHARED_BROKER = True


async def produce(client: DanubeClient, topic: str, count: int, prefix: str = "m") -> None:
    producer = await client.create_producer(topic, dispatch="reliable")
    for i in range(count):
        await producer.send(f"{prefix}{i}".encode())


async def reliable_consumer(client: DanubeClient, topic: str, subscription: str = "s", **options: object):
    """Create the reliable topic (a producer does), then subscribe."""
    await client.create_producer(topic, dispatch="reliable")
    return await client.subscribe(topic, subscription, **options)


async def test_seek_back_to_an_offset_redelivers_from_there(broker) -> None:
    """Ten messages consumed and acked; `seek(offset=3)` makes offsets 3..9 come again,
    and describe shows the cursor moved back to 2."""
    async with DanubeClient(broker.url) as client:
        consumer = await reliable_consumer(client, "/default/sk1", sub_type=SubType.EXCLUSIVE)
        await produce(client, "/default/sk1", 10)
        await drain(consumer, 10)
        await consumer.flush_acks()
        await consumer.seek(offset=3)
        info = await describe_subscription(broker, "/default/sk1", "s")
        assert info.cursor >= 2 and info.backlog_messages <= 7, info
        again = await drain(consumer, 7)
        assert [m.message_id.offset for m in again] == list(range(3, 10))
        assert [m.payload for m in again] == [f"m{i}".encode() for i in range(3, 10)]
        with pytest.raises(Timeout):
            await consumer.receive(timeout=0.5)


async def test_seek_drops_what_the_consumer_had_queued(broker) -> None:
    """A consumer that prefetched 20 messages and took 5 seeks to 2: the next message it
    receives is offset 2, not the queued offset 5."""
    async with DanubeClient(broker.url) as client:
        consumer = await reliable_consumer(client, "/default/sk2", sub_type=SubType.EXCLUSIVE)
        await produce(client, "/default/sk2", 20)
        first = [await consumer.receive(timeout=5) for _ in range(5)]
        assert [m.message_id.offset for m in first] == list(range(5))
        await asyncio.sleep(0.2)  # the other 15 reach the receive queue
        await consumer.seek(offset=2)
        got = await drain(consumer, 18)
        assert [m.message_id.offset for m in got] == list(range(2, 20))


async def test_admin_seek_moves_a_connected_consumer(broker) -> None:
    """An admin seek to offset 0 while a consumer is attached: it keeps its attachment
    and receives everything again from 0."""
    async with DanubeClient(broker.url) as client, AdminClient(broker.admin_url) as admin:
        consumer = await reliable_consumer(client, "/default/sk3", sub_type=SubType.SHARED)
        await produce(client, "/default/sk3", 6)
        await drain(consumer, 6)
        await consumer.flush_acks()
        await admin.seek_subscription("/default/sk3", "s", offset=0)
        again = await drain(consumer, 6)
        assert [m.message_id.offset for m in again] == list(range(6))


async def test_seek_by_publish_time(broker) -> None:
    """`seek(publish_time=t)` restarts at the first message published at or after t; a
    time after every message waits for the next one."""
    async with DanubeClient(broker.url) as client:
        consumer = await reliable_consumer(client, "/default/sk4", sub_type=SubType.EXCLUSIVE)
        producer = await client.create_producer("/default/sk4", dispatch="reliable")
        for i in range(5):
            await producer.send(f"old{i}".encode())
        await asyncio.sleep(0.05)
        for i in range(5):
            await producer.send(f"new{i}".encode())
        got = await drain(consumer, 10)
        t = got[5].publish_time
        assert got[4].publish_time < t
        await consumer.flush_acks()
        await consumer.seek(publish_time=t)
        again = await drain(consumer, 5)
        assert [m.payload for m in again] == [f"new{i}".encode() for i in range(5)]

        await consumer.seek(publish_time=got[-1].publish_time + 60_000)
        with pytest.raises(Timeout):
            await consumer.receive(timeout=0.5)
        await producer.send(b"later")
        assert (await consumer.receive(timeout=5)).payload == b"later"

        async with AdminClient(broker.admin_url) as admin:
            await admin.seek_subscription("/default/sk4", "s", publish_time=0)
        assert (await consumer.receive(timeout=5)).message_id.offset == 0


async def test_seek_out_of_range_is_a_clear_error(broker) -> None:
    """An offset past the committed end is INVALID_ARGUMENT naming the valid range, from
    the client and from the admin; the subscription does not move."""
    async with DanubeClient(broker.url) as client, AdminClient(broker.admin_url) as admin:
        consumer = await reliable_consumer(client, "/default/sk5", sub_type=SubType.EXCLUSIVE)
        await produce(client, "/default/sk5", 10)
        await drain(consumer, 10)
        with pytest.raises(InvalidArgument, match=r"outside /default/sk5's log: seek to 0\.\.10"):
            await consumer.seek(offset=11)
        with pytest.raises(InvalidArgument, match=r"0\.\.10"):
            await admin.seek_subscription("/default/sk5", "s", offset=100)
        with pytest.raises(InvalidArgument, match="exactly one"):
            await consumer.seek()
        with pytest.raises(NotFound, match="nope"):
            await admin.seek_subscription("/default/sk5", "nope", offset=0)
        await consumer.seek(offset=10)  # the end is allowed: nothing to redeliver
        with pytest.raises(Timeout):
            await consumer.receive(timeout=0.5)


async def test_seek_and_failure_policy_are_refused_on_non_reliable_topics(broker) -> None:
    """FAILED_PRECONDITION for seek (client and admin) and failure policies on a
    non-reliable topic."""
    async with DanubeClient(broker.url) as client, AdminClient(broker.admin_url) as admin:
        await client.create_producer("/default/sk6")
        consumer = await client.subscribe("/default/sk6", "s")
        with pytest.raises(FailedPrecondition, match="not reliable"):
            await consumer.seek(offset=0)
        with pytest.raises(FailedPrecondition, match="not reliable"):
            await admin.seek_subscription("/default/sk6", "s", offset=0)
        with pytest.raises(FailedPrecondition, match="not reliable"):
            await admin.set_failure_policy("/default/sk6", "s", max_redelivery_count=1)
        with pytest.raises(FailedPrecondition, match="not reliable"):
            await admin.get_failure_policy("/default/sk6", "s")


async def nack_storm(consumer, payload: bytes) -> tuple[list[int], list[bytes]]:
    """Nack every delivery of `payload` and ack everything else, until nothing comes for
    1.5 s; returns the redelivery counts of `payload` and the other payloads seen."""
    counts: list[int] = []
    others: list[bytes] = []
    while True:
        try:
            msg = await consumer.receive(timeout=1.5)
        except Timeout:
            return counts, others
        if msg.payload == payload:
            counts.append(msg.redelivery_count)
            await consumer.nack(msg)
        else:
            others.append(msg.payload)
            await consumer.ack(msg)


async def test_set_failure_policy_changes_redelivery_count_and_poison_policy(broker_factory) -> None:
    """The broker defaults to 2 redeliveries and block; after set-failure-policy with
    max_redelivery_count 4 and drop, a nack storm sees counts 0..4, then the message is
    dropped (the cursor passes it). dead_letter with a topic republishes there."""
    broker = broker_factory(env=FAST_REDELIVERY)
    async with DanubeClient(broker.url) as client, AdminClient(broker.admin_url) as admin:
        consumer = await reliable_consumer(client, "/default/fp1", sub_type=SubType.EXCLUSIVE)
        before = await admin.get_failure_policy("/default/fp1", "s")
        assert (before.max_redelivery_count, before.poison_policy, before.explicit) == (2, "block", False)
        after = await admin.set_failure_policy("/default/fp1", "s", max_redelivery_count=4, poison_policy="drop",
                                               base_redelivery_delay_ms=20, backoff="fixed")
        assert after.ack_timeout_ms == 600, "unspecified fields keep their values"
        got = await admin.get_failure_policy("/default/fp1", "s")
        assert (got.max_redelivery_count, got.poison_policy, got.backoff, got.explicit) == (4, "drop", "fixed", True)

        producer = await client.create_producer("/default/fp1", dispatch="reliable")
        await producer.send(b"poison")
        await producer.send(b"next")
        assert await nack_storm(consumer, b"poison") == ([0, 1, 2, 3, 4], [b"next"])
        info = await describe_subscription(broker, "/default/fp1", "s")
        assert info.cursor == 1 and info.blocked_offset is None, "dropped, not blocked"

        await admin.set_failure_policy("/default/fp1", "s", max_redelivery_count=0, poison_policy="dead_letter",
                                       dead_letter_topic="/default/fp1-dlq")
        await producer.send(b"poison2")
        await producer.send(b"next2")
        assert await nack_storm(consumer, b"poison2") == ([0], [b"next2"])
        for _ in range(50):  # the broker creates the dead-letter topic with the first letter
            try:
                dlq = await client.subscribe("/default/fp1-dlq", "audit", initial_position="earliest")
                break
            except NotFound:
                await asyncio.sleep(0.1)
        letter = await dlq.receive(timeout=5)
        assert letter.payload == b"poison2" and letter.attributes["x-original-topic"] == "/default/fp1"


async def test_lowering_max_redelivery_count_applies_to_a_waiting_message(broker_factory) -> None:
    """A message nacked with a one-minute delay waits for redelivery and holds the
    cursor back; setting max_redelivery_count 0 with drop settles it at once."""
    broker = broker_factory(env={**FAST_REDELIVERY, "DANUBE_RELIABLE__MAX_REDELIVERY_COUNT": "5"})
    async with DanubeClient(broker.url) as client, AdminClient(broker.admin_url) as admin:
        consumer = await reliable_consumer(client, "/default/fp2", sub_type=SubType.EXCLUSIVE)
        await admin.set_failure_policy("/default/fp2", "s", max_redelivery_delay_ms=60_000)
        producer = await client.create_producer("/default/fp2", dispatch="reliable")
        await producer.send(b"slow")
        await producer.send(b"next")
        slow, nxt = await consumer.receive(timeout=5), await consumer.receive(timeout=5)
        await consumer.nack(slow, delay_ms=60_000)
        await consumer.ack(nxt)
        await consumer.flush_acks()
        await asyncio.sleep(0.3)
        assert (await describe_subscription(broker, "/default/fp2", "s")).cursor == -1
        await admin.set_failure_policy("/default/fp2", "s", max_redelivery_count=0, poison_policy="drop")
        await asyncio.sleep(0.3)
        assert (await describe_subscription(broker, "/default/fp2", "s")).cursor == 1
        with pytest.raises(Timeout):
            await consumer.receive(timeout=0.5)


async def test_invalid_failure_policy_names_the_field(broker) -> None:
    """INVALID_ARGUMENT names the field at fault; nothing changes."""
    async with DanubeClient(broker.url) as client, AdminClient(broker.admin_url) as admin:
        await client.create_producer("/default/fp3", dispatch="reliable")
        await client.subscribe("/default/fp3", "s")
        with pytest.raises(InvalidArgument, match="dead_letter_topic"):
            await admin.set_failure_policy("/default/fp3", "s", poison_policy="dead_letter")
        with pytest.raises(InvalidArgument, match="max_redelivery_count"):
            await admin.set_failure_policy("/default/fp3", "s", max_redelivery_count=5000)
        with pytest.raises(InvalidArgument, match="backoff"):
            await admin.set_failure_policy("/default/fp3", "s", backoff="linear")
        with pytest.raises(InvalidArgument, match="max_redelivery_delay_ms"):
            await admin.set_failure_policy("/default/fp3", "s", max_redelivery_delay_ms=1)
        assert not (await admin.get_failure_policy("/default/fp3", "s")).explicit


async def test_failure_policy_survives_a_broker_restart(broker_factory) -> None:
    """A policy set just before kill -9 is back after the restart (it is stored before
    the answer) and governs redelivery: max 1 redelivery, then drop."""
    first = broker_factory(env=FAST_REDELIVERY)
    async with DanubeClient(first.url) as client, AdminClient(first.admin_url) as admin:
        await client.create_producer("/default/fp4", dispatch="reliable")
        await client.subscribe("/default/fp4", "s", sub_type=SubType.EXCLUSIVE, consumer_name="c")
        await admin.set_failure_policy("/default/fp4", "s", max_redelivery_count=1, poison_policy="drop",
                                       ack_timeout_ms=700, dead_letter_topic="/default/unused")
    first.stop(signal.SIGKILL)
    second = broker_factory(url=first.url, admin_url=first.admin_url, env=FAST_REDELIVERY)
    async with DanubeClient(second.url) as client, AdminClient(second.admin_url) as admin:
        policy = await admin.get_failure_policy("/default/fp4", "s")
        assert (policy.max_redelivery_count, policy.poison_policy, policy.ack_timeout_ms,
                policy.dead_letter_topic, policy.explicit) == (1, "drop", 700, "/default/unused", True)
        consumer = await reliable_consumer(client, "/default/fp4", sub_type=SubType.EXCLUSIVE, consumer_name="c")
        producer = await client.create_producer("/default/fp4", dispatch="reliable")
        await producer.send(b"poison")
        await producer.send(b"next")
        assert await nack_storm(consumer, b"poison") == ([0, 1], [b"next"])
    assert second.stop() == 0


def test_cli_failure_policy_seek_and_describe(broker) -> None:
    """`danube admin topics set-failure-policy / get-failure-policy / seek / describe`
    in subprocesses: options reach the broker, JSON and table output, errors as one
    `error:` line."""
    admin = ("admin", "--endpoint", broker.admin_url)
    assert danube(*admin, "topics", "create", "/default/cli-sk", "--dispatch-strategy", "reliable").returncode == 0
    sent = danube("produce", "-s", broker.url, "--reliable", "-t", "/default/cli-sk", "-m", "hi", "-c", "5")
    assert sent.returncode == 0, sent.stderr
    got = danube("consume", "-s", broker.url, "-t", "/default/cli-sk", "-m", "s", "--initial-position", "earliest",
                 "-c", "5", "--timeout", "10", "--json")
    assert got.returncode == 0, got.stderr

    before = danube(*admin, "topics", "get-failure-policy", "/default/cli-sk", "-s", "s", "-o", "json")
    assert before.returncode == 0, before.stderr
    assert json.loads(before.stdout)["explicit"] is False

    set_ = danube(*admin, "topics", "set-failure-policy", "/default/cli-sk", "-s", "s", "--max-redelivery-count", "7",
                  "--backoff-strategy", "fixed", "--poison-policy", "dead_letter", "--dead-letter-topic", "/default/d")
    assert set_.returncode == 0, set_.stderr
    assert "max_redelivery_count=7" in set_.stdout
    shown = danube(*admin, "topics", "get-failure-policy", "/default/cli-sk", "-s", "s", "-o", "json")
    policy = json.loads(shown.stdout)
    assert policy == {"max_redelivery_count": 7, "ack_timeout_ms": 30_000, "base_redelivery_delay_ms": 1000,
                      "max_redelivery_delay_ms": 60_000, "backoff": "fixed", "poison_policy": "dead_letter",
                      "dead_letter_topic": "/default/d", "explicit": True}
    table = danube(*admin, "topics", "get-failure-policy", "/default/cli-sk", "-s", "s")
    assert "MAX-REDELIVERIES" in table.stdout and "dead_letter" in table.stdout

    bad = danube(*admin, "topics", "set-failure-policy", "/default/cli-sk", "-s", "s", "--max-redelivery-count",
                 "5000")
    assert bad.returncode != 0 and bad.stderr.startswith("error:") and "max_redelivery_count" in bad.stderr

    moved = danube(*admin, "topics", "seek", "/default/cli-sk", "-s", "s", "--offset", "2")
    assert moved.returncode == 0, moved.stderr
    described = json.loads(danube(*admin, "topics", "describe", "/default/cli-sk", "-o", "json").stdout)
    [subscription] = described["partitions"][0]["subscriptions"]
    assert subscription["cursor"] == 1 and subscription["backlog_messages"] == 3, subscription
    assert {"unacked_messages", "redeliveries", "blocked_offset"} <= subscription.keys()
    table = danube(*admin, "topics", "describe", "/default/cli-sk")
    assert "Reliable delivery" in table.stdout and "CURSOR" in table.stdout and "BACKLOG" in table.stdout

    again = danube("consume", "-s", broker.url, "-t", "/default/cli-sk", "-m", "s", "-c", "3", "--timeout", "10",
                   "--json")
    assert [json.loads(line)["offset"] for line in again.stdout.splitlines()] == [2, 3, 4]

    future = datetime.now(UTC).replace(year=datetime.now(UTC).year + 1).isoformat()
    by_time = danube(*admin, "topics", "seek", "/default/cli-sk", "-s", "s", "--time", future)
    assert by_time.returncode == 0, by_time.stderr
    by_ms = danube(*admin, "topics", "seek", "/default/cli-sk", "-s", "s", "--time", "0")
    assert by_ms.returncode == 0, by_ms.stderr
    described = json.loads(danube(*admin, "topics", "describe", "/default/cli-sk", "-o", "json").stdout)
    assert described["partitions"][0]["subscriptions"][0]["cursor"] == -1

    out_of_range = danube(*admin, "topics", "seek", "/default/cli-sk", "-s", "s", "--offset", "99")
    assert out_of_range.returncode != 0 and "0..5" in out_of_range.stderr, out_of_range.stderr
    both = danube(*admin, "topics", "seek", "/default/cli-sk", "-s", "s", "--offset", "1", "--time", "0")
    assert both.returncode != 0 and "exactly one" in both.stderr
    assert danube(*admin, "topics", "create", "/default/cli-nr").returncode == 0
    refused = danube(*admin, "topics", "get-failure-policy", "/default/cli-nr", "-s", "s")
    assert refused.returncode != 0 and "not reliable" in refused.stderr


def test_sync_consumer_seek(broker) -> None:
    """The blocking facade seeks like the asyncio consumer."""
    from danube_zmq import SyncClient

    with SyncClient(broker.url) as client:
        producer = client.create_producer("/default/sync-seek", dispatch="reliable")
        consumer = client.subscribe("/default/sync-seek", "s", sub_type="exclusive")
        for i in range(3):
            producer.send(f"m{i}".encode())
        for _ in range(3):
            consumer.ack(consumer.receive(timeout=5))
        consumer.seek(offset=1)
        assert consumer.receive(timeout=5).payload == b"m1"

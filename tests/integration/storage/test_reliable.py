"""Reliable topics against real broker processes: store-then-deliver, acks, redelivery,
poison policies, cursors and restarts."""

from __future__ import annotations

import asyncio
import signal

import pytest

from danube_zmq import DanubeClient, SubType
from danube_zmq.client.admin import AdminClient
from danube_zmq.transport.errors import Timeout
from tests.integration.actors.test_metrics_endpoint import get, series
from tests.integration.actors.test_subscriptions import drain
from tests.integration.conftest import free_port

# One broker for the module (tests/integration/conftest.py): each test has topics of its own.
SHARED_BROKER = True

FAST_REDELIVERY = {
    "DANUBE_RELIABLE__BASE_REDELIVERY_DELAY_MS": "100",
    "DANUBE_RELIABLE__MAX_REDELIVERY_DELAY_MS": "400",
    "DANUBE_RELIABLE__ACK_TIMEOUT_MS": "600",
    "DANUBE_RELIABLE__MAX_REDELIVERY_COUNT": "2",
}


async def describe_subscription(broker, topic: str, name: str):
    async with AdminClient(broker.admin_url) as admin:
        info = await admin.describe_topic(topic)
    return next(s for p in info.partitions for s in p.subscriptions if s.name == name)


async def test_reliable_produce_and_consume(broker) -> None:
    """Messages sent to a reliable topic are acknowledged with offsets and delivered in order."""
    async with DanubeClient(broker.url) as client:
        producer = await client.create_producer("/default/r1", dispatch="reliable")
        consumer = await client.subscribe("/default/r1", "s", sub_type=SubType.EXCLUSIVE)
        ids = [await producer.send(f"m{i}".encode()) for i in range(20)]
        assert [i.offset for i in ids] == list(range(20))
        got = await drain(consumer, 20)
        assert [m.payload for m in got] == [f"m{i}".encode() for i in range(20)]
        info = await describe_subscription(broker, "/default/r1", "s")
        await asyncio.sleep(0.3)
        info = await describe_subscription(broker, "/default/r1", "s")
        assert info.cursor == 19 and info.backlog_messages == 0 and info.unacked_messages == 0


async def test_reliable_messages_survive_a_restart_with_continuous_offsets(broker_factory) -> None:
    """After SIGTERM and restart, earliest replays every message and new offsets continue."""
    first = broker_factory()
    async with DanubeClient(first.url) as client:
        producer = await client.create_producer("/default/r2", dispatch="reliable")
        for i in range(50):
            producer.send_nowait(f"a{i}".encode())
        await producer.flush()
    assert first.stop() == 0
    second = broker_factory(url=first.url, admin_url=first.admin_url)
    async with DanubeClient(second.url) as client:
        producer = await client.create_producer("/default/r2", dispatch="reliable")
        assert (await producer.send(b"after")).offset == 50
        consumer = await client.subscribe("/default/r2", "replay", initial_position="earliest")
        got = await drain(consumer, 51)
        assert [m.message_id.offset for m in got] == list(range(51))


async def test_cursor_survives_restart(broker_factory) -> None:
    """Acknowledged messages are not redelivered after a restart; the rest are."""
    first = broker_factory()
    async with DanubeClient(first.url) as client:
        producer = await client.create_producer("/default/r3", dispatch="reliable")
        consumer = await client.subscribe("/default/r3", "s", sub_type=SubType.EXCLUSIVE, consumer_name="c")
        for i in range(10):
            await producer.send(f"m{i}".encode())
        await drain(consumer, 5)
        await consumer.flush_acks()
        await asyncio.sleep(0.5)  # past the cursor flush interval
    first.stop(signal.SIGKILL)
    second = broker_factory(url=first.url, admin_url=first.admin_url)
    async with DanubeClient(second.url) as client:
        consumer = await client.subscribe("/default/r3", "s", sub_type=SubType.EXCLUSIVE, consumer_name="c")
        got = await drain(consumer, 5)
        assert [m.payload for m in got] == [f"m{i}".encode() for i in range(5, 10)]
        with pytest.raises(Timeout):
            await consumer.receive(timeout=0.5)


async def test_exclusive_reconnect_gets_unacked_messages_again(broker) -> None:
    """A consumer that leaves without acking gets the same messages when it comes back."""
    async with DanubeClient(broker.url) as client:
        producer = await client.create_producer("/default/r4", dispatch="reliable")
        consumer = await client.subscribe("/default/r4", "s", sub_type=SubType.EXCLUSIVE, consumer_name="c")
        for i in range(3):
            await producer.send(f"m{i}".encode())
        first = [await consumer.receive(timeout=5) for _ in range(3)]
        await consumer.close()
        again = await client.subscribe("/default/r4", "s", sub_type=SubType.EXCLUSIVE, consumer_name="c")
        second = await drain(again, 3)
        assert [m.payload for m in second] == [m.payload for m in first]
        assert all(m.redelivery_count >= 1 for m in second)


async def test_shared_unacked_messages_move_to_another_consumer(broker) -> None:
    """When a Shared consumer leaves with unacked messages, another consumer gets them."""
    async with DanubeClient(broker.url) as client:
        producer = await client.create_producer("/default/r5", dispatch="reliable")
        leaver = await client.subscribe("/default/r5", "s", consumer_name="leaver")
        for i in range(4):
            await producer.send(f"m{i}".encode())
        held = [await leaver.receive(timeout=5) for _ in range(4)]
        stayer = await client.subscribe("/default/r5", "s", consumer_name="stayer")
        await leaver.close()
        got = await drain(stayer, 4)
        assert sorted(m.payload for m in got) == sorted(m.payload for m in held)


async def test_nack_redelivers_with_increasing_count(broker_factory) -> None:
    """A nacked message comes back after the backoff with redelivery_count 1, then 2."""
    broker = broker_factory(env=FAST_REDELIVERY)
    async with DanubeClient(broker.url) as client:
        producer = await client.create_producer("/default/r6", dispatch="reliable")
        consumer = await client.subscribe("/default/r6", "s", sub_type=SubType.EXCLUSIVE)
        await producer.send(b"retry me")
        counts = []
        for _ in range(3):
            msg = await consumer.receive(timeout=5)
            counts.append(msg.redelivery_count)
            await consumer.nack(msg)
        assert counts == [0, 1, 2]


async def test_ack_timeout_redelivers(broker_factory) -> None:
    """A message received but never acked is delivered again after the ack timeout."""
    broker = broker_factory(env=FAST_REDELIVERY)
    async with DanubeClient(broker.url) as client:
        producer = await client.create_producer("/default/r7", dispatch="reliable")
        consumer = await client.subscribe("/default/r7", "s", sub_type=SubType.EXCLUSIVE)
        await producer.send(b"forgotten")
        first = await consumer.receive(timeout=5)
        second = await consumer.receive(timeout=5)
        assert second.payload == first.payload and second.redelivery_count == 1


@pytest.mark.parametrize("policy", ["drop", "dead_letter", "block"])
async def test_poison_policies(broker_factory, policy: str) -> None:
    """After max_redelivery_count redeliveries: drop skips the message, dead_letter
    republishes it with x-original-* attributes (and the broker's metrics count the
    letter and the two redeliveries), block stops the subscription there."""
    env = {**FAST_REDELIVERY, "DANUBE_RELIABLE__POISON_POLICY": policy}
    if policy == "dead_letter":
        env["DANUBE_RELIABLE__DEAD_LETTER_TOPIC"] = "/default/r8-dlq"
    metrics_port = free_port()
    broker = broker_factory("--metrics-port", str(metrics_port), env=env)
    async with DanubeClient(broker.url) as client:
        producer = await client.create_producer("/default/r8", dispatch="reliable")
        consumer = await client.subscribe("/default/r8", "s", sub_type=SubType.EXCLUSIVE)
        await producer.send(b"poison")
        for _ in range(3):  # the first delivery and max_redelivery_count (2) redeliveries
            await consumer.nack(await consumer.receive(timeout=5))
        await producer.send(b"next")
        if policy == "block":
            with pytest.raises(Timeout):
                await consumer.receive(timeout=1.5)
            info = await describe_subscription(broker, "/default/r8", "s")
            assert info.blocked_offset == 0
            return
        nxt = await consumer.receive(timeout=5)
        assert nxt.payload == b"next"
        if policy == "dead_letter":
            # Whether the letter made the topic yet or not: subscribing makes the broker's
            # dead-letter topic reliable, as the letter would.
            dlq = await client.subscribe("/default/r8-dlq", "audit", initial_position="earliest")
            letter = await dlq.receive(timeout=5)
            assert letter.payload == b"poison"
            assert letter.attributes["x-original-topic"] == "/default/r8"
            assert letter.attributes["x-original-subscription"] == "s"
            assert letter.attributes["x-original-offset"] == "0"
            assert letter.attributes["x-delivery-attempt"] == "3"
            _, body = await asyncio.to_thread(get, f"http://127.0.0.1:{metrics_port}/metrics")
            labels = '{subscription="s",topic="/default/r8"}'
            assert series(body, "danube_subscription_dlq_total")[labels] == 1
            assert series(body, "danube_subscription_redelivery_total")[labels] == 2


async def test_reliable_and_non_reliable_do_not_mix(broker) -> None:
    """A non-reliable producer on a reliable topic is refused, and the other way round."""
    from danube_zmq.transport.errors import FailedPrecondition

    async with DanubeClient(broker.url) as client:
        await client.create_producer("/default/r9", dispatch="reliable")
        with pytest.raises(FailedPrecondition, match="reliable"):
            await client.create_producer("/default/r9")


async def test_describe_reports_backlog_in_messages_and_bytes(broker) -> None:
    """A subscription behind by 11 messages of 1 KiB shows a backlog of 11 and at least 11 KiB."""
    async with DanubeClient(broker.url) as client:
        producer = await client.create_producer("/default/r10", dispatch="reliable")
        await client.subscribe("/default/r10", "behind", sub_type=SubType.EXCLUSIVE, receiver_queue_size=1)
        for _ in range(11):
            await producer.send(b"x" * 1024)
        await asyncio.sleep(0.3)
        info = await describe_subscription(broker, "/default/r10", "behind")
        assert info.backlog_messages == 11
        assert 11 * 1024 <= info.backlog_bytes <= 11 * 1200


async def test_a_backlog_larger_than_a_frame_is_delivered(broker) -> None:
    """A held backlog of 64 KiB messages larger than limits.frame_bytes_max (16 MiB) is
    delivered whole to a consumer granting the default 1,000 permits: the broker splits
    one consumer's run into Deliver frames that each fit a frame (one 1,000-message frame
    of 64 MiB was dropped by the client's ZMQ_MAXMSGSIZE and nothing ever arrived)."""
    payload, count = b"x" * 64 * 1024, 300  # 18.75 MiB
    async with DanubeClient(broker.url) as client:
        producer = await client.create_producer("/default/big-backlog", dispatch="reliable")
        await (await client.subscribe("/default/big-backlog", "held", initial_position="earliest")).close()
        for start in range(0, count, 32):
            await asyncio.gather(*(producer.send(payload) for _ in range(min(32, count - start))))
        consumer = await client.subscribe("/default/big-backlog", "held", initial_position="earliest")
        offsets = []
        for _ in range(count):
            message = await consumer.receive(timeout=30)
            offsets.append(message.offset)
            await consumer.ack(message)
    assert offsets == list(range(count))


async def test_a_backlog_larger_than_the_outbound_budget_is_delivered(broker_factory) -> None:
    """A held backlog of 48 MiB, more than limits.outbound_bytes_per_connection_max
    (32 MiB), is delivered whole long before the ack timeout (10 minutes here): the
    Deliver frames the connection's budget refuses go back to the subscription with
    their permits, which sends them again once the connection drains (they were counted
    delivered and their permits lost, so nothing more came: the 64 MiB move stalled)."""
    broker = broker_factory(env={"DANUBE_RELIABLE__ACK_TIMEOUT_MS": "600000"})
    payload, count = b"x" * 64 * 1024, 768
    async with DanubeClient(broker.url) as client:
        producer = await client.create_producer("/default/over-budget", dispatch="reliable")
        await (await client.subscribe("/default/over-budget", "held", initial_position="earliest")).close()
        for start in range(0, count, 32):
            await asyncio.gather(*(producer.send(payload) for _ in range(min(32, count - start))))
        consumer = await client.subscribe("/default/over-budget", "held", initial_position="earliest")
        offsets = []
        for _ in range(count):
            message = await consumer.receive(timeout=60)
            offsets.append(message.offset)
            await consumer.ack(message)
    assert offsets == list(range(count))

"""The consumer against the fake broker: receive, flow permits, batched acks, nacks,
partitions, re-subscription after ConsumerClosed and after a broker restart."""

from __future__ import annotations

import asyncio

import pytest

from danube_zmq.client import InitialPosition, Message, MessageId, SubType
from danube_zmq.client.consumer import split_window
from danube_zmq.client.errors import AlreadyClosed
from danube_zmq.transport.client_protocol import Ack, Flow, GetPartitions, Nack, Subscribe, Unsubscribe
from danube_zmq.transport.common import Connect
from danube_zmq.transport.errors import ErrorCode, FailedPrecondition, InvalidArgument, NotFound, Timeout
from tests.unit.client.test_client_fake_broker import FakeBroker, client_for, eventually, running_broker

TOPIC = "/default/events"


def only_consumer(broker: FakeBroker):
    (consumer,) = broker.consumers.values()
    return consumer


@pytest.mark.asyncio
async def test_receive_returns_the_message_with_its_fields() -> None:
    """What a producer sent arrives with payload, key, attributes, publish time,
    producer name and a MessageId naming topic, offset and producer."""
    async with running_broker() as broker, client_for(broker) as client:
        producer = await client.create_producer(TOPIC, name="prod")
        consumer = await client.subscribe(TOPIC, "sub", sub_type="exclusive", consumer_name="c1")
        sent = await producer.send(b"hello", key="k", attributes={"a": "1"})
        msg = await consumer.receive(timeout=2)
        assert isinstance(msg, Message)
        assert msg.payload == b"hello" and msg.value() == b"hello"
        assert msg.key == "k" and dict(msg.attributes) == {"a": "1"}
        assert msg.message_id == sent == MessageId(TOPIC, 0, sent.producer_id)
        assert msg.topic == TOPIC and msg.producer_name == "prod" and msg.redelivery_count == 0
        assert msg.publish_time > 1_600_000_000_000
        (subscribe,) = broker.of(Subscribe)
        assert (subscribe.subscription, subscribe.consumer_name, subscribe.sub_type) == ("sub", "c1", SubType.EXCLUSIVE)


@pytest.mark.asyncio
async def test_receive_timeout_raises_timeout() -> None:
    async with running_broker() as broker, client_for(broker) as client:
        broker.create_topic(TOPIC)
        consumer = await client.subscribe(TOPIC, "sub")
        with pytest.raises(Timeout) as info:
            await consumer.receive(timeout=0.05)
        assert info.value.retriable is True


@pytest.mark.asyncio
async def test_receives_that_time_out_or_are_cancelled_leave_no_waiter_behind() -> None:
    """A consumer polled with short timeouts, or whose receive is cancelled, keeps no
    takers queued (the queue of waiters is bounded by the receives in progress), and a
    message after them still reaches the next receive."""
    async with running_broker() as broker, client_for(broker) as client:
        broker.create_topic(TOPIC)
        consumer = await client.subscribe(TOPIC, "sub")
        for _ in range(20):
            with pytest.raises(Timeout):
                await consumer.batch_receive(timeout=0.001)
        task = asyncio.get_running_loop().create_task(consumer.receive())
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert consumer._inbox._waiters == []
        producer = await client.create_producer(TOPIC)
        await producer.send(b"after")
        assert (await consumer.receive(timeout=5)).payload == b"after"


@pytest.mark.asyncio
async def test_subscribe_to_missing_topic_asks_to_create_it_and_is_not_found_if_refused() -> None:
    """A missing topic: GetPartitions, NOT_FOUND, then GetPartitions(create,
    for_subscription) (only creating needs Produce); the broker's NOT_FOUND to that (auto
    topic creation off) is the caller's, and no Subscribe is sent."""
    async with running_broker() as broker, client_for(broker) as client:
        broker.fail_next(GetPartitions, ErrorCode.NOT_FOUND, "auto topic creation is off", times=2)
        with pytest.raises(NotFound, match="auto topic creation is off"):
            await client.subscribe("/default/missing", "sub")
        assert [(m.create, m.for_subscription) for m in broker.of(GetPartitions)] == [(False, False), (True, True)]
        assert broker.of(Subscribe) == []


@pytest.mark.asyncio
async def test_permits_never_exceed_the_receiver_queue() -> None:
    """receiver_queue_size=10 over a backlog of 100: the first Flow grants 10; permits
    come back in halves as the application takes messages; the broker never holds
    more permits than the queue has room for (granted <= 10 + taken)."""
    async with running_broker() as broker, client_for(broker) as client:
        broker.create_topic(TOPIC)
        await broker.publish(TOPIC, [b"m%d" % i for i in range(100)])
        consumer = await client.subscribe(TOPIC, "sub", initial_position="earliest", receiver_queue_size=10)
        assert broker.of(Subscribe)[0].initial_position == InitialPosition.EARLIEST
        fake = only_consumer(broker)
        await eventually(lambda: fake.delivered_total == 10, what="first window delivered")
        assert [m.permits for m in broker.of(Flow)] == [10]
        await asyncio.sleep(0.02)
        assert fake.delivered_total == 10  # nothing beyond the window
        payloads = []
        for taken in range(1, 101):
            payloads.append((await consumer.receive(timeout=2)).payload)
            assert fake.granted_total <= 10 + taken
            assert fake.delivered_total <= fake.granted_total
            assert len(consumer._inbox) <= 10
        assert payloads == [b"m%d" % i for i in range(100)]
        assert fake.max_outstanding <= 10
        # Given back at least half a window at a time (more if receives outran the Flow task).
        assert all(5 <= m.permits <= 10 for m in broker.of(Flow)[1:])


def test_split_window_gives_every_partition_a_share() -> None:
    assert split_window(10, 3) == [4, 3, 3]
    assert split_window(2, 3) == [1, 1, 1]
    assert split_window(1000, 1) == [1000]


@pytest.mark.asyncio
async def test_acks_are_batched() -> None:
    """50 acks made one after the other reach the broker as one Ack of 50 offsets."""
    async with running_broker() as broker, client_for(broker) as client:
        broker.create_topic(TOPIC)
        consumer = await client.subscribe(TOPIC, "sub")
        await broker.publish(TOPIC, [b"x"] * 50)
        for _ in range(50):
            await consumer.ack(await consumer.receive(timeout=2))
        await eventually(lambda: sum(len(o) for _, o in broker.acks) == 50, what="acks")
        assert len(broker.of(Ack)) == 1
        assert broker.acks[0] == (only_consumer(broker).consumer_id, list(range(50)))


@pytest.mark.asyncio
async def test_full_ack_batches_go_at_once_and_close_sends_the_rest() -> None:
    """With ack_batch_max=10 and a long delay, every 10th ack sends a batch; close()
    sends the 5 left."""
    async with running_broker() as broker, client_for(broker) as client:
        broker.create_topic(TOPIC)
        consumer = await client.subscribe(TOPIC, "sub", ack_batch_max=10, ack_delay_ms=10_000)
        await broker.publish(TOPIC, [b"x"] * 25)
        for _ in range(25):
            await consumer.ack(await consumer.receive(timeout=2))
        await eventually(lambda: len(broker.acks) == 2, what="two full batches")
        assert [len(o) for _, o in broker.acks] == [10, 10]
        await consumer.close()
        assert [len(o) for _, o in broker.acks] == [10, 10, 5]
        assert sorted(o for _, offsets in broker.acks for o in offsets) == list(range(25))


@pytest.mark.asyncio
async def test_nack_asks_for_redelivery_with_delay() -> None:
    async with running_broker() as broker, client_for(broker) as client:
        broker.create_topic(TOPIC)
        consumer = await client.subscribe(TOPIC, "sub")
        await broker.publish(TOPIC, [b"bad"])
        msg = await consumer.receive(timeout=2)
        await consumer.nack(msg, delay_ms=250)
        assert broker.nacks == [(only_consumer(broker).consumer_id, [0], 250)]
        assert broker.of(Nack)[0].delay_ms == 250
        with pytest.raises(InvalidArgument):
            await consumer.ack(MessageId("/default/elsewhere", 0, 1))


@pytest.mark.asyncio
async def test_async_for_ends_when_the_consumer_is_closed() -> None:
    async with running_broker() as broker, client_for(broker) as client:
        broker.create_topic(TOPIC)
        consumer = await client.subscribe(TOPIC, "sub")
        await broker.publish(TOPIC, [b"a", b"b"])
        seen = []

        async def drain() -> None:
            async for msg in consumer:
                seen.append(msg.payload)

        task = asyncio.create_task(drain())
        await eventually(lambda: len(seen) == 2, what="two messages")
        await consumer.close()
        await asyncio.wait_for(task, 1)
        assert seen == [b"a", b"b"]
        with pytest.raises(AlreadyClosed):
            await consumer.receive()


@pytest.mark.asyncio
async def test_unsubscribe_deletes_the_subscription() -> None:
    async with running_broker() as broker, client_for(broker) as client:
        broker.create_topic(TOPIC)
        consumer = await client.subscribe(TOPIC, "sub")
        consumer_id = only_consumer(broker).consumer_id
        await consumer.unsubscribe()
        assert [m.consumer_id for m in broker.of(Unsubscribe)] == [consumer_id]
        assert broker.consumers == {}


@pytest.mark.asyncio
async def test_consumer_closed_push_resubscribes_and_regrants_permits() -> None:
    """After ConsumerClosed with reattach (an actor restart) the client subscribes again
    with the same name and subscription, grants permits again, and keeps receiving."""
    async with running_broker() as broker, client_for(broker) as client:
        broker.create_topic(TOPIC)
        consumer = await client.subscribe(TOPIC, "sub", consumer_name="c", receiver_queue_size=8)
        old_id = only_consumer(broker).consumer_id
        await broker.close_consumer(old_id)
        await eventually(lambda: len(broker.consumers) == 1, what="re-subscribed")
        new = only_consumer(broker)
        assert new.consumer_id != old_id and (new.name, new.subscription) == ("c", "sub")
        await eventually(lambda: new.granted_total == 8, what="permits re-granted")
        await broker.publish(TOPIC, [b"again"])
        assert (await consumer.receive(timeout=2)).payload == b"again"


@pytest.mark.asyncio
async def test_consumer_closed_for_good_is_raised_by_receive() -> None:
    """ConsumerClosed without reattach (deleted, taken over): no re-subscribe; receive
    raises FailedPrecondition with the broker's reason."""
    async with running_broker() as broker, client_for(broker) as client:
        broker.create_topic(TOPIC)
        consumer = await client.subscribe(TOPIC, "sub")
        await broker.close_consumer(only_consumer(broker).consumer_id, "subscription deleted", reattach=False)
        with pytest.raises(FailedPrecondition, match="subscription deleted"):
            await consumer.receive(timeout=2)
        assert not broker.consumers


@pytest.mark.asyncio
async def test_resubscribe_failure_is_raised_by_receive() -> None:
    """If re-subscribing fails with a non-retriable error, receive raises it."""
    async with running_broker() as broker, client_for(broker) as client:
        broker.create_topic(TOPIC)
        consumer = await client.subscribe(TOPIC, "sub")
        broker.fail_next(Subscribe, ErrorCode.NOT_FOUND, "topic deleted")
        await broker.close_consumer(only_consumer(broker).consumer_id, "topic deleted")
        with pytest.raises(NotFound, match="topic deleted"):
            await consumer.receive(timeout=2)


@pytest.mark.asyncio
async def test_partitioned_consumer_reads_every_partition_and_acks_each() -> None:
    """One broker-side consumer per partition; the receive queue is shared and split
    into windows; acks go to the consumer of the message's partition."""
    async with running_broker() as broker, client_for(broker) as client:
        parts = broker.create_topic(TOPIC, partitions=3)
        consumer = await client.subscribe(TOPIC, "sub", receiver_queue_size=9)
        assert consumer.partitions == parts
        assert sorted(m.topic for m in broker.of(Subscribe)) == parts
        await eventually(lambda: len(broker.of(Flow)) == 3, what="three Flows")  # Flow has no reply
        assert sorted(m.permits for m in broker.of(Flow)) == [3, 3, 3]
        for part in parts:
            await broker.publish(part, [part.encode()])
        received = [await consumer.receive(timeout=2) for _ in range(3)]
        assert sorted(m.topic for m in received) == parts
        for msg in received:
            await consumer.ack(msg)
        await consumer.flush_acks()
        by_id = {c.consumer_id: c.topic for c in broker.consumers.values()}
        assert sorted(by_id[cid] for cid, _ in broker.acks) == parts


@pytest.mark.asyncio
async def test_broker_restart_resubscribes_with_same_name() -> None:
    """After a broker restart the consumer re-handshakes, subscribes again under the
    same name and subscription, re-grants its permits and receives new messages."""
    async with running_broker() as broker, client_for(broker) as client:
        producer = await client.create_producer(TOPIC)
        consumer = await client.subscribe(TOPIC, "sub", consumer_name="c", sub_type=SubType.FAILOVER,
                                          receiver_queue_size=4)
        await producer.send(b"one")
        assert (await consumer.receive(timeout=2)).payload == b"one"
        await broker.restart()
        await eventually(lambda: len(broker.consumers) == 1 and len(broker.producers) == 1, what="re-attached")
        fake = only_consumer(broker)
        assert (fake.name, fake.subscription, fake.sub_type) == ("c", "sub", SubType.FAILOVER)
        await eventually(lambda: fake.granted_total == 4, what="permits re-granted")
        assert len(broker.of(Connect)) == 2
        await producer.send(b"two")
        assert (await consumer.receive(timeout=2)).payload == b"two"


@pytest.mark.asyncio
async def test_batch_receive_takes_what_is_queued_in_order_and_acks_a_list() -> None:
    """Two deliveries of 30 queue up; batch_receive(max 40) gives the first 40 in order,
    the next call the 20 left; ack(list) acknowledges all of them in one Ack, and the
    queue grants the permits back."""
    async with running_broker() as broker, client_for(broker) as client:
        broker.create_topic(TOPIC)
        consumer = await client.subscribe(TOPIC, "sub", receiver_queue_size=100)
        await broker.publish(TOPIC, [b"a%d" % i for i in range(30)])
        await broker.publish(TOPIC, [b"b%d" % i for i in range(30)])
        await eventually(lambda: len(consumer._inbox) == 60, what="60 queued")
        first = await consumer.batch_receive(40, timeout=2)
        rest = await consumer.batch_receive(timeout=2)
        assert [m.payload for m in first + rest] == [b"a%d" % i for i in range(30)] + [b"b%d" % i for i in range(30)]
        assert [m.offset for m in first + rest] == list(range(60))
        assert len(first) == 40 and len(rest) == 20 and len(consumer._inbox) == 0
        await consumer.ack(first + rest)
        await consumer.flush_acks()
        assert broker.acks == [(only_consumer(broker).consumer_id, list(range(60)))]
        with pytest.raises(Timeout):
            await consumer.batch_receive(timeout=0.05)
        with pytest.raises(InvalidArgument):
            await consumer.batch_receive(0)
        with pytest.raises(InvalidArgument):
            await consumer.ack("not a message")


@pytest.mark.asyncio
async def test_a_cancelled_batch_receive_loses_nothing() -> None:
    """A batch_receive cancelled while it waits takes nothing: the next message still
    reaches the next receive."""
    async with running_broker() as broker, client_for(broker) as client:
        broker.create_topic(TOPIC)
        consumer = await client.subscribe(TOPIC, "sub")
        waiting = asyncio.get_running_loop().create_task(consumer.batch_receive())
        await asyncio.sleep(0.05)
        waiting.cancel()
        await broker.publish(TOPIC, [b"kept"])
        assert (await consumer.receive(timeout=2)).payload == b"kept"


def test_messages_compare_by_identity_not_by_attached_schema() -> None:
    msg = Message(b"x", TOPIC, 3, 7, 1_700_000_000_000, "p")
    assert msg.message_id == MessageId(TOPIC, 3, 7)
    assert msg == msg._replace(schema_error="not fetched") and hash(msg) == hash(msg._replace(schema_error="e"))
    assert msg != msg._replace(offset=4)
    assert dict(msg.attributes) == {} and "reader_schema" not in repr(msg)

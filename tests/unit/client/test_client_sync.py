"""The blocking facade: the same calls as the asyncio client, run on the client's
background loop. The fake broker runs on a loop of its own in another thread."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Iterator

import pytest

from danube_zmq import MessageId, SyncClient
from danube_zmq.client.errors import AlreadyClosed, ProducerQueueFull
from danube_zmq.transport.client_protocol import Send
from danube_zmq.transport.errors import Timeout
from tests.unit.client.test_client_fake_broker import FakeBroker

TOPIC = "/default/sync"


@pytest.fixture
def broker() -> Iterator[FakeBroker]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    fake = FakeBroker()
    asyncio.run_coroutine_threadsafe(fake.start(), loop).result(5)
    fake.loop = loop  # type: ignore[attr-defined]
    try:
        yield fake
    finally:
        asyncio.run_coroutine_threadsafe(fake.stop(), loop).result(5)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.close()


def test_sync_round_trip(broker: FakeBroker) -> None:
    """Produce, receive, ack and close with plain blocking calls."""
    with SyncClient(broker.url, request_timeout_ms=2_000) as client:
        producer = client.create_producer(TOPIC, name="sp")
        consumer = client.subscribe(TOPIC, "sub", initial_position="earliest")
        mid = producer.send(b"hello", key="k")
        assert isinstance(mid, MessageId) and mid.offset == 0
        msg = consumer.receive(timeout=2)
        assert (msg.payload, msg.key, msg.message_id) == (b"hello", "k", mid)
        consumer.ack(msg)
        with pytest.raises(Timeout):
            consumer.receive(timeout=0.05)
        consumer.close()
        producer.close()
        with pytest.raises(AlreadyClosed):
            consumer.receive(timeout=0.05)


def test_sync_send_nowait_returns_concurrent_future(broker: FakeBroker) -> None:
    """Futures from another thread; with the receipts held at the broker, the third
    send finds pending_messages_max (2) taken."""
    broker.hold(Send)
    with SyncClient(broker.url, request_timeout_ms=2_000) as client:
        producer = client.create_producer(TOPIC, pending_messages_max=2, batch_delay_ms=200)
        futures = [producer.send_nowait(b"a"), producer.send_nowait(b"b")]
        assert all(isinstance(f, concurrent.futures.Future) for f in futures)
        with pytest.raises(ProducerQueueFull):
            producer.send_nowait(b"c")
        asyncio.run_coroutine_threadsafe(broker.release(Send), broker.loop).result(5)  # type: ignore[attr-defined]
        producer.flush()
        assert [f.result(2).offset for f in futures] == [0, 1]
        # The first leaves at once (nothing in flight); the second joins it or follows.
        assert len([m for m in broker.received if isinstance(m, Send)]) in (1, 2)


def test_sync_sends_carry_a_given_publish_time(broker: FakeBroker) -> None:
    """A publish time stamped elsewhere travels as given, blocking or queued."""
    with SyncClient(broker.url, request_timeout_ms=2_000) as client:
        producer = client.create_producer(TOPIC, name="stamped")
        producer.send(b"a", publish_time=1_700_000_000_000)
        producer.send_nowait(b"b", publish_time=1_700_000_000_001).result(2)
        consumer = client.subscribe(TOPIC, "sub", initial_position="earliest")
        assert [consumer.receive(timeout=2).publish_time for _ in range(2)] == [1_700_000_000_000, 1_700_000_000_001]


def test_sync_iteration_stops_on_close(broker: FakeBroker) -> None:
    """`for msg in consumer` ends when another thread closes the consumer."""
    with SyncClient(broker.url, request_timeout_ms=2_000) as client:
        producer = client.create_producer(TOPIC)
        consumer = client.subscribe(TOPIC, "sub")
        for i in range(3):
            producer.send(b"%d" % i)
        seen: list[bytes] = []
        closer = threading.Thread(target=consumer.close)
        for msg in consumer:
            seen.append(msg.payload)
            if len(seen) == 3:
                closer.start()
        closer.join(2)
        assert seen == [b"0", b"1", b"2"]


def test_close_releases_threads_blocked_in_receive(broker: FakeBroker) -> None:
    """Closing the client wakes a thread blocked in receive() with AlreadyClosed."""
    client = SyncClient(broker.url, request_timeout_ms=2_000)
    client.create_producer(TOPIC)
    consumer = client.subscribe(TOPIC, "sub")
    outcome: list[BaseException] = []

    def wait() -> None:
        try:
            consumer.receive()
        except BaseException as exc:
            outcome.append(exc)

    waiter = threading.Thread(target=wait)
    waiter.start()
    client.close()
    waiter.join(2)
    assert len(outcome) == 1 and isinstance(outcome[0], AlreadyClosed)

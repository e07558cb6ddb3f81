"""The producer against the fake broker: batching, receipts, backpressure, limits,
partition routing, errors and recovery after a broker restart."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from danube_zmq.client import BatchReceipt, DanubeClient, DispatchStrategy, MessageId, PendingSend, Producer, ProducerQueueFull
from danube_zmq.client.errors import AlreadyClosed
from danube_zmq.client.routing import RoundRobin, fnv1a_64, partition_for_key
from danube_zmq.transport.client_protocol import (
    CLIENT_PROTOCOL,
    CloseProducer,
    CreateProducer,
    GetPartitions,
    Send,
    SendReceipt,
)
from danube_zmq.transport.common import Connect, Error
from danube_zmq.transport.errors import (
    ErrorCode,
    FailedPrecondition,
    InvalidArgument,
    ResourceExhausted,
)
from tests.unit.client.test_client_fake_broker import FakeBroker, client_for, eventually, running_broker

TOPIC = "/default/orders"


@pytest.mark.asyncio
async def test_many_send_nowait_become_few_send_frames() -> None:
    """500 messages queued at once go out in one Send (batch_messages_max 1000), and each
    future gets the MessageId of its own message: (topic, offset, producer_id)."""
    async with running_broker() as broker, client_for(broker) as client:
        producer = await client.create_producer(TOPIC, name="p")
        futures = [producer.send_nowait(f"m{i}".encode()) for i in range(500)]
        ids = await asyncio.gather(*futures)
        sends = broker.of(Send)
        assert len(sends) == 1
        assert len(sends[0].payloads) == 500
        producer_id = broker.of(Send)[0].producer_id
        assert ids == [MessageId(TOPIC, i, producer_id) for i in range(500)]
        assert [e.payload for e in broker.logs[TOPIC]] == [f"m{i}".encode() for i in range(500)]


@pytest.mark.asyncio
async def test_batches_are_cut_at_batch_messages_max() -> None:
    """250 messages with batch_messages_max=100 go as 100, 100 and 50, in order."""
    async with running_broker() as broker, client_for(broker) as client:
        producer = await client.create_producer(TOPIC, batch_messages_max=100)
        ids = await asyncio.gather(*(producer.send_nowait(b"x%d" % i) for i in range(250)))
        assert [len(s.payloads) for s in broker.of(Send)] == [100, 100, 50]
        assert [m.offset for m in ids] == list(range(250))


@pytest.mark.asyncio
async def test_batches_are_cut_at_batch_bytes_max() -> None:
    """Batches stay under batch_bytes_max: 1000-byte payloads, 4 KiB batches -> 4 a batch."""
    async with running_broker() as broker, client_for(broker) as client:
        producer = await client.create_producer(TOPIC, batch_bytes_max=4096)
        await asyncio.gather(*(producer.send_nowait(b"x" * 1000) for _ in range(10)))
        assert [len(s.payloads) for s in broker.of(Send)] == [4, 4, 2]


@pytest.mark.asyncio
async def test_batches_fit_the_brokers_frame_bytes_max() -> None:
    """A broker with a 10 kB frame limit never gets a bigger Send frame, whatever
    batch_bytes_max says."""
    async with running_broker(frame_bytes_max=10_000, message_bytes_max=5_000) as broker, client_for(broker) as client:
        producer = await client.create_producer(TOPIC)
        await asyncio.gather(
            *(producer.send_nowait(b"y" * 3000, key="k", attributes={"a": "b"}) for _ in range(20))
        )
        sends = broker.of(Send)
        assert sum(len(s.payloads) for s in sends) == 20
        assert len(sends) > 1
        assert max(len(CLIENT_PROTOCOL.encode(s)) for s in sends) <= 10_000


@pytest.mark.asyncio
async def test_a_lone_message_leaves_at_once_and_the_next_waits_for_the_pipe() -> None:
    """Nothing in flight: a message leaves on the loop's next turn, whatever
    batch_delay_ms. While that batch is in flight the next one fills, and leaves when
    the pipe drains, here long before its one-minute delay."""
    async with running_broker() as broker, client_for(broker) as client:
        producer = await client.create_producer(TOPIC, batch_delay_ms=60_000)
        broker.hold(Send)
        first = producer.send_nowait(b"first")
        await eventually(lambda: len(broker.held) == 1, what="the first batch sent at once")
        second = [producer.send_nowait(b"second-%d" % i) for i in range(3)]
        await broker.release(Send)
        assert (await asyncio.wait_for(first, 2)).offset == 0
        assert [m.offset for m in await asyncio.wait_for(asyncio.gather(*second), 2)] == [1, 2, 3]
        assert [len(s.payloads) for s in broker.of(Send)] == [1, 3]


@pytest.mark.asyncio
async def test_batch_delay_bounds_the_wait_while_a_batch_is_in_flight() -> None:
    async with running_broker() as broker, client_for(broker) as client:
        producer = await client.create_producer(TOPIC, batch_delay_ms=20)
        broker.hold(Send)
        producer.send_nowait(b"first")
        await eventually(lambda: len(broker.held) == 1, what="the first batch sent at once")
        producer.send_nowait(b"second")
        await eventually(lambda: len(broker.held) == 2, what="the second batch sent after its delay")
        await broker.release(Send)
        await producer.flush(timeout=2)


@pytest.mark.asyncio
async def test_with_a_full_window_an_overdue_batch_waits_as_one_not_as_many() -> None:
    """One batch in flight (`inflight_batches_max=1`), batch_delay_ms=0, a message per turn
    of the loop: one batch waits for the window and the rest keep filling the open
    batch, which goes when the waiting one does. (Cutting at every delay queued a
    one-message batch per turn behind the window: a reliable producer fell seconds
    behind at 5,000 msg/s.)"""
    async with running_broker() as broker, client_for(broker) as client:
        producer = await client.create_producer(TOPIC, batch_delay_ms=0, inflight_batches_max=1)
        broker.hold(Send)
        handles = [producer.send_nowait(b"first")]
        await eventually(lambda: len(broker.held) == 1, what="the first batch sent at once")
        for i in range(20):
            handles.append(producer.send_nowait(b"m%d" % i))
            await asyncio.sleep(0.001)
        await broker.release(Send)
        assert [m.offset for m in await asyncio.wait_for(asyncio.gather(*handles), 5)] == list(range(21))
        sizes = [len(s.payloads) for s in broker.of(Send)]
        assert sum(sizes) == 21 and len(sizes) <= 3, sizes


@pytest.mark.asyncio
async def test_batching_disabled_sends_each_message_alone() -> None:
    async with running_broker() as broker, client_for(broker) as client:
        producer = await client.create_producer(TOPIC, batching=False)
        await asyncio.gather(*(producer.send_nowait(b"z") for _ in range(5)))
        assert [len(s.payloads) for s in broker.of(Send)] == [1] * 5


@pytest.mark.asyncio
async def test_message_over_message_bytes_max_fails_locally() -> None:
    """A payload over the broker's message_bytes_max is InvalidArgument before sending."""
    async with running_broker(message_bytes_max=1000) as broker, client_for(broker) as client:
        producer = await client.create_producer(TOPIC)
        with pytest.raises(InvalidArgument, match="message_bytes_max"):
            await producer.send(b"x" * 1001)
        with pytest.raises(InvalidArgument):
            producer.send_nowait(b"x" * 1001)
        await producer.send(b"x" * 1000)
        assert [len(s.payloads) for s in broker.of(Send)] == [1]


@pytest.mark.asyncio
async def test_payload_types() -> None:
    """str payloads are sent as UTF-8; other types are InvalidArgument, not TypeError."""
    async with running_broker() as broker, client_for(broker) as client:
        producer = await client.create_producer(TOPIC)
        await producer.send("héllo")
        await producer.send(bytearray(b"ba"))
        assert [e.payload for e in broker.logs[TOPIC]] == ["héllo".encode(), b"ba"]
        with pytest.raises(InvalidArgument):
            await producer.send(42)  # type: ignore[arg-type]
        with pytest.raises(InvalidArgument):
            await producer.send(b"x", attributes={"a": 1})  # type: ignore[dict-item]
        with pytest.raises(InvalidArgument):
            await producer.send(b"x", key=5)  # type: ignore[arg-type]


@pytest.mark.asyncio
async def test_send_nowait_raises_producer_queue_full() -> None:
    """With pending_messages_max messages awaiting receipts, send_nowait raises
    ProducerQueueFull, a retriable ResourceExhausted; once receipts come, there is room."""
    async with running_broker() as broker, client_for(broker) as client:
        producer = await client.create_producer(TOPIC, pending_messages_max=3)
        broker.hold(Send)
        futures = [producer.send_nowait(b"a") for _ in range(3)]
        with pytest.raises(ProducerQueueFull) as info:
            producer.send_nowait(b"b")
        assert isinstance(info.value, ResourceExhausted)
        assert info.value.retriable is True
        await eventually(lambda: broker.held, what="held Send")
        await broker.release(Send)
        assert [m.offset for m in await asyncio.gather(*futures)] == [0, 1, 2]
        assert producer.statistics().pending_messages == 0
        await producer.send(b"c")


@pytest.mark.asyncio
async def test_send_waits_for_room() -> None:
    """`send` blocks while pending_messages_max messages are pending, then goes on."""
    async with running_broker() as broker, client_for(broker) as client:
        producer = await client.create_producer(TOPIC, pending_messages_max=2)
        broker.hold(Send)
        tasks = [asyncio.create_task(producer.send(b"m%d" % i)) for i in range(3)]
        await eventually(lambda: broker.held, what="held Send")
        await asyncio.sleep(0.05)
        assert producer.statistics().pending_messages == 2
        assert sum(len(m.payloads) for _, m in broker.held) == 2
        assert not any(t.done() for t in tasks)
        await broker.release(Send)
        ids = await asyncio.gather(*tasks)
        assert sorted(m.offset for m in ids) == [0, 1, 2]


@pytest.mark.asyncio
async def test_failed_batch_fails_every_future() -> None:
    """A non-retriable error on a Send fails every message of the batch with that class,
    and is not retried."""
    async with running_broker() as broker, client_for(broker) as client:
        producer = await client.create_producer(TOPIC)
        broker.fail_next(Send, ErrorCode.FAILED_PRECONDITION, "topic is sealed")
        futures = [producer.send_nowait(b"x") for _ in range(5)]
        results = await asyncio.gather(*futures, return_exceptions=True)
        assert all(isinstance(r, FailedPrecondition) for r in results)
        assert all(str(r) == "topic is sealed" and r.retriable is False for r in results)
        assert len(broker.of(Send)) == 1
        assert producer.statistics().messages_failed == 5


@pytest.mark.asyncio
async def test_retriable_send_error_is_retried() -> None:
    """RESOURCE_EXHAUSTED twice, then success: the batch is sent three times and the
    messages succeed."""
    async with running_broker() as broker, client_for(broker) as client:
        producer = await client.create_producer(TOPIC)
        broker.fail_next(Send, ErrorCode.RESOURCE_EXHAUSTED, "slow down", times=2)
        mid = await producer.send(b"x")
        assert mid.offset == 0
        assert len(broker.of(Send)) == 3
        assert producer.statistics().send_retries == 2


@pytest.mark.asyncio
async def test_retriable_send_error_gives_up_after_operation_retries_max() -> None:
    async with running_broker() as broker, client_for(broker, operation_retries_max=1) as client:
        producer = await client.create_producer(TOPIC)
        broker.fail_next(Send, ErrorCode.RESOURCE_EXHAUSTED, "slow down", times=5)
        with pytest.raises(ResourceExhausted, match="slow down"):
            await producer.send(b"x")
        assert len(broker.of(Send)) == 2


@pytest.mark.asyncio
async def test_a_refused_batch_is_sent_again_before_the_batches_in_flight_behind_it() -> None:
    """Four batches in flight; the first is refused (the broker then refuses the later
    ones until it comes again): every batch is sent again in order, and the log holds
    the messages in the order they were sent."""
    async with running_broker() as broker, client_for(broker) as client:
        producer = await client.create_producer(TOPIC, batch_messages_max=2, inflight_batches_max=4)
        await producer.send(b"warm")  # the producer is attached and its sequence known
        broker.hold(Send)
        futures = [producer.send_nowait(f"m{i}".encode()) for i in range(8)]
        await eventually(lambda: len(broker.held) == 4, what="four batches in flight")
        broker.fail_next(Send, ErrorCode.UNAVAILABLE, "topic moving")
        await broker.release(Send)
        ids = await asyncio.gather(*futures)
        assert [e.payload for e in broker.logs[TOPIC]] == [b"warm"] + [f"m{i}".encode() for i in range(8)]
        assert [i.offset for i in ids] == list(range(1, 9))
        sequences = [m.sequence for m in broker.of(Send)]
        assert sequences[:5] == [0, 1, 2, 3, 4] and sorted(sequences[5:]) == sequences[5:], sequences


@pytest.mark.asyncio
async def test_after_giving_up_on_a_refused_batch_the_next_batches_are_accepted() -> None:
    """Without retries a refused batch fails; the producer re-attaches, so the broker no
    longer waits for it and the next batch is stored."""
    async with running_broker() as broker, client_for(broker, operation_retries_max=0) as client:
        producer = await client.create_producer(TOPIC)
        await producer.send(b"first")
        broker.fail_next(Send, ErrorCode.RESOURCE_EXHAUSTED, "disk full")
        with pytest.raises(ResourceExhausted, match="disk full"):
            await producer.send(b"refused")
        assert (await producer.send(b"next")).offset == 1
        assert [e.payload for e in broker.logs[TOPIC]] == [b"first", b"next"]
        assert len(broker.of(CreateProducer)) == 2


@pytest.mark.asyncio
async def test_keys_and_attributes_are_columns() -> None:
    """keys/attributes are None in a batch where no message has one, else one entry each."""
    async with running_broker() as broker, client_for(broker) as client:
        producer = await client.create_producer(TOPIC)
        await asyncio.gather(producer.send_nowait(b"a"), producer.send_nowait(b"b"))
        await asyncio.gather(
            producer.send_nowait(b"c", key="k1"),
            producer.send_nowait(b"d", attributes={"x": "y"}),
            producer.send_nowait(b"e"),
        )
        first, second = broker.of(Send)
        assert first.keys is None and first.attributes is None
        assert second.keys == ["k1", None, None]
        assert second.attributes == [None, {"x": "y"}, None]
        assert len(second.publish_times) == 3


@pytest.mark.asyncio
async def test_send_callback_gets_error_or_id() -> None:
    async with running_broker() as broker, client_for(broker) as client:
        producer = await client.create_producer(TOPIC)
        seen: list[tuple[object, object]] = []
        await producer.send_nowait(b"a", callback=lambda err, mid: seen.append((err, mid)))
        broker.fail_next(Send, ErrorCode.PERMISSION_DENIED, "no")
        with pytest.raises(Exception, match="no"):
            await producer.send_nowait(b"b", callback=lambda err, mid: seen.append((err, mid)))
        await asyncio.sleep(0)
        assert seen[0] == (None, MessageId(TOPIC, 0, broker.of(Send)[0].producer_id))
        assert seen[1][1] is None and type(seen[1][0]).__name__ == "PermissionDenied"


@pytest.mark.asyncio
async def test_on_batch_is_told_once_per_batch_before_the_messages() -> None:
    """`on_batch` gets one BatchReceipt per batch (offsets and count, or the error and
    count), before the messages' own callbacks run."""
    async with running_broker() as broker, client_for(broker) as client:
        order: list[str] = []
        receipts: list[BatchReceipt] = []

        def on_batch(receipt: BatchReceipt) -> None:
            receipts.append(receipt)
            order.append("batch")

        producer = await client.create_producer(TOPIC, on_batch=on_batch)
        handles = [producer.send_nowait(b"m", callback=lambda err, mid: order.append("message")) for _ in range(3)]
        await asyncio.gather(*handles)
        producer_id = broker.of(Send)[0].producer_id
        assert receipts == [BatchReceipt(TOPIC, producer_id, [0, 1, 2], 3, None)]
        assert order == ["batch", "message", "message", "message"]

        broker.fail_next(Send, ErrorCode.PERMISSION_DENIED, "no")
        failed = [producer.send_nowait(b"n") for _ in range(2)]
        await asyncio.gather(*failed, return_exceptions=True)
        assert len(receipts) == 2
        assert receipts[1].count == 2 and receipts[1].offsets == []
        assert type(receipts[1].error).__name__ == "PermissionDenied"


def test_pending_send_is_a_cheap_pair_that_acts_like_a_future() -> None:
    """No future until someone waits: a batch nobody awaits never makes one; one made
    for an awaiter resolves at the receipt, and one asked for after it is resolved."""
    from danube_zmq.client.producer import PendingSend, _Batch, _new

    async def run() -> None:
        batch = _Batch(TOPIC, None)
        batch.payloads.append(b"x")
        handle = _new(PendingSend, (batch, 0))
        assert not handle.done()
        batch.finish([7], 3, None)
        assert batch._waiter is None
        assert handle.done() and handle.result() == MessageId(TOPIC, 7, 3) and handle.exception() is None
        assert await handle == MessageId(TOPIC, 7, 3)

        waited = _Batch(TOPIC, None)
        waited.payloads.append(b"y")
        pending = asyncio.ensure_future(_awaited(_new(PendingSend, (waited, 0))))
        await asyncio.sleep(0)
        assert waited._waiter is not None and not pending.done()
        waited.finish([8], 3, None)
        assert await pending == MessageId(TOPIC, 8, 3)
    asyncio.run(run())


async def _awaited(handle: object) -> object:
    return await handle  # type: ignore[misc]


def test_fnv1a_64_known_vectors() -> None:
    """FNV-1a 64 as published (and as Danube's Rust client computes it)."""
    assert fnv1a_64(b"") == 0xCBF29CE484222325
    assert fnv1a_64(b"a") == 0xAF63DC4C8601EC8C
    assert fnv1a_64(b"foobar") == 0x85944171F73967E8
    assert partition_for_key("foobar", 7) == 0x85944171F73967E8 % 7


def test_round_robin_cycles_from_start() -> None:
    rr = RoundRobin(3, start=2)
    assert [rr.next() for _ in range(7)] == [2, 0, 1, 2, 0, 1, 2]


@pytest.mark.asyncio
async def test_partitioned_producer_round_robins_without_key() -> None:
    """A 3-partition topic: one broker-side producer per partition named name-i, and
    unkeyed messages visit the partitions in turn."""
    async with running_broker() as broker, client_for(broker) as client:
        producer = await client.create_producer(TOPIC, name="p", partitions=3)
        assert broker.of(GetPartitions)[0].create is True
        assert broker.of(GetPartitions)[0].partitions == 3
        parts = [f"{TOPIC}-part-{i}" for i in range(3)]
        assert producer.partitions == parts
        assert sorted((m.topic, m.producer_name) for m in broker.of(CreateProducer)) == [
            (parts[i], f"p-{i}") for i in range(3)
        ]
        ids = [await producer.send(b"m%d" % i) for i in range(9)]
        order = [parts.index(m.topic) for m in ids]
        assert all((b - a) % 3 == 1 for a, b in itertools.pairwise(order))
        assert [len(broker.logs[p]) for p in parts] == [3, 3, 3]


@pytest.mark.asyncio
async def test_partitioned_producer_routes_keys_by_fnv1a() -> None:
    """A key always lands on partition fnv1a_64(key) % n."""
    async with running_broker() as broker, client_for(broker) as client:
        producer = await client.create_producer(TOPIC, partitions=4)
        keys = [f"user-{i}" for i in range(20)]
        for _ in range(2):
            for key in keys:
                mid = await producer.send(b"v", key=key)
                assert mid.topic == f"{TOPIC}-part-{partition_for_key(key, 4)}"
        assert {e.key for p in producer.partitions for e in broker.logs[p]} == set(keys)


@pytest.mark.asyncio
async def test_dispatch_strategy_and_names() -> None:
    """dispatch takes the enum or its name; the topic is created with it; names default
    to unique generated ones."""
    async with running_broker() as broker, client_for(broker) as client:
        p1 = await client.create_producer(TOPIC, dispatch="reliable")
        p2 = await client.create_producer("/default/other", dispatch=DispatchStrategy.RELIABLE)
        assert [m.dispatch_strategy for m in broker.of(GetPartitions)] == [1, 1]
        assert [m.dispatch_strategy for m in broker.of(CreateProducer)] == [1, 1]
        assert p1.name != p2.name and p1.name.startswith("producer-")
        with pytest.raises(InvalidArgument, match="dispatch"):
            await client.create_producer(TOPIC, dispatch="sometimes")


@pytest.mark.asyncio
async def test_close_flushes_then_detaches() -> None:
    """close() sends what is batched (even with a long batch delay), waits for the
    receipts, sends CloseProducer; sending afterwards raises AlreadyClosed."""
    async with running_broker() as broker, client_for(broker) as client:
        producer = await client.create_producer(TOPIC, batch_delay_ms=10_000)
        futures = [producer.send_nowait(b"q") for _ in range(3)]
        await producer.close()
        assert all(f.done() and f.exception() is None for f in futures)
        assert len(broker.of(CloseProducer)) == 1
        with pytest.raises(AlreadyClosed):
            await producer.send(b"late")
        assert producer not in client._producers


@pytest.mark.asyncio
async def test_broker_restart_recreates_producer_and_retries_in_flight_sends() -> None:
    """Sends in flight when the broker restarts are retried once the client has
    re-handshaken and re-created the producer (same name); they all get receipts."""
    async with running_broker() as broker, client_for(broker) as client:
        producer = await client.create_producer(TOPIC, name="steady")
        first = await producer.send(b"before")
        broker.hold(Send)
        futures = [producer.send_nowait(b"during%d" % i) for i in range(10)]
        await eventually(lambda: broker.held, what="held Send")
        await broker.restart()  # the held Send dies with it, unanswered
        broker.held_types.clear()
        ids = await asyncio.wait_for(asyncio.gather(*futures), 5)
        assert len(broker.of(Connect)) == 2
        assert [m.producer_name for m in broker.of(CreateProducer)] == ["steady", "steady"]
        assert {m.producer_id for m in ids} != {first.producer_id}
        assert [e.payload for e in broker.logs[TOPIC]] == [b"before"] + [b"during%d" % i for i in range(10)]
        assert producer.statistics().reattaches == 1


@pytest.mark.asyncio
async def test_create_producer_follows_redirect() -> None:
    """UNAVAILABLE with a redirect_url: the producer is created on the named broker."""
    async with running_broker() as broker, running_broker() as owner, client_for(broker) as client:
        broker.fail_next(CreateProducer, ErrorCode.UNAVAILABLE, "not the owner", redirect_url=owner.url)
        producer = await client.create_producer(TOPIC)
        await producer.send(b"hi")
        assert [e.payload for e in owner.logs[TOPIC]] == [b"hi"]
        assert owner.of(Send) and not broker.of(Send)
        assert set(client._connections) == {broker.url, owner.url}


@pytest.mark.asyncio
async def test_close_with_the_broker_gone_is_bounded() -> None:
    """With receipts that never come, close() gives up after the request timeout and
    fails what is unsent with AlreadyClosed instead of waiting out every retry."""
    async with running_broker() as broker, client_for(broker, request_timeout_ms=300) as client:
        producer = await client.create_producer(TOPIC)
        broker.hold(Send)
        future = producer.send_nowait(b"stuck")
        await eventually(lambda: broker.held, what="held Send")
        started = asyncio.get_running_loop().time()
        await producer.close()
        assert asyncio.get_running_loop().time() - started < 1.5
        with pytest.raises(AlreadyClosed):
            await future


@pytest.mark.asyncio
async def test_pending_send_acts_like_a_future_of_its_message_id() -> None:
    """Before the receipt: not done, result() raises InvalidStateError. After: the
    MessageId; callbacks run in send order; cancelling one awaiter leaves the batch's
    other messages alone."""
    async with running_broker() as broker, client_for(broker) as client:
        producer = await client.create_producer(TOPIC, batch_delay_ms=50)
        order: list[int] = []
        handles = [producer.send_nowait(b"m%d" % i, callback=lambda e, mid: order.append(mid.offset)) for i in range(5)]
        assert not handles[0].done() and not handles[0].cancelled()
        with pytest.raises(asyncio.InvalidStateError):
            handles[0].result()
        awaiter = asyncio.get_running_loop().create_task(_await(handles[0]))
        await asyncio.sleep(0)
        awaiter.cancel()
        seen: list[object] = []
        handles[4].add_done_callback(seen.append)
        ids = await asyncio.gather(*handles[1:])
        assert [m.offset for m in ids] == [1, 2, 3, 4]
        assert handles[0].result().offset == 0 and handles[0].exception() is None
        assert order == [0, 1, 2, 3, 4] and seen == [handles[4]]


async def _await(handle: object) -> object:
    return await handle  # type: ignore[misc]


@pytest.mark.asyncio
async def test_a_failed_batch_fails_every_pending_send_and_callback() -> None:
    async with running_broker() as broker, client_for(broker) as client:
        producer = await client.create_producer(TOPIC)
        broker.fail_next(Send, ErrorCode.FAILED_PRECONDITION, "refused")
        errors: list[object] = []
        handles = [producer.send_nowait(b"x", callback=lambda e, mid: errors.append(e)) for _ in range(3)]
        await producer.flush()
        for handle in handles:
            assert isinstance(handle.exception(), FailedPrecondition)
            with pytest.raises(FailedPrecondition, match="refused"):
                await handle
        assert [type(e) for e in errors] == [FailedPrecondition] * 3


async def _moved_with_b_in_flight(client: DanubeClient, old: FakeBroker,
                                  new: FakeBroker) -> tuple[Producer, PendingSend, bytes, Send]:
    """Batches a and b in flight on `old`; the topic moves to `new`: a is refused at once
    (and stored on `new` when sent again), b stays unanswered on `old`. Returns the
    producer, b's handle, and what `old.push` needs to answer b."""
    producer = await client.create_producer(TOPIC, batch_messages_max=1, inflight_batches_max=4)
    await producer.send(b"warm")
    old.hold(Send)
    a, b = producer.send_nowait(b"a"), producer.send_nowait(b"b")
    await eventually(lambda: len(old.held) == 2, what="a and b in flight")
    (identity, send_a), (_, send_b) = old.held
    old.held.clear()
    old.fail_next(CreateProducer, ErrorCode.UNAVAILABLE, "not the owner", redirect_url=new.url)
    await old.push(identity, Error(request_id=send_a.request_id, code=ErrorCode.UNAVAILABLE,
                                   message="topic moved before this batch was acknowledged"))
    await a
    return producer, b, identity, send_b


@pytest.mark.asyncio
async def test_a_batch_still_in_flight_on_the_old_owner_is_stored_before_later_batches_on_the_new_one() -> None:
    """The topic moves while batches a and b are in flight on the old owner: a is refused
    at once (moved), b's answer comes late. The producer re-attaches on the new owner and
    sends a again; c, sent meanwhile, must not be stored there before b: c waits for b's
    outcome, and the new owner was told (`CreateProducer.next_sequence`) to expect a.
    (Chaos B5 seed 2: c's batch was stored first.)"""
    async with running_broker() as old, running_broker() as new, client_for(old) as client:
        producer, b, identity, send_b = await _moved_with_b_in_flight(client, old, new)
        c = producer.send_nowait(b"c")
        # b's answer is late: c is not stored before it (the unfixed client stored c here
        # within a backoff or two).
        done, _ = await asyncio.wait({asyncio.ensure_future(c)}, timeout=1.5)
        assert not done, "c was acknowledged while b, sent before it, was still unanswered"
        await old.push(identity, Error(request_id=send_b.request_id, code=ErrorCode.UNAVAILABLE,
                                       message="topic moved before this batch was acknowledged"))
        await asyncio.gather(b, c)
        assert [e.payload for e in new.logs[TOPIC]] == [b"a", b"b", b"c"]
        assert new.of(CreateProducer)[-1].next_sequence is not None


@pytest.mark.asyncio
async def test_a_batch_acknowledged_on_the_old_owner_after_the_move_is_not_waited_for() -> None:
    """a and b are in flight on the old owner; a is refused (moved) and goes again on
    the new owner, which was told to expect a then b; b's receipt then comes from the
    old owner (it was stored there). c, sent next, is not held back by b: the new owner
    refuses it once (it still expects b), the producer re-attaches naming c, and c is
    stored. No batch waits for one that is acknowledged."""
    async with running_broker() as old, running_broker() as new, client_for(old) as client:
        producer, b, identity, send_b = await _moved_with_b_in_flight(client, old, new)
        # b was stored on the old owner (offset 2) before the move: its receipt comes late.
        await old.push(identity, SendReceipt(request_id=send_b.request_id, producer_id=send_b.producer_id,
                                             offsets=[2]))
        assert (await b).offset == 2
        await asyncio.wait_for(producer.send(b"c"), 10)
        assert [e.payload for e in new.logs[TOPIC]] == [b"a", b"c"]
        assert [m.payloads for m in new.of(Send)].count([b"b"]) == 0


@pytest.mark.asyncio
async def test_a_retry_waiting_for_the_new_attachment_still_goes_after_earlier_batches_in_flight() -> None:
    """a, b, c are in flight on the old owner; c is refused first (moved) and its retry
    waits for the new attachment, which is slow to come. a and b, still unanswered on
    the old owner, are put before it when the attachment comes: the new owner sees a, b,
    then c, and never c first."""
    async with running_broker() as old, running_broker() as new, client_for(old) as client:
        producer = await client.create_producer(TOPIC, batch_messages_max=1, inflight_batches_max=4)
        await producer.send(b"warm")
        old.hold(Send)
        a, b, c = (producer.send_nowait(p) for p in (b"a", b"b", b"c"))
        await eventually(lambda: len(old.held) == 3, what="a, b and c in flight")
        (identity, send_a), (_, send_b), (_, send_c) = old.held
        old.held.clear()
        old.fail_next(CreateProducer, ErrorCode.UNAVAILABLE, "not the owner", redirect_url=new.url)
        new.hold(CreateProducer)
        moved = "topic moved before this batch was acknowledged"
        await old.push(identity, Error(request_id=send_c.request_id, code=ErrorCode.UNAVAILABLE, message=moved))
        await eventually(lambda: new.held, what="the attach on the new owner")
        await asyncio.sleep(0.5)  # past c's first backoff (at most 100 ms): c waits for the attachment
        await new.release(CreateProducer)
        for send in (send_a, send_b):
            await old.push(identity, Error(request_id=send.request_id, code=ErrorCode.UNAVAILABLE, message=moved))
        await asyncio.gather(a, b, c)
        assert [m.payloads for m in new.of(Send)] == [[b"a"], [b"b"], [b"c"]]
        assert [e.payload for e in new.logs[TOPIC]] == [b"a", b"b", b"c"]

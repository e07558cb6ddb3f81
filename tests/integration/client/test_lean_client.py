"""The lean client (issue 39) against a real broker: it sends nothing the broker would
only answer and forget, and its sends and reads work without a receive task or a
future per batch."""

from __future__ import annotations

import asyncio

from danube_zmq import DanubeClient


async def test_acks_on_a_non_reliable_topic_are_not_sent(broker) -> None:
    """A non-reliable topic keeps nothing to acknowledge: `ack` checks its argument and
    sends nothing (before, an Ack request and its answer every ack delay). On a
    reliable topic every ack is sent."""
    async with DanubeClient(broker.url) as client:
        for dispatch, sent in (("non_reliable", 0), ("reliable", 20)):
            topic = f"/default/acks-{dispatch}"
            producer = await client.create_producer(topic, dispatch=dispatch)
            consumer = await client.subscribe(topic, "s")
            for i in range(20):
                producer.send_nowait(f"m{i}".encode())
            await producer.flush()
            got = []
            while len(got) < 20:
                got.extend(await consumer.batch_receive(20, timeout=10))
            await consumer.ack(got)
            await consumer.flush_acks()
            stats = consumer.statistics()
            assert (stats.acks_sent, stats.pending_acks, stats.acks_failed) == (sent, 0, 0), dispatch


async def test_many_sends_nobody_awaits_then_one_that_is_awaited(broker) -> None:
    """`send_nowait` batches nobody waits on, then an awaited send: the awaited one
    gets its id, `flush` returns once every receipt is in, and a consumer gets all."""
    async with DanubeClient(broker.url) as client:
        producer = await client.create_producer("/default/lean")
        consumer = await client.subscribe("/default/lean", "s")
        handles = []
        for i in range(500):
            handles.append(producer.send_nowait(f"m{i}".encode()))
            if i % 50 == 0:
                await asyncio.sleep(0)
        last = await producer.send(b"last")
        await producer.flush()
        assert all(h.done() and h.exception() is None for h in handles)
        assert [h.result().offset for h in handles] == list(range(500)) and last.offset == 500
        got = []
        while len(got) < 501:
            got.extend(await consumer.batch_receive(501, timeout=10))
        assert [m.payload for m in got][-1] == b"last" and len(got) == 501

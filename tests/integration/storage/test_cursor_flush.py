"""Cursors of reliable subscriptions across broker stops, against real broker processes:
the broker's cursor flusher (`actors/broker/cursor_flusher.py`) writes them on its timer, and a
clean stop writes the last ones the topics told it as they stopped."""

from __future__ import annotations

import asyncio

import pytest

from danube_zmq import DanubeClient, SubType
from danube_zmq.transport.errors import Timeout
from tests.integration.actors.test_subscriptions import drain
from tests.integration.storage.test_reliable import describe_subscription

# The longest flush interval the config takes: no timer flush while a test runs.
NO_TIMER_FLUSH = {"DANUBE_STORAGE__CURSOR_FLUSH_INTERVAL_MS": "60000"}


async def test_a_clean_stop_writes_the_cursors_no_timer_flush_reached(broker_factory) -> None:
    """With the flush timer a minute away, five of ten messages are acknowledged (the
    subscription's cursor is at 4 on the broker) and the broker is stopped cleanly
    (SIGTERM) right away: the topics stop first and tell the flusher their final
    cursors, the flusher stops after them and writes those. After a restart the
    subscription resumes at offset 5: the acknowledged messages are not delivered again."""
    first = broker_factory(env=NO_TIMER_FLUSH)
    async with DanubeClient(first.url) as client:
        producer = await client.create_producer("/default/flushed", dispatch="reliable")
        consumer = await client.subscribe("/default/flushed", "s", sub_type=SubType.EXCLUSIVE, consumer_name="c")
        for i in range(10):
            await producer.send(f"m{i}".encode())
        await drain(consumer, 5)
        await consumer.flush_acks()
        for _ in range(600):  # the acks reached the subscription (never the store: no flush)
            if (await describe_subscription(first, "/default/flushed", "s")).cursor == 4:
                break
            await asyncio.sleep(0.05)
        else:
            pytest.fail("the acks never moved the cursor")
    assert first.stop() == 0, first.log()
    second = broker_factory(url=first.url, admin_url=first.admin_url, env=NO_TIMER_FLUSH)
    async with DanubeClient(second.url) as client:
        consumer = await client.subscribe("/default/flushed", "s", sub_type=SubType.EXCLUSIVE, consumer_name="c")
        got = await drain(consumer, 5)
        assert [m.payload for m in got] == [f"m{i}".encode() for i in range(5, 10)]
        with pytest.raises(Timeout):
            await consumer.receive(timeout=0.5)


async def test_a_broker_killed_resumes_every_subscription_from_its_wal_checkpoint(broker_factory, tmp_path) -> None:
    """storage.mode local, with the store's flush timer out of reach (60 s): three
    subscriptions acknowledge 3, 7 and none of ten messages; once their cursors are
    checkpoints in the topic's WAL (found by scanning its files) the broker is killed
    with SIGKILL, so the metadata store never heard of them. After a restart each
    resumes right after its own acknowledged prefix (the one that acknowledged nothing
    from its start): the WAL alone told the topic they exist and where they are."""
    import signal

    from danube_zmq.storage.wal import scan
    from danube_zmq.transport import cluster_records as cr

    def checkpointed() -> dict[str, int]:
        newest: dict[str, int] = {}
        for path in sorted((tmp_path / "data").rglob("*.wal")):
            base = int(path.name.split(".")[0])
            for c in scan(path.read_bytes(), expected_offset=base, decode=False).checkpoints:
                if c.state is not None:
                    newest[c.subscription] = cr.decode_cursor(c.state).cursor
        return newest

    first = broker_factory(env=NO_TIMER_FLUSH)
    acked = {"a": 3, "b": 7, "c": 0}
    async with DanubeClient(first.url) as client:
        producer = await client.create_producer("/default/walcursors", dispatch="reliable")
        consumers = {name: await client.subscribe("/default/walcursors", name, sub_type=SubType.EXCLUSIVE,
                                                  consumer_name=f"c{name}") for name in acked}
        for i in range(10):
            await producer.send(f"m{i}".encode())
        for name, count in acked.items():
            if count:
                await drain(consumers[name], count)
                await consumers[name].flush_acks()
        for _ in range(600):
            if checkpointed() == {name: count - 1 for name, count in acked.items()}:
                break
            await asyncio.sleep(0.05)
        else:
            pytest.fail(f"the cursors never reached the WAL: {checkpointed()}")
    first.stop(signal.SIGKILL)
    second = broker_factory(url=first.url, admin_url=first.admin_url)
    async with DanubeClient(second.url) as client:
        for name, count in acked.items():
            consumer = await client.subscribe("/default/walcursors", name, sub_type=SubType.EXCLUSIVE,
                                              consumer_name=f"c{name}")
            got = await drain(consumer, 10 - count)
            assert [m.payload for m in got] == [f"m{i}".encode() for i in range(count, 10)]

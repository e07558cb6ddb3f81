"""Producer and consumer names cannot be taken over (issue 19, section 6).

Pulsar's rule, against a real broker process: a name held by another live connection
is refused (PRODUCER_BUSY / CONSUMER_BUSY) until its holder is gone, while the holder
keeps working; the holder's own reconnect (same connection identity) still resumes it.
"""

from __future__ import annotations

import asyncio
import signal
import sys

import pytest

from danube_zmq import DanubeClient, DispatchStrategy, SubType
from danube_zmq.client.admin import AdminClient
from danube_zmq.transport.errors import ConsumerBusy, ProducerBusy

DISPATCHES = [DispatchStrategy.NON_RELIABLE, DispatchStrategy.RELIABLE]


async def _receive(consumer, count: int, timeout_s: float = 10.0) -> list:
    got = []
    for _ in range(count):
        msg = await consumer.receive(timeout=timeout_s)
        await consumer.ack(msg)
        got.append(msg)
    return got


async def _eventually(attempt, timeout_s: float = 15.0):
    """Retry `attempt` (a coroutine factory) until it stops raising a busy error."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        try:
            return await attempt()
        except (ProducerBusy, ConsumerBusy):
            if asyncio.get_running_loop().time() > deadline:
                raise
            await asyncio.sleep(0.2)


@pytest.mark.parametrize("dispatch", DISPATCHES, ids=lambda d: d.name.lower())
async def test_second_connection_cannot_take_over_a_live_producer_name(broker, dispatch) -> None:
    """A second client asking for a live producer's name gets PRODUCER_BUSY (not
    retriable); the holder keeps publishing as that name, and once the holder is gone the
    name is free for the second client."""
    topic = f"/default/names-{dispatch.name.lower()}"
    async with DanubeClient(broker.url) as holder, DanubeClient(broker.url) as intruder:
        owned = await holder.create_producer(topic, name="orders-writer", dispatch=dispatch)
        consumer = await holder.subscribe(topic, "audit", sub_type=SubType.EXCLUSIVE)
        with pytest.raises(ProducerBusy, match="orders-writer") as caught:
            await intruder.create_producer(topic, name="orders-writer", dispatch=dispatch)
        assert not caught.value.retriable
        await owned.send(b"from the holder")
        [msg] = await _receive(consumer, 1)
        assert (msg.payload, msg.producer_name) == (b"from the holder", "orders-writer")
        await holder.close()
        # The holder is gone (closed its connection): the name is free.
        taken = await _eventually(lambda: intruder.create_producer(topic, name="orders-writer", dispatch=dispatch))
        await taken.send(b"from the successor")


@pytest.mark.parametrize("sub_type", [SubType.EXCLUSIVE, SubType.SHARED, SubType.FAILOVER],
                         ids=lambda s: s.name.lower())
async def test_second_connection_cannot_take_over_a_live_consumer_name(broker, sub_type) -> None:
    """A second client subscribing with a live consumer's name gets CONSUMER_BUSY; the
    holder keeps receiving, and once the holder is gone the name is free."""
    topic = f"/default/consumer-names-{sub_type.name.lower()}"
    async with DanubeClient(broker.url) as holder, DanubeClient(broker.url) as intruder:
        producer = await holder.create_producer(topic)
        owned = await holder.subscribe(topic, "billing", sub_type=sub_type, consumer_name="biller")
        with pytest.raises(ConsumerBusy, match="biller") as caught:
            await intruder.subscribe(topic, "billing", sub_type=sub_type, consumer_name="biller")
        assert not caught.value.retriable
        await producer.send(b"one")
        [msg] = await _receive(owned, 1)
        assert msg.payload == b"one"
        await holder.close()
        taken = await _eventually(lambda: intruder.subscribe(topic, "billing", sub_type=sub_type,
                                                             consumer_name="biller"))
        again = await intruder.create_producer(topic)
        await again.send(b"two")
        [msg] = await _receive(taken, 1)
        assert msg.payload == b"two"


async def test_the_holders_reconnect_resumes_its_names(broker) -> None:
    """The broker is paused past the session timeout, so the client's connection is lost
    and re-handshakes on the same socket identity: its producer and Exclusive consumer
    come back under their names (no BUSY), and messages flow as before."""
    topic = "/default/names-resume"
    async with DanubeClient(broker.url) as client, AdminClient(broker.admin_url) as admin:
        producer = await client.create_producer(topic, name="steady", dispatch=DispatchStrategy.RELIABLE)
        consumer = await client.subscribe(topic, "keep", sub_type=SubType.EXCLUSIVE, consumer_name="keeper")
        await producer.send(b"before")
        assert [m.payload for m in await _receive(consumer, 1)] == [b"before"]
        broker.process.send_signal(signal.SIGSTOP)
        try:
            await asyncio.sleep(3.5)  # > 2 x the tests' 1.5 s session timeout
        finally:
            broker.process.send_signal(signal.SIGCONT)
        sent = await asyncio.wait_for(producer.send(b"after"), 30)
        assert sent.topic == topic
        # At least once: an ack in flight at the pause may be lost, so "before" may come again.
        seen = [m.payload for m in await _receive(consumer, 1, timeout_s=30)]
        while seen[-1] != b"after":
            seen += [m.payload for m in await _receive(consumer, 1, timeout_s=30)]
        assert set(seen) <= {b"before", b"after"}, seen
        described = await admin.describe_topic(topic)
        assert [p.producers for p in described.partitions] == [["steady"]]
        assert [c for p in described.partitions for s in p.subscriptions for c in s.consumers] == ["keeper"]


_HOLDER_SCRIPT = """
import asyncio, sys
from danube_zmq import DanubeClient, DispatchStrategy, SubType

async def main(url, topic, dispatch):
    client = DanubeClient(url)  # never closed: the process is killed
    producer = await client.create_producer(topic, name="killed-writer", dispatch=DispatchStrategy[dispatch])
    await client.subscribe(topic, "audit", sub_type=SubType.EXCLUSIVE, consumer_name="killed-reader")
    await producer.send(b"before")
    print("ready", flush=True)
    await asyncio.sleep(3600)

asyncio.run(main(*sys.argv[1:]))
"""


@pytest.mark.parametrize("dispatch", DISPATCHES, ids=lambda d: d.name.lower())
async def test_a_killed_clients_names_go_to_a_new_process_after_its_session_times_out(broker, dispatch) -> None:
    """A client process holding a producer name and an Exclusive consumer name is killed
    with SIGKILL (no close, no goodbye: its session ends by the broker's session timeout,
    1.5 s in these tests' config). A new client process, on a new connection identity,
    then gets both names (retrying BUSY while the dead session may still live), and
    messages flow; on a reliable topic the message the dead consumer never acked comes
    to the new one."""
    topic = f"/default/killed-{dispatch.name.lower()}"
    holder = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _HOLDER_SCRIPT, broker.url, topic, dispatch.name, stdout=asyncio.subprocess.PIPE)
    try:
        line = await asyncio.wait_for(holder.stdout.readline(), 60)
        assert line == b"ready\n", line
    finally:
        holder.kill()  # SIGKILL
        await holder.wait()
    async with DanubeClient(broker.url) as successor:
        producer = await _eventually(lambda: successor.create_producer(topic, name="killed-writer", dispatch=dispatch),
                                     timeout_s=60)
        consumer = await _eventually(lambda: successor.subscribe(topic, "audit", sub_type=SubType.EXCLUSIVE,
                                                                 consumer_name="killed-reader"), timeout_s=60)
        await producer.send(b"after")
        seen = [m.payload for m in await _receive(consumer, 1, timeout_s=30)]
        if dispatch == DispatchStrategy.RELIABLE:
            while b"after" not in seen or b"before" not in seen:
                seen += [m.payload for m in await _receive(consumer, 1, timeout_s=30)]
            assert sorted(seen) == [b"after", b"before"], seen
        else:
            assert seen == [b"after"], seen

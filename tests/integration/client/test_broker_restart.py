"""A clean broker restart (SIGTERM, then a start on the same ports) as clients see it:
a standalone broker's topics come back, so its producers, consumers and readers attach
again and go on, as Pulsar's clients do through a broker restart. (A topic deleted is
what closes them for good.)"""

from __future__ import annotations

import signal

from danube_zmq import DanubeClient, SubType


async def test_producers_consumers_and_readers_go_on_through_a_clean_restart(broker_factory) -> None:
    broker = broker_factory()
    async with DanubeClient(broker.url) as client:
        producer = await client.create_producer("/default/restarted", dispatch="reliable")
        consumer = await client.subscribe("/default/restarted", "s", sub_type=SubType.EXCLUSIVE)
        reader = await client.create_reader("/default/restarted", start="earliest")
        await producer.send(b"before")
        before = await consumer.receive(timeout=10)
        await consumer.ack(before)
        await consumer.flush_acks()
        assert (await reader.read_next(timeout=10)).payload == b"before"

        assert broker.stop(signal.SIGTERM) == 0
        broker = broker_factory(url=broker.url, admin_url=broker.admin_url)
        await producer.send(b"after")
        assert (await consumer.receive(timeout=30)).payload == b"after"
        assert (await reader.read_next(timeout=30)).payload == b"after"

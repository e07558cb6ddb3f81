"""Messages near 20 MB, on a broker whose limits were raised for them (issue 38, item 2).

The client's inbound frame cap (ZMQ_MAXMSGSIZE) stayed at its 16 MiB default whatever the
broker's limits.frame_bytes_max: libzmq reads the option when the socket connects, and
setting it after `Connected` changed nothing. A Deliver over 16 MiB reset the client's
connection, the receipt of the send went with it, and the send hung in a reconnect loop."""

from __future__ import annotations

import asyncio

import msgpack
import pytest
import zmq

from danube_zmq.client import DanubeClient, SubType
from danube_zmq.transport.errors import DanubeError, InvalidArgument

MIB = 1024 * 1024
MESSAGE_MAX = 20_000_000  # policies.max_message_size: the at-limit message
FRAME_MAX = 24 * MIB  # limits.frame_bytes_max: over MESSAGE_MAX + the 1 MiB envelope
# What a 20 MB message needs raised (the broker refuses to start short of any of them):
# a subscription must be able to hold one message while its consumers are paused.
RAISED = {"DANUBE_POLICIES__MAX_MESSAGE_SIZE": str(MESSAGE_MAX), "DANUBE_LIMITS__FRAME_BYTES_MAX": str(FRAME_MAX),
          "DANUBE_DISPATCH__PENDING_BYTES_MAX": str(FRAME_MAX)}
PROMPT_S = 20.0  # a hung send fails the test instead of hanging it; a loaded 2-core machine takes ~1 s

# Tags and codes of docs/protocol.md (sections 6, 7 and 11).
CONNECT, CONNECTED, ERROR, CREATE_PRODUCER, PRODUCER_CREATED, SEND = 1, 2, 3, 20, 21, 23
INVALID_ARGUMENT = 1


@pytest.mark.parametrize("dispatch", ["non_reliable", "reliable"])
async def test_an_at_limit_message_of_20_mb_makes_the_round_trip(broker_factory, dispatch: str) -> None:
    broker = broker_factory(env=RAISED)
    payload = bytes(range(256)) * (MESSAGE_MAX // 256) + b"!" * (MESSAGE_MAX % 256)
    async with DanubeClient(broker.url) as client:
        producer = await client.create_producer(f"/default/large-{dispatch}", dispatch=dispatch)
        consumer = await client.subscribe(f"/default/large-{dispatch}", "s")
        receipt = await asyncio.wait_for(producer.send(payload), PROMPT_S)
        assert receipt.offset == 0
        message = await asyncio.wait_for(consumer.receive(), PROMPT_S)
        assert message.payload == payload
        await consumer.ack(message)
        # The connection carries on: a small message after the large one.
        await asyncio.wait_for(producer.send(b"after"), PROMPT_S)
        assert (await asyncio.wait_for(consumer.receive(), PROMPT_S)).payload == b"after"


async def test_an_over_limit_message_fails_at_once_naming_the_setting(broker_factory) -> None:
    """The client refuses it before sending (it knows the limit from `Connected`); a peer
    that sends it anyway gets INVALID_ARGUMENT from the broker naming the same setting."""
    broker = broker_factory(env=RAISED)
    over = b"x" * (MESSAGE_MAX + 1)
    async with DanubeClient(broker.url) as client:
        producer = await client.create_producer("/default/over")
        with pytest.raises(InvalidArgument, match=rf"message_bytes_max {MESSAGE_MAX} \(its policies.max_message_size\)"):
            await asyncio.wait_for(producer.send(over), PROMPT_S)

    ctx = zmq.Context()
    try:
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RCVTIMEO, int(PROMPT_S * 1000))
        sock.connect(broker.url)

        def request(*items: object) -> list[object]:
            sock.send(msgpack.packb(list(items), use_bin_type=True))
            return msgpack.unpackb(sock.recv(), raw=False)

        assert request(CONNECT, 1, 1, "raw")[0] == CONNECTED
        created = request(CREATE_PRODUCER, 2, "/default/over", "raw")
        assert created[0] == PRODUCER_CREATED, created
        refused = request(SEND, 3, created[2], [over], [0])
        assert refused[:3] == [ERROR, 3, INVALID_ARGUMENT], refused[:3]
        assert f"exceeds max_message_size ({MESSAGE_MAX} bytes" in refused[3], refused[3]
        assert "policies.max_message_size" in refused[3], refused[3]
    finally:
        ctx.destroy(linger=0)


async def test_a_client_follows_a_broker_restarted_with_raised_limits(broker_factory) -> None:
    """A connection made to a broker with the default 16 MiB frames reconnects to it
    restarted with larger ones, and takes a message over 16 MiB from it."""
    broker = broker_factory()
    payload = b"y" * MESSAGE_MAX
    async with DanubeClient(broker.url) as client:
        producer = await client.create_producer("/default/restarted")
        with pytest.raises(InvalidArgument, match=r"policies\.max_message_size"):
            await producer.send(payload)
        broker.stop()
        broker_factory(env=RAISED, url=broker.url, admin_url=broker.admin_url)
        # The stop closed the topic and its producer; the client's connection reconnects.
        producer = await client.create_producer("/default/restarted")
        consumer = await client.subscribe("/default/restarted", "s")
        receipt = await asyncio.wait_for(producer.send(payload), PROMPT_S)
        message = await asyncio.wait_for(consumer.receive(), PROMPT_S)
        assert message.payload == payload and message.message_id == receipt
        assert [c.connections_lost for c in client.statistics().connections] == [1]


async def test_a_burst_of_large_messages_stays_within_the_brokers_inbound_budget(broker_factory) -> None:
    """Five 20 MB messages sent at once: a producer's batches in flight are at most a frame's
    worth, so the broker never holds more than limits.inbound_bytes_per_connection_max
    (here its least, a frame and a MiB) unread from the connection. With a window of 16
    batches of any size it cut the connection, and the sends took a reconnect each."""
    broker = broker_factory(env={**RAISED, "DANUBE_LIMITS__INBOUND_BYTES_PER_CONNECTION_MAX": str(FRAME_MAX + MIB)})
    payload = b"z" * MESSAGE_MAX
    async with DanubeClient(broker.url) as client:
        producer = await client.create_producer("/default/burst")
        receipts = await asyncio.wait_for(asyncio.gather(*(producer.send(payload) for _ in range(5))), PROMPT_S)
        assert [r.offset for r in receipts] == [0, 1, 2, 3, 4]
        assert [c.connections_lost for c in client.statistics().connections] == [0]
    assert "inbound_bytes_per_connection_max" not in broker.log()


async def test_a_stored_message_over_a_lowered_frame_limit_fails_the_consumer_at_once(broker_factory) -> None:
    """A reliable topic keeps a 20 MB message written while the limits were raised; the
    broker restarted with the default 16 MiB frames cannot deliver it in one. The consumer
    is told so, naming the setting, instead of its connection being reset by every try."""
    raised = broker_factory(env=RAISED)
    async with DanubeClient(raised.url) as client:
        producer = await client.create_producer("/default/kept", dispatch="reliable")
        consumer = await client.subscribe("/default/kept", "s", sub_type=SubType.SHARED)
        await asyncio.wait_for(producer.send(b"k" * MESSAGE_MAX), PROMPT_S)
        await consumer.close()
    raised.stop()
    lowered = broker_factory(url=raised.url, admin_url=raised.admin_url)
    async with DanubeClient(lowered.url) as client:
        consumer = await client.subscribe("/default/kept", "s", sub_type=SubType.SHARED)
        with pytest.raises(DanubeError, match=r"limits\.frame_bytes_max"):
            await asyncio.wait_for(consumer.receive(), PROMPT_S)
    assert "limits.frame_bytes_max" in lowered.log()

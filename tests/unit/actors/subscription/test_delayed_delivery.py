"""Delayed delivery on a reliable topic behind the real gateway, on an injected clock
(`actors/subscription/delayed.py`): a Shared or Key-Shared subscription delivers a
message with `__deliver_at` on the millisecond its timer message fires and never
before; Exclusive delivers it at once; acks, nacks and the ack timeout work on
released messages; a seek judges them again. No sleeps for the times: the test moves
the clock."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import zmq.asyncio

from danube_zmq.actors.metrics import METRICS
from danube_zmq.actors.subscription.delayed import deliver_at_of
from danube_zmq.actors.subscription.shell import SubscriptionActor
from danube_zmq.actors.subscription.tracked_delivery import TrackedDelivery
from danube_zmq.actors.topic import TopicActor
from danube_zmq.clock import ManualClock
from danube_zmq.config.broker_config import BrokerConfig, PoliciesSection, ReliableSection
from danube_zmq.runtime.system import ActorSystem
from danube_zmq.transport import client_protocol as cp
from danube_zmq.transport.client_protocol import DELIVER_AT
from tests.unit.reliable_topic import ask, reliable_topic
from tests.waiting import until

TOPIC = "/default/delayed"


def test_a_delivery_time_reads_as_a_non_negative_integer_or_none() -> None:
    assert deliver_at_of({DELIVER_AT: "1700000000000"}) == 1_700_000_000_000
    assert deliver_at_of(None) is None
    assert deliver_at_of({"other": "1"}) is None
    assert deliver_at_of({DELIVER_AT: "soon"}) is None
    assert deliver_at_of({DELIVER_AT: "-1"}) is None


class _Client:
    def __init__(self, sock: zmq.asyncio.Socket) -> None:
        self.sock = sock
        self.delivered: list[tuple[int, bytes, int]] = []  # (offset, payload, redelivery count)

    async def drain(self, within_s: float = 0.2) -> list[tuple[int, bytes, int]]:
        """What arrives within `within_s`."""
        got = []
        while await self.sock.poll(int(within_s * 1000)):
            message = cp.CLIENT_PROTOCOL.decode(await self.sock.recv())
            if isinstance(message, cp.Deliver):
                offsets = message.offsets or list(range(message.base_offset, message.base_offset
                                                        + len(message.payloads)))
                got += [(o, p, message.redelivery_count) for o, p in zip(offsets, message.payloads, strict=True)]
        self.delivered += got
        return got


async def _setup(system: ActorSystem, endpoint: str, sock: zmq.asyncio.Socket, sub_type: int,
                 ) -> tuple[TopicActor, int, int]:
    topic = system.actor(endpoint)
    assert isinstance(topic, TopicActor)
    created = await ask(sock, cp.CreateProducer(request_id=2, topic=TOPIC, producer_name="p",
                                                dispatch_strategy=cp.DispatchStrategy.RELIABLE))
    assert isinstance(created, cp.ProducerCreated)
    subscribed = await ask(sock, cp.Subscribe(request_id=3, topic=TOPIC, subscription="s", consumer_name="c",
                                              sub_type=sub_type, initial_position=cp.InitialPosition.EARLIEST))
    assert isinstance(subscribed, cp.Subscribed)
    await sock.send(cp.CLIENT_PROTOCOL.encode(cp.Flow(consumer_id=subscribed.consumer_id, permits=1000)))
    return topic, created.producer_id, subscribed.consumer_id


def _delivery(system: ActorSystem, topic: TopicActor) -> TrackedDelivery:
    actor = system.actor(topic.subscriptions["s"].endpoint)
    assert isinstance(actor, SubscriptionActor) and isinstance(actor.delivery, TrackedDelivery)
    return actor.delivery


async def _send(sock: zmq.asyncio.Socket, producer_id: int, request_id: int, sequence: int,
                messages: list[tuple[bytes, int | None]]) -> None:
    receipt = await ask(sock, cp.Send(
        request_id=request_id, producer_id=producer_id, payloads=[p for p, _ in messages], sequence=sequence,
        publish_times=[0] * len(messages), attributes=[None if at is None else {DELIVER_AT: str(at)} for _, at in messages]))
    assert isinstance(receipt, cp.SendReceipt), receipt


@pytest.mark.parametrize("sub_type", [cp.SubType.SHARED, cp.SubType.KEY_SHARED])
async def test_a_delayed_message_comes_on_its_millisecond_and_never_before(tmp_path: Path, sub_type: int) -> None:
    clock = ManualClock()
    async with reliable_topic(tmp_path, TOPIC, clock=clock) as (system, endpoint, _, sock):
        topic, producer_id, consumer_id = await _setup(system, endpoint, sock, sub_type)
        client = _Client(sock)
        t0 = clock.now_ms()
        await _send(sock, producer_id, 4, 0, [(b"a", t0 + 1000), (b"b", None), (b"c", t0 + 500), (b"d", t0 - 5)])
        assert sorted(p for _, p, _ in await client.drain()) == [b"b", b"d"]  # d's time has passed
        delivery = _delivery(system, topic)
        assert delivery.info()["delayed_messages"] == 2
        clock.advance(499)
        assert await client.drain() == []
        clock.advance(1)
        assert await client.drain() == [(2, b"c", 0)]
        clock.advance(499)
        assert await client.drain() == []
        clock.advance(1)
        assert await client.drain() == [(0, b"a", 0)]
        assert delivery.info()["delayed_messages"] == 0
        await sock.send(cp.CLIENT_PROTOCOL.encode(cp.Ack(request_id=5, consumer_id=consumer_id,
                                                         offsets=[0, 1, 2, 3])))
        await until(lambda: delivery.tracker.cursor == 3 and not delivery.delayed.offset_of,
                    "every message acknowledged")


async def test_exclusive_delivers_a_delayed_message_at_once(tmp_path: Path) -> None:
    clock = ManualClock()
    async with reliable_topic(tmp_path, TOPIC, clock=clock) as (system, endpoint, _, sock):
        topic, producer_id, _ = await _setup(system, endpoint, sock, cp.SubType.EXCLUSIVE)
        await _send(sock, producer_id, 4, 0, [(b"a", clock.now_ms() + 60_000)])
        assert [p for _, p, _ in await _Client(sock).drain()] == [b"a"]
        assert _delivery(system, topic).delayed is None


async def test_a_released_message_nacked_or_timed_out_is_delivered_again(tmp_path: Path) -> None:
    clock = ManualClock()
    # An ack timeout well within the client session's timeout (the test sends no heartbeats).
    config = BrokerConfig(reliable=ReliableSection(ack_timeout_ms=1000))
    async with reliable_topic(tmp_path, TOPIC, clock=clock, config=config) as (system, endpoint, _, sock):
        _, producer_id, consumer_id = await _setup(system, endpoint, sock, cp.SubType.SHARED)
        client = _Client(sock)
        await _send(sock, producer_id, 4, 0, [(b"a", clock.now_ms() + 100)])
        clock.advance(100)
        assert await client.drain() == [(0, b"a", 0)]
        nacked = await ask(sock, cp.Nack(request_id=5, consumer_id=consumer_id, offsets=[0], delay_ms=2000))
        assert nacked.request_id == 5
        clock.advance(1999)
        await asyncio.sleep(0.15)  # a tick may pass
        assert await client.drain() == []
        clock.advance(200)
        assert await client.drain(1.0) == [(0, b"a", 1)]
        # No ack: the ack timeout (1 s) fails it; the backoff of a second failure is 2 s.
        clock.advance(1000)
        await asyncio.sleep(0.15)
        assert await client.drain() == []
        clock.advance(2_100)
        assert await client.drain(1.0) == [(0, b"a", 2)]


async def test_a_seek_judges_delayed_messages_again(tmp_path: Path) -> None:
    clock = ManualClock()
    async with reliable_topic(tmp_path, TOPIC, clock=clock) as (system, endpoint, _, sock):
        _, producer_id, consumer_id = await _setup(system, endpoint, sock, cp.SubType.SHARED)
        client = _Client(sock)
        t0 = clock.now_ms()
        await _send(sock, producer_id, 4, 0, [(b"a", t0 + 1000), (b"b", None)])
        assert await client.drain() == [(1, b"b", 0)]
        sought = await ask(sock, cp.Seek(request_id=5, consumer_id=consumer_id, offset=0))
        assert sought.request_id == 5
        assert await client.drain() == [(1, b"b", 0)]  # a held back again, b delivered again
        clock.advance(1000)
        assert await client.drain() == [(0, b"a", 0)]


async def test_the_message_ttl_expires_held_messages_too(tmp_path: Path) -> None:
    """`message_ttl_s` 30: a message published now and due in 60 s is acknowledged by
    the TTL check 30 s later (counted with the subscription's label), never delivered."""
    clock = ManualClock()
    config = BrokerConfig(policies=PoliciesSection(message_expiry_check_interval_ms=100, message_ttl_s=30))
    async with reliable_topic(tmp_path, TOPIC, clock=clock, config=config) as (system, endpoint, _, sock):
        topic, producer_id, _ = await _setup(system, endpoint, sock, cp.SubType.SHARED)
        client = _Client(sock)
        now = clock.now_ms()
        receipt = await ask(sock, cp.Send(request_id=4, producer_id=producer_id, payloads=[b"late"], sequence=0,
                                          publish_times=[now], attributes=[{DELIVER_AT: str(now + 60_000)}]))
        assert isinstance(receipt, cp.SendReceipt)
        delivery = _delivery(system, topic)
        await until(lambda: delivery.info()["delayed_messages"] == 1, "the message to be held")
        clock.advance(29_000)
        assert await client.drain() == []
        clock.advance(1_100)
        await until(lambda: delivery.info()["delayed_messages"] == 0, "the held message to expire")
        assert METRICS.messages_expired.labels(topic=TOPIC, subscription="s").value == 1
        assert delivery.tracker.cursor == 0

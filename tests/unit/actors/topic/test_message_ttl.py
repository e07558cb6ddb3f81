"""The message TTL of a reliable topic (`actors/topic/message_ttl.py`) on an injected
clock: messages published before now - message_ttl_s are acknowledged for every
subscription at the next check, counted per subscription; nothing expires while the
policy is 0. No sleeps: the test moves the clock."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import zmq.asyncio

from danube_zmq.actors.metrics import METRICS
from danube_zmq.actors.subscription.shell import SubscriptionActor
from danube_zmq.actors.subscription.tracked_delivery import TrackedDelivery
from danube_zmq.actors.topic import TopicActor
from danube_zmq.actors.topic.message_ttl import cutoff_ms
from danube_zmq.clock import ManualClock
from danube_zmq.config.broker_config import BrokerConfig, PoliciesSection
from danube_zmq.runtime.system import ActorSystem
from danube_zmq.transport import client_protocol as cp
from danube_zmq.transport.common import PROTOCOL_VERSION, Connect, Connected
from tests.unit.reliable_topic import ask, reliable_topic
from tests.waiting import until

TOPIC = "/default/ttl"
CHECK_MS = 100


def test_the_cutoff_is_now_less_the_ttl_and_none_without_one() -> None:
    assert cutoff_ms(1_700_000_000_000, 60) == 1_699_999_940_000
    assert cutoff_ms(1_700_000_000_000, 0) is None


async def _topic_and_producer(system: ActorSystem, endpoint: str,
                              sock: zmq.asyncio.Socket) -> tuple[TopicActor, cp.ProducerCreated]:
    topic = system.actor(endpoint)
    assert isinstance(topic, TopicActor)
    created = await ask(sock, cp.CreateProducer(request_id=2, topic=TOPIC, producer_name="p",
                                                dispatch_strategy=cp.DispatchStrategy.RELIABLE))
    assert isinstance(created, cp.ProducerCreated)
    return topic, created


def _cursor(system: ActorSystem, topic: TopicActor, name: str) -> int:
    actor = system.actor(topic.subscriptions[name].endpoint)
    assert isinstance(actor, SubscriptionActor) and isinstance(actor.delivery, TrackedDelivery)
    return actor.delivery.tracker.cursor


async def test_messages_past_the_ttl_are_acknowledged_for_every_subscription_at_the_next_check(
        tmp_path: Path) -> None:
    clock = ManualClock()
    config = BrokerConfig(policies=PoliciesSection(message_expiry_check_interval_ms=CHECK_MS))
    async with reliable_topic(tmp_path, TOPIC, clock=clock, config=config) as (system, endpoint, _, sock):
        topic, created = await _topic_and_producer(system, endpoint, sock)
        now = clock.now_ms()
        # Two messages published 10 s ago, then one now.
        receipt = await ask(sock, cp.Send(request_id=3, producer_id=created.producer_id, payloads=[b"a", b"b", b"c"],
                                          publish_times=[now - 10_000, now - 10_000, now], sequence=0))
        assert isinstance(receipt, cp.SendReceipt) and receipt.offsets == [0, 1, 2]
        for request_id, name in ((4, "first"), (5, "second")):
            subscribed = await ask(sock, cp.Subscribe(request_id=request_id, topic=TOPIC, subscription=name,
                                                      consumer_name=name, sub_type=cp.SubType.SHARED,
                                                      initial_position=cp.InitialPosition.EARLIEST))
            assert isinstance(subscribed, cp.Subscribed)
        # No TTL: nothing expires, however long.
        clock.advance(60_000)
        assert topic.ttl._armed is False
        assert _cursor(system, topic, "first") == _cursor(system, topic, "second") == -1
        # A reader's subscription (not durable; no permits granted, so it read
        # nothing), on a session begun again: the first did not outlive that minute.
        assert isinstance(await ask(sock, Connect(request_id=7, protocol_version=PROTOCOL_VERSION, client_name="t")),
                          Connected)
        subscribed = await ask(sock, cp.Subscribe(request_id=6, topic=TOPIC, subscription="reader", consumer_name="r",
                                                  sub_type=cp.SubType.EXCLUSIVE, durable=False,
                                                  initial_position=cp.InitialPosition.EARLIEST))
        assert isinstance(subscribed, cp.Subscribed)

        system.tell(endpoint, dataclasses.replace(topic.policies, message_ttl_s=30))
        await until(lambda: topic.policies.message_ttl_s == 30, "the policy to apply")
        clock.advance(CHECK_MS)  # 70 s after the first two, 60 s after the third
        await until(lambda: _cursor(system, topic, "first") == _cursor(system, topic, "second") == 2,
                    "all three to expire for both subscriptions")
        for name in ("first", "second"):
            assert METRICS.messages_expired.labels(topic=TOPIC, subscription=name).value == 3
        assert _cursor(system, topic, "reader") == -1  # a reader reads what is stored

async def test_only_the_messages_older_than_the_ttl_expire_and_the_rest_when_their_time_comes(
        tmp_path: Path) -> None:
    clock = ManualClock()
    config = BrokerConfig(policies=PoliciesSection(message_expiry_check_interval_ms=CHECK_MS, message_ttl_s=30))
    async with reliable_topic(tmp_path, TOPIC, clock=clock, config=config) as (system, endpoint, _, sock):
        topic, created = await _topic_and_producer(system, endpoint, sock)
        subscribed = await ask(sock, cp.Subscribe(request_id=3, topic=TOPIC, subscription="s", consumer_name="c",
                                                  sub_type=cp.SubType.EXCLUSIVE,
                                                  initial_position=cp.InitialPosition.EARLIEST))
        assert isinstance(subscribed, cp.Subscribed)
        now = clock.now_ms()
        receipt = await ask(sock, cp.Send(request_id=4, producer_id=created.producer_id, payloads=[b"old", b"new"],
                                          publish_times=[now - 40_000, now - 10_000], sequence=0))
        assert isinstance(receipt, cp.SendReceipt)
        clock.advance(CHECK_MS)
        await until(lambda: _cursor(system, topic, "s") == 0, "the message 40 s old to expire")
        clock.advance(10_000)  # the other is 20 s old: kept
        assert _cursor(system, topic, "s") == 0
        clock.advance(10_000)  # 30 s: its time
        await until(lambda: _cursor(system, topic, "s") == 1, "the second message to expire at its time")
        assert METRICS.messages_expired.labels(topic=TOPIC, subscription="s").value == 2

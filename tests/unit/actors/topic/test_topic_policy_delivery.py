"""A topic policy change reaches every subscription of a live topic, whatever its
mailbox holds at that moment (docs/operations.md, "Topic policies").

Two hops carry a change: the broker's policy keeper tells the topic (`PolicyKeeper`),
the topic tells its subscriptions. The tests run the real topic and subscription actors
in one actor system with small mailboxes; the broker's part is its `PolicyKeeper`
itself, on a fake local replica of the metadata store, told the topic is served as the
broker tells it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
import zmq
import zmq.asyncio

from danube_zmq.actors.ids import IdSource
from danube_zmq.actors.policy.policy_keeper import PolicyKeeper
from danube_zmq.actors.topic import make_topic
from danube_zmq.clock import SystemClock
from danube_zmq.config.broker_config import BrokerConfig, BrokerSection
from danube_zmq.runtime.actor import Actor
from danube_zmq.runtime.system import ActorSystem
from danube_zmq.transport import client_protocol as cp
from danube_zmq.transport import cluster_records as cr
from danube_zmq.transport.internal_protocol import (
    ApplyTopicPolicies,
    ClientRequest,
    DispatchTokensDue,
    PublishTokensDue,
    Tick,
    TopicPoliciesChanged,
    TopicServed,
)
from tests.unit.full_mailbox import FakeReplica, Staller
from tests.waiting import until

TOPIC = "/default/policed"
MAILBOX_MAX = 8


class StandInBroker(Actor):
    """The topic's parent: it answers nothing (a non-reliable topic asks its broker nothing here)."""


@dataclass
class Setup:
    system: ActorSystem
    keeper: str
    topic: str
    subscription: str
    staller: str
    replica: FakeReplica


@pytest.fixture
async def setup() -> AsyncIterator[Setup]:
    context = zmq.asyncio.Context()
    # A short ask timeout: what `send` waits for room before it gives up.
    system = ActorSystem(context, clock=SystemClock(), mailbox_messages_max=MAILBOX_MAX, ask_timeout_ms=300)
    config = BrokerConfig(broker=BrokerSection(listen="inproc://policy-delivery"))
    replica = FakeReplica()
    broker = await system.spawn(StandInBroker, name="broker")
    keeper = await system.spawn(lambda: PolicyKeeper(metadata=replica, config=config, broker_id=1),  # type: ignore[arg-type]
                                name="policy keeper", parent=broker)
    topic = await system.spawn(lambda: make_topic(name=TOPIC, dispatch_strategy=cp.DispatchStrategy.NON_RELIABLE,
                                                  config=config, rng=IdSource(3), broker_endpoint=broker),
                               name=f"topic {TOPIC}", parent=broker)
    assert system.tell(keeper, TopicServed(topic=TOPIC, dispatch_strategy=cp.DispatchStrategy.NON_RELIABLE,
                                           endpoint=topic, revision=0))
    assert system.tell(topic, ClientRequest(identity=b"consumer", frame=cp.CLIENT_PROTOCOL.encode(
        cp.Subscribe(request_id=1, topic=TOPIC, subscription="s", consumer_name="c"))))
    await until(lambda: "s" in system.actor(topic).subscriptions, "the subscription spawned")  # type: ignore[attr-defined]
    subscription = system.actor(topic).subscriptions["s"].endpoint  # type: ignore[attr-defined]
    Staller.release = asyncio.Event()
    staller = await system.spawn(Staller, name="staller", parent=topic, share_mailbox=True)
    try:
        yield Setup(system=system, keeper=keeper, topic=topic, subscription=subscription, staller=staller,
                    replica=replica)
    finally:
        Staller.release.set()
        await system.shutdown()
        context.term()


def _set_topic_policies(replica: FakeReplica, **values: Any) -> None:
    replica.records[cr.topic_policies_key(TOPIC)] = cr.encode(cr.TopicPoliciesRecord(**values))


def _policies(system: ActorSystem, endpoint: str) -> ApplyTopicPolicies:
    return system.actor(endpoint).policies  # type: ignore[attr-defined, no-any-return]


async def test_a_subscription_with_a_full_mailbox_gets_the_change_its_topic_passes_on(setup: Setup) -> None:
    """The subscription's mailbox is full (its group stalled, `mailbox_messages_max`
    timer messages queued, one more refused) when the topic handles the change: the
    topic tells it from inside the group, on the group's local lane, which takes no
    bound, so once the group runs again the subscription applies the new limits."""
    system = setup.system
    assert system.tell(setup.staller, Tick())
    await asyncio.sleep(0.01)  # the group's task now waits in the staller
    told = [system.tell(setup.subscription, DispatchTokensDue()) for _ in range(MAILBOX_MAX + 1)]
    assert told[-1] is False and all(told[:-1])  # full
    changed = ApplyTopicPolicies(**{**_fields(_policies(system, setup.topic)), "max_dispatch_rate": 50,
                                    "max_consumers_per_subscription": 2})
    assert system.tell(setup.topic, changed)
    Staller.release.set()
    await until(lambda: _policies(system, setup.subscription) == changed, "the subscription applied the change")
    assert _policies(system, setup.topic) == changed


async def test_a_change_told_while_the_topics_mailbox_stays_full_still_reaches_its_subscriptions(
        setup: Setup) -> None:
    """The topic's mailbox is full, and stays full past what the keeper's `send` would
    wait (the system's ask timeout, 300 ms here), when the keeper learns of a change
    (`TopicPoliciesChanged` from its watch). Once the topic drains, the topic and its
    subscription both hold the new max_dispatch_rate and max_consumers_per_subscription:
    the keeper keeps the change pending and tells it again, as it is in the store then."""
    system = setup.system
    assert system.tell(setup.staller, Tick())
    await asyncio.sleep(0.01)
    told = [system.tell(setup.topic, PublishTokensDue()) for _ in range(MAILBOX_MAX + 1)]
    assert told[-1] is False and all(told[:-1])  # full
    _set_topic_policies(setup.replica, max_dispatch_rate=50, max_consumers_per_subscription=2)
    assert system.tell(setup.keeper, TopicPoliciesChanged())
    await asyncio.sleep(0.6)  # past the send deadline, the topic still stalled
    # A later change, while the first is still undelivered: the last one in the store wins.
    _set_topic_policies(setup.replica, max_dispatch_rate=70, max_consumers_per_subscription=3)
    assert system.tell(setup.keeper, TopicPoliciesChanged())
    await asyncio.sleep(0.6)
    Staller.release.set()
    await until(lambda: _policies(system, setup.subscription).max_dispatch_rate == 70,
                "the subscription applied the last change", deadline_s=5)
    for endpoint in (setup.topic, setup.subscription):
        policies = _policies(system, endpoint)
        assert (policies.max_dispatch_rate, policies.max_consumers_per_subscription) == (70, 3)


def _fields(policies: ApplyTopicPolicies) -> dict[str, int]:
    return {name: getattr(policies, name) for name in ApplyTopicPolicies.__dataclass_fields__}

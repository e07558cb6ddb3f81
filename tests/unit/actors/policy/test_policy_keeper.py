"""The policy keeper tells a topic the broker spawned before a change it learned of
(`TopicServed` with an older revision) the policies now in force, and leaves alone one
spawned after it (which read them at spawn); a topic released is told nothing more,
unless the release names an earlier actor of the topic. The keeper runs in a real
actor system on a fake local replica; the topics are recorders."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import zmq
import zmq.asyncio

from danube_zmq.actors.policy.policy_keeper import PolicyKeeper
from danube_zmq.clock import SystemClock
from danube_zmq.config.broker_config import BrokerConfig, BrokerSection
from danube_zmq.runtime.actor import Actor
from danube_zmq.runtime.system import ActorSystem
from danube_zmq.transport import client_protocol as cp
from danube_zmq.transport import cluster_records as cr
from danube_zmq.transport.internal_protocol import (
    ApplyBacklogQuota,
    ApplyTopicPolicies,
    BacklogQuotasChanged,
    TopicPoliciesChanged,
    TopicReleased,
    TopicServed,
)
from tests.unit.full_mailbox import FakeReplica

RELIABLE = cp.DispatchStrategy.RELIABLE


class Recorder(Actor):
    def __init__(self) -> None:
        self.told: list[object] = []

    def handle_ApplyTopicPolicies(self, msg: ApplyTopicPolicies) -> None:
        self.told.append(msg)

    def handle_ApplyBacklogQuota(self, msg: ApplyBacklogQuota) -> None:
        self.told.append(msg)


@pytest.fixture
async def system() -> AsyncIterator[ActorSystem]:
    context = zmq.asyncio.Context()
    system = ActorSystem(context, clock=SystemClock(), mailbox_messages_max=64)
    try:
        yield system
    finally:
        await system.shutdown()
        context.term()


async def _settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0.01)


async def test_a_topic_spawned_before_a_change_is_told_it_and_one_spawned_after_is_not(system: ActorSystem) -> None:
    replica = FakeReplica()
    replica.records[cr.namespace_topic_policies_key("default")] = cr.encode(cr.TopicPoliciesRecord(max_dispatch_rate=9))
    replica.records[cr.namespace_backlog_quota_key("default")] = cr.encode(
        cr.BacklogQuotaRecord(limit_bytes=4096, policy="producer_request_hold"))
    config = BrokerConfig(broker=BrokerSection(listen="inproc://keeper"))
    keeper = await system.spawn(lambda: PolicyKeeper(metadata=replica, config=config, broker_id=1),  # type: ignore[arg-type]
                                name="policy keeper")
    early = await system.spawn(Recorder, name="early")
    late = await system.spawn(Recorder, name="late")
    assert system.tell(keeper, TopicPoliciesChanged(revision=5))
    assert system.tell(keeper, BacklogQuotasChanged(revision=5))
    assert system.tell(keeper, TopicServed(topic="/default/early", dispatch_strategy=RELIABLE, endpoint=early,
                                           revision=4))
    assert system.tell(keeper, TopicServed(topic="/default/late", dispatch_strategy=RELIABLE, endpoint=late,
                                           revision=5))
    await _settle()
    told = system.actor(early).told  # type: ignore[attr-defined]
    assert [type(m) for m in told] == [ApplyTopicPolicies, ApplyBacklogQuota]
    assert told[0].max_dispatch_rate == 9 and (told[1].limit_bytes, told[1].policy) == (4096, "producer_request_hold")
    assert system.actor(late).told == []  # type: ignore[attr-defined]

    # A release naming another actor of the topic (an earlier one) keeps this one.
    assert system.tell(keeper, TopicReleased(topic="/default/late", endpoint="somewhere else"))
    assert system.tell(keeper, TopicReleased(topic="/default/early", endpoint=early))
    assert system.tell(keeper, TopicPoliciesChanged(revision=6))
    await _settle()
    assert len(system.actor(early).told) == 2  # type: ignore[attr-defined]
    assert [type(m) for m in system.actor(late).told] == [ApplyTopicPolicies]  # type: ignore[attr-defined]

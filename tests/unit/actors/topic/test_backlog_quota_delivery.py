"""A backlog quota change reaches a live reliable topic whatever its mailbox holds at
that moment, and the broker's policy keeper does not wait for the topic's room meanwhile
(docs/operations.md, "Backlog quotas and the disk reserve").

The test runs a real reliable topic in an actor system with small mailboxes; the
broker's part is its `PolicyKeeper` itself, on a fake local replica of the metadata
store, told the topic is served as the broker tells it, beside a stand-in broker that
answers what a reliable topic asks its broker."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
import zmq
import zmq.asyncio

from danube_zmq.actors.ids import IdSource
from danube_zmq.actors.policy.policy_keeper import PolicyKeeper
from danube_zmq.actors.topic import TopicActor, WalStorage, make_topic
from danube_zmq.clock import SystemClock
from danube_zmq.config.broker_config import BrokerConfig, BrokerSection
from danube_zmq.runtime.system import ActorSystem
from danube_zmq.transport import client_protocol as cp
from danube_zmq.transport import cluster_records as cr
from danube_zmq.transport.internal_protocol import (
    BacklogQuotasChanged,
    PublishTokensDue,
    Tick,
    TopicServed,
)
from tests.unit.full_mailbox import FakeReplica, Staller
from tests.unit.reliable_topic import Reserver
from tests.waiting import until

TOPIC = "/default/quota-held"
MAILBOX_MAX = 8
ASK_TIMEOUT_MS = 300


@dataclass
class Setup:
    system: ActorSystem
    keeper: str
    topic: str
    staller: str
    replica: FakeReplica


@pytest.fixture
async def setup(tmp_path: Path) -> AsyncIterator[Setup]:
    context = zmq.asyncio.Context()
    # A short ask timeout: what `send` waits for room before it gives up.
    system = ActorSystem(context, clock=SystemClock(), mailbox_messages_max=MAILBOX_MAX, ask_timeout_ms=ASK_TIMEOUT_MS)
    executor = ThreadPoolExecutor(1)
    config = BrokerConfig(broker=BrokerSection(listen="inproc://quota-delivery"))
    replica = FakeReplica()
    stand_in = Reserver()
    broker = await system.spawn(lambda: stand_in, name="broker")
    keeper = await system.spawn(lambda: PolicyKeeper(metadata=replica, config=config, broker_id=1),  # type: ignore[arg-type]
                                name="policy keeper", parent=broker)
    topic = await system.spawn(lambda: make_topic(name=TOPIC, dispatch_strategy=cp.DispatchStrategy.RELIABLE,
                                                  config=config, rng=IdSource(3), broker_endpoint=broker,
                                                  wal_dir=tmp_path / "wal", executor=executor),
                               name=f"topic {TOPIC}", parent=broker)
    stand_in.serve(topic)
    assert system.tell(keeper, TopicServed(topic=TOPIC, dispatch_strategy=cp.DispatchStrategy.RELIABLE,
                                           endpoint=topic, revision=0))
    Staller.release = asyncio.Event()
    staller = await system.spawn(Staller, name="staller", parent=topic, share_mailbox=True)
    try:
        yield Setup(system=system, keeper=keeper, topic=topic, staller=staller, replica=replica)
    finally:
        Staller.release.set()
        await system.shutdown()
        executor.shutdown()
        context.term()


def _set_topic_quota(replica: FakeReplica, limit_bytes: int, policy: str) -> None:
    replica.records[cr.topic_backlog_quota_key(TOPIC)] = cr.encode(
        cr.BacklogQuotaRecord(limit_bytes=limit_bytes, policy=policy))


def _quota(system: ActorSystem, topic: str) -> tuple[int, str]:
    actor = system.actor(topic)
    assert isinstance(actor, TopicActor) and isinstance(actor.storage, WalStorage)
    return actor.storage.quota.quota_bytes_max, actor.storage.quota.quota_policy


async def _fill(system: ActorSystem, setup: Setup) -> None:
    """Stall the topic's group and fill the topic's mailbox (one more tell refused)."""
    assert system.tell(setup.staller, Tick())
    await asyncio.sleep(0.01)  # the group's task now waits in the staller
    told = [system.tell(setup.topic, PublishTokensDue()) for _ in range(MAILBOX_MAX + 1)]
    assert told[-1] is False and all(told[:-1])  # full


async def test_a_quota_change_told_while_the_topics_mailbox_stays_full_still_reaches_it(setup: Setup) -> None:
    """The topic's mailbox is full, and stays full past what the keeper's `send` would
    wait (the system's ask timeout, 300 ms here), when the keeper learns of a quota
    change (`BacklogQuotasChanged` from its watch), then of a second one. Once the topic
    drains it holds the second: the keeper kept the topic pending and told it again,
    with what the store held then."""
    system = setup.system
    assert _quota(system, setup.topic) == (BrokerConfig().policies.backlog_quota_bytes_max, "producer_exception")
    await _fill(system, setup)
    _set_topic_quota(setup.replica, 4096, "producer_request_hold")
    assert system.tell(setup.keeper, BacklogQuotasChanged())
    await asyncio.sleep(2 * ASK_TIMEOUT_MS / 1000)  # past the send deadline, the topic still stalled
    # A later change, while the first is still undelivered: the last one in the store wins.
    _set_topic_quota(setup.replica, 8192, "consumer_backlog_eviction")
    assert system.tell(setup.keeper, BacklogQuotasChanged())
    await asyncio.sleep(2 * ASK_TIMEOUT_MS / 1000)
    Staller.release.set()
    await until(lambda: _quota(system, setup.topic) == (8192, "consumer_backlog_eviction"),
                "the topic applied the last quota change", deadline_s=5)

"""One topic shell and one subscription shell, with the storage and delivery sides
plugged in (`actors/topic/`, `actors/subscription/`).

The same client sequence (produce, subscribe, consume, ack, describe) runs against the
real gateway, topic and subscription actors in one actor system, once with each
storage side: `MemoryTail` (its subscriptions get a `RuleDelivery`) and `WalStorage`
(a WAL in a temp dir; its subscriptions get a `TrackedDelivery`). The broker's part is
played by a small actor that reserves offsets and keeps what it is told.

And actors share nothing: no module of the topic or subscription packages reads
another actor's live instance (`system.actor(...)`).
"""

from __future__ import annotations

import ast
import asyncio
import itertools
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
import zmq
import zmq.asyncio

from danube_zmq.actors.ids import IdSource
from danube_zmq.actors.sockets.gateway import Gateway
from danube_zmq.actors.subscription import RuleDelivery, SubscriptionActor, TrackedDelivery
from danube_zmq.actors.topic import MemoryTail, TopicActor, WalStorage, make_topic
from danube_zmq.clock import SystemClock
from danube_zmq.config.broker_config import BrokerConfig, BrokerSection
from danube_zmq.runtime.actor import Actor
from danube_zmq.runtime.system import ActorSystem
from danube_zmq.transport import client_protocol as cp
from danube_zmq.transport import cluster_records as cr
from danube_zmq.transport.codec import Message
from danube_zmq.transport.common import PROTOCOL_VERSION, Connect, Connected, Ok
from danube_zmq.transport.internal_protocol import (
    DescribePartition,
    FlushDone,
    OffsetsReserved,
    PartitionStats,
    PersistCursor,
    PersistedSubscriptions,
    ProducerRegistry,
    ReserveOffsets,
    SubscriptionsOf,
)
from tests.paths import PACKAGE

TOPIC = "/default/composed"
ACTORS = PACKAGE / "actors"
_listeners = itertools.count(1)
STRATEGIES = {"memory": cp.DispatchStrategy.NON_RELIABLE, "wal": cp.DispatchStrategy.RELIABLE}


class StandInBroker(Actor):
    """The broker actor's part towards one topic: offsets reserved at once, cursors and
    producer records kept."""

    def __init__(self) -> None:
        self.topic_endpoint = ""
        self.cursors: list[PersistCursor] = []
        self.registry: list[ProducerRegistry] = []

    def handle_ReserveOffsets(self, msg: ReserveOffsets) -> None:
        self.system.tell(self.topic_endpoint, OffsetsReserved(until=msg.until))

    def handle_PersistCursor(self, msg: PersistCursor) -> None:
        self.cursors.append(msg)

    def handle_ProducerRegistry(self, msg: ProducerRegistry) -> None:
        self.registry.append(msg)

    def handle_SubscriptionsOf(self, msg: SubscriptionsOf) -> PersistedSubscriptions:
        return PersistedSubscriptions(states=[])  # a new topic: none persisted


@dataclass
class Broker:
    system: ActorSystem
    context: zmq.asyncio.Context
    url: str
    topic: str
    stand_in: StandInBroker
    reliable: bool


@pytest.fixture(params=sorted(STRATEGIES))
async def broker(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Broker]:
    context = zmq.asyncio.Context()
    system = ActorSystem(context, clock=SystemClock(), mailbox_messages_max=1024)
    url = f"inproc://composition-{next(_listeners)}"
    config = BrokerConfig(broker=BrokerSection(listen=url))
    executor = ThreadPoolExecutor(1)
    system.gateway_endpoint = await system.spawn(lambda: Gateway(config=config, broker_id=1), name="gateway")
    stand_in = StandInBroker()
    broker_endpoint = await system.spawn(lambda: stand_in, name="broker")
    topic = await system.spawn(
        lambda: make_topic(name=TOPIC, dispatch_strategy=STRATEGIES[request.param], config=config, rng=IdSource(3),
                           broker_endpoint=broker_endpoint, wal_dir=tmp_path / "wal", executor=executor),
        name=f"topic {TOPIC}")
    stand_in.topic_endpoint = topic
    system.broker_endpoint = topic  # the gateway hands producer and subscribe requests to the topic
    yield Broker(system=system, context=context, url=url, topic=topic, stand_in=stand_in,
                 reliable=request.param == "wal")
    await system.shutdown()
    executor.shutdown()
    context.term()


class Client:
    def __init__(self, broker: Broker) -> None:
        self.sock = broker.context.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(broker.url)
        self.request_ids = itertools.count(1)
        self.pushes: list[Message] = []

    async def ask(self, make) -> Message:
        request_id = next(self.request_ids)
        await self.sock.send(cp.CLIENT_PROTOCOL.encode(make(request_id)))
        async with asyncio.timeout(30):
            while True:
                msg = cp.CLIENT_PROTOCOL.decode(await self.sock.recv())
                if getattr(msg, "request_id", None) == request_id:
                    return msg
                self.pushes.append(msg)

    async def delivered(self, count: int) -> list[cp.Deliver]:
        """Deliveries until `count` messages came."""
        async with asyncio.timeout(30):
            while sum(len(d.payloads) for d in self.pushes if isinstance(d, cp.Deliver)) < count:
                self.pushes.append(cp.CLIENT_PROTOCOL.decode(await self.sock.recv()))
        return [d for d in self.pushes if isinstance(d, cp.Deliver)]


async def test_each_storage_side_produces_delivers_and_acknowledges_the_same_way(broker: Broker) -> None:
    """Produce three messages, consume them on a shared subscription and ack them: the
    receipt, the deliveries, the ack's answer and the partition's counters are the same
    whether the topic keeps a memory tail or a WAL; each storage side gives its
    subscriptions the delivery side that matches it."""
    reliable = broker.reliable
    strategy = cp.DispatchStrategy.RELIABLE if reliable else cp.DispatchStrategy.NON_RELIABLE
    client = Client(broker)
    try:
        assert isinstance(await client.ask(lambda r: Connect(request_id=r, protocol_version=PROTOCOL_VERSION,
                                                             client_name="t")), Connected)
        subscribed = await client.ask(lambda r: cp.Subscribe(request_id=r, topic=TOPIC, subscription="s",
                                                              consumer_name="c"))
        assert isinstance(subscribed, cp.Subscribed), subscribed
        await client.sock.send(cp.CLIENT_PROTOCOL.encode(cp.Flow(consumer_id=subscribed.consumer_id, permits=100)))
        created = await client.ask(lambda r: cp.CreateProducer(request_id=r, topic=TOPIC, producer_name="p",
                                                                dispatch_strategy=strategy))
        assert isinstance(created, cp.ProducerCreated), created
        payloads = [b"a", b"bb", b"ccc"]
        receipt = await client.ask(lambda r: cp.Send(request_id=r, producer_id=created.producer_id,
                                                      payloads=payloads, publish_times=[1, 2, 3]))
        assert isinstance(receipt, cp.SendReceipt) and receipt.offsets == [0, 1, 2], receipt
        deliveries = await client.delivered(3)
        assert [p for d in deliveries for p in d.payloads] == payloads
        assert deliveries[0].base_offset == 0 and deliveries[0].producer_name == "p"
        ack = await client.ask(lambda r: cp.Ack(request_id=r, consumer_id=subscribed.consumer_id, offsets=[0, 1, 2]))
        assert isinstance(ack, Ok), ack

        stats = await broker.system.ask(broker.topic, DescribePartition())
        assert isinstance(stats, PartitionStats)
        info = stats.info
        assert (info.next_offset, info.messages_in, info.bytes_in, info.producers) == (3, 3, 6, ["p"])
        (subscription,) = info.subscriptions
        assert (subscription.name, subscription.consumers, subscription.delivered_messages) == ("s", ["c"], 3)
        assert subscription.dropped_messages == 0

        topic = broker.system.actor(broker.topic)
        assert isinstance(topic, TopicActor)
        shell = broker.system.actor(topic.subscriptions["s"].endpoint)
        assert isinstance(shell, SubscriptionActor)
        if reliable:
            assert isinstance(topic.storage, WalStorage) and isinstance(shell.delivery, TrackedDelivery)
            # The ack moved the cursor, which the topic checkpoints in its WAL (storage.mode
            # local: the metadata store hears of a subscription only at its creation).
            wal = topic.storage.wal
            assert wal is not None
            async with asyncio.timeout(30):
                while "s" not in wal.checkpoints() or cr.decode_cursor(wal.checkpoints()["s"]).cursor != 2:
                    await asyncio.sleep(0.01)
            assert (subscription.cursor, subscription.unacked_messages) == (2, 0)
        else:
            assert isinstance(topic.storage, MemoryTail) and isinstance(shell.delivery, RuleDelivery)
            assert broker.stand_in.cursors == []  # nothing is tracked
            assert subscription.cursor is None
        assert [r.attached for r in broker.stand_in.registry] == [True]
    finally:
        client.sock.close(linger=0)


def _reads_of_live_instances(path: Path) -> list[int]:
    """Lines of `path` that call `<anything>.actor(...)` (the system's live-instance lookup)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    return [node.lineno for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "actor"]


def test_topic_and_subscription_modules_never_read_another_actors_instance() -> None:
    """Actors share nothing: the topic and subscription packages reach other actors by
    messages only, never through `system.actor(endpoint)` (the live instance, for the
    system's owner and tests)."""
    modules = sorted([*(ACTORS / "topic").glob("*.py"), *(ACTORS / "subscription").glob("*.py")])
    assert len(modules) >= 8
    offenders = {str(p.relative_to(ACTORS)): lines for p in modules if (lines := _reads_of_live_instances(p))}
    assert offenders == {}


@pytest.mark.parametrize("broker", ["wal"], indirect=True)
async def test_consumers_of_a_restarting_topic_are_told_to_re_attach(broker: Broker) -> None:
    """A topic whose handler raises is rebuilt with its subscriptions; their consumers
    are told to re-attach (`ConsumerClosed(reattach=True)`). The subscription learns it
    from the runtime, which stops a restarting actor's children as restarting, not by
    reading its topic's instance. (The failure: a `FlushDone` for a flush the WAL never
    started trips its check; a memory tail has no such message and counts it instead.)"""
    client = Client(broker)
    try:
        assert isinstance(await client.ask(lambda r: Connect(request_id=r, protocol_version=PROTOCOL_VERSION,
                                                             client_name="t")), Connected)
        subscribed = await client.ask(lambda r: cp.Subscribe(request_id=r, topic=TOPIC, subscription="s",
                                                              consumer_name="c"))
        assert isinstance(subscribed, cp.Subscribed), subscribed
        restarts = broker.system.statistics().restarts
        assert broker.system.tell(broker.topic, FlushDone(flush_id=1 << 40))
        async with asyncio.timeout(30):
            while not any(isinstance(m, cp.ConsumerClosed) for m in client.pushes):
                client.pushes.append(cp.CLIENT_PROTOCOL.decode(await client.sock.recv()))
        (closed,) = [m for m in client.pushes if isinstance(m, cp.ConsumerClosed)]
        assert closed.consumer_id == subscribed.consumer_id and closed.reattach, closed
        assert "restarted" in closed.reason
        async with asyncio.timeout(30):
            while broker.system.statistics().restarts != restarts + 1:
                await asyncio.sleep(0.01)
    finally:
        client.sock.close(linger=0)

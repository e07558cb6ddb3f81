"""A reliable topic in `wal_sync: interval` mode fsyncs its WAL on a timer message of
its own (`WalSyncDue`), not on a `FlushDone` with a made-up flush id.

The real gateway and a reliable topic run in one actor system (a stand-in broker
reserves offsets), with a client on an inproc DEALER socket; the timer's interval is an
hour, so only the message the test tells the topic fsyncs.
"""

from __future__ import annotations

import asyncio
import itertools
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import zmq
import zmq.asyncio

from danube_zmq.actors.config import BrokerConfig, BrokerSection, StorageSection
from danube_zmq.actors.gateway import Gateway
from danube_zmq.actors.ids import IdSource
from danube_zmq.actors.topic import TopicActor, WalStorage, make_topic
from danube_zmq.clock import SystemClock
from danube_zmq.runtime.actor import Actor
from danube_zmq.runtime.system import ActorSystem
from danube_zmq.transport import client_protocol as cp
from danube_zmq.transport.codec import Message
from danube_zmq.transport.common import PROTOCOL_VERSION, Connect, Connected
from danube_zmq.transport.internal_protocol import (
    OffsetsReserved,
    PersistedSubscriptions,
    ReserveOffsets,
    SubscriptionsOf,
    WalSyncDue,
)

TOPIC = "/default/interval"
_listeners = itertools.count(1)


class _Reserver(Actor):
    """The broker actor's parts here: offsets reserved at once, no persisted cursors."""

    def __init__(self) -> None:
        self.topic_endpoint = ""

    def handle_ReserveOffsets(self, msg: ReserveOffsets) -> None:
        self.system.tell(self.topic_endpoint, OffsetsReserved(until=msg.until))

    def handle_SubscriptionsOf(self, msg: SubscriptionsOf) -> PersistedSubscriptions:
        return PersistedSubscriptions(states=[])  # a new topic: none persisted


async def _ask(sock: zmq.asyncio.Socket, msg: Message) -> Message:
    await sock.send(cp.CLIENT_PROTOCOL.encode(msg))
    async with asyncio.timeout(30):
        while True:
            answer = cp.CLIENT_PROTOCOL.decode(await sock.recv())
            if getattr(answer, "request_id", None) == msg.request_id:  # type: ignore[attr-defined]
                return answer


async def test_the_periodic_fsync_is_a_message_of_its_own(tmp_path: Path) -> None:
    """A batch acknowledged in interval mode is written, not yet fsynced; telling the
    topic `WalSyncDue` fsyncs the WAL once (its `syncs` count moves), handled by its own
    handler (nothing unrecognized, no restart)."""
    context = zmq.asyncio.Context()
    system = ActorSystem(context, clock=SystemClock(), mailbox_messages_max=1024)
    executor = ThreadPoolExecutor(1)
    url = f"inproc://wal-sync-timer-{next(_listeners)}"
    config = BrokerConfig(broker=BrokerSection(listen=url),
                          storage=StorageSection(wal_sync="interval", wal_sync_interval_ms=3_600_000))
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        system.gateway_endpoint = await system.spawn(lambda: Gateway(config=config, broker_id=1), name="gateway")
        reserver = _Reserver()
        broker_endpoint = await system.spawn(lambda: reserver, name="broker")
        topic = await system.spawn(
            lambda: make_topic(name=TOPIC, dispatch_strategy=cp.DispatchStrategy.RELIABLE, config=config,
                               rng=IdSource(3), broker_endpoint=broker_endpoint, wal_dir=tmp_path / "wal",
                               executor=executor),
            name=f"topic {TOPIC}")
        reserver.topic_endpoint = system.broker_endpoint = topic
        sock.connect(url)
        assert isinstance(await _ask(sock, Connect(request_id=1, protocol_version=PROTOCOL_VERSION,
                                                   client_name="t")), Connected)
        created = await _ask(sock, cp.CreateProducer(request_id=2, topic=TOPIC, producer_name="p"))
        assert isinstance(created, cp.ProducerCreated), created
        receipt = await _ask(sock, cp.Send(request_id=3, producer_id=created.producer_id, payloads=[b"a"],
                                           publish_times=[0]))
        assert isinstance(receipt, cp.SendReceipt), receipt

        actor = system.actor(topic)
        assert isinstance(actor, TopicActor) and isinstance(actor.storage, WalStorage)
        wal = actor.storage.wal
        assert wal is not None
        syncs = wal.statistics().syncs
        before = system.actor_statistics()
        assert system.tell(topic, WalSyncDue())
        async with asyncio.timeout(30):
            while wal.statistics().syncs == syncs:
                await asyncio.sleep(0.01)
        (stats,) = [s for s in system.actor_statistics() if s.endpoint == topic]
        (old,) = [s for s in before if s.endpoint == topic]
        assert stats.unrecognized_messages == old.unrecognized_messages and stats.restarts == old.restarts == 0
        assert wal.statistics().syncs == syncs + 1
    finally:
        sock.close(linger=0)
        await system.shutdown()
        executor.shutdown()
        context.term()

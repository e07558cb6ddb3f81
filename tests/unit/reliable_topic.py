"""A reliable topic behind the real gateway, on inproc, with a client DEALER: for unit
tests of what the topic answers a client (no broker actor: `Reserver` stands in for the
parts of it a topic asks)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import zmq
import zmq.asyncio

from danube_zmq.actors.ids import IdSource
from danube_zmq.actors.sockets.gateway import Gateway
from danube_zmq.actors.topic import TopicActor, WalStorage, make_topic
from danube_zmq.clock import Clock, SystemClock
from danube_zmq.config.broker_config import BrokerConfig, BrokerSection, StorageSection
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
)

_listeners = itertools.count(1)


class Reserver(Actor):
    """The broker actor's parts here: offsets reserved at once, no persisted cursors."""

    def __init__(self) -> None:
        self.topic_endpoint = ""
        self._asked_until = 0  # asked while the topic starts, before its endpoint is known here

    def serve(self, topic_endpoint: str) -> None:
        """The topic's endpoint, once its spawn returned; a reservation it asked for
        while starting (its start awaits the disk, and this actor runs meanwhile) is
        answered now."""
        self.topic_endpoint = topic_endpoint
        if self._asked_until:
            self.system.tell(topic_endpoint, OffsetsReserved(until=self._asked_until))

    def handle_ReserveOffsets(self, msg: ReserveOffsets) -> None:
        if not self.topic_endpoint:
            self._asked_until = max(self._asked_until, msg.until)
            return
        self.system.tell(self.topic_endpoint, OffsetsReserved(until=msg.until))

    def handle_SubscriptionsOf(self, msg: SubscriptionsOf) -> PersistedSubscriptions:
        return PersistedSubscriptions(states=[])  # a new topic: none persisted


async def ask(sock: zmq.asyncio.Socket, msg: Message) -> Message:
    """Send a client request and return the answer with its request id."""
    await sock.send(cp.CLIENT_PROTOCOL.encode(msg))
    return await answer_to(sock, msg.request_id)  # type: ignore[attr-defined]


async def answer_to(sock: zmq.asyncio.Socket, request_id: int) -> Message:
    """The next answer with `request_id` (others are skipped)."""
    async with asyncio.timeout(30):
        while True:
            answer = cp.CLIENT_PROTOCOL.decode(await sock.recv())
            if getattr(answer, "request_id", None) == request_id:
                return answer


@contextlib.asynccontextmanager
async def reliable_topic(tmp_path: Path, topic_name: str, storage: StorageSection | None = None,
                         identity: bytes | None = None, clock: Clock | None = None,
                         config: BrokerConfig | None = None,
                         ) -> AsyncIterator[tuple[ActorSystem, str, WalStorage, zmq.asyncio.Socket]]:
    """The system, the topic's endpoint, its storage, and a connected client socket
    (with `identity` when given), on `clock` (the system's clock by default); `config`'s
    sections other than `broker` and `storage` apply."""
    context = zmq.asyncio.Context()
    system = ActorSystem(context, clock=clock or SystemClock(), mailbox_messages_max=1024)
    executor = ThreadPoolExecutor(1)
    url = f"inproc://reliable-topic-{next(_listeners)}"
    config = dataclasses.replace(config or BrokerConfig(), broker=BrokerSection(listen=url),
                                 storage=storage or StorageSection())
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    if identity is not None:
        sock.setsockopt(zmq.IDENTITY, identity)
    try:
        system.gateway_endpoint = await system.spawn(lambda: Gateway(config=config, broker_id=1), name="gateway")
        reserver = Reserver()
        broker_endpoint = await system.spawn(lambda: reserver, name="broker")
        topic = await system.spawn(
            lambda: make_topic(name=topic_name, dispatch_strategy=cp.DispatchStrategy.RELIABLE, config=config,
                               rng=IdSource(3), broker_endpoint=broker_endpoint, wal_dir=tmp_path / "wal",
                               executor=executor),
            name=f"topic {topic_name}")
        system.broker_endpoint = topic
        reserver.serve(topic)
        sock.connect(url)
        assert isinstance(await ask(sock, Connect(request_id=1, protocol_version=PROTOCOL_VERSION,
                                                  client_name="t")), Connected)
        actor = system.actor(topic)
        assert isinstance(actor, TopicActor) and isinstance(actor.storage, WalStorage)
        yield system, topic, actor.storage, sock
    finally:
        sock.close(linger=0)
        await system.shutdown()
        executor.shutdown()
        context.term()

"""A producer or consumer name is never left held by a connection that is gone.

When a session ends, the gateway *tells* each topic and subscription to release its
names; a tell to a full mailbox is dropped. These tests run the real gateway, topic and
subscription actors in one actor system, with a client on an inproc DEALER socket, and
lose that notice deterministically: the holder sends a burst of frames that fills the
actor's mailbox, then `Connect` again (which ends its session) in the same burst, so the
gateway handles all of it in one drain before the actor runs. The holder then vanishes;
a new connection must get the name, and a live holder must still keep it.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
import zmq
import zmq.asyncio

from danube_zmq.actors.ids import IdSource
from danube_zmq.actors.sockets.gateway import Gateway
from danube_zmq.actors.subscription import SubscriptionActor
from danube_zmq.actors.topic import TopicActor, make_topic
from danube_zmq.clock import SystemClock
from danube_zmq.config.broker_config import BrokerConfig, BrokerSection
from danube_zmq.runtime.system import ActorSystem
from danube_zmq.transport import client_protocol as cp
from danube_zmq.transport.codec import Message
from danube_zmq.transport.common import PROTOCOL_VERSION, Connect, Connected, Error
from danube_zmq.transport.errors import ErrorCode

TOPIC = "/default/names"
MAILBOX_MAX = 8
# The gateway tells a round's Sends for one topic as one message, so a burst of Sends
# fills the topic's mailbox by bytes: one Send of BURST_PAYLOAD is over this bound (an
# empty mailbox takes it), and nothing else gets in until it is handled.
MAILBOX_BYTES_MAX = 512
BURST_PAYLOAD = b"x" * 1024
_listeners = itertools.count(1)


@dataclass
class Broker:
    system: ActorSystem
    context: zmq.asyncio.Context
    url: str
    topic: str  # the topic actor's endpoint
    clients: list[RawClient]

    def topic_actor(self) -> TopicActor:
        actor = self.system.actor(self.topic)
        assert isinstance(actor, TopicActor)
        return actor

    def subscription_actor(self, name: str) -> SubscriptionActor:
        actor = self.system.actor(self.topic_actor().subscriptions[name].endpoint)
        assert isinstance(actor, SubscriptionActor)
        return actor


@pytest.fixture
async def broker() -> AsyncIterator[Broker]:
    """A gateway and one non-reliable topic; the broker actor's part in CreateProducer
    and Subscribe (finding the topic's actor) is played by pointing the system's broker
    endpoint at the one topic."""
    context = zmq.asyncio.Context()
    system = ActorSystem(context, clock=SystemClock(), mailbox_messages_max=MAILBOX_MAX,
                         mailbox_bytes_max=MAILBOX_BYTES_MAX)
    url = f"inproc://name-release-{next(_listeners)}"
    config = BrokerConfig(broker=BrokerSection(listen=url))
    system.gateway_endpoint = await system.spawn(lambda: Gateway(config=config, broker_id=1), name="gateway")
    topic = await system.spawn(
        lambda: make_topic(name=TOPIC, dispatch_strategy=cp.DispatchStrategy.NON_RELIABLE, config=config,
                           rng=IdSource(7), broker_endpoint="no-broker"),
        name=f"topic {TOPIC}")
    system.broker_endpoint = topic
    running = Broker(system=system, context=context, url=url, topic=topic, clients=[])
    yield running
    for client in running.clients:
        client.close()
    await system.shutdown()
    context.term()


class RawClient:
    """One client connection: a DEALER with a fixed identity, speaking frames."""

    def __init__(self, broker: Broker, identity: bytes) -> None:
        self.sock = broker.context.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.ROUTING_ID, identity)
        self.sock.connect(broker.url)
        # Sends that must all be queued before the event loop runs the gateway.
        self.sync = zmq.Socket.shadow(self.sock.underlying)
        self.request_ids = itertools.count(1)
        self.broker = broker
        broker.clients.append(self)

    def send_now(self, msg: Message) -> None:
        self.sync.send(cp.CLIENT_PROTOCOL.encode(msg), zmq.NOBLOCK)

    async def reply_to(self, request_id: int, timeout_s: float = 10.0) -> Message:
        """The answer to `request_id`, skipping pushes and answers to other requests."""
        async with asyncio.timeout(timeout_s):
            while True:
                msg = cp.CLIENT_PROTOCOL.decode(await self.sock.recv())
                if getattr(msg, "request_id", None) == request_id:
                    return msg

    async def ask(self, make) -> Message:
        request_id = next(self.request_ids)
        self.send_now(make(request_id))
        return await self.reply_to(request_id)

    async def connect(self) -> None:
        reply = await self.ask(lambda r: Connect(request_id=r, protocol_version=PROTOCOL_VERSION, client_name="t"))
        assert isinstance(reply, Connected), reply

    def close(self) -> None:
        self.sock.close(linger=0)


async def _connected(broker: Broker, identity: bytes) -> RawClient:
    client = RawClient(broker, identity)
    await client.connect()
    return client


async def _create_producer(client: RawClient, name: str) -> Message:
    return await client.ask(lambda r: cp.CreateProducer(request_id=r, topic=TOPIC, producer_name=name))


async def _subscribe(client: RawClient, consumer_name: str) -> Message:
    return await client.ask(lambda r: cp.Subscribe(request_id=r, topic=TOPIC, subscription="audit",
                                                   consumer_name=consumer_name, sub_type=cp.SubType.EXCLUSIVE))


async def _reconnect_behind_a_burst(client: RawClient, burst: list[Message]) -> None:
    """Send `burst` and then `Connect`, all before the gateway runs: the burst fills the
    actor's mailbox (by count, or by bytes for Sends, which the gateway groups per
    topic) and the new `Connect` ends the session, whose release notice finds that
    mailbox full."""
    assert len(burst) > MAILBOX_MAX
    # An idle topic would handle a burst of Sends on the gateway's task (`handle_now`),
    # never queued: the lost notice needs a busy topic, which it plays by refusing that path.
    client.broker.system.handle_now = lambda endpoint, msg: False
    for msg in burst:
        client.send_now(msg)
    request_id = next(client.request_ids)
    client.send_now(Connect(request_id=request_id, protocol_version=PROTOCOL_VERSION, client_name="t"))
    assert isinstance(await client.reply_to(request_id), Connected)


async def test_a_producer_name_whose_release_notice_was_lost_goes_to_the_next_connection(broker: Broker) -> None:
    """The holder's session ends while its topic's mailbox is full (so the topic never
    hears of it) and the holder vanishes: a new connection asking for the name gets it,
    and from then on a third connection is refused with PRODUCER_BUSY while the new
    holder lives."""
    holder = await _connected(broker, b"holder")
    created = await _create_producer(holder, "writer")
    assert isinstance(created, cp.ProducerCreated), created
    sends = [cp.Send(request_id=1000 + i, producer_id=created.producer_id, payloads=[BURST_PAYLOAD],
                     publish_times=[0])
             for i in range(MAILBOX_MAX + 4)]
    await _reconnect_behind_a_burst(holder, sends)
    holder.close()
    # The notice was lost: the topic still lists the name under the departed session.
    assert "writer" in broker.topic_actor().producer_ids_by_name

    successor = await _connected(broker, b"successor")
    taken = await _create_producer(successor, "writer")
    assert isinstance(taken, cp.ProducerCreated), taken
    intruder = await _connected(broker, b"intruder")
    refused = await _create_producer(intruder, "writer")
    assert isinstance(refused, Error) and refused.code == ErrorCode.PRODUCER_BUSY, refused


@pytest.mark.parametrize("successor_name", ["reader", "successor"], ids=["same-name", "other-name"])
async def test_an_exclusive_consumer_whose_release_notice_was_lost_gives_way(broker: Broker,
                                                                             successor_name: str) -> None:
    """The holder of an Exclusive subscription ends its session while the subscription's
    mailbox is full, then vanishes: a new connection subscribing with the same consumer
    name or another name (else CONSUMER_BUSY either way) is attached, and a third
    connection is then refused while the new consumer lives."""
    holder = await _connected(broker, b"holder")
    subscribed = await _subscribe(holder, "reader")
    assert isinstance(subscribed, cp.Subscribed), subscribed
    flows = [cp.Flow(consumer_id=subscribed.consumer_id, permits=1) for _ in range(MAILBOX_MAX + 4)]
    await _reconnect_behind_a_burst(holder, flows)
    holder.close()
    assert [c.name for c in broker.subscription_actor("audit").consumers.values()] == ["reader"]

    successor = await _connected(broker, b"successor")
    taken = await _subscribe(successor, successor_name)
    assert isinstance(taken, cp.Subscribed), taken
    intruder = await _connected(broker, b"intruder")
    refused = await _subscribe(intruder, successor_name)
    assert isinstance(refused, Error) and refused.code == ErrorCode.CONSUMER_BUSY, refused
    refused = await _subscribe(intruder, "third")
    assert isinstance(refused, Error) and refused.code == ErrorCode.CONSUMER_BUSY, refused

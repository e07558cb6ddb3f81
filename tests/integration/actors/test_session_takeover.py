"""A session cannot be taken by its routing id (issue 37, finding 3), through real sockets.

The attack: a DEALER that knows a consumer's routing id connects with it, with a CURVE
key of its own and no token (security.mode curve) or plainly (mode none), and sends one
Ping. Before the fix the broker's ROUTER handed the victim's identity over to the new
pipe (ROUTER_HANDOVER) and every later `Deliver` went to the attacker. Now a pipe never
displaces a live one with the same routing id, and a frame that does reach the gateway
with another key than its session's ends that session and cuts the connection it came
on, so nothing of the session can be routed to it.
"""

from __future__ import annotations

import asyncio
import random
import time

import zmq
import zmq.asyncio

from danube_zmq import DanubeClient, SubType
from danube_zmq.client.client import DanubeClient as _Client
from danube_zmq.transport import client_protocol as cp
from danube_zmq.transport.common import Ping
from tests.integration.conftest import BrokerProcess, CurveKeys

TOPIC = "/default/takeover"
MESSAGES = 40
WATCH_S = 3.0


def _identity_of(client: _Client) -> bytes:
    [connection] = client._connections.values()
    sock = connection._socket
    assert sock is not None
    return sock.getsockopt(zmq.IDENTITY)


async def _attack(url: str, identity: bytes, server_key: str | None) -> list[object]:
    """Dial with the victim's routing id, send one Ping, and collect every frame the
    broker sends this pipe for WATCH_S seconds while the victim's messages flow."""
    ctx = zmq.asyncio.Context.instance()
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.setsockopt(zmq.IDENTITY, identity)
    if server_key is not None:
        public, secret = zmq.curve_keypair()
        dealer.setsockopt(zmq.CURVE_SERVERKEY, server_key.encode())
        dealer.setsockopt(zmq.CURVE_PUBLICKEY, public)
        dealer.setsockopt(zmq.CURVE_SECRETKEY, secret)
    dealer.connect(url)
    received: list[object] = []
    try:
        await dealer.send(cp.CLIENT_PROTOCOL.encode(Ping(request_id=1)))
        deadline = time.monotonic() + WATCH_S
        while (left := deadline - time.monotonic()) > 0:
            if await dealer.poll(int(left * 1000)):
                received.append(cp.CLIENT_PROTOCOL.decode(await dealer.recv()))
    finally:
        dealer.close(linger=0)
    return received


async def _victim_keeps_its_messages(url: str, server_key: str | None, client_keys: str | None) -> None:
    keys = {} if server_key is None else {"server_public_key": server_key, "client_keys": client_keys}
    async with DanubeClient(url, **keys) as client:
        producer = await client.create_producer(TOPIC)
        consumer = await client.subscribe(TOPIC, "victim", sub_type=SubType.EXCLUSIVE)
        async with DanubeClient(url, **keys) as other:
            identity = _identity_of(client)
            other_producer = await other.create_producer(TOPIC)
            attack = asyncio.create_task(_attack(url, identity, server_key))
            await asyncio.sleep(0.5)  # the attacker's pipe is up and has sent its Ping
            for i in range(MESSAGES):
                await other_producer.send(f"m{i}".encode())
                await asyncio.sleep(WATCH_S / 2 / MESSAGES)
            stolen = await attack
        delivered = [m for m in stolen if isinstance(m, cp.Deliver)]
        assert not delivered, f"the attacker received {len(delivered)} of the victim's Delivers"
        got: list[bytes] = []
        while len(got) < MESSAGES:
            message = await asyncio.wait_for(consumer.receive(), timeout=10)
            got.append(message.payload)
            await consumer.ack(message)
        assert got == [f"m{i}".encode() for i in range(MESSAGES)]
        await producer.send(b"still mine")  # the victim's session is its own still


async def test_a_routing_id_does_not_take_a_curve_session(curve_broker: BrokerProcess,
                                                           curve_keys: CurveKeys) -> None:
    await _victim_keeps_its_messages(curve_broker.url, curve_keys.server_public_key,
                                     str(curve_keys.client_secret_file))


async def test_a_routing_id_does_not_take_a_session_in_mode_none(broker: BrokerProcess) -> None:
    """Mode none authenticates nobody, yet a live connection is not displaced either."""
    await _victim_keeps_its_messages(broker.url, None, None)


async def test_routing_ids_and_names_do_not_come_from_the_clients_rng(broker: BrokerProcess) -> None:
    """The client's `rng` (a Mersenne Twister, injectable for its backoff jitter) once drew
    routing ids and names too, so whoever saw a few of its outputs, or seeded it, could
    tell the next id. Two clients given the same seeded rng now differ in both."""
    identities, names = [], []
    for _ in range(2):
        async with DanubeClient(broker.url, rng=random.Random(1)) as client:
            await client.create_producer(TOPIC)
            identities.append(_identity_of(client))
            names.append(client.client_name)
    assert identities[0] != identities[1] and names[0] != names[1]
    assert len(identities[0]) == 16 and identities[0][0] != 0

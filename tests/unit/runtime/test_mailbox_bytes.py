"""A topic's mailbox is bounded in bytes as well as in messages, and a producer whose
batches pass the byte bound is told to retry (RESOURCE_EXHAUSTED), as at the count bound.

The real gateway and a non-reliable topic run in one actor system, with a client on an
inproc DEALER socket. The client sends a burst of large batches before the event loop
runs the gateway, so the gateway forwards all of them in one drain before the topic
handles any: what the topic's mailbox takes is decided by its bounds alone.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator

import pytest
import zmq
import zmq.asyncio

from danube_zmq.actors.ids import IdSource
from danube_zmq.actors.sockets.gateway import Gateway
from danube_zmq.actors.topic import make_topic
from danube_zmq.clock import SystemClock
from danube_zmq.config.broker_config import BrokerConfig, BrokerSection
from danube_zmq.runtime.system import ActorSystem
from danube_zmq.transport import client_protocol as cp
from danube_zmq.transport.codec import Message
from danube_zmq.transport.common import PROTOCOL_VERSION, Connect, Connected, Error
from danube_zmq.transport.errors import ErrorCode

TOPIC = "/default/bytes"
KIB = 1024
MAILBOX_BYTES_MAX = 256 * KIB
BATCH_BYTES = 64 * KIB
_listeners = itertools.count(1)


@pytest.fixture
async def client() -> AsyncIterator[tuple[ActorSystem, zmq.asyncio.Socket]]:
    """A gateway and one non-reliable topic (the broker actor's part in CreateProducer is
    played by pointing the system's broker endpoint at the topic), mailboxes bounded at
    10,000 messages and 256 KiB, and a connected client."""
    context = zmq.asyncio.Context()
    system = ActorSystem(context, clock=SystemClock(), mailbox_messages_max=10_000, mailbox_bytes_max=MAILBOX_BYTES_MAX)
    url = f"inproc://mailbox-bytes-{next(_listeners)}"
    config = BrokerConfig(broker=BrokerSection(listen=url))
    system.gateway_endpoint = await system.spawn(lambda: Gateway(config=config, broker_id=1), name="gateway")
    system.broker_endpoint = await system.spawn(
        lambda: make_topic(name=TOPIC, dispatch_strategy=cp.DispatchStrategy.NON_RELIABLE, config=config,
                           rng=IdSource(7), broker_endpoint="no-broker"),
        name=f"topic {TOPIC}")
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(url)
    try:
        yield system, sock
    finally:
        sock.close(linger=0)
        await system.shutdown()
        context.term()


async def _answers(sock: zmq.asyncio.Socket, request_ids: set[int]) -> dict[int, Message]:
    found: dict[int, Message] = {}
    async with asyncio.timeout(30):
        while set(found) != request_ids:
            msg = cp.CLIENT_PROTOCOL.decode(await sock.recv())
            request_id = getattr(msg, "request_id", None)
            if request_id in request_ids:
                found[request_id] = msg
    return found


def _send_now(sock: zmq.asyncio.Socket, msg: Message) -> None:
    # Through a sync view of the socket: queued at once, before the event loop runs the gateway.
    zmq.Socket.shadow(sock.underlying).send(cp.CLIENT_PROTOCOL.encode(msg), zmq.NOBLOCK)


async def test_batches_past_a_topics_mailbox_bytes_are_refused_as_retriable(client) -> None:
    """Twelve 64 KiB batches at once, far under the count bound: the topic's mailbox takes
    them until the next would pass 256 KiB, the rest are answered RESOURCE_EXHAUSTED
    (every batch is answered, none is lost silently), and a refused batch sent again
    once the topic caught up is received."""
    system, sock = client
    _send_now(sock, Connect(request_id=1, protocol_version=PROTOCOL_VERSION, client_name="t"))
    assert isinstance((await _answers(sock, {1}))[1], Connected)
    _send_now(sock, cp.CreateProducer(request_id=2, topic=TOPIC, producer_name="p"))
    created = (await _answers(sock, {2}))[2]
    assert isinstance(created, cp.ProducerCreated), created

    def batch(request_id: int) -> cp.Send:
        return cp.Send(request_id=request_id, producer_id=created.producer_id, payloads=[b"x" * BATCH_BYTES],
                       publish_times=[0])

    # An idle topic would handle the burst on the gateway's task (`handle_now`), never
    # queued: the bound is for a busy topic, which this one plays by refusing that path.
    system.handle_now = lambda endpoint, msg: False
    burst = range(100, 112)
    for request_id in burst:
        _send_now(sock, batch(request_id))
    answers = await _answers(sock, set(burst))
    received = [r for r in burst if isinstance(answers[r], cp.SendReceipt)]
    refused = [r for r in burst if isinstance(answers[r], Error)]
    assert sorted(received + refused) == list(burst), answers
    # 256 KiB holds three batches and their envelopes, not four.
    assert received == list(burst)[:3], answers
    assert all(answers[r].code == ErrorCode.RESOURCE_EXHAUSTED and "retry" in answers[r].message for r in refused)
    # The gateway tells a round's batches for one topic as one message (`ClientRequests`,
    # cut at the mailbox's byte bound): a refused group is one drop.
    assert 1 <= system.statistics().mailbox_full_drops <= len(refused)

    _send_now(sock, batch(refused[0]))
    again = (await _answers(sock, {refused[0]}))[refused[0]]
    assert isinstance(again, cp.SendReceipt), again


async def test_a_refused_oversized_message_costs_the_read_budget_one_request_not_its_parts(client) -> None:
    """A message of more parts than requests_per_message_max is refused whole with one
    answer: it must cost the gateway's read budget one request, not its part count (a
    hostile client sending 100,000 empty parts would otherwise put the gateway ~200
    rounds in debt, reading nobody's requests meanwhile). The round is run here, before
    the event loop runs the gateway's task (inproc delivers at once)."""
    system, sock = client
    zmq.Socket.shadow(sock.underlying).send_multipart([b""] * 100_000)
    gateway = system.actor(system.gateway_endpoint)
    gateway._read_router(lambda fd, received: None)  # type: ignore[attr-defined]
    parts_max = gateway.config.limits.requests_per_message_max  # type: ignore[attr-defined]
    assert gateway._read_carry >= -parts_max, gateway._read_carry  # type: ignore[attr-defined]
    answer = (await _answers(sock, {0}))[0]
    assert isinstance(answer, Error) and answer.code == ErrorCode.INVALID_ARGUMENT, answer

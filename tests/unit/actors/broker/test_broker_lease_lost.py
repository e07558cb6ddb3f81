"""A broker that lost its lease answers at once (`actors/broker/broker.py` `_serve`): found by
chaos scenario B4, where clients still reaching an owner cut off from the Raft majority
had their `CreateProducer` parked without an answer until `cluster.request_timeout_ms`,
again and again through the partition, so the first acknowledgement came ~24 s after
the heal. The real `BrokerActor` joined to a real single-voter store in a real
`ActorSystem`; client requests told to it as the gateway tells them, answers read from
the client outbox (an inproc PULL standing in for the gateway's)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path

import zmq
import zmq.asyncio

from danube_zmq.actors.broker.broker import BrokerActor
from danube_zmq.config.broker_config import ClusterSection
from danube_zmq.consensus.metadata_store import RaftMetadataStore
from danube_zmq.runtime.actor import CLIENT_OUTBOX
from danube_zmq.runtime.system import ActorSystem
from danube_zmq.transport import client_protocol as cp
from danube_zmq.transport import cluster_records as cr
from danube_zmq.transport.client_protocol import CLIENT_PROTOCOL
from danube_zmq.transport.codec import Message
from danube_zmq.transport.common import Error
from danube_zmq.transport.errors import Unavailable
from danube_zmq.transport.internal_protocol import ClientRequest, LeaseChanged
from tests.unit.joined_broker import BROKER_ID, DEADLINE_S, joined_broker

TOPIC = "/default/leased"
IDENTITY = b"client-connection"
# A parked request is refused only after this: far past DEADLINE_S, so an answer within
# the deadline can only be the broker's own.
PARKED_FOR_MS = 600_000


class Joined:
    def __init__(self, store: RaftMetadataStore, system: ActorSystem, broker: BrokerActor,
                 outbox: zmq.asyncio.Socket) -> None:
        self.store, self.system, self.broker, self.outbox = store, system, broker, outbox

    def tell(self, msg: Message) -> None:
        assert self.system.tell(self.broker.endpoint, ClientRequest(identity=IDENTITY,
                                                                    frame=CLIENT_PROTOCOL.encode(msg)))

    async def answer(self) -> Message:
        try:
            async with asyncio.timeout(DEADLINE_S):
                identity, frame = await self.outbox.recv_multipart()
        except TimeoutError:
            raise AssertionError(f"no answer within {DEADLINE_S} s") from None
        assert identity == IDENTITY
        return CLIENT_PROTOCOL.decode(frame)

    async def until(self, condition: object, what: str) -> None:
        deadline = time.monotonic() + DEADLINE_S
        while not condition():  # type: ignore[operator]
            assert time.monotonic() < deadline, f"never: {what}"
            await asyncio.sleep(0.01)


@contextlib.asynccontextmanager
async def _joined(tmp_path: Path) -> AsyncIterator[Joined]:
    async with joined_broker(tmp_path, CLIENT_OUTBOX, ClusterSection(request_timeout_ms=PARKED_FOR_MS)) as (
            store, system, broker, outbox):
        joined = Joined(store, system, broker, outbox)
        await store.put(cr.topic_record_key(TOPIC), cr.encode(cr.TopicRecord(
            dispatch_strategy=cp.DispatchStrategy.NON_RELIABLE, partitions=0, created_ms=0)))
        await store.put(cr.assignment_key(TOPIC), cr.encode(cr.Assignment(broker_id=BROKER_ID, epoch=1,
                                                                          assigned_ms=0)))
        await joined.until(lambda: TOPIC in broker.topics, "the topic was loaded")
        yield joined

async def _lose_the_lease(joined: Joined) -> None:
    """What the lease keeper does when a renewal fails; the keeper is stopped first so
    that its next renewal (the store is fine here) does not give the lease back."""
    keeper = next(s.endpoint for s in joined.system.actor_statistics() if s.name == f"lease keeper {BROKER_ID}")
    await joined.system.stop(keeper)
    await joined.system.send(joined.broker.endpoint, LeaseChanged(held=False))
    await joined.until(lambda: not joined.broker.lease_held and TOPIC not in joined.broker.topics,
                       "the broker unloaded its topic")


async def test_a_broker_that_lost_its_lease_refuses_a_producer_at_once_as_unavailable(tmp_path: Path) -> None:
    """Its store still says the topic is assigned here, but the lease is gone (another
    broker may take the topic): `CreateProducer` and `Lookup` are answered UNAVAILABLE
    (retriable) at once, naming the lease, instead of parked for request_timeout_ms
    (ten minutes here), so the client's retry finds the topic's next broker."""
    async with _joined(tmp_path) as joined:
        await _lose_the_lease(joined)
        joined.tell(cp.CreateProducer(request_id=3, topic=TOPIC, producer_name="p"))
        answer = await joined.answer()
        assert isinstance(answer, Error), answer
        assert (answer.request_id, answer.code) == (3, Unavailable.code)
        assert "lease" in answer.message and "retry" in answer.message, answer.message
        joined.tell(cp.Lookup(request_id=4, topic=TOPIC))
        answer = await joined.answer()
        assert isinstance(answer, Error), answer
        assert (answer.request_id, answer.code) == (4, Unavailable.code)
        assert not joined.broker.parked


async def test_a_broker_that_never_held_its_lease_still_parks_until_it_does(tmp_path: Path) -> None:
    """The other side of the rule: a request for a topic whose assignment arrives later
    still waits (parked, no answer) while the broker holds its lease, and is served
    when the topic is loaded, as before."""
    async with _joined(tmp_path) as joined:
        other = "/default/later"
        await joined.store.put(cr.topic_record_key(other), cr.encode(cr.TopicRecord(
            dispatch_strategy=cp.DispatchStrategy.NON_RELIABLE, partitions=0, created_ms=0)))
        joined.tell(cp.Lookup(request_id=5, topic=other))
        await joined.until(lambda: other in joined.broker.parked, "the lookup was parked")
        assert not await joined.outbox.poll(0), "answered while parked"
        await joined.store.put(cr.assignment_key(other), cr.encode(cr.Assignment(broker_id=BROKER_ID, epoch=1,
                                                                                 assigned_ms=0)))
        answer = await joined.answer()
        assert isinstance(answer, cp.LookupResult), answer
        assert (answer.request_id, answer.kind) == (5, cp.LookupKind.CONNECT)


async def test_requests_parked_when_the_lease_is_lost_are_refused_at_once(tmp_path: Path) -> None:
    """A lookup parked for a topic with no broker yet is answered UNAVAILABLE as soon as
    the lease is lost, not after its ten minutes."""
    async with _joined(tmp_path) as joined:
        other = "/default/later"
        await joined.store.put(cr.topic_record_key(other), cr.encode(cr.TopicRecord(
            dispatch_strategy=cp.DispatchStrategy.NON_RELIABLE, partitions=0, created_ms=0)))
        joined.tell(cp.Lookup(request_id=6, topic=other))
        await joined.until(lambda: other in joined.broker.parked, "the lookup was parked")
        await _lose_the_lease(joined)
        answer = await joined.answer()
        assert isinstance(answer, Error), answer
        assert (answer.request_id, answer.code) == (6, Unavailable.code)
        assert "lease" in answer.message, answer.message
        assert not joined.broker.parked and joined.broker.parked.count == 0

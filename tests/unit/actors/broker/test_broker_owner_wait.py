"""An admin request about a partition between brokers waits for its assignment
(`actors/broker/admin_reach.py` `on_owner`): the real `BrokerActor` joined to a real
single-voter store in a real `ActorSystem`, the request told to it as the admin gateway
tells it (`AdminRequest`), its answer read from the admin outbox (an inproc PULL
standing in for the admin gateway's)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import zmq
import zmq.asyncio

from danube_zmq.actors.broker import admin_reach
from danube_zmq.actors.broker.broker import BrokerActor
from danube_zmq.consensus.metadata_store import RaftMetadataStore
from danube_zmq.runtime.actor import ADMIN_OUTBOX
from danube_zmq.runtime.system import ActorSystem
from danube_zmq.transport import admin_protocol as ap
from danube_zmq.transport import client_protocol as cp
from danube_zmq.transport import cluster_records as cr
from danube_zmq.transport.admin_protocol import ADMIN_PROTOCOL
from danube_zmq.transport.codec import Message
from danube_zmq.transport.common import Error
from danube_zmq.transport.errors import Unavailable
from danube_zmq.transport.internal_protocol import AdminRequest
from tests.unit.joined_broker import BROKER_ID, DEADLINE_S, joined_broker

TOPIC = "/default/waiting"
IDENTITY = b"admin-client"


class Joined:
    """A broker joined to its store, and the admin outbox's other end."""

    def __init__(self, store: RaftMetadataStore, system: ActorSystem, broker: BrokerActor,
                 outbox: zmq.asyncio.Socket) -> None:
        self.store, self.system, self.broker, self.outbox = store, system, broker, outbox

    async def ask_admin(self, request_id: int) -> None:
        """Tell the broker a `DescribeTopic` of TOPIC, as the admin gateway does."""
        frame = ADMIN_PROTOCOL.encode(ap.DescribeTopic(request_id=request_id, topic=TOPIC))
        assert self.system.tell(self.broker.endpoint, AdminRequest(identity=IDENTITY, frame=frame))

    async def answer(self) -> Message:
        try:
            identity, frame = await asyncio.wait_for(self.outbox.recv_multipart(), DEADLINE_S)
        except TimeoutError:
            raise AssertionError(f"no answer within {DEADLINE_S} s") from None
        assert identity == IDENTITY
        return ADMIN_PROTOCOL.decode(frame)

    async def until_waiting(self) -> None:
        """The request is in the broker's `owner_waits` for TOPIC (it holds no answer)."""
        deadline = time.monotonic() + DEADLINE_S
        while not self.broker.reach.owner_waits.get(TOPIC):
            assert time.monotonic() < deadline, "the request never waited for the topic's owner"
            await asyncio.sleep(0.01)
        assert not await self.outbox.poll(0), "answered while it waits"


@contextlib.asynccontextmanager
async def _joined(tmp_path: Path) -> AsyncIterator[Joined]:
    async with joined_broker(tmp_path, ADMIN_OUTBOX) as (store, system, broker, outbox):
        await store.put(cr.topic_record_key(TOPIC), cr.encode(cr.TopicRecord(
            dispatch_strategy=cp.DispatchStrategy.NON_RELIABLE, partitions=0, created_ms=0)))
        yield Joined(store, system, broker, outbox)

async def test_a_request_for_a_topic_between_brokers_is_answered_when_its_assignment_arrives(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A describe of a topic with no broker yet waits (its future in `owner_waits`, no
    answer). The owner wait is made ten minutes long, so only the broker's handling of
    the assignment (`_wake`, `AdminReach.wake`) can end it within the test's deadline: once the topic is
    assigned here, the broker loads it and the request is answered with its
    description, served by this broker; nothing is left waiting."""
    monkeypatch.setattr(admin_reach, "OWNER_WAIT_MS", 600_000)
    async with _joined(tmp_path) as joined:
        await joined.ask_admin(request_id=7)
        await joined.until_waiting()
        await joined.store.put(cr.assignment_key(TOPIC), cr.encode(cr.Assignment(
            broker_id=BROKER_ID, epoch=1, assigned_ms=0)))
        answer = await joined.answer()
        assert isinstance(answer, ap.TopicDescription), answer
        assert (answer.request_id, answer.name, answer.broker_id) == (7, TOPIC, BROKER_ID)
        assert [p.name for p in answer.partitions] == [TOPIC]
        assert TOPIC in joined.broker.topics and not joined.broker.reach.owner_waits


async def test_a_request_for_a_topic_never_assigned_is_refused_unavailable_after_the_wait(tmp_path: Path) -> None:
    """With no assignment coming, the same request is answered UNAVAILABLE ("no broker
    right now; retry", retriable) once the 3 s wait is over, not before, and its
    future leaves `owner_waits`. An assignment of another topic meanwhile does not end
    the wait."""
    async with _joined(tmp_path) as joined:
        started = time.monotonic()
        await joined.ask_admin(request_id=8)
        await joined.until_waiting()
        await joined.store.put(cr.assignment_key("/default/other"), cr.encode(cr.Assignment(
            broker_id=2, epoch=1, assigned_ms=0)))
        answer = await joined.answer()
        waited_s = time.monotonic() - started
        assert isinstance(answer, Error), answer
        assert (answer.request_id, answer.code) == (8, Unavailable.code)
        assert answer.message == f"topic {TOPIC} has no broker right now; retry"
        assert waited_s >= admin_reach.OWNER_WAIT_MS / 1000
        assert not joined.broker.reach.owner_waits


async def test_a_partitioned_topic_is_described_with_its_unserved_partition_marked(tmp_path: Path) -> None:
    """A describe of a 2-partition topic whose partition 0 is served here and partition 1
    never gets a broker is answered after the wait (not refused): partition 0 with this
    broker's id and URL, partition 1 unassigned (no broker) and saying why."""
    base = "/default/halves"
    async with _joined(tmp_path) as joined:
        await joined.store.put(cr.topic_record_key(base), cr.encode(cr.TopicRecord(
            dispatch_strategy=cp.DispatchStrategy.NON_RELIABLE, partitions=2, created_ms=0)))
        await joined.store.put(cr.assignment_key(f"{base}-part-0"), cr.encode(cr.Assignment(
            broker_id=BROKER_ID, epoch=1, assigned_ms=0)))
        deadline = time.monotonic() + DEADLINE_S
        while f"{base}-part-0" not in joined.broker.topics:
            assert time.monotonic() < deadline, "partition 0 was never loaded"
            await asyncio.sleep(0.01)
        frame = ADMIN_PROTOCOL.encode(ap.DescribeTopic(request_id=9, topic=base))
        assert joined.system.tell(joined.broker.endpoint, AdminRequest(identity=IDENTITY, frame=frame))
        answer = await joined.answer()
        assert isinstance(answer, ap.TopicDescription), answer
        served, unserved = answer.partitions
        assert (served.name, served.broker_id, served.broker_url, served.not_served) == (
            f"{base}-part-0", BROKER_ID, "tcp://127.0.0.1:1", None)
        assert (unserved.name, unserved.broker_id, unserved.broker_url) == (f"{base}-part-1", None, None)
        assert unserved.not_served == f"topic {base}-part-1 has no broker right now; retry"
        assert not joined.broker.reach.owner_waits

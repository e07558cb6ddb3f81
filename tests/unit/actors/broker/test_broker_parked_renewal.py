"""A request parked because its topic's owner missed a lease renewal is answered once
that owner renews (`actors/broker/broker.py` `_elsewhere`, `handle_ParkedExpired`): found by
chaos B1, where a producer re-attaching through another broker after its owner's kill -9
and restart had its lookup parked there until `cluster.request_timeout_ms` ran out,
though the restarted owner renewed within a second (first acknowledgements 5-9 s after
the restart). The real `BrokerActor` joined to a real single-voter store, as in
test_broker_lease_lost.py."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from danube_zmq.transport import client_protocol as cp
from danube_zmq.transport import cluster_records as cr
from tests.unit.actors.broker.test_broker_lease_lost import _joined
from tests.unit.joined_broker import DEADLINE_S

OWNER = 2
OWNER_URL = "tcp://10.0.0.2:6650"
TOPIC = "/default/owned-elsewhere"
TTL_MS = 3_000


async def _register_owner(store: object) -> None:
    await store.put_with_ttl(cr.register_key(OWNER), cr.encode(cr.BrokerRegistration(  # type: ignore[attr-defined]
        broker_id=OWNER, broker_url=OWNER_URL, admin_url="tcp://10.0.0.2:50051", raft_node_id=2, started_ms=0)),
        TTL_MS)


async def test_a_lookup_parked_for_an_owner_that_missed_a_renewal_is_redirected_when_it_renews(
        tmp_path: Path) -> None:
    """The owner's registration goes unrenewed past half its TTL: a lookup of its topic
    is parked here (no answer), as `_elsewhere` says. The owner renews: the lookup is
    answered REDIRECT to the owner's URL within the test's deadline, far inside the ten
    minutes it would otherwise wait."""
    async with _joined(tmp_path) as joined:
        store = joined.store
        await store.put(cr.topic_record_key(TOPIC), cr.encode(cr.TopicRecord(
            dispatch_strategy=cp.DispatchStrategy.NON_RELIABLE, partitions=0, created_ms=0)))
        await _register_owner(store)
        await store.put(cr.assignment_key(TOPIC), cr.encode(cr.Assignment(broker_id=OWNER, epoch=1, assigned_ms=0)))
        deadline = time.monotonic() + DEADLINE_S
        while not store.stopped_renewing(cr.register_key(OWNER)):
            assert time.monotonic() < deadline, "the owner's registration never went stale"
            await asyncio.sleep(0.05)
        joined.tell(cp.Lookup(request_id=9, topic=TOPIC))
        await joined.until(lambda: TOPIC in joined.broker.parked, "the lookup was parked")
        assert not await joined.outbox.poll(0), "answered while its owner is silent"
        await _register_owner(store)
        answer = await joined.answer()
        assert isinstance(answer, cp.LookupResult), answer
        assert (answer.request_id, answer.kind, answer.broker_url) == (9, cp.LookupKind.REDIRECT, OWNER_URL)
        assert TOPIC not in joined.broker.parked

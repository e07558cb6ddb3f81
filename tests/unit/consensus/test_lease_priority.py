"""Lease renewals (TTL puts) go ahead of bulk metadata writes in a Raft peer's queue:
a real single-voter peer (LevelDB log, no sockets), proposals queued before its loop
runs, the order they are applied in read from their revisions."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from danube_zmq.consensus.metadata_store import RaftMetadataStore
from danube_zmq.consensus.peer import RaftPeer, renews_ttl
from danube_zmq.consensus.raft import RaftConfig
from danube_zmq.consensus.state_machine import (
    Batch,
    Delete,
    ExpireTtlKeys,
    KeyValue,
    Put,
    PutWithTtl,
    encode_command,
)

TTL_MS = 6_000


def _peer(tmp_path: Path, events_max: int = 10_000) -> RaftMetadataStore:
    peer = RaftPeer(1, tmp_path, None, {}, RaftConfig(node_id=1), 10, events_max=events_max,
                    ttl_check_interval_s=3600)
    return RaftMetadataStore(peer, owns_peer=True)


def _bulk(n: int) -> Batch:
    return Batch(puts=[KeyValue(key=f"/bulk/{n}/{i}", value=b"x" * 64) for i in range(256)], deletes=[], expect=[])


def test_only_ttl_puts_are_renewals() -> None:
    """The leader tells a forwarded renewal from its bytes alone: a `PutWithTtl` is
    one, every other command (a plain put, a batch, an expiry, a delete) is not."""
    assert renews_ttl(encode_command(PutWithTtl(key="/cluster/register/1", value=b"r", ttl_ms=TTL_MS, now_ms=1)))
    assert renews_ttl(encode_command(PutWithTtl(key="k" * 5000, value=b"v" * 70_000, ttl_ms=1 << 40,
                                                now_ms=(1 << 62) - 1)))
    for other in (Put(key="/cluster/register/1", value=b"r"), _bulk(0), ExpireTtlKeys(now_ms=1), Delete(key="k")):
        assert not renews_ttl(encode_command(other)), other
    assert not renews_ttl(b"") and not renews_ttl(b"\x95")


async def test_a_renewal_queued_behind_bulk_writes_is_applied_before_them(tmp_path: Path) -> None:
    """Forty batches of 256 keys are queued, then a lease renewal: the renewal is
    applied first (lowest revision). Before, the peer took its queue in order and the
    renewal waited for every batch ahead of it to be appended, replicated and applied."""
    async with _peer(tmp_path) as store:
        bulk = [asyncio.create_task(store.transaction({}, {kv.key: kv.value for kv in _bulk(n).puts}))
                for n in range(40)]
        renewal = asyncio.create_task(store.put_with_ttl("/cluster/register/2", b"r", TTL_MS))
        await asyncio.gather(*bulk, renewal)
        renewed_at = renewal.result().mod_revision
        first_bulk = min(store.peer.state.get(f"/bulk/{n}/0").mod_revision for n in range(40))  # type: ignore[union-attr]
        assert renewed_at < first_bulk, (renewed_at, first_bulk)


async def test_a_renewal_sent_before_its_lease_ran_out_outruns_a_queued_expiry(tmp_path: Path) -> None:
    """A registration due now; the leader has queued `ExpireTtlKeys(now)` behind bulk
    writes when the broker's renewal (sent a second ago) reaches it. The registration
    is never deleted: its key keeps its create revision and no delete event is in the
    history. Before, the expiry went first and deleted it (the load manager then saw
    the broker gone, and failed its topics over after a third of the lease)."""
    async with _peer(tmp_path) as store:
        now_ms = int(time.time() * 1000)
        key = "/cluster/register/2"
        first = await store.peer.propose(PutWithTtl(key=key, value=b"r", ttl_ms=TTL_MS, now_ms=now_ms - TTL_MS))
        created = first.value.create_revision  # type: ignore[union-attr]
        bulk = [asyncio.create_task(store.transaction({}, {kv.key: kv.value for kv in _bulk(n).puts}))
                for n in range(10)]
        expiry = asyncio.create_task(store.peer.propose(ExpireTtlKeys(now_ms=now_ms)))
        renewal = asyncio.create_task(store.peer.propose(
            PutWithTtl(key=key, value=b"r", ttl_ms=TTL_MS, now_ms=now_ms - 1_000)))
        await asyncio.gather(*bulk, expiry, renewal)
        current = store.peer.state.get(key)
        assert current is not None and current.create_revision == created
        assert not [e for e in store.peer.state.events_since("/cluster/register/", 0) if e.value is None]


async def test_a_full_queue_of_bulk_writes_does_not_refuse_a_renewal(tmp_path: Path) -> None:
    """With the peer's event queue full of bulk proposals (a client gets
    RESOURCE_EXHAUSTED), a lease renewal is still taken and committed: renewals have
    their own bounded lane."""
    async with _peer(tmp_path, events_max=8) as store:
        bulk = [asyncio.create_task(store.put(f"/bulk/{n}", b"x")) for n in range(8)]
        await asyncio.sleep(0)  # each has queued its proposal
        from danube_zmq.transport.errors import ResourceExhausted
        with pytest.raises(ResourceExhausted):
            await store.put("/bulk/one-too-many", b"x")
        renewed = await store.put_with_ttl("/cluster/register/2", b"r", TTL_MS)
        assert renewed.version == 1
        await asyncio.gather(*bulk)

"""Raft TTLs (broker leases, load reports, fencing) run on the injected clock, as the
rest of the broker does: a single-voter peer whose clock is a fake, the TTL stamped and
expired by it alone."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from danube_zmq.clock import ManualClock
from danube_zmq.consensus.metadata_store import RaftMetadataStore
from danube_zmq.consensus.peer import RaftPeer
from danube_zmq.consensus.raft import RaftConfig

HOUR_MS = 3_600_000


async def test_a_ttl_is_stamped_and_expired_by_the_injected_clock(tmp_path: Path) -> None:
    """A key put with a 1-hour TTL carries an expiry one hour past the fake clock's
    now (a day behind the wall), stays while the fake clock stands still, and is
    expired once the fake clock moves two hours on. Before, both the stamp and the
    expiry check read `time.time()`: the key's expiry was a day off the fake clock,
    and moving it changed nothing."""
    wall_ms = int(time.time() * 1000) - 24 * HOUR_MS  # a day before now: moves only when told
    clock = ManualClock(monotonic_ms=wall_ms, now_ms=wall_ms)
    peer = RaftPeer(1, tmp_path, None, {}, RaftConfig(node_id=1), 10, ttl_check_interval_s=0.02, clock=clock)
    async with RaftMetadataStore(peer, owns_peer=True) as store:
        written = await store.put_with_ttl("/cluster/register/7", b"r", HOUR_MS)
        assert written.expires_at_ms == clock.now_ms() + HOUR_MS
        await asyncio.sleep(0.2)  # ten expiry checks: nothing is due on the fake clock
        assert store.peer.state.get("/cluster/register/7") is not None
        clock.advance(2 * HOUR_MS)
        deadline = time.monotonic() + 30
        while store.peer.state.get("/cluster/register/7") is not None:
            assert time.monotonic() < deadline, "the key outlived its TTL on the injected clock"
            await asyncio.sleep(0.02)

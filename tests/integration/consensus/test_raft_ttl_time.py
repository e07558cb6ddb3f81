"""Raft TTLs (broker leases) run on cluster time, not on any node's wall clock: three
peers over real ZeroMQ sockets in one event loop, each with its own fake clock, whose
wall readings are stepped as the chaos scenario R4 steps them (30 s either way)."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from danube_zmq.clock import ManualClock
from danube_zmq.consensus.metadata_store import RaftMetadataStore
from danube_zmq.consensus.peer import RaftPeer
from danube_zmq.consensus.raft import RaftConfig
from danube_zmq.transport.errors import Timeout, Unavailable

TTL_MS = 6_000  # cluster.lease_ttl_ms's default
STEP_MS = 30_000
QUIET_S = 0.5  # 25 expiry checks: long enough for a wrong expiry to show, not needed for a right one


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Cluster:
    def __init__(self, root: Path) -> None:
        self.addresses = {i: f"tcp://127.0.0.1:{_free_port()}" for i in (1, 2, 3)}
        self.clocks = {i: ManualClock() for i in self.addresses}
        self.stores: dict[int, RaftMetadataStore] = {}
        self.root = root

    async def start(self) -> None:
        for i, address in self.addresses.items():
            config = RaftConfig(node_id=i, election_ticks_min=10, election_ticks_max=20)
            peer = RaftPeer(i, self.root / f"peer-{i}", address, self.addresses, config, tick_ms=20,
                            ttl_check_interval_s=0.02, clock=self.clocks[i])
            await peer.start()
            self.stores[i] = RaftMetadataStore(peer)

    async def stop(self, node_id: int) -> None:
        await self.stores.pop(node_id).peer.stop()

    async def leader(self, timeout: float = 30.0) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            leaders = [i for i, s in self.stores.items() if s.is_leader]
            if len(leaders) == 1 and all(s.peer.leader_id == leaders[0] for s in self.stores.values()):
                return leaders[0]
            await asyncio.sleep(0.01)
        raise AssertionError(f"no agreed leader within {timeout} s")

    async def put_with_ttl(self, node_id: int, key: str, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                await self.stores[node_id].put_with_ttl(key, b"lease", TTL_MS)
                return
            except (Unavailable, Timeout):
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.05)

    def advance(self, ms: int) -> None:
        """Time passes for every node alike (monotonic and wall readings)."""
        for clock in self.clocks.values():
            clock.advance(ms)

    def live(self, key: str) -> dict[int, bool]:
        return {i: s.local_get(key) is not None for i, s in self.stores.items()}

    async def wait_expired(self, key: str, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while any(self.live(key).values()):
            assert time.monotonic() < deadline, f"{key} outlived its TTL: {self.live(key)}"
            await asyncio.sleep(0.02)


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    c = Cluster(tmp_path)
    try:
        await c.start()
        yield c
    finally:
        for node_id in list(c.stores):
            await c.stop(node_id)


async def test_a_wall_clock_step_expires_no_live_lease(cluster: Cluster) -> None:
    """The leader's wall clock steps 30 s ahead and a follower's 30 s back, and that
    follower renews its lease (forwarded to the leader): no lease expires early, and
    both still expire once their TTL has passed with no renewal. Before, the leader's
    expirer read its wall clock (every lease ended at once) and the follower stamped its
    renewal 30 s in the past (ended at once)."""
    leader = await cluster.leader()
    follower = next(i for i in cluster.stores if i != leader)
    await cluster.put_with_ttl(leader, "/reg/leader")
    cluster.clocks[leader].step_wall(+STEP_MS)
    cluster.clocks[follower].step_wall(-STEP_MS)
    await cluster.put_with_ttl(follower, "/reg/follower")
    await asyncio.sleep(QUIET_S)
    assert cluster.live("/reg/leader") == cluster.live("/reg/follower") == {1: True, 2: True, 3: True}
    cluster.advance(TTL_MS - 1_000)
    await asyncio.sleep(QUIET_S)
    assert all(cluster.live("/reg/follower").values()), "a renewal made before the step ended early"
    cluster.advance(2_000)
    await cluster.wait_expired("/reg/leader")
    await cluster.wait_expired("/reg/follower")


async def test_a_new_leader_gives_recent_renewals_a_whole_ttl(cluster: Cluster) -> None:
    """A broker renewed 5 s (of a 6 s TTL) before the old leader's last stamp; the old
    leader dies and the survivors' wall clocks are 30 s ahead. The new leader does not
    expire that lease 1 s into its term: the lease gets a whole TTL from the log's time
    (etcd's renew-on-election), and still ends when nobody renews it."""
    old = await cluster.leader()
    await cluster.put_with_ttl(old, "/reg/quiet")
    cluster.advance(5_000)
    await cluster.put_with_ttl(old, "/reg/busy")  # the old leader's last stamp
    for i in cluster.stores:
        if i != old:
            cluster.clocks[i].step_wall(+STEP_MS)
    await cluster.stop(old)
    new = await cluster.leader()
    assert new != old
    cluster.advance(3_000)  # past the quiet lease's old expiry, within a TTL of the election
    await asyncio.sleep(QUIET_S)
    assert all(cluster.live("/reg/quiet").values()), "a new leader expired a lease renewed within its TTL"
    cluster.advance(TTL_MS)
    await cluster.wait_expired("/reg/quiet")
    await cluster.wait_expired("/reg/busy")


async def test_every_peer_reckons_the_leaders_time_whatever_its_wall_clock(cluster: Cluster) -> None:
    """What "renewed lately" is measured against (`cluster_now_ms`, the clock of
    `expires_at_ms`): a follower whose wall clock stepped 30 s ahead, and one 30 s back,
    each reckon the leader's time from the stamps they applied, and keep it as time
    passes; a wall reading there would call every lease 30 s stale (or fresh)."""
    leader = await cluster.leader()
    for i, step in zip((i for i in cluster.stores if i != leader), (+STEP_MS, -STEP_MS), strict=True):
        cluster.clocks[i].step_wall(step)
    await cluster.put_with_ttl(leader, "/reg/leader")
    stamped = cluster.stores[leader].local_get("/reg/leader")
    assert stamped is not None and stamped.expires_at_ms is not None
    deadline = time.monotonic() + 30
    while any(s.local_get("/reg/leader") is None for s in cluster.stores.values()):
        assert time.monotonic() < deadline, "the lease never reached every peer"
        await asyncio.sleep(0.02)
    renewed_at = stamped.expires_at_ms - TTL_MS
    assert {i: s.cluster_now_ms() for i, s in cluster.stores.items()} == dict.fromkeys(cluster.stores, renewed_at)
    cluster.advance(2_000)
    assert {i: s.cluster_now_ms() for i, s in cluster.stores.items()} == dict.fromkeys(
        cluster.stores, renewed_at + 2_000)


async def test_a_dead_leaders_silence_is_judged_on_each_survivors_own_clock(cluster: Cluster) -> None:
    """The leader renews its own lease and dies 1 s later. Every survivor, the new leader
    included, judges that it stopped renewing once half its TTL has passed since the last
    renewal reached it, on its own clock, whatever the election took. Before, the
    judgement read cluster time, which stands still from the old leader's last stamp
    until the new leader's first: the new leader called the dead one alive for as long
    as the election took, and sent admin requests to it."""
    old = await cluster.leader()
    await cluster.put_with_ttl(old, "/reg/old")
    deadline = time.monotonic() + 30
    while not all(cluster.live("/reg/old").values()):
        assert time.monotonic() < deadline, "the lease never reached every peer"
        await asyncio.sleep(0.02)
    cluster.advance(1_000)
    await cluster.stop(old)
    await cluster.leader()  # the election takes no time on these clocks: only its pause shows
    cluster.advance(TTL_MS // 2 - 1_000)
    assert {i: s.stopped_renewing("/reg/old") for i, s in cluster.stores.items()} == dict.fromkeys(
        cluster.stores, False), "judged absent before half its TTL passed"
    cluster.advance(1)
    assert {i: s.stopped_renewing("/reg/old") for i, s in cluster.stores.items()} == dict.fromkeys(
        cluster.stores, True), "still judged alive past half its TTL with no renewal"

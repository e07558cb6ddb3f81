"""Raft peers over real ZeroMQ tcp sockets, in one event loop: election, replication,
linearizable reads on every peer, leader failover, restart and catch-up, the embedded
single-voter store, and watches across a leader change."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from danube_zmq.actors.metrics import RaftCollector
from danube_zmq.consensus.metadata_store import RaftMetadataStore, embedded_store
from danube_zmq.consensus.peer import NotLeader, RaftPeer
from danube_zmq.consensus.raft import RaftConfig, ReadIndex
from danube_zmq.consensus.state_machine import Put, Value, WatchEvent, WatchKind
from danube_zmq.transport.errors import FailedPrecondition, ResourceExhausted, Timeout, Unavailable

TICK_MS = 20


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Cluster:
    def __init__(self, root: Path, size: int = 3, log_entries_max: int = 10_000) -> None:
        self.root = root
        self.log_entries_max = log_entries_max
        self.addresses = {i: f"tcp://127.0.0.1:{_free_port()}" for i in range(1, size + 1)}
        self.peers: dict[int, RaftPeer] = {}

    def build(self, node_id: int) -> RaftPeer:
        config = RaftConfig(
            node_id=node_id, election_ticks_min=10, election_ticks_max=20, log_entries_max=self.log_entries_max
        )
        return RaftPeer(
            node_id, self.root / f"peer-{node_id}", self.addresses[node_id], self.addresses, config, tick_ms=TICK_MS
        )

    async def start(self, node_id: int) -> RaftPeer:
        peer = self.build(node_id)
        await peer.start()
        self.peers[node_id] = peer
        return peer

    async def stop(self, node_id: int) -> None:
        await self.peers.pop(node_id).stop()

    async def leader(self, timeout: float = 5.0) -> RaftPeer:
        """The one running leader, once every running peer agrees on it."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            leaders = [p for p in self.peers.values() if p.is_leader]
            if len(leaders) == 1 and all(p.leader_id == leaders[0].node_id for p in self.peers.values()):
                return leaders[0]
            await asyncio.sleep(0.01)
        raise AssertionError(f"no agreed leader within {timeout} s: {[p.statistics() for p in self.peers.values()]}")

    async def put(self, key: str, value: bytes, timeout: float = 5.0) -> Value:
        """Put through the current leader, retrying across leader changes."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                leader = await self.leader(max(0.1, deadline - time.monotonic()))
                result = await leader.propose(Put(key=key, value=value))
                assert type(result) is Value
                return result
            except (Unavailable, Timeout):
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.02)


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    c = Cluster(tmp_path)
    try:
        for node_id in c.addresses:
            await c.start(node_id)
        yield c
    finally:
        for node_id in list(c.peers):
            await c.stop(node_id)


async def test_leader_elected_writes_commit_and_read_everywhere(cluster: Cluster) -> None:
    leader = await cluster.leader()
    for i in range(10):
        result = await leader.propose(Put(key=f"/k/{i}", value=b"v%d" % i))
        assert type(result) is Value and result.value.version == 1
    for peer in cluster.peers.values():
        got = await peer.read("/k/9")  # linearizable: followers ask the leader for a read index
        assert got is not None and got.value == b"v9"
        assert [k for k, _ in await peer.list_prefix("/k/")] == sorted(f"/k/{i}" for i in range(10))

    follower = next(p for p in cluster.peers.values() if not p.is_leader)
    result = await follower.propose(Put(key="/x", value=b"forwarded"))  # forwarded to the leader
    assert type(result) is Value and result.value.version == 1
    got = follower.get_local("/x")  # applied on the follower before propose returned
    assert got is not None and got.value == b"forwarded"
    assert follower.statistics().proposals_forwarded == 1

    n = 200
    started = time.perf_counter()
    for i in range(n):
        await leader.propose(Put(key=f"/bench/{i % 10}", value=b"x" * 100))
    rate = n / (time.perf_counter() - started)
    print(f"\nsequential committed puts on 3 peers: {rate:.0f}/s")
    stats = leader.statistics()
    assert stats.proposals_committed >= n + 10 and stats.log is not None


async def test_leader_failover_and_restart_catch_up(cluster: Cluster) -> None:
    leader = await cluster.leader()
    for i in range(20):
        await cluster.put(f"/a/{i}", b"before")
    old_id = leader.node_id
    stopped_at = time.monotonic()
    await cluster.stop(old_id)
    new_leader = await cluster.leader(timeout=5.0)
    elapsed = time.monotonic() - stopped_at
    print(f"\nnew leader {new_leader.node_id} elected {elapsed * 1000:.0f} ms after stopping leader {old_id}")
    assert new_leader.node_id != old_id
    assert elapsed < 3.0

    for i in range(20):
        await cluster.put(f"/b/{i}", b"after")
    for peer in cluster.peers.values():
        got = await peer.read("/b/19")
        assert got is not None and got.value == b"after"

    restarted = await cluster.start(old_id)  # same data dir: Restore from disk, then catch up
    # Its log is back from disk; what it applies beyond the persisted commit index (a lower
    # bound) it learns from the leader's next heartbeat.
    assert restarted.statistics().last_index >= 21
    deadline = time.monotonic() + 5.0
    while restarted.get_local("/b/19") is None:
        assert time.monotonic() < deadline, restarted.statistics()
        await asyncio.sleep(0.02)
    assert restarted.get_local("/a/19") is not None
    got = await restarted.read("/b/19")
    assert got is not None and got.value == b"after"
    leader = await cluster.leader()
    await cluster.put("/c", b"3")
    got = await restarted.read("/c")
    assert got is not None and got.value == b"3"
    revisions = {p.node_id: p.state.revision for p in cluster.peers.values()}
    await asyncio.sleep(0.1)
    assert len({p.state.revision for p in cluster.peers.values()}) == 1, revisions


async def test_lagging_peer_catches_up_from_a_snapshot(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, log_entries_max=50)
    try:
        for node_id in cluster.addresses:
            await cluster.start(node_id)
        leader = await cluster.leader()
        lagging = next(i for i in cluster.peers if i != leader.node_id)
        await cluster.stop(lagging)
        for i in range(150):
            await cluster.put(f"/s/{i % 20}", b"%d" % i)
        await asyncio.sleep(0.2)  # TakeSnapshot -> SnapshotTaken -> SaveSnapshot + CompactLog
        stats = leader.statistics()
        assert stats.log is not None and stats.log.snapshots_saved >= 1 and stats.log.first_index > 1, stats
        restarted = await cluster.start(lagging)
        got = await restarted.read("/s/9")  # needs InstallSnapshot: the leader compacted its log
        assert got is not None and got.value == b"149"
        assert restarted.statistics().log.snapshots_installed >= 1  # type: ignore[union-attr]
        assert restarted.state.revision == leader.state.revision  # no writes since the read's index
        assert restarted.state.list_prefix("") == leader.state.list_prefix("")
        await cluster.stop(restarted.node_id)
        again = await cluster.start(lagging)  # restart from its installed snapshot
        got = await again.read("/s/9")
        assert got is not None and got.value == b"149"
    finally:
        for node_id in list(cluster.peers):
            await cluster.stop(node_id)


async def test_watch_sees_puts_and_deletes_in_order_across_leader_change(cluster: Cluster) -> None:
    leader = await cluster.leader()
    watcher_peer = next(p for p in cluster.peers.values() if not p.is_leader)
    seen: list[WatchEvent] = []

    async def watch() -> None:
        async for event in RaftMetadataStore(watcher_peer).watch("/w/"):
            seen.append(event)

    task = asyncio.create_task(watch())
    try:
        store = RaftMetadataStore(leader)
        await store.put("/w/a", b"1")
        await store.put("/other", b"ignored")
        await store.put("/w/b", b"2")
        assert await store.delete("/w/a")
        await cluster.stop(leader.node_id)
        new_leader = await cluster.leader()
        store = RaftMetadataStore(new_leader)
        await store.put("/w/c", b"3")
        assert await store.delete_prefix("/w/") == 2
        deadline = time.monotonic() + 5.0
        while len(seen) < 6:
            assert time.monotonic() < deadline, seen
            await asyncio.sleep(0.01)
    finally:
        task.cancel()
    got = [(WatchKind(e.kind), e.key) for e in seen]
    assert got == [
        (WatchKind.PUT, "/w/a"),
        (WatchKind.PUT, "/w/b"),
        (WatchKind.DELETE, "/w/a"),
        (WatchKind.PUT, "/w/c"),
        (WatchKind.DELETE, "/w/b"),
        (WatchKind.DELETE, "/w/c"),
    ]
    revisions = [e.revision for e in seen]
    assert revisions == sorted(revisions) and revisions[0] < revisions[2] < revisions[3] < revisions[4]


async def test_no_leader_is_not_leader(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path)
    try:
        alone = await cluster.start(1)  # one of three voters: it never wins an election
        await asyncio.sleep(0.5)
        with pytest.raises(NotLeader) as info:
            await alone.propose(Put(key="/x", value=b""))
        assert info.value.leader_id is None and info.value.retriable
    finally:
        for node_id in list(cluster.peers):
            await cluster.stop(node_id)


async def test_membership_add_promote_remove(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path)
    try:
        for node_id in cluster.addresses:
            await cluster.start(node_id)
        leader = await cluster.leader()
        for i in range(30):
            await cluster.put(f"/m/{i}", b"x")
        # A fourth node starts empty (join) knowing the founders; it is added through a follower.
        cluster.addresses[4] = f"tcp://127.0.0.1:{_free_port()}"
        config = RaftConfig(node_id=4, election_ticks_min=10, election_ticks_max=20)
        founders = {i: a for i, a in cluster.addresses.items() if i != 4}
        newcomer = RaftPeer(4, tmp_path / "peer-4", cluster.addresses[4], founders, config, tick_ms=TICK_MS,
                            bootstrap_cluster=False)
        await newcomer.start()
        cluster.peers[4] = newcomer
        follower = RaftMetadataStore(next(p for p in cluster.peers.values() if not p.is_leader and p.node_id != 4))
        await follower.add_node(4, cluster.addresses[4])
        members = {m.node_id: m for m in follower.members()}
        assert not members[4].voter and members[4].address == cluster.addresses[4]
        with pytest.raises(FailedPrecondition):
            await follower.add_node(4, cluster.addresses[4])
        deadline = time.monotonic() + 5.0
        while newcomer.get_local("/m/29") is None:  # a learner replicates
            assert time.monotonic() < deadline, newcomer.statistics()
            await asyncio.sleep(0.02)
        for _attempt in range(50):  # refused (retriable) until it has caught up
            try:
                await follower.promote_node(4)
                break
            except Unavailable:
                await asyncio.sleep(0.05)
        assert [m.node_id for m in leader.members() if m.voter] == [1, 2, 3, 4]
        # Every member learned every address from the replicated book.
        for peer in cluster.peers.values():
            assert peer.addresses == cluster.addresses, (peer.node_id, peer.addresses)
        # Remove a founder that is not the leader; the remaining three keep committing.
        gone = next(i for i in (1, 2, 3) if i != leader.node_id)
        await RaftMetadataStore(leader).remove_node(gone)
        await cluster.stop(gone)
        assert [m.node_id for m in leader.members()] == sorted({1, 2, 3, 4} - {gone})
        await cluster.put("/after-remove", b"ok")
        got = await newcomer.read("/after-remove")
        assert got is not None and got.value == b"ok"
        assert leader.get_local(f"/cluster/nodes/{gone}") is None
        with pytest.raises(FailedPrecondition):
            await RaftMetadataStore(leader).promote_node(gone)
    finally:
        for node_id in list(cluster.peers):
            await cluster.stop(node_id)


async def test_embedded_store(tmp_path: Path) -> None:
    async with embedded_store(tmp_path / "meta") as store:
        v = await store.put("/t/one", b"1")
        assert v.version == 1
        got = await store.get("/t/one")
        assert got is not None and got.value == b"1"
        cas = await store.compare_and_swap("/t/one", 1, b"2")
        assert cas.succeeded and cas.version == 2
        cas = await store.compare_and_swap("/t/one", 1, b"3")
        assert not cas.succeeded and cas.value is not None and cas.value.value == b"2"
        cas = await store.compare_and_swap("/t/new", 0, b"n")
        assert cas.succeeded and cas.version == 1
        assert [await store.allocate_id("/ids/x") for _ in range(3)] == [1, 2, 3]
        ttl = await store.put_with_ttl("/t/ttl", b"t", 60_000)
        assert ttl.ttl_ms == 60_000

        events: list[WatchEvent] = []
        watch = store.watch("/t/", from_revision=0)
        while len(events) < 4:  # the failed CAS and the counters make no events
            events.append(await asyncio.wait_for(anext(watch), 2.0))
        assert [e.key for e in events] == ["/t/one", "/t/one", "/t/new", "/t/ttl"]
        assert [e.revision for e in events] == sorted(e.revision for e in events)
        next_event = asyncio.ensure_future(anext(watch))
        await asyncio.sleep(0.05)
        assert not next_event.done()  # nothing new: the watch waits (no polling)
        assert await store.delete("/t/new")
        event = await asyncio.wait_for(next_event, 2.0)
        assert (WatchKind(event.kind), event.key) == (WatchKind.DELETE, "/t/new")
        await watch.aclose()
        assert await store.delete_prefix("/t/") == 2
        assert await store.list_prefix("/t/") == []
        revision = store.revision

    async with embedded_store(tmp_path / "meta") as store:  # restart: recovered from the log
        assert store.revision == revision
        assert await store.allocate_id("/ids/x") == 4
        assert await store.get("/t/one") is None


async def test_raft_metrics(tmp_path: Path) -> None:
    async with embedded_store(tmp_path / "meta") as store:
        await store.put("/a", b"1")
        families = {m.name: m for m in RaftCollector(store.peer).collect()}
    assert families["danube_raft_leader"].samples[0].value == 1
    assert families["danube_raft_voters"].samples[0].value == 1
    assert families["danube_raft_commit_index"].samples[0].value >= 2  # the bootstrap entry and the put
    proposals = families["danube_raft_proposals"].samples[0]
    assert (proposals.name, proposals.value) == ("danube_raft_proposals_total", 1)
    # A lone peer elected itself once; what it committed it applied.
    changes = families["danube_raft_leader_changes"].samples[0]
    assert (changes.name, changes.value) == ("danube_raft_leader_changes_total", 1)
    assert families["danube_raft_apply_lag"].samples[0].value == 0


async def test_transaction_applies_only_when_every_guard_holds(tmp_path: Path) -> None:
    async with embedded_store(tmp_path / "meta") as store:
        assert await store.transaction({"/s/meta": 0}, {"/s/meta": b"m1", "/s/v/1": b"d1"})
        assert not await store.transaction({"/s/meta": 0}, {"/s/meta": b"m2", "/s/v/1": b"other"})
        got = await store.get("/s/v/1")
        assert got is not None and got.value == b"d1"  # the failed transaction changed nothing
        assert await store.transaction({"/s/meta": 1, "/s/v/2": 0}, {"/s/meta": b"m2", "/s/v/2": b"d2"}, ["/s/v/1"])
        assert [k for k, _ in await store.list_prefix("/s/")] == ["/s/meta", "/s/v/2"]


async def test_the_event_queue_is_bounded(tmp_path: Path) -> None:
    peer = RaftPeer(1, tmp_path / "meta", None, {}, RaftConfig(node_id=1), tick_ms=10, events_max=4)
    async with RaftMetadataStore(peer, owns_peer=True) as store:
        # Nothing runs between these calls, so the loop cannot drain: the fifth is refused.
        with pytest.raises(ResourceExhausted, match="requests queued"):
            for k in range(5):
                peer._enqueue(ReadIndex(request_id=1_000_000 + k))
        await asyncio.sleep(0.05)  # the loop drains the queue, and the peer serves again
        assert (await store.put("/after", b"ok")).version == 1


async def test_the_leader_answers_a_write_before_it_sends_the_commit_notices(cluster: Cluster) -> None:
    """A commit's notices to the followers (Heartbeats asking no answer) leave after the
    proposer's answer: each ZeroMQ send wakes libzmq's I/O thread, which on a busy
    machine can take the core from the loop before it answers. The leader's notices and
    the `propose_then` answers are recorded in order, for 20 writes one at a time."""
    from danube_zmq.consensus.peer import PEER_PROTOCOL
    from danube_zmq.consensus.raft.messages import Heartbeat

    await cluster.put("/warm", b"up", timeout=20.0)
    leader = await cluster.leader(timeout=20.0)
    order: list[str] = []
    send_frame = leader._send_frame

    def recording_send(to_id: int, frame: bytes) -> bool:
        msg = PEER_PROTOCOL.decode(frame)
        if type(msg) is Heartbeat and not msg.answer:
            order.append(f"notice {msg.leader_commit}")
        return send_frame(to_id, frame)

    leader._send_frame = recording_send  # type: ignore[method-assign]
    for k in range(20):
        answered = asyncio.get_running_loop().create_future()

        def done(result: object, answered: asyncio.Future[object] = answered) -> None:
            order.append(f"answer {leader.state.last_applied_index}")  # our entry, just applied
            answered.set_result(result)

        assert leader.propose_then(Put(key=f"/k/{k}", value=b"v"), done)
        async with asyncio.timeout(20.0):
            await answered
    # Each answered write's own notices (their commit index is its entry's) come after it.
    answered_at = {what: n for n, what in enumerate(order) if what.startswith("answer")}
    ours = [(n, what) for n, what in enumerate(order) if f"answer {what.split()[1]}" in answered_at
            and what.startswith("notice")]
    assert len(answered_at) == 20 and ours, order
    for n, what in ours:
        assert answered_at[f"answer {what.split()[1]}"] < n, order

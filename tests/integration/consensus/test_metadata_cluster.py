"""The Raft metadata store across real broker processes (`danube broker start` with a
`cluster:` section) on loopback, through the admin API and the CLI: a leader kill -9
while clients write (new leader within 2 s, no acknowledged write lost, the history
linearizable), the killed broker's restart and catch-up, a 5-node cluster with two
nodes down, and membership changes with `danube admin cluster ...`."""

from __future__ import annotations

import asyncio
import json
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from danube_zmq.client.admin import AdminClient
from danube_zmq.consensus.linearizability import Operation, check
from danube_zmq.transport.errors import DanubeError, Timeout
from tests.integration.conftest import BrokerProcess, free_port, start_broker

ELECTION_S_MAX = 2.0


class Node:
    def __init__(self, tmp_path: Path, node_id: int) -> None:
        self.tmp_path = tmp_path
        self.node_id = node_id
        self.raft = f"tcp://127.0.0.1:{free_port()}"
        self.url = f"tcp://127.0.0.1:{free_port()}"
        self.admin_url = f"tcp://127.0.0.1:{free_port()}"
        self.process: BrokerProcess | None = None

    def start(self, founders: list[Node], *, join: bool = False, env: dict[str, str] | None = None,
              extra: tuple[str, ...] = ()) -> Node:
        env = {
            **(env or {}),
            "DANUBE_CLUSTER__NODE_ID": str(self.node_id),
            "DANUBE_CLUSTER__RAFT_LISTEN": self.raft,
            "DANUBE_CLUSTER__PEERS": ",".join(f"{n.node_id}={n.raft}" for n in founders),
            "DANUBE_CLUSTER__JOIN": "true" if join else "false",
        }
        self.process = start_broker(self.tmp_path, "--data-dir", str(self.tmp_path / f"node-{self.node_id}"), *extra,
                                    env=env, url=self.url, admin_url=self.admin_url)
        return self

    def kill(self) -> None:
        assert self.process is not None
        self.process.stop(signal.SIGKILL)
        self.process = None

    def stop(self) -> None:
        if self.process is not None:
            code = self.process.stop()
            log = self.process.log()
            self.process = None
            assert code == 0, f"node {self.node_id} did not stop cleanly (exit {code}):\n{log}"


def start_cluster(tmp_path: Path, size: int, env: dict[str, str] | None = None) -> list[Node]:
    nodes = [Node(tmp_path, i) for i in range(1, size + 1)]
    try:
        for node in nodes:
            node.start(nodes, env=env)
    except BaseException:
        for node in nodes:  # the ones that did start must not outlive the test
            if node.process is not None:
                node.kill()
        raise
    return nodes


async def status(node: Node, timeout_ms: int = 1000) -> object:
    async with AdminClient(node.admin_url, timeout_ms=timeout_ms) as admin:
        return await admin.cluster_status()


async def agreed_leader(nodes: list[Node], timeout_s: float = 60.0, term_above: int = 0) -> tuple[int, int]:
    """(leader id, term) once every running node names the same leader in a term above `term_above`."""
    deadline = time.monotonic() + timeout_s
    last: list[object] = []
    while time.monotonic() < deadline:
        try:
            last = [await status(n) for n in nodes if n.process is not None]
        except DanubeError:
            await asyncio.sleep(0.02)
            continue
        leaders = {s.leader_id for s in last}  # type: ignore[attr-defined]
        terms = {s.term for s in last}  # type: ignore[attr-defined]
        if len(leaders) == 1 and None not in leaders and len(terms) == 1 and min(terms) > term_above:
            return leaders.pop(), terms.pop()  # type: ignore[return-value]
        await asyncio.sleep(0.02)
    raise AssertionError(f"no agreed leader within {timeout_s} s: {last}")


class Workload:
    """Clients writing and reading through random live brokers, recording a history."""

    def __init__(self, nodes: list[Node], clients: int, seed: int) -> None:
        self.nodes = nodes
        self.clients = clients
        self.rng = random.Random(seed)
        self.history: list[Operation] = []
        self.acked_logs: set[str] = set()
        self.acked = 0
        self.failed = 0
        self.running = True
        self.keys = [f"/reg/{i}" for i in range(4)]
        self.counter = 0

    def live(self) -> list[Node]:
        return [n for n in self.nodes if n.process is not None]

    async def client(self, cid: int) -> None:
        admins = {n.node_id: AdminClient(n.admin_url, timeout_ms=1500) for n in self.nodes}
        try:
            for admin in admins.values():
                await admin.connect()
            while self.running:
                node = self.rng.choice(self.live())
                await self.one(cid, admins[node.node_id])
        finally:
            for admin in admins.values():
                admin.close()

    async def one(self, cid: int, admin: AdminClient) -> None:
        self.counter += 1
        value = f"c{cid}-{self.counter}".encode()
        choice = self.rng.random()
        invoke = time.monotonic_ns()
        if choice < 0.25:  # a unique key: its acknowledgement must survive anything
            key = f"/log/{value.decode()}"
            try:
                await admin.metadata_put(key, value)
            except DanubeError:
                self.failed += 1
                return
            self.acked += 1
            self.acked_logs.add(key)
            return
        key = self.rng.choice(self.keys)
        if choice < 0.55:
            try:
                await admin.metadata_put(key, value)
                complete: int | None = time.monotonic_ns()
                self.acked += 1
            except DanubeError:
                complete = None
                self.failed += 1
            self.history.append(Operation(client=cid, op="put", key=key, value=value, invoke=invoke, complete=complete))
        elif choice < 0.8:
            try:
                entry = await admin.metadata_get(key)
            except DanubeError:
                self.failed += 1
                return  # an unknown read constrains nothing
            self.history.append(Operation(client=cid, op="get", key=key, result=entry.value if entry else None,
                                          invoke=invoke, complete=time.monotonic_ns()))
        else:
            # Values are unique, so "version is n" is "value is the one read at version n".
            try:
                current = await admin.metadata_get(key)
            except DanubeError:
                self.failed += 1
                return
            invoke = time.monotonic_ns()
            expected_version = current.version if current else 0
            try:
                written = await admin.metadata_cas(key, expected_version, value)
                complete, result = time.monotonic_ns(), written.succeeded
                self.acked += 1
            except DanubeError:
                complete, result = None, None
                self.failed += 1
            self.history.append(Operation(client=cid, op="cas", key=key, value=value,
                                          expected=current.value if current else None, result=result,
                                          invoke=invoke, complete=complete))


async def test_leader_kill_while_clients_write(tmp_path: Path) -> None:
    nodes = start_cluster(tmp_path, 3)
    try:
        leader_id, term = await agreed_leader(nodes)
        work = Workload(nodes, clients=6, seed=7)
        tasks = [asyncio.create_task(work.client(c)) for c in range(work.clients)]
        await asyncio.sleep(1.5)
        acked_before = work.acked
        leader = nodes[leader_id - 1]
        killed_at = time.monotonic()
        leader.kill()
        new_leader, new_term = await agreed_leader(nodes, timeout_s=30.0, term_above=term)
        election_s = time.monotonic() - killed_at
        print(f"\nleader {leader_id} killed; node {new_leader} leads term {new_term} after {election_s * 1000:.0f} ms")
        assert new_leader != leader_id
        assert election_s < ELECTION_S_MAX
        await asyncio.sleep(1.5)
        leader.start(nodes)  # same data dir: recovers its log, then catches up
        await asyncio.sleep(1.0)
        work.running = False
        await asyncio.gather(*tasks)
        print(f"{work.acked} acknowledged ({acked_before} before the kill), {work.failed} failed or unknown")
        assert work.acked > acked_before + 20  # writes kept committing after the kill

        # No acknowledged write lost, on any node, the restarted one included.
        for node in nodes:
            async with AdminClient(node.admin_url, timeout_ms=3000) as admin:
                listed = await admin.metadata_list("/log/", limit=100_000)
            missing = work.acked_logs - {e.key for e in listed.entries}
            assert not missing, f"node {node.node_id} lost acknowledged writes: {sorted(missing)[:10]}"
        # The restarted node applied everything (stale read of its own state, after a round).
        async with AdminClient(leader.admin_url, timeout_ms=3000) as admin:
            await admin.metadata_get("/log/")  # a linearizable read: waits until caught up
            local = await admin.metadata_list("/log/", linearizable=False, limit=100_000)
        assert work.acked_logs <= {e.key for e in local.entries}
        revisions = {(await status(n, 3000)).revision for n in nodes}  # type: ignore[attr-defined]
        assert len(revisions) == 1, revisions

        result = check(work.history)
        assert result.ok is True, (result.explanation, [op.describe() for op in result.operations])
        print(f"linearizable: {len(work.history)} register operations")
    finally:
        for node in nodes:
            if node.process is not None:
                node.kill()


async def test_five_nodes_two_down_keep_committing(tmp_path: Path) -> None:
    nodes = start_cluster(tmp_path, 5)
    try:
        leader_id, term = await agreed_leader(nodes)
        followers = [n for n in nodes if n.node_id != leader_id]
        for node in (nodes[leader_id - 1], followers[0]):  # the leader and one more: a new election on 3 of 5
            node.kill()
        await agreed_leader(nodes, timeout_s=30.0, term_above=term)
        survivor = next(n for n in nodes if n.process is not None)
        async with AdminClient(survivor.admin_url, timeout_ms=5000) as admin:
            for i in range(20):
                await admin.metadata_put(f"/five/{i}", b"%d" % i)
            info = await admin.cluster_status()
        assert len([m for m in info.members if m.voter]) == 5
        for node in nodes:
            if node.process is not None:
                async with AdminClient(node.admin_url, timeout_ms=5000) as admin:
                    entry = await admin.metadata_get("/five/19")
                assert entry is not None and entry.value == b"19"
        # A third node down: no quorum, writes fail (retriable), nothing is acknowledged.
        next(n for n in nodes if n.process is not None and n is not survivor).kill()
        async with AdminClient(survivor.admin_url, timeout_ms=5000) as admin:
            with pytest.raises(DanubeError) as info_err:
                await admin.metadata_put("/five/no-quorum", b"x")
        assert info_err.value.retriable
    finally:
        for node in nodes:
            if node.process is not None:
                node.kill()


def danube(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "danube_zmq.cli.main", *args], capture_output=True, text=True,
                          timeout=60)


async def test_cli_cluster_membership_and_metadata(tmp_path: Path) -> None:
    nodes = start_cluster(tmp_path, 3)
    try:
        leader_id, _ = await agreed_leader(nodes)
        follower = next(n for n in nodes if n.node_id != leader_id)
        out = danube("admin", "--endpoint", follower.admin_url, "cluster", "status", "--output", "json")
        assert out.returncode == 0, out.stderr
        info = json.loads(out.stdout)
        assert info["leader_id"] == leader_id and info["role"] == "FOLLOWER"
        assert [(m["node_id"], m["voter"], m["address"]) for m in info["members"]] == [
            (n.node_id, True, n.raft) for n in nodes]

        # A fourth broker joins: started empty, added through a follower, promoted when caught up.
        newcomer = Node(tmp_path, 4).start(nodes, join=True)
        nodes.append(newcomer)
        out = danube("admin", "--endpoint", follower.admin_url, "cluster", "add-node", "4", newcomer.raft)
        assert out.returncode == 0, out.stderr
        assert "learner" in out.stdout
        deadline = time.monotonic() + 10
        while True:
            out = danube("admin", "--endpoint", follower.admin_url, "cluster", "promote-node", "4")
            if out.returncode == 0 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert out.returncode == 0, out.stderr
        members = json.loads(danube("admin", "--endpoint", newcomer.admin_url, "cluster", "status", "-o",
                                    "json").stdout)["members"]
        assert [(m["node_id"], m["voter"]) for m in members] == [(1, True), (2, True), (3, True), (4, True)]

        # Metadata through the newcomer (a follower: writes are forwarded).
        out = danube("admin", "--endpoint", newcomer.admin_url, "metadata", "put", "/ops/flag", "on")
        assert out.returncode == 0 and "version 1" in out.stdout, out.stderr
        out = danube("admin", "--endpoint", newcomer.admin_url, "metadata", "put", "/ops/flag", "off",
                     "--expect-version", "7")
        assert out.returncode == 1 and "compare-and-swap failed" in out.stderr and "version 1" in out.stderr
        out = danube("admin", "--endpoint", nodes[0].admin_url, "metadata", "get", "/ops/flag", "-o", "json")
        assert json.loads(out.stdout)[0]["value"] == "on"
        out = danube("admin", "--endpoint", nodes[0].admin_url, "metadata", "list", "/cluster/nodes/")
        assert out.returncode == 0 and all(n.raft in out.stdout for n in nodes), out.stdout
        out = danube("admin", "--endpoint", nodes[0].admin_url, "metadata", "get", "/nope")
        assert out.returncode == 1 and "not found" in out.stderr

        # Bad input gets a clear error.
        out = danube("admin", "--endpoint", follower.admin_url, "cluster", "add-node", "5", "http://x:1")
        assert out.returncode != 0 and "tcp://" in out.stderr
        out = danube("admin", "--endpoint", follower.admin_url, "cluster", "promote-node", "9")
        assert out.returncode != 0 and "membership change refused" in out.stderr

        # Remove a founder (not the leader); the others keep serving.
        gone = next(n for n in nodes[:3] if n.node_id not in (leader_id, follower.node_id))
        out = danube("admin", "--endpoint", follower.admin_url, "cluster", "remove-node", str(gone.node_id))
        assert out.returncode == 0, out.stderr
        gone.stop()
        members = json.loads(danube("admin", "--endpoint", newcomer.admin_url, "cluster", "status", "-o",
                                    "json").stdout)["members"]
        assert gone.node_id not in [m["node_id"] for m in members]
        out = danube("admin", "--endpoint", newcomer.admin_url, "metadata", "delete", "/ops/", "--prefix")
        assert out.returncode == 0 and "deleted 1 key" in out.stdout, out.stderr
    finally:
        for node in nodes:
            if node.process is not None:
                node.kill()


def _members(node: Node) -> list[tuple[int, bool]]:
    out = danube("admin", "--endpoint", node.admin_url, "cluster", "status", "-o", "json")
    assert out.returncode == 0, out.stderr
    return [(m["node_id"], m["voter"]) for m in json.loads(out.stdout)["members"]]


def _promote(via: Node, node_id: int, deadline_s: float = 20.0) -> subprocess.CompletedProcess[str]:
    deadline = time.monotonic() + deadline_s
    while True:
        out = danube("admin", "--endpoint", via.admin_url, "cluster", "promote-node", str(node_id))
        if out.returncode == 0 or time.monotonic() > deadline:
            return out
        time.sleep(0.2)


async def test_promoting_a_learner_that_never_answered_is_refused(tmp_path: Path) -> None:
    """Issue 19, section 3, as reported: a one-voter cluster, `add-node 2` at an address
    where nothing listens, then `promote-node 2`. The promotion is refused with a clear,
    retriable error (it used to succeed and leave two voters and no leader, for good);
    the broker keeps committing and restarts."""
    node = Node(tmp_path, 1)
    node.start([node])
    try:
        nowhere = f"tcp://127.0.0.1:{free_port()}"
        out = danube("admin", "--endpoint", node.admin_url, "cluster", "add-node", "2", nowhere)
        assert out.returncode == 0, out.stderr
        out = _promote(node, 2, deadline_s=3.0)
        assert out.returncode != 0 and "learner has not" in out.stderr, (out.stdout, out.stderr)
        assert _members(node) == [(1, True), (2, False)]
        out = danube("admin", "--endpoint", node.admin_url, "metadata", "put", "/still/writable", "yes")
        assert out.returncode == 0, out.stderr
        node.stop()
        node.start([node])
        out = danube("admin", "--endpoint", node.admin_url, "metadata", "get", "/still/writable", "-o", "json")
        assert out.returncode == 0 and json.loads(out.stdout)[0]["value"] == "yes", out.stderr
    finally:
        if node.process is not None:
            node.kill()


@pytest.mark.cluster
async def test_a_survivor_recovers_alone_with_admin_cluster_recover(tmp_path: Path) -> None:
    """Disaster recovery with the CLI: three brokers, ten keys written, then all killed
    and two of them lost for good. `danube admin cluster recover --data-dir` (offline)
    makes the survivor the only voter; started again it leads at once with every key,
    takes writes, and a new broker joins from an empty data dir as learner then voter."""
    nodes = start_cluster(tmp_path, 3)
    survivor = nodes[0]
    try:
        await agreed_leader(nodes)
        for i in range(10):
            out = danube("admin", "--endpoint", survivor.admin_url, "metadata", "put", f"/keep/{i}", f"v{i}")
            assert out.returncode == 0, out.stderr
        for node in nodes:
            node.kill()
        out = danube("admin", "cluster", "recover", "--data-dir", str(tmp_path / "node-1"), "--yes")
        assert out.returncode == 0 and "node 1 is now the only voter" in out.stdout, (out.stdout, out.stderr)
        survivor.start(nodes)
        assert _members(survivor) == [(1, True)]
        out = danube("admin", "--endpoint", survivor.admin_url, "metadata", "get", "/keep/9", "-o", "json")
        assert out.returncode == 0 and json.loads(out.stdout)[0]["value"] == "v9", out.stderr
        out = danube("admin", "--endpoint", survivor.admin_url, "metadata", "put", "/after/recovery", "ok")
        assert out.returncode == 0, out.stderr
        newcomer = Node(tmp_path, 4).start([survivor], join=True)
        nodes.append(newcomer)
        out = danube("admin", "--endpoint", survivor.admin_url, "cluster", "add-node", "4", newcomer.raft)
        assert out.returncode == 0, out.stderr
        out = _promote(survivor, 4)
        assert out.returncode == 0, out.stderr
        assert _members(newcomer) == [(1, True), (4, True)]
        out = danube("admin", "--endpoint", newcomer.admin_url, "metadata", "get", "/keep/0", "-o", "json")
        assert out.returncode == 0 and json.loads(out.stdout)[0]["value"] == "v0", out.stderr
    finally:
        for node in nodes:
            if node.process is not None:
                node.kill()


@pytest.mark.cluster
async def test_a_survivor_recovers_alone_with_force_new_cluster(tmp_path: Path) -> None:
    """Disaster recovery with the broker flag: two of three brokers lost, the survivor
    restarted with `danube broker start --force-new-cluster` leads alone with its data."""
    nodes = start_cluster(tmp_path, 3)
    survivor = nodes[0]
    try:
        await agreed_leader(nodes)
        out = danube("admin", "--endpoint", survivor.admin_url, "metadata", "put", "/keep/flag", "kept")
        assert out.returncode == 0, out.stderr
        for node in nodes:
            node.kill()
        survivor.start(nodes, extra=("--force-new-cluster",))
        assert _members(survivor) == [(1, True)]
        out = danube("admin", "--endpoint", survivor.admin_url, "metadata", "get", "/keep/flag", "-o", "json")
        assert out.returncode == 0 and json.loads(out.stdout)[0]["value"] == "kept", out.stderr
        out = danube("admin", "--endpoint", survivor.admin_url, "metadata", "put", "/after/flag", "ok")
        assert out.returncode == 0, out.stderr
    finally:
        for node in nodes:
            if node.process is not None:
                node.kill()


async def test_puts_acked_before_the_leaders_fsync_survive_kill_9_of_leader_and_a_follower(tmp_path: Path) -> None:
    """The leader answers a put once a majority holds it durably, possibly before its
    own fsync (it replicates while it syncs). Eight proposers write to the leader; right
    after the 200th acknowledgement the leader and one follower are killed -9 at once,
    then both restart from their data dirs: every acknowledged put is on all three nodes
    (a commit that counted the leader's unsynced copy would be lost here)."""
    nodes = start_cluster(tmp_path, 3)
    try:
        leader_id, _ = await agreed_leader(nodes)
        leader = nodes[leader_id - 1]
        follower = next(n for n in nodes if n.node_id != leader_id)
        acked: set[str] = set()
        enough = asyncio.Event()

        async def proposer(p: int) -> None:
            async with AdminClient(leader.admin_url, timeout_ms=2000) as admin:
                for i in range(10_000):
                    key = f"/acked/{p}/{i}"
                    try:
                        await admin.metadata_put(key, b"v" * 100)
                    except DanubeError:
                        return  # the leader is gone: outcome unknown, not counted
                    acked.add(key)
                    if len(acked) >= 200:
                        enough.set()

        tasks = [asyncio.create_task(proposer(p)) for p in range(8)]
        await asyncio.wait_for(enough.wait(), 60.0)
        leader.kill()
        follower.kill()
        await asyncio.gather(*tasks)
        leader.start(nodes)
        follower.start(nodes)
        await agreed_leader(nodes)
        for node in nodes:
            async with AdminClient(node.admin_url, timeout_ms=5000) as admin:
                # A linearizable read: caught up with the leader. Its read index waits for
                # the new leader's first commit of its term, which two restarted nodes may
                # take past one request's timeout on a loaded machine: asked again.
                deadline = time.monotonic() + 60
                while True:
                    try:
                        await admin.metadata_get("/acked/")
                        break
                    except Timeout:
                        assert time.monotonic() < deadline, f"node {node.node_id}: no linearizable read in 60 s"
                listed = await admin.metadata_list("/acked/", linearizable=False, limit=100_000)
            missing = acked - {e.key for e in listed.entries}
            assert not missing, f"node {node.node_id} lost acknowledged puts: {sorted(missing)[:10]}"
    finally:
        for node in nodes:
            if node.process is not None:
                node.kill()

"""R5 (docs/reliability.md 4.2): Raft membership changes while the leader is killed.

    Hosts(4); Cluster(members=3): broker-1..3 on h1..h3 (supervised), h4 empty
    metadata workload + observer (R-leader's)
    1. broker-4 started on h4 with cluster.join (empty data dir), a second observer on it
    2. `cluster add-node 4` through a follower (learner), then `promote-node 4` while
       the Raft leader is killed with SIGKILL (its supervisor restarts it)
    3. `remove-node F` (a founder other than the leader, drawn from the seed) while the
       leader of that moment is killed again
    4. every member's view agrees on one leader and on the final configuration

A membership call cut by the kill may have been applied or not: it is retried through
another member until the cluster's view shows it done. Checked after the run
(`judge_membership`): the final configuration was agreed by every member (from the
notes), no two leaders in one term (the observers), linearizable metadata.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tests.chaos.harness.checkers import Report
from tests.chaos.harness.cluster import ADMIN_PORT, CLIENT_PORT, RAFT_PORT, Broker, danube_argv
from tests.chaos.harness.history import Op
from tests.chaos.harness.workload import command

if TYPE_CHECKING:
    from tests.chaos.harness.scenarios import Run

NEWCOMER_ID = 4
CHANGE_DEADLINE_S = 120.0


class Newcomer:
    """broker-4 on the fourth host, started by the scenario (no supervisor: a kill is
    followed by our own restart on the same data dir)."""

    def __init__(self, run: Run) -> None:
        cluster = run.cluster
        self.run = run
        self.host = cluster.hosts[len(cluster.members)]
        address = self.host.address
        data_dir = cluster.data_dir / f"broker-{NEWCOMER_ID}"
        self.broker = Broker(name=f"broker-{NEWCOMER_ID}", node_id=NEWCOMER_ID, host=self.host,
                             url=f"tcp://{address}:{CLIENT_PORT}", admin_url=f"tcp://{address}:{ADMIN_PORT}",
                             raft_url=f"tcp://{address}:{RAFT_PORT}", data_dir=data_dir,
                             log_path=cluster.data_dir / f"broker-{NEWCOMER_ID}.log")
        self.env = {**os.environ, "DANUBE_CLUSTER__NODE_ID": str(NEWCOMER_ID),
                    "DANUBE_CLUSTER__RAFT_LISTEN": self.broker.raft_url, "DANUBE_CLUSTER__JOIN": "true",
                    "DANUBE_CLUSTER__PEERS": ",".join(f"{b.node_id}={b.raft_url}" for b in cluster.brokers)}
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        b = self.broker
        b.data_dir.mkdir(parents=True, exist_ok=True)
        argv = danube_argv("broker", "start", "--data-dir", str(b.data_dir), "--listen", b.url,
                           "--admin-listen", b.admin_url, "--metrics-port", "0",
                           "--config", str(self.run.cluster.data_dir / "broker.yml"))
        with open(b.log_path, "ab") as log:
            self.process = self.host.popen(argv, stdout=log, stderr=subprocess.STDOUT, env=self.env)
        (b.data_dir / "broker.pid").write_text(f"{self.process.pid}\n")

    def kill9_and_restart(self) -> None:
        """kill -9, recorded as a fault healed by the restart."""
        assert self.process is not None
        fault = self.run.faults.mark("kill9", [self.broker.name], f"kill -9 {self.broker.name} (pid {self.process.pid})")
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(30)
        self.start()
        self.run.faults.heal(fault)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(30)


async def _views(brokers: list[Broker]) -> dict[int, Any]:
    from danube_zmq.client.admin import AdminClient
    from danube_zmq.transport.errors import DanubeError

    views = {}
    for b in brokers:
        try:
            async with AdminClient(b.admin_url, timeout_ms=1_000) as admin:
                views[b.node_id] = await admin.cluster_status()
        except (DanubeError, OSError, TimeoutError):
            pass
    return views


def _configuration(view: Any) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(voters, learners) of one node's view."""
    return (tuple(sorted(m.node_id for m in view.members if m.voter)),
            tuple(sorted(m.node_id for m in view.members if not m.voter)))


def _leader_view(brokers: list[Broker]) -> Any | None:
    views = asyncio.run(_views(brokers))
    return next((v for v in views.values() if v.role == "LEADER"), None)


def _change(run: Run, what: str, call: Callable[[Any], Any], done: Callable[[Any], bool],
            members: Callable[[], list[Broker]]) -> int:
    """Make membership change `what` (`call(admin)`), through a seeded member, again
    through another while it fails (a killed leader, an election), until the leader's
    view shows it `done`. Returns the attempts it took."""
    from danube_zmq.client.admin import AdminClient
    from danube_zmq.transport.errors import DanubeError

    deadline = time.monotonic() + CHANGE_DEADLINE_S
    attempts = 0
    while True:
        leader = _leader_view(members())
        if leader is not None and done(leader):
            return attempts
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not done within {CHANGE_DEADLINE_S:g} s (seed {run.seed}); leader view:"
                                 f" {leader}")
        via = run.rng.choice(members())
        attempts += 1

        async def attempt(via: Broker = via) -> None:
            async with AdminClient(via.admin_url, timeout_ms=5_000) as admin:
                await call(admin)

        try:
            asyncio.run(attempt())
        except (DanubeError, OSError, TimeoutError) as exc:
            run.notes.setdefault("membership_errors", []).append(f"{what} via {via.name}: {type(exc).__name__}")
            time.sleep(0.3)


def _kill_leader_during(run: Run, newcomer: Newcomer, change: Callable[[], int], what: str) -> None:
    """Start `change` in a thread, kill the Raft leader of that moment with SIGKILL
    0-300 ms (seeded) later, and wait for both."""
    leader = run.leader(among=_members(run, newcomer))
    delay_s = run.rng.uniform(0.0, 0.3)
    outcome: dict[str, Any] = {}

    def worker() -> None:
        try:
            outcome["attempts"] = change()
        except BaseException as exc:  # re-raised in the schedule's thread
            outcome["error"] = exc

    thread = threading.Thread(target=worker, name=what, daemon=True)
    thread.start()
    time.sleep(delay_s)
    run.notes.setdefault("killed_leaders", []).append(f"{leader.name} {round(delay_s * 1000)} ms into {what}")
    if leader.node_id == NEWCOMER_ID:
        newcomer.kill9_and_restart()
    else:
        run.faults.kill9(leader)
    thread.join(CHANGE_DEADLINE_S + 30)
    if "error" in outcome:
        raise outcome["error"]
    run.notes.setdefault("attempts", {})[what] = outcome.get("attempts")


def _members(run: Run, newcomer: Newcomer) -> list[Broker]:
    removed = run.notes.get("removed")
    return [b for b in run.cluster.brokers if b.name != removed]


def membership_change(run: Run) -> None:
    """R5's schedule (the module docstring)."""
    writers = [name for name in run.processes if name.startswith("admin-")]
    run.wait(lambda: all(run.acked(w) >= 20 for w in writers), "metadata writes before the membership changes")
    newcomer = Newcomer(run)  # stopped with its host's namespace at the end of the run
    newcomer.start()
    founders = list(run.cluster.brokers)
    run.cluster.brokers.append(newcomer.broker)  # its views count in wait_leader from now on
    run.spawn("observer-4", command("observe", name="observer-4", history_dir=run.history,
                                    admin_url=[newcomer.broker.admin_url], interval_ms=100, request_timeout_ms=500,
                                    duration_s=600))
    try:
        leader = run.leader(among=founders)  # node 4 knows no leader before it is added
        run.notes["first_leader_r5"] = leader.name
        _change(run, "add-node 4", lambda admin: admin.add_node(NEWCOMER_ID, newcomer.broker.raft_url),
                lambda view: NEWCOMER_ID in [m.node_id for m in view.members], lambda: founders)
        _kill_leader_during(run, newcomer, lambda: _change(
            run, "promote-node 4", lambda admin: admin.promote_node(NEWCOMER_ID),
            lambda view: NEWCOMER_ID in _configuration(view)[0], lambda: _members(run, newcomer)), "promote-node 4")
        leader = run.leader(among=_members(run, newcomer))
        removed = run.rng.choice([b for b in founders if b != leader])
        run.notes["removed"] = removed.name
        _kill_leader_during(run, newcomer, lambda: _change(
            run, f"remove-node {removed.node_id}", lambda admin: admin.remove_node(removed.node_id),
            lambda view: removed.node_id not in [m.node_id for m in view.members],
            lambda: _members(run, newcomer)), f"remove-node {removed.node_id}")
        run.notes["final"] = _agreed(run, newcomer, expected=tuple(sorted(
            b.node_id for b in _members(run, newcomer))))
    finally:
        run.stop("observer-4")


def _agreed(run: Run, newcomer: Newcomer, expected: tuple[int, ...]) -> dict[str, Any]:
    """Wait until every member answers with one leader and the configuration (voters
    `expected`, no learner); what they said last, and whether they agreed."""
    members = _members(run, newcomer)
    deadline = time.monotonic() + CHANGE_DEADLINE_S
    while True:
        views = asyncio.run(_views(members))
        said = {n: {"leader": v.leader_id, "term": v.term, "voters": list(_configuration(v)[0]),
                    "learners": list(_configuration(v)[1])} for n, v in views.items()}
        agreed = (len(views) == len(members) and len({(s["leader"], s["term"]) for s in said.values()}) == 1
                  and all(tuple(s["voters"]) == expected and not s["learners"] for s in said.values()))
        if agreed or time.monotonic() > deadline:
            return {"agreed": agreed, "expected_voters": list(expected), "views": said}
        time.sleep(0.3)


def judge_membership(run: Run, report: Report, ops: list[Op]) -> tuple[Report, dict[str, Any]]:
    """R5: the final configuration agreed by every member (a failed criterion if not)."""
    final = run.notes.get("final") or {"agreed": False}
    if not final["agreed"]:
        report = dataclasses.replace(report, criteria_failed=report.criteria_failed + 1, findings=(
            *report.findings, f"the members never agreed on the final configuration: {final}"))
    return report, {}

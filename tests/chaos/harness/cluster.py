"""A broker cluster across namespace hosts, started as the multi-host deployment of
docs/operations.md starts one across machines.

    h1: `danube cluster join` is not needed: `danube cluster up --place h1=..,h2=..,h3=..`
        starts h1's supervisor (the convention leader), waits for the others, places
        one broker per host and waits for a Raft leader
    h2, h3: `danube cluster join --convention h1:1900 --host-name hN` (one supervisor each)

Every broker binds its host's address (client, admin and Raft ports are the same
numbers on every host: each namespace has its own port space). Every `danube cluster`
command runs inside h1 (its supervisor binds h1's address); the test process reaches
the brokers over the bridge. `down()` stops the brokers and the supervisors; the
Hosts' removal kills whatever a failure left.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.chaos.harness.hosts import Host, Hosts

SUPERVISOR_PORT = 1900
CLIENT_PORT = 6650
ADMIN_PORT = 50051
RAFT_PORT = 7650
UP_TIMEOUT_S = 150.0
# Fast failure detection for chaos runs: a lost leader is replaced in about a second, a
# dead broker's lease runs out in 6 s (the brokers' own defaults, spelled out here so a
# change of defaults does not silently change what the scenarios test).
CONFIG = """\
cluster:
  tick_ms: 50
  heartbeat_interval_ms: 100
  election_timeout_ms_min: 500
  election_timeout_ms_max: 1000
  lease_ttl_ms: 6000
"""


class ClusterError(RuntimeError):
    """The cluster did not start or answer; the message names the log to read."""


@dataclass(frozen=True)
class Broker:
    name: str  # broker-N, as `danube cluster status` names it
    node_id: int
    host: Host
    url: str
    admin_url: str
    raft_url: str
    data_dir: Path
    log_path: Path

    def pid(self) -> int | None:
        """The running broker's pid, as its keeper wrote it (None between a kill and the
        restart's write)."""
        try:
            return int((self.data_dir / "broker.pid").read_text())
        except (OSError, ValueError):
            return None


def danube_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "danube_zmq.cli.main", *args]


class Cluster:
    """Three (or `len(hosts)`) brokers, one per namespace host, under one thespian
    supervisor per host: `with Cluster(hosts, tmp_path) as cluster: ...`."""

    def __init__(self, hosts: Hosts, data_dir: Path, *, config: str = CONFIG,
                 host_env: Callable[[Host], dict[str, str]] | None = None, members: int | None = None) -> None:
        self.hosts = hosts
        # The hosts that run a broker from the start: the first `members` (R5 keeps the
        # last host for a broker that joins later).
        self.members: list[Host] = list(hosts)[:members or len(hosts)]
        # Extra environment of each host's supervisor, which its brokers inherit (a
        # restarted broker too): tests/chaos/harness/clock.py's wall-clock shim.
        self.host_env = host_env
        self.data_dir = data_dir.resolve()
        self.config = config
        self.brokers: list[Broker] = []
        self.layout: dict[str, Any] = {}
        self._started = False

    @property
    def leader_host(self) -> Host:
        return self.hosts[0]

    def start(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        config = self.data_dir / "broker.yml"
        # seal_every_flush: a receipt means the batch is in the durable store, so a topic
        # taken over from a dead or paused owner loses nothing acknowledged (without it
        # the unsealed tail of the active segment is the documented loss window).
        config.write_text(f"storage:\n  mode: shared_fs\n  durable_url: {self.data_dir / 'durable'}\n"
                          "  seal_every_flush: true\n" + self.config)
        first = self.leader_host
        place = ",".join(f"{h.name}={h.address}" for h in self.members)
        up_log = self.data_dir / "up.log"
        self._started = True
        with open(up_log, "w") as err:
            up = first.popen(danube_argv("cluster", "up", "--brokers", str(len(self.members)), "--config", str(config),
                                         "--data-dir", str(self.data_dir), "--bind", first.address,
                                         "--supervisor-port", str(SUPERVISOR_PORT), "--host-name", first.name,
                                         "--place", place, "--client-port", str(CLIENT_PORT),
                                         "--admin-port", str(ADMIN_PORT), "--raft-port", str(RAFT_PORT),
                                         "--metrics-port", "0",
                                         "--output", "json"),
                             stdout=subprocess.PIPE, stderr=err, text=True, env=self._env(first))
        try:
            self._wait_listening(first.address, SUPERVISOR_PORT, up)
            for host in self.members[1:]:
                joined = host.run(danube_argv("cluster", "join", "--convention", f"{first.address}:{SUPERVISOR_PORT}",
                                              "--bind", host.address, "--supervisor-port", str(SUPERVISOR_PORT),
                                              "--host-name", host.name, "--data-dir", str(self.data_dir / host.name)),
                                  env=self._env(host))
                if joined.returncode != 0:
                    raise ClusterError(f"`cluster join` on {host.name} failed: {joined.stderr or joined.stdout}")
            out, _ = up.communicate(timeout=UP_TIMEOUT_S)
        except BaseException:
            if up.poll() is None:
                up.kill()
                up.wait(10)
            raise
        if up.returncode != 0:
            raise ClusterError(f"`cluster up` failed ({up.returncode}): {up_log.read_text()[-2000:]}")
        self.layout = json.loads(out)
        self.brokers = [Broker(name=b["name"], node_id=b["node_id"], host=self.hosts.by_name(b["host"]), url=b["url"],
                               admin_url=b["admin_url"], raft_url=b["raft"], data_dir=Path(b["data_dir"]),
                               log_path=Path(b["log"]))
                        for b in self.layout["brokers"]]

    def _env(self, host: Host) -> dict[str, str] | None:
        return None if self.host_env is None else {**os.environ, **self.host_env(host)}

    @staticmethod
    def _wait_listening(address: str, port: int, up: subprocess.Popen[str]) -> None:
        import socket

        deadline = time.monotonic() + UP_TIMEOUT_S
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                socket.create_connection((address, port), timeout=1).close()
                return
            if up.poll() is not None:
                raise ClusterError(f"`cluster up` exited ({up.returncode}) before its supervisor listened")
            time.sleep(0.2)
        raise ClusterError(f"no supervisor on {address}:{port} within {UP_TIMEOUT_S:g} s")

    def status(self) -> dict[str, Any]:
        """`danube cluster status --output json`, run on h1."""
        done = self.leader_host.run(danube_argv("cluster", "status", "--data-dir", str(self.data_dir),
                                                "--output", "json"), timeout=60)
        if done.returncode != 0:
            raise ClusterError(f"`cluster status` failed: {done.stderr or done.stdout}")
        return json.loads(done.stdout)

    def broker(self, name_or_url: str) -> Broker:
        return next(b for b in self.brokers if name_or_url in (b.name, b.url, b.admin_url))

    def by_node(self, node_id: int) -> Broker:
        return next(b for b in self.brokers if b.node_id == node_id)

    async def raft_views(self, timeout_ms: int = 1000) -> dict[int, Any]:
        """Each answering broker's ClusterStatusInfo (role, term, leader), by node id."""
        from danube_zmq.client.admin import AdminClient
        from danube_zmq.transport.errors import DanubeError

        views = {}
        for b in self.brokers:
            with contextlib.suppress(DanubeError, OSError):
                async with AdminClient(b.admin_url, timeout_ms=timeout_ms) as admin:
                    views[b.node_id] = await admin.cluster_status()
        return views

    async def wait_leader(self, *, among: list[Broker] | None = None, exclude: int | None = None,
                          deadline_s: float = 60.0) -> Broker:
        """The Raft leader that every answering broker of `among` (default all) agrees on,
        other than node `exclude`: a leader of a majority reports itself LEADER."""
        among = among or self.brokers
        wanted = {b.node_id for b in among}
        deadline = time.monotonic() + deadline_s
        last: object = "no answer"
        while time.monotonic() < deadline:
            views = {n: v for n, v in (await self.raft_views()).items() if n in wanted}
            leaders = {v.leader_id for v in views.values()}
            if len(views) == len(wanted) and len(leaders) == 1:
                leader = leaders.pop()
                if leader is not None and leader != exclude and leader in wanted \
                        and views[leader].role == "LEADER":
                    return self.by_node(leader)
            last = {n: (v.role, v.term, v.leader_id) for n, v in views.items()}
            await asyncio.sleep(0.2)
        raise ClusterError(f"no agreed Raft leader among {sorted(wanted)} (not {exclude}) within {deadline_s:g} s;"
                           f" last views (role, term, leader): {last}")

    async def owner(self, topic: str) -> Broker:
        """The broker serving `topic`, as a lookup through the first answering broker says."""
        from danube_zmq import DanubeClient

        async with DanubeClient(self.brokers[0].url) as client:
            return self.broker(await client.lookup(topic))

    def down(self) -> list[str]:
        """Stop every broker, then every supervisor; the steps that failed (each step
        runs whatever a fault or a failed start left; Hosts' removal kills any process
        still in a namespace)."""
        if not self._started:
            return []
        self._started = False
        steps = [(self.leader_host, danube_argv("cluster", "down", "--data-dir", str(self.data_dir)), 90)]
        steps += [(host, danube_argv("cluster", "leave", "--bind", host.address,
                                     "--supervisor-port", str(SUPERVISOR_PORT)), 30) for host in self.members[1:]]
        problems = []
        for host, argv, timeout in steps:
            try:
                done = host.run(argv, timeout=timeout)
            except subprocess.TimeoutExpired:
                problems.append(f"{' '.join(argv[3:5])} on {host.name}: no answer in {timeout} s")
                continue
            if done.returncode != 0:
                problems.append(f"{' '.join(argv[3:5])} on {host.name}: {(done.stderr or done.stdout).strip()[-300:]}")
        return problems

    def __enter__(self) -> Cluster:
        try:
            self.start()
        except BaseException:
            self.down()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.down()

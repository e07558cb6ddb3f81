"""`danube cluster up/status/down` end to end: three brokers under the thespian
supervisor, kill -9 of the broker serving a reliable topic while a producer sends with
acks (the supervisor restarts it within its lease; the stream resumes; nothing
acknowledged is lost), and a clean stop that leaves no process or port behind."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from danube_zmq import DanubeClient
from tests.integration.conftest import free_port

pytestmark = pytest.mark.cluster


def danube(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "danube_zmq.cli.main", *args], capture_output=True, text=True,
                          timeout=timeout)


def _ports(count: int) -> int:
    """A first port with `count` free ports after it."""
    while True:
        first = free_port()
        if first + count < 65000 and all(_free(first + i) for i in range(count)):
            return first


def _free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def test_cluster_up_status_kill_restart_down(tmp_path: Path) -> None:
    data_dir = tmp_path / "cluster"
    config = tmp_path / "broker.yml"
    config.write_text(f"storage:\n  mode: shared_fs\n  durable_url: {tmp_path / 'shared'}\n"
                      "cluster:\n  lease_ttl_ms: 6000\n")
    supervisor_port = _ports(1)
    up = danube("cluster", "up", "--brokers", "3", "--config", str(config), "--data-dir", str(data_dir),
                "--client-port", str(_ports(3)), "--admin-port", str(_ports(3)), "--raft-port", str(_ports(3)),
                "--metrics-port", "0", "--supervisor-port", str(supervisor_port), "--output", "json")
    try:
        assert up.returncode == 0, up.stderr + up.stdout
        layout = json.loads(up.stdout)
        urls = [b["url"] for b in layout["brokers"]]
        assert layout["leader_node_id"] in (1, 2, 3)
        # The supervisor's admin port listens on the cluster's address only.
        listening = {c.laddr for c in psutil.net_connections("tcp") if c.status == psutil.CONN_LISTEN}
        assert ("127.0.0.1", supervisor_port) in listening
        assert ("0.0.0.0", supervisor_port) not in listening

        status = danube("cluster", "status", "--data-dir", str(data_dir), "--output", "json")
        assert status.returncode == 0, status.stderr
        report = json.loads(status.stdout)
        assert [b["running"] for b in report["brokers"]] == [True, True, True]
        assert sorted(b["raft_role"] for b in report["brokers"]) == ["follower", "follower", "leader"]
        assert report["leader_node_id"] == layout["leader_node_id"]

        asyncio.run(_kill_the_owner_while_producing(urls, layout, data_dir))

        status = json.loads(danube("cluster", "status", "--data-dir", str(data_dir), "--output", "json").stdout)
        assert sum(b["restarts"] for b in status["brokers"]) == 1, status
        assert sum(b["topics"] for b in status["brokers"]) == 1
    finally:
        down = danube("cluster", "down", "--data-dir", str(data_dir))
    assert down.returncode == 0, down.stderr + down.stdout
    assert "stopped broker-1, broker-2, broker-3" in down.stdout
    deadline = time.monotonic() + 10
    while _leftovers(data_dir, supervisor_port) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _leftovers(data_dir, supervisor_port)
    assert not any(c.laddr[1] == supervisor_port for c in psutil.net_connections("tcp")
                   if c.status == psutil.CONN_LISTEN)


def _leftovers(data_dir: Path, supervisor_port: int) -> list[int]:
    """Brokers of this cluster, and the supervisor's processes (thespian forks them
    from the helper, so they keep its command line)."""
    found = []
    for process in psutil.process_iter(["pid", "cmdline"]):
        cmdline = " ".join(process.info["cmdline"] or [])
        if str(data_dir) in cmdline or f"--port {supervisor_port}" in cmdline:
            found.append(process.info["pid"])
    return found


async def _kill_the_owner_while_producing(urls: list[str], layout: dict, data_dir: Path) -> None:
    topic, total = "/default/supervised", 400
    async with DanubeClient(urls[0]) as client:
        producer = await client.create_producer(topic, dispatch="reliable")
        consumer = await client.subscribe(topic, "audit", initial_position="earliest")
        owner_url = await client.lookup(topic)
        owner = next(b for b in layout["brokers"] if b["url"] == owner_url)
        acked: list[tuple[int, bytes]] = []
        killed_at = resumed_at = 0.0
        for i in range(total):
            if i == total // 2:
                pid = int((Path(owner["data_dir"]) / "broker.pid").read_text())
                os.kill(pid, signal.SIGKILL)
                killed_at = time.monotonic()
            message_id = await producer.send(f"s{i:04d}".encode())
            acked.append((message_id.offset, f"s{i:04d}".encode()))
            if i == total // 2:
                resumed_at = time.monotonic()
        received = set()
        deadline = time.monotonic() + 60
        while len(received) < total and time.monotonic() < deadline:
            message = await consumer.receive(timeout=30)
            received.add(message.payload)
            await consumer.ack(message)
    offsets = [offset for offset, _ in acked]
    assert offsets == sorted(set(offsets)), "an offset was reused"
    lost = [p for _, p in acked if p not in received]
    assert not lost, f"acknowledged messages lost: {lost[:5]}"
    print(f"kill -9 of the owner -> the next send acknowledged after {resumed_at - killed_at:.2f} s;"
          f" {total} acknowledged, none lost")


def _listener_pid(port: int) -> int | None:
    """The pid of the process listening on loopback `port` (a supervisor's ActorSystem)."""
    return next((c.pid for c in psutil.net_connections("tcp")
                 if c.status == psutil.CONN_LISTEN and c.laddr == ("127.0.0.1", port)), None)


def _family(pid: int | None) -> set[int]:
    """`pid` and its ancestors but init: a supervisor's ActorSystem forks its actors from
    its own processes."""
    if pid is None:
        return set()
    process = psutil.Process(pid)
    return ({pid} | {p.pid for p in process.parents()}) - {1}


def test_brokers_are_placed_on_convention_members_by_capability(tmp_path: Path) -> None:
    """Two supervisors (two "hosts" on loopback): `up --place a=...,b=...` on the first
    waits for the second to `join` its convention, then places one broker on each by
    their `danube-host` capability; the broker on b is started, and restarted after
    kill -9, by a keeper running on b's ActorSystem."""
    leader_port, member_port = _ports(1), _ports(1)
    while member_port == leader_port:
        member_port = _ports(1)
    data_dir = tmp_path / "cluster"
    up = subprocess.Popen(
        [sys.executable, "-m", "danube_zmq.cli.main", "cluster", "up", "--brokers", "2", "--data-dir", str(data_dir),
         "--client-port", str(_ports(2)), "--admin-port", str(_ports(2)), "--raft-port", str(_ports(2)),
         "--metrics-port", "0", "--supervisor-port", str(leader_port), "--host-name", "a",
         "--place", "a=127.0.0.1,b=127.0.0.1",
         "--output", "json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while not any(c.laddr == ("127.0.0.1", leader_port) for c in psutil.net_connections("tcp")
                      if c.status == psutil.CONN_LISTEN):
            assert time.monotonic() < deadline and up.poll() is None, up.communicate()
            time.sleep(0.2)
        joined = danube("cluster", "join", "--convention", f"127.0.0.1:{leader_port}", "--bind", "127.0.0.1",
                        "--supervisor-port", str(member_port), "--host-name", "b", "--data-dir", str(tmp_path / "b"))
        assert joined.returncode == 0, joined.stderr
        out, err = up.communicate(timeout=120)
        assert up.returncode == 0, err + out
        status = json.loads(danube("cluster", "status", "--data-dir", str(data_dir), "--output", "json").stdout)
        assert [(b["name"], b["host"], b["running"]) for b in status["brokers"]] == [
            ("broker-1", "a", True), ("broker-2", "b", True)]
        on_b = psutil.Process(status["brokers"][1]["pid"])
        # By pid, not command line: thespian retitles its processes when setproctitle is installed.
        ancestry = {p.pid for p in on_b.parents()} - {1}
        assert ancestry & _family(_listener_pid(member_port)), "the broker on b is not started by b's supervisor"
        assert not ancestry & _family(_listener_pid(leader_port)), "the broker on b is started by a's supervisor"
        on_b.kill()
        deadline = time.monotonic() + 10
        while True:
            status = json.loads(danube("cluster", "status", "--data-dir", str(data_dir), "--output", "json").stdout)
            if status["brokers"][1]["restarts"] == 1 and status["brokers"][1]["running"]:
                break
            assert time.monotonic() < deadline, status
            time.sleep(0.2)
    finally:
        if up.poll() is None:
            up.kill()
        danube("cluster", "down", "--data-dir", str(data_dir))
        danube("cluster", "leave", "--bind", "127.0.0.1", "--supervisor-port", str(member_port))
    deadline = time.monotonic() + 10
    while (_leftovers(data_dir, leader_port) or _leftovers(data_dir, member_port)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _leftovers(data_dir, leader_port) and not _leftovers(data_dir, member_port)

"""Namespace hosts (tests/chaos/harness/hosts.py): made, reachable across the bridge, and removed
completely at the end, after a failure, and after their owning process died."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from tests.chaos.conftest import links, namespaces, require_hosts, tcp_reachable
from tests.chaos.harness.hosts import STATE_DIR, Hosts, sweep_stale


def _listen(host: object, port: int) -> subprocess.Popen[bytes]:
    """A TCP listener inside `host` on its address (accepts forever)."""
    code = ("import socket; s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1);"
            f" s.bind(({host.address!r}, {port})); s.listen()\n"  # type: ignore[attr-defined]
            "while True: s.accept()[0].close()")
    return host.popen([sys.executable, "-c", code])  # type: ignore[attr-defined]


def _wait_reachable(source: object, address: str, port: int) -> bool:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if tcp_reachable(source, address, port):
            return True
        time.sleep(0.2)
    return False


def test_hosts_reach_each_other_and_are_removed_at_exit() -> None:
    """Three namespaces on one bridge: a host reaches another host's address and the root
    namespace reaches every host (over the bridge, not loopback); at exit the
    namespaces, veths, bridge, state file and the processes left inside are gone."""
    require_hosts()
    with Hosts(3) as hosts:
        made = {h.netns for h in hosts}
        made_links = {h.veth for h in hosts} | {f"dz{hosts.run_id}br"}
        assert made <= namespaces() and made_links <= links()
        assert [h.address for h in hosts] == [f"10.77.{hosts.net}.{i}" for i in (1, 2, 3)]
        listener = _listen(hosts[2], 9000)
        assert _wait_reachable(hosts[0], hosts[2].address, 9000)
        assert _wait_reachable(None, hosts[2].address, 9000)
        # Loopback inside one host is its own: nothing listens on h1's loopback.
        assert not tcp_reachable(hosts[0], "127.0.0.1", 9000)
        assert listener.pid in hosts[2].pids()
        state = STATE_DIR / f"{hosts.run_id}.json"
        assert state.exists()
    assert listener.wait(10) == -signal.SIGKILL  # killed by the removal, not left running
    assert not made & namespaces() and not made_links & links() and not state.exists()


def test_hosts_are_removed_when_the_body_raises() -> None:
    """An exception inside `with Hosts()` still removes every namespace and link."""
    require_hosts()
    made: set[str] = set()
    with pytest.raises(ZeroDivisionError), Hosts(2) as hosts:
        made = {h.netns for h in hosts} | {h.veth for h in hosts}
        1 / 0  # noqa: B018
    assert made and not made & (namespaces() | links())


def test_sweeper_removes_what_a_killed_run_left() -> None:
    """A run whose process dies by kill -9 cannot clean up: its namespaces stay. The next
    run's sweeper finds its state file, sees its owner is dead and removes them (and
    leaves live runs alone)."""
    require_hosts()
    code = ("import sys, time; from tests.chaos.harness.hosts import Hosts; h = Hosts(2).__enter__();"
            " print(h.run_id, flush=True); time.sleep(600)")
    orphan = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        run_id = orphan.stdout.readline().strip()  # type: ignore[union-attr]
        assert run_id, "the orphan run did not start"
        with Hosts(1) as live:
            assert run_id not in sweep_stale()  # its owner is alive
            orphan.kill()
            orphan.wait(10)
            left = {f"dz{run_id}h1", f"dz{run_id}h2"}
            assert left <= namespaces()
            assert run_id in sweep_stale()
            assert not left & namespaces() and f"dz{run_id}br" not in links()
            assert live[0].netns in namespaces()  # a live run is not swept
    finally:
        orphan.kill()


def test_sweeper_removes_our_names_no_state_file_claims() -> None:
    """A namespace and a bridge of our naming shape with no state file (a removal that
    stopped half way after deleting it) are removed by the sweeper; a name of another
    shape is left alone."""
    require_hosts()
    made = ["dzq9zzh2", "dzq9zzbr", "dzq9zz-not-ours"]
    subprocess.run(["ip", "netns", "add", made[0]], check=True)
    subprocess.run(["ip", "link", "add", made[1], "type", "bridge"], check=True)
    subprocess.run(["ip", "netns", "add", made[2]], check=True)
    try:
        assert "q9zz" in sweep_stale()
        assert made[0] not in namespaces() and made[1] not in links()
        assert made[2] in namespaces()
    finally:
        for ns in (made[0], made[2]):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        subprocess.run(["ip", "link", "del", made[1]], capture_output=True)

"""Network faults (tests/chaos/harness/faults.py) on bare namespace hosts: each cuts what it says,
leaves the rest (the tests' bridge address) alone, and heal restores the network.
Checked with real TCP connections and UDP datagrams between the namespaces."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import pytest

from tests.chaos.conftest import tcp_reachable
from tests.chaos.harness.faults import Faults, FaultUnavailable, netem_available
from tests.chaos.harness.hosts import Host, Hosts

# With the smoke: these need nft, which the harness installs (scripts/install-chaos.sh),
# and that is the chaos envs' business, not the main env's.
pytestmark = pytest.mark.chaos_smoke

PORT = 9000
UDP_PORT = 9001


def _serve(hosts: Hosts) -> list[subprocess.Popen[bytes]]:
    """On every host: a TCP listener (accepts and closes) and a UDP counter that answers
    'n' with how many datagrams it got."""
    code = """
import socket, sys, threading
address = sys.argv[1]
tcp = socket.socket(); tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
tcp.bind((address, int(sys.argv[2]))); tcp.listen()
threading.Thread(target=lambda: [tcp.accept()[0].close() for _ in iter(int, 1)], daemon=True).start()
udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); udp.bind((address, int(sys.argv[3])))
count = 0
while True:
    data, peer = udp.recvfrom(64)
    if data == b"n":
        udp.sendto(str(count).encode(), peer); count = 0
    else:
        count += 1
"""
    servers = [h.popen([sys.executable, "-c", code, h.address, str(PORT), str(UDP_PORT)]) for h in hosts]
    for h in hosts:
        deadline = time.monotonic() + 30
        while not tcp_reachable(None, h.address, PORT):
            assert time.monotonic() < deadline, f"no listener on {h.name}"
            time.sleep(0.2)
    return servers


def _send(source: Host, target: Host, count: int) -> None:
    """`count` datagrams from `source` to `target`."""
    code = ("import socket, sys, time; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
            f"for _ in range({count}): s.sendto(b'x', ({target.address!r}, {UDP_PORT})); time.sleep(0.001)")
    source.run([sys.executable, "-c", code], check=True)
    time.sleep(0.3)


def _arrived(target: Host) -> int | None:
    """How many datagrams `target` got since last asked (asked from the root namespace,
    over the bridge)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(3)
        s.sendto(b"n", (target.address, UDP_PORT))
        try:
            return int(s.recv(64))
        except OSError:
            return None


def _datagrams(source: Host, target: Host, count: int) -> int | None:
    """Send `count` datagrams from `source` to `target`; how many arrived."""
    _send(source, target, count)
    return _arrived(target)


def test_isolate_cuts_a_host_from_its_peers_and_heal_restores_it(hosts: Hosts) -> None:
    """While h1 is isolated, h2 and h3 cannot open a connection to it nor it to them,
    but h2 and h3 still talk and the bridge (the tests' address) still reaches h1;
    after heal every path works again and the fault is recorded with both times."""
    _serve(hosts)
    h1, h2, h3 = hosts
    with Faults(hosts) as faults:
        fault = faults.isolate(h1)
        assert not tcp_reachable(h2, h1.address, PORT)
        assert not tcp_reachable(h1, h3.address, PORT)
        assert tcp_reachable(h2, h3.address, PORT)
        assert tcp_reachable(None, h1.address, PORT)
        faults.heal(fault)
        assert tcp_reachable(h2, h1.address, PORT) and tcp_reachable(h1, h3.address, PORT)
        assert fault.healed_at is not None and fault.healed_at >= fault.started_at
        assert [f.kind for f in faults.history] == ["partition"]


def test_bridge_node_talks_to_both_sides_that_cannot_talk(hosts: Hosts) -> None:
    """bridge(h1, h2, h3): h1 and h3 are cut from each other; h2 reaches both and both
    reach h2. Leaving the `with` heals it."""
    _serve(hosts)
    h1, h2, h3 = hosts
    with Faults(hosts) as faults:
        faults.bridge(h1, h2, h3)
        assert not tcp_reachable(h1, h3.address, PORT) and not tcp_reachable(h3, h1.address, PORT)
        assert tcp_reachable(h1, h2.address, PORT) and tcp_reachable(h3, h2.address, PORT)
        assert tcp_reachable(h2, h1.address, PORT) and tcp_reachable(h2, h3.address, PORT)
    assert tcp_reachable(h1, h3.address, PORT)


def test_one_way_drops_one_direction_only(hosts: Hosts) -> None:
    """one_way(h1, h2): h2 receives none of h1's datagrams while h1 still receives all of
    h2's; after heal h2 receives h1's again."""
    _serve(hosts)
    h1, h2, _ = hosts
    with Faults(hosts) as faults:
        fault = faults.one_way(h1, h2)
        assert _datagrams(h1, h2, 50) == 0
        assert _datagrams(h2, h1, 50) == 50
        faults.heal(fault)
    assert _datagrams(h1, h2, 50) == 50


def test_loss_drops_about_its_share_of_packets(hosts: Hosts) -> None:
    """loss(h2, 50): of 400 datagrams into h2 some but far from all arrive (a binomial
    band wide enough never to fail by chance: 400 draws at p=0.5 leave 80..320 with
    probability 1 - 1e-30); loss 100 drops all; heal drops none."""
    _serve(hosts)
    h1, h2, _ = hosts
    with Faults(hosts) as faults:
        half = faults.loss(h2, 50)
        _send(h1, h2, 400)
        faults.heal(half)  # before asking: the question and its answer cross h2's link too
        arrived = _arrived(h2)
        assert arrived is not None and 80 <= arrived <= 320, arrived
        faults.loss(h2, 100)
        assert not tcp_reachable(h1, h2.address, PORT)
    assert _datagrams(h1, h2, 100) == 100


def test_delay_uses_netem_or_says_it_is_unavailable(hosts: Hosts) -> None:
    """Where the kernel has netem, delay(h1, 200) slows h1's packets and heal removes
    the qdisc; where it has not (this project's CI machine), delay raises
    FaultUnavailable naming the missing kernel option and records nothing."""
    h1 = hosts[0]
    with Faults(hosts) as faults:
        if not netem_available(h1):
            with pytest.raises(FaultUnavailable, match="CONFIG_NET_SCH_NETEM"):
                faults.delay(h1, 200)
            assert faults.history == []
            return
        fault = faults.delay(h1, 200)
        assert "netem" in h1.run(["tc", "qdisc", "show", "dev", "eth0"]).stdout
        faults.heal(fault)
        assert "netem" not in h1.run(["tc", "qdisc", "show", "dev", "eth0"]).stdout

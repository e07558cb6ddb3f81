"""Where a sequential Raft put spends its time: timestamps at every hop, 3 brokers.

    .venv/bin/python benchmarks/raft_stages.py --count 400

Starts 3 brokers (`cluster:` section, as benchmarks/raft.py) whose processes are this
script in `--child` mode: it wraps the functions on the write path with a recorder of
`time.monotonic_ns()` (CLOCK_MONOTONIC, one clock for every process on the machine),
then runs the broker CLI. Puts go one at a time to the leader; each put's window (client
send -> client receive) takes the first occurrence of each hop on each node, and the
table shows every hop's median offset from the client's send, in time order, with the
median gap from the hop before it. Nothing here changes what the brokers do, only what
they cost (a few µs per hop for the recorder itself).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

_HOPS: list[tuple[int, str]] = []


def _mark(label: str) -> None:
    _HOPS.append((time.monotonic_ns(), label))


def _wrap(owner: Any, name: str, label: Any, *, after: str | None = None) -> None:
    """Record `label` (or `label(args)`) when `owner.name` is called (and `after` once it returned)."""
    original = getattr(owner, name)
    if asyncio.iscoroutinefunction(original):
        async def wrapped_async(*args: Any, **kwargs: Any) -> Any:
            _mark(label(*args, **kwargs) if callable(label) else label)
            try:
                return await original(*args, **kwargs)
            finally:
                if after:
                    _mark(after)
        setattr(owner, name, wrapped_async)
    else:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            _mark(label(*args, **kwargs) if callable(label) else label)
            try:
                return original(*args, **kwargs)
            finally:
                if after:
                    _mark(after)
        setattr(owner, name, wrapped)


def _entries(msg: Any) -> str:
    n = len(getattr(msg, "entries", ()) or ())
    return f"{type(msg).__name__}" + (f"[{n}]" if n else "")


def child(trace: str) -> None:
    """Instrument, then run the broker CLI (argv after `--`). SIGUSR2 writes the trace."""
    from danube_zmq.actors.cluster import cluster_admin
    from danube_zmq.actors.sockets import admin_gateway
    from danube_zmq.consensus import log_store, peer

    _wrap(admin_gateway.AdminGateway, "_on_frame", "gw.frame")
    _wrap(cluster_admin, "metadata_put", "store.put", after="store.put.done")
    _wrap(admin_gateway.AdminGateway, "_send_out", "gw.reply")
    _wrap(peer.RaftPeer, "_enqueue", "peer.enqueue")
    _wrap(peer.RaftPeer, "_step_batch",
          lambda self, events: "step:" + "+".join(sorted({_entries(getattr(e, "message", e)) for e in events})))
    _wrap(peer.RaftPeer, "_send", lambda self, msg: "send:" + _entries(msg))
    _wrap(peer.RaftPeer, "_apply", "apply", after="apply.done")
    _wrap(peer, "_within", "wait", after="wait.done")
    _wrap(peer.RaftPeer, "_run_segment", "segment", after="segment.done")
    _wrap(peer.RaftPeer, "_persisted", "leader.fsynced")
    _wrap(log_store.RaftLogStore, "append", lambda self, entries, **_: f"append[{len(entries)}]", after="append.done")
    protocol = peer.PEER_PROTOCOL
    decode = protocol.decode

    def traced_decode(data: bytes) -> Any:
        msg = decode(data)
        _mark("recv:" + _entries(msg))
        return msg

    protocol.decode = traced_decode  # type: ignore[method-assign]

    def dump(*_: Any) -> None:
        with open(trace, "w") as out:
            out.writelines(f"{t} {label}\n" for t, label in _HOPS)
            out.write("end\n")

    signal.signal(signal.SIGUSR2, dump)
    from danube_zmq.cli.main import main as cli

    sys.argv = ["danube", *sys.argv[sys.argv.index("--") + 1 :]]
    cli()


def start_traced(node: Any, nodes: list[Any], trace: str) -> None:
    """benchmarks/raft.py's `Node.start`, with this script in `--child` mode as the process."""
    env = {
        **os.environ,
        "DANUBE_CLUSTER__NODE_ID": str(node.node_id),
        "DANUBE_CLUSTER__RAFT_LISTEN": node.raft,
        "DANUBE_CLUSTER__PEERS": ",".join(f"{n.node_id}={n.raft}" for n in nodes),
    }
    node.process = subprocess.Popen(
        [sys.executable, __file__, "--child", trace, "--", "broker", "start", "--listen", node.url,
         "--admin-listen", node.admin_url, "--metrics-port", "0", "--data-dir", node.data_dir],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)


async def drive(count: int) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from raft import Node, agreed_leader

    from danube_zmq.client.admin import AdminClient

    root = tempfile.mkdtemp(prefix="danube-raft-stages-")
    nodes = [Node(root, i) for i in (1, 2, 3)]
    traces = {n.node_id: os.path.join(root, f"trace-{n.node_id}") for n in nodes}
    try:
        for node in nodes:
            start_traced(node, nodes, traces[node.node_id])
        leader_id, _ = await agreed_leader(nodes)
        windows: list[tuple[int, int]] = []
        async with AdminClient(nodes[leader_id - 1].admin_url, timeout_ms=10_000) as admin:
            for i in range(50):
                await admin.metadata_put(f"/warm/{i}", b"x" * 100)
            for i in range(count):
                started = time.monotonic_ns()
                await admin.metadata_put(f"/bench/{i}", b"x" * 100)
                windows.append((started, time.monotonic_ns()))
        for node in nodes:
            assert node.process is not None
            node.process.send_signal(signal.SIGUSR2)
        for node in nodes:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                if os.path.exists(traces[node.node_id]) and open(traces[node.node_id]).read().endswith("end\n"):
                    break
                await asyncio.sleep(0.1)
        report(leader_id, windows, traces)
    finally:
        for node in nodes:
            node.kill()
        shutil.rmtree(root, ignore_errors=True)


def report(leader_id: int, windows: list[tuple[int, int]], traces: dict[int, str]) -> None:
    hops: list[tuple[int, str]] = []
    followers = iter(("F1", "F2"))
    for node_id, path in sorted(traces.items()):
        who = "L" if node_id == leader_id else next(followers)
        for line in open(path).read().splitlines()[:-1]:
            t, label = line.split(" ", 1)
            hops.append((int(t), f"{who} {label}"))
    hops.sort()
    offsets: dict[str, list[float]] = defaultdict(list)
    totals = [(end - start) / 1000 for start, end in windows]
    i = 0
    for start, end in windows:
        while i < len(hops) and hops[i][0] < start:
            i += 1
        seen: set[str] = set()
        j = i
        while j < len(hops) and hops[j][0] <= end:
            t, label = hops[j]
            if label not in seen:
                seen.add(label)
                offsets[label].append((t - start) / 1000)
            j += 1
    common = {label: v for label, v in offsets.items() if len(v) >= len(windows) // 2}
    rows = sorted((statistics.median(v), label, len(v)) for label, v in common.items())
    print(f"{len(windows)} sequential puts, median {statistics.median(totals):.0f} µs client send -> receive;"
          f" load average {os.getloadavg()[0]:.2f}")
    print(f"{'hop':<44} {'at µs':>7} {'+µs':>6} {'seen':>5}")
    before = 0.0
    for at, label, seen in rows:
        print(f"{label:<44} {at:>7.0f} {at - before:>6.0f} {seen:>5}")
        before = at
    print(f"{'client receives':<44} {statistics.median(totals):>7.0f} {statistics.median(totals) - before:>6.0f}")


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        child(sys.argv[2])
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=400)
    args = parser.parse_args()
    asyncio.run(drive(args.count))


if __name__ == "__main__":
    main()

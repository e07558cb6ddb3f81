"""Raft metadata store figures on 3 broker processes on loopback (`cluster:` section).

    .venv/bin/python benchmarks/raft.py writes --count 2000 --concurrency 1 --via leader
    .venv/bin/python benchmarks/raft.py writes --count 10000 --concurrency 64
    .venv/bin/python benchmarks/raft.py election --runs 10

`writes`: committed puts through the admin API (`metadata put`) of the brokers named
by `--via` (leader, follower, or all: proposers spread over the three), each
acknowledged once the entry is committed on a majority (every log append fsynced) and
applied on the broker asked. `--concurrency N` runs N
proposers, each with its own admin connection and one request at a time. Reports puts/s
and commit latency percentiles (request sent -> acknowledgement received).

`election`: kill -9 the leader, time until the two survivors agree on a new leader
(polled every 10 ms through `cluster status`), restart the killed broker, wait until
it has caught up, repeat. Reports every run and the median.

Brokers use the default Raft timing (tick 50 ms, heartbeat 100 ms, election timeout
500-1000 ms). Prints one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

from e2e import percentile  # benchmarks/ is on sys.path when a script here runs

from danube_zmq.client.admin import AdminClient
from danube_zmq.transport.errors import DanubeError


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Node:
    def __init__(self, root: str, node_id: int) -> None:
        self.node_id = node_id
        self.data_dir = os.path.join(root, f"node-{node_id}")
        self.raft = f"tcp://127.0.0.1:{free_port()}"
        self.url = f"tcp://127.0.0.1:{free_port()}"
        self.admin_url = f"tcp://127.0.0.1:{free_port()}"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, nodes: list[Node], python: str | None = None) -> None:
        """`python`: another venv's interpreter runs its checkout's broker (an A/B)."""
        env = {
            **os.environ,
            "DANUBE_CLUSTER__NODE_ID": str(self.node_id),
            "DANUBE_CLUSTER__RAFT_LISTEN": self.raft,
            "DANUBE_CLUSTER__PEERS": ",".join(f"{n.node_id}={n.raft}" for n in nodes),
        }
        self.process = subprocess.Popen(
            [python or sys.executable, "-m", "danube_zmq.cli.main", "broker", "start", "--listen", self.url, "--admin-listen",
             self.admin_url, "--metrics-port", "0", "--data-dir", self.data_dir],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)

    def kill(self) -> None:
        if self.process is not None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()
            self.process = None


async def cluster_status(node: Node) -> object | None:
    try:
        async with AdminClient(node.admin_url, timeout_ms=500) as admin:
            return await admin.cluster_status()
    except DanubeError:
        return None


async def agreed_leader(nodes: list[Node], term_above: int = 0, timeout_s: float = 30.0) -> tuple[int, int]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        seen = [await cluster_status(n) for n in nodes if n.process is not None]
        if all(seen):
            leaders = {s.leader_id for s in seen}  # type: ignore[union-attr]
            terms = {s.term for s in seen}  # type: ignore[union-attr]
            if len(leaders) == 1 and None not in leaders and len(terms) == 1 and min(terms) > term_above:
                return leaders.pop(), terms.pop()  # type: ignore[return-value]
        await asyncio.sleep(0.01)
    raise SystemExit("no leader agreed on")


async def caught_up(nodes: list[Node], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        seen = [await cluster_status(n) for n in nodes]
        if all(seen) and len({s.applied_index for s in seen}) == 1:  # type: ignore[union-attr]
            return
        await asyncio.sleep(0.05)
    raise SystemExit("a node did not catch up")


def percentiles(samples_us: list[int]) -> dict[str, float]:
    ordered = sorted(samples_us)
    return {f"{name}_ms": round(percentile(ordered, q), 2) for name, q in
            (("p50", 0.50), ("p90", 0.90), ("p99", 0.99), ("max", 1.0))}


async def writes(nodes: list[Node], count: int, concurrency: int, size: int, via: str) -> dict[str, object]:
    leader_id, _ = await agreed_leader(nodes)
    if via == "leader":
        targets = [nodes[leader_id - 1]]
    elif via == "follower":
        targets = [n for n in nodes if n.node_id != leader_id]
    else:
        targets = nodes
    value = b"x" * size
    latencies: list[int] = []  # microseconds
    per = count // concurrency

    async def proposer(p: int) -> None:
        node = targets[p % len(targets)]
        async with AdminClient(node.admin_url, timeout_ms=10_000) as admin:
            for i in range(per):
                started = time.perf_counter_ns()
                await admin.metadata_put(f"/bench/{p}/{i % 100}", value)
                latencies.append((time.perf_counter_ns() - started) // 1000)

    started = time.perf_counter()
    await asyncio.gather(*(proposer(p) for p in range(concurrency)))
    elapsed = time.perf_counter() - started
    return {"workload": "writes", "peers": len(nodes), "via": via, "concurrency": concurrency,
            "value_bytes": size, "committed": len(latencies), "seconds": round(elapsed, 2),
            "writes_per_s": round(len(latencies) / elapsed), **percentiles(latencies)}


async def election(nodes: list[Node], runs: int) -> dict[str, object]:
    times: list[float] = []
    for _ in range(runs):
        leader_id, term = await agreed_leader(nodes)
        leader = nodes[leader_id - 1]
        killed = time.monotonic()
        leader.kill()
        await agreed_leader(nodes, term_above=term)
        times.append(time.monotonic() - killed)
        leader.start(nodes)
        await caught_up(nodes)
    return {"workload": "election", "peers": len(nodes), "runs": runs,
            "election_ms": [round(t * 1000) for t in times],
            "median_ms": round(statistics.median(times) * 1000), "max_ms": round(max(times) * 1000)}


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="workload", required=True)
    w = sub.add_parser("writes")
    w.add_argument("--count", type=int, default=2000)
    w.add_argument("--concurrency", type=int, default=1)
    w.add_argument("--size", type=int, default=100)
    w.add_argument("--via", choices=["leader", "follower", "all"], default="all")
    e = sub.add_parser("election")
    e.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()

    root = tempfile.mkdtemp(prefix="danube-raft-bench-")
    nodes = [Node(root, i) for i in (1, 2, 3)]
    try:
        for node in nodes:
            node.start(nodes)
        if args.workload == "writes":
            report = await writes(nodes, args.count, args.concurrency, args.size, args.via)
        else:
            report = await election(nodes, args.runs)
        print(json.dumps(report))
    finally:
        for node in nodes:
            node.kill()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    asyncio.run(main())

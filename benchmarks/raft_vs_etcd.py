"""Raft writes side by side: our 3-broker metadata group against a 3-member etcd 3.4.

    .venv/bin/python benchmarks/raft_vs_etcd.py --repeat 3 --count 2000
    .venv/bin/python benchmarks/raft_vs_etcd.py --broker before=/work/main/.venv/bin/python \
        --broker after=.venv/bin/python --repeat 3

Starts, for every run, 3 etcd members on loopback (Debian `etcd-server`, installed by
scripts/install-peers.sh when missing; own tmp data dirs, free ports, default fsync:
etcd syncs its WAL before it acknowledges) and 3 of our brokers (`cluster:` section,
every Raft append fsynced before it counts), and drives both the same way: N proposers
(`--concurrency`, default 1 and 64; `--count` puts sequential, `--count-concurrent`
with more), each one request at a time, puts of a `--size`-byte
value to distinct keys, all through the leader (`--via all` spreads the proposers over
the three members; a follower forwards). A put is acknowledged once committed on a
majority and applied on the member asked. Systems alternate run by run (etcd, then each
`--broker`, repeated), each on fresh servers; the table shows medians of puts/s and
commit latency p50/p99 and, for ours, the leader's CPU per put (user + sys of its process
over the run, psutil); every run is appended to benchmarks/results/raft_vs_etcd.jsonl.

etcd is driven over its native gRPC KV API (`/etcdserverpb.KV/Put`) with grpcio. The
`etcd3` package is not used: its generated stubs need protobuf < 4 and this venv has
protobuf 5+. Instead of generated stubs the two messages the benchmark needs are
encoded by hand (PutRequest: field 1 key, field 2 value; StatusResponse: field 4 leader,
header field 2 member id), which is the same bytes a generated client sends.
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
from pathlib import Path
from typing import Any

import grpc
import psutil
from e2e import percentile  # benchmarks/ is on sys.path when a script here runs
from harness import append, now_utc
from raft import Node, agreed_leader

from danube_zmq.client.admin import AdminClient

WORKLOAD = "raft_vs_etcd"
_INSTALL = Path(__file__).resolve().parent.parent / "scripts" / "install-peers.sh"
_READY_TIMEOUT_S = 60.0


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        out.append(low | (0x80 if n else 0))
        if not n:
            return bytes(out)


def encode_put(key: bytes, value: bytes) -> bytes:
    """etcd's `PutRequest{key=1, value=2}` (both length-delimited)."""
    return b"\x0a" + _varint(len(key)) + key + b"\x12" + _varint(len(value)) + value


def decode_fields(data: bytes) -> dict[int, Any]:
    """A protobuf message's top-level fields: varints as int, length-delimited as bytes."""
    fields: dict[int, Any] = {}
    i = 0
    while i < len(data):
        tag, i = _read_varint(data, i)
        number, kind = tag >> 3, tag & 7
        if kind == 0:
            fields[number], i = _read_varint(data, i)
        elif kind == 2:
            size, i = _read_varint(data, i)
            fields[number], i = data[i : i + size], i + size
        elif kind == 1:
            i += 8
        elif kind == 5:
            i += 4
        else:
            raise ValueError(f"protobuf wire type {kind} not expected")
    return fields


def _read_varint(data: bytes, i: int) -> tuple[int, int]:
    n = shift = 0
    while True:
        byte = data[i]
        i += 1
        n |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return n, i


def _identity(b: bytes) -> bytes:
    return b


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def ensure_etcd() -> str:
    etcd = shutil.which("etcd")
    if etcd is None:
        subprocess.run(["bash", str(_INSTALL)], check=False)
        etcd = shutil.which("etcd")
    if etcd is None:
        raise SystemExit("etcd not found and scripts/install-peers.sh could not install etcd-server")
    return etcd


class EtcdCluster:
    """3 etcd members on loopback, each with its own data dir under `root`."""

    def __init__(self, root: str, members: int = 3) -> None:
        self.root = root
        self.names = [f"m{i}" for i in range(1, members + 1)]
        self.client_ports = [free_port() for _ in self.names]
        self.peer_ports = [free_port() for _ in self.names]
        self.processes: list[subprocess.Popen[bytes]] = []

    def start(self, etcd: str) -> None:
        token = f"bench-{os.getpid()}-{time.monotonic_ns()}"  # one per cluster: members with another refuse
        initial = ",".join(f"{n}=http://127.0.0.1:{p}" for n, p in zip(self.names, self.peer_ports, strict=True))
        for name, client, peer in zip(self.names, self.client_ports, self.peer_ports, strict=True):
            self.processes.append(subprocess.Popen(
                [etcd, "--name", name, "--data-dir", os.path.join(self.root, name),
                 "--listen-client-urls", f"http://127.0.0.1:{client}",
                 "--advertise-client-urls", f"http://127.0.0.1:{client}",
                 "--listen-peer-urls", f"http://127.0.0.1:{peer}",
                 "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
                 "--initial-cluster", initial, "--initial-cluster-state", "new",
                 "--initial-cluster-token", token,
                 "--logger", "zap", "--log-level", "error"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))

    def stop(self) -> None:
        for process in self.processes:
            process.send_signal(signal.SIGKILL)
            process.wait()
        self.processes = []

    def target(self, i: int) -> str:
        return f"127.0.0.1:{self.client_ports[i]}"

    async def leader(self) -> int:
        """The index of the member that leads, once all agree (Maintenance.Status)."""
        deadline = time.monotonic() + _READY_TIMEOUT_S
        while time.monotonic() < deadline:
            seen: list[tuple[int, int]] = []
            for i in range(len(self.names)):
                try:
                    async with grpc.aio.insecure_channel(self.target(i)) as channel:
                        status = channel.unary_unary("/etcdserverpb.Maintenance/Status", request_serializer=_identity,
                                                     response_deserializer=_identity)
                        fields = decode_fields(await status(b"", timeout=1.0))
                        seen.append((decode_fields(fields[1])[2], fields.get(4, 0)))
                except (grpc.RpcError, KeyError):
                    break
            leaders = {leader for _, leader in seen}
            if len(seen) == len(self.names) and len(leaders) == 1 and 0 not in leaders:
                leader = leaders.pop()
                return next(i for i, (member, _) in enumerate(seen) if member == leader)
            await asyncio.sleep(0.1)
        raise SystemExit("etcd: no leader agreed on")


def summary(latencies_us: list[int], elapsed: float) -> dict[str, Any]:
    ordered = sorted(latencies_us)
    return {"committed": len(ordered), "seconds": round(elapsed, 2), "puts_per_s": round(len(ordered) / elapsed),
            "p50_ms": round(percentile(ordered, 0.50), 2), "p99_ms": round(percentile(ordered, 0.99), 2),
            "max_ms": round(percentile(ordered, 1.0), 2)}


async def drive_etcd(cluster: EtcdCluster, count: int, concurrency: int, size: int, via: str) -> dict[str, Any]:
    leader = await cluster.leader()
    targets = [leader] if via == "leader" else list(range(len(cluster.names)))
    value = b"x" * size
    per = count // concurrency
    latencies: list[int] = []
    channels = [grpc.aio.insecure_channel(cluster.target(i)) for i in targets]
    try:
        puts = [c.unary_unary("/etcdserverpb.KV/Put", request_serializer=_identity, response_deserializer=_identity)
                for c in channels]
        await puts[0](encode_put(b"/warm", value), timeout=10.0)

        async def proposer(p: int) -> None:
            put = puts[p % len(puts)]
            for i in range(per):
                started = time.perf_counter_ns()
                await put(encode_put(f"/bench/{p}/{i}".encode(), value), timeout=10.0)
                latencies.append((time.perf_counter_ns() - started) // 1000)

        started = time.perf_counter()
        await asyncio.gather(*(proposer(p) for p in range(concurrency)))
        elapsed = time.perf_counter() - started
    finally:
        for channel in channels:
            await channel.close()
    return summary(latencies, elapsed)


async def drive_ours(nodes: list[Node], count: int, concurrency: int, size: int, via: str) -> dict[str, Any]:
    leader_id, _ = await agreed_leader(nodes)
    targets = [nodes[leader_id - 1]] if via == "leader" else nodes
    value = b"x" * size
    per = count // concurrency
    latencies: list[int] = []
    # One admin connection per proposer (an AdminClient serves one request at a time).
    admins = [AdminClient(targets[p % len(targets)].admin_url, timeout_ms=10_000) for p in range(concurrency)]
    for admin in admins:
        await admin.__aenter__()
    try:
        await admins[0].metadata_put("/warm", value)

        async def proposer(p: int) -> None:
            admin = admins[p]
            for i in range(per):
                started = time.perf_counter_ns()
                await admin.metadata_put(f"/bench/{p}/{i}", value)
                latencies.append((time.perf_counter_ns() - started) // 1000)

        leader = psutil.Process(nodes[leader_id - 1].process.pid)  # type: ignore[union-attr]
        cpu_before = leader.cpu_times()
        started = time.perf_counter()
        await asyncio.gather(*(proposer(p) for p in range(concurrency)))
        elapsed = time.perf_counter() - started
        cpu_after = leader.cpu_times()
    finally:
        for admin in admins:
            await admin.__aexit__(None, None, None)
    # The leader's CPU (user + sys, all its threads) per acknowledged put.
    cpu_s = (cpu_after.user + cpu_after.system) - (cpu_before.user + cpu_before.system)
    return {**summary(latencies, elapsed), "leader_cpu_us_per_put": round(cpu_s * 1e6 / len(latencies), 1)}


async def one_run(system: str, python: str | None, etcd: str, count: int, concurrency: int, size: int,
                  via: str) -> dict[str, Any]:
    root = tempfile.mkdtemp(prefix=f"danube-raft-vs-etcd-{system}-")
    try:
        if python is None:
            cluster = EtcdCluster(root)
            try:
                cluster.start(etcd)
                figures = await drive_etcd(cluster, count, concurrency, size, via)
            finally:
                cluster.stop()
        else:
            nodes = [Node(root, i) for i in (1, 2, 3)]
            try:
                for node in nodes:
                    node.start(nodes, python=python)
                figures = await drive_ours(nodes, count, concurrency, size, via)
            finally:
                for node in nodes:
                    node.kill()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return {"workload": WORKLOAD, "system": system, "concurrency": concurrency, "value_bytes": size, "via": via,
            **figures, "load_1m": round(os.getloadavg()[0], 2), "at": now_utc()}


def report(runs: list[dict[str, Any]]) -> None:
    groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for run in runs:
        groups.setdefault((run["system"], run["concurrency"]), []).append(run)
    etcd_rate = {c: statistics.median(r["puts_per_s"] for r in g) for (s, c), g in groups.items() if s == "etcd"}
    print(f"{'system':<10} {'proposers':>9} {'runs':>4} {'puts/s':>8} {'p50 ms':>7} {'p99 ms':>7} {'vs etcd':>7}"
          f" {'leader µs/put':>13}")
    for (system, concurrency), group in groups.items():
        rate = statistics.median(r["puts_per_s"] for r in group)
        p50 = statistics.median(r["p50_ms"] for r in group)
        p99 = statistics.median(r["p99_ms"] for r in group)
        ratio = f"{rate / etcd_rate[concurrency]:.2f}x" if concurrency in etcd_rate else "-"
        cpus = [r["leader_cpu_us_per_put"] for r in group if "leader_cpu_us_per_put" in r]
        cpu = f"{statistics.median(cpus):.0f}" if cpus else "-"
        print(f"{system:<10} {concurrency:>9} {len(group):>4} {rate:>8.0f} {p50:>7.2f} {p99:>7.2f} {ratio:>7} {cpu:>13}")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--count", type=int, default=2000, help="puts per sequential run (one proposer)")
    parser.add_argument("--count-concurrent", type=int, default=12800, help="puts per run of more proposers (split)")
    parser.add_argument("--concurrency", default="1,64", help="comma-separated proposer counts")
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--via", choices=["leader", "all"], default="leader")
    parser.add_argument("--broker", action="append", metavar="LABEL=PYTHON",
                        help="our brokers under that venv's Python (repeatable; default: this checkout's, 'ours')")
    parser.add_argument("--no-etcd", action="store_true", help="only our brokers (e.g. a before/after A/B)")
    args = parser.parse_args()
    brokers: dict[str, str] = {}
    for value in args.broker or [f"ours={sys.executable}"]:
        label, _, python = value.partition("=")
        if not label or not python:
            raise SystemExit(f"--broker wants LABEL=PYTHON, got {value!r}")
        brokers[label] = python
    etcd = "" if args.no_etcd else ensure_etcd()
    systems: list[tuple[str, str | None]] = ([] if args.no_etcd else [("etcd", None)]) + list(brokers.items())
    runs: list[dict[str, Any]] = []
    for _ in range(args.repeat):
        for concurrency in (int(c) for c in args.concurrency.split(",")):
            for system, python in systems:
                count = args.count if concurrency == 1 else args.count_concurrent
                run = await one_run(system, python, etcd, count, concurrency, args.size, args.via)
                print(f"  {run}", flush=True)
                runs.append(run)
    print(f"load average (1/5/15 min): {os.getloadavg()}")
    report(runs)
    path = append(WORKLOAD, runs)
    print(f"  ({len(runs)} runs appended to {path})")


if __name__ == "__main__":
    asyncio.run(main())

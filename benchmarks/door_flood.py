"""A flood of silent TCP connections to the gRPC client door (issue 37, item 2): what the
broker holds before, during and after it. One broker process with the door and its
default bounds (`broker.grpc_connections_max` 1000, `grpc_handshake_timeout_ms` 5000);
`--connections` plain TCP connections, nothing sent, kept open until the broker closes
them. Reported: the broker's descriptors and RSS before, at peak and after; when the
last connection was closed; how long a native produce takes before, during and after.

    .venv/bin/python benchmarks/door_flood.py --connections 19950

The flooding process needs RLIMIT_NOFILE above `--connections` (raised to its hard limit).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import selectors
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any

import psutil
from e2e import _ready, free_port  # benchmarks/ is on sys.path when a script here runs
from harness import append, now_utc

from danube_zmq import DanubeClient

WORKLOAD = "door_flood"
MIB = 1024 * 1024


async def _produce_ms(url: str) -> int:
    started = time.monotonic()
    async with asyncio.timeout(10), DanubeClient(url) as client:
        producer = await client.create_producer("/default/door-flood", name="probe")
        await producer.send(b"x")
    return round((time.monotonic() - started) * 1000)


class Sampler:
    def __init__(self, pid: int) -> None:
        self.process = psutil.Process(pid)
        self.peak_fds = self.peak_rss = 0

    def sample(self) -> tuple[int, int]:
        fds, rss = self.process.num_fds(), self.process.memory_info().rss
        self.peak_fds, self.peak_rss = max(self.peak_fds, fds), max(self.peak_rss, rss)
        return fds, rss


def _flood(port: int, count: int, sampler: Sampler) -> tuple[list[socket.socket], int]:
    socks, failed = [], 0
    for i in range(count):
        try:
            socks.append(socket.create_connection(("127.0.0.1", port), timeout=2))
        except OSError:
            failed += 1
        if i % 1000 == 0:
            sampler.sample()
    return socks, failed


def _until_closed(socks: list[socket.socket], sampler: Sampler, timeout_s: float) -> tuple[int, float]:
    """Read every socket until the broker closes it: (closed, seconds until the last)."""
    start = time.monotonic()
    selector = selectors.DefaultSelector()
    for sock in socks:
        sock.setblocking(False)
        selector.register(sock, selectors.EVENT_READ)
    closed, last = 0, 0.0
    while closed < len(socks) and time.monotonic() - start < timeout_s:
        for key, _ in selector.select(0.2):
            try:
                data = key.fileobj.recv(65536)  # type: ignore[union-attr]
            except OSError:
                data = b""
            if not data:
                selector.unregister(key.fileobj)
                closed, last = closed + 1, time.monotonic() - start
        sampler.sample()
    selector.close()
    return closed, last


def run(connections: int) -> dict[str, Any]:
    work = tempfile.mkdtemp(prefix="door-flood-")
    url, admin_url, grpc_port = (f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}", free_port())
    broker = subprocess.Popen([sys.executable, "-m", "danube_zmq.cli.main", "broker", "start", "--listen", url,
                               "--admin-listen", admin_url, "--metrics-port", "0", "--data-dir", f"{work}/data",
                               "--grpc-listen", f"http://127.0.0.1:{grpc_port}"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        asyncio.run(_ready(admin_url))
        sampler = Sampler(broker.pid)
        fds_before, rss_before = sampler.sample()
        produce_before = asyncio.run(_produce_ms(url))
        socks, failed = _flood(grpc_port, connections, sampler)
        produce_during = asyncio.run(_produce_ms(url))
        closed, last_s = _until_closed(socks, sampler, 120)
        for sock in socks:
            sock.close()
        time.sleep(2)
        fds_after, rss_after = sampler.sample()
        return {"connections": connections, "refused_by_kernel": failed, "closed_by_broker": closed,
                "last_closed_s": round(last_s, 1), "fds_before": fds_before, "fds_peak": sampler.peak_fds,
                "fds_after": fds_after, "rss_before_mib": round(rss_before / MIB), "rss_peak_mib":
                round(sampler.peak_rss / MIB), "rss_after_mib": round(rss_after / MIB),
                "produce_ms_before": produce_before, "produce_ms_during": produce_during,
                "produce_ms_after": asyncio.run(_produce_ms(url))}
    finally:
        broker.terminate()
        broker.wait(10)
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--connections", type=int, default=19_950)
    args = parser.parse_args()
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    result = {"at": now_utc(), **run(args.connections)}
    print(json.dumps(result))
    append(WORKLOAD, [result])


if __name__ == "__main__":
    main()

"""Cluster figures for docs/performance.md (issue 8's closing note), on loopback:

- unload -> the first message acknowledged by the new owner (median of `--moves`), on a
  reliable topic in shared_fs mode while a producer sends with acks;
- kill -9 of the owner -> the next acknowledged send, under `danube cluster up` (the
  supervisor restarts the broker within its lease);
- aggregate non-reliable throughput, `danube bench e2e` over 6 partitions: 3 brokers
  against 1.

    .venv/bin/python benchmarks/cluster.py [--moves 10] [--count 300000] [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from danube_zmq import DanubeClient
from danube_zmq.client.admin import AdminClient


def danube(*args: str, timeout: float = 300) -> str:
    done = subprocess.run([sys.executable, "-m", "danube_zmq.cli.main", *args], capture_output=True, text=True,
                          timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"danube {' '.join(args)} failed: {done.stderr}{done.stdout}")
    return done.stdout


class Cluster:
    def __init__(self, root: Path, brokers: int, base: int) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        config = root / "broker.yml"
        config.write_text(f"storage:\n  mode: shared_fs\n  durable_url: {root / 'shared'}\n")
        out = danube("cluster", "up", "--brokers", str(brokers), "--config", str(config), "--data-dir",
                     str(root / "cluster"), "--client-port", str(base), "--admin-port", str(base + 100),
                     "--raft-port", str(base + 200), "--supervisor-port", str(base + 300), "--metrics-port", "0",
                     "--output", "json")
        self.layout = json.loads(out)
        self.urls = [b["url"] for b in self.layout["brokers"]]

    def down(self) -> None:
        danube("cluster", "down", "--data-dir", str(self.root / "cluster"))


async def unload_times(cluster: Cluster, moves: int) -> list[float]:
    topic = "/default/bench-moves"
    admin_url = cluster.layout["brokers"][0]["admin_url"]
    async with AdminClient(admin_url) as admin:
        await admin.create_topic(topic, dispatch_strategy=1)
    times = []
    async with DanubeClient(cluster.urls[0]) as client:
        producer = await client.create_producer(topic, dispatch="reliable", batch_delay_ms=0)
        # (when, the URL of the broker the producer was attached to when the ack came)
        acked: list[tuple[float, str]] = []
        stop = asyncio.Event()
        attachment = producer._partitions[0]  # the one partition's producer: its connection is its broker

        async def produce() -> None:
            while not stop.is_set():
                await producer.send(b"x" * 100)
                acked.append((time.monotonic(), attachment.connection.url))
                await asyncio.sleep(0.002)

        task = asyncio.create_task(produce())
        await asyncio.sleep(0.5)
        for _ in range(moves):
            before = await client.lookup(topic)
            async with AdminClient(admin_url) as admin:
                started = time.monotonic()
                await admin.unload_topic(topic)
            while True:  # the first acknowledgement from the new owner
                await asyncio.sleep(0.002)
                served = next((t for t, url in reversed(acked) if t > started and url != before), None)
                if served is not None:
                    first = min(t for t, url in acked if t > started and url != before)
                    times.append(first - started)
                    break
            await asyncio.sleep(0.3)
        stop.set()
        await task
    return times


async def kill_restart_time(cluster: Cluster) -> float:
    topic = "/default/bench-kill"
    async with DanubeClient(cluster.urls[0]) as client:
        producer = await client.create_producer(topic, dispatch="reliable", batch_delay_ms=0)
        for _ in range(50):
            await producer.send(b"y" * 100)
        owner_url = await client.lookup(topic)
        owner = next(b for b in cluster.layout["brokers"] if b["url"] == owner_url)
        os.kill(int((Path(owner["data_dir"]) / "broker.pid").read_text()), signal.SIGKILL)
        killed = time.monotonic()
        await producer.send(b"after the kill")
        return time.monotonic() - killed


def throughput(url: str, count: int, topic: str) -> dict[str, object]:
    out = danube("bench", "e2e", "-s", url, "-t", topic, "--partitions", "6", "--count", str(count), "--json")
    result = json.loads(out)
    return {"msg_s": round(float(result["msg_s"])), "lost": result.get("lost"), "duplicates": result.get("duplicates")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--moves", type=int, default=10)
    parser.add_argument("--count", type=int, default=300_000)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    results: dict[str, object] = {}
    with tempfile.TemporaryDirectory() as tmp:
        cluster = Cluster(Path(tmp) / "three", 3, 31000)
        try:
            moves = asyncio.run(unload_times(cluster, args.moves))
            results["unload_to_first_ack_s"] = {"median": statistics.median(moves), "max": max(moves), "all": moves}
            results["kill9_to_next_ack_s"] = asyncio.run(kill_restart_time(cluster))
            time.sleep(2)
            results["three_brokers"] = throughput(cluster.urls[0], args.count, "/default/bench-three")
        finally:
            cluster.down()
        single = Cluster(Path(tmp) / "one", 1, 32000)
        try:
            results["one_broker"] = throughput(single.urls[0], args.count, "/default/bench-one")
        finally:
            single.down()
    print(json.dumps(results, indent=2))
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()

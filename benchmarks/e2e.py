"""End-to-end non-reliable figures: 1 producer process -> broker process -> 1 consumer process.

    .venv/bin/python benchmarks/e2e.py throughput --size 100 --count 500000
    .venv/bin/python benchmarks/e2e.py latency --rate 5000 --seconds 10
    .venv/bin/python benchmarks/e2e.py throughput --reliable --size 100 --count 200000
    .venv/bin/python benchmarks/e2e.py throughput --reliable --dedup --size 100 --count 200000

With --reliable the topic is reliable (acknowledged after fsync, wal_sync always), the
consumer acknowledges every message, and the report adds produce-ack latency (send to
receipt) and the WAL's group commits: flushes per second and records per flush, read
from the broker's Prometheus endpoint. --dedup (with --reliable) turns the broker's
`policies.deduplication` on: the producer's messages carry sequence ids and the topic
checks them.

Throughput = messages received / (last receive - first send), client batching on
(defaults: 1000 messages, 1 MiB, 10 ms). Latency = receive time - send time of each
message (CLOCK_MONOTONIC is shared by processes on one machine), stamped in the first
8 bytes of the payload. Loss is counted (non-reliable topics may drop under overload).
Prints one JSON line. `danube bench` (a later issue) grows out of this.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing as mp
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from danube_zmq import DanubeClient, SubType
from danube_zmq.client.admin import AdminClient
from danube_zmq.transport.errors import DanubeError, Timeout


@contextlib.contextmanager
def standalone_broker(prefix: str, env: dict[str, str] | None = None) -> Iterator[tuple[str, str, subprocess.Popen[bytes], Path]]:
    """A broker process on free loopback ports with its data in a fresh temp dir, ready:
    (client URL, admin URL, process, data dir); stopped (SIGTERM) and its data removed after."""
    url, admin_url = f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"
    data_dir = Path(tempfile.mkdtemp(prefix=prefix))
    broker = subprocess.Popen([sys.executable, "-m", "danube_zmq.cli.main", "broker", "start", "--listen", url,
                               "--admin-listen", admin_url, "--metrics-port", "0", "--data-dir", str(data_dir)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, **(env or {})})
    try:
        asyncio.run(_ready(admin_url))
        yield url, admin_url, broker, data_dir
    finally:
        broker.send_signal(signal.SIGTERM)
        broker.wait(60)
        shutil.rmtree(data_dir, ignore_errors=True)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def _ready(admin_url: str, **client_options: object) -> None:
    """Until the broker answers on its admin port; `client_options` (server_public_key,
    token, ...) as `AdminClient` takes them, for a secured broker."""
    for _ in range(100):
        try:
            async with AdminClient(admin_url, timeout_ms=300, **client_options) as admin:  # type: ignore[arg-type]
                await admin.list_namespaces()
                return
        except DanubeError:
            await asyncio.sleep(0.1)
    raise SystemExit("broker did not start")


def consumer_main(url: str, topic: str, count: int, ready: mp.Event, out: mp.Queue, ack: bool,
                  sub_type: SubType = SubType.EXCLUSIVE) -> None:
    async def run() -> None:
        async with DanubeClient(url) as client:
            consumer = await client.subscribe(topic, "bench", sub_type=sub_type, receiver_queue_size=20_000)
            ready.set()
            got, first_ns, latencies = 0, 0, []
            last_ns = 0
            while got < count:
                try:
                    msg = await consumer.receive(timeout=5)
                except Timeout:
                    break
                last_ns = time.monotonic_ns()
                if got == 0:
                    first_ns = last_ns
                (sent_ns,) = struct.unpack_from("<q", msg.payload)
                latencies.append(last_ns - sent_ns)
                got += 1
                if ack:
                    await consumer.ack(msg)
            out.put({"received": got, "first_ns": first_ns, "last_ns": last_ns, "latencies_ns": latencies})
    asyncio.run(run())


async def produce(url: str, topic: str, count: int, size: int, rate: float, reliable: bool,
                  deliver_after_ms: int | None = None) -> tuple[int, list[int]]:
    """Send `count` messages (as fast as possible, or at `rate`); returns the start time
    and each message's produce-ack latency in ns."""
    filler = b"x" * (size - 8)
    ack_latencies: list[int] = []

    def on_receipt(sent_ns: int):
        def record(error: BaseException | None, message_id: object) -> None:
            if error is None:
                ack_latencies.append(time.monotonic_ns() - sent_ns)
        return record

    async with DanubeClient(url) as client:
        producer = await client.create_producer(topic, dispatch="reliable" if reliable else "non_reliable")
        start = time.monotonic_ns()
        interval_ns = int(1e9 / rate) if rate > 0 else 0
        # Only when asked: a tree from before delayed delivery runs this file too (feature_cost.py).
        timing = {} if deliver_after_ms is None else {"deliver_after_ms": deliver_after_ms}
        for i in range(count):
            if interval_ns:
                delay = (start + i * interval_ns - time.monotonic_ns()) / 1e9
                if delay > 0:
                    await asyncio.sleep(delay)
            now = time.monotonic_ns()
            payload = struct.pack("<q", now) + filler
            while True:
                try:
                    producer.send_nowait(payload, callback=on_receipt(now), **timing)
                    break
                except DanubeError:  # the pending queue is full: let receipts come back
                    await asyncio.sleep(0.001)
        await producer.flush()
        return start, ack_latencies


def scrape(metrics_url: str) -> dict[str, float]:
    import urllib.request

    with urllib.request.urlopen(metrics_url, timeout=5) as response:
        text = response.read().decode()
    values = {}
    for line in text.splitlines():
        if line.startswith(("danube_wal_flushes_total", "danube_wal_records_total")):
            name, value = line.split()
            values[name] = float(value)
    return values


def percentile(sorted_values: list[int], q: float) -> float:
    if not sorted_values:
        return float("nan")
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))] / 1000.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=["throughput", "latency"])
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--count", type=int, default=300_000)
    parser.add_argument("--rate", type=float, default=5000)
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--reliable", action="store_true")
    parser.add_argument("--dedup", action="store_true", help="policies.deduplication on (reliable topics)")
    parser.add_argument("--shared", action="store_true", help="a Shared subscription (Exclusive by default)")
    parser.add_argument("--deliver-after-ms", type=int, help="every message delayed by this (with --shared)")
    args = parser.parse_args()
    rate = 0.0 if args.mode == "throughput" else args.rate
    count = args.count if args.mode == "throughput" else int(args.rate * args.seconds)
    url, admin_url = f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"
    metrics_port = free_port()
    data_dir = tempfile.mkdtemp(prefix="danube-bench-")
    broker = subprocess.Popen([sys.executable, "-m", "danube_zmq.cli.main", "broker", "start", "--listen", url,
                               "--admin-listen", admin_url, "--metrics-port", str(metrics_port),
                               "--data-dir", data_dir],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              env={**os.environ, **({"DANUBE_POLICIES__DEDUPLICATION": "true"} if args.dedup else {})})
    metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
    try:
        asyncio.run(_ready(admin_url))
        topic = f"/default/bench-{os.getpid()}"

        async def create() -> None:
            async with AdminClient(admin_url) as admin:
                await admin.create_topic(topic, dispatch_strategy=1 if args.reliable else 0)
        asyncio.run(create())
        ready, out = mp.Event(), mp.Queue()
        consumer = mp.Process(target=consumer_main, args=(url, topic, count, ready, out, args.reliable,
                                                          SubType.SHARED if args.shared else SubType.EXCLUSIVE))
        consumer.start()
        ready.wait(20)
        wal_before = scrape(metrics_url)
        start_ns, ack_latencies = asyncio.run(produce(url, topic, count, args.size, rate, args.reliable,
                                                      args.deliver_after_ms))
        produce_s = (time.monotonic_ns() - start_ns) / 1e9
        wal_after = scrape(metrics_url)
        result = out.get(timeout=600)
        consumer.join(10)
    finally:
        broker.send_signal(signal.SIGTERM)
        broker.wait(15)
        shutil.rmtree(data_dir, ignore_errors=True)
    latencies = sorted(result.pop("latencies_ns"))
    ack_latencies.sort()
    elapsed_s = (result["last_ns"] - start_ns) / 1e9
    flushes = wal_after.get("danube_wal_flushes_total", 0) - wal_before.get("danube_wal_flushes_total", 0)
    records = wal_after.get("danube_wal_records_total", 0) - wal_before.get("danube_wal_records_total", 0)
    print(json.dumps({
        "mode": args.mode, "reliable": args.reliable, "dedup": args.dedup, "size": args.size, "sent": count,
        "received": result["received"],
        "lost": count - result["received"],
        "msg_s": round(result["received"] / elapsed_s) if elapsed_s > 0 else None,
        "mb_s": round(result["received"] * args.size / elapsed_s / 1e6, 1) if elapsed_s > 0 else None,
        "latency_us": {"p50": percentile(latencies, 0.5), "p90": percentile(latencies, 0.9),
                       "p99": percentile(latencies, 0.99), "max": percentile(latencies, 1.0)},
        "produce_ack_latency_us": {"p50": percentile(ack_latencies, 0.5), "p99": percentile(ack_latencies, 0.99)},
        "wal": {"flushes_per_s": round(flushes / produce_s, 1), "records_per_flush": round(records / flushes, 1)}
        if flushes else None,
    }))


if __name__ == "__main__":
    main()

"""End-to-end non-reliable figures: 1 producer process -> broker process -> 1 consumer process.

    .venv/bin/python benchmarks/e2e.py throughput --size 100 --count 500000
    .venv/bin/python benchmarks/e2e.py latency --rate 5000 --seconds 10

Throughput = messages received / (last receive - first send), client batching on
(defaults: 1000 messages, 128 KiB, 10 ms). Latency = receive time - send time of each
message (CLOCK_MONOTONIC is shared by processes on one machine), stamped in the first
8 bytes of the payload. Loss is counted (non-reliable topics may drop under overload).
Prints one JSON line. `danube bench` (a later issue) grows out of this.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import signal
import socket
import struct
import subprocess
import sys
import time

from danube_zmq import DanubeClient, SubType
from danube_zmq.client.admin import AdminClient
from danube_zmq.transport.errors import DanubeError, Timeout


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def _ready(admin_url: str) -> None:
    for _ in range(100):
        try:
            async with AdminClient(admin_url, timeout_ms=300) as admin:
                await admin.list_namespaces()
                return
        except DanubeError:
            await asyncio.sleep(0.1)
    raise SystemExit("broker did not start")


def consumer_main(url: str, topic: str, count: int, ready: mp.Event, out: mp.Queue) -> None:
    async def run() -> None:
        async with DanubeClient(url) as client:
            consumer = await client.subscribe(topic, "bench", sub_type=SubType.EXCLUSIVE, receiver_queue_size=20_000)
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
            out.put({"received": got, "first_ns": first_ns, "last_ns": last_ns, "latencies_ns": latencies})
    asyncio.run(run())


async def produce(url: str, topic: str, count: int, size: int, rate: float) -> int:
    filler = b"x" * (size - 8)
    async with DanubeClient(url) as client:
        producer = await client.create_producer(topic)
        start = time.monotonic_ns()
        if rate <= 0:
            for _ in range(count):
                try:
                    producer.send_nowait(struct.pack("<q", time.monotonic_ns()) + filler)
                except DanubeError:
                    await producer.flush()
                    producer.send_nowait(struct.pack("<q", time.monotonic_ns()) + filler)
        else:
            interval_ns = int(1e9 / rate)
            for i in range(count):
                target = start + i * interval_ns
                delay = (target - time.monotonic_ns()) / 1e9
                if delay > 0:
                    await asyncio.sleep(delay)
                producer.send_nowait(struct.pack("<q", time.monotonic_ns()) + filler)
        await producer.flush()
        return start


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
    args = parser.parse_args()
    rate = 0.0 if args.mode == "throughput" else args.rate
    count = args.count if args.mode == "throughput" else int(args.rate * args.seconds)
    url, admin_url = f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"
    broker = subprocess.Popen([sys.executable, "-m", "danube_zmq.cli.main", "broker", "start", "--listen", url,
                               "--admin-listen", admin_url, "--metrics-port", "0"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        asyncio.run(_ready(admin_url))
        topic = f"/default/bench-{os.getpid()}"

        async def create() -> None:
            async with AdminClient(admin_url) as admin:
                await admin.create_topic(topic)
        asyncio.run(create())
        ready, out = mp.Event(), mp.Queue()
        consumer = mp.Process(target=consumer_main, args=(url, topic, count, ready, out))
        consumer.start()
        ready.wait(20)
        start_ns = asyncio.run(produce(url, topic, count, args.size, rate))
        result = out.get(timeout=600)
        consumer.join(10)
    finally:
        broker.send_signal(signal.SIGTERM)
        broker.wait(15)
    latencies = sorted(result.pop("latencies_ns"))
    elapsed_s = (result["last_ns"] - start_ns) / 1e9
    print(json.dumps({
        "mode": args.mode, "size": args.size, "sent": count, "received": result["received"],
        "lost": count - result["received"],
        "msg_s": round(result["received"] / elapsed_s) if elapsed_s > 0 else None,
        "mb_s": round(result["received"] * args.size / elapsed_s / 1e6, 1) if elapsed_s > 0 else None,
        "latency_us": {"p50": percentile(latencies, 0.5), "p90": percentile(latencies, 0.9),
                       "p99": percentile(latencies, 0.99), "max": percentile(latencies, 1.0)},
    }))


if __name__ == "__main__":
    main()

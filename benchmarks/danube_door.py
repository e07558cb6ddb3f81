"""What moving from Danube's client to the native one buys: one broker process with its
gRPC door (docs/danube-compat.md), 100-byte messages, non-reliable and reliable topics,
in one run side by side:

- `danube_seq`: `danube-client` (PyPI) through the door, `await producer.send()` one
  message at a time, as Danube's examples do;
- `danube_64`: the same client with 64 sends in flight (`asyncio.gather` over windows;
  its producer allows concurrent sends), the most it offers for speed (no batching:
  `SendMessage` is one unary call per message);
- `native`: our client on the broker's own port, batching on (its defaults).

The figure is acknowledged messages per second at the producer (reliable: after the
broker's fsync). Cases alternate over `--rounds` rounds so drift hits all alike; the
median of the rounds is reported with its min and max, and the ratio native / danube.

    .venv/bin/python benchmarks/danube_door.py --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from e2e import _ready, free_port  # benchmarks/ is on sys.path when a script here runs
from harness import append, now_utc

from danube_zmq import DanubeClient
from danube_zmq.client.errors import ProducerQueueFull
from danube_zmq.transport.client_protocol import DispatchStrategy

WORKLOAD = "danube_door"
PAYLOAD = b"x" * 100
WINDOW = 64
STRATEGIES = {"non_reliable": DispatchStrategy.NON_RELIABLE, "reliable": DispatchStrategy.RELIABLE}


async def danube_rate(grpc_url: str, topic: str, strategy: str, count: int, window: int) -> float:
    import danube

    client = await danube.DanubeClientBuilder().service_url(grpc_url).build()
    kind = danube.DispatchStrategy.RELIABLE if strategy == "reliable" else danube.DispatchStrategy.NON_RELIABLE
    producer = (client.new_producer().with_topic(topic).with_name(f"bench-{time.monotonic_ns()}")
                .with_dispatch_strategy(kind).build())
    await producer.create()
    for _ in range(200):  # warm up: the channel, the door's native producer
        await producer.send(PAYLOAD)
    start = time.perf_counter()
    if window == 1:
        for _ in range(count):
            await producer.send(PAYLOAD)
    else:
        for first in range(0, count, window):
            await asyncio.gather(*(producer.send(PAYLOAD) for _ in range(min(window, count - first))))
    return count / (time.perf_counter() - start)


async def native_rate(url: str, topic: str, strategy: str, count: int) -> float:
    async with DanubeClient(url) as client:
        producer = await client.create_producer(topic, dispatch=STRATEGIES[strategy])
        for _ in range(2000):
            await _send(producer)
        await producer.flush()
        start = time.perf_counter()
        futures = [await _send(producer) for _ in range(count)]
        await producer.flush()
        elapsed = time.perf_counter() - start
        for future in futures:
            future.result()  # a refused batch raises: only acknowledged messages count
        await producer.close()
    return count / elapsed


async def _send(producer: Any) -> Any:
    while True:
        try:
            return producer.send_nowait(PAYLOAD)
        except ProducerQueueFull:
            await producer.flush()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--danube-count", type=int, default=5000, help="messages per danube-client case")
    parser.add_argument("--native-count", type=int, default=200_000, help="messages per native case")
    args = parser.parse_args()
    url, admin_url = f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"
    grpc_url = f"http://127.0.0.1:{free_port()}"
    data_dir = tempfile.mkdtemp(prefix="danube-bench-")
    broker = subprocess.Popen([sys.executable, "-m", "danube_zmq.cli.main", "broker", "start", "--listen", url,
                               "--admin-listen", admin_url, "--grpc-listen", grpc_url, "--metrics-port", "0",
                               "--data-dir", data_dir], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    rates: dict[str, list[float]] = {}
    try:
        asyncio.run(_ready(admin_url))
        for round_ in range(args.rounds):
            for strategy in STRATEGIES:
                # A topic per case and round: no case reads another's backlog or WAL.
                cases = {
                    f"danube_seq/{strategy}": lambda t, s=strategy: danube_rate(grpc_url, t, s, args.danube_count, 1),
                    f"danube_{WINDOW}/{strategy}": lambda t, s=strategy: danube_rate(
                        grpc_url, t, s, args.danube_count, WINDOW),
                    f"native/{strategy}": lambda t, s=strategy: native_rate(url, t, s, args.native_count),
                }
                for name, run in cases.items():
                    topic = f"/default/door-{name.replace('/', '-')}-{round_}"
                    rates.setdefault(name, []).append(asyncio.run(run(topic)))
    finally:
        broker.send_signal(signal.SIGTERM)
        broker.wait(30)
        shutil.rmtree(data_dir, ignore_errors=True)
    summary = {name: {"median": round(statistics.median(values)), "min": round(min(values)),
                      "max": round(max(values))} for name, values in rates.items()}
    ratios = {strategy: {"native/danube_seq": round(summary[f"native/{strategy}"]["median"]
                                                     / summary[f"danube_seq/{strategy}"]["median"], 1),
                         f"native/danube_{WINDOW}": round(summary[f"native/{strategy}"]["median"]
                                                          / summary[f"danube_{WINDOW}/{strategy}"]["median"], 1)}
              for strategy in STRATEGIES}
    run = {"at": now_utc(), "rounds": args.rounds, "payload_bytes": len(PAYLOAD), "msg_s": summary, "ratio": ratios}
    append(WORKLOAD, [run])
    print(json.dumps(run))


if __name__ == "__main__":
    main()

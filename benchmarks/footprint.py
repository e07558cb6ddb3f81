"""Many quiet topics: broker memory per topic and broker CPU, ours and the peers where the
idea maps (Redis PUB/SUB channels, NATS core subjects).

    .venv/bin/python benchmarks/footprint.py --repeat 3 --topics 1000 --seconds 10
    .venv/bin/python benchmarks/footprint.py --repeat 1 --topics 50 --seconds 2      # smoke run

Every run starts its own servers, so earlier runs leave nothing in the heap measured.
After the clients connect (RSS before), `--topics` topics are opened, each with a
producer and a subscriber, and each topic gets 1 msg/s of 100 B (all topics in turn,
evenly spread). Measured on the server process alone (psutil, the PID we started:
`danube broker start`, `redis-server`, `nats-server`):

- rss_per_topic_kib: (RSS after `--seconds` of traffic - RSS before) / topics
- cpu_traffic_pct: server CPU over `--seconds` of that traffic, % of one core
- cpu_idle_pct: server CPU over the next `--seconds` with no messages, producers and
  subscribers still attached, % of one core

Ours: non-reliable and reliable topics (wal_sync always), one client connection for
the producers and one for the consumers (Exclusive subscriptions, acks on reliable
topics). Redis: one PUB/SUB connection subscribed to every channel, one PUBLISH per
message. NATS: one connection with a subscription per subject, one publish per message.
With `--broker LABEL=PYTHON` (repeatable) each named venv's broker runs in turn
(before, after, before, ...: an A/B in one run), its rows labelled `danube_<kind>[LABEL]`.
Medians of `--repeat` runs; every run is appended to benchmarks/results/footprint.jsonl.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

from harness import Meter, Servers, medians, now_utc, print_table, run_alone, split_list

from danube_zmq import DanubeClient
from danube_zmq.transport.errors import Timeout

WORKLOAD = "footprint"
PEERS = {"redis_pubsub": "redis", "nats_core": "nats"}
SETTLE_S = 2.0
PAYLOAD = b"x" * 100
FIELDS = ("rss_before_mib", "rss_after_mib", "rss_per_topic_kib", "cpu_traffic_pct", "cpu_idle_pct", "received")

Send = Callable[[int], Any]


async def _measure(meter: Meter, topics: int, seconds: float, send: Send, received: Callable[[], int],
                   rss_before: int) -> dict[str, Any]:
    """Traffic (1 msg/s per topic, in turn) for `seconds`, then quiet for `seconds`."""
    stop = asyncio.Event()

    async def traffic() -> None:
        start, index = time.monotonic(), 0
        while not stop.is_set():
            await asyncio.sleep(max(start + index / topics - time.monotonic(), 0))
            send(index % topics)
            index += 1
    task = asyncio.get_running_loop().create_task(traffic())
    try:
        await asyncio.sleep(SETTLE_S)
        cpu_traffic = await meter.cpu_percent(seconds)
        rss_after = meter.rss_bytes()
    finally:
        stop.set()
        await task
    await asyncio.sleep(SETTLE_S)
    cpu_idle = await meter.cpu_percent(seconds)
    return {"rss_before_mib": round(rss_before / 2**20, 1), "rss_after_mib": round(rss_after / 2**20, 1),
            "rss_per_topic_kib": round((rss_after - rss_before) / topics / 1024, 2), "cpu_traffic_pct": cpu_traffic,
            "cpu_idle_pct": cpu_idle, "received": received()}


async def ours(servers: Servers, topics: int, seconds: float, reliable: bool) -> dict[str, Any]:
    meter = Meter(servers.danube.pid)
    dispatch = "reliable" if reliable else "non_reliable"
    async with DanubeClient(servers.danube.url, client_name="footprint-producers") as producing, \
            DanubeClient(servers.danube.url, client_name="footprint-consumers") as consuming:
        await asyncio.sleep(SETTLE_S)
        rss_before = meter.rss_bytes()
        names = [f"/default/footprint-{i}" for i in range(topics)]
        producers = [await producing.create_producer(name, dispatch=dispatch) for name in names]
        consumers = [await consuming.subscribe(name, "footprint", sub_type="exclusive") for name in names]
        received = 0

        async def drain(consumer: Any) -> None:
            nonlocal received
            while True:
                with contextlib.suppress(Timeout):
                    batch = await consumer.batch_receive(timeout=1.0)
                    received += len(batch)
                    if reliable:
                        await consumer.ack(batch)
        drains = [asyncio.get_running_loop().create_task(drain(c)) for c in consumers]
        try:
            return await _measure(meter, topics, seconds, lambda i: producers[i].send_nowait(PAYLOAD),
                                  lambda: received, rss_before)
        finally:
            for task in drains:
                task.cancel()
            await asyncio.gather(*drains, return_exceptions=True)


async def redis_pubsub(servers: Servers, topics: int, seconds: float) -> dict[str, Any]:
    import redis.asyncio as redis

    meter = Meter(servers.peers["redis"].pid)
    publisher = redis.Redis.from_url(servers.peers["redis"].url)
    pubsub = redis.Redis.from_url(servers.peers["redis"].url).pubsub(ignore_subscribe_messages=True)
    await publisher.ping()
    await asyncio.sleep(SETTLE_S)
    rss_before = meter.rss_bytes()
    channels = [f"footprint-{i}" for i in range(topics)]
    await pubsub.subscribe(*channels)
    received = 0

    async def drain() -> None:
        nonlocal received
        while True:
            if await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0) is not None:
                received += 1
    draining = asyncio.get_running_loop().create_task(drain())
    try:
        return await _measure(meter, topics, seconds, _publisher(lambda i: publisher.publish(channels[i], PAYLOAD)),
                              lambda: received, rss_before)
    finally:
        draining.cancel()
        await asyncio.gather(draining, return_exceptions=True)
        await pubsub.aclose()
        await publisher.aclose()


async def nats_core(servers: Servers, topics: int, seconds: float) -> dict[str, Any]:
    import nats

    meter = Meter(servers.peers["nats"].pid)
    publisher = await nats.connect(servers.peers["nats"].url)
    subscriber = await nats.connect(servers.peers["nats"].url)
    await asyncio.sleep(SETTLE_S)
    rss_before = meter.rss_bytes()
    subjects = [f"footprint.{i}" for i in range(topics)]
    received = 0

    async def on_message(_: Any) -> None:
        nonlocal received
        received += 1
    for subject in subjects:
        await subscriber.subscribe(subject, cb=on_message)
    await subscriber.flush()
    try:
        return await _measure(meter, topics, seconds, _publisher(lambda i: publisher.publish(subjects[i], PAYLOAD)),
                              lambda: received, rss_before)
    finally:
        await publisher.close()
        await subscriber.close()


def _publisher(publish: Callable[[int], Awaitable[Any]]) -> Send:
    """A synchronous `send(index)` over an async client's publish: each runs as a task
    (kept referenced until done), so a slow reply never delays the next topic's turn."""
    pending: set[asyncio.Task[Any]] = set()

    def send(index: int) -> None:
        task = asyncio.get_running_loop().create_task(publish(index))
        pending.add(task)
        task.add_done_callback(pending.discard)
    return send


def measure(*, repeat: int, topics: int, seconds: float, dispatches: list[str], peers: list[str],
            brokers: dict[str, str] | None = None) -> list[dict[str, Any]]:
    runs: list[dict[str, Any]] = []
    brokers = brokers or {"this": ""}
    for r in range(repeat):
        for dispatch in dispatches:
            for label, python in brokers.items():
                with Servers([], python or None) as servers:
                    result = asyncio.run(ours(servers, topics, seconds, dispatch == "reliable"))
                runs.append({"workload": f"danube_{dispatch}" + ("" if len(brokers) == 1 else f"[{label}]"),
                             "repeat": r, "measured": "the `danube broker start` process", **result})
                print(runs[-1], file=sys.stderr)
        for peer in peers:
            with Servers([PEERS[peer]]) as servers:
                if PEERS[peer] not in servers.peers:
                    continue
                result = asyncio.run({"redis_pubsub": redis_pubsub, "nats_core": nats_core}[peer](servers, topics, seconds))
            runs.append({"workload": peer, "repeat": r, "measured": f"the {PEERS[peer]}-server process", **result})
    for run in runs:
        run.update({"at": now_utc(), "topics": topics, "seconds": seconds})
    return runs


def report(runs: list[dict[str, Any]]) -> None:
    if not runs:
        return
    first = runs[0]
    print_table(f"{first['topics']:,} topics at 1 msg/s each: server RSS per topic and CPU (% of one core; medians of"
                f" {max(r['repeat'] for r in runs) + 1} runs, {first['seconds']:g} s windows)",
                [("workload", "workload"), ("rss before MiB", "rss_before_mib"), ("rss after MiB", "rss_after_mib"),
                 ("KiB/topic", "rss_per_topic_kib"), ("cpu traffic %", "cpu_traffic_pct"), ("cpu idle %", "cpu_idle_pct"),
                 ("received", "received")],
                medians(runs, "workload", FIELDS))
    for name in dict.fromkeys(run["workload"] for run in runs):
        print(f"  {name}: measured {next(run['measured'] for run in runs if run['workload'] == name)}")


def add_arguments(parser: argparse.ArgumentParser, prefix: str = "") -> None:
    parser.add_argument(f"--{prefix}topics", type=int, default=1000, help="footprint: topics (each 1 msg/s)")
    parser.add_argument(f"--{prefix}seconds", type=float, default=10.0, help="footprint: seconds per CPU window")
    parser.add_argument(f"--{prefix}dispatch", default="non_reliable,reliable", help="footprint: our topic kinds")
    parser.add_argument(f"--{prefix}peers", default=",".join(PEERS), help="footprint: peer workloads")


def options(args: argparse.Namespace, prefix: str = "") -> dict[str, Any]:
    get, key = vars(args), prefix.replace("-", "_")
    return {"topics": get[f"{key}topics"], "seconds": get[f"{key}seconds"],
            "dispatches": split_list(get[f"{key}dispatch"]),
            "peers": split_list(get[f"{key}peers"])}


if __name__ == "__main__":
    run_alone(sys.modules[__name__], brokers=True)

"""Fan-out: one producer, one topic, 10 subscribers each receiving every message; the
figure is the aggregate delivered msg/s (deliveries over all subscribers / (last
receive - first send)).

    .venv/bin/python benchmarks/fanout.py --repeat 3 --count 100000
    .venv/bin/python benchmarks/fanout.py --repeat 1 --count 5000            # smoke run

Ours: `danube bench e2e --subscriptions 10` (10 distinct subscriptions on one
non-reliable topic, one consumer each, all in one consumer process on one client
connection; loss and duplicates counted per subscription). Peers, each with its
subscribers in one consumer process as ours: Redis PUB/SUB (PUBLISH pipelined by 100;
10 redis.asyncio connections subscribed to the channel) and NATS core (publish per
message; 10 nats-py connections with one subscription each). Medians of `--repeat`
runs; every run is appended to benchmarks/results/fanout.jsonl.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from typing import Any

from harness import Servers, medians, now_utc, print_table, run_alone, run_pair, servers_for, split_list
from peer_workloads import nats_core_producer, redis_pubsub_producer

WORKLOAD = "fanout"
PEERS = {"redis_pubsub": "redis", "nats_core": "nats"}
IDLE_S = 5.0
FIELDS = ("msg_s", "received", "lost", "duplicates", "broker_cpu_percent")
NOTES = {
    "redis_pubsub": "redis-py PUBLISH pipelined by 100; N redis.asyncio subscriber connections in one process",
    "nats_core": "nats-py publish per message; N nats-py connections, one subscription each, in one process",
}


# The peer producers of peer_workloads.py publish to "bench" and return their start
# time (time.time()); these consumers end with the time of their last receive.


def redis_consumers(ready: Any, url: str, count: int, size: int, subscribers: int) -> tuple[int, float]:
    import redis.asyncio as redis

    async def run() -> tuple[int, float]:
        pubsubs = [redis.Redis.from_url(url).pubsub(ignore_subscribe_messages=True) for _ in range(subscribers)]
        for pubsub in pubsubs:
            await pubsub.subscribe("bench")
        ready.set()
        received = [0] * subscribers
        last = time.time()

        async def drain(index: int, pubsub: Any) -> None:
            nonlocal last
            idle_since = time.time()
            while received[index] < count and time.time() - idle_since < IDLE_S:
                message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
                if message is not None and message["type"] == "message":
                    received[index] += 1
                    last = idle_since = time.time()
        await asyncio.gather(*(drain(i, p) for i, p in enumerate(pubsubs)))
        for pubsub in pubsubs:
            await pubsub.aclose()
        return sum(received), last
    return asyncio.run(run())


def nats_consumers(ready: Any, url: str, count: int, size: int, subscribers: int) -> tuple[int, float]:
    import nats

    async def run() -> tuple[int, float]:
        connections = [await nats.connect(url, pending_size=1 << 30) for _ in range(subscribers)]
        state = {"received": 0, "last": time.time()}
        done = asyncio.Event()

        async def on_message(_: Any) -> None:
            state["received"] += 1
            state["last"] = time.time()
            if state["received"] >= count * subscribers:
                done.set()
        for nc in connections:
            await nc.subscribe("bench", cb=on_message, pending_msgs_limit=count + 1)
            await nc.flush()
        ready.set()
        while not done.is_set() and time.time() - state["last"] < IDLE_S:
            await asyncio.sleep(0.05)
        for nc in connections:
            await nc.close()
        return int(state["received"]), float(state["last"])
    return asyncio.run(run())


def _produce_redis(ready: Any, url: str, count: int, size: int, subscribers: int) -> float:
    return float(redis_pubsub_producer(url, count, size, ready, {}))


def _produce_nats(ready: Any, url: str, count: int, size: int, subscribers: int) -> float:
    return float(nats_core_producer(url, count, size, ready, {}))


PRODUCERS = {"redis_pubsub": _produce_redis, "nats_core": _produce_nats}
CONSUMERS = {"redis_pubsub": redis_consumers, "nats_core": nats_consumers}


def measure(servers: Servers | None = None, *, repeat: int, count: int, size: int, subscribers: int,
            peers: list[str]) -> list[dict[str, Any]]:
    runs: list[dict[str, Any]] = []
    expected = count * subscribers
    with servers_for(servers, [PEERS[p] for p in peers]) as live:
        for r in range(repeat):
            result = live.danube.bench("e2e", f"/default/fanout-{time.monotonic_ns()}", "--count", str(count),
                                       "--size", str(size), "--subscriptions", str(subscribers))
            runs.append({"workload": "danube_non_reliable", "repeat": r, "msg_s": result["msg_s"],
                         "received": result["received"], "lost": result["lost"], "duplicates": result["duplicates"],
                         "per_subscription": result["per_subscription"],
                         "broker_cpu_percent": (result["broker"] or {}).get("cpu_percent"),
                         "note": f"danube bench e2e --subscriptions {subscribers}, one consumer each"})
            for peer in peers:
                if PEERS[peer] not in live.peers:
                    continue
                start, (received, last) = run_pair(PRODUCERS[peer], CONSUMERS[peer], live.peers[PEERS[peer]].url,
                                                   count, size, subscribers)
                elapsed = last - start
                runs.append({"workload": peer, "repeat": r, "received": received, "lost": expected - received,
                             "msg_s": round(received / elapsed, 1) if received and elapsed > 0 else 0.0,
                             "note": NOTES[peer].replace("N ", f"{subscribers} ")})
    for run in runs:
        run.update({"at": now_utc(), "count": count, "size": size, "subscribers": subscribers})
    return runs


def report(runs: list[dict[str, Any]]) -> None:
    if not runs:
        return
    first = runs[0]
    print_table(f"fan-out: {first['count']:,} messages of {first['size']} B to {first['subscribers']} subscribers"
                f" (aggregate delivered msg/s, medians of {max(r['repeat'] for r in runs) + 1} runs)",
                [("workload", "workload"), ("msg/s", "msg_s"), ("received", "received"), ("lost", "lost"),
                 ("duplicates", "duplicates"), ("broker cpu %", "broker_cpu_percent")],
                medians(runs, "workload", FIELDS))


def add_arguments(parser: argparse.ArgumentParser, prefix: str = "") -> None:
    parser.add_argument(f"--{prefix}count", type=int, default=100_000, help="fan-out: messages published per run")
    parser.add_argument(f"--{prefix}subscribers", type=int, default=10, help="fan-out: subscriptions / subscribers")
    parser.add_argument(f"--{prefix}peers", default=",".join(PEERS), help="fan-out: peer workloads")


def options(args: argparse.Namespace, prefix: str = "") -> dict[str, Any]:
    get, key = vars(args), prefix.replace("-", "_")
    return {"count": get[f"{key}count"], "subscribers": get[f"{key}subscribers"],
            "peers": split_list(get[f"{key}peers"])}


if __name__ == "__main__":
    run_alone(sys.modules[__name__], sized=True)

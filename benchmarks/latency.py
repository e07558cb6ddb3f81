"""Latency at a fixed rate (default 5,000 msg/s, 100 B): ours and the peers, the same
stamp and the same percentiles.

    .venv/bin/python benchmarks/latency.py --repeat 3 --seconds 10
    .venv/bin/python benchmarks/latency.py --repeat 1 --seconds 2           # smoke run

Ours: `danube bench e2e --rate R --count R*S` on a non-reliable topic (end-to-end
latency) and a reliable one (wal_sync always: produce-ack latency, send to receipt
after fsync, and end-to-end), at the client's default batching delay (10 ms) and at
0 ms (a batch leaves as soon as the event loop turns), `--batch-delays` to choose.
Peers: Redis PUB/SUB (redis-py with hiredis, one PUBLISH per message; subscriber
`get_message`) and NATS core (nats-py on uvloop, one publish per message; subscription
callback). The floor: a bare pyzmq relay between three processes at the same rate
(benchmarks/floors.py), in the same table (`--no-floor` leaves it out).

Every message carries the bench stamp (loadgen/stamp.py: producer, sequence and the
CLOCK_MONOTONIC send time in ns); latency = the consumer's receive time minus the
stamped send time, consumer and producer in separate processes on this machine, all
recorded in the same HdrHistogram (loadgen/histogram.py), no warm-up dropped for anyone.
Producers pace message i at start + i / rate. With `--broker LABEL=PYTHON` (repeatable)
each named venv's broker runs in turn, a fresh one per run (an A/B in one run), its rows
labelled `danube_<kind>_delay<ms>ms[LABEL]`. Medians of `--repeat` runs; every run is
appended to benchmarks/results/latency.jsonl.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from typing import Any

import floors
import numpy as np
from harness import Servers, medians, now_utc, print_table, run_alone, run_pair, servers_for, split_list

from danube_zmq.loadgen.histogram import LatencyHistogram
from danube_zmq.loadgen.stamp import Stamper, read_stamp
from danube_zmq.runtime import event_loop

WORKLOAD = "latency"
PEERS = {"redis_pubsub": "redis", "nats_core": "nats"}
IDLE_S = 5.0
FIELDS = ("p50_us", "p90_us", "p99_us", "p99.9_us", "max_us", "ack_p50_us", "ack_p99_us", "received", "lost")
NOTES = {
    "redis_pubsub": "redis-py with hiredis, one PUBLISH per message (no pipeline); subscriber get_message",
    "nats_core": "nats-py on uvloop, one publish per message; subscription callback",
}


def _pace(start_ns: int, index: int, rate: float) -> float:
    """Seconds to wait before message `index` leaves."""
    return max(start_ns + int(index * 1e9 / rate) - time.monotonic_ns(), 0) / 1e9


def _summary(latencies_ns: list[int]) -> dict[str, float | None]:
    histogram = LatencyHistogram()
    histogram.record_many_ns(np.array(latencies_ns, dtype=np.int64))
    return histogram.summary_us()


# ---------------------------------------------------------------- Redis PUB/SUB


def redis_producer(ready: Any, url: str, count: int, size: int, rate: float) -> None:
    import redis

    client = redis.Redis.from_url(url)
    stamper = Stamper(0, size)
    ready.wait(30)
    start = time.monotonic_ns()
    for i in range(count):
        time.sleep(_pace(start, i, rate))
        client.publish("latency", stamper.payload(i, time.monotonic_ns()))


def redis_consumer(ready: Any, url: str, count: int, size: int, rate: float) -> dict[str, Any]:
    import redis

    pubsub = redis.Redis.from_url(url).pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe("latency")
    while not pubsub.subscribed:
        pubsub.get_message(timeout=0.1)
    ready.set()
    latencies: list[int] = []
    while len(latencies) < count:
        message = pubsub.get_message(timeout=IDLE_S)  # None: idle (or the subscription's own confirmation)
        if message is None:
            if latencies:
                break
            continue
        latencies.append(time.monotonic_ns() - read_stamp(message["data"])[2])
    return {"received": len(latencies), "latency_us": _summary(latencies)}


# ---------------------------------------------------------------- NATS core


def nats_producer(ready: Any, url: str, count: int, size: int, rate: float) -> None:
    import nats

    async def run() -> None:
        nc = await nats.connect(url)
        stamper = Stamper(0, size)
        await asyncio.get_running_loop().run_in_executor(None, ready.wait, 30)
        start = time.monotonic_ns()
        for i in range(count):
            await asyncio.sleep(_pace(start, i, rate))
            await nc.publish("latency", stamper.payload(i, time.monotonic_ns()))
        await nc.flush()
        await nc.close()
    event_loop.run(run())


def nats_consumer(ready: Any, url: str, count: int, size: int, rate: float) -> dict[str, Any]:
    import nats

    async def run() -> dict[str, Any]:
        nc = await nats.connect(url, pending_size=1 << 30)
        latencies: list[int] = []
        done = asyncio.Event()

        async def on_message(message: Any) -> None:
            latencies.append(time.monotonic_ns() - read_stamp(message.data)[2])
            if len(latencies) >= count:
                done.set()
        await nc.subscribe("latency", cb=on_message, pending_msgs_limit=count + 1)
        await nc.flush()
        ready.set()
        seen = 0
        while not done.is_set():
            try:
                await asyncio.wait_for(done.wait(), IDLE_S)
            except TimeoutError:
                if seen and len(latencies) == seen:
                    break  # idle since the last window
                seen = len(latencies)
        await nc.close()
        return {"received": len(latencies), "latency_us": _summary(latencies)}
    return event_loop.run(run())


PAIRS = {"redis_pubsub": (redis_producer, redis_consumer), "nats_core": (nats_producer, nats_consumer)}


# ---------------------------------------------------------------- one run of each


def _row(workload: str, repeat: int, count: int, e2e: dict[str, Any] | None, ack: dict[str, Any] | None,
         received: int, note: str) -> dict[str, Any]:
    row: dict[str, Any] = {"workload": workload, "repeat": repeat, "at": now_utc(), "sent": count,
                           "received": received, "lost": count - received, "note": note}
    for name, value in (e2e or {}).items():
        row[f"{name}_us"] = value
    row["ack_p50_us"] = ack["p50"] if ack else None
    row["ack_p99_us"] = ack["p99"] if ack else None
    return row


def measure(servers: Servers | None = None, *, repeat: int, seconds: float, rate: float, size: int,
            batch_delays: list[int], peers: list[str], floor: bool = True,
            brokers: dict[str, str] | None = None) -> list[dict[str, Any]]:
    count = max(int(rate * seconds), 1)
    runs: list[dict[str, Any]] = []
    brokers = brokers or {"this": ""}
    with servers_for(servers, [PEERS[p] for p in peers]) as live:
        for r in range(repeat):
            for label, python in brokers.items():
                # One broker: the suite's servers; several: a fresh broker per label and run, in turn.
                with servers_for(live if len(brokers) == 1 else None, [], python or None) as ours:
                    for reliable in (False, True):
                        for delay in batch_delays:
                            kind = "reliable" if reliable else "non_reliable"
                            result = ours.danube.bench(
                                "e2e", f"/default/lat-{kind}-{delay}-{time.monotonic_ns()}", "--rate", str(rate),
                                "--count", str(count), "--size", str(size), "--batch-max-delay-ms", str(delay),
                                *(["--reliable"] if reliable else []))
                            suffix = "" if len(brokers) == 1 else f"[{label}]"
                            runs.append(_row(f"danube_{kind}_delay{delay}ms{suffix}", r, count,
                                             result["e2e_latency_us"], result["ack_latency_us"] if reliable else None,
                                             result["received"], f"danube bench e2e, batch delay {delay} ms"
                                             + (", wal_sync always" * reliable)))
                            print(runs[-1], file=sys.stderr)
            for peer in peers:
                if PEERS[peer] not in live.peers:
                    continue
                producer, consumer = PAIRS[peer]
                _, consumed = run_pair(producer, consumer, live.peers[PEERS[peer]].url, count, size, rate)
                runs.append(_row(peer, r, count, consumed["latency_us"], None, consumed["received"], NOTES[peer]))
            if floor:
                # The bare pyzmq relay (benchmarks/floors.py) at the same rate, in the same run: the
                # transport's floor beside ours and the peers, in one table.
                relay = floors.zmq_relay(rate=rate, seconds=seconds, size=size)
                summary = {name[:-3]: relay[name] for name in ("p50_us", "p90_us", "p99_us", "max_us")}
                runs.append(_row("floor_zmq_relay", r, count, summary, None, relay["samples"],
                                 "bare pyzmq PUSH -> relay (recv, send) -> PULL, three processes, tcp://"))
    for run in runs:
        run.update({"rate": rate, "size": size})
    return runs


def report(runs: list[dict[str, Any]]) -> None:
    if not runs:
        return
    print_table(f"latency at {runs[0]['rate']:,.0f} msg/s, {runs[0]['size']} B (medians of {max(r['repeat'] for r in runs) + 1}"
                " runs; µs)",
                [("workload", "workload"), ("e2e p50", "p50_us"), ("p90", "p90_us"), ("p99", "p99_us"),
                 ("p99.9", "p99.9_us"), ("max", "max_us"), ("ack p50", "ack_p50_us"), ("ack p99", "ack_p99_us"),
                 ("received", "received"), ("lost", "lost")],
                medians(runs, "workload", FIELDS))


def add_arguments(parser: argparse.ArgumentParser, prefix: str = "") -> None:
    parser.add_argument(f"--{prefix}seconds", type=float, default=10.0, help="latency: seconds of traffic per run")
    parser.add_argument(f"--{prefix}rate", type=float, default=5000.0, help="latency: messages per second")
    parser.add_argument(f"--{prefix}batch-delays", default="10,0", help="latency: our client batch delays (ms) to run")
    parser.add_argument(f"--{prefix}peers", default=",".join(PEERS), help="latency: peer workloads")
    parser.add_argument(f"--{prefix}no-floor", action="store_true",
                        help="latency: leave out the bare pyzmq relay row (benchmarks/floors.py)")


def options(args: argparse.Namespace, prefix: str = "") -> dict[str, Any]:
    get = vars(args)
    key = prefix.replace("-", "_")
    return {"seconds": get[f"{key}seconds"], "rate": get[f"{key}rate"],
            "batch_delays": [int(d) for d in split_list(get[f"{key}batch_delays"])],
            "peers": split_list(get[f"{key}peers"]), "floor": not get[f"{key}no_floor"]}


if __name__ == "__main__":
    run_alone(sys.modules[__name__], sized=True, brokers=True)

"""A slow consumer: a producer flat out, a consumer that takes 1,000 msg/s; the broker's
RSS must stay bounded by its configured buffers whatever the producer does.

    .venv/bin/python benchmarks/slow_consumer.py --repeat 3 --seconds 20
    .venv/bin/python benchmarks/slow_consumer.py --repeat 1 --seconds 3              # smoke run

Every run starts its own broker (default configuration). The consumer (a child
process, Exclusive subscription, the client's default receiver queue of 1,000) takes
`batch_receive` batches of at most 100 and sleeps so that it handles `--consume-rate`
msg/s, acking on reliable topics. The producer is `danube bench produce --duration
SECONDS` (max rate, 100 B). The broker's RSS (psutil, the `danube broker start`
process) is sampled every 0.5 s from just before the producer starts until it ends:
start, max and end are reported, with the growth over the run's second half (flat
means bounded) and the configured bounds that should hold it: non-reliable
subscriptions keep at most dispatch.pending_messages_max / pending_bytes_max and drop
(and count) the rest; reliable topics keep the log on disk and at most
storage.cache_bytes_max of it in memory. Medians of `--repeat` runs; every run is
appended to benchmarks/results/slow_consumer.jsonl.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import multiprocessing as mp
import queue
import sys
import threading
import time
from typing import Any

from harness import Meter, Servers, medians, now_utc, print_table, run_alone, split_list

from danube_zmq.config.broker_config import DispatchSection, StorageSection
from danube_zmq.transport.errors import Timeout

WORKLOAD = "slow_consumer"
SAMPLE_S = 0.5
BATCH_MAX = 100
FIELDS = ("produced", "produce_msg_s", "consumed", "rss_start_mib", "rss_max_mib", "rss_end_mib",
          "rss_growth_second_half_mib")


def consumer_main(url: str, topic: str, reliable: bool, rate: float, ready: Any, stop: Any, out: Any) -> None:
    from danube_zmq import DanubeClient

    async def run() -> int:
        consumed = 0
        async with DanubeClient(url, client_name="slow-consumer") as client:
            producer = await client.create_producer(topic, dispatch="reliable" if reliable else "non_reliable")
            await producer.close()  # the topic exists now, with its dispatch
            consumer = await client.subscribe(topic, "slow", sub_type="exclusive")
            ready.set()
            while not stop.is_set():
                with contextlib.suppress(Timeout):
                    batch = await consumer.batch_receive(BATCH_MAX, timeout=0.5)
                    consumed += len(batch)
                    if reliable:
                        await consumer.ack(batch)
                    await asyncio.sleep(len(batch) / rate)
        return consumed
    out.put(asyncio.run(run()))


def one_run(seconds: float, reliable: bool, consume_rate: float) -> dict[str, Any]:
    with Servers([]) as servers:
        broker = servers.danube
        meter = Meter(broker.pid)
        topic = f"/default/slow-{time.monotonic_ns()}"
        context = mp.get_context("spawn")
        ready, stop, out = context.Event(), context.Event(), context.Queue()
        child = context.Process(target=consumer_main, args=(broker.url, topic, reliable, consume_rate, ready, stop, out),
                                daemon=True)
        child.start()
        try:
            if not ready.wait(60):
                raise SystemExit("the slow consumer did not subscribe")
            samples: list[tuple[float, int]] = []  # (seconds since the producer started, RSS)
            result: dict[str, Any] = {}

            def produce() -> None:
                result.update(broker.bench("produce", topic, "--duration", str(seconds), "--size", "100",
                                           *(["--reliable"] if reliable else [])))
            producing = threading.Thread(target=produce)
            start = time.monotonic()
            samples.append((0.0, meter.rss_bytes()))
            producing.start()
            while producing.is_alive():
                producing.join(SAMPLE_S)
                samples.append((time.monotonic() - start, meter.rss_bytes()))
            if not result:
                raise SystemExit("danube bench produce failed (its error is above)")
        finally:
            stop.set()
            try:
                consumed = out.get(timeout=60)
            except queue.Empty:
                consumed = None
            child.join(10)
            if child.is_alive():
                child.kill()
    rss = [value for _, value in samples]
    half = samples[-1][0] / 2
    first_half = max((v for t, v in samples if t <= half), default=rss[0])
    mib = 2**20
    return {"produced": result.get("acked"), "produce_msg_s": result.get("msg_s"), "consumed": consumed,
            "rss_start_mib": round(rss[0] / mib, 1), "rss_max_mib": round(max(rss) / mib, 1),
            "rss_end_mib": round(rss[-1] / mib, 1), "rss_growth_second_half_mib": round((max(rss) - first_half) / mib, 1),
            "rss_samples_mib": [round(v / mib, 1) for v in rss]}


def measure(*, repeat: int, seconds: float, consume_rate: float, dispatches: list[str]) -> list[dict[str, Any]]:
    dispatch, storage = DispatchSection(), StorageSection()
    bounds = {"non_reliable": f"pending_messages_max {dispatch.pending_messages_max:,}, pending_bytes_max"
                              f" {dispatch.pending_bytes_max / 2**20:g} MiB per subscription",
              "reliable": f"cache_bytes_max {storage.cache_bytes_max / 2**20:g} MiB per topic; the log on disk"}
    runs = []
    for r in range(repeat):
        for kind in dispatches:
            runs.append({"workload": f"danube_{kind}", "repeat": r, "at": now_utc(), "seconds": seconds,
                         "consume_rate": consume_rate, "bounds": bounds[kind],
                         **one_run(seconds, kind == "reliable", consume_rate)})
    return runs


def report(runs: list[dict[str, Any]]) -> None:
    if not runs:
        return
    first = runs[0]
    print_table(f"slow consumer: producer flat out for {first['seconds']:g} s, consumer {first['consume_rate']:,.0f} msg/s;"
                f" broker RSS (medians of {max(r['repeat'] for r in runs) + 1} runs)",
                [("workload", "workload"), ("produced", "produced"), ("msg/s", "produce_msg_s"), ("consumed", "consumed"),
                 ("rss start MiB", "rss_start_mib"), ("max", "rss_max_mib"), ("end", "rss_end_mib"),
                 ("growth 2nd half", "rss_growth_second_half_mib")],
                medians(runs, "workload", FIELDS))
    for name in dict.fromkeys(run["workload"] for run in runs):
        print(f"  {name}: bounded by {next(run['bounds'] for run in runs if run['workload'] == name)}")


def add_arguments(parser: argparse.ArgumentParser, prefix: str = "") -> None:
    parser.add_argument(f"--{prefix}seconds", type=float, default=20.0, help="slow consumer: seconds of producing")
    parser.add_argument(f"--{prefix}consume-rate", type=float, default=1000.0, help="slow consumer: msg/s consumed")
    parser.add_argument(f"--{prefix}dispatch", default="non_reliable,reliable", help="slow consumer: our topic kinds")


def options(args: argparse.Namespace, prefix: str = "") -> dict[str, Any]:
    get, key = vars(args), prefix.replace("-", "_")
    return {"seconds": get[f"{key}seconds"], "consume_rate": get[f"{key}consume_rate"],
            "dispatches": split_list(get[f"{key}dispatch"])}


if __name__ == "__main__":
    run_alone(sys.modules[__name__])

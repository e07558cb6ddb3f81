"""What this machine allows at the bottom: the latency of bare pyzmq and of an fsync,
with no broker logic at all, to judge the latency targets against.

    .venv/bin/python benchmarks/floors.py --repeat 3 --seconds 5
    .venv/bin/python benchmarks/floors.py --repeat 1 --seconds 1            # smoke run

- zmq_relay: the shape of our non-reliable path with nothing in it. A producer process
  PUSHes stamped messages (loadgen/stamp.py) at `--rate` over tcp:// loopback to a relay
  process, whose loop is one blocking `recv` and one `send` (PULL in, PUSH out), to a
  consumer process that PULLs them; latency = receive time - stamped send time. Three
  processes and two TCP hops, as producer -> broker -> consumer.
- zmq_round_trip: a DEALER sends one message to a ROUTER in another process, which
  echoes it; the round trip, once with 5 ms between messages (an idle machine: every
  hop wakes a sleeping thread) and once back to back. A producer's receipt is at least
  this.
- zmq_send: the wall time of one DEALER `send` to a ROUTER in another process, sends
  200 µs apart (the gap of 5k msg/s): what handing a message to libzmq's I/O thread
  costs the sending thread when that thread sleeps between messages.
- fdatasync: one append of `size` bytes and `os.fdatasync` on the file system of
  `--dir` (the broker's data directory by default: the temporary directory), 1 ms
  apart. A reliable receipt (wal_sync always) is at least this plus a round trip.

Medians of `--repeat` runs; every run is appended to benchmarks/results/floors.jsonl.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing as mp
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import zmq
from e2e import free_port
from harness import medians, now_utc, print_table, run_alone

from danube_zmq.loadgen.histogram import LatencyHistogram
from danube_zmq.loadgen.stamp import Stamper, read_stamp

WORKLOAD = "floors"
FIELDS = ("p50_us", "p90_us", "p99_us", "max_us", "mean_us", "samples")
_GAP_S = 0.005


def _summary(latencies_ns: list[int]) -> dict[str, Any]:
    histogram = LatencyHistogram()
    histogram.record_many_ns(np.array(latencies_ns, dtype=np.int64))
    summary = histogram.summary_us()
    return {"p50_us": summary["p50"], "p90_us": summary["p90"], "p99_us": summary["p99"], "max_us": summary["max"],
            "mean_us": round(float(np.mean(latencies_ns)) / 1000, 1) if latencies_ns else None,
            "samples": len(latencies_ns)}


# ---------------------------------------------------------------- relay


def _relay(in_url: str, out_url: str, count: int) -> None:
    context = zmq.Context()
    pull, push = context.socket(zmq.PULL), context.socket(zmq.PUSH)
    pull.bind(in_url)
    push.bind(out_url)
    for _ in range(count):
        push.send(pull.recv())
    push.close(linger=5000)
    pull.close(linger=0)
    context.term()


def _relay_consumer(out_url: str, count: int, ready: Any, results: Any) -> None:
    context = zmq.Context()
    pull = context.socket(zmq.PULL)
    pull.connect(out_url)
    ready.set()
    latencies = []
    pull.setsockopt(zmq.RCVTIMEO, 10_000)
    try:
        for _ in range(count):
            payload = pull.recv()
            latencies.append(time.monotonic_ns() - read_stamp(payload)[2])
    except zmq.Again:
        pass  # short: reported as fewer samples than sent
    results.put(latencies)
    pull.close(linger=0)
    context.term()


def zmq_relay(*, rate: float, seconds: float, size: int) -> dict[str, Any]:
    count = max(int(rate * seconds), 1)
    in_url, out_url = f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"
    spawn = mp.get_context("spawn")
    ready, results = spawn.Event(), spawn.Queue()
    relay = spawn.Process(target=_relay, args=(in_url, out_url, count), daemon=True)
    consumer = spawn.Process(target=_relay_consumer, args=(out_url, count, ready, results), daemon=True)
    relay.start()
    consumer.start()
    try:
        ready.wait(30)
        context = zmq.Context()
        push = context.socket(zmq.PUSH)
        push.connect(in_url)
        time.sleep(0.5)  # both connections up before the clock starts
        stamper = Stamper(0, size)
        start_ns = time.monotonic_ns()
        for index in range(count):
            wait_ns = start_ns + int(index * 1e9 / rate) - time.monotonic_ns()
            if wait_ns > 0:
                time.sleep(wait_ns / 1e9)
            push.send(stamper.payload(index, time.monotonic_ns()))
        latencies = results.get(timeout=120)
        push.close(linger=0)
        context.term()
    finally:
        for process in (relay, consumer):
            process.join(10)
            if process.is_alive():
                process.kill()
    return {**_summary(latencies), "rate": rate}


# ---------------------------------------------------------------- round trip


def _router(url: str, count: int, echo: bool) -> None:
    """Another process's ROUTER: takes `count` messages, sending each back with `echo`."""
    context = zmq.Context()
    router = context.socket(zmq.ROUTER)
    router.bind(url)
    for _ in range(count):
        parts = router.recv_multipart()
        if echo:
            router.send_multipart(parts)
    router.close(linger=1000 if echo else 0)
    context.term()


@contextlib.contextmanager
def _dealer_to_router(count: int, *, echo: bool) -> Iterator[zmq.Socket]:
    """A DEALER connected to `_router` in a process of its own, taking `count` messages
    (the first one, sent here, is answered once the connection is up when `echo`)."""
    url = f"tcp://127.0.0.1:{free_port()}"
    router = mp.get_context("spawn").Process(target=_router, args=(url, count + 1, echo), daemon=True)
    router.start()
    context = zmq.Context()
    dealer = context.socket(zmq.DEALER)
    try:
        dealer.setsockopt(zmq.RCVTIMEO, 10_000)
        dealer.connect(url)
        dealer.send(b"hello")
        if echo:
            dealer.recv()
        else:
            time.sleep(0.5)  # connected
        yield dealer
    finally:
        dealer.close(linger=1000)
        context.term()
        router.join(10)
        if router.is_alive():
            router.kill()


def zmq_round_trip(*, count: int, gap_s: float, size: int) -> dict[str, Any]:
    payload = b"x" * size
    latencies = []
    with _dealer_to_router(count, echo=True) as dealer:
        for _ in range(count):
            if gap_s:
                time.sleep(gap_s)
            sent = time.monotonic_ns()
            dealer.send(payload)
            dealer.recv()
            latencies.append(time.monotonic_ns() - sent)
    return {**_summary(latencies), "gap_ms": gap_s * 1000}


# ---------------------------------------------------------------- one send


def zmq_send(*, count: int, gap_s: float, size: int) -> dict[str, Any]:
    """The wall time of one `send` of a DEALER to a ROUTER in another process, sends
    `gap_s` apart: libzmq hands the message to its I/O thread, which it wakes when idle
    (every send here, as every one-message batch at 5k msg/s meets it)."""
    payload = b"x" * size
    durations = []
    with _dealer_to_router(count, echo=False) as dealer:
        for _ in range(count):
            deadline = time.perf_counter() + gap_s
            while time.perf_counter() < deadline:  # spin: a sleep would idle the core too
                pass
            started = time.monotonic_ns()
            dealer.send(payload, zmq.NOBLOCK)
            durations.append(time.monotonic_ns() - started)
    return {**_summary(durations), "gap_ms": gap_s * 1000}


# ---------------------------------------------------------------- fsync


def fdatasync(*, directory: str, size: int, count: int) -> dict[str, Any]:
    fd, path = tempfile.mkstemp(prefix="danube-floor-", dir=directory)
    payload = b"x" * size
    latencies = []
    try:
        for _ in range(count):
            started = time.monotonic_ns()
            os.write(fd, payload)
            os.fdatasync(fd)
            latencies.append(time.monotonic_ns() - started)
            time.sleep(0.001)
    finally:
        os.close(fd)
        os.unlink(path)
    return {**_summary(latencies), "size": size}


# ---------------------------------------------------------------- suite


def measure(*, repeat: int, size: int, rate: float, seconds: float, directory: str) -> list[dict[str, Any]]:
    runs: list[dict[str, Any]] = []
    stamp = now_utc()
    round_trips = max(int(seconds / _GAP_S), 50)
    for r in range(repeat):
        print(f"floors run {r + 1}/{repeat}", file=sys.stderr)
        parts = {
            f"zmq_relay_{int(rate)}_per_s": zmq_relay(rate=rate, seconds=seconds, size=size),
            "zmq_round_trip_idle": zmq_round_trip(count=round_trips, gap_s=_GAP_S, size=size),
            "zmq_round_trip_busy": zmq_round_trip(count=round_trips * 4, gap_s=0.0, size=size),
            "zmq_send_200us_apart": zmq_send(count=round_trips * 4, gap_s=0.0002, size=size),
            "fdatasync_120B": fdatasync(directory=directory, size=120, count=round_trips),
            "fdatasync_128KiB": fdatasync(directory=directory, size=128 * 1024, count=max(round_trips // 4, 20)),
        }
        for name, result in parts.items():
            runs.append({"workload": name, "run": r, "at": stamp, "size": size, **result})
    return runs


def report(runs: list[dict[str, Any]]) -> None:
    repeat = len({run["run"] for run in runs})
    columns = [("floor", "workload"), ("runs", "runs"), ("p50 µs", "p50_us"), ("p90 µs", "p90_us"),
               ("p99 µs", "p99_us"), ("max µs", "max_us"), ("samples", "samples")]
    print_table(f"Floors of this machine (medians of {repeat} runs)", columns, medians(runs, "workload", FIELDS))


def add_arguments(parser: argparse.ArgumentParser, prefix: str = "") -> None:
    parser.add_argument(f"--{prefix}rate", type=float, default=5000.0, help="floors: relay messages per second")
    parser.add_argument(f"--{prefix}seconds", type=float, default=5.0, help="floors: seconds per measurement")
    parser.add_argument(f"--{prefix}dir", default=tempfile.gettempdir(), help="floors: where fdatasync is timed")


def options(args: argparse.Namespace, prefix: str = "") -> dict[str, Any]:
    get = vars(args)
    key = prefix.replace("-", "_")
    return {"rate": get[f"{key}rate"], "seconds": get[f"{key}seconds"], "directory": get[f"{key}dir"]}


if __name__ == "__main__":
    run_alone(sys.modules[__name__], sized=True)

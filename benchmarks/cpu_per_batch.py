"""The broker's CPU per batch (issue 20: "halved, measured at 5k batches/s"): `--producers`
paced producers (default 10) send `--rate` messages a second in all, one message per
batch, to a non-reliable topic with one consumer; the broker's CPU (user + sys of its process, psutil) over the
sending window, divided by the batches it took.

    .venv/bin/python benchmarks/cpu_per_batch.py --repeat 5 --seconds 10
    .venv/bin/python benchmarks/cpu_per_batch.py --repeat 5 \\
        --broker before=/work/a/.venv/bin/python --broker after=/work/b/.venv/bin/python

Each run starts a fresh broker (`danube broker start`, run by the named venv's
Python: `--broker LABEL=PYTHON`, repeatable; default this checkout's, or
$DANUBE_BENCH_BROKER_PYTHON), measures its idle CPU for `--idle-seconds`, then runs
`danube bench e2e --rate R --duration S --batch-max-messages 1 --producers P` from this checkout (the
same client for every broker). With several brokers the runs alternate (A, B, A, B,
...), so a machine that gets busier part way through loads both alike.

Reported per broker: µs of broker CPU per batch (= per message here), raw and net of
its idle CPU over the same wall time, the broker's % of one core, e2e p50/p99, and the
bench processes' CPU; medians of `--repeat` runs with the range (min-max). Every run
is appended to benchmarks/results/cpu_per_batch.jsonl.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from harness import Danube, Meter, append, now_utc, parse_brokers, print_table

WORKLOAD = "cpu_per_batch"


def one_run(python: str, *, rate: float, seconds: float, idle_seconds: float, topics: int,
            producers: int) -> dict[str, Any]:
    broker = Danube(Path(tempfile.mkdtemp(prefix="danube-cpb-")), python).start()
    try:
        meter = Meter(broker.pid)
        time.sleep(1.0)  # start-up work (the first lease, the load manager's first round) out of the idle window
        cpu0, wall0 = meter.cpu_s(), time.monotonic()
        time.sleep(idle_seconds)
        idle_cpu_s_per_s = (meter.cpu_s() - cpu0) / (time.monotonic() - wall0)
        result = broker.bench("e2e", f"/default/cpb-{time.monotonic_ns()}", "--rate", str(rate), "--duration",
                              str(seconds), "--batch-max-messages", "1", "--topics", str(topics),
                              "--producers", str(producers))
    finally:
        broker.stop()
    probe = result["broker"]
    batches = result["acked"]  # one message per batch
    cpu_s, wall_s = probe["cpu_s"], probe["wall_s"]
    clients = result.get("clients") or {}
    return {"batches": batches, "received": result["received"], "lost": result["lost"], "broker_cpu_s": cpu_s,
            "wall_s": wall_s, "broker_cpu_percent": probe["cpu_percent"],
            "idle_cpu_percent": round(100 * idle_cpu_s_per_s, 2),
            "cpu_us_per_batch": round(1e6 * cpu_s / batches, 1) if batches else None,
            "net_cpu_us_per_batch": round(1e6 * (cpu_s - idle_cpu_s_per_s * wall_s) / batches, 1) if batches else None,
            "e2e_p50_us": (result["e2e_latency_us"] or {}).get("p50"),
            "e2e_p99_us": (result["e2e_latency_us"] or {}).get("p99"),
            "producer_cpu_percent": max(clients.get("producer_cpu_percent") or [0.0]),
            "consumer_cpu_percent": clients.get("consumer_cpu_percent")}


def measure(*, repeat: int, brokers: dict[str, str], rate: float, seconds: float, idle_seconds: float,
            topics: int, producers: int) -> list[dict[str, Any]]:
    runs: list[dict[str, Any]] = []
    stamp = now_utc()
    for r in range(repeat):
        for label, python in brokers.items():
            run = one_run(python, rate=rate, seconds=seconds, idle_seconds=idle_seconds, topics=topics,
                          producers=producers)
            runs.append({"workload": label, "python": python, "repeat": r, "at": stamp, "rate": rate,
                         "seconds": seconds, "topics": topics, "producers": producers, **run})
            print(runs[-1], file=sys.stderr)
    return runs


def summarize(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per broker: the median of each figure over its runs, and the range of the CPU per
    batch ("min-max")."""
    rows = []
    for label in dict.fromkeys(run["workload"] for run in runs):
        group = [run for run in runs if run["workload"] == label]
        row: dict[str, Any] = {"workload": label, "runs": len(group)}
        for field in ("cpu_us_per_batch", "net_cpu_us_per_batch", "broker_cpu_percent", "idle_cpu_percent",
                      "e2e_p50_us", "e2e_p99_us", "producer_cpu_percent", "consumer_cpu_percent", "batches", "lost"):
            values = [run[field] for run in group if isinstance(run.get(field), int | float)]
            row[field] = statistics.median(values) if values else None
        spread = [run["cpu_us_per_batch"] for run in group if run.get("cpu_us_per_batch") is not None]
        row["range"] = f"{min(spread):.0f}-{max(spread):.0f}" if spread else "-"
        rows.append(row)
    return rows


def report(runs: list[dict[str, Any]]) -> None:
    if not runs:
        return
    print_table(f"broker CPU per batch at {runs[0]['rate']:,.0f} batches/s (1 message each, 100 B, non-reliable;"
                f" medians of {max(r['repeat'] for r in runs) + 1} runs; µs, % of one core)",
                [("broker", "workload"), ("runs", "runs"), ("cpu µs/batch", "cpu_us_per_batch"), ("range", "range"),
                 ("net of idle", "net_cpu_us_per_batch"), ("broker cpu %", "broker_cpu_percent"),
                 ("idle %", "idle_cpu_percent"), ("e2e p50", "e2e_p50_us"), ("p99", "e2e_p99_us"),
                 ("producer %", "producer_cpu_percent"), ("consumer %", "consumer_cpu_percent"), ("lost", "lost")],
                summarize(runs))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--rate", type=float, default=5000.0, help="batches (= messages) per second")
    parser.add_argument("--seconds", type=float, default=10.0, help="seconds of traffic per run")
    parser.add_argument("--idle-seconds", type=float, default=3.0, help="the broker's idle CPU measured this long")
    parser.add_argument("--topics", type=int, default=1, help="topics, one consumer each")
    parser.add_argument("--producers", type=int, default=10,
                        help="paced producers sharing the rate (one producer's window of 16 batches in flight would"
                             " limit it: its queue, not the broker, would set the latency)")
    parser.add_argument("--broker", action="append", metavar="LABEL=PYTHON",
                        help="a venv's Python whose broker to measure (repeatable: runs alternate)")
    args = parser.parse_args()
    runs = measure(repeat=args.repeat, brokers=parse_brokers(args.broker), rate=args.rate, seconds=args.seconds,
                   idle_seconds=args.idle_seconds, topics=args.topics, producers=args.producers)
    report(runs)
    path = append(WORKLOAD, runs)
    print(f"  ({len(runs)} runs appended to {path.relative_to(path.parent.parent.parent)})")


if __name__ == "__main__":
    main()

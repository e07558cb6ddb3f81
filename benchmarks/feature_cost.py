"""What a feature costs on the data path, off and on: `e2e.py` runs of several variants
alternating in one session (A/B/C, ... per round), medians with the range.

    git worktree add /tmp/before <commit before the feature>
    .venv/bin/python benchmarks/feature_cost.py --rounds 3 \\
        --variant before=/tmp/before: --variant off=: --variant on=:--dedup

A variant is `name=PYTHONPATH:extra e2e args` (an empty PYTHONPATH runs this tree; a
tree given runs its `danube_zmq` in the broker and the clients alike). Each round runs
every variant once for reliable throughput (`--count` messages of `--size` bytes) and
once for reliable latency at `--rate` msg/s; the order of the variants turns each
round, so a drift in the machine is spread over them. Prints one JSON line per run, then
a table of medians (min-max).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

E2E = Path(__file__).with_name("e2e.py")


def _run(pythonpath: str, extra: list[str], mode_args: list[str]) -> dict:
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    out = subprocess.run([sys.executable, str(E2E), *mode_args, "--reliable", *extra], env=env, check=True,
                         capture_output=True, text=True, timeout=900, cwd=pythonpath or None).stdout
    return json.loads(out.strip().splitlines()[-1])


def _summary(values: list[float]) -> str:
    return f"{statistics.median(values):,.0f} ({min(values):,.0f}-{max(values):,.0f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variant", action="append", required=True, help="name=PYTHONPATH:extra e2e args")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--count", type=int, default=200_000)
    parser.add_argument("--rate", type=int, default=5000)
    parser.add_argument("--seconds", type=int, default=10)
    args = parser.parse_args()
    variants = []
    for spec in args.variant:
        name, _, rest = spec.partition("=")
        pythonpath, _, extra = rest.partition(":")
        variants.append((name, pythonpath, extra.split()))
    throughput = ["throughput", "--size", str(args.size), "--count", str(args.count)]
    latency = ["latency", "--size", str(args.size), "--rate", str(args.rate), "--seconds", str(args.seconds)]
    results: dict[str, dict[str, list[float]]] = {name: {"msg_s": [], "ack_p50": [], "e2e_p50": [], "e2e_p99": []}
                                                  for name, _, _ in variants}
    for round_index in range(args.rounds):
        order = variants[round_index % len(variants):] + variants[:round_index % len(variants)]
        for name, pythonpath, extra in order:
            fast = _run(pythonpath, extra, throughput)
            slow = _run(pythonpath, extra, latency)
            print(json.dumps({"variant": name, "round": round_index, "throughput": fast, "latency": slow}), flush=True)
            results[name]["msg_s"].append(fast["msg_s"])
            results[name]["ack_p50"].append(slow["produce_ack_latency_us"]["p50"])
            results[name]["e2e_p50"].append(slow["latency_us"]["p50"])
            results[name]["e2e_p99"].append(slow["latency_us"]["p99"])
    print("| variant | reliable msg/s | produce-ack p50 µs at rate | e2e p50 µs | e2e p99 µs |")
    print("|---|---|---|---|---|")
    for name, figures in results.items():
        print(f"| {name} | {_summary(figures['msg_s'])} | {_summary(figures['ack_p50'])} | "
              f"{_summary(figures['e2e_p50'])} | {_summary(figures['e2e_p99'])} |")


if __name__ == "__main__":
    main()

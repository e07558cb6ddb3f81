"""What security costs: a broker in security.mode curve with a JWT client against a
plaintext broker, side by side in one run (issue 21; goal: secured >= 80% of plaintext).

    .venv/bin/python benchmarks/security.py --repeat 3
    .venv/bin/python benchmarks/security.py --repeat 5 --count 200000 --sizes 100
    .venv/bin/python benchmarks/security.py --sizes 1024 --dispatch reliable --io-threads 2
    .venv/bin/python benchmarks/security.py --sizes 1024 --dispatch reliable --bench-args '--max-inflight-batches 16'

Starts two brokers on loopback from this checkout: one in mode none, one in mode curve
(a cluster key pair, an HS256 secret and a token for a subject named in
`security.super_admins`, all made in a tmp dir, so the token is allowed everything once
requests are checked; where they are not yet, it is carried and verified at Connect).
Then `danube bench e2e` (1 producer -> 1 consumer, the throughput mode of
benchmarks/side_by_side.py) against each in turn, for {100 B, 1 KiB} x {non-reliable,
reliable}, `--repeat` times, the order of the two brokers swapped every repeat so a
drift of the machine favours neither. The secured bench's clients dial over CURVE with
the cluster's public key (DANUBE_SERVER_KEY) and a fresh client pair, and send the token
in every Connect (DANUBE_TOKEN).

Prints the medians with their ranges, the ratio secured / plaintext and the broker's
CPU (% of a core, median) per cell, then where the CPU goes: the producer's and the
consumer's CPU, and the share of the broker's CPU spent in libzmq's I/O threads (read
per thread from /proc: where CURVE encrypts and decrypts), and appends every run to
benchmarks/results/security.jsonl. Throughput is messages received per second: a
non-reliable topic drops what a consumer cannot take (1 KiB flat out loses about half
on one machine, in both modes alike).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from harness import Danube, append, now_utc, split_list

from danube_zmq.security.keys import generate_key_pair
from danube_zmq.security.token_keys import new_secret, read_secret, write_new_file
from danube_zmq.security.tokens import TokenSigner

WORKLOAD = "security"
SUBJECT = "bench-admin"
GOAL_RATIO = 0.8

_PLAINTEXT_ENV = {"DANUBE_SERVER_KEY": "", "DANUBE_CLIENT_KEYS": "", "DANUBE_TOKEN": ""}


def secured_broker(work_dir: Path, io_threads: int) -> Danube:
    """A broker in mode curve: keys, secret, config and the client environment in `work_dir`."""
    cluster = generate_key_pair(work_dir / "broker-keys", "cluster")
    secret_file = work_dir / "jwt.secret"
    write_new_file(secret_file, new_secret(), 0o600)
    config = work_dir / "broker.yml"
    config.write_text(
        f"broker:\n  io_threads: {io_threads}\n"
        "security:\n"
        "  mode: curve\n"
        f"  broker_key_file: {json.dumps(str(cluster.secret_file))}\n"
        f"  broker_public_keys_dir: {json.dumps(str(cluster.public_file.parent))}\n"
        "  jwt_algorithm: HS256\n"
        f"  jwt_secret_file: {json.dumps(str(secret_file))}\n"
        f"  super_admins: [{SUBJECT}]\n")
    signer = TokenSigner("HS256", read_secret(secret_file, "jwt_secret_file"), issuer="danube", audience="danube",
                         now_s=time.time)
    token = signer.create(SUBJECT, "user", 24 * 3600)
    return Danube(work_dir / "broker", config=config,
                  client_env={"DANUBE_SERVER_KEY": cluster.public_key, "DANUBE_CLIENT_KEYS": "",
                              "DANUBE_TOKEN": token})


_TICK_S = 1 / os.sysconf("SC_CLK_TCK")


def thread_cpu_s(pid: int) -> dict[str, float]:
    """CPU seconds (user + system) of the broker process's threads by kind: `zmq_io`
    (libzmq's I/O threads, named ZMQbg/IO/N: where CURVE encrypts and decrypts) and
    `other` (the event loop and everything else)."""
    out = {"zmq_io": 0.0, "other": 0.0}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            name = (task / "comm").read_text().strip()
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # the thread ended meanwhile
            continue
        ticks = int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of stat)
        out["zmq_io" if name.startswith("ZMQbg/IO") else "other"] += ticks * _TICK_S
    return out


def run_once(broker: Danube, reliable: bool, size: int, count: int, bench_args: list[str]) -> dict[str, Any]:
    topic = f"/default/sec-{'r' if reliable else 'n'}-{size}-{time.monotonic_ns()}"
    before, started = thread_cpu_s(broker.pid), time.monotonic()
    result = broker.bench("e2e", topic, "--size", str(size), "--count", str(count),
                          *(["--reliable"] if reliable else []), *bench_args)
    after, wall = thread_cpu_s(broker.pid), time.monotonic() - started
    keep = ("msg_s", "received", "lost", "latency_ms", "broker", "clients")
    # Over the whole bench command (its start and setup included): read as the I/O
    # threads' share of the broker's CPU, not as a rate.
    threads = {kind: round(after[kind] - before[kind], 3) for kind in after}
    return {**{key: result[key] for key in keep if key in result}, "broker_threads_cpu_s": threads,
            "bench_wall_s": round(wall, 3)}


def measure(*, repeat: int, count: int, sizes: list[int], io_threads: int, bench_args: list[str],
            dispatches: list[str]) -> list[dict[str, Any]]:
    work_dir = Path(tempfile.mkdtemp(prefix="danube-security-bench-"))
    plain_config = work_dir / "plaintext.yml"
    plain_config.write_text(f"broker:\n  io_threads: {io_threads}\n")
    plaintext = Danube(work_dir / "plaintext", config=plain_config, client_env=_PLAINTEXT_ENV)
    secured = secured_broker(work_dir / "secured", io_threads)
    runs: list[dict[str, Any]] = []
    stamp = now_utc()
    plaintext.start()
    try:
        secured.start()
        try:
            for r in range(repeat):
                for size in sizes:
                    for reliable in [d == "reliable" for d in dispatches]:
                        pair = [("plaintext", plaintext), ("curve+jwt", secured)]
                        for mode, broker in (pair if r % 2 == 0 else pair[::-1]):
                            result = run_once(broker, reliable, size, count, bench_args)
                            runs.append({"workload": WORKLOAD, "mode": mode, "size": size,
                                         "dispatch": "reliable" if reliable else "non_reliable",
                                         "count": count, "repeat": r, "at": stamp, "io_threads": io_threads,
                                         "bench_args": " ".join(bench_args),
                                         "load_1m": round(os.getloadavg()[0], 2), **result})
                            print(json.dumps(runs[-1]), file=sys.stderr)
        finally:
            secured.stop()
    finally:
        plaintext.stop()
    return runs


def rows(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (size, dispatch): each mode's median msg/s and range, and the ratio."""
    cells: dict[tuple[int, str], dict[str, list[float]]] = {}
    for run in runs:
        cells.setdefault((run["size"], run["dispatch"]), {}).setdefault(run["mode"], []).append(run["msg_s"])
    out = []
    for (size, dispatch), by_mode in cells.items():
        plain, secure = by_mode.get("plaintext", []), by_mode.get("curve+jwt", [])
        plain_median = statistics.median(plain) if plain else None
        secure_median = statistics.median(secure) if secure else None
        def median_of(mode: str, pick: Any, cell: tuple[int, str] = (size, dispatch)) -> float:
            return statistics.median(pick(run) for run in runs if (run["size"], run["dispatch"], run["mode"])
                                     == (*cell, mode))

        cpu = {mode: median_of(mode, lambda run: run["broker"]["cpu_percent"]) for mode in by_mode}
        producer = {mode: median_of(mode, lambda run: sum(run["clients"]["producer_cpu_percent"]))
                    for mode in by_mode}
        consumer = {mode: median_of(mode, lambda run: run["clients"]["consumer_cpu_percent"] or 0.0)
                    for mode in by_mode}
        io_share = {mode: median_of(mode, lambda run: run["broker_threads_cpu_s"]["zmq_io"]
                                    / max(sum(run["broker_threads_cpu_s"].values()), 1e-9)) for mode in by_mode}
        out.append({"size": size, "dispatch": dispatch, "runs": min(len(plain), len(secure)),
                    "plaintext_cpu": cpu.get("plaintext"), "secured_cpu": cpu.get("curve+jwt"),
                    "producer_cpu": producer, "consumer_cpu": consumer, "broker_io_share": io_share,
                    "plaintext": plain_median, "plaintext_range": (min(plain), max(plain)) if plain else None,
                    "secured": secure_median, "secured_range": (min(secure), max(secure)) if secure else None,
                    "ratio": secure_median / plain_median if plain_median and secure_median else None})
    return out


def report(runs: list[dict[str, Any]]) -> None:
    def rate(value: float | None, span: tuple[float, float] | None) -> str:
        if value is None or span is None:
            return "-"
        return f"{value:,.0f} ({span[0]:,.0f}-{span[1]:,.0f})"

    table = rows(runs)
    print(f"\nthroughput msg/s, 1 producer -> 1 consumer, medians (min-max) of {table[0]['runs'] if table else 0} runs")
    print(f"{'size':>5}  {'dispatch':<13} {'plaintext':>28}  {'curve+jwt':>28}  ratio  broker CPU % (plain/secured)")
    for row in table:
        ratio = f"{row['ratio']:.2f}" if row["ratio"] else "-"
        verdict = "" if row["ratio"] is None else ("  ok" if row["ratio"] >= GOAL_RATIO else f"  below {GOAL_RATIO}")
        print(f"{row['size']:>5}  {row['dispatch']:<13} {rate(row['plaintext'], row['plaintext_range']):>28}  "
              f"{rate(row['secured'], row['secured_range']):>28}  {ratio}{verdict}"
              f"  {row['plaintext_cpu']:.0f} / {row['secured_cpu']:.0f}")
    print("\nCPU % of a core, medians (plaintext / secured): producer, consumer, and the share of the"
          " broker's CPU spent in libzmq's I/O threads")
    for row in table:
        def pair(values: dict[str, float], scale: float = 1.0) -> str:
            return f"{values.get('plaintext', 0) * scale:.0f} / {values.get('curve+jwt', 0) * scale:.0f}"

        print(f"{row['size']:>5}  {row['dispatch']:<13} producer {pair(row['producer_cpu'])}"
              f"  consumer {pair(row['consumer_cpu'])}  broker I/O threads {pair(row['broker_io_share'], 100)}%")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--count", type=int, default=100_000, help="messages per run")
    parser.add_argument("--sizes", default="100,1024", help="message sizes in bytes")
    parser.add_argument("--dispatch", default="non_reliable,reliable", help="non_reliable, reliable or both")
    parser.add_argument("--io-threads", type=int, default=1, help="broker.io_threads of both brokers")
    parser.add_argument("--bench-args", default="", help="more `danube bench e2e` options, e.g."
                                                         " '--max-inflight-batches 16'")
    args = parser.parse_args()
    runs = measure(repeat=args.repeat, count=args.count, sizes=[int(s) for s in split_list(args.sizes)],
                   io_threads=args.io_threads, bench_args=args.bench_args.split(),
                   dispatches=split_list(args.dispatch))
    report(runs)
    path = append(WORKLOAD, runs)
    print(f"  ({len(runs)} runs appended to {path.relative_to(path.parent.parent.parent)})")


if __name__ == "__main__":
    main()

"""What security costs: a broker in security.mode curve with a JWT client against a
plaintext broker, side by side in one run (issue 21; goal: secured >= 80% of plaintext).

    .venv/bin/python benchmarks/security.py --repeat 3
    .venv/bin/python benchmarks/security.py --repeat 5 --count 200000 --sizes 100

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
CPU (% of a core, median) per cell, and appends every run to
benchmarks/results/security.jsonl. Throughput is messages received per second: a
non-reliable topic drops what a consumer cannot take (1 KiB flat out loses about half
on one machine, in both modes alike).
"""

from __future__ import annotations

import argparse
import json
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


def secured_broker(work_dir: Path) -> Danube:
    """A broker in mode curve: keys, secret, config and the client environment in `work_dir`."""
    cluster = generate_key_pair(work_dir / "broker-keys", "cluster")
    secret_file = work_dir / "jwt.secret"
    write_new_file(secret_file, new_secret(), 0o600)
    config = work_dir / "broker.yml"
    config.write_text(
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


def run_once(broker: Danube, reliable: bool, size: int, count: int) -> dict[str, Any]:
    topic = f"/default/sec-{'r' if reliable else 'n'}-{size}-{time.monotonic_ns()}"
    result = broker.bench("e2e", topic, "--size", str(size), "--count", str(count),
                          *(["--reliable"] if reliable else []))
    keep = ("msg_s", "received", "lost", "latency_ms", "broker")
    return {key: result[key] for key in keep if key in result}


def measure(*, repeat: int, count: int, sizes: list[int]) -> list[dict[str, Any]]:
    work_dir = Path(tempfile.mkdtemp(prefix="danube-security-bench-"))
    plaintext = Danube(work_dir / "plaintext", client_env=_PLAINTEXT_ENV)
    secured = secured_broker(work_dir / "secured")
    runs: list[dict[str, Any]] = []
    stamp = now_utc()
    plaintext.start()
    try:
        secured.start()
        try:
            for r in range(repeat):
                for size in sizes:
                    for reliable in (False, True):
                        pair = [("plaintext", plaintext), ("curve+jwt", secured)]
                        for mode, broker in (pair if r % 2 == 0 else pair[::-1]):
                            result = run_once(broker, reliable, size, count)
                            runs.append({"workload": WORKLOAD, "mode": mode, "size": size,
                                         "dispatch": "reliable" if reliable else "non_reliable",
                                         "count": count, "repeat": r, "at": stamp, **result})
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
        cpu = {mode: statistics.median(run["broker"]["cpu_percent"] for run in runs
                                       if (run["size"], run["dispatch"], run["mode"]) == (size, dispatch, mode))
               for mode in by_mode}
        out.append({"size": size, "dispatch": dispatch, "runs": min(len(plain), len(secure)),
                    "plaintext_cpu": cpu.get("plaintext"), "secured_cpu": cpu.get("curve+jwt"),
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--count", type=int, default=100_000, help="messages per run")
    parser.add_argument("--sizes", default="100,1024", help="message sizes in bytes")
    args = parser.parse_args()
    runs = measure(repeat=args.repeat, count=args.count, sizes=[int(s) for s in split_list(args.sizes)])
    report(runs)
    path = append(WORKLOAD, runs)
    print(f"  ({len(runs)} runs appended to {path.relative_to(path.parent.parent.parent)})")


if __name__ == "__main__":
    main()

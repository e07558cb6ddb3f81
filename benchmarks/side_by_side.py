"""Our broker and the peers a Python shop would pick instead, side by side in one run.

    .venv/bin/pip install -e '.[peers]'      # redis, nats-py, aio-pika, paho-mqtt
    .venv/bin/python benchmarks/side_by_side.py --repeat 3 --count 200000

Starts a danube broker and the peer servers on loopback (installing their Debian
packages when missing: scripts/install-peers.sh), runs each workload 1 producer ->
1 consumer at 100 B and 1 KiB, `--repeat` times in alternation, and prints medians with
our ratio to each peer; every run is appended to benchmarks/results/side_by_side.jsonl.

Ours: `danube bench e2e` (non-reliable; reliable with wal_sync always, acks after
fsync). Peers (benchmarks/peer_workloads.py): Redis PUB/SUB, Redis Streams with AOF
everysec and always, NATS core, NATS JetStream, RabbitMQ durable queue with publisher
confirms, MQTT QoS 0 and 1 (mosquitto).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from e2e import _ready, free_port
from peer_servers import PeerServers, ensure_installed
from peer_workloads import NOTES, WORKLOADS, run_workload

from danube_zmq.bench.compare import median_rates, ratio_rows

RESULTS = Path(__file__).resolve().parent / "results" / "side_by_side.jsonl"


def run_ours(url: str, reliable: bool, count: int, size: int) -> dict[str, object]:
    args = [sys.executable, "-m", "danube_zmq.cli.main", "bench", "e2e", "-s", url, "-t",
            f"/default/sbs-{'r' if reliable else 'n'}-{size}-{time.monotonic_ns()}", "--size", str(size),
            "--count", str(count), "--json"]
    if reliable:
        args.append("--reliable")
    done = subprocess.run(args, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise SystemExit(done.stderr)
    result = json.loads(done.stdout)
    return {"msg_s": result["msg_s"], "received": result["received"], "lost": result["lost"],
            "broker": result["broker"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--count", type=int, default=200_000)
    parser.add_argument("--sizes", default="100,1024")
    parser.add_argument("--peers", default=",".join(WORKLOADS), help="peer workloads to run")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    workloads = [w for w in args.peers.split(",") if w]
    still_missing = ensure_installed()
    for name in still_missing:
        print(f"skip: {name} could not be installed (scripts/install-peers.sh)", file=sys.stderr)
    work = Path(tempfile.mkdtemp(prefix="danube-sbs-"))
    servers = PeerServers(work).start(sorted({WORKLOADS[w][0] for w in workloads} - set(still_missing)))
    for name, why in servers.skipped.items():
        print(f"skip: {name} did not start: {why}", file=sys.stderr)
    url, admin_url = f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"
    broker = subprocess.Popen([sys.executable, "-m", "danube_zmq.cli.main", "broker", "start", "--listen", url,
                               "--admin-listen", admin_url, "--metrics-port", "0", "--data-dir", str(work / "danube")],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    runs: list[dict[str, object]] = []
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    try:
        asyncio.run(_ready(admin_url))
        for repeat in range(args.repeat):
            for size in sizes:
                for reliable in (False, True):
                    name = "danube_reliable" if reliable else "danube_non_reliable"
                    runs.append({"workload": name, "size": size, "repeat": repeat, "at": stamp,
                                 **run_ours(url, reliable, args.count, size)})
                    print(json.dumps(runs[-1]), file=sys.stderr)
                for workload in workloads:
                    server = WORKLOADS[workload][0]
                    if server not in servers.peers:
                        continue
                    count = args.count if workload != "redis_streams_always" else max(args.count // 4, 1000)
                    result = run_workload(workload, servers.peers[server].url, count, size)
                    runs.append({"workload": workload, "size": size, "repeat": repeat, "at": stamp,
                                 "note": NOTES[workload], **result})
                    print(json.dumps(runs[-1]), file=sys.stderr)
    finally:
        broker.terminate()
        broker.wait(30)
        servers.stop()
    RESULTS.parent.mkdir(exist_ok=True)
    with open(RESULTS, "a") as out:
        for run in runs:
            out.write(json.dumps(run) + "\n")
    medians = median_rates(runs)
    print(f"{'size':>5}  {'ours':<20} {'msg/s':>10}  {'peer':<22} {'msg/s':>10}  ratio")
    for row in ratio_rows(medians, sizes):
        ours = f"{row.ours_msg_s:,.0f}" if row.ours_msg_s else "-"
        peer = f"{row.peer_msg_s:,.0f}" if row.peer_msg_s else "-"
        ratio = f"{row.ratio:.2f}x" if row.ratio else "-"
        print(f"{row.size:>5}  {row.ours:<20} {ours:>10}  {row.peer:<22} {peer:>10}  {ratio}")


if __name__ == "__main__":
    main()

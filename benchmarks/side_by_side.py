"""Our broker and the peers a Python shop would pick instead, side by side in one run.

    .venv/bin/pip install -e '.[peers]'      # redis, nats-py, aio-pika, paho-mqtt
    .venv/bin/python benchmarks/side_by_side.py --repeat 3             # every workload
    .venv/bin/python benchmarks/side_by_side.py --workloads throughput,latency --repeat 3 --count 200000

Starts a danube broker and the peer servers on loopback (installing their Debian
packages when missing: scripts/install-peers.sh) and runs the workloads named by
`--workloads`, each `--repeat` times, printing a table of medians per workload:

- throughput: 1 producer -> 1 consumer at 100 B and 1 KiB, ours (`danube bench e2e`,
  non-reliable; reliable with wal_sync always, acks after fsync) and the peers of
  benchmarks/peer_workloads.py (Redis PUB/SUB, Redis Streams with AOF everysec and
  always, NATS core, NATS JetStream, RabbitMQ durable queue with publisher confirms,
  MQTT QoS 0 and 1), in alternation, with our ratio to each peer; runs appended to
  benchmarks/results/side_by_side.jsonl.
- latency (benchmarks/latency.py): p50/p99 at a fixed 5,000 msg/s, 100 B.
- fanout (benchmarks/fanout.py): one topic to 10 subscriptions, aggregate msg/s.
- footprint (benchmarks/footprint.py): 1,000 topics at 1 msg/s each, broker RSS per
  topic and CPU (fresh servers per run).
- slow_consumer (benchmarks/slow_consumer.py): a producer flat out, a consumer at
  1,000 msg/s, broker RSS over time (a fresh broker per run).
- floors (benchmarks/floors.py): no broker at all: a bare pyzmq relay between three
  processes at 5,000 msg/s, a pyzmq round trip idle and busy, and fdatasync: what the
  latency targets are up against on this machine.
- many_producers (benchmarks/many_producers.py): 200 paced producers in 4 processes
  over 20 topics at 10,000 msg/s in all, one consumer per topic: e2e p50/p99/max,
  delivered/sent, the broker's CPU and every bench process's CPU, ours beside NATS core
  and Redis PUB/SUB (--many-producers 1 / 20 / 200 for the issue's three points).
- transport_floor (benchmarks/transport_floor.py): our path's shape with no logic
  (producer -> relay -> consumer, a receipt back) on libzmq and on plain asyncio TCP,
  beside NATS core: latency and each process's CPU per message.
- cpu_per_batch (benchmarks/cpu_per_batch.py): our broker's CPU per batch at 5,000
  one-message batches/s (fresh broker per run; ours only).

To measure another checkout's broker with this checkout's bench and peers, point
$DANUBE_BENCH_BROKER_PYTHON at that checkout's venv Python (e.g.
/work/before/.venv/bin/python); or pass `--broker LABEL=PYTHON` twice (this suite's
throughput, latency, many_producers, footprint and cpu_per_batch, and those scripts
alone) to alternate the two brokers in one run, a fresh broker per run.

Throughput, latency and fan-out run first, on the suite's servers; footprint and the
slow consumer after those are stopped. Each of those modules also runs alone (its --help); their options appear here with
the workload's name as a prefix (--latency-seconds, --fanout-count, ...). Every run is
appended to benchmarks/results/<workload>.jsonl.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import cpu_per_batch
import fanout
import floors
import footprint
import latency
import many_producers
import slow_consumer
import transport_floor
from harness import Danube, Servers, append, finish, now_utc, parse_brokers, split_list
from peer_workloads import NOTES, WORKLOADS, client_stack, run_workload

from danube_zmq.loadgen.compare import median_rates, ratio_rows

WORKLOAD_NAMES = ("throughput", "latency", "fanout", "many_producers", "footprint", "slow_consumer", "floors",
                  "transport_floor", "cpu_per_batch")


def run_ours(broker: Danube, reliable: bool, count: int, size: int) -> dict[str, object]:
    result = broker.bench("e2e", f"/default/sbs-{'r' if reliable else 'n'}-{size}-{time.monotonic_ns()}", "--size",
                          str(size), "--count", str(count), *(["--reliable"] if reliable else []))
    return {"msg_s": result["msg_s"], "received": result["received"], "lost": result["lost"],
            "broker": result["broker"]}


def throughput(servers: Servers, repeat: int, count: int, sizes: list[int], workloads: list[str],
               brokers: dict[str, str] | None = None) -> None:
    runs: list[dict[str, Any]] = []
    stamp = now_utc()
    brokers = brokers or {"this": ""}
    for r in range(repeat):
        for size in sizes:
            for reliable in (False, True):
                name = "danube_reliable" if reliable else "danube_non_reliable"
                for label, python in brokers.items():
                    if len(brokers) == 1:
                        result = run_ours(servers.danube, reliable, count, size)
                    else:  # several: a fresh broker per label and run, in turn (an A/B in one run)
                        broker = Danube(Path(tempfile.mkdtemp(prefix="danube-sbs-ab-")), python).start()
                        try:
                            result = {"python": python, **run_ours(broker, reliable, count, size)}
                        finally:
                            broker.stop()
                    runs.append({"workload": name + ("" if len(brokers) == 1 else f"[{label}]"), "size": size,
                                 "repeat": r, "at": stamp, **result})
                    print(json.dumps(runs[-1]), file=sys.stderr)
            for workload in workloads:
                server = WORKLOADS[workload][0]
                if server not in servers.peers:
                    continue
                peer_count = count if workload != "redis_streams_always" else max(count // 4, 1000)
                result = run_workload(workload, servers.peers[server].url, peer_count, size)
                runs.append({"workload": workload, "size": size, "repeat": r, "at": stamp, "note": NOTES[workload],
                             "client": client_stack()[server], **result})
                print(json.dumps(runs[-1]), file=sys.stderr)
    append("side_by_side", runs)
    for label in brokers:
        suffix = "" if len(brokers) == 1 else f"[{label}]"
        # The ratio table names our workloads without a label: this broker's runs under those names.
        mine = [{**run, "workload": run["workload"].removesuffix(suffix)} for run in runs
                if not run["workload"].startswith("danube_") or run["workload"].endswith(suffix)]
        print(f"\nthroughput, 1 producer -> 1 consumer (medians of {repeat} runs){' ' + label if suffix else ''}")
        print(f"{'size':>5}  {'ours':<20} {'msg/s':>10}  {'peer':<22} {'msg/s':>10}  ratio")
        for row in ratio_rows(median_rates(mine), sizes):
            ours = f"{row.ours_msg_s:,.0f}" if row.ours_msg_s else "-"
            peer = f"{row.peer_msg_s:,.0f}" if row.peer_msg_s else "-"
            ratio = f"{row.ratio:.2f}x" if row.ratio else "-"
            print(f"{row.size:>5}  {row.ours:<20} {ours:>10}  {row.peer:<22} {peer:>10}  {ratio}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", default=",".join(WORKLOAD_NAMES),
                        help="which workloads to run: throughput, latency and fanout in this order on the suite's"
                             " servers, then footprint and slow_consumer on fresh ones, and floors with no server")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--count", type=int, default=200_000, help="throughput: messages per run")
    parser.add_argument("--sizes", default="100,1024", help="throughput: message sizes")
    parser.add_argument("--peers", default=",".join(WORKLOADS), help="throughput: peer workloads to run")
    parser.add_argument("--broker", action="append", metavar="LABEL=PYTHON",
                        help="throughput, latency, many_producers, footprint, cpu_per_batch: run this venv's broker"
                             " (repeatable: each in turn, a fresh broker per run, an A/B in one run)")
    latency.add_arguments(parser, "latency-")
    fanout.add_arguments(parser, "fanout-")
    many_producers.add_arguments(parser, "many-")
    parser.add_argument("--cpb-seconds", type=float, default=10.0, help="cpu_per_batch: seconds of traffic per run")
    footprint.add_arguments(parser, "footprint-")
    slow_consumer.add_arguments(parser, "slow-")
    floors.add_arguments(parser, "floors-")
    transport_floor.add_arguments(parser, "transport-")
    args = parser.parse_args()
    chosen = split_list(args.workloads)
    for name in set(chosen) - set(WORKLOAD_NAMES):
        parser.error(f"unknown workload {name!r} (choose from {', '.join(WORKLOAD_NAMES)})")
    peer_workloads = split_list(args.peers)
    brokers = parse_brokers(args.broker)
    latency_options, fanout_options = latency.options(args, "latency-"), fanout.options(args, "fanout-")
    many_options = many_producers.options(args, "many-")
    # Latency and fan-out share the suite's servers with throughput; footprint and the
    # slow consumer start fresh ones per run (they measure the servers' memory).
    needed: set[str] = set()
    if "throughput" in chosen:
        needed |= {WORKLOADS[w][0] for w in peer_workloads}
    if "latency" in chosen:
        needed |= {latency.PEERS[p] for p in latency_options["peers"]}
    if "fanout" in chosen:
        needed |= {fanout.PEERS[p] for p in fanout_options["peers"]}
    if "many_producers" in chosen:
        needed |= {many_producers.PEERS[p] for p in many_options["peers"]}
    if {"throughput", "latency", "fanout", "many_producers"} & set(chosen):
        with Servers(needed) as servers:
            for name in chosen:
                if name == "throughput":
                    throughput(servers, args.repeat, args.count, [int(s) for s in split_list(args.sizes)], peer_workloads,
                               brokers)
                elif name == "latency":
                    finish(latency, latency.measure(servers, repeat=args.repeat, size=100, brokers=brokers,
                                                    **latency_options))
                elif name == "fanout":
                    finish(fanout, fanout.measure(servers, repeat=args.repeat, size=100, **fanout_options))
                elif name == "many_producers":
                    finish(many_producers, many_producers.measure(servers, repeat=args.repeat, size=100,
                                                                  brokers=brokers, **many_options))
    # After the shared servers stopped, so that they take no CPU from these measurements.
    for name in chosen:
        if name == "footprint":
            finish(footprint, footprint.measure(repeat=args.repeat, brokers=brokers,
                                                        **footprint.options(args, "footprint-")))
        elif name == "slow_consumer":
            finish(slow_consumer, slow_consumer.measure(repeat=args.repeat, **slow_consumer.options(args, "slow-")))
        elif name == "floors":
            finish(floors, floors.measure(repeat=args.repeat, size=100, **floors.options(args, "floors-")))
        elif name == "transport_floor":
            finish(transport_floor, transport_floor.measure(repeat=args.repeat, size=100,
                                                            **transport_floor.options(args, "transport-")))
        elif name == "cpu_per_batch":
            finish(cpu_per_batch, cpu_per_batch.measure(repeat=args.repeat, brokers=brokers, rate=5000.0,
                                                        seconds=args.cpb_seconds, idle_seconds=3.0, topics=1,
                                                        producers=10))


if __name__ == "__main__":
    main()

"""Many small producers (issue 20): 200 producers over 20 topics at 10,000 msg/s in
all, 100 B, paced, one consumer per topic; ours and NATS core and Redis PUB/SUB through
their Python clients, in one run.

    .venv/bin/python benchmarks/many_producers.py --repeat 3 --seconds 20
    .venv/bin/python benchmarks/many_producers.py --repeat 1 --producers 20 --seconds 10   # issue's 1/20/200
    .venv/bin/python benchmarks/many_producers.py --broker before=/work/a/.venv/bin/python \\
        --broker after=/work/b/.venv/bin/python --peers "" --repeat 3                      # A/B, alternating

Every system gets the same load: `--producers` producers dealt round-robin over
`--producer-processes` processes (one client connection each, on uvloop), producer i
sending to topic i mod `--topics` every producers/rate seconds, offset by i/producers
of that interval so that the whole load is one message every 1/rate s
(loadgen/spread.py); one consumer per topic, all in one consumer process. Every message
carries the bench stamp (loadgen/stamp.py); e2e latency = receive time - stamped send
time, CLOCK_MONOTONIC of one machine.

Reported per run: sent, delivered / sent, e2e p50/p99/max, the BROKER's CPU (psutil
on the server's pid: user + sys over the sending window / wall, % of one core), and
the bench's own processes' CPU (each producer process and the consumer process, % of
one core): a producer process near 100% would make the client the limit and the run
says nothing about the broker.

Ours: `danube bench e2e --producers --producer-processes --topics --rate --duration`
(non-reliable topics, default client settings, shared subscription, one consumer each).
NATS core: nats-py, one connection per process, `publish` per message (buffered by the
client's flusher, as its own pub benchmark does), one subscription per subject with a
callback. Redis PUB/SUB: redis-py's asyncio client with hiredis, `PUBLISH` per message
from each producer task (its pool opens a connection per concurrent command), one
`PubSub` per channel reading `get_message`. With `--broker LABEL=PYTHON` (repeatable)
each named venv's broker runs in turn with this checkout's bench (an A/B in one run).
Every run is appended to benchmarks/results/many_producers.jsonl.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
from harness import Meter, Servers, finish, medians, now_utc, parse_brokers, print_table, servers_for, split_list

from danube_zmq.loadgen.histogram import LatencyHistogram
from danube_zmq.loadgen.spread import CpuSamples, CpuWindow, deal, send_offset_ns
from danube_zmq.loadgen.stamp import Stamper, read_stamp
from danube_zmq.runtime import event_loop

WORKLOAD = "many_producers"
PEERS = {"nats_core": "nats", "redis_pubsub": "redis"}
FIELDS = ("sent", "received", "delivered", "p50_us", "p99_us", "max_us", "broker_cpu_percent",
          "producer_cpu_max_percent", "consumer_cpu_percent")
_IDLE_S = 2.0  # a consumer stops this long after the last message once the producers are done
_READY_TIMEOUT_S = 120.0


def _subject(topic: int) -> str:
    return f"many.{topic}"


# ---------------------------------------------------------------- peers: one producer process


async def _open_nats(url: str) -> tuple[Callable[[int, bytes], Awaitable[None]], Callable[[], Awaitable[None]]]:
    import nats

    nc = await nats.connect(url)

    async def close() -> None:
        await nc.flush()
        await nc.close()
    return (lambda topic, payload: nc.publish(_subject(topic), payload)), close


async def _open_redis(url: str) -> tuple[Callable[[int, bytes], Awaitable[Any]], Callable[[], Awaitable[None]]]:
    import redis.asyncio

    client = redis.asyncio.Redis.from_url(url)
    await client.ping()
    return (lambda topic, payload: client.publish(_subject(topic), payload)), client.aclose


OPEN = {"nats_core": _open_nats, "redis_pubsub": _open_redis}


def _producer_main(peer: str, url: str, indices: list[int], load: dict[str, Any], ready: Any, go: Any,
                   start_ns: Any, out: Any) -> None:
    async def main() -> dict[str, Any]:
        publish, close = await OPEN[peer](url)
        ready.release()
        await asyncio.get_running_loop().run_in_executor(None, go.wait, 600)
        start = int(start_ns.value)
        producers, topics, size = load["producers"], load["topics"], load["size"]
        interval_ns = int(1e9 * producers / load["rate"])
        deadline_ns = start + int(load["seconds"] * 1e9)
        window = CpuWindow(time.process_time(), time.monotonic())
        sent: dict[int, int] = {}

        async def one(index: int) -> None:
            stamper, topic = Stamper(index, size), index % topics
            first_ns = start + send_offset_ns(index, producers, interval_ns)
            sequence = 0
            while True:
                due_ns = first_ns + sequence * interval_ns
                if due_ns >= deadline_ns:
                    break
                delay_ns = due_ns - time.monotonic_ns()
                if delay_ns > 0:
                    await asyncio.sleep(delay_ns / 1e9)
                await publish(topic, stamper.payload(sequence, time.monotonic_ns()))
                sequence += 1
            sent[index] = sequence
        await asyncio.gather(*(one(i) for i in indices))
        await close()
        return {"sent": sent, "cpu_percent": window.percent(time.process_time(), time.monotonic())}
    out.put(event_loop.run(main()))


# ---------------------------------------------------------------- peers: the consumer process


def _consumer_main(peer: str, url: str, topics: int, ready: Any, stop: Any, out: Any) -> None:
    latencies: list[int] = []
    clock = {"last_ns": 0}
    cpu = CpuSamples()  # as our bench's consumer reads it (loadgen/spread.py)

    def got(data: bytes) -> None:
        now = time.monotonic_ns()
        latencies.append(now - read_stamp(data)[2])
        if cpu.due(now):
            cpu.record(time.process_time(), now)
        clock["last_ns"] = now

    async def wait_done() -> None:
        while not (stop.is_set() and time.monotonic_ns() - max(clock["last_ns"], 1) > _IDLE_S * 1e9):
            await asyncio.sleep(0.1)

    async def nats_consumer() -> None:
        import nats

        nc = await nats.connect(url)

        async def on_message(message: Any) -> None:
            got(message.data)
        for topic in range(topics):
            await nc.subscribe(_subject(topic), cb=on_message)
        await nc.flush()
        ready.set()
        await wait_done()
        await nc.close()

    async def redis_consumer() -> None:
        import redis.asyncio

        client = redis.asyncio.Redis.from_url(url)
        pubsubs = [client.pubsub(ignore_subscribe_messages=True) for _ in range(topics)]
        for topic, pubsub in enumerate(pubsubs):
            await pubsub.subscribe(_subject(topic))

        async def read(pubsub: Any) -> None:
            while True:
                message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
                if message is not None and message["type"] == "message":
                    got(message["data"])
        readers = [asyncio.get_running_loop().create_task(read(p)) for p in pubsubs]
        ready.set()
        await wait_done()
        for reader in readers:
            reader.cancel()
        await asyncio.gather(*readers, return_exceptions=True)
        for pubsub in pubsubs:
            await pubsub.aclose()
        await client.aclose()

    event_loop.run(nats_consumer() if peer == "nats_core" else redis_consumer())
    histogram = LatencyHistogram()
    histogram.record_many_ns(np.array(latencies, dtype=np.int64))
    out.put({"received": len(latencies), "latency_us": histogram.summary_us(), "cpu_percent": cpu.percent()})


def run_peer(peer: str, url: str, server_pid: int, *, producers: int, producer_processes: int, topics: int,
             rate: float, seconds: float, size: int) -> dict[str, Any]:
    """One run against a peer server: its consumer process subscribed, the producer
    processes open, one common start; the server's CPU over the sending window."""
    context = mp.get_context("spawn")
    subscribed, stop, consumed = context.Event(), context.Event(), context.Queue()
    consumer = context.Process(target=_consumer_main, args=(peer, url, topics, subscribed, stop, consumed), daemon=True)
    consumer.start()
    ready, go, start_ns, produced = context.Semaphore(0), context.Event(), context.Value("q", 0), context.Queue()
    load = {"producers": producers, "topics": topics, "rate": rate, "seconds": seconds, "size": size}
    children = [context.Process(target=_producer_main, args=(peer, url, share, load, ready, go, start_ns, produced),
                                daemon=True) for share in deal(producers, producer_processes)]
    for child in children:
        child.start()
    try:
        if not subscribed.wait(_READY_TIMEOUT_S) or not all(ready.acquire(True, _READY_TIMEOUT_S) for _ in children):
            raise SystemExit(f"{peer}: the bench processes did not get ready within {_READY_TIMEOUT_S:g} s")
        meter = Meter(server_pid)
        cpu0, wall0 = meter.cpu_s(), time.monotonic()
        start_ns.value = time.monotonic_ns()
        go.set()
        outcomes = [produced.get(timeout=seconds + 600) for _ in children]
        broker_cpu = CpuWindow(cpu0, wall0).percent(meter.cpu_s(), time.monotonic())
        stop.set()
        received = consumed.get(timeout=600)
    finally:
        for process in (*children, consumer):
            process.join(10)
            if process.is_alive():
                process.kill()
    sent = sum(sum(outcome["sent"].values()) for outcome in outcomes)
    return _row(peer, sent, received["received"], received["latency_us"], broker_cpu,
                [outcome["cpu_percent"] for outcome in outcomes], received["cpu_percent"])


# ---------------------------------------------------------------- ours


def run_ours(servers: Servers, *, producers: int, producer_processes: int, topics: int, rate: float, seconds: float,
             size: int) -> dict[str, Any]:
    result = servers.danube.bench(
        "e2e", f"/default/many-{time.monotonic_ns()}", "--producers", str(producers), "--producer-processes",
        str(producer_processes), "--topics", str(topics), "--rate", str(rate), "--duration", str(seconds), "--size",
        str(size))
    clients = result.get("clients") or {}
    return _row("danube_non_reliable", result["sent"], result["received"], result["e2e_latency_us"] or {},
                (result.get("broker") or {}).get("cpu_percent"), clients.get("producer_cpu_percent") or [],
                clients.get("consumer_cpu_percent"))


def _row(workload: str, sent: int, received: int, latency_us: dict[str, Any], broker_cpu: float | None,
         producer_cpus: list[float], consumer_cpu: float | None) -> dict[str, Any]:
    return {"workload": workload, "sent": sent, "received": received,
            "delivered": round(received / sent, 4) if sent else None, "p50_us": latency_us.get("p50"),
            "p99_us": latency_us.get("p99"), "max_us": latency_us.get("max"), "broker_cpu_percent": broker_cpu,
            "producer_cpu_percent": producer_cpus, "producer_cpu_max_percent": max(producer_cpus, default=None),
            "consumer_cpu_percent": consumer_cpu}


# ---------------------------------------------------------------- suite


def measure(servers: Servers | None = None, *, repeat: int, producers: int, producer_processes: int, topics: int,
            rate: float, seconds: float, size: int, peers: list[str],
            brokers: dict[str, str] | None = None) -> list[dict[str, Any]]:
    load = {"producers": producers, "producer_processes": producer_processes, "topics": topics, "rate": rate,
            "seconds": seconds, "size": size}
    runs: list[dict[str, Any]] = []
    stamp = now_utc()
    brokers = brokers or {"this": ""}
    for r in range(repeat):
        for label, python in brokers.items():
            # The suite's shared servers serve one broker; each other label gets its own.
            with servers_for(servers if len(brokers) == 1 else None, [], python or None) as ours:
                row = run_ours(ours, **load)
            row["workload"] += "" if len(brokers) == 1 else f"[{label}]"
            runs.append({**row, "repeat": r, "at": stamp, **load})
            print(runs[-1], file=sys.stderr)
        if peers:
            with servers_for(servers, [PEERS[p] for p in peers]) as live:
                for peer in peers:
                    if PEERS[peer] not in live.peers:
                        continue
                    server = live.peers[PEERS[peer]]
                    row = run_peer(peer, server.url, server.pid, **load)
                    runs.append({**row, "repeat": r, "at": stamp, **load})
                    print(runs[-1], file=sys.stderr)
    return runs


def report(runs: list[dict[str, Any]]) -> None:
    if not runs:
        return
    first = runs[0]
    print_table(f"many producers: {first['producers']} producers in {first['producer_processes']} processes,"
                f" {first['topics']} topics, {first['rate']:,.0f} msg/s, {first['size']} B, {first['seconds']:g} s"
                f" (medians of {max(r['repeat'] for r in runs) + 1} runs; µs, % of one core)",
                [("workload", "workload"), ("sent", "sent"), ("delivered", "delivered"), ("e2e p50", "p50_us"),
                 ("p99", "p99_us"), ("max", "max_us"), ("broker cpu", "broker_cpu_percent"),
                 ("producer proc cpu max", "producer_cpu_max_percent"), ("consumer cpu", "consumer_cpu_percent")],
                medians(runs, "workload", FIELDS))


def add_arguments(parser: argparse.ArgumentParser, prefix: str = "") -> None:
    parser.add_argument(f"--{prefix}producers", type=int, default=200, help="many producers: producers in all")
    parser.add_argument(f"--{prefix}producer-processes", type=int, default=4,
                        help="many producers: processes the producers are dealt over")
    parser.add_argument(f"--{prefix}topics", type=int, default=20, help="many producers: topics (one consumer each)")
    parser.add_argument(f"--{prefix}rate", type=float, default=10_000.0, help="many producers: msg/s in all")
    parser.add_argument(f"--{prefix}seconds", type=float, default=20.0, help="many producers: seconds of traffic")
    parser.add_argument(f"--{prefix}peers", default=",".join(PEERS), help="many producers: peer workloads")


def options(args: argparse.Namespace, prefix: str = "") -> dict[str, Any]:
    get = vars(args)
    key = prefix.replace("-", "_")
    producers = get[f"{key}producers"]
    return {"producers": producers, "producer_processes": min(get[f"{key}producer_processes"], producers),
            "topics": get[f"{key}topics"], "rate": get[f"{key}rate"], "seconds": get[f"{key}seconds"],
            "peers": split_list(get[f"{key}peers"])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--broker", action="append", metavar="LABEL=PYTHON",
                        help="run this venv's broker (repeatable: each in turn, an A/B in one run)")
    add_arguments(parser)
    args = parser.parse_args()
    brokers = parse_brokers(args.broker)
    finish(sys.modules[__name__], measure(repeat=args.repeat, size=args.size, brokers=brokers, **options(args)))


if __name__ == "__main__":
    main()

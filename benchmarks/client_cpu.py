"""What our client costs its own process per message, beside nats-py (issue 39's lean
client): the CPU of the producer process and of the consumer process, in µs per
message, in one run, systems alternated.

    .venv/bin/pip install -e '.[peers,bench]'
    .venv/bin/python benchmarks/client_cpu.py --repeat 3
    .venv/bin/python benchmarks/client_cpu.py --repeat 1 --seconds 2 --count 20000   # a smoke run
    .venv/bin/python benchmarks/client_cpu.py --client before=/work/before/.venv/bin/python \
        --client after=.venv/bin/python --peers ""                                   # an A/B of our client

Two workloads, 100 B messages, one producer process and one consumer process each:

- `paced`: one message at a time at `--rate` msg/s (5,000) for `--seconds`: the
  producer waits for each message's time (`asyncio.sleep`), then sends it alone, so
  every message is its own turn of the loop (the case a "low-latency" user meets first).
- `bulk`: `--count` messages as fast as the client takes them, yielding to the loop
  every 100 (a producer with work queued).

Ours: `Producer.send_nowait` per message on a non-reliable topic (no future awaited;
a final `flush`), consumer `batch_receive` then `ack` of the batch. NATS core:
nats-py's `publish` per message (its flusher task writes), a subscription callback.
`pace_only` is the paced loop with no client at all: the floor under both.

With `--client LABEL=PYTHON` (repeatable) our producer and consumer run on each named
venv's interpreter in turn (its client, this checkout's broker), rows `danube_<mode>[LABEL]`.
Every producer and consumer is a process of its own (`--role`), started fresh per run.

The figure is the process's CPU time (`time.process_time`: user + system of every
thread) from just before the first send to the last receipt (producer) or from the
first message to the last (consumer), divided by the messages; connecting is outside
the window. Medians of `--repeat` runs; runs appended to
benchmarks/results/client_cpu.jsonl.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from danube_zmq.runtime import event_loop

WORKLOAD = "client_cpu"
FIELDS = ("producer_us_per_msg", "consumer_us_per_msg", "sent", "received")
_IDLE_S = 3.0  # a consumer stops this long after its last message
_YIELD_EVERY = 100  # bulk: messages sent between two turns of the loop


def _pace(start_ns: int, index: int, rate: float) -> float:
    return max(start_ns + int(index * 1e9 / rate) - time.monotonic_ns(), 0) / 1e9


async def _turn(mode: str, start_ns: int, index: int, rate: float) -> None:
    """Before message `index`: paced, wait for its time; bulk, yield every
    `_YIELD_EVERY` messages."""
    if mode == "paced":
        await asyncio.sleep(_pace(start_ns, index, rate))
    elif index % _YIELD_EVERY == 0:
        await asyncio.sleep(0)


# ---------------------------------------------------------------- ours


def danube_producer(ready: Any, url: str, topic: str, mode: str, count: int, rate: float) -> dict[str, Any]:
    from danube_zmq import DanubeClient
    from danube_zmq.client.errors import ProducerQueueFull

    async def run() -> dict[str, Any]:
        payload = b"x" * 100
        async with DanubeClient(url) as client:
            producer = await client.create_producer(topic)
            await asyncio.get_running_loop().run_in_executor(None, ready.wait)
            cpu = time.process_time()
            start = time.monotonic_ns()
            last = None
            for i in range(count):
                await _turn(mode, start, i, rate)
                while True:
                    try:
                        last = producer.send_nowait(payload)
                        break
                    except ProducerQueueFull:
                        assert last is not None
                        await last
            await producer.flush()
            used = time.process_time() - cpu
            await producer.close()
        return {"sent": count, "producer_us_per_msg": used * 1e6 / count}
    return event_loop.run(run())


def danube_consumer(ready: Any, url: str, topic: str, mode: str, count: int, rate: float) -> dict[str, Any]:
    from danube_zmq import DanubeClient
    from danube_zmq.transport.errors import Timeout

    async def run() -> dict[str, Any]:
        async with DanubeClient(url) as client:
            consumer = await client.subscribe(topic, "cpu")
            ready.set()
            received, cpu, last = 0, None, 0.0
            while received < count:
                try:
                    batch = await consumer.batch_receive(1000, timeout=_IDLE_S if received else 60)
                except Timeout:
                    break
                if cpu is None:
                    cpu = time.process_time()
                received += len(batch)
                await consumer.ack(batch)
                last = time.process_time()
            used = last - cpu if cpu is not None else 0.0
        return {"received": received, "consumer_us_per_msg": used * 1e6 / max(received, 1)}
    return event_loop.run(run())


# ---------------------------------------------------------------- NATS core


def nats_producer(ready: Any, url: str, subject: str, mode: str, count: int, rate: float) -> dict[str, Any]:
    import nats

    async def run() -> dict[str, Any]:
        payload = b"x" * 100
        nc = await nats.connect(url)
        await asyncio.get_running_loop().run_in_executor(None, ready.wait)
        cpu = time.process_time()
        start = time.monotonic_ns()
        for i in range(count):
            await _turn(mode, start, i, rate)
            await nc.publish(subject, payload)
        await nc.flush()
        used = time.process_time() - cpu
        await nc.close()
        return {"sent": count, "producer_us_per_msg": used * 1e6 / count}
    return event_loop.run(run())


def nats_consumer(ready: Any, url: str, subject: str, mode: str, count: int, rate: float) -> dict[str, Any]:
    import nats

    async def run() -> dict[str, Any]:
        nc = await nats.connect(url, pending_size=1 << 30)
        state: dict[str, Any] = {"received": 0, "cpu": None, "last": None, "at": time.monotonic()}
        done = asyncio.Event()

        async def on_message(message: Any) -> None:
            if state["cpu"] is None:
                state["cpu"] = time.process_time()
            state["received"] += 1
            state["at"] = time.monotonic()
            if state["received"] >= count:
                state["last"] = time.process_time()
                done.set()
        await nc.subscribe(subject, cb=on_message, pending_msgs_limit=count + 1)
        await nc.flush()
        ready.set()
        while not done.is_set():
            try:
                await asyncio.wait_for(done.wait(), 0.5)
            except TimeoutError:
                if state["received"] and time.monotonic() - state["at"] > _IDLE_S:
                    state["last"] = time.process_time()
                    break
        await nc.close()
        cpu = state["cpu"]
        used = (state["last"] - cpu) if cpu is not None else 0.0
        return {"received": state["received"], "consumer_us_per_msg": used * 1e6 / max(state["received"], 1)}
    return event_loop.run(run())


# ---------------------------------------------------------------- the floor


def pace_only(count: int, rate: float) -> dict[str, Any]:
    async def run() -> dict[str, Any]:
        cpu = time.process_time()
        start = time.monotonic_ns()
        for i in range(count):
            await asyncio.sleep(_pace(start, i, rate))
        return {"sent": count, "producer_us_per_msg": (time.process_time() - cpu) * 1e6 / count}
    return event_loop.run(run())


# ---------------------------------------------------------------- one process per side

ROLES = {"danube_producer": danube_producer, "danube_consumer": danube_consumer,
         "nats_producer": nats_producer, "nats_consumer": nats_consumer}


class _Stdio:
    """The role's side of the handshake: the consumer says "ready" on stdout once
    subscribed; the producer waits for a line on stdin before its first send."""

    def set(self) -> None:
        print("ready", flush=True)

    def wait(self) -> None:
        sys.stdin.readline()


def _role(python: str, role: str, *args: Any) -> subprocess.Popen[str]:
    return subprocess.Popen([python, __file__, "--role", role, *map(str, args)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, cwd="/")


def _result(process: subprocess.Popen[str]) -> dict[str, Any]:
    out, _ = process.communicate(timeout=600)
    if process.returncode != 0:
        raise SystemExit(f"a benchmark process failed ({process.args})")
    return json.loads(out.strip().splitlines()[-1])


def run_pair(python: str, system: str, *args: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    consumer = _role(python, f"{system}_consumer", *args)
    producer = _role(python, f"{system}_producer", *args)
    try:
        assert consumer.stdout is not None and producer.stdin is not None
        if consumer.stdout.readline().strip() != "ready":
            raise SystemExit(f"{system} consumer did not subscribe")
        producer.stdin.write("go\n")
        producer.stdin.flush()
        return _result(producer), _result(consumer)
    finally:
        for process in (producer, consumer):
            if process.poll() is None:
                process.kill()


# ---------------------------------------------------------------- runs


def measure(*, repeat: int, seconds: float, rate: float, count: int, modes: list[str], peers: list[str],
            clients: dict[str, str]) -> list[dict[str, Any]]:
    from harness import Servers, now_utc

    runs: list[dict[str, Any]] = []
    with Servers(peers) as servers:
        nats_url = servers.peers["nats"].url if "nats" in servers.peers else None
        for n in range(1, repeat + 1):
            for mode in modes:
                messages = int(rate * seconds) if mode == "paced" else count
                systems = [(f"danube_{mode}" + (f"[{label}]" if len(clients) > 1 else ""), "danube", python,
                            servers.danube.url) for label, python in clients.items()]
                if nats_url is not None:
                    systems.append((f"nats_core_{mode}", "nats", sys.executable, nats_url))
                if n % 2 == 0:
                    systems.reverse()  # alternate who goes first
                for name, system, python, url in systems:
                    target = f"/default/cpu-{mode}-{n}-{time.monotonic_ns()}" if system == "danube" \
                        else f"cpu.{mode}.{n}"
                    produced, consumed = run_pair(python, system, url, target, mode, messages, rate)
                    runs.append({"workload": name, "repeat": n, "at": now_utc(), "rate": rate, **produced,
                                 **consumed})
                    print(f"  {name} #{n}: producer {produced['producer_us_per_msg']:.1f} µs/msg,"
                          f" consumer {consumed['consumer_us_per_msg']:.1f} µs/msg,"
                          f" {consumed['received']}/{produced['sent']} received", flush=True)
                if mode == "paced":
                    runs.append({"workload": "pace_only_paced", "repeat": n, "at": now_utc(), "rate": rate,
                                 **pace_only(messages, rate)})
    return runs


def report(runs: list[dict[str, Any]]) -> None:
    from harness import medians, print_table

    print_table("Client CPU per message (µs, medians; the process's user + system time)",
                [("workload", "workload"), ("runs", "runs"), ("producer", "producer_us_per_msg"),
                 ("consumer", "consumer_us_per_msg"), ("sent", "sent"), ("received", "received")],
                medians(runs, "workload", FIELDS))


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--role":
        role, url, target, mode, count, rate = sys.argv[2:8]
        print(json.dumps(ROLES[role](_Stdio(), url, target, mode, int(count), float(rate))), flush=True)
        return
    from harness import finish

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=10.0, help="paced: seconds of sending")
    parser.add_argument("--rate", type=float, default=5000.0, help="paced: messages per second")
    parser.add_argument("--count", type=int, default=200_000, help="bulk: messages")
    parser.add_argument("--modes", default="paced,bulk", help="paced, bulk or both (comma-separated)")
    parser.add_argument("--peers", default="nats", help="peers beside ours: nats, or \"\" for none")
    parser.add_argument("--client", action="append", metavar="LABEL=PYTHON",
                        help="our client from this venv's interpreter (repeatable: an A/B in one run)")
    args = parser.parse_args()
    clients = {label: os.path.abspath(python) for label, python in
               (entry.split("=", 1) for entry in args.client or [])} or {"this": sys.executable}
    finish(sys.modules[__name__], measure(
        repeat=args.repeat, seconds=args.seconds, rate=args.rate, count=args.count,
        modes=[m for m in args.modes.split(",") if m], peers=[p for p in args.peers.split(",") if p],
        clients=clients))


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    main()

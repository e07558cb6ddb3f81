"""What the transport alone costs per message, libzmq against plain asyncio TCP: the
shape of our non-reliable path (producer -> broker -> consumer, a receipt back to the
producer) with no broker logic, in three processes on uvloop, as ours run.

    .venv/bin/python benchmarks/transport_floor.py --repeat 3 --seconds 5
    .venv/bin/python benchmarks/transport_floor.py --repeat 1 --seconds 1       # smoke run

- zmq: DEALER -> ROUTER -> DEALER over tcp:// loopback, each socket's ZMQ_FD watched by
  the loop (`add_reader`) and read with non-blocking `recv` until ZMQ_EVENTS has no
  POLLIN, as client/connection.py and the gateway do; libzmq's I/O thread in each
  process does the socket work.
- tcp: asyncio `Protocol`s on plain TCP, 4-byte length before each frame: the loop's
  own thread writes and reads the socket, as nats-py does.
- nats: NATS core itself, for scale: nats-py `publish` per message (its flusher task
  writes; no receipt), nats-server as the relay (its process CPU, psutil), a callback
  subscriber.

The producer sends message i at start + i / rate (`asyncio.sleep`), each alone; the
relay answers each with a 9-byte receipt and passes it to the consumer. Reported:
e2e latency (the stamp of loadgen/stamp.py), and each process's CPU (user + system of
all its threads, `time.process_time`) per message over the sending window, split for
zmq into the loop's thread and libzmq's I/O thread (`/proc/self/task`). Medians of
`--repeat` runs; runs appended to benchmarks/results/transport_floor.jsonl.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import socket
import struct
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import zmq
from e2e import free_port
from harness import Meter, medians, now_utc, print_table, run_alone
from peer_servers import PeerServers, ensure_installed

from danube_zmq.loadgen.histogram import LatencyHistogram
from danube_zmq.loadgen.stamp import Stamper, read_stamp
from danube_zmq.runtime import event_loop

WORKLOAD = "transport_floor"
FIELDS = ("p50_us", "p99_us", "producer_us", "producer_io_us", "relay_us", "relay_io_us", "consumer_us",
          "consumer_io_us", "received")
KINDS = ("zmq", "tcp", "nats")
_LENGTH = struct.Struct(">I")
_RECEIPT = struct.Struct(">BQ")
_EVENTS, _POLLIN, _NOBLOCK = int(zmq.EVENTS), int(zmq.POLLIN), int(zmq.NOBLOCK)


class _Cpu:
    """This process's CPU from `start` to `stop`: all threads, and libzmq's I/O threads."""

    def start(self) -> None:
        self._total, self._io = time.process_time(), _io_thread_seconds()

    def stop(self, count: int) -> dict[str, float]:
        total, io = time.process_time() - self._total, _io_thread_seconds() - self._io
        return {"us": round(total * 1e6 / max(count, 1), 1), "io_us": round(io * 1e6 / max(count, 1), 1)}


def _io_thread_seconds() -> float:
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/comm") as comm:
                if not comm.read().startswith("ZMQbg/IO"):
                    continue
            with open(f"/proc/self/task/{task}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / ticks  # utime, stime
    return total


class _Framer(asyncio.Protocol):
    """Length-prefixed frames on a TCP stream, each handed to `on_frame`."""

    def __init__(self) -> None:
        self.buffer = bytearray()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is no asyncio.Transport subclass
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        buffer = self.buffer
        buffer += data
        start = 0
        while len(buffer) - start >= 4:
            (size,) = _LENGTH.unpack_from(buffer, start)
            if len(buffer) - start - 4 < size:
                break
            self.on_frame(bytes(buffer[start + 4:start + 4 + size]))
            start += 4 + size
        del buffer[:start]

    def send(self, frame: bytes) -> None:
        assert self.transport is not None
        self.transport.write(_LENGTH.pack(len(frame)) + frame)

    def on_frame(self, frame: bytes) -> None:
        raise NotImplementedError


def _dealer(loop: asyncio.AbstractEventLoop, url: str,
            on_frame: Callable[[bytes], None]) -> tuple[zmq.Context[Any], zmq.Socket[Any], Callable[[], None]]:
    """A DEALER connected to `url` whose frames go to `on_frame`, read when the loop sees
    its ZMQ_FD (edge-triggered: read until ZMQ_EVENTS has no POLLIN); and that drain."""
    context = zmq.Context()
    dealer = context.socket(zmq.DEALER)
    dealer.connect(url)

    def drain() -> None:
        while dealer.getsockopt(_EVENTS) & _POLLIN:
            on_frame(dealer.recv(_NOBLOCK))

    loop.add_reader(dealer.FD, drain)
    return context, dealer, drain


# ---------------------------------------------------------------- relay


def _relay(kind: str, port: int, count: int, ready: Any, results: Any) -> None:
    async def run_zmq() -> dict[str, float]:
        context = zmq.Context()
        router = context.socket(zmq.ROUTER)
        router.bind(f"tcp://127.0.0.1:{port}")
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        cpu = _Cpu()
        state = {"consumer": None, "relayed": 0}

        def drain() -> None:
            while router.getsockopt(_EVENTS) & _POLLIN:
                identity, body = router.recv(_NOBLOCK), router.recv()
                if body == b"hello":
                    state["consumer"] = identity
                    continue
                if state["relayed"] == 0:
                    cpu.start()
                router.send(identity, zmq.SNDMORE)
                router.send(_RECEIPT.pack(1, state["relayed"]))
                router.send(state["consumer"], zmq.SNDMORE)
                router.send(body)
                state["relayed"] += 1
                if state["relayed"] == count and not done.done():
                    done.set_result(cpu.stop(count))

        loop.add_reader(router.FD, drain)
        ready.set()
        drain()
        result = await done
        loop.remove_reader(router.FD)
        await asyncio.sleep(0.5)  # the last frames leave
        router.close(linger=1000)
        context.term()
        return result

    async def run_tcp() -> dict[str, float]:
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        cpu = _Cpu()
        state: dict[str, Any] = {"consumer": None, "relayed": 0}

        class Side(_Framer):
            def on_frame(self, frame: bytes) -> None:
                if frame == b"hello":
                    state["consumer"] = self
                    return
                if state["relayed"] == 0:
                    cpu.start()
                self.send(_RECEIPT.pack(1, state["relayed"]))
                state["consumer"].send(frame)
                state["relayed"] += 1
                if state["relayed"] == count and not done.done():
                    done.set_result(cpu.stop(count))

        server = await loop.create_server(Side, "127.0.0.1", port)
        ready.set()
        result = await done
        await asyncio.sleep(0.5)
        server.close()
        return result

    results.put(("relay", event_loop.run(run_zmq() if kind == "zmq" else run_tcp())))


# ---------------------------------------------------------------- consumer


def _consumer(kind: str, url: str, count: int, ready: Any, results: Any) -> None:
    async def run() -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        cpu = _Cpu()
        latencies: list[int] = []

        def on_payload(payload: bytes) -> None:
            if not latencies:
                cpu.start()
            latencies.append(time.monotonic_ns() - read_stamp(payload)[2])
            if len(latencies) == count and not done.done():
                done.set_result(cpu.stop(count))

        if kind == "nats":
            import nats

            async def on_message(message: Any) -> None:
                on_payload(message.data)

            connection = await nats.connect(url, pending_size=1 << 30)
            await connection.subscribe("floor", cb=on_message, pending_msgs_limit=count + 1)
            await connection.flush()
        elif kind == "zmq":
            context, dealer, drain = _dealer(loop, url, on_payload)
            dealer.send(b"hello")
            drain()
        else:
            class Side(_Framer):
                def on_frame(self, frame: bytes) -> None:
                    on_payload(frame)

            _, side = await loop.create_connection(Side, "127.0.0.1", int(url.rsplit(":", 1)[1]))
            side.send(b"hello")
        ready.set()
        try:
            used = await asyncio.wait_for(done, timeout=60 + count / 1000)
        except TimeoutError:
            used = {"us": None, "io_us": None}
        if kind == "nats":
            await connection.close()
        elif kind == "zmq":
            loop.remove_reader(dealer.FD)
            dealer.close(linger=0)
            context.term()
        return {**used, "latencies": latencies}

    results.put(("consumer", event_loop.run(run())))


# ---------------------------------------------------------------- producer


async def _produce(kind: str, url: str, count: int, rate: float, size: int) -> dict[str, float]:
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    receipts = [0]
    cpu = _Cpu()

    def on_receipt() -> None:
        receipts[0] += 1
        if receipts[0] == count and not done.done():
            done.set_result(cpu.stop(count))

    if kind == "nats":
        import nats

        connection = await nats.connect(url)

        def send(frame: bytes) -> None:
            # nats-py's publish only appends to its pending buffer (no I/O awaited): the
            # coroutine is run to its end here, as `await` would.
            step = connection.publish("floor", frame)
            try:
                step.send(None)
            except StopIteration:
                on_receipt()  # NATS core has no receipt: a publish is done when buffered
    elif kind == "zmq":
        context, dealer, drain = _dealer(loop, url, lambda _: on_receipt())

        def send(frame: bytes) -> None:
            dealer.send(frame, _NOBLOCK)
            if dealer.getsockopt(_EVENTS) & _POLLIN:  # a send resets the edge-triggered FD
                drain()
    else:
        class Side(_Framer):
            def on_frame(self, frame: bytes) -> None:
                on_receipt()

        _, side = await loop.create_connection(Side, "127.0.0.1", int(url.rsplit(":", 1)[1]))
        send = side.send
    await asyncio.sleep(0.5)  # connected before the clock starts
    stamper = Stamper(0, size)
    cpu.start()
    start_ns = time.monotonic_ns()
    for index in range(count):
        await asyncio.sleep(max(start_ns + int(index * 1e9 / rate) - time.monotonic_ns(), 0) / 1e9)
        send(stamper.payload(index, time.monotonic_ns()))
    try:
        used = await asyncio.wait_for(done, timeout=60)
    except TimeoutError:
        used = {"us": None, "io_us": None}
    if kind == "nats":
        await connection.flush()
        used = cpu.stop(count)  # its flusher's writes included
        await connection.close()
    elif kind == "zmq":
        loop.remove_reader(dealer.FD)
        dealer.close(linger=0)
        context.term()
    return used


def run_once(kind: str, *, rate: float, seconds: float, size: int, nats: Any = None) -> dict[str, Any]:
    """One run of `kind`; `nats`: the suite's nats-server (harness `Peer`) for kind nats."""
    count = max(int(rate * seconds), 1)
    spawn = mp.get_context("spawn")
    relay_ready, consumer_ready, results = spawn.Event(), spawn.Event(), spawn.Queue()
    children = []
    if kind == "nats":
        url, meter = nats.url, Meter(nats.pid)
    else:
        port = free_port()
        url = f"tcp://127.0.0.1:{port}"
        children.append(spawn.Process(target=_relay, args=(kind, port, count, relay_ready, results), daemon=True))
        children[0].start()
        relay_ready.wait(30)
    children.append(spawn.Process(target=_consumer, args=(kind, url, count, consumer_ready, results), daemon=True))
    children[-1].start()
    try:
        consumer_ready.wait(30)
        server_cpu = meter.cpu_s() if kind == "nats" else 0.0
        produced = event_loop.run(_produce(kind, url, count, rate, size))
        got = dict(results.get(timeout=120) for _ in range(len(children)))
        if kind == "nats":
            # From before the first publish to after the last delivery: the window of
            # the others, give or take the producer's half second of settling.
            got["relay"] = {"us": round((meter.cpu_s() - server_cpu) * 1e6 / count, 1), "io_us": None}
    finally:
        for process in children:
            process.join(10)
            if process.is_alive():
                process.kill()
    latencies = got["consumer"].pop("latencies")
    histogram = LatencyHistogram()
    histogram.record_many_ns(np.array(latencies, dtype=np.int64))
    summary = histogram.summary_us()
    return {"p50_us": summary["p50"], "p99_us": summary["p99"], "received": len(latencies), "sent": count,
            "producer_us": produced["us"], "producer_io_us": produced["io_us"],
            "relay_us": got["relay"]["us"], "relay_io_us": got["relay"]["io_us"],
            "consumer_us": got["consumer"]["us"], "consumer_io_us": got["consumer"]["io_us"]}


def measure(*, repeat: int, size: int, rate: float, seconds: float) -> list[dict[str, Any]]:
    runs: list[dict[str, Any]] = []
    stamp = now_utc()
    peers = PeerServers(Path(tempfile.mkdtemp(prefix="danube-floor-")))
    try:
        if "nats" not in ensure_installed():
            peers.start(["nats"])
        nats = peers.peers.get("nats")
        if nats is None:
            print("skip: nats-server could not be installed or started (scripts/install-peers.sh)", file=sys.stderr)
        kinds = [kind for kind in KINDS if kind != "nats" or nats is not None]
        for r in range(repeat):
            for kind in kinds:  # alternated, so a machine that changes pace loads all alike
                print(f"transport floor run {r + 1}/{repeat}: {kind}", file=sys.stderr)
                runs.append({"workload": kind, "run": r, "at": stamp, "size": size, "rate": rate,
                             **run_once(kind, rate=rate, seconds=seconds, size=size, nats=nats)})
    finally:
        peers.stop()
    return runs


def report(runs: list[dict[str, Any]]) -> None:
    repeat = len({run["run"] for run in runs})
    columns = [("transport", "workload"), ("runs", "runs"), ("e2e p50 µs", "p50_us"), ("e2e p99 µs", "p99_us"),
               ("producer µs/msg", "producer_us"), ("(I/O thread)", "producer_io_us"), ("relay µs/msg", "relay_us"),
               ("(I/O thread)", "relay_io_us"), ("consumer µs/msg", "consumer_us"),
               ("(I/O thread)", "consumer_io_us"), ("received", "received")]
    print_table(f"The transport alone, 3 processes on uvloop (medians of {repeat} runs)", columns,
                medians(runs, "workload", FIELDS))


def add_arguments(parser: argparse.ArgumentParser, prefix: str = "") -> None:
    parser.add_argument(f"--{prefix}rate", type=float, default=5000.0, help="transport_floor: messages per second")
    parser.add_argument(f"--{prefix}seconds", type=float, default=5.0, help="transport_floor: seconds per run")


def options(args: argparse.Namespace, prefix: str = "") -> dict[str, Any]:
    get = vars(args)
    key = prefix.replace("-", "_")
    return {"rate": get[f"{key}rate"], "seconds": get[f"{key}seconds"]}


if __name__ == "__main__":
    run_alone(sys.modules[__name__], sized=True)

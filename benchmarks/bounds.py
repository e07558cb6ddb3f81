"""Every buffer is bounded in bytes (issue 19, section 4): four hostile loads, each
against its own fresh broker, while a well-behaved client keeps producing.

    .venv/bin/python benchmarks/bounds.py                      # 60 s per load
    .venv/bin/python benchmarks/bounds.py --seconds 10 --loads a,d

Loads (hand-built where the danube client never misbehaves so):
  a  consumers that grant 2**30 permits and never read their socket (a new one every
     second, at most 20 at once, on 20 subscriptions), fed 1 MiB messages on a
     non-reliable topic flat out;
  b  raw ZMTP 3.0 over a plain TCP socket (greeting and NULL READY written by hand):
     one connection sending 1 MiB parts with the MORE flag forever, one sending
     messages of 1,000 parts of 1 MiB; a cut connection is opened again (each is
     cut at inbound_bytes_per_connection_max: the reconnect counts say how often);
  c  as many TCP connections as RLIMIT_NOFILE allows (at most 20,000; the script
     raises its soft limit to the hard one, the broker inherits it) that finish the
     ZMTP handshake and never send `Connect`; cut ones are opened again;
  d  a reliable topic whose subscription never acks, a producer at full speed (16 KiB
     messages, 64 in flight), refusals counted and sent again.

Throughout each load, the broker's RSS (psutil) is sampled every 0.5 s (start, max,
final reported; its child processes', the inbound watcher, apart), and a probe
client in its own process sends one 100-byte message to a reliable topic every 10 ms
and awaits its ack: p50/p99/max latency and errors.
The broker configuration is `CONFIG` below (environment variables), printed with the
table; every run is appended to benchmarks/results/bounds.jsonl.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing as mp
import os
import re
import resource
import select
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import msgpack
import psutil

MIB = 1 << 20
SAMPLE_S = 0.5
PROBE_INTERVAL_S = 0.010
RESULTS = Path(__file__).resolve().parent / "results"

# The stated broker configuration (everything else is the default).
CONFIG = {
    "DANUBE_LIMITS__OUTBOUND_BYTES_PER_CONNECTION_MAX": str(32 * MIB),
    "DANUBE_LIMITS__OUTBOUND_BYTES_MAX": str(128 * MIB),
    "DANUBE_LIMITS__OUTBOUND_STALL_TIMEOUT_MS": "30000",
    "DANUBE_LIMITS__FRAME_BYTES_MAX": str(16 * MIB),
    "DANUBE_LIMITS__INBOUND_BYTES_PER_CONNECTION_MAX": str(64 * MIB),
    "DANUBE_LIMITS__CONNECTIONS_PENDING_MAX": "1000",
    "DANUBE_LIMITS__CONNECT_TIMEOUT_MS": "10000",
    "DANUBE_DISPATCH__PENDING_BYTES_MAX": str(16 * MIB),
    "DANUBE_STORAGE__CACHE_BYTES_MAX": str(16 * MIB),
    "DANUBE_POLICIES__BACKLOG_QUOTA_BYTES_MAX": str(256 * MIB),
    "DANUBE_POLICIES__BACKLOG_QUOTA_POLICY": "producer_exception",
}

CONNECT, CONNECTED, SUBSCRIBE, SUBSCRIBED, FLOW = 1, 2, 25, 26, 27
PROTOCOL_VERSION, EXCLUSIVE, LATEST = 1, 0, 0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# ---------------------------------------------------------------- the broker


class Broker:
    def __init__(self, work_dir: Path) -> None:
        self.work_dir = work_dir
        self.port = free_port()
        self.url = f"tcp://127.0.0.1:{self.port}"
        self.admin_url = f"tcp://127.0.0.1:{free_port()}"
        self.process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Broker:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        with open(self.work_dir / "broker.log", "wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "danube_zmq.cli.main", "broker", "start", "--listen", self.url,
                 "--admin-listen", self.admin_url, "--metrics-port", "0", "--data-dir", str(self.work_dir / "data")],
                stdout=log, stderr=subprocess.STDOUT,
                env={**os.environ, **CONFIG, "COLUMNS": "400"})  # log lines unwrapped: `_held_at_cuts` reads them
        asyncio.run(self._ready())
        return self

    async def _ready(self) -> None:
        from danube_zmq.client.admin import AdminClient

        deadline = time.monotonic() + 60
        while True:
            try:
                async with AdminClient(self.admin_url, timeout_ms=1000) as admin:
                    await admin.list_brokers()
                return
            except Exception:
                if time.monotonic() > deadline or (self.process and self.process.poll() is not None):
                    raise SystemExit(f"broker did not start; see {self.work_dir / 'broker.log'}") from None
                await asyncio.sleep(0.2)

    def __exit__(self, *_: object) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)


# ---------------------------------------------------------------- the probe


def probe_main(url: str, ready: Any, stop: Any, out: Any) -> None:
    from danube_zmq import DanubeClient

    async def run() -> dict[str, Any]:
        latencies: list[float] = []
        errors: dict[str, int] = {}
        async with DanubeClient(url, client_name="probe", operation_retries_max=0) as client:
            producer = await client.create_producer("/default/probe", dispatch="reliable")
            await producer.send(b"warm-up")
            ready.set()
            next_at = time.monotonic()
            while not stop.is_set():
                start = time.monotonic()
                try:
                    await asyncio.wait_for(producer.send(b"p" * 100), 10)
                    latencies.append((time.monotonic() - start) * 1000)
                except Exception as exc:  # counted and reported: the probe must go on
                    errors[type(exc).__name__] = errors.get(type(exc).__name__, 0) + 1
                next_at += PROBE_INTERVAL_S
                await asyncio.sleep(max(0.0, next_at - time.monotonic()))
        latencies.sort()
        pick = (lambda q: round(latencies[min(len(latencies) - 1, int(q * len(latencies)))], 2)) if latencies \
            else (lambda q: None)
        return {"probe_sends": len(latencies), "probe_p50_ms": pick(0.50), "probe_p99_ms": pick(0.99),
                "probe_max_ms": round(latencies[-1], 2) if latencies else None, "probe_errors": errors}

    out.put(asyncio.run(run()))


# ---------------------------------------------------------------- the loads


def _pack(*items: Any) -> bytes:
    return msgpack.packb(list(items), use_bin_type=True)


def load_a(url: str, stop: Any, out: Any) -> None:
    """Stuck consumers (2**30 permits, never read) and a producer of 1 MiB messages."""
    import zmq

    from danube_zmq import DanubeClient

    topic = "/default/stuck"
    ctx = zmq.Context()
    stuck: list[zmq.Socket] = []

    def add_stuck(index: int) -> None:
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RCVTIMEO, 10_000)
        sock.setsockopt(zmq.RCVHWM, 1)
        sock.setsockopt(zmq.RCVBUF, 4096)
        sock.setsockopt(zmq.ROUTING_ID, b"\x01" + os.urandom(15))
        sock.connect(url)
        sock.send(_pack(CONNECT, 1, PROTOCOL_VERSION, f"stuck{index}"))
        msgpack.unpackb(sock.recv(), raw=False)
        # 20 subscriptions reused: a subscription outlives its consumer and keeps up to
        # pending_bytes_max, so new names would measure the subscription count instead.
        name = f"stuck{index % 20}"
        sock.send(_pack(SUBSCRIBE, 2, topic, name, f"stuck{index}", EXCLUSIVE, LATEST))
        reply = msgpack.unpackb(sock.recv(), raw=False)
        if reply[0] == SUBSCRIBED:
            sock.send(_pack(FLOW, reply[2], 1 << 30))
        stuck.append(sock)
        if len(stuck) > 20:
            stuck.pop(0).close(linger=0)

    async def run() -> dict[str, Any]:
        sent = 0
        async with DanubeClient(url, client_name="feeder") as client:
            producer = await client.create_producer(topic)
            await producer.send(b"warm-up")
            payload = os.urandom(MIB)
            next_stuck = 0.0
            index = 0
            while not stop.is_set():
                if time.monotonic() >= next_stuck:
                    await asyncio.to_thread(add_stuck, index)
                    index += 1
                    next_stuck = time.monotonic() + 1.0
                for _ in range(4):
                    producer.send_nowait(payload)
                await producer.flush()
                sent += 4
        return {"load": f"{sent} MiB published, {index} stuck consumers"}

    try:
        out.put(asyncio.run(run()))
    finally:
        for sock in stuck:
            sock.close(linger=0)
        ctx.term()


def _zmtp_connect(port: int) -> socket.socket:
    """A plain TCP socket that has said ZMTP 3.0 hello as a DEALER with the NULL mechanism."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    greeting = b"\xff" + b"\x00" * 8 + b"\x7f" + bytes([3, 0]) + b"NULL".ljust(20, b"\x00") + b"\x00" + b"\x00" * 31
    sock.sendall(greeting)
    name, value = b"Socket-Type", b"DEALER"
    body = b"\x05READY" + bytes([len(name)]) + name + struct.pack(">I", len(value)) + value
    sock.sendall(bytes([0x04, len(body)]) + body)
    return sock


def _part(size: int, more: bool) -> bytes:
    return bytes([0x02 | (0x01 if more else 0)]) + struct.pack(">Q", size)


def _hung_up(sock: socket.socket) -> bool:
    """Whether the broker has shut the connection down (EOF), reading what it sent.
    A cut peer blocked in a send would otherwise wait forever: the broker's shutdown
    leaves it no room, and it is not reset until it reads."""
    while select.select([sock], [], [], 0)[0]:
        try:
            if not sock.recv(65536):
                return True
        except OSError:
            return True
    return False


def load_b(port: int, stop: Any, out: Any) -> None:
    """Endless MORE parts on one connection, 1,000-part messages on another."""
    part = b"m" * MIB
    counts = {"endless_mib": 0, "endless_reconnects": 0, "multipart_messages": 0, "multipart_reconnects": 0}

    def endless() -> None:
        while not stop.is_set():
            try:
                with _zmtp_connect(port) as sock:
                    sock.settimeout(1.0)
                    while not stop.is_set() and not _hung_up(sock):
                        with contextlib.suppress(TimeoutError):
                            sock.sendall(_part(MIB, True) + part)
                            counts["endless_mib"] += 1
                counts["endless_reconnects"] += 1
            except OSError:
                counts["endless_reconnects"] += 1
                time.sleep(0.1)

    def thousand_parts() -> None:
        while not stop.is_set():
            try:
                with _zmtp_connect(port) as sock:
                    sock.settimeout(1.0)
                    while not stop.is_set():
                        for i in range(1000):
                            if stop.is_set():
                                return
                            if _hung_up(sock):
                                raise ConnectionResetError
                            sock.sendall(_part(MIB, i < 999) + part)
                        counts["multipart_messages"] += 1
            except OSError:
                counts["multipart_reconnects"] += 1
                time.sleep(0.1)

    threads = [threading.Thread(target=endless, daemon=True), threading.Thread(target=thousand_parts, daemon=True)]
    for thread in threads:
        thread.start()
    stop.wait()
    for thread in threads:
        thread.join(5)
    out.put({"load": ", ".join(f"{k} {v}" for k, v in counts.items())})


def load_c(port: int, stop: Any, out: Any) -> None:
    """As many ZMTP connections without `Connect` as the fd limit allows, kept open."""
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    target = min(20_000, hard - 200)
    open_socks: dict[int, socket.socket] = {}
    poller = select.poll()
    opened = cut = failed = 0
    peak = 0
    while not stop.is_set():
        burst_end = time.monotonic() + 0.5
        while len(open_socks) < target and time.monotonic() < burst_end and not stop.is_set():
            try:
                sock = _zmtp_connect(port)
            except OSError:
                failed += 1
                time.sleep(0.05)
                break
            sock.setblocking(False)
            open_socks[sock.fileno()] = sock
            poller.register(sock.fileno(), select.POLLIN | select.POLLHUP | select.POLLERR)
            opened += 1
        peak = max(peak, len(open_socks))
        for fd, _event in poller.poll(0):
            sock = open_socks.get(fd)
            if sock is None:
                continue
            try:
                data = sock.recv(65536)
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            if not data:
                poller.unregister(fd)
                del open_socks[fd]
                sock.close()
                cut += 1
        time.sleep(0.05)
    out.put({"load": f"target {target}, opened {opened}, cut by the broker {cut}, connect failures {failed},"
                     f" open at once max {peak}, at the end {len(open_socks)}"})
    for sock in open_socks.values():
        sock.close()


def load_d(url: str, stop: Any, out: Any) -> None:
    """A reliable topic with a subscription that never acks; a producer flat out."""
    from danube_zmq import DanubeClient
    from danube_zmq.transport.errors import ResourceExhausted

    async def run() -> dict[str, Any]:
        accepted = refused = other = 0
        first_refusal: str | None = None
        async with DanubeClient(url, client_name="flood", operation_retries_max=0) as client:
            producer = await client.create_producer("/default/flood", dispatch="reliable")
            await client.subscribe("/default/flood", "never-acks", sub_type="exclusive")
            payload = os.urandom(16 * 1024)
            in_flight: set[asyncio.Future[Any]] = set()
            while not stop.is_set():
                while len(in_flight) < 64:
                    in_flight.add(asyncio.ensure_future(producer.send(payload)))
                done, in_flight = await asyncio.wait(in_flight, return_when=asyncio.FIRST_COMPLETED)
                for future in done:
                    exc = future.exception()
                    if exc is None:
                        accepted += 1
                    elif isinstance(exc, ResourceExhausted):
                        refused += 1
                        first_refusal = first_refusal or str(exc)
                    else:
                        other += 1
                if refused and len(done) == refused:
                    await asyncio.sleep(0.001)
            for future in in_flight:
                future.cancel()
        return {"load": f"{accepted * 16 // 1024} MiB accepted, {refused} sends refused, {other} other errors",
                "refusal": first_refusal}

    out.put(asyncio.run(run()))


LOADS = {
    "a": ("a: consumers never read, 1 MiB messages", load_a, "url",
          "outbound 32 MiB/connection, 128 MiB/broker; pending 16 MiB/subscription x 20"),
    "b": ("b: raw ZMTP, endless MORE parts + 1,000-part messages", load_b, "port",
          "inbound 64 MiB/connection + up to 30 MiB arriving while the watcher checks, x 2 connections"
          " (inbound_bytes_max 256 MiB); frame_bytes_max 16 MiB"),
    "c": ("c: TCP connections never sending Connect", load_c, "port",
          "connections_pending_max 1000, connect_timeout_ms 10000"),
    "d": ("d: reliable topic, consumer never acks", load_d, "url",
          "backlog_quota_bytes_max 256 MiB (producer_exception), cache 16 MiB"),
}


def _held_at_cuts(log: Path) -> dict[str, Any]:
    """What the inbound watcher's cuts found held (its WARNING lines): how late it was."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return {}
    held = sorted(int(n) for n in re.findall(r"holds (\d+) bytes the broker has not been handed", text))
    if not held:
        return {}
    return {"inbound_cuts": len(held), "held_at_cut_p50_mib": round(held[len(held) // 2] / MIB, 1),
            "held_at_cut_p99_mib": round(held[min(len(held) - 1, int(0.99 * len(held)))] / MIB, 1),
            "held_at_cut_max_mib": round(held[-1] / MIB, 1)}


def _children_rss(process: psutil.Process) -> int:
    total = 0
    for child in process.children():
        with contextlib.suppress(psutil.Error):
            total += child.memory_info().rss
    return total


def one_load(key: str, seconds: float) -> dict[str, Any]:
    title, target, address, budget = LOADS[key]
    work = Path(tempfile.mkdtemp(prefix=f"danube-bounds-{key}-"))
    context = mp.get_context("spawn")
    try:
        with Broker(work) as broker:
            assert broker.process is not None
            process = psutil.Process(broker.process.pid)
            ready, stop, probe_out, load_out = context.Event(), context.Event(), context.Queue(), context.Queue()
            probe = context.Process(target=probe_main, args=(broker.url, ready, stop, probe_out), daemon=True)
            probe.start()
            if not ready.wait(60):
                raise SystemExit("the probe did not start")
            rss_start = process.memory_info().rss
            load = context.Process(target=target, args=(broker.url if address == "url" else broker.port, stop,
                                                        load_out), daemon=True)
            load.start()
            samples = [rss_start]
            children_samples = [0]  # the broker's own children: the inbound watcher process
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                time.sleep(SAMPLE_S)
                samples.append(process.memory_info().rss)
                children_samples.append(_children_rss(process))
            stop.set()
            result: dict[str, Any] = {}
            for queue, name in ((load_out, "load"), (probe_out, "probe")):
                try:
                    result.update(queue.get(timeout=60))
                except Exception:
                    result[name] = "no result"
            for child in (load, probe):
                child.join(10)
                if child.is_alive():
                    child.kill()
            held_at_cuts = _held_at_cuts(work / "broker.log")
            wal = work / "data"
            wal_bytes = sum(f.stat().st_size for f in wal.rglob("*.wal")) if wal.exists() else 0
            alive = broker.process.poll() is None
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {"load_key": key, "title": title, "seconds": seconds, "budget": budget,
            "rss_start_mib": round(rss_start / MIB, 1), "rss_max_mib": round(max(samples) / MIB, 1),
            "rss_final_mib": round(samples[-1] / MIB, 1), "wal_mib": round(wal_bytes / MIB, 1),
            "children_rss_max_mib": round(max(children_samples) / MIB, 1), "load_average": os.getloadavg(),
            **held_at_cuts,
            "broker_alive": alive, **result}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=60.0, help="length of each load (default 60)")
    parser.add_argument("--loads", default="a,b,c,d", help="which loads, comma-separated (default a,b,c,d)")
    args = parser.parse_args()
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # the broker inherits it
    runs = []
    for key in [k.strip() for k in args.loads.split(",") if k.strip()]:
        run = one_load(key, args.seconds)
        run["at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        runs.append(run)
        print(json.dumps(run), flush=True)
    RESULTS.mkdir(exist_ok=True)
    with open(RESULTS / "bounds.jsonl", "a", encoding="utf-8") as file:
        for run in runs:
            file.write(json.dumps(run) + "\n")
    print("\nbroker config:", " ".join(f"{k}={v}" for k, v in CONFIG.items()))
    print(f"RLIMIT_NOFILE {hard}\n")
    print("| load | s | RSS start / max / final MiB | WAL MiB | probe p50 / p99 / max ms | probe errors | budget |")
    print("|---|---|---|---|---|---|---|")
    for run in runs:
        print(f"| {run['title']} | {run['seconds']:g} | {run['rss_start_mib']} / {run['rss_max_mib']} /"
              f" {run['rss_final_mib']} | {run['wal_mib']} | {run.get('probe_p50_ms')} / {run.get('probe_p99_ms')} /"
              f" {run.get('probe_max_ms')} | {run.get('probe_errors') or 0} | {run['budget']} |")
    for run in runs:
        print(f"{run['load_key']}: {run.get('load')}" + (f"; refusal: {run['refusal']}" if run.get("refusal") else ""))


if __name__ == "__main__":
    main()

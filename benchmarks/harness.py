"""What the side-by-side workloads share: our broker and the peer servers on loopback,
`danube bench` as a subprocess, peer producer/consumer process pairs, process
resources (RSS, CPU) read with psutil, medians of repeated runs, plain tables, and the
JSON lines every run is appended to (benchmarks/results/<workload>.jsonl).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil
from e2e import _ready, free_port
from peer_servers import Peer, PeerServers, ensure_installed

RESULTS = Path(__file__).resolve().parent / "results"
_BENCH_TIMEOUT_S = 900
# The Python (a venv's bin/python) whose danube_zmq runs the broker: another checkout's
# venv measures that checkout's broker with this checkout's clients and bench (A/B).
BROKER_PYTHON_ENV = "DANUBE_BENCH_BROKER_PYTHON"


def broker_python() -> str:
    return os.environ.get(BROKER_PYTHON_ENV) or sys.executable


# "broker": `danube bench` runs with the broker's Python, so each broker of an A/B meets
# its own checkout's client (needed across a wire change such as issue 20's request
# rounds, which an older broker refuses); default: this checkout's client for all.
BENCH_CLIENT_ENV = "DANUBE_BENCH_CLIENT"


def bench_python(broker: str) -> str:
    return broker if os.environ.get(BENCH_CLIENT_ENV) == "broker" else sys.executable


def parse_brokers(values: list[str] | None) -> dict[str, str]:
    """`--broker LABEL=PYTHON` options as {label: python}; none given: this checkout's
    (or $DANUBE_BENCH_BROKER_PYTHON's) broker, labelled "this"."""
    if not values:
        return {"this": broker_python()}
    brokers: dict[str, str] = {}
    for value in values:
        label, sep, python = value.partition("=")
        if not sep or not label or not python:
            raise SystemExit(f"--broker wants LABEL=PYTHON (a venv's bin/python), got {value!r}")
        brokers[label] = python
    return brokers


class Danube:
    """Our broker, `danube broker start` on free loopback ports, data in `work_dir`,
    run by `python` (default: `broker_python()`). `config`: a broker YAML (`--config`);
    `client_env`: the environment its clients need (DANUBE_SERVER_KEY, DANUBE_TOKEN for
    a secured broker), given to `danube bench` and to the readiness check."""

    def __init__(self, work_dir: Path, python: str | None = None, *, config: Path | None = None,
                 client_env: dict[str, str] | None = None) -> None:
        self.work_dir = work_dir
        self.python = python or broker_python()
        self.url = f"tcp://127.0.0.1:{free_port()}"
        self.admin_url = f"tcp://127.0.0.1:{free_port()}"
        self.config = config
        self.client_env = dict(client_env or {})
        self._process: subprocess.Popen[bytes] | None = None

    def start(self) -> Danube:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.work_dir / "broker.log", "wb")
        self._process = subprocess.Popen(
            [self.python, "-m", "danube_zmq.cli.main", "broker", "start", "--listen", self.url, "--admin-listen",
             self.admin_url, "--metrics-port", "0", "--data-dir", str(self.work_dir / "data"),
             *(["--config", str(self.config)] if self.config is not None else [])],
            stdout=log, stderr=subprocess.STDOUT)
        options = {"server_public_key": self.client_env.get("DANUBE_SERVER_KEY"),
                   "token": self.client_env.get("DANUBE_TOKEN")}
        asyncio.run(_ready(self.admin_url, **{k: v for k, v in options.items() if v}))
        return self

    @property
    def pid(self) -> int:
        assert self._process is not None
        return self._process.pid

    def stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(30)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait(10)

    def bench(self, mode: str, topic: str, *args: str) -> dict[str, Any]:
        """`danube bench MODE -t TOPIC ARGS --json` against this broker: its JSON result."""
        done = subprocess.run([bench_python(self.python), "-m", "danube_zmq.cli.main", "bench", mode, "-s", self.url,
                               "-t", topic, *args, "--json"], capture_output=True, text=True, timeout=_BENCH_TIMEOUT_S,
                              env={**os.environ, **self.client_env})
        if done.returncode != 0:
            raise SystemExit(f"danube bench {mode} failed:\n{done.stderr}")
        return json.loads(done.stdout)


class Servers:
    """Our broker and the named peers for one run (peers installed when missing, a peer
    that cannot be installed or started skipped with a line saying why)."""

    def __init__(self, peers: Iterable[str], broker_python: str | None = None) -> None:
        self.work_dir = Path(tempfile.mkdtemp(prefix="danube-sbs-"))
        self.danube = Danube(self.work_dir / "danube", broker_python)
        self._wanted = sorted(set(peers))
        self._peers = PeerServers(self.work_dir)

    @property
    def peers(self) -> dict[str, Peer]:
        return self._peers.peers

    def __enter__(self) -> Servers:
        missing = ensure_installed() if self._wanted else []
        for name in missing:
            print(f"skip: {name} could not be installed (scripts/install-peers.sh)", file=sys.stderr)
        try:
            self._peers.start([name for name in self._wanted if name not in missing])
            for name, why in self._peers.skipped.items():
                print(f"skip: {name} did not start: {why}", file=sys.stderr)
            self.danube.start()
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *_: object) -> None:
        self.danube.stop()
        self._peers.stop()


@contextmanager
def servers_for(shared: Servers | None, peers: Iterable[str], broker_python: str | None = None) -> Iterator[Servers]:
    """`shared` when the suite passes its servers in, else fresh ones for this workload."""
    if shared is not None:
        yield shared
        return
    with Servers(peers, broker_python) as servers:
        yield servers


# ---------------------------------------------------------------- peer process pairs


def _consumer_main(consumer: Callable[..., Any], ready: Any, out: Any, args: tuple[Any, ...]) -> None:
    out.put(consumer(ready, *args))


def run_pair(producer: Callable[..., Any], consumer: Callable[..., Any], *args: Any) -> tuple[Any, Any]:
    """consumer(ready, *args) in a child process, which sets `ready` once subscribed;
    producer(ready, *args) here, which waits for it. Returns both results."""
    context = mp.get_context("spawn")
    ready, out = context.Event(), context.Queue()
    child = context.Process(target=_consumer_main, args=(consumer, ready, out, args), daemon=True)
    child.start()
    try:
        produced = producer(ready, *args)
        consumed = out.get(timeout=600)
    finally:
        child.join(10)
        if child.is_alive():
            child.kill()
    return produced, consumed


# ---------------------------------------------------------------- process resources


class Meter:
    """RSS and CPU time of a server process and its children (psutil)."""

    def __init__(self, pid: int) -> None:
        self.process = psutil.Process(pid)

    def _family(self) -> list[psutil.Process]:
        return [self.process, *self.process.children(recursive=True)]

    def rss_bytes(self) -> int:
        return sum(p.memory_info().rss for p in self._family())

    def cpu_s(self) -> float:
        return sum(t.user + t.system for t in (p.cpu_times() for p in self._family()))

    async def cpu_percent(self, seconds: float) -> float:
        """CPU over the next `seconds`, as % of one core."""
        cpu, wall = self.cpu_s(), time.monotonic()
        await asyncio.sleep(seconds)
        return round(100 * (self.cpu_s() - cpu) / (time.monotonic() - wall), 2)


# ---------------------------------------------------------------- results


def append(workload: str, runs: list[dict[str, Any]]) -> Path:
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{workload}.jsonl"
    with open(path, "a") as out:
        for run in runs:
            out.write(json.dumps(run) + "\n")
    return path


def finish(module: Any, runs: list[dict[str, Any]]) -> None:
    """A workload module's table of medians, and its runs appended to its results file."""
    module.report(runs)
    path = append(module.WORKLOAD, runs)
    print(f"  ({len(runs)} runs appended to {path.relative_to(RESULTS.parent.parent)})")


def run_alone(module: Any, *, sized: bool = False, brokers: bool = False) -> None:
    """A workload module's own command line: --repeat (and --size, and --broker for a
    module whose `measure` takes `brokers`), its options, then `finish`."""
    parser = argparse.ArgumentParser(description=module.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3)
    if sized:
        parser.add_argument("--size", type=int, default=100)
    if brokers:
        parser.add_argument("--broker", action="append", metavar="LABEL=PYTHON",
                            help="run this venv's broker (repeatable: each in turn, an A/B in one run)")
    module.add_arguments(parser)
    args = parser.parse_args()
    extra: dict[str, Any] = {"size": args.size} if sized else {}
    if brokers:
        extra["brokers"] = parse_brokers(args.broker)
    finish(module, module.measure(repeat=args.repeat, **extra, **module.options(args)))


def split_list(text: str) -> list[str]:
    """The items of a comma-separated option."""
    return [item for item in text.split(",") if item]


def now_utc() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def medians(runs: list[dict[str, Any]], key: str, fields: Iterable[str]) -> list[dict[str, Any]]:
    """One row per distinct `run[key]`, in first-seen order: the median of each field
    over the runs that have it (None where none has), and how many runs there were."""
    groups: dict[Any, list[dict[str, Any]]] = {}
    for run in runs:
        groups.setdefault(run[key], []).append(run)
    rows = []
    for name, group in groups.items():
        row: dict[str, Any] = {key: name, "runs": len(group)}
        for field in fields:
            values = [run[field] for run in group if isinstance(run.get(field), int | float)]
            row[field] = statistics.median(values) if values else None
        rows.append(row)
    return rows


def print_table(title: str, columns: list[tuple[str, str]], rows: list[dict[str, Any]]) -> None:
    """`columns`: (header, field); numbers with thousands separators, None as '-'."""
    def cell(value: Any) -> str:
        if value is None:
            return "-"
        if isinstance(value, float):
            return f"{value:,.1f}" if abs(value) < 100 else f"{value:,.0f}"
        if isinstance(value, int):
            return f"{value:,}"
        return str(value)
    table = [[header for header, _ in columns]] + [[cell(row.get(field)) for _, field in columns] for row in rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(columns))]
    print(f"\n{title}")
    for number, line in enumerate(table):
        print("  ".join(text.ljust(w) if i == 0 else text.rjust(w) for i, (text, w) in enumerate(zip(line, widths,
                                                                                                       strict=True))))
        if number == 0:
            print("  ".join("-" * w for w in widths))

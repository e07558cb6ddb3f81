"""Metadata at scale (issue 19, section 5), three broker processes on loopback:

- `--partitions` partitions created through the admin API in topics of
  `--per-topic` partitions each (one create after the other): how long the creates
  took, and how long until every partition is served (the leader's placement plus the
  owners loading them: `danube_broker_topics_owned` summed over the brokers);
- admin `Ping` round trips to every broker, every 50 ms from a thread of its own,
  throughout: p50, p99, max and how many got no answer within 5 s;
- lease losses: "lost its lease" and "could not renew its lease" in the brokers' logs,
  and registered brokers sampled from the admin API (always 3);
- every broker stopped (SIGTERM, how long each took) and started again: time until
  every partition is served again.

- with `--gc-pauses`, every garbage collection over 30 ms in the brokers (wall and
  CPU time: `gc_probe/sitecustomize.py`).

Lease losses are counted from the brokers' logs (unbuffered) once they have stopped.

    .venv/bin/python benchmarks/metadata_scale.py [--partitions 100000] [--per-topic 1000] [--gc-pauses]
        [--json FILE] [--work-dir DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import zmq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from danube_zmq.client.admin import AdminClient
from danube_zmq.transport.admin_protocol import ADMIN_PROTOCOL
from danube_zmq.transport.common import PROTOCOL_VERSION, Connect, Ping
from danube_zmq.transport.errors import AlreadyExists, DanubeError
from tests.integration.conftest import free_port, start_broker
from tests.integration.consensus.test_metadata_cluster import Node, agreed_leader

_PING_EVERY_S = 0.05
_PING_TIMEOUT_MS = 5_000
_OWNED = re.compile(r"^danube_broker_topics_owned (\S+)$", re.MULTILINE)


class ScaleNode(Node):
    """A cluster node whose broker exports metrics (the served-partition gauge)."""

    def __init__(self, tmp_path: Path, node_id: int) -> None:
        super().__init__(tmp_path, node_id)
        self.metrics_port = free_port()

    def start(self, founders: list[Node], *, join: bool = False, env: dict[str, str] | None = None) -> Node:
        env = {
            **(env or {}),
            "DANUBE_CLUSTER__NODE_ID": str(self.node_id),
            "DANUBE_CLUSTER__RAFT_LISTEN": self.raft,
            "DANUBE_CLUSTER__PEERS": ",".join(f"{n.node_id}={n.raft}" for n in founders),
            "DANUBE_CLUSTER__JOIN": "false",
        }
        self.process = start_broker(self.tmp_path, "--data-dir", str(self.tmp_path / f"node-{self.node_id}"),
                                    "--metrics-port", str(self.metrics_port), env=env, url=self.url,
                                    admin_url=self.admin_url)
        return self


class Pinger(threading.Thread):
    """Admin Ping round trips to each broker, one DEALER each, on a thread of its own so
    the benchmark's own event loop never delays a measurement."""

    def __init__(self, admin_urls: list[str]) -> None:
        super().__init__(daemon=True)
        self.admin_urls = admin_urls
        self.rtts_ms: list[float] = []
        self.unanswered = 0
        self.stopping = threading.Event()
        self.paused = threading.Event()

    def run(self) -> None:
        ctx = zmq.Context.instance()
        sockets = {}
        request_id = 1
        while not self.stopping.is_set():
            if self.paused.is_set():
                for sock in sockets.values():
                    sock.close(linger=0)
                sockets.clear()
                time.sleep(_PING_EVERY_S)
                continue
            for url in self.admin_urls:
                sock = sockets.get(url)
                if sock is None:
                    sock = sockets[url] = ctx.socket(zmq.DEALER)
                    sock.setsockopt(zmq.LINGER, 0)
                    sock.setsockopt(zmq.RCVTIMEO, _PING_TIMEOUT_MS)
                    sock.connect(url)
                    sock.send(ADMIN_PROTOCOL.encode(Connect(request_id=0, protocol_version=PROTOCOL_VERSION,
                                                            client_name="metadata-scale-ping")))
                    try:
                        sock.recv()
                    except zmq.Again:
                        self.unanswered += 1
                        sock.close(linger=0)
                        del sockets[url]
                        continue
                request_id += 1
                sent = time.perf_counter()
                sock.send(ADMIN_PROTOCOL.encode(Ping(request_id=request_id)))
                try:
                    sock.recv()
                    self.rtts_ms.append((time.perf_counter() - sent) * 1000)
                except zmq.Again:
                    self.unanswered += 1
                    sock.close(linger=0)
                    del sockets[url]
            time.sleep(_PING_EVERY_S)
        for sock in sockets.values():
            sock.close(linger=0)

    def figures(self) -> dict[str, float | int]:
        rtts = sorted(self.rtts_ms)
        if not rtts:
            return {"pings": 0, "unanswered": self.unanswered}
        return {"pings": len(rtts), "p50_ms": round(statistics.median(rtts), 2),
                "p99_ms": round(rtts[min(len(rtts) - 1, int(len(rtts) * 0.99))], 2),
                "max_ms": round(rtts[-1], 2), "unanswered": self.unanswered}

    def reset(self) -> None:
        self.rtts_ms = []
        self.unanswered = 0


def owned(metrics_urls: list[str]) -> int:
    total = 0
    for url in metrics_urls:
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                match = _OWNED.search(response.read().decode())
        except OSError:
            continue
        total += int(float(match.group(1))) if match else 0
    return total


async def until_served(nodes: list[ScaleNode], total: int, timeout_s: float, registered: list[int]) -> float:
    """Seconds until the brokers serve `total` partitions; samples the registered count."""
    start = time.monotonic()
    urls = [f"http://127.0.0.1:{n.metrics_port}/metrics" for n in nodes]
    while time.monotonic() - start < timeout_s:
        try:
            async with AdminClient(nodes[0].admin_url, timeout_ms=10_000) as admin:
                registered.append(len(await admin.list_brokers()))
            if owned(urls) >= total:
                return time.monotonic() - start
        except Exception:
            pass
        await asyncio.sleep(1.0)
    raise TimeoutError(f"{total} partitions not served within {timeout_s} s (now {owned(urls)})")


async def term(node: Node) -> int:
    async with AdminClient(node.admin_url, timeout_ms=10_000) as admin:
        return (await admin.cluster_status()).term


def gc_pauses(logs: list[str]) -> dict[str, float]:
    walls = sorted(float(m.group(1)) for m in re.finditer(r"GCPAUSE gen\d (\d+) ms", "".join(logs)))
    cpus = sorted(float(m.group(1)) for m in re.finditer(r"GCPAUSE gen\d \d+ ms cpu (\d+) ms", "".join(logs)))
    if not walls:
        return {"over_30ms": 0}
    return {"over_30ms": len(walls), "wall_p50": walls[len(walls) // 2], "wall_max": walls[-1],
            "cpu_max": cpus[-1] if cpus else 0.0}


def lease_trouble(nodes: list[Node], logs: list[str]) -> dict[str, int]:
    text = "".join(logs) + "".join(n.process.log() for n in nodes if n.process is not None)
    return {"lost": text.count("lost its lease"), "renew_failed": text.count("could not renew its lease")}


async def create(nodes: list[ScaleNode], partitions: int, per_topic: int, registered: list[int]) -> dict[str, float]:
    """Create the topics one after the other through the brokers in turn; a create with
    no answer is retried on the next broker (an AlreadyExists then means it was made)."""
    topics = max(1, partitions // per_topic)
    started = time.monotonic()
    retries = 0
    turn = 0
    for i in range(topics):
        while True:
            node = nodes[turn % len(nodes)]
            try:
                async with AdminClient(node.admin_url, timeout_ms=60_000) as admin:
                    try:
                        await admin.create_topic(f"/default/scale-{i}", partitions=per_topic)
                    except AlreadyExists:
                        pass
                    try:
                        registered.append(len(await admin.list_brokers()))
                    except DanubeError:
                        registered.append(-1)  # no answer (no leader known): counted as a miss
                break
            except DanubeError as exc:
                retries += 1
                turn += 1
                print(f"create of /default/scale-{i} failed ({exc}); retrying on the next broker", file=sys.stderr)
                await asyncio.sleep(1.0)
    created = time.monotonic() - started
    served = await until_served(nodes, topics * per_topic, 3600, registered)
    return {"topics": topics, "partitions": topics * per_topic, "create_s": round(created, 1),
            "create_retries": retries, "served_after_first_create_s": round(time.monotonic() - started, 1),
            "served_after_last_create_s": round(served, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--partitions", type=int, default=100_000)
    parser.add_argument("--per-topic", type=int, default=1_000)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--work-dir", type=Path, help="keep data and broker logs here (default: a temp dir)")
    parser.add_argument("--gc-pauses", action="store_true", help="log the brokers' collections over 30 ms")
    args = parser.parse_args()
    env = {"DANUBE_POLICIES__TOPICS_PER_NAMESPACE_MAX": str(max(10_000, args.partitions)),
           "DANUBE_POLICIES__PARTITIONS_PER_TOPIC_MAX": str(max(1_000, args.per_topic)),
           "DANUBE_LOAD_MANAGER__ASSIGNMENT_STRATEGY": "balanced", "PYTHONUNBUFFERED": "1",
           "COLUMNS": "1000"}  # one log line a record: the counts below match whole lines
    if args.gc_pauses:
        env["PYTHONPATH"] = str(Path(__file__).resolve().parent / "gc_probe")
    result: dict[str, object] = {"partitions": args.partitions, "per_topic": args.per_topic}
    with tempfile.TemporaryDirectory(prefix="metadata-scale-") as tmp_dir:
        tmp = str(args.work_dir) if args.work_dir else tmp_dir
        Path(tmp).mkdir(parents=True, exist_ok=True)
        nodes = [ScaleNode(Path(tmp), i) for i in (1, 2, 3)]
        for node in nodes:
            node.start(nodes, env=env)
        logs: list[str] = []
        pinger = Pinger([n.admin_url for n in nodes])
        try:
            _, first_term = asyncio.run(agreed_leader(nodes, timeout_s=30))
            pinger.start()
            registered: list[int] = []
            result["create"] = asyncio.run(create(nodes, args.partitions, args.per_topic, registered))
            result["ping_during_create"] = pinger.figures()
            result["registered_min_during_create"] = min(registered)
            result["lease_during_create"] = lease_trouble(nodes, logs)
            result["elections_during_create"] = asyncio.run(term(nodes[0])) - first_term
            print(json.dumps(result), flush=True)
            pinger.paused.set()
            # All three at once, as a cluster restart: stopped one by one, each broker's
            # topics would fail over to the ones still up first.
            stops = []
            begun = time.monotonic()
            for node in nodes:
                assert node.process is not None
                node.process.process.send_signal(signal.SIGTERM)
            for node in nodes:
                assert node.process is not None
                try:
                    code = node.process.process.wait(max(1.0, 120 - (time.monotonic() - begun)))
                except subprocess.TimeoutExpired:
                    node.process.process.kill()
                    code = node.process.process.wait(10)
                stops.append({"exit": code, "s": round(time.monotonic() - begun, 1)})
                logs.append(node.process.log())
                node.process = None
            result["stop"] = stops
            pinger.reset()
            begun = time.monotonic()
            for node in nodes:
                node.start(nodes, env=env)
            pinger.paused.clear()
            registered = []
            total = result["create"]["partitions"]  # type: ignore[index]
            result["restarted_s"] = round(time.monotonic() - begun, 1)  # three processes answering Connect
            asyncio.run(until_served(nodes, total, 3600, registered))
            result["restart_served_from_start_s"] = round(time.monotonic() - begun, 1)
            result["ping_after_restart"] = pinger.figures()
        finally:
            pinger.stopping.set()
            for node in nodes:
                if node.process is not None:
                    node.process.stop(timeout_s=120)
                    logs.append(node.process.log())
                    node.process = None
            result["lease_total"] = lease_trouble(nodes, logs)
            result["failovers"] = sum(text.count(" topics unassigned (failover)") for text in logs)
            if args.gc_pauses:
                result["gc_pauses_ms"] = gc_pauses(logs)
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()

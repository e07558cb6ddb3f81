"""A real Prometheus server (Debian's `prometheus`, installed by
scripts/install-prometheus.sh when missing) scraping a 3-broker cluster on loopback:
the backlog, lag and latency queries an operator's console runs return data through
Prometheus' HTTP API (histogram_quantile over `_bucket` series included, which Danube's
summaries cannot answer)."""

from __future__ import annotations

import asyncio
import contextlib
import math
import shutil
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import httpx2 as httpx
import pytest

from danube_zmq import SyncClient
from danube_zmq.client import promql
from danube_zmq.client.admin import AdminClient
from danube_zmq.transport.client_protocol import DispatchStrategy
from tests.integration.actors.test_cluster import LEASE_ENV, _registered
from tests.integration.conftest import free_port
from tests.integration.consensus.test_metadata_cluster import Node, agreed_leader
from tests.integration.console_process import console
from tests.integration.doors.console.test_console import login
from tests.paths import ROOT

pytestmark = pytest.mark.cluster

REPO = ROOT
TOPIC = "/default/watched"
# What a console (and the MCP server's topic_metrics) asks, per topic and subscription.
QUERIES = {name: build(TOPIC) for name, build in promql.CONSOLE_QUERIES.items()}
# Label values PromQL must read back exactly as quoted (client/promql.py's `quote`).
AWKWARD_VALUES = ['a"b', "back\\slash\\", "new\nline\ttab", "{x=~\".*\"}", "é€😀", "\x01\x7f", ""]


def prometheus_binary() -> str:
    if shutil.which("prometheus") is None:
        done = subprocess.run(["bash", str(REPO / "scripts" / "install-prometheus.sh")], capture_output=True,
                              text=True, timeout=600)
        if done.returncode != 0:
            pytest.skip(f"prometheus is not installed and could not be: {done.stderr.strip()}")
    found = shutil.which("prometheus")
    assert found is not None
    return found


def query(port: int, expr: str) -> list[dict[str, object]]:
    return promql.instant(f"http://127.0.0.1:{port}", expr)["result"]  # type: ignore[no-any-return]


def has_data(result: list[dict[str, object]]) -> bool:
    """Some series with a number (histogram_quantile gives NaN without increases)."""
    return any(not math.isnan(float(r["value"][1])) for r in result)  # type: ignore[index]


@contextlib.contextmanager
def running_prometheus(tmp_path: Path, targets: list[int]) -> Iterator[int]:
    port = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        "scrape_configs:\n  - job_name: danube\n    static_configs:\n"
        f"      - targets: [{', '.join(f'127.0.0.1:{p}' for p in targets)}]\n")
    log = (tmp_path / "prometheus.log").open("wb")
    process = subprocess.Popen(
        [prometheus_binary(), f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{port}"], stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/-/ready", timeout=5) as response:
                    if response.status == 200:
                        break
            except (urllib.error.URLError, OSError):
                pass
            assert process.poll() is None, (tmp_path / "prometheus.log").read_text()
            assert time.monotonic() < deadline, "prometheus not ready in 60 s"
            time.sleep(0.2)
        yield port
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


def test_prometheus_answers_the_consoles_backlog_lag_and_latency_queries(tmp_path: Path) -> None:
    """Three brokers with fixed metrics ports, scraped every second by Prometheus. A
    reliable topic gets a message every 50 ms or so; its consumer acks every other
    message, so the subscription has a backlog. Label values with quotes, backslashes,
    newlines and non-ASCII, quoted by client/promql.py, read back from Prometheus as they
    were. Within 60 s each named console query of client/promql.py (backlog, its bytes, lag,
    unacked, produce and end-to-end p99 from the histograms' buckets, publish and dispatch
    rates, fsync p99) returns data through Prometheus' HTTP API, sent by client/promql.py's
    client, and the backlog is above 0. The web console started with --prometheus-url
    draws its backlog, rate and latency charts from them."""
    nodes = [Node(tmp_path, i) for i in range(1, 4)]
    metrics = [free_port() for _ in nodes]
    stop = threading.Event()
    errors: list[BaseException] = []
    worker = threading.Thread(target=lambda: produce(), name="console-workload", daemon=True)

    def produce() -> None:
        try:
            with SyncClient(nodes[0].url) as client:
                producer = client.create_producer(TOPIC, dispatch="reliable")
                consumer = client.subscribe(TOPIC, "console", receiver_queue_size=10)
                while not stop.is_set():
                    producer.send(b"x" * 64)
                    # Every other message acked: the backlog grows, and the dispatch window
                    # never fills (first deliveries, the end-to-end series, go on).
                    for message in consumer.batch_receive(timeout=0.05)[::2]:
                        consumer.ack(message)
        except BaseException as exc:  # reported by the test's thread
            errors.append(exc)

    try:
        for node, port in zip(nodes, metrics, strict=True):
            node.start(nodes, env=LEASE_ENV, extra=("--metrics-port", str(port)))
        asyncio.run(agreed_leader(nodes))
        asyncio.run(_registered(nodes, 3))

        async def create() -> None:
            async with AdminClient(nodes[0].admin_url) as admin:
                await admin.create_topic(TOPIC, dispatch_strategy=DispatchStrategy.RELIABLE)

        asyncio.run(create())
        worker.start()
        with running_prometheus(tmp_path, metrics) as port:
            for value in AWKWARD_VALUES:
                [quoted] = query(port, f'label_replace(vector(1), "v", {promql.quote(value)}, "", "")')
                assert quoted["metric"] == ({"v": value} if value else {}), (value, quoted)  # type: ignore[index]
            answered: dict[str, list[dict[str, object]]] = {}
            deadline = time.monotonic() + 60
            while len(answered) < len(QUERIES) and time.monotonic() < deadline and not errors:
                for name, expr in QUERIES.items():
                    # The backlog's first scrape may come before the first unacked message.
                    if name not in answered and has_data(result := query(port, expr)) \
                            and (name != "backlog_messages" or float(result[0]["value"][1]) > 0):  # type: ignore[index]
                        answered[name] = result
                time.sleep(1)
            assert not errors, errors
            assert set(answered) == set(QUERIES), f"no data for {set(QUERIES) - set(answered)}"
            [backlog] = answered["backlog_messages"]
            assert backlog["metric"] == {"topic": TOPIC, "subscription": "console"}
            assert float(backlog["value"][1]) > 0  # type: ignore[index]

            # The web console's charts, from the same Prometheus through the same queries.
            with console(nodes[0].admin_url, tmp_path, "--prometheus-url", f"http://127.0.0.1:{port}") as url, \
                    httpx.Client(base_url=url) as http:
                login(http)
                charts = http.get("/api/topic-series", params={"topic": TOPIC}).json()
            assert charts["source"] == "prometheus", charts
            for chart in ("backlog", "rates", "latency"):
                drawn = [line for line in charts["charts"][chart] if any(v is not None for v in line["values"])]
                assert drawn, (chart, charts["charts"][chart])
    finally:
        stop.set()
        if worker.is_alive():
            worker.join(timeout=30)
        for node in nodes:
            if node.process is not None:
                node.stop()

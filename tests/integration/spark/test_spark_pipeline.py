"""The pipeline of examples/spark_pipeline.py (topic -> parse JSON -> windowed count ->
topic), run as its own driver process while a producer writes, through failures: its
driver killed with -9 and restarted from its checkpoint, the broker killed with -9 and
restarted, the topics moved between brokers; and on a Spark standalone cluster. The
output holds each (window, user) once with the count of the events sent for it:
nothing lost, nothing twice."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")

from danube_zmq import DanubeClient
from danube_zmq.client.admin import AdminClient
from danube_zmq.transport.errors import DanubeError
from tests.integration.actors.test_cluster import running_cluster
from tests.integration.conftest import start_broker
from tests.paths import ROOT
from tests.spark_cluster import SparkCluster, apps

pytestmark = [pytest.mark.spark, pytest.mark.timeout(900)]

SOURCE, SINK = "/default/clicks", "/default/click-counts"
START_MS = 1_767_225_600_000  # event time of the first event
EVENTS = 6000
ENV = {"DANUBE_POLICIES__DEDUPLICATION": "true"}


def event(i: int) -> dict[str, Any]:
    return {"user": f"u{i % 5}", "page": f"/p{i % 3}", "ts": START_MS + i * 20}


def expected_counts() -> Counter[tuple[str, str]]:
    """What the pipeline must write: per 10 s window of event time and user, the events."""
    counts: Counter[tuple[str, str]] = Counter()
    for i in range(EVENTS):
        e = event(i)
        start = (e["ts"] // 10_000) * 10_000
        counts[(time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(start / 1000)), e["user"])] += 1
    return counts


class Producer(threading.Thread):
    """Sends the events at about 1,000 a second, resending through broker restarts
    (dedup: a resend of what was stored is not stored again), then one an hour later
    in event time, which moves the watermark past every window before it."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url, self.sent, self.error = url, 0, None

    def run(self) -> None:
        try:
            asyncio.run(self._run())
        except Exception as exc:  # surfaced by the test
            self.error = exc

    async def _run(self) -> None:
        async with DanubeClient(self.url, reconnect_attempts_max=600) as client:
            producer = await client.create_producer(SOURCE, name="clicks", dispatch="reliable", partitions=2)
            for start in range(0, EVENTS, 100):
                for i in range(start, start + 100):
                    e = event(i)
                    producer.send_nowait(json.dumps(e).encode(), key=e["user"], sequence_id=i)
                await producer.flush()
                self.sent = start + 100
                await asyncio.sleep(0.1)
            late = {"user": "u0", "page": "/", "ts": START_MS + 3_600_000}
            await producer.send(json.dumps(late).encode(), key="u0", sequence_id=EVENTS)


def driver(url: str, checkpoint: Path, log: Path, master: str = "local[2]") -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen(
            [sys.executable, str(ROOT / "examples" / "spark_pipeline.py"), "counts", "--service-url", url,
             "--source", SOURCE, "--sink", SINK, "--checkpoint", str(checkpoint), "--master", master],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True, cwd=checkpoint.parent)


def kill_group(process: subprocess.Popen[bytes]) -> None:
    """The driver and what it started (Spark's JVM, its Python workers)."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait(30)


def committed(checkpoint: Path) -> int:
    commits = checkpoint / "commits"
    return len(list(commits.glob("[0-9]*"))) if commits.exists() else 0


def wait(condition: Callable[[], bool], timeout_s: float, what: str, log: Path) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} within {timeout_s} s; driver log:\n{log.read_text()[-4000:]}")
        time.sleep(0.5)


async def output(url: str) -> list[dict[str, Any]]:
    async with DanubeClient(url) as client:
        reader = await client.create_reader(SINK, start="earliest")
        rows = []
        while await reader.has_message_available():
            rows.append(json.loads((await reader.read_next(10)).payload))
        await reader.close()
        return rows


def check_exactly_once(url: str, log: Path) -> None:
    want = expected_counts()
    wait(lambda: len(asyncio.run(output(url))) >= len(want), 240, "every window written", log)
    time.sleep(3)  # a duplicate written late would show now
    rows = asyncio.run(output(url))
    got = Counter((r["window_start"], r["user"]) for r in rows)
    assert [k for k, n in got.items() if n > 1] == [], "windows written twice"
    assert {(r["window_start"], r["user"]): r["clicks"] for r in rows} == dict(want)


async def create_sink(url: str) -> None:
    """The sink's topic, reliable, before anyone reads it (a reader would not create it so)."""
    async with DanubeClient(url) as client:
        await (await client.create_producer(SINK, dispatch="reliable")).close()


Failure = Callable[[str, subprocess.Popen[bytes]], subprocess.Popen[bytes]]


def run_through(tmp_path: Path, url: str, failure: Failure | None, master: str = "local[2]") -> None:
    """The pipeline's driver against `url` while the producer writes; `failure` strikes
    after two committed micro-batches and gives the driver that goes on."""
    checkpoint, log = tmp_path / "ckpt", tmp_path / "driver.log"
    asyncio.run(create_sink(url))
    producer = Producer(url)
    process = driver(url, checkpoint, log, master)
    try:
        producer.start()
        wait(lambda: committed(checkpoint) >= 2, 180, "two micro-batches committed", log)
        if failure is not None:
            process = failure(url, process)
        producer.join(300)
        assert not producer.is_alive() and producer.error is None, producer.error
        check_exactly_once(url, log)
    finally:
        kill_group(process)


def test_a_driver_killed_mid_stream_restarts_from_its_checkpoint_and_writes_each_window_once(tmp_path: Path) -> None:
    broker = start_broker(tmp_path, env=ENV)

    def kill_the_driver(url: str, process: subprocess.Popen[bytes]) -> subprocess.Popen[bytes]:
        kill_group(process)
        return driver(url, tmp_path / "ckpt", tmp_path / "driver.log")

    try:
        run_through(tmp_path, broker.url, kill_the_driver)
    finally:
        assert broker.stop() == 0, broker.log()


def test_a_broker_killed_mid_stream_and_restarted_loses_and_repeats_nothing(tmp_path: Path) -> None:
    brokers = [start_broker(tmp_path, env=ENV)]

    def kill_the_broker(url: str, process: subprocess.Popen[bytes]) -> subprocess.Popen[bytes]:
        brokers[0].stop(signal.SIGKILL)
        time.sleep(1)
        brokers[0] = start_broker(tmp_path, env=ENV, url=url, admin_url=brokers[0].admin_url)
        return process

    try:
        run_through(tmp_path, brokers[0].url, kill_the_broker)
    finally:
        assert brokers[0].stop() == 0, brokers[0].log()


def test_topics_moved_between_brokers_mid_stream_lose_and_repeat_nothing(tmp_path: Path) -> None:
    """A 3-broker cluster: the source's partitions and the sink move to other brokers
    while the pipeline reads and writes (storage.mode local: the WAL and the
    deduplication table go with each)."""
    with running_cluster(tmp_path, env=ENV) as nodes:
        def move_the_topics(url: str, process: subprocess.Popen[bytes]) -> subprocess.Popen[bytes]:
            wait(lambda: bool(asyncio.run(output(url))), 120, "a first window written", tmp_path / "driver.log")

            async def unload() -> None:
                async with AdminClient(nodes[0].admin_url) as admin:
                    before = await owners(admin)
                    for topic in (SOURCE, SINK):
                        await admin.unload_topic(topic)
                    after = await owners(admin)
                assert all(after[p] != before[p] for p in before), (before, after)
            asyncio.run(unload())
            return process

        run_through(tmp_path, nodes[0].url, move_the_topics)


async def owners(admin: AdminClient) -> dict[str, int | None]:
    described = [await admin.describe_topic(t) for t in (SOURCE, SINK)]
    return {p.name: p.broker_id for d in described for p in d.partitions}


def test_the_pipeline_on_a_standalone_spark_cluster_writes_each_window_once(tmp_path: Path,
                                                                            spark_standalone: SparkCluster) -> None:
    """The same pipeline with its executors on a Spark standalone cluster's worker."""
    broker = start_broker(tmp_path, env=ENV)
    before = apps(spark_standalone)
    try:
        run_through(tmp_path, broker.url, None, master=spark_standalone.url)
        assert apps(spark_standalone) - before  # the worker ran this driver's executors
    finally:
        assert broker.stop() == 0, broker.log()


def test_the_demo_writes_every_event_to_parquet_and_every_window_once() -> None:
    """`./run spark-pipeline` (README, docs/spark.md) runs the example's demo."""
    assert 'exec "$VENV/bin/python" examples/spark_pipeline.py' in (ROOT / "run").read_text()
    done = subprocess.run([sys.executable, str(ROOT / "examples" / "spark_pipeline.py")], capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr[-4000:]
    assert "parquet: 2001 events in" in done.stdout and "offsets Row(min(offset)=0" in done.stdout, done.stdout
    assert "counts: 50 windows, 2000 clicks" in done.stdout, done.stdout


def test_the_docs_snippet_runs_as_written(tmp_path: Path) -> None:
    """docs/spark.md's Python block, against a broker on free ports (its URL and
    checkpoint put in), left to run until its sink holds every message upper-cased."""
    block = re.search(r"```python\n(.*?)```", (ROOT / "docs" / "spark.md").read_text(), re.S)
    assert block is not None
    broker = start_broker(tmp_path, env=ENV)
    try:
        asyncio.run(_send(broker.url, "/default/clicks", [f"click {i}".encode() for i in range(20)]))
        script = block.group(1).replace("tcp://127.0.0.1:6650", broker.url) \
            .replace("/tmp/ckpt-upper", str(tmp_path / "ckpt"))
        script += "\nimport time\ntime.sleep(60)\n"  # the query runs in the background; the test stops it
        (tmp_path / "snippet.py").write_text(script)
        process = subprocess.Popen([sys.executable, str(tmp_path / "snippet.py")], stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL, start_new_session=True, cwd=tmp_path)
        try:
            deadline = time.monotonic() + 120
            while sorted(asyncio.run(_read(broker.url, "/default/clicks-upper"))) != \
                    sorted(f"CLICK {i}".encode() for i in range(20)):
                assert process.poll() is None and time.monotonic() < deadline, "the snippet wrote nothing"
                time.sleep(1)
        finally:
            kill_group(process)
    finally:
        assert broker.stop() == 0, broker.log()


async def _send(url: str, topic: str, payloads: list[bytes]) -> None:
    async with DanubeClient(url) as client:
        producer = await client.create_producer(topic, dispatch="reliable")
        for payload in payloads:
            producer.send_nowait(payload)
        await producer.flush()


async def _read(url: str, topic: str) -> list[bytes]:
    async with DanubeClient(url) as client:
        try:
            reader = await client.create_reader(topic, start="earliest")
        except DanubeError:
            return []  # not there yet
        payloads = []
        while await reader.has_message_available():
            payloads.append((await reader.read_next(10)).payload)
        await reader.close()
        return payloads

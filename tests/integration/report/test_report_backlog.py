"""`danube report backlog` with a real Spark over snapshots of a real broker: backlog
numbers equal what the broker reports, the Python engine's rows equal Spark's, edge cases (an empty topic, a subscription with
no acks, a Shared one with holes, WAL rotation, a broker restart between snapshots, a
damaged file), the HTML report's charts, and the same report on a Spark standalone
cluster started on loopback."""

from __future__ import annotations

import asyncio
import base64
import json
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")

import pyarrow.parquet as pq

from danube_zmq import DanubeClient, SubType
from danube_zmq.client.admin import AdminClient
from danube_zmq.report.backlog import BacklogReport, compute_backlog
from danube_zmq.report.local import compute_backlog_python
from danube_zmq.report.spark import spark_session
from danube_zmq.snapshots.store import SnapshotStore
from danube_zmq.transport.errors import Unavailable
from tests.integration.conftest import start_broker
from tests.integration.snapshots.test_snapshots import SMALL_SEGMENTS, produce_known_traffic
from tests.spark_cluster import SparkCluster, apps

pytestmark = [pytest.mark.spark, pytest.mark.timeout(600)]


class Traffic:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.url = str(root / "data" / "snapshots")
        self.described: dict[str, dict[str, tuple[int, int | None]]] = {}  # base topic -> sub -> (backlog, bytes)


async def _describe(admin_url: str) -> dict[str, dict[str, tuple[int, int | None]]]:
    out: dict[str, dict[str, tuple[int, int | None]]] = {}
    async with AdminClient(admin_url) as admin:
        for name in ("/default/orders", "/default/audit", "/default/empty"):
            for partition in (await admin.describe_topic(name)).partitions:
                for s in partition.subscriptions:
                    backlog, size = out.setdefault(name, {}).get(s.name, (0, 0))
                    out[name][s.name] = (backlog + (s.backlog_messages or 0), size + (s.backlog_bytes or 0))
    return out


@pytest.fixture(scope="module")
def traffic(tmp_path_factory: pytest.TempPathFactory) -> Traffic:
    """Known traffic, a snapshot, a broker restart, more traffic, a second snapshot."""
    root = tmp_path_factory.mktemp("report")
    result = Traffic(root)
    broker = start_broker(root, env=SMALL_SEGMENTS)
    try:
        asyncio.run(produce_known_traffic(broker.url))

        async def empty_topic() -> None:
            async with AdminClient(broker.admin_url) as admin:
                await admin.create_topic("/default/empty", dispatch_strategy=1)
                async with DanubeClient(broker.url) as client:
                    consumer = await client.subscribe("/default/empty", "quiet", sub_type=SubType.EXCLUSIVE)
                    await consumer.close()
                await admin.create_snapshot()
        asyncio.run(empty_topic())
    finally:
        assert broker.stop() == 0, broker.log()
    broker = start_broker(root, env=SMALL_SEGMENTS, url=broker.url, admin_url=broker.admin_url)
    try:
        async def more() -> None:
            async with DanubeClient(broker.url) as client:
                audit = await client.create_producer("/default/audit", dispatch="reliable", batch_messages_max=25)
                for i in range(100):
                    audit.send_nowait(f"after-restart-{i}".encode())
                await audit.flush()
            async with AdminClient(broker.admin_url) as admin:
                await admin.create_snapshot()
            result.described = await _describe(broker.admin_url)
        asyncio.run(more())
    finally:
        assert broker.stop() == 0, broker.log()
    return result


@pytest.fixture(scope="module")
def spark() -> Iterator[object]:
    session = spark_session("local[2]")
    yield session
    session.stop()


def by_name(report: BacklogReport) -> dict[str, object]:
    return {s.name: s for s in report.subscriptions}


def test_backlog_equals_what_the_broker_reports(traffic: Traffic, spark: object) -> None:
    report = compute_backlog(spark, traffic.url)
    assert report.snapshots == 2
    subs = by_name(report)
    for topic, per_sub in traffic.described.items():
        for name, (backlog, size) in per_sub.items():
            row = subs[f"{topic}:{name}"]
            assert row.backlog_messages == backlog, (topic, name)
            if name != "workers":  # holes: the broker prorates bytes; checked exactly below
                assert row.backlog_bytes == size, (topic, name)
    assert subs["/default/orders:billing"].backlog_messages == 2 * 80
    assert subs["/default/orders:idle"].backlog_messages == 400 and subs["/default/orders:idle"].partitions == 2
    assert subs["/default/audit:workers"].backlog_messages == 500 - 30
    assert subs["/default/empty:quiet"].backlog_messages == 0 and subs["/default/empty:quiet"].oldest_unacked_ms is None
    # Bytes with holes, counted here from the Parquet files without Spark.
    store = SnapshotStore(traffic.url)
    manifest = store.manifest(report.snapshot_id)
    audit = next(t for t in manifest.topics if t.topic == "/default/audit")
    workers = next(s for s in audit.subscriptions if s.name == "workers")
    rows = [r for f in audit.files for r in pq.read_table(store.open_read(f.path)).to_pylist()]
    expected = sum(r["record_bytes"] for r in rows if r["offset"] > workers.cursor
                   and r["offset"] not in workers.acked_above)
    assert subs["/default/audit:workers"].backlog_bytes == expected
    oldest = min(r["publish_time"] for r in rows if r["offset"] not in workers.acked_above)
    assert subs["/default/audit:workers"].oldest_unacked_ms == round(oldest.timestamp() * 1000)
    assert report.top_lagging[:2] == ["/default/audit:workers", "/default/orders:idle"]


def test_rates_and_trends_across_the_restart(traffic: Traffic, spark: object) -> None:
    report = compute_backlog(spark, traffic.url)
    store = SnapshotStore(traffic.url)
    first, second = (store.manifest(i) for i in store.snapshot_ids())
    minutes = (second.created_ms - first.created_ms) / 60_000
    audit = next(t for t in report.topics if t.topic == "/default/audit")
    assert audit.produce_rate_per_min == pytest.approx(100 / minutes, rel=0.01)
    assert next(t for t in report.topics if t.topic == "/default/orders").produce_rate_per_min == 0
    workers = by_name(report)["/default/audit:workers"]
    assert workers.backlog_trend_per_min == pytest.approx(100 / minutes, rel=0.01)  # nobody consumed
    assert [v for _, v in report.backlog_series["/default/audit:workers"]] == [370, 470]
    assert report.consume_series["/default/orders:billing"][-1][1] == 0
    # A window holding only the first snapshot has no rates yet.
    early = compute_backlog(spark, traffic.url, to_ms=first.created_ms)
    assert early.snapshots == 1 and by_name(early)["/default/audit:workers"].backlog_messages == 370
    assert all(t.produce_rate_per_min is None for t in early.topics)
    only_orders = compute_backlog(spark, traffic.url, topic="/default/orders")
    assert {s.topic for s in only_orders.subscriptions} == {"/default/orders"}


def _rows(report: BacklogReport) -> dict[str, object]:
    """Everything the report holds but the engine's name."""
    out = report.to_dict()
    out.pop("engine")
    return out


@pytest.mark.parametrize("window", ["all", "first", "orders", "partition"])
def test_python_and_spark_give_the_same_rows(traffic: Traffic, spark: object, window: str) -> None:
    store = SnapshotStore(traffic.url)
    first = store.manifest(store.snapshot_ids()[0])
    options: dict[str, object] = {"all": {}, "first": {"to_ms": first.created_ms}, "orders": {"topic": "/default/orders"},
                                  "partition": {"topic": "/default/orders-part-1", "top": 1}}[window]
    by_spark = compute_backlog(spark, traffic.url, **options)  # type: ignore[arg-type]
    by_python = compute_backlog_python(traffic.url, **options)  # type: ignore[arg-type]
    assert (by_spark.engine, by_python.engine) == ("spark (local[2])", "python")
    assert by_python.subscriptions and by_python.topics
    assert _rows(by_python) == _rows(by_spark)


def test_small_snapshots_are_read_without_spark(traffic: Traffic) -> None:
    """No --master and a small snapshot: the Python engine, named in the output; the
    threshold sends the same snapshot to Spark."""
    done = danube_report("--snapshots", traffic.url, "--format", "json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["engine"] == "python" and "report computed by python" in done.stderr
    got = {f"{s['topic']}:{s['subscription']}": s["backlog_messages"] for s in report["subscriptions"]}
    assert got["/default/audit:workers"] == 470 and got["/default/orders:billing"] == 160
    done = danube_report("--snapshots", traffic.url, "--spark-above-records", "10")
    assert done.returncode == 0, done.stderr
    assert "computed by spark (local[*])" in done.stdout and "starting Spark" in done.stderr
    done = danube_report("--snapshots", traffic.url, "--engine", "python", "--master", "local[2]")
    assert done.returncode == 2 and "--master is for the Spark engine" in done.stderr


def danube_report(*args: str, timeout_s: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "danube_zmq.cli.main", "report", "backlog", *args],
                          capture_output=True, text=True, timeout=timeout_s)


class _Images(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.images: list[tuple[str, bytes]] = []
        self.tables = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        if tag == "table":
            self.tables += 1
        if tag == "img" and (values.get("src") or "").startswith("data:image/png;base64,"):
            self.images.append((values.get("alt") or "", base64.b64decode((values["src"] or "").split(",", 1)[1])))


def test_html_report_has_its_tables_and_charts(traffic: Traffic, tmp_path: Path) -> None:
    """Rendered from the Python engine's rows, which equal Spark's (above): no JVM to start."""
    out = tmp_path / "backlog.html"
    done = danube_report("--snapshots", traffic.url, "--engine", "python", "--format", "html", "--out", str(out))
    assert done.returncode == 0, done.stderr
    page = _Images()
    page.feed(out.read_text())
    assert page.tables == 2
    titles = [title for title, _ in page.images]
    assert titles[0] == "backlog over time per subscription" and "produce vs consume rate: /default/audit" in titles
    assert all(png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 2000 for _, png in page.images)


def test_a_damaged_snapshot_file_is_named(traffic: Traffic, tmp_path: Path) -> None:
    copy = tmp_path / "snapshots"
    shutil.copytree(traffic.url, copy)
    store = SnapshotStore(str(copy))
    victim = store.manifest(store.snapshot_ids()[-1]).topics[0].files[0].path
    (copy / victim).write_bytes(b"PAR1 not really parquet")
    for engine in (["--master", "local[2]"], ["--engine", "python"]):
        done = danube_report("--snapshots", str(copy), *engine, "--format", "json")
        assert done.returncode == 1, engine
        assert "error:" in done.stderr and victim in done.stderr and "cannot be read" in done.stderr, engine
    done = danube_report("--snapshots", str(tmp_path / "nothing-here"), "--format", "csv")
    assert done.returncode == 1 and "no snapshot at" in done.stderr


def test_the_same_report_on_a_standalone_cluster(traffic: Traffic, spark_standalone: SparkCluster) -> None:
    before = apps(spark_standalone)
    done = danube_report("--snapshots", traffic.url, "--master", spark_standalone.url, "--format", "json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    got = {f"{s['topic']}:{s['subscription']}": s["backlog_messages"] for s in report["subscriptions"]}
    assert got["/default/audit:workers"] == 470 and got["/default/orders:billing"] == 160
    assert apps(spark_standalone) - before  # the worker ran the report's executors


def test_published_backlog_weighs_in_the_load_manager(traffic: Traffic, tmp_path: Path) -> None:
    """`--publish` writes each topic's backlog into the metadata store; the load manager
    then counts it in the broker's load (a topic's load grows 0.2 per 10,000 messages).
    The broker publishes no load report of its own in the test's time, so the backlog
    comes from the report alone (the Python engine's, whose rows equal Spark's: above)."""
    broker = start_broker(traffic.root, env={**SMALL_SEGMENTS, "DANUBE_LOAD_MANAGER__REPORT_INTERVAL_MS": "3600000"})
    try:
        async def balance() -> float:
            # Just started, the broker may not know yet that it leads (UNAVAILABLE,
            # "retry"): retried as a user would.
            deadline = time.monotonic() + 60
            async with AdminClient(broker.admin_url) as admin:
                while True:
                    try:
                        return (await admin.cluster_balance()).mean_load
                    except Unavailable:
                        if time.monotonic() > deadline:
                            raise
                        await asyncio.sleep(0.2)

        before = asyncio.run(balance())
        done = danube_report("--snapshots", traffic.url, "--engine", "python", "--format", "json",
                             "--publish", broker.admin_url)
        assert done.returncode == 0, done.stderr
        published = asyncio.run(_published(broker.admin_url))
        expected = {name: sum(backlog for backlog, _ in subs.values()) for name, subs in traffic.described.items()}
        assert published == expected
        after = asyncio.run(balance())
        assert after > before
    finally:
        assert broker.stop() == 0, broker.log()


async def _published(admin_url: str) -> dict[str, int]:
    from danube_zmq.transport import cluster_records as cr

    async with AdminClient(admin_url) as admin:
        entry = await admin.metadata_get(cr.BACKLOG_REPORT)
    assert entry is not None
    record = cr.decode(entry.value, cr.BacklogReportRecord)
    return {t.topic: t.backlog_messages for t in record.topics}


def test_payloads_need_a_snapshot_holding_them_and_streams_are_refused(traffic: Traffic, spark: Any) -> None:
    """The fixture's snapshots were taken without `snapshots.include_payloads`."""
    payloads = spark.read.format("danube_snapshots").option("path", traffic.url).option("payload", "true").load()
    with pytest.raises(Exception, match=r"taken without payloads(.|\n)*DANUBE_SNAPSHOTS__INCLUDE_PAYLOADS=true"):
        payloads.collect()
    query = spark.readStream.format("danube_snapshots").option("path", traffic.url).load().writeStream.format("noop").start()
    try:
        with pytest.raises(Exception, match=r"reads snapshots in batch only(.|\n)*use spark.read.format"):
            query.awaitTermination(120)
    finally:
        query.stop()

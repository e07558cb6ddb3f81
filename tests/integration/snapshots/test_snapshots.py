"""WAL snapshots against a real broker: known traffic on reliable topics (partitions,
several segments, subscriptions acked to known points, Shared with holes), snapshots
taken with `danube admin snapshots create`, and their Parquet files and manifests checked
record by record against what the broker itself reports."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from danube_zmq import DanubeClient, SubType
from danube_zmq.client.admin import AdminClient
from danube_zmq.snapshots.manifest import Manifest
from danube_zmq.snapshots.store import SnapshotStore
from tests.integration.conftest import BrokerProcess
from tests.integration.storage.test_durable_topics import broker_env

SMALL_SEGMENTS = {"DANUBE_STORAGE__WAL_SEGMENT_BYTES_MAX": "8192", "DANUBE_SNAPSHOTS__RETENTION_COUNT": "3",
                  "DANUBE_STORAGE__CURSOR_FLUSH_INTERVAL_MS": "50"}


def danube(broker: BrokerProcess, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "danube_zmq.cli.main", "admin", "--endpoint", broker.admin_url,
                           "snapshots", *args], capture_output=True, text=True, timeout=120)


async def produce_known_traffic(url: str) -> None:
    async with DanubeClient(url) as client:
        # Small batches: a WAL segment rolls between batches, so these make several segments.
        orders = await client.create_producer("/default/orders", dispatch="reliable", partitions=2,
                                              batch_messages_max=25)
        audit = await client.create_producer("/default/audit", dispatch="reliable", batch_messages_max=25)
        idle = await client.subscribe("/default/orders", "idle", sub_type=SubType.SHARED)  # never acks
        await idle.close()
        for i in range(400):
            orders.send_nowait(f"order-{i:04d}".encode() * 3, key=f"k{i % 7}", attributes={"n": str(i)})
            audit.send_nowait(f"audit-{i}".encode())
        await orders.flush()
        await audit.flush()
        # Exclusive, acked up to offset 119 on each partition.
        billing = await client.subscribe("/default/orders", "billing", sub_type=SubType.EXCLUSIVE,
                                         initial_position="earliest")
        taken = 0
        while taken < 240:
            msg = await billing.receive(timeout=10)
            if msg.offset < 120:
                await billing.ack(msg)
                taken += 1
        await billing.flush_acks()
        await billing.close()
        # Shared with holes: every odd offset of the first 60 acked.
        shared = await client.subscribe("/default/audit", "workers", sub_type=SubType.SHARED,
                                        initial_position="earliest", receiver_queue_size=60)
        seen = 0
        while seen < 60:
            msg = await shared.receive(timeout=10)
            seen += 1
            if msg.offset % 2 == 1 and msg.offset < 60:
                await shared.ack(msg)
        await shared.flush_acks()
        await shared.close()
    await asyncio.sleep(0.5)  # cursors reach the broker (flushed every 50 ms)


def parquet_rows(store: SnapshotStore, manifest: Manifest, topic: str) -> list[dict[str, object]]:
    state = next(t for t in manifest.topics if t.topic == topic)
    rows: list[dict[str, object]] = []
    for ref in state.files:
        with store.open_read(ref.path) as file:
            rows += pq.read_table(file).to_pylist()
    return rows


async def test_snapshot_holds_every_record_and_the_subscriptions_as_the_broker_sees_them(broker_factory,
                                                                                        tmp_path: Path) -> None:
    broker = broker_factory(env=SMALL_SEGMENTS)
    await produce_known_traffic(broker.url)

    out = danube(broker, "create", "-o", "json")
    assert out.returncode == 0, out.stderr
    created = json.loads(out.stdout)
    assert created["snapshot"]["topics"] == 3 and created["snapshot"]["records"] == 800
    assert created["files_shared"] == 0 and created["files_written"] == created["snapshot"]["files"] > 3

    store = SnapshotStore(str(tmp_path / "data" / "snapshots"))
    manifest = store.manifest(created["snapshot"]["snapshot_id"])
    async with AdminClient(broker.admin_url) as admin:
        described = {p.name: p for name in ("/default/orders", "/default/audit")
                     for p in (await admin.describe_topic(name)).partitions}
    for topic in manifest.topics:
        rows = parquet_rows(store, manifest, topic.topic)
        assert [r["offset"] for r in rows] == list(range(topic.log_start_offset, topic.end_offset))
        assert topic.end_offset == described[topic.topic].next_offset
        assert all(r["topic"] == topic.topic and r["payload"] is None for r in rows)
        for sub in topic.subscriptions:
            broker_view = next(s for s in described[topic.topic].subscriptions if s.name == sub.name)
            backlog = [r for r in rows if r["offset"] > sub.cursor and r["offset"] not in sub.acked_above]
            assert (sub.cursor, len(backlog), sub.backlog_messages) == \
                (broker_view.cursor, broker_view.backlog_messages, broker_view.backlog_messages)
            if not sub.acked_above:  # no holes: the broker's byte count is exact too
                assert sum(r["record_bytes"] for r in backlog) == broker_view.backlog_bytes
    orders0 = parquet_rows(store, manifest, "/default/orders-part-0")
    assert orders0[0]["key"] is not None and orders0[0]["attributes"] and orders0[0]["size"] == 30
    audit = next(t for t in manifest.topics if t.topic == "/default/audit")
    workers = next(s for s in audit.subscriptions if s.name == "workers")
    assert (workers.cursor, workers.sub_type) == (-1, "shared") and workers.acked_above[:3] == [1, 3, 5]
    assert {s.name for s in next(t for t in manifest.topics if t.topic == "/default/orders-part-1").subscriptions} \
        == {"idle", "billing"}

    # The next snapshot shares the sealed segments' files; retention keeps the newest 3.
    for _ in range(3):
        out = danube(broker, "create", "--topic", "/default/orders", "-o", "json")
        assert out.returncode == 0, out.stderr
    again = json.loads(out.stdout)
    assert again["files_shared"] > 0 and again["snapshot"]["topics"] == 2
    out = danube(broker, "list", "-o", "json")
    listed = json.loads(out.stdout)["snapshots"]
    assert len(listed) == 3 and created["snapshot"]["snapshot_id"] not in [s["snapshot_id"] for s in listed]
    out = danube(broker, "describe", listed[-1]["snapshot_id"])
    assert out.returncode == 0 and "/default/orders-part-0" in out.stdout and "billing" in out.stdout, out.stderr
    out = danube(broker, "delete", listed[0]["snapshot_id"])
    assert out.returncode == 0, out.stderr
    out = danube(broker, "describe", listed[0]["snapshot_id"])
    assert out.returncode == 1 and "not found" in out.stderr
    out = danube(broker, "create", "--topic", "/nothing/*")
    assert out.returncode == 1 and "no reliable topic" in out.stderr
    # Shared segment files still named by a manifest survive the deletions.
    for snapshot_id in store.snapshot_ids():
        assert all(store.exists(f.path) for f in store.manifest(snapshot_id).files)


async def test_snapshots_on_a_schedule_and_a_damaged_segment_left_out(broker_factory, tmp_path: Path) -> None:
    broker = broker_factory(env={**SMALL_SEGMENTS, "DANUBE_SNAPSHOTS__INTERVAL_SECONDS": "1"})
    async with DanubeClient(broker.url) as client:
        for name in ("good", "bad"):
            producer = await client.create_producer(f"/default/{name}", dispatch="reliable", batch_messages_max=25)
            for i in range(300):
                producer.send_nowait(f"{name}-{i}".encode() * 4)
            await producer.flush()
    store = SnapshotStore(str(tmp_path / "data" / "snapshots"))
    for _ in range(100):
        if store.snapshot_ids():
            break
        await asyncio.sleep(0.1)
    assert store.snapshot_ids(), "no scheduled snapshot within 10 s"
    # Damage a sealed WAL segment of /default/bad: its records there no longer check.
    segments = sorted((tmp_path / "data").glob("**/default/bad/*.wal"))
    assert len(segments) > 1
    data = bytearray(segments[0].read_bytes())
    data[40] ^= 0xFF
    segments[0].write_bytes(bytes(data))
    for path in store.fs.find(store.path("segments")):  # no already-exported copy to fall back on
        store.fs.rm(path)
    out = danube(broker, "create", "-o", "json")
    assert out.returncode == 0, out.stderr
    manifest = store.manifest(json.loads(out.stdout)["snapshot"]["snapshot_id"])
    assert [t.topic for t in manifest.topics] == ["/default/good"]
    assert len(manifest.errors) == 1 and "/default/bad" in manifest.errors[0] and ".wal" in manifest.errors[0] \
        and "damaged at byte" in manifest.errors[0]


@pytest.fixture(params=["s3", "az", "gs"])
def object_store(request: pytest.FixtureRequest) -> tuple[str, dict[str, object]]:
    url, options = request.getfixturevalue({"s3": "moto_store", "az": "azurite_store", "gs": "gcs_store"}[request.param])
    return f"{url.rsplit('/', 1)[0]}/snapshots-{request.node.name.rsplit('[', 1)[1].rstrip(']')}", options


async def test_snapshots_to_an_object_store(broker_factory, object_store: tuple[str, dict[str, object]]) -> None:
    """The same snapshot in s3://, az:// and gs:// (real emulators), read back from there."""
    url, options = object_store
    env = {**broker_env("object_store", url, options), **SMALL_SEGMENTS, "DANUBE_STORAGE__MODE": "local",
           "DANUBE_SNAPSHOTS__URL": url}
    del env["DANUBE_STORAGE__DURABLE_URL"]
    broker = broker_factory(env=env)
    async with DanubeClient(broker.url) as client:
        producer = await client.create_producer("/default/remote", dispatch="reliable", batch_messages_max=25)
        for i in range(300):
            producer.send_nowait(f"remote-{i}".encode())
        await producer.flush()
    out = danube(broker, "create", "-o", "json")
    assert out.returncode == 0, out.stderr
    created = json.loads(out.stdout)
    store = SnapshotStore(url, **options)
    manifest = store.manifest(created["snapshot"]["snapshot_id"])
    [topic] = manifest.topics
    rows = [r for f in topic.files for r in pq.read_table(store.open_read(f.path)).to_pylist()]
    assert [r["offset"] for r in rows] == list(range(300)) and len(topic.files) > 1
    out = danube(broker, "list", "-o", "json")
    assert json.loads(out.stdout)["url"] == url and len(json.loads(out.stdout)["snapshots"]) == 1


async def test_retention_counts_snapshots_of_earlier_runs_of_the_broker(broker_factory, tmp_path: Path) -> None:
    env = {"DANUBE_SNAPSHOTS__RETENTION_COUNT": "2"}
    broker = broker_factory(env=env)
    first = [json.loads(danube(broker, "create", "-o", "json").stdout)["snapshot"]["snapshot_id"] for _ in range(2)]
    assert broker.stop() == 0
    broker = broker_factory(env=env, url=broker.url, admin_url=broker.admin_url)
    latest = json.loads(danube(broker, "create", "-o", "json").stdout)["snapshot"]["snapshot_id"]
    listed = [s["snapshot_id"] for s in json.loads(danube(broker, "list", "-o", "json").stdout)["snapshots"]]
    assert listed == [first[1], latest] and all(s.endswith("-n1") for s in listed)

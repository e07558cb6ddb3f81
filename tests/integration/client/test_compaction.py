"""Topic compaction against real broker processes, as a Pulsar user tries it: an
admin compacts a reliable topic (`AdminClient.compact_topic`, `danube admin topics
compact`) while producers keep writing; readers and Exclusive subscriptions with
`read_compacted` get the latest message per key (an empty payload deletes its key,
messages without a key pass), then the live tail; the view survives kill -9 and moves
to another broker (local and shared_fs); Shared subscriptions and non-reliable topics
are refused by name."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from danube_zmq import DanubeClient
from danube_zmq.client.admin import AdminClient
from danube_zmq.client.reader import Reader
from danube_zmq.storage.wal.compacted import ledger_file_name
from danube_zmq.transport.client_protocol import DispatchStrategy
from danube_zmq.transport.errors import FailedPrecondition, InvalidArgument, Timeout
from tests.integration.actors.test_cluster import _owners, running_cluster


async def _publish(producer, versions: int = 3) -> dict[str, bytes]:
    """Keys k0..k9 in `versions` rounds, then k3 deleted (empty payload) and two
    messages without a key; returns the latest value per live key."""
    latest: dict[str, bytes] = {}
    for round_ in range(versions):
        for k in range(10):
            value = f"k{k}-v{round_}".encode()
            await producer.send(value, key=f"k{k}")
            latest[f"k{k}"] = value
    await producer.send(b"", key="k3")
    del latest["k3"]
    await producer.send(b"no-key-1")
    await producer.send(b"no-key-2")
    return latest


async def _read_until_quiet(source, quiet_s: float = 1.5) -> list:
    """What a reader reads, or a consumer receives (acknowledged), until `quiet_s` of silence."""
    reader = isinstance(source, Reader)
    out = []
    while True:
        try:
            message = await (source.read_next(timeout=quiet_s) if reader else source.receive(timeout=quiet_s))
        except Timeout:
            return out
        out.append(message)
        if not reader:
            await source.ack(message)


def broker_data(broker) -> Path:
    return broker.log_path.parent / "data"  # `start_broker`'s --data-dir


def _view(messages) -> list[tuple[str | None, bytes]]:
    return [(m.key, m.payload) for m in messages]


def _expected(latest: dict[str, bytes]) -> list[tuple[str | None, bytes]]:
    """The compacted view of `_publish`, in offset order: the last round's keys (k3
    gone), then the keyless messages."""
    return [(key, value) for key, value in latest.items()] + [(None, b"no-key-1"), (None, b"no-key-2")]


async def test_a_compacted_topic_reads_the_latest_message_per_key_then_the_tail(broker_factory) -> None:
    """30 messages over 10 keys, a tombstone and 2 keyless ones, compacted: a
    read_compacted reader gets 11 (each key's last value but the deleted one, in offset
    order), then every message sent after; a plain reader still gets all 33."""
    broker = broker_factory()
    topic = "/default/compacted"
    async with DanubeClient(broker.url) as client, AdminClient(broker.admin_url) as admin:
        producer = await client.create_producer(topic, dispatch="reliable")
        latest = await _publish(producer)
        await admin.compact_topic(topic)
        described = await admin.wait_for_compaction(topic, timeout_s=60)
        (partition,) = described.partitions
        assert partition.compaction == "done" and partition.compaction_horizon == 33

        reader = await client.create_reader(topic, start="earliest", read_compacted=True)
        view = await _read_until_quiet(reader)
        assert _view(view) == _expected(latest)
        assert [m.offset for m in view] == sorted(m.offset for m in view)
        await producer.send(b"k0-v9", key="k0")
        await producer.send(b"k0-v10", key="k0")
        tail = [await reader.read_next(timeout=10) for _ in range(2)]
        assert [m.payload for m in tail] == [b"k0-v9", b"k0-v10"]

        plain = await client.create_reader(topic, start="earliest")
        assert len(await _read_until_quiet(plain)) == 35


async def test_a_broker_killed_mid_compaction_keeps_the_previous_view(broker_factory) -> None:
    """kill -9 while a compaction writes: the restarted broker serves the view it had
    (none here: "never"), leaves no partial file behind, and compacts again."""
    broker = broker_factory()
    topic = "/default/compacted-cut"
    async with DanubeClient(broker.url) as client, AdminClient(broker.admin_url) as admin:
        producer = await client.create_producer(topic, dispatch="reliable", pending_messages_max=50_000)
        for i in range(200_000):
            producer.send_nowait(b"v" * 100, key=f"k{i % 1000}")
            if i % 20_000 == 19_999:
                await producer.flush()
        await admin.compact_topic(topic)
        assert (await admin.describe_topic(topic)).partitions[0].compaction == "running"
    broker.stop(signal.SIGKILL)
    leftovers = [p.name for p in broker_data(broker).rglob("*") if p.name.endswith(".tmp")
                 or p.name.startswith(".compacting-") or p.name.endswith(".compacted")]
    # Whichever phase the kill cut, what a writer killed in the second leaves: its .tmp.
    wal_dir = next(broker_data(broker).rglob("*.wal")).parent
    (wal_dir / (ledger_file_name(200_000) + ".tmp")).write_bytes(b"cut short")
    broker = broker_factory(url=broker.url, admin_url=broker.admin_url)
    async with DanubeClient(broker.url) as client, AdminClient(broker.admin_url) as admin:
        assert (await admin.describe_topic(topic)).partitions[0].compaction == "never", leftovers
        assert not [p for p in broker_data(broker).rglob("*") if p.name.endswith(".tmp")
                    or p.name.startswith(".compacting-")]
        await admin.compact_topic(topic)
        described = await admin.wait_for_compaction(topic, timeout_s=120)
        assert described.partitions[0].compaction_horizon == 200_000
        reader = await client.create_reader(topic, start="earliest", read_compacted=True)
        assert len(await _read_until_quiet(reader)) == 1000


async def test_a_partitioned_topic_is_compacted_partition_by_partition(broker_factory) -> None:
    """Each partition has its own view (a key lives in one partition); a reader of the
    partitioned topic gets each key's latest value once."""
    broker = broker_factory()
    topic = "/default/compacted-parts"
    async with DanubeClient(broker.url) as client, AdminClient(broker.admin_url) as admin:
        await admin.create_topic(topic, 3, DispatchStrategy.RELIABLE)
        producer = await client.create_producer(topic, dispatch="reliable")
        latest = await _publish(producer)
        await admin.compact_topic(topic)
        described = await admin.wait_for_compaction(topic, timeout_s=60)
        assert [p.compaction for p in described.partitions] == ["done"] * 3
        reader = await client.create_reader(topic, start="earliest", read_compacted=True)
        view = _view(await _read_until_quiet(reader))
        assert sorted(view, key=repr) == sorted(_expected(latest), key=repr)


async def test_producers_keep_writing_while_a_topic_is_compacted(broker_factory) -> None:
    """Compaction runs beside the topic: sends during it are acknowledged, and a second
    compaction takes what came since (a key rewritten after the first horizon shows
    its new value)."""
    broker = broker_factory()
    topic = "/default/compacted-live"
    async with DanubeClient(broker.url) as client, AdminClient(broker.admin_url) as admin:
        producer = await client.create_producer(topic, dispatch="reliable")
        for i in range(3000):
            producer.send_nowait(f"v{i}".encode(), key=f"k{i % 100}")
            if i % 500 == 499:
                await producer.flush()
        await admin.compact_topic(topic)
        sends = [await producer.send(f"during{i}".encode(), key=f"k{i}") for i in range(50)]
        assert len(sends) == 50
        await admin.wait_for_compaction(topic, timeout_s=60)
        await admin.compact_topic(topic)
        described = await admin.wait_for_compaction(topic, timeout_s=60)
        assert described.partitions[0].compaction_horizon == 3050
        consumer = await client.subscribe(topic, "view", sub_type="exclusive", initial_position="earliest",
                                          read_compacted=True)
        view = dict(_view(await _read_until_quiet(consumer)))
        assert len(view) == 100
        assert view["k7"] == b"during7" and view["k99"] == b"v2999"


async def test_the_compacted_view_survives_kill_9(broker_factory) -> None:
    """The ledger is a file beside the WAL, whole or absent: after kill -9 and a
    restart on the same data the view is the same. A durable subscription made before
    (its topic reads ahead from the log at the restart, before any consumer) gives the
    view to a consumer that attaches with read_compacted."""
    broker = broker_factory()
    topic = "/default/compacted-crash"
    async with DanubeClient(broker.url) as client, AdminClient(broker.admin_url) as admin:
        kept = await client.subscribe(topic, "kept", sub_type="exclusive", initial_position="earliest")
        await kept.close()
        producer = await client.create_producer(topic, dispatch="reliable")
        latest = await _publish(producer)
        await admin.compact_topic(topic)
        await admin.wait_for_compaction(topic, timeout_s=60)
    broker.stop(signal.SIGKILL)
    broker = broker_factory(url=broker.url, admin_url=broker.admin_url)
    async with DanubeClient(broker.url) as client, AdminClient(broker.admin_url) as admin:
        described = await admin.describe_topic(topic)
        assert described.partitions[0].compaction == "done"
        reader = await client.create_reader(topic, start="earliest", read_compacted=True)
        assert _view(await _read_until_quiet(reader)) == _expected(latest)
        await asyncio.sleep(0.5)  # the kept subscription has read ahead from the log
        consumer = await client.subscribe(topic, "kept", sub_type="exclusive", read_compacted=True)
        assert _view(await _read_until_quiet(consumer)) == _expected(latest)


async def test_a_topic_compacts_itself_past_its_threshold(broker_factory) -> None:
    """The topic policy `compaction_threshold_bytes` (Pulsar's compactionThreshold):
    nothing happens below it; past it the topic compacts at its next check, and again
    once as many bytes came after that horizon."""
    broker = broker_factory(env={"DANUBE_STORAGE__RETENTION_CHECK_INTERVAL_MS": "100"})
    topic = "/default/compacted-auto"
    async with DanubeClient(broker.url) as client, AdminClient(broker.admin_url) as admin:
        producer = await client.create_producer(topic, dispatch="reliable")
        await admin.set_topic_policies(topic, compaction_threshold_bytes=20_000)
        for i in range(10):
            await producer.send(b"x" * 1000, key=f"k{i}")
        await asyncio.sleep(0.5)
        assert (await admin.describe_topic(topic)).partitions[0].compaction == "never"
        for i in range(30):
            await producer.send(b"y" * 1000, key=f"k{i % 10}")
        # A compaction needs 20 messages (of about 1,030 bytes in the log) past the last
        # horizon: it may start while the sends go on, so each horizon is 20 past the last.
        horizon = await _horizon_reaches(admin, topic, 20)
        for i in range(30):
            await producer.send(b"z" * 1000, key=f"k{i % 10}")
        await _horizon_reaches(admin, topic, horizon + 20)


async def _horizon_reaches(admin: AdminClient, topic: str, at_least: int) -> int:
    for _ in range(100):
        partition = (await admin.describe_topic(topic)).partitions[0]
        if partition.compaction == "done" and (partition.compaction_horizon or 0) >= at_least:
            return partition.compaction_horizon
        await asyncio.sleep(0.1)
    raise AssertionError(f"not compacted to {at_least}: {partition.compaction} at {partition.compaction_horizon}")


async def test_the_view_outlives_the_log_retention_deletes(broker_factory) -> None:
    """Retention deletes the log's old segments (no subscription holds them); a
    read_compacted reader still gets every key's latest value, a plain one only what
    the log still holds."""
    broker = broker_factory(env={"DANUBE_STORAGE__RETENTION_CHECK_INTERVAL_MS": "100",
                                 "DANUBE_STORAGE__WAL_SEGMENT_BYTES_MAX": "4096"})
    topic = "/default/compacted-retained"
    async with DanubeClient(broker.url) as client, AdminClient(broker.admin_url) as admin:
        producer = await client.create_producer(topic, dispatch="reliable")
        latest = await _publish(producer)
        await admin.compact_topic(topic)
        await admin.wait_for_compaction(topic, timeout_s=60)
        await admin.set_topic_policies(topic, retention_time_ms=1)
        for _ in range(40):  # seals the segments that hold the first 33
            await producer.send(b"p" * 200, key="padding")
        for _ in range(100):
            plain = await client.create_reader(topic, start="earliest")
            first = await plain.read_next(timeout=10)
            await plain.close()
            if first.offset >= 33:
                break
            await asyncio.sleep(0.1)
        else:
            raise AssertionError(f"retention kept the log from offset {first.offset}")
        reader = await client.create_reader(topic, start="earliest", read_compacted=True)
        view = _view(await _read_until_quiet(reader))
        assert view[:11] == _expected(latest)


async def test_compaction_is_refused_where_it_does_not_apply(broker_factory) -> None:
    """A non-reliable topic cannot be compacted or read compacted; a Shared or
    Key-Shared subscription cannot read compacted (as in Pulsar)."""
    broker = broker_factory()
    async with DanubeClient(broker.url) as client, AdminClient(broker.admin_url) as admin:
        producer = await client.create_producer("/default/fast", dispatch="non_reliable")
        await producer.send(b"x", key="k")
        with pytest.raises(FailedPrecondition, match="not reliable"):
            await admin.compact_topic("/default/fast")
        with pytest.raises(FailedPrecondition, match="not reliable"):
            await client.subscribe("/default/fast", "s", sub_type="exclusive", read_compacted=True)
        for sub_type in ("shared", "key_shared"):
            with pytest.raises(InvalidArgument, match="exclusive and failover"):
                await client.subscribe("/default/fast", "s", sub_type=sub_type, read_compacted=True)


async def test_the_cli_compacts_and_describes(broker_factory) -> None:
    """`danube admin topics compact TOPIC --wait` prints each partition's horizon;
    `topics describe` shows the compaction table, and its JSON the fields; `danube
    consume --reader --read-compacted` reads the view."""
    broker = broker_factory()
    topic = "/default/compacted-cli"
    async with DanubeClient(broker.url) as client:
        producer = await client.create_producer(topic, dispatch="reliable")
        latest = await _publish(producer, versions=1)
    admin = [sys.executable, "-m", "danube_zmq.cli.main", "admin", "--endpoint", broker.admin_url, "topics"]

    def run(*args: str) -> str:
        done = subprocess.run([*admin, *args], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        return done.stdout

    out = await asyncio.to_thread(run, "compact", topic, "--wait")
    assert f"{topic}: compacted below offset 13" in out
    described = await asyncio.to_thread(run, "describe", topic)
    assert "Compaction" in described and "done" in described
    as_json = json.loads(await asyncio.to_thread(run, "describe", topic, "--output", "json"))
    assert as_json["partitions"][0]["compaction_horizon"] == 13
    read = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-m", "danube_zmq.cli.main", "consume", "-s", broker.url, "-t", topic,
                         "--reader", "--start", "earliest", "--read-compacted", "--timeout", "2", "--json"],
        capture_output=True, text=True, timeout=120)
    assert read.returncode == 0, read.stderr
    lines = [json.loads(line) for line in read.stdout.splitlines()]
    assert [(m["key"], m["payload"]) for m in lines] == [(k, v.decode()) for k, v in _expected(latest)]


def _ledger_objects(shared: Path, topic: str) -> list[str]:
    return sorted(path.name for path in (shared / topic.strip("/")).glob("*.compacted"))


@pytest.mark.cluster
@pytest.mark.parametrize("mode", ["local", "shared_fs"])
def test_the_compacted_view_moves_with_its_topic(tmp_path: Path, mode: str) -> None:
    """Two brokers, 64 KiB WAL segments: 600 messages of 1 KiB over keys k0..k9 span
    several segments and are compacted, then `_publish` overwrites every key and is
    compacted again, and one more message comes after that horizon. `topics unload`
    moves the topic to the other broker (local: the WAL handed over with the ledger;
    shared_fs: the ledger uploaded under the topic's prefix, the older one deleted, and
    downloaded by the next broker): there a read_compacted reader reads exactly the view,
    then the message after the horizon, and `topics describe` shows the same horizon.
    In shared_fs, deleting the topic deletes its ledger object."""
    shared = tmp_path / "shared"
    env = {"DANUBE_STORAGE__WAL_SEGMENT_BYTES_MAX": "65536"}
    if mode == "shared_fs":
        env |= {"DANUBE_STORAGE__MODE": "shared_fs", "DANUBE_STORAGE__DURABLE_URL": str(shared)}
    topic = f"/default/compacted-moved-{mode}"

    async def run(nodes: list) -> None:
        owners = {node.url: node for node in nodes}
        async with AdminClient(nodes[0].admin_url) as admin:
            await admin.create_topic(topic, dispatch_strategy=DispatchStrategy.RELIABLE)
        before = (await _owners(nodes[0], [topic]))[topic]
        async with DanubeClient(nodes[0].url, operation_retries_max=10) as client, \
                AdminClient(owners[before].admin_url) as admin:
            producer = await client.create_producer(topic, dispatch="reliable")
            for i in range(600):
                producer.send_nowait(f"{i}:".encode() + b"x" * 1000, key=f"k{i % 10}")
            await producer.flush()
            await admin.compact_topic(topic)
            await admin.wait_for_compaction(topic, timeout_s=60)
            latest = await _publish(producer)
            await admin.compact_topic(topic)
            described = await admin.wait_for_compaction(topic, timeout_s=60)
            assert described.partitions[0].compaction_horizon == 633
            if mode == "shared_fs":
                assert _ledger_objects(shared, topic) == [ledger_file_name(633)]
            await producer.send(b"k1-after", key="k1")  # past the horizon: the log's, not the view's
            await admin.unload_topic(topic)
        deadline = time.monotonic() + 30
        while (after := (await _owners(nodes[0], [topic]))[topic]) == before:
            assert time.monotonic() < deadline, "the topic did not move"
            await asyncio.sleep(0.2)
        async with DanubeClient(nodes[0].url, operation_retries_max=10) as client, \
                AdminClient(owners[after].admin_url) as admin:
            reader = await client.create_reader(topic, start="earliest", read_compacted=True)
            assert _view(await _read_until_quiet(reader)) == [*_expected(latest), ("k1", b"k1-after")]
            (partition,) = (await admin.describe_topic(topic)).partitions
            assert (partition.compaction, partition.compaction_horizon) == ("done", 633)
            if mode == "shared_fs":
                await reader.close()
                await admin.delete_topic(topic)
                assert _ledger_objects(shared, topic) == []

    with running_cluster(tmp_path, env, size=2) as nodes:
        asyncio.run(run(nodes))

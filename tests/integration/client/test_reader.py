"""Readers (Pulsar's Reader) against real broker processes: `create_reader` from
earliest, latest, an offset and a publish time, `has_message_available`, `seek`,
partitioned topics, the sync client and `danube consume --reader`; a reader keeps
nothing on the broker (no subscription left behind, none after a restart, no log held
back from retention) and reads on across a broker restart without a gap or a repeat."""

from __future__ import annotations

import asyncio
import json
import shutil
import signal
import time

import pytest

from danube_zmq import DanubeClient, SubType, SyncClient
from danube_zmq.client.admin import AdminClient
from danube_zmq.transport.errors import FailedPrecondition, InvalidArgument, Timeout
from tests.integration.cli.test_cli_e2e import danube
from tests.integration.storage.test_durable_topics import broker_env, local_segments, wait_until

TOPIC = "/default/read"


async def _produce(client: DanubeClient, topic: str, payloads: list[bytes]) -> list[int]:
    producer = await client.create_producer(topic, dispatch="reliable")
    offsets = [(await producer.send(p)).offset for p in payloads]
    await producer.close()
    return offsets


async def _read_all(reader, timeout: float = 1.0) -> list[bytes]:  # type: ignore[no-untyped-def]
    read = []
    while True:
        try:
            read.append((await reader.read_next(timeout=timeout)).payload)
        except Timeout:
            return read


async def _subscriptions(admin: AdminClient, topic: str) -> list[str]:
    return sorted(await admin.list_subscriptions(topic))


async def test_a_reader_reads_from_each_start_and_says_when_more_is_there(broker) -> None:
    """Ten messages: a reader from earliest reads them all, in order, and then has
    none available until one more is sent; one from offset 7 reads 7..; one from
    latest only what comes after it; one from a publish time what was published then
    or later; `seek` goes back. While open a reader shows as a subscription of its
    own; once closed none is left."""
    async with DanubeClient(broker.url) as client, AdminClient(broker.admin_url) as admin:
        await _produce(client, TOPIC, [f"m{i}".encode() for i in range(5)])
        middle = int(time.time() * 1000)
        await asyncio.sleep(0.01)
        await _produce(client, TOPIC, [f"m{i}".encode() for i in range(5, 10)])

        earliest = await client.create_reader(TOPIC, start="earliest")
        assert await earliest.has_message_available()
        assert await _read_all(earliest) == [f"m{i}".encode() for i in range(10)]
        assert not await earliest.has_message_available()
        latest = await client.create_reader(TOPIC, start="latest")
        assert not await latest.has_message_available()
        at_seven = await client.create_reader(TOPIC, start=7)
        by_time = await client.create_reader(TOPIC, start_publish_time_ms=middle)
        readers = await _subscriptions(admin, TOPIC)
        assert len(readers) == 4 and all(name.startswith("reader-") for name in readers), readers

        await _produce(client, TOPIC, [b"m10"])
        assert await earliest.has_message_available()
        assert (await earliest.read_next(timeout=10)).payload == b"m10"
        assert await latest.has_message_available()
        assert await _read_all(latest) == [b"m10"]
        assert await _read_all(at_seven) == [b"m7", b"m8", b"m9", b"m10"]
        assert await _read_all(by_time) == [f"m{i}".encode() for i in range(5, 11)]
        await earliest.seek(offset=2)
        assert (await earliest.read_next(timeout=10)).payload == b"m2"

        for reader in (earliest, latest, at_seven, by_time):
            await reader.close()
        await wait_until_async(lambda: _subscriptions(admin, TOPIC), [], "the readers' subscriptions to go")


async def wait_until_async(get, want, what: str, timeout_s: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while (got := await get()) != want:
        assert time.monotonic() < deadline, f"{what}: {got}"
        await asyncio.sleep(0.1)


async def test_bad_starts_and_non_reliable_topics_are_clear_errors(broker) -> None:
    async with DanubeClient(broker.url) as client:
        for start in ("first", -1, True):
            with pytest.raises(InvalidArgument, match="start must be"):
                await client.create_reader(TOPIC, start=start)  # type: ignore[arg-type]
        with pytest.raises(InvalidArgument, match="not both"):
            await client.create_reader(TOPIC, start="earliest", start_publish_time_ms=1)
        await client.create_producer("/default/fast", dispatch="non_reliable")
        with pytest.raises(FailedPrecondition, match="not reliable"):
            await client.create_reader("/default/fast", start="earliest")
        await _produce(client, TOPIC, [b"x"])
        with pytest.raises(InvalidArgument, match="outside"):
            await client.create_reader(TOPIC, start=99)


async def test_a_partitioned_topic_is_read_from_every_partition(broker) -> None:
    async with DanubeClient(broker.url) as client, AdminClient(broker.admin_url) as admin:
        await admin.create_topic("/default/parts", partitions=3, dispatch_strategy="reliable")
        producer = await client.create_producer("/default/parts", dispatch="reliable")
        for i in range(30):
            await producer.send(f"p{i}".encode(), key=f"k{i}")
        reader = await client.create_reader("/default/parts", start="earliest")
        assert sorted(await _read_all(reader)) == sorted(f"p{i}".encode() for i in range(30))
        assert not await reader.has_message_available()
        with pytest.raises(InvalidArgument, match="per partition"):
            await client.create_reader("/default/parts", start=0)


def test_the_sync_reader_and_the_cli_reader_read_from_earliest(broker) -> None:
    with SyncClient(broker.url) as client:
        producer = client.create_producer("/default/sync-read", dispatch="reliable")
        for i in range(3):
            producer.send(f"s{i}".encode())
        with client.create_reader("/default/sync-read", start="earliest") as reader:
            assert [reader.read_next(timeout=10).payload for _ in range(3)] == [b"s0", b"s1", b"s2"]
            assert not reader.has_message_available()
    done = danube("consume", "--service-url", broker.url, "-t", "/default/sync-read", "--reader", "--start", "1",
                  "--timeout", "2", "--json")
    assert done.returncode == 0, done.stderr
    assert [json.loads(line)["payload"] for line in done.stdout.splitlines()] == ["s1", "s2"]
    refused = danube("consume", "--service-url", broker.url, "-t", "/default/sync-read", "-m", "sub", "--reader")
    assert refused.returncode != 0 and "leave out -m" in refused.stderr


async def test_a_reader_reads_on_across_a_restart_and_leaves_nothing_behind(broker_factory) -> None:
    """A reader that read 4 of 10 messages when the broker is killed (kill -9) and
    starts again reads the other 6 once it is back, none twice; after a clean stop
    and start the broker keeps no subscription for it."""
    broker = broker_factory()
    async with DanubeClient(broker.url) as client:
        await _produce(client, TOPIC, [f"m{i}".encode() for i in range(10)])
        reader = await client.create_reader(TOPIC, start="earliest", receiver_queue_size=1)
        assert [(await reader.read_next(timeout=10)).payload for _ in range(4)] == [b"m0", b"m1", b"m2", b"m3"]
        assert broker.stop(signal.SIGKILL) == -signal.SIGKILL
        broker = broker_factory(url=broker.url, admin_url=broker.admin_url)
        rest = [(await reader.read_next(timeout=30)).payload for _ in range(6)]
        assert rest == [f"m{i}".encode() for i in range(4, 10)]
        assert not await reader.has_message_available()  # nothing read twice is waiting
        await reader.close()
    assert broker.stop(signal.SIGTERM) == 0
    again = broker_factory(url=broker.url, admin_url=broker.admin_url)
    async with AdminClient(again.admin_url) as admin:
        assert await _subscriptions(admin, TOPIC) == []


async def test_a_reader_holds_no_log_back_from_retention(broker_factory, tmp_path) -> None:
    """Sealed segments past the retention time go once the durable subscription has
    acknowledged them, though a reader opened at earliest has read only one message;
    that reader then reads on from what the log still holds."""
    broker = broker_factory(env={"DANUBE_STORAGE__WAL_SEGMENT_BYTES_MAX": str(32 * 1024),
                                 "DANUBE_STORAGE__RETENTION_TIME_MS": "1",
                                 "DANUBE_STORAGE__RETENTION_CHECK_INTERVAL_MS": "200"})
    wal_dir = tmp_path / "data" / "wal" / "default" / "kept"
    async with DanubeClient(broker.url) as client:
        consumer = await client.subscribe("/default/kept", "all", sub_type=SubType.EXCLUSIVE)
        await _produce(client, "/default/kept", [f"m{i:04d}".encode() + b"x" * 90 for i in range(2000)])
        reader = await client.create_reader("/default/kept", start="earliest", receiver_queue_size=1)
        assert (await reader.read_next(timeout=10)).payload.startswith(b"m0000")
        for _ in range(2000):
            await consumer.ack(await consumer.receive(timeout=10))
        await wait_until(lambda: len(local_segments(wal_dir)) == 1, 30, "the acknowledged segments to go")
        assert (await reader.read_next(timeout=10)).payload.startswith(b"m")  # it reads on


async def test_a_reader_reads_durable_history_after_the_local_wal_is_lost(broker_factory, tmp_path) -> None:
    """storage.mode shared_fs: 300 messages uploaded, the local WAL lost; a reader from
    earliest reads them all from durable segments, in order."""
    env = broker_env("shared_fs", str(tmp_path / "shared"), {})
    broker = broker_factory(env=env)
    async with DanubeClient(broker.url) as client:
        await _produce(client, "/default/history", [f"h{i:03d}".encode() + b"x" * 90 for i in range(300)])
    assert broker.stop(signal.SIGTERM) == 0
    shutil.rmtree(tmp_path / "data" / "wal" / "default" / "history")
    broker = broker_factory(env=env, url=broker.url, admin_url=broker.admin_url)
    async with DanubeClient(broker.url) as client:
        reader = await client.create_reader("/default/history", start="earliest")
        read = await _read_all(reader, timeout=5)
        assert [p[:4] for p in read] == [f"h{i:03d}".encode() for i in range(300)]


@pytest.mark.cluster
def test_a_reader_reads_on_when_its_topic_moves(tmp_path) -> None:
    """3 brokers: a reader that read 3 of 6 messages reads the other 3 after
    `topics unload` moved the topic to another broker, none twice."""
    from tests.integration.actors.test_cluster import _owners, running_cluster

    topic = "/default/read-moved"

    async def run(nodes) -> None:  # type: ignore[no-untyped-def]
        async with AdminClient(nodes[0].admin_url) as admin:
            await admin.create_topic(topic, dispatch_strategy="reliable")
        owner = (await _owners(nodes[0], [topic]))[topic]
        async with DanubeClient(nodes[0].url, operation_retries_max=3) as client, \
                AdminClient(nodes[1].admin_url) as admin:
            await _produce(client, topic, [f"m{i}".encode() for i in range(6)])
            reader = await client.create_reader(topic, start="earliest", receiver_queue_size=1)
            assert [(await reader.read_next(timeout=10)).payload for _ in range(3)] == [b"m0", b"m1", b"m2"]
            await admin.unload_topic(topic)
            deadline = time.monotonic() + 30
            while (await _owners(nodes[0], [topic]))[topic] == owner:
                assert time.monotonic() < deadline, "the topic did not move"
                await asyncio.sleep(0.2)
            assert [(await reader.read_next(timeout=30)).payload for _ in range(3)] == [b"m3", b"m4", b"m5"]
            assert not await reader.has_message_available()

    with running_cluster(tmp_path) as nodes:
        asyncio.run(run(nodes))


async def test_a_snapshot_holds_the_subscriptions_not_the_readers(broker_factory, tmp_path) -> None:
    """A WAL snapshot taken while a reader is open lists the topic's subscription and
    not the reader's: a backlog report counts what subscriptions hold back."""
    from danube_zmq.snapshots.store import SnapshotStore
    from tests.integration.snapshots.test_snapshots import danube as snapshots

    broker = broker_factory()
    async with DanubeClient(broker.url) as client:
        consumer = await client.subscribe(TOPIC, "kept", sub_type=SubType.EXCLUSIVE)
        await _produce(client, TOPIC, [b"a", b"b"])
        reader = await client.create_reader(TOPIC, start="earliest")
        assert (await reader.read_next(timeout=10)).payload == b"a"
        out = snapshots(broker, "create", "-o", "json")
        assert out.returncode == 0, out.stderr
        created = json.loads(out.stdout)
        await reader.close()
        await consumer.close()
    manifest = SnapshotStore(str(tmp_path / "data" / "snapshots")).manifest(created["snapshot"]["snapshot_id"])
    topic = next(t for t in manifest.topics if t.topic == TOPIC)
    assert [s.name for s in topic.subscriptions] == ["kept"]

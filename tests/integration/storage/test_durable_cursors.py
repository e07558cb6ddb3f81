"""Cursors out of the metadata store in the durable modes (`storage.cursors_in_segments`),
against three real broker processes sharing a shared_fs store: the cursors are
checkpoints in the topic's WAL, the sealed and uploaded segments carry them, and the
broker a topic moves to resumes every subscription from them."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from danube_zmq import DanubeClient, SubType
from danube_zmq.client.admin import AdminClient
from danube_zmq.clock import SystemClock
from danube_zmq.storage.catalog import topic_key
from danube_zmq.storage.wal import segment_checkpoints, segment_file_name
from danube_zmq.transport import cluster_records as cr
from danube_zmq.transport.client_protocol import DispatchStrategy
from danube_zmq.transport.errors import DanubeError
from tests.integration.actors.test_cluster import _owners, running_cluster
from tests.integration.actors.test_subscriptions import drain
from tests.integration.storage.test_reliable import describe_subscription

pytestmark = pytest.mark.cluster


def _uploaded_cursors(shared: Path, topic: str, suffix: str = ".seg") -> dict[str, int | None]:
    """The cursors the newest uploaded segment of `topic` carries (what a broker taking
    the topic over reads), by subscription; None: a deletion marker. `suffix` ".cursors":
    the newest checkpoints-only segment's."""
    namespace, name = topic.strip("/").split("/")
    segments = sorted((shared / namespace / name).glob(f"*{suffix}"))
    if not segments:
        return {}
    copy = shared.parent / "newest" / segment_file_name(int(segments[-1].name.split(".")[0]))
    copy.parent.mkdir(exist_ok=True)
    copy.write_bytes(segments[-1].read_bytes())  # a segment file is read by its WAL name
    found = segment_checkpoints([copy], SystemClock())
    return {sub: None if state is None else cr.decode_cursor(state).cursor for sub, state in found.items()}


def test_a_shared_fs_topic_moved_resumes_every_subscription_from_its_uploaded_checkpoints(tmp_path: Path) -> None:
    """shared_fs with `cursors_in_segments`: three subscriptions acknowledge 3, 7 and none
    of ten messages; the topic is unloaded as soon as the acknowledgements reached the
    subscriptions. The old broker writes its last checkpoints before it seals the active
    segment, so the uploaded segment carries every cursor; the next broker reads them from
    it and each subscription resumes right after its own acknowledged prefix. The
    metadata store's record of each subscription is the one written at its creation: no
    cursor write reached the store (its version never changed)."""
    shared = tmp_path / "shared"
    env = {"DANUBE_STORAGE__MODE": "shared_fs", "DANUBE_STORAGE__DURABLE_URL": str(shared),
           "DANUBE_STORAGE__CURSORS_IN_SEGMENTS": "true"}
    topic = "/default/durablecursors"
    acked = {"a": 3, "b": 7, "c": 0}

    async def run(nodes: list) -> None:
        async with AdminClient(nodes[0].admin_url) as admin:
            await admin.create_topic(topic, dispatch_strategy=DispatchStrategy.RELIABLE)
        first_owner = (await _owners(nodes[0], [topic]))[topic]
        owner_node = next(node for node in nodes if node.url == first_owner)
        async with DanubeClient(nodes[0].url) as client:
            producer = await client.create_producer(topic, dispatch="reliable")
            consumers = {name: await client.subscribe(topic, name, sub_type=SubType.EXCLUSIVE,
                                                      consumer_name=f"c{name}") for name in acked}
            async with AdminClient(nodes[0].admin_url) as admin:
                created = {}
                for name in acked:
                    deadline = time.monotonic() + 15
                    while (entry := await admin.metadata_get(f"{topic_key(topic)}/subscriptions/{name}")) is None:
                        assert time.monotonic() < deadline, f"subscription {name} never recorded"
                        await asyncio.sleep(0.1)
                    created[name] = entry.version
            for i in range(10):
                await producer.send(f"m{i}".encode())
            for name, count in acked.items():
                if count:
                    await drain(consumers[name], count)
                    await consumers[name].flush_acks()
            await _cursors_at(owner_node, topic, acked)
            for consumer in consumers.values():
                await consumer.close()
            async with AdminClient(nodes[0].admin_url) as admin:
                await admin.unload_topic(topic)
            await _moved(nodes[0], topic, first_owner)
        assert _uploaded_cursors(shared, topic) == {name: count - 1 for name, count in acked.items()}
        async with DanubeClient(nodes[0].url) as client:
            for name, count in acked.items():
                consumer = await client.subscribe(topic, name, sub_type=SubType.EXCLUSIVE, consumer_name=f"c{name}")
                got = await drain(consumer, 10 - count, timeout_s=20)
                assert [m.payload for m in got] == [f"m{i}".encode() for i in range(count, 10)], name
        async with AdminClient(nodes[0].admin_url) as admin:
            for name in acked:
                entry = await admin.metadata_get(f"{topic_key(topic)}/subscriptions/{name}")
                assert entry is not None and entry.version == created[name], f"a cursor of {name} written to the store"
                assert cr.decode_cursor(entry.value).cursor == -1

    with running_cluster(tmp_path, env) as nodes:
        asyncio.run(run(nodes))


def test_retention_dropping_uploaded_segments_keeps_the_cursors_a_moved_topic_resumes(tmp_path: Path) -> None:
    """shared_fs with `cursors_in_segments`, 4 KiB segments and retention at once: of 60
    messages of 200 bytes (several segments), `fast` acknowledges all and `slow` 30, so
    retention deletes the uploaded segments both passed (the first one's checkpoints go
    with it). The topic is then moved: the newest uploaded segment still carries both
    cursors (each segment begins with every cursor), so `slow` resumes at 30 and `fast`
    gets only the message sent after the move; the store holds each subscription's
    creation record (cursor -1) only."""
    shared = tmp_path / "shared"
    env = {"DANUBE_STORAGE__MODE": "shared_fs", "DANUBE_STORAGE__DURABLE_URL": str(shared),
           "DANUBE_STORAGE__CURSORS_IN_SEGMENTS": "true", "DANUBE_STORAGE__WAL_SEGMENT_BYTES_MAX": "4096",
           "DANUBE_STORAGE__RETENTION_TIME_MS": "0", "DANUBE_STORAGE__RETENTION_CHECK_INTERVAL_MS": "200",
           "DANUBE_STORAGE__LOCAL_RETENTION_MS": "0"}
    topic = "/default/retained"
    acked = {"fast": 60, "slow": 30}

    def payload(i: int) -> bytes:
        return f"m{i:03d}".encode().ljust(200, b".")

    async def run(nodes: list) -> None:
        async with AdminClient(nodes[0].admin_url) as admin:
            await admin.create_topic(topic, dispatch_strategy=DispatchStrategy.RELIABLE)
        first_owner = (await _owners(nodes[0], [topic]))[topic]
        owner_node = next(node for node in nodes if node.url == first_owner)
        async with DanubeClient(nodes[0].url) as client:
            producer = await client.create_producer(topic, dispatch="reliable")
            consumers = {name: await client.subscribe(topic, name, sub_type=SubType.EXCLUSIVE,
                                                      consumer_name=f"c{name}") for name in acked}
            for i in range(60):
                await producer.send(payload(i))
            for name, count in acked.items():
                await drain(consumers[name], count)
                await consumers[name].flush_acks()
            await _cursors_at(owner_node, topic, acked)
            segments = shared / "default" / "retained"
            deadline = time.monotonic() + 20
            while (shared_first := min((p.name for p in segments.glob("*.seg")), default="")) \
                    != "" and int(shared_first.split(".")[0]) == 0:
                assert time.monotonic() < deadline, "retention never deleted the first uploaded segment"
                await asyncio.sleep(0.1)
            for consumer in consumers.values():
                await consumer.close()
            async with AdminClient(nodes[0].admin_url) as admin:
                await admin.unload_topic(topic)
            await _moved(nodes[0], topic, first_owner)
            await producer.send(payload(60))
        assert _uploaded_cursors(shared, topic) == {name: count - 1 for name, count in acked.items()}
        async with DanubeClient(nodes[0].url) as client:
            slow = await client.subscribe(topic, "slow", sub_type=SubType.EXCLUSIVE, consumer_name="cslow")
            assert [m.payload for m in await drain(slow, 31, timeout_s=20)] == [payload(i) for i in range(30, 61)]
            fast = await client.subscribe(topic, "fast", sub_type=SubType.EXCLUSIVE, consumer_name="cfast")
            assert [m.payload for m in await drain(fast, 1, timeout_s=20)] == [payload(60)]
        async with AdminClient(nodes[0].admin_url) as admin:  # the store kept the creation floors only
            for name in acked:
                entry = await admin.metadata_get(f"{topic_key(topic)}/subscriptions/{name}")
                assert entry is not None and cr.decode_cursor(entry.value).cursor == -1, name

    with running_cluster(tmp_path, env) as nodes:
        asyncio.run(run(nodes))


async def _subscribe_and_ack(client: DanubeClient, owner_node, topic: str, acked: dict[str, int]) -> None:
    """Subscribe each of `acked`, acknowledge its count of the first messages, wait
    until the owner's subscriptions hold those cursors, then close the consumers."""
    consumers = {name: await client.subscribe(topic, name, sub_type=SubType.EXCLUSIVE, consumer_name=f"c{name}",
                                              initial_position="earliest") for name in acked}
    for name, count in acked.items():
        if count:
            await drain(consumers[name], count)
            await consumers[name].flush_acks()
    await _cursors_at(owner_node, topic, acked)
    for consumer in consumers.values():
        await consumer.close()


async def _cursors_at(owner_node, topic: str, acked: dict[str, int]) -> None:
    """Wait until the owner's subscriptions hold the cursors `acked` moved them to."""
    for name, count in acked.items():
        deadline = time.monotonic() + 15
        while (await describe_subscription(owner_node, topic, name)).cursor != count - 1:
            assert time.monotonic() < deadline, f"the acks of {name} never moved its cursor"
            await asyncio.sleep(0.05)


async def _resumes_after_acked(node, topic: str, acked: dict[str, int], total: int) -> None:
    async with DanubeClient(node.url) as client:
        for name, count in acked.items():
            consumer = await client.subscribe(topic, name, sub_type=SubType.EXCLUSIVE, consumer_name=f"c{name}")
            got = await drain(consumer, total - count, timeout_s=20)
            assert [m.payload for m in got] == [f"m{i}".encode() for i in range(count, total)], name
    async with AdminClient(node.admin_url) as admin:  # the store kept the creation floors only
        for name in acked:
            entry = await admin.metadata_get(f"{topic_key(topic)}/subscriptions/{name}")
            assert entry is not None and cr.decode_cursor(entry.value).cursor == -1, name


async def _moved(node, topic: str, old_owner: str, timeout_s: float = 20) -> str:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            owner = (await _owners(node, [topic]))[topic]
        except DanubeError:
            owner = old_owner
        if owner != old_owner:
            return owner
        assert time.monotonic() < deadline, "the topic did not move"
        await asyncio.sleep(0.1)


def test_acks_after_the_last_sealed_segment_survive_two_moves(tmp_path: Path) -> None:
    """shared_fs with `cursors_in_segments`: ten messages, the topic moved once (its
    segment uploaded, nothing acknowledged yet); on the second broker `a` and `b`
    acknowledge 3 and 7 with no message sent, so their checkpoints sit in an active
    segment holding no record, which cannot be sealed. At the second move the broker
    publishes that segment as it is (`{base}.cursors`), and the third broker resumes
    `a` at 3, `b` at 7 and `c` at 0 (before: back at 0, the newest sealed segment's)."""
    shared = tmp_path / "shared"
    env = {"DANUBE_STORAGE__MODE": "shared_fs", "DANUBE_STORAGE__DURABLE_URL": str(shared),
           "DANUBE_STORAGE__CURSORS_IN_SEGMENTS": "true"}
    topic = "/default/tailcursors"
    acked = {"a": 3, "b": 7, "c": 0}

    async def run(nodes: list) -> None:
        async with AdminClient(nodes[0].admin_url) as admin:
            await admin.create_topic(topic, dispatch_strategy=DispatchStrategy.RELIABLE)
        first = (await _owners(nodes[0], [topic]))[topic]
        async with DanubeClient(nodes[0].url) as client:
            await _subscribe_and_ack(client, next(n for n in nodes if n.url == first), topic, dict.fromkeys(acked, 0))
            producer = await client.create_producer(topic, dispatch="reliable")
            for i in range(10):
                await producer.send(f"m{i}".encode())
            await producer.close()
        async with AdminClient(nodes[0].admin_url) as admin:
            await admin.unload_topic(topic)
        second = await _moved(nodes[0], topic, first)
        async with DanubeClient(nodes[0].url) as client:
            await _subscribe_and_ack(client, next(n for n in nodes if n.url == second), topic, acked)
        async with AdminClient(nodes[0].admin_url) as admin:
            await admin.unload_topic(topic)
        await _moved(nodes[0], topic, second)
        assert _uploaded_cursors(shared, topic, ".cursors") == {name: count - 1 for name, count in acked.items()}
        await _resumes_after_acked(nodes[0], topic, acked, 10)

    with running_cluster(tmp_path, env) as nodes:
        asyncio.run(run(nodes))


@pytest.mark.parametrize("then_send", [False, True])
def test_a_failover_after_kill_9_resumes_every_subscription_at_its_acknowledged_cursor(tmp_path: Path,
                                                                                       then_send: bool) -> None:
    """shared_fs with `seal_every_flush` and `cursors_in_segments`: `a` and `b`
    acknowledge 3 and 7 of ten messages, after the last send, so their checkpoints are
    flushed alone into a segment holding no record; each such flush publishes it
    (`{base}.cursors`). With `then_send`, one more message follows: its sealed segment
    begins with those cursors, and once it is durable the `.cursors` object is deleted
    (the next broker reads the sealed segment instead). The owner is killed with
    SIGKILL (its disk counts as lost); the broker that takes the topic over once the
    lease ends resumes `a` at 3, `b` at 7 and `c` at 0 from the store's segments, and
    no cursor was written to the metadata store."""
    shared = tmp_path / "shared"
    env = {"DANUBE_STORAGE__MODE": "shared_fs", "DANUBE_STORAGE__DURABLE_URL": str(shared),
           "DANUBE_STORAGE__SEAL_EVERY_FLUSH": "true", "DANUBE_STORAGE__CURSORS_IN_SEGMENTS": "true"}
    topic = "/default/failovercursors"
    acked = {"a": 3, "b": 7, "c": 0}

    async def run(nodes: list) -> None:
        async with AdminClient(nodes[0].admin_url) as admin:
            await admin.create_topic(topic, dispatch_strategy=DispatchStrategy.RELIABLE)
        owner = (await _owners(nodes[0], [topic]))[topic]
        victim = next(n for n in nodes if n.url == owner)
        survivor = next(n for n in nodes if n.url != owner)
        async with DanubeClient(survivor.url) as client:
            await _subscribe_and_ack(client, victim, topic, dict.fromkeys(acked, 0))
            producer = await client.create_producer(topic, dispatch="reliable")
            for i in range(10):
                await producer.send(f"m{i}".encode())
            await producer.close()
            await _subscribe_and_ack(client, victim, topic, acked)
        want = {name: count - 1 for name, count in acked.items()}
        deadline = time.monotonic() + 15
        while _uploaded_cursors(shared, topic, ".cursors") != want:
            assert time.monotonic() < deadline, f"never published: {_uploaded_cursors(shared, topic, '.cursors')}"
            await asyncio.sleep(0.05)
        total = 10
        if then_send:
            async with DanubeClient(survivor.url) as client:
                producer = await client.create_producer(topic, dispatch="reliable")
                await producer.send(b"m10")
                await producer.close()
            total = 11
            deadline = time.monotonic() + 15
            while list((shared / "default" / "failovercursors").glob("*.cursors")):
                assert time.monotonic() < deadline, "the checkpoints-only segments were never deleted"
                await asyncio.sleep(0.05)
            assert _uploaded_cursors(shared, topic) == want
        victim.kill()
        await _moved(survivor, topic, owner, timeout_s=30)
        await _resumes_after_acked(survivor, topic, acked, total)

    with running_cluster(tmp_path, env) as nodes:
        asyncio.run(run(nodes))

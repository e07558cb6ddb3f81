"""Producer deduplication against real broker processes, as a Pulsar user tries it:
the `deduplication` policy set with the CLI, a producer process killed with -9
mid-stream and started again under its name resending from its last acknowledged id
minus 100, the broker killed with -9 under a producer whose client resends what was
in flight, and a topic moved in a cluster. Each time the topic holds every message
exactly once, in order (read back with a reader)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from danube_zmq import DanubeClient
from danube_zmq.client.admin import AdminClient
from danube_zmq.transport.errors import InvalidArgument, Timeout
from tests.integration.actors.test_topic_policies import _cli
from tests.integration.storage.test_durable_topics import broker_env

# A producer process: sends m{i} with sequence id i for i in [start, end), one line per
# acknowledged id on stdout, as it is acknowledged.
_PRODUCER = """
import asyncio, sys
from danube_zmq import DanubeClient

async def main(url, topic, start, end):
    async with DanubeClient(url) as client:
        producer = await client.create_producer(topic, name="ingest", dispatch="reliable")
        print(f"last {producer.last_sequence_id}", flush=True)
        def acked(error, message_id, i):
            if error is None:
                print(f"acked {i} {message_id.offset}", flush=True)
        for i in range(start, end):
            producer.send_nowait(f"m{i}".encode(), sequence_id=i, callback=lambda e, mid, i=i: acked(e, mid, i))
            if i % 50 == 0:
                await asyncio.sleep(0.005)
        await producer.flush()

asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])))
"""


def _start_producer(url: str, topic: str, start: int, end: int) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", _PRODUCER, url, topic, str(start), str(end)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})


async def _read_all(url: str, topic: str) -> list[bytes]:
    """Every message the topic holds, from the earliest, with a reader."""
    async with DanubeClient(url) as client:
        reader = await client.create_reader(topic, start="earliest")
        out = []
        while True:
            try:
                out.append((await reader.read_next(timeout=2)).payload)
            except Timeout:
                return out


async def test_a_producer_killed_mid_stream_resends_from_its_last_acknowledged_id_less_100(broker_factory) -> None:
    """`namespaces policies set default --deduplication true`. A producer process sends
    m0..m2999 (ids 0..2999) and is killed with -9 after 1,000 acknowledgements. Started
    again under the same name it learns its last stored id, and resends from the last
    id it saw acknowledged minus 100 to the end. The topic holds m0..m2999 once each,
    in order, and the resent ones already stored are answered with their first offsets."""
    broker = broker_factory()
    out = await _cli(broker.admin_url, "namespaces", "policies", "set", "default", "--deduplication", "true")
    assert "deduplication" in out, out
    shown = json.loads(await _cli(broker.admin_url, "namespaces", "policies", "get", "default", "-o", "json"))
    assert shown["deduplication"] == {"value": True, "source": "namespace"}, shown
    async with AdminClient(broker.admin_url) as admin:
        with pytest.raises(InvalidArgument, match="1 \\(on\\) or 0 \\(off\\), got 2"):
            await admin.set_namespace_policies("default", deduplication=2)
    topic = "/default/dedup-killed-producer"
    first = _start_producer(broker.url, topic, 0, 3000)
    acked: dict[int, int] = {}
    assert first.stdout is not None
    assert first.stdout.readline().strip() == "last -1"
    for line in first.stdout:
        _, i, offset = line.split()
        acked[int(i)] = int(offset)
        if len(acked) >= 1000:
            break
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=30)
    last_acked = max(acked)
    assert last_acked < 2999, "the producer finished before it was killed"

    # The name is busy until the broker notices the killed session (1.5 s here, later
    # on a loaded machine): a user starts the producer again until it attaches.
    deadline = time.monotonic() + 60
    while True:
        second = _start_producer(broker.url, topic, last_acked - 100, 3000)
        stdout, stderr = await asyncio.to_thread(second.communicate, timeout=120)
        if "ProducerBusy" not in stderr or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.5)
    assert second.returncode == 0, stderr
    lines = stdout.splitlines()
    stored_last = int(lines[0].split()[1])
    assert stored_last >= last_acked  # what the broker stored, maybe past what the killed one saw acknowledged
    again = {int(i): int(offset) for _, i, offset in (line.split() for line in lines[1:])}
    assert set(again) == set(range(last_acked - 100, 3000))
    for i in range(last_acked - 100, last_acked + 1):
        assert again[i] == acked[i], (i, again[i], acked[i])  # answered with the first offset

    assert await _read_all(broker.url, topic) == [f"m{i}".encode() for i in range(3000)]


@pytest.mark.parametrize("mode", ["local", "shared_fs"])
async def test_the_broker_killed_mid_stream_stores_each_message_once(broker_factory, tmp_path: Path,
                                                                      mode: str) -> None:
    """The broker's own default `policies.deduplication` true. A producer sends 20,000
    messages with automatic ids while the broker is killed with -9 twice; its client
    sends again every batch whose receipt it did not get. With shared_fs and
    `seal_every_flush` a receipt waits for the upload, so batches written and not yet
    acknowledged are there at each kill (without deduplication they are stored twice).
    Every send succeeds and the topic holds each message exactly once, in order; after
    the restarts `producer.last_sequence_id` is the last id."""
    env = {"DANUBE_POLICIES__DEDUPLICATION": "true"}
    if mode == "shared_fs":
        env |= {**broker_env("shared_fs", str(tmp_path / "shared"), {}), "DANUBE_STORAGE__SEAL_EVERY_FLUSH": "true"}
    broker = broker_factory(env=env)
    topic = "/default/dedup-killed-broker"
    total = 20_000
    async with DanubeClient(broker.url, operation_retries_max=50) as client:
        producer = await client.create_producer(topic, name="steady", dispatch="reliable",
                                                pending_messages_max=total)
        pending = []
        for i in range(total):
            pending.append(producer.send_nowait(f"m{i}".encode()))
            if i in (6_000, 13_000):
                # Killed once receipts come back for some of the burst and not the rest.
                while not pending[i - 3_000].done():
                    await asyncio.sleep(0.001)
                broker.stop(signal.SIGKILL)
                broker = broker_factory(env=env, url=broker.url, admin_url=broker.admin_url)
            elif i % 500 == 0:
                await asyncio.sleep(0)
        ids = [await p for p in pending]
        assert len({m.offset for m in ids}) == total
        assert producer.last_sequence_id == total - 1
    assert await _read_all(broker.url, topic) == [f"m{i}".encode() for i in range(total)]


async def test_the_table_comes_with_the_durable_segments_when_the_local_wal_is_lost(broker_factory,
                                                                                   tmp_path: Path) -> None:
    """storage.mode shared_fs, `deduplication` on: 5,000 messages, a clean stop (the
    active segment sealed and uploaded), then the local WAL is lost, as when the topic
    moves to another broker or the disk is new. The broker finds the table in the
    newest durable segments: the producer re-attaches knowing its last id, and a resend
    of the last 1,000 stores nothing."""
    env = {**broker_env("shared_fs", str(tmp_path / "shared"), {}), "DANUBE_POLICIES__DEDUPLICATION": "true"}
    broker = broker_factory(env=env)
    topic = "/default/dedup-durable"
    async with DanubeClient(broker.url) as client:
        producer = await client.create_producer(topic, name="durable", dispatch="reliable")
        for i in range(5000):
            producer.send_nowait(f"m{i}".encode() + b"x" * 40)
        await producer.flush()
    assert broker.stop(signal.SIGTERM) == 0
    shutil.rmtree(tmp_path / "data" / "wal" / "default" / "dedup-durable")
    broker = broker_factory(env=env, url=broker.url, admin_url=broker.admin_url)
    async with DanubeClient(broker.url) as client:
        producer = await client.create_producer(topic, name="durable", dispatch="reliable")
        assert producer.last_sequence_id == 4999
        offsets = [(await producer.send(f"m{i}".encode() + b"x" * 40, sequence_id=i)).offset
                   for i in range(4000, 5000)]
        assert offsets == list(range(4000, 5000))
        with pytest.raises(InvalidArgument, match="must increase"):
            await producer.send(b"again", sequence_id=4999)  # not above the last message's
        await producer.send(b"m5000" + b"x" * 40)  # automatic: above everything stored
    assert await _read_all(broker.url, topic) == [f"m{i}".encode() + b"x" * 40 for i in range(5001)]


@pytest.mark.cluster
def test_the_table_moves_with_the_topic_in_a_cluster(tmp_path: Path) -> None:
    """3 brokers, `--deduplication true` on the topic. After `topics unload` the next
    owner (the WAL handed over) knows the producer's last id: the producer re-attaches
    with it, and a resend of the last 100 stores nothing."""
    from tests.integration.actors.test_cluster import _owners, running_cluster

    topic = "/default/dedup-moved"

    async def run(nodes) -> None:  # type: ignore[no-untyped-def]
        async with AdminClient(nodes[0].admin_url) as admin:
            await admin.create_topic(topic, dispatch_strategy=1)
            await admin.set_topic_policies(topic, deduplication=1)
        owner_url = (await _owners(nodes[0], [topic]))[topic]
        async with DanubeClient(nodes[0].url, operation_retries_max=10) as client, \
                AdminClient(nodes[1].admin_url) as admin:
            producer = await client.create_producer(topic, name="mover", dispatch="reliable")
            for i in range(500):
                producer.send_nowait(f"m{i}".encode())
            await producer.flush()
            await admin.unload_topic(topic)
            deadline = time.monotonic() + 30
            while (await _owners(nodes[0], [topic]))[topic] == owner_url:
                assert time.monotonic() < deadline, "the topic did not move"
                await asyncio.sleep(0.2)
            await producer.close()
            again = await client.create_producer(topic, name="mover", dispatch="reliable")
            assert again.last_sequence_id == 499
            offsets = [(await again.send(f"m{i}".encode(), sequence_id=i)).offset for i in range(400, 500)]
            assert offsets == list(range(400, 500))
            await again.send(b"m500")
        assert await _read_all(nodes[0].url, topic) == [f"m{i}".encode() for i in range(501)]

    with running_cluster(tmp_path) as nodes:
        asyncio.run(run(nodes))

"""Reliable topics on durable storage: sealed WAL segments are uploaded (shared_fs and
object_store against real emulators), local WAL files go once covered, readers replay
old offsets from durable segments and hand off to the live tail, and a broker whose
local WAL is lost resumes with continuous offsets."""

from __future__ import annotations

import asyncio
import shutil
import signal
import time
from pathlib import Path

import pytest

from danube_zmq import DanubeClient, SubType
from tests.integration.actors.test_subscriptions import drain

MESSAGES = 2000


def broker_env(mode: str, url: str, options: dict) -> dict[str, str]:
    env = {
        "DANUBE_STORAGE__MODE": mode,
        "DANUBE_STORAGE__DURABLE_URL": url,
        "DANUBE_STORAGE__WAL_SEGMENT_BYTES_MAX": str(32 * 1024),
        "DANUBE_STORAGE__LOCAL_RETENTION_MS": "0",
        "DANUBE_STORAGE__RETENTION_CHECK_INTERVAL_MS": "200",
    }
    # The broker reaches object stores with the libraries' standard environment.
    if url.startswith("s3://"):
        env.update(AWS_ACCESS_KEY_ID=options["key"], AWS_SECRET_ACCESS_KEY=options["secret"],
                   AWS_ENDPOINT_URL=options["endpoint_url"], AWS_DEFAULT_REGION="us-west-2")
    elif url.startswith("az://"):
        env["AZURE_STORAGE_CONNECTION_STRING"] = options["connection_string"]
    elif url.startswith("gs://"):
        env["STORAGE_EMULATOR_HOST"] = options["endpoint_url"]
    return env


@pytest.fixture(params=["shared_fs", "s3", "az", "gs"])
def durable(request, tmp_path) -> tuple[str, str, dict]:
    if request.param == "shared_fs":
        return "shared_fs", str(tmp_path / "shared"), {}
    fixture = {"s3": "moto_store", "az": "azurite_store", "gs": "gcs_store"}[request.param]
    url, options = request.getfixturevalue(fixture)
    return "object_store", f"{url}/{request.node.name.replace('[', '-').rstrip(']')}", options


def local_segments(wal_dir: Path) -> list[Path]:
    return sorted(wal_dir.glob("*.wal")) if wal_dir.exists() else []


async def wait_until(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.1)


async def test_seal_upload_drop_local_replay_and_resume(broker_factory, tmp_path, durable) -> None:
    """Upload sealed segments, delete the local WAL files they cover, replay the whole
    topic from durable segments into the live tail; then lose the local WAL entirely and
    check offsets continue after the durable history."""
    mode, url, options = durable
    env = broker_env(mode, url, options)
    broker = broker_factory(env=env)
    wal_dir = tmp_path / "data" / "wal" / "default" / "durable"
    async with DanubeClient(broker.url) as client:
        producer = await client.create_producer("/default/durable", dispatch="reliable")
        for i in range(MESSAGES):
            producer.send_nowait(f"m{i:05d}".encode() + b"x" * 90)
        await producer.flush()
        # Everything but the active segment is uploaded, then deleted locally.
        await wait_until(lambda: len(local_segments(wal_dir)) == 1, 30, "local WAL files covered by durable ones")
        consumer = await client.subscribe("/default/durable", "replay", sub_type=SubType.EXCLUSIVE,
                                          initial_position="earliest")
        history = await drain(consumer, MESSAGES, timeout_s=30)
        assert [m.message_id.offset for m in history] == list(range(MESSAGES))
        await producer.send(b"live")
        tail = await drain(consumer, 1)
        assert tail[0].payload == b"live" and tail[0].message_id.offset == MESSAGES

    # A clean stop seals and uploads the active segment (the hand-off of a topic move);
    # then the local WAL is lost: the topic resumes entirely from durable storage.
    assert broker.stop(signal.SIGTERM) == 0
    shutil.rmtree(wal_dir)
    broker = broker_factory(env=env, url=broker.url, admin_url=broker.admin_url)
    async with DanubeClient(broker.url) as client:
        producer = await client.create_producer("/default/durable", dispatch="reliable")
        resumed = await producer.send(b"after loss")
        assert resumed.offset == MESSAGES + 1
        consumer = await client.subscribe("/default/durable", "again", sub_type=SubType.EXCLUSIVE,
                                          initial_position="earliest")
        replayed = await drain(consumer, MESSAGES + 2, timeout_s=30)
        assert [m.message_id.offset for m in replayed] == list(range(MESSAGES + 2))
        assert replayed[MESSAGES].payload == b"live" and replayed[-1].payload == b"after loss"


async def test_a_lost_disk_after_kill_never_reuses_an_acknowledged_offset(broker_factory, tmp_path) -> None:
    """kill -9, then the local WAL is lost: every acknowledged message was uploaded
    (`seal_every_flush`), and the broker resumes past the offsets it had reserved, so no
    offset it acknowledged names another message; readers skip the gap."""
    env = {**broker_env("shared_fs", str(tmp_path / "shared"), {}), "DANUBE_STORAGE__SEAL_EVERY_FLUSH": "true"}
    broker = broker_factory(env=env)
    wal_dir = tmp_path / "data" / "wal" / "default" / "gap"
    async with DanubeClient(broker.url) as client:
        producer = await client.create_producer("/default/gap", dispatch="reliable")
        acked = {(await producer.send(f"a{i:03d}".encode())).offset: f"a{i:03d}".encode() for i in range(300)}
        # Every acknowledged batch reaches the durable store (its own sealed segment).
        await wait_until(lambda: len(local_segments(wal_dir)) <= 1, 30, "uploads of the sealed segments")
    assert broker.stop(signal.SIGKILL) == -signal.SIGKILL
    shutil.rmtree(wal_dir)
    broker = broker_factory(env=env, url=broker.url, admin_url=broker.admin_url)
    async with DanubeClient(broker.url) as client:
        producer = await client.create_producer("/default/gap", dispatch="reliable")
        after = {(await producer.send(f"b{i:03d}".encode())).offset: f"b{i:03d}".encode() for i in range(5)}
        assert min(after) > max(acked), "an offset given out before the kill was given out again"
        assert min(after) >= 4096, "the new log starts past the reservation (one block of at least 4,096)"
        consumer = await client.subscribe("/default/gap", "all", sub_type=SubType.EXCLUSIVE,
                                          initial_position="earliest")
        received = await drain(consumer, len(acked) + len(after), timeout_s=30)
    assert {m.message_id.offset: m.payload for m in received} == {**acked, **after}


async def test_with_seal_every_flush_a_receipt_waits_until_its_segment_is_durable(broker_factory, tmp_path) -> None:
    """`seal_every_flush`: while the topic's uploads fail (its folder in the shared store
    is a file), a send is written and sealed but not acknowledged; once uploads work
    again it is, and after kill -9 with the local WAL lost, every acknowledged message is
    read back from the durable store. (Chaos B4: an owner cut off from the metadata
    majority answered receipts at the local fsync, and its successor never had them.)"""
    shared = tmp_path / "shared"
    env = {**broker_env("shared_fs", str(shared), {}), "DANUBE_STORAGE__SEAL_EVERY_FLUSH": "true"}
    broker = broker_factory(env=env)
    folder, aside = shared / "default" / "held", shared / "default" / "held.aside"
    wal_dir = tmp_path / "data" / "wal" / "default" / "held"
    async with DanubeClient(broker.url) as client:
        producer = await client.create_producer("/default/held", dispatch="reliable")
        first = await producer.send(b"first")
        assert folder.is_dir()
        folder.rename(aside)
        folder.write_bytes(b"")  # an upload under it fails: not a directory
        pending = asyncio.ensure_future(producer.send(b"held"))
        await wait_until(lambda: "/default/held@" in broker.log() and "failed" in broker.log(), 60,
                         "a failed upload of the held batch's segment")
        assert not pending.done(), "acknowledged before its segment reached the durable store"
        folder.unlink()
        aside.rename(folder)
        second = await asyncio.wait_for(pending, 120)
    assert broker.stop(signal.SIGKILL) == -signal.SIGKILL
    shutil.rmtree(wal_dir)
    broker = broker_factory(env=env, url=broker.url, admin_url=broker.admin_url)
    async with DanubeClient(broker.url) as client:
        consumer = await client.subscribe("/default/held", "all", sub_type=SubType.EXCLUSIVE,
                                          initial_position="earliest")
        received = await drain(consumer, 2, timeout_s=30)
    assert {m.message_id.offset: m.payload for m in received} == {first.offset: b"first", second.offset: b"held"}



async def test_a_segment_reopened_after_a_crash_is_uploaded_again_and_its_sends_acknowledged(
        broker_factory, tmp_path) -> None:
    """`seal_every_flush`: a flush seals its segment, which is uploaded, and rolls to a new
    empty file. A power loss can take that new file (its directory entry was never
    synced): the sealed segment is the last one again and is reopened and appended to.
    Its grown range must be uploaded again, or every receipt after it waits for a
    durable segment that never comes (chaos B6 seeds 6, 7, 9, 10: 2,382 sends never
    acknowledged while they were appended and delivered)."""
    shared = tmp_path / "shared"
    env = {**broker_env("shared_fs", str(shared), {}), "DANUBE_STORAGE__SEAL_EVERY_FLUSH": "true"}
    broker = broker_factory(env=env)
    wal_dir = tmp_path / "data" / "wal" / "default" / "reopened"
    async with DanubeClient(broker.url) as client:
        producer = await client.create_producer("/default/reopened", dispatch="reliable")
        first = await producer.send(b"first")
    assert broker.stop(signal.SIGKILL) == -signal.SIGKILL
    newest = max(wal_dir.glob("*.wal"))
    assert newest.stat().st_size == 0, "the flush did not roll to a new file"
    newest.unlink()  # what the power loss drops: the new file, never synced
    broker = broker_factory(env=env, url=broker.url, admin_url=broker.admin_url)
    async with DanubeClient(broker.url) as client:
        producer = await client.create_producer("/default/reopened", dispatch="reliable")
        second = await asyncio.wait_for(producer.send(b"second"), 60)
        consumer = await client.subscribe("/default/reopened", "all", sub_type=SubType.EXCLUSIVE,
                                          initial_position="earliest")
        received = await drain(consumer, 2, timeout_s=30)
    assert {m.message_id.offset: m.payload for m in received} == {first.offset: b"first", second.offset: b"second"}

async def test_a_lost_disk_loses_what_was_not_uploaded_but_no_offset_is_reused(broker_factory, tmp_path) -> None:
    """Without `seal_every_flush` the acknowledged tail still in the active WAL segment is
    the documented dead-disk window; the broker's next offsets start past what it had
    reserved, so the lost messages' offsets never come back naming other messages."""
    broker = broker_factory(env={"DANUBE_STORAGE__MODE": "shared_fs",
                                 "DANUBE_STORAGE__DURABLE_URL": str(tmp_path / "shared")})
    async with DanubeClient(broker.url) as client:
        producer = await client.create_producer("/default/tail", dispatch="reliable")
        acked = [(await producer.send(f"a{i:03d}".encode())).offset for i in range(50)]
    assert broker.stop(signal.SIGKILL) == -signal.SIGKILL
    shutil.rmtree(tmp_path / "data" / "wal" / "default" / "tail")
    broker = broker_factory(env={"DANUBE_STORAGE__MODE": "shared_fs",
                                 "DANUBE_STORAGE__DURABLE_URL": str(tmp_path / "shared")},
                            url=broker.url, admin_url=broker.admin_url)
    async with DanubeClient(broker.url) as client:
        producer = await client.create_producer("/default/tail", dispatch="reliable")
        resumed = await producer.send(b"after")
        assert resumed.offset > max(acked), f"offset {resumed.offset} was acknowledged before the disk was lost"
        consumer = await client.subscribe("/default/tail", "all", sub_type=SubType.EXCLUSIVE,
                                          initial_position="earliest")
        received = await drain(consumer, 1, timeout_s=10)
    assert [(m.message_id.offset, m.payload) for m in received] == [(resumed.offset, b"after")]

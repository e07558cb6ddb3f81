"""A reliable topic whose WAL cannot be written: the sends of the failed flush get a
clear error, nothing unwritten is acknowledged, reads go on, and the same broker process
takes writes again once the fault is gone.

The faults are real, made by the kernel for a real broker process, not mocked:

* Disk full (ENOSPC -> RESOURCE_EXHAUSTED): the broker's `--data-dir` is on a 2 MiB
  tmpfs this test mounts (we run as root on Linux; tmpfs needs no device or image and
  returns ENOSPC from `write` as soon as its pages run out). Where mounting tmpfs is
  refused, a 4 MiB ext4 image on a loop device (`-m 0`: no blocks reserved for root,
  who could otherwise write past the point where `statvfs` says the disk is full).
  Where neither can be mounted (no CAP_SYS_ADMIN), the test is skipped.
  The whole data dir, catalog included, is on the small filesystem; the catalog is
  written (topic, subscription) before the disk is filled, and acks are sent only after
  space returns, so the catalog is not what fails.
* Any other write error (-> INTERNAL): RLIMIT_FSIZE lowered on the running broker
  (`prlimit(2)`), so a write past the limit fails with EFBIG. The kernel also sends
  SIGXFSZ, which CPython ignores from startup (SIG_IGN), so the write just fails.

The chaos smoke's disk-full run (W6, marked `chaos_smoke`) runs the broker under the
chaos disk launcher (`tests.chaos.harness.disk`), so that after the full disk a power loss
(WAL files cut to their last fsync) proves no acknowledgement was given without durable
data.

Reads come from the WAL files (`storage.cache_bytes_max: 0`), so they prove the log the
topic reopened after the failure serves readers.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from danube_zmq import DanubeClient, SubType
from danube_zmq.transport.errors import DanubeError, InternalError, ResourceExhausted, Timeout
from tests.chaos.harness.disk import crash_journal, launcher, write_control
from tests.integration.conftest import BrokerProcess, start_broker
from tests.integration.storage.test_reliable import describe_subscription

pytestmark = pytest.mark.skipif(
    sys.platform != "linux" or os.geteuid() != 0,
    reason="mounting a small filesystem and lowering another process's RLIMIT_FSIZE need root on Linux")

# The disk reserve (storage.disk_free_bytes_min) would refuse every send on this small
# filesystem before it fills: off, so that the kernel's ENOSPC is what these tests meet
# (the reserve has its own test in test_backlog_quota.py).
NO_CACHE = {"DANUBE_STORAGE__CACHE_BYTES_MAX": "0", "DANUBE_STORAGE__DISK_FREE_BYTES_MIN": "0"}
TOPIC = "/default/full"
PAYLOAD = b"x" * 1024
SENDS_MAX = 2_000  # far more than the room left: the sends must fail well before


def _run(*argv: str) -> bool:
    return subprocess.run(argv, capture_output=True, check=False).returncode == 0


@contextlib.contextmanager
def small_filesystem(tmp_path: Path) -> Iterator[Path]:
    """Mount a small filesystem at `tmp_path/disk` (tmpfs, else a loop-mounted ext4
    image) and unmount it on exit; skip the test if neither can be mounted."""
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    if not _run("mount", "-t", "tmpfs", "-o", "size=2m,mode=0755", "tmpfs", str(mount_point)):
        image = tmp_path / "disk.img"
        with open(image, "wb") as file:
            file.truncate(4 * 1024 * 1024)
        mounted = (shutil.which("mkfs.ext4") is not None and _run("mkfs.ext4", "-q", "-F", "-m", "0", str(image))
                   and _run("mount", "-o", "loop", str(image), str(mount_point)))
        if not mounted:
            pytest.skip("cannot mount a small filesystem here (neither tmpfs nor a loop-mounted ext4 image)")
    try:
        yield mount_point
    finally:
        if not _run("umount", str(mount_point)):
            _run("umount", "-l", str(mount_point))  # still busy: detach it now, freed when released


def fill(directory: Path, room_bytes: int) -> Path:
    """Write a filler file that leaves about `room_bytes` free on `directory`'s filesystem."""
    stat = os.statvfs(directory)
    to_write = stat.f_bavail * stat.f_frsize - room_bytes
    assert to_write > 0, "the filesystem is already fuller than the test needs"
    path = directory / "filler"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    chunk = b"\0" * (64 * 1024)
    try:
        while to_write > 0:
            try:
                to_write -= os.write(fd, chunk[:to_write])
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                break  # already full: that will do
    finally:
        os.close(fd)
    return path


async def send_until_failure(producer) -> tuple[list[int], DanubeError]:
    """Send PAYLOAD one message at a time until a send fails; the acknowledged offsets
    and the error."""
    acked: list[int] = []
    for _ in range(SENDS_MAX):
        try:
            acked.append((await producer.send(PAYLOAD)).offset)
        except DanubeError as exc:
            return acked, exc
    raise AssertionError(f"{SENDS_MAX} sends of {len(PAYLOAD)} bytes all succeeded: the fault never hit")


async def receive_everything(client, idle_s: float = 1.5) -> list:
    """Attach to the `reader` subscription (made before the fault) and receive until it
    is idle, without acking."""
    consumer = await client.subscribe(TOPIC, "reader", sub_type=SubType.EXCLUSIVE)
    got = []
    while True:
        try:
            got.append(await consumer.receive(timeout=idle_s))
        except Timeout:
            return consumer, got


async def check_reads_and_recovery(broker: BrokerProcess, client, producer, acked: list[int],
                                   undo_fault) -> None:
    """Everything acknowledged is read back (with any record written whole but refused,
    never a gap); after `undo_fault()` sends succeed and are read, in the same process."""
    consumer, got = await receive_everything(client)
    offsets = [m.message_id.offset for m in got]
    # Records written whole by a failed flush may stay (at-least-once); gaps never.
    assert offsets == list(range(len(offsets))), offsets
    assert set(acked) <= set(offsets), sorted(set(acked) - set(offsets))
    for message in got[10:len(acked)]:
        assert message.payload == PAYLOAD

    undo_fault()
    after = [(await producer.send(f"after-{i}".encode())).offset for i in range(5)]
    assert after == list(range(len(offsets), len(offsets) + 5))
    fresh = [await consumer.receive(timeout=5) for _ in range(5)]
    assert [m.payload for m in fresh] == [f"after-{i}".encode() for i in range(5)]
    assert [m.message_id.offset for m in fresh] == after
    for message in got + fresh:
        await consumer.ack(message)
    await consumer.flush_acks()
    assert broker.process.poll() is None, broker.log()
    for _ in range(50):  # the cursor moves when the acks are processed
        info = await describe_subscription(broker, TOPIC, "reader")
        if info.cursor == after[-1]:
            break
        await asyncio.sleep(0.1)
    assert info.cursor == after[-1] and info.backlog_messages == 0, info


def no_retry_client(broker: BrokerProcess) -> DanubeClient:
    """RESOURCE_EXHAUSTED is retriable: without retries its error reaches the test at once."""
    return DanubeClient(broker.url, operation_retries_max=0)


async def start_producing(client):
    """A reliable producer sending one message per Send (so a failed flush fails one
    message) with 10 messages stored, and the `reader` subscription from earliest, made
    while the disk has room and left without a consumer until the reads."""
    producer = await client.create_producer(TOPIC, dispatch="reliable", batching=False)
    reader = await client.subscribe(TOPIC, "reader", sub_type=SubType.EXCLUSIVE, initial_position="earliest")
    await reader.close()
    assert [(await producer.send(f"before-{i}".encode())).offset for i in range(10)] == list(range(10))
    return producer


def stop(broker: BrokerProcess) -> None:
    code = broker.stop()
    assert code == 0, f"broker did not stop cleanly (exit {code}):\n{broker.log()}"


async def test_disk_full_fails_sends_with_resource_exhausted_and_recovers(tmp_path: Path) -> None:
    """On a full disk the failing send gets RESOURCE_EXHAUSTED naming the topic and the
    disk; every acknowledged message stays readable from earliest; a send larger than
    the room left fails too; after the filler file is deleted, the same broker process
    acknowledges and delivers new messages with the next offsets."""
    with small_filesystem(tmp_path) as disk:
        broker = start_broker(tmp_path, "--data-dir", str(disk / "data"), env=NO_CACHE)
        try:
            async with no_retry_client(broker) as client:
                producer = await start_producing(client)
                filler = fill(disk, room_bytes=48 * 1024)
                acked, error = await send_until_failure(producer)
                assert isinstance(error, ResourceExhausted), repr(error)
                message = str(error)
                assert TOPIC in message and "disk full" in message and "may not have been stored" in message, message
                assert "No space left on device" in message, message
                assert len(acked) > 10, "some sends must succeed in the room left"
                with pytest.raises(ResourceExhausted, match="disk full"):
                    await producer.send(b"y" * (256 * 1024))  # more than is left: still refused
                await check_reads_and_recovery(broker, client, producer, acked, filler.unlink)
            assert "WAL flush failed" in broker.log()
            stop(broker)
        finally:
            broker.stop(signal.SIGKILL)


async def test_write_error_fails_sends_with_internal_error_and_recovers(tmp_path: Path) -> None:
    """A write error other than a full disk (EFBIG past the broker's RLIMIT_FSIZE) fails
    the send with INTERNAL ("write failed"); acknowledged messages stay readable; with
    the limit lifted the same process takes and delivers new messages."""
    broker = start_broker(tmp_path, env=NO_CACHE)
    pid = broker.process.pid
    unlimited = (resource.RLIM_INFINITY, resource.RLIM_INFINITY)
    try:
        async with no_retry_client(broker) as client:
            producer = await start_producing(client)
            # The WAL segment (~1 KiB a message) is by far the broker's largest file: its
            # log and catalog files stay well below 64 KiB.
            resource.prlimit(pid, resource.RLIMIT_FSIZE, (64 * 1024, resource.RLIM_INFINITY))
            acked, error = await send_until_failure(producer)
            assert isinstance(error, InternalError), repr(error)
            message = str(error)
            assert TOPIC in message and "write failed" in message and "may not have been stored" in message, message
            assert "File too large" in message, message
            assert len(acked) > 10

            def lift() -> None:
                resource.prlimit(pid, resource.RLIMIT_FSIZE, unlimited)

            await check_reads_and_recovery(broker, client, producer, acked, lift)
        stop(broker)
    finally:
        broker.stop(signal.SIGKILL)


@pytest.mark.chaos_smoke
async def test_disk_full_acks_only_durable_messages_and_resumes(tmp_path: Path) -> None:
    """W6 (reliability.md 4.2), the chaos smoke's disk-full run: a broker under the chaos
    disk launcher on a 2 MiB tmpfs is filled while a reliable producer sends. The first
    failing send gets a retriable RESOURCE_EXHAUSTED; every acknowledged message stays
    readable; after the filler is deleted sends are acknowledged again. Then a power
    loss (kill -9, WAL files cut to their last fsync) and a restart: every message ever
    acknowledged, before and after the full disk, is still consumed, so no ack was given
    for data that was not durable. Figures (error latency, time to the first ack after
    space returns) are printed for docs/reliability.md, never asserted on."""
    control, journal = tmp_path / "control.json", tmp_path / "journal"
    write_control(control, seed=0, journal=journal)
    with small_filesystem(tmp_path) as disk:
        start = functools.partial(start_broker, tmp_path, "--data-dir", str(disk / "data"), env=NO_CACHE,
                                  launcher=launcher(control))
        broker = start()
        try:
            async with no_retry_client(broker) as client:
                producer = await start_producing(client)
                acked = list(range(10))
                filler = fill(disk, room_bytes=48 * 1024)
                more, error = await send_until_failure(producer)
                acked += more
                started = time.monotonic()
                with pytest.raises(ResourceExhausted) as refused:
                    await producer.send(PAYLOAD)
                error_s = time.monotonic() - started
                assert isinstance(error, ResourceExhausted) and error.retriable and refused.value.retriable
                consumer, got = await receive_everything(client)
                assert set(acked) <= {m.message_id.offset for m in got}  # reads go on
                await consumer.close()

                filler.unlink()
                freed = time.monotonic()
                for _ in range(200):  # bounded: 200 tries, 0.1 s apart
                    try:
                        acked.append((await producer.send(b"after")).offset)
                        break
                    except ResourceExhausted:
                        await asyncio.sleep(0.1)
                resumed_s = time.monotonic() - freed
                acked += [(await producer.send(b"after")).offset for _ in range(20)]

            broker.stop(signal.SIGKILL)
            report = crash_journal(journal, seed=0)
            broker = start(url=broker.url, admin_url=broker.admin_url)
            async with no_retry_client(broker) as client:
                consumer = await client.subscribe(TOPIC, "after-crash", sub_type=SubType.EXCLUSIVE,
                                                  initial_position="earliest")
                offsets = []
                while True:
                    try:
                        offsets.append((await consumer.receive(timeout=3)).message_id.offset)
                    except Timeout:
                        break
            lost = sorted(set(acked) - set(offsets))
            assert not lost, f"acknowledged offsets lost after the power loss: {lost[:10]}\n{broker.log()[-3000:]}"
            assert offsets == list(range(len(offsets)))
            print(f"disk full run {{\"acked\": {len(acked)}, \"consumed_after_crash\": {len(offsets)}, "
                  f"\"refused_send_s\": {error_s:.3f}, \"first_ack_after_free_s\": {resumed_s:.3f}, "
                  f"\"crash_bytes_dropped\": {report.bytes_dropped}}}")
        finally:
            broker.stop(signal.SIGKILL)

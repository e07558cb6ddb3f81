"""A damaged WAL is corruption, not a torn tail, on a real broker.

The reproduction of issue 19: 10,000 acknowledged messages on a reliable topic, the
broker stopped (kill -9, or a clean stop), one bit flipped in the body of record 5,000
of the active WAL segment, the broker restarted. Before, recovery cut the file there
(5,000 acknowledged messages gone, a WARNING) and new messages reused offsets from
5,000; after a clean stop the whole WAL was dropped. Now the topic is not served
(UNAVAILABLE naming it and the reason), `topics describe` shows the damage, the file is
untouched, and `topics repair --accept-loss` prints the lost offsets, then serves the
topic again with every readable record and new offsets past every one given out.
"""

from __future__ import annotations

import asyncio
import os
import signal
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from danube_zmq import DanubeClient, SubType
from danube_zmq.storage.wal import HEADER, HEADER_BYTES
from danube_zmq.transport.errors import DanubeError, ErrorCode, Timeout

TOPIC = "/default/damaged"
MESSAGES = 10_000
DAMAGED = 5_000


def admin(broker, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "danube_zmq.cli.main", "admin", "--endpoint", broker.admin_url,
                           *args], capture_output=True, text=True, timeout=60)


def flip_bit_in_record(directory: Path, offset: int) -> tuple[Path, int]:
    """Flip one bit in the body of record `offset` of the last (active) segment file;
    return the file and the record's byte position."""
    path = sorted(directory.glob("*.wal"))[-1]
    data = bytearray(path.read_bytes())
    position = 0
    while True:
        record_offset, length, _ = HEADER.unpack_from(data, position)
        if record_offset == offset:
            break
        position += HEADER_BYTES + length
    data[position + HEADER_BYTES + 3] ^= 0x20
    path.write_bytes(bytes(data))
    return path, position


async def produce(url: str, payloads: list[bytes]) -> list[int]:
    async with DanubeClient(url, request_timeout_ms=10_000) as client:
        producer = await client.create_producer(TOPIC, dispatch="reliable", name="writer")
        ids = await asyncio.gather(*(producer.send(payload) for payload in payloads))
        return [message_id.offset for message_id in ids]


async def consume_all(url: str, subscription: str) -> list[tuple[int, int]]:
    """(offset, sequence number) of everything from the earliest offset, in order."""
    received = []
    async with DanubeClient(url, request_timeout_ms=10_000) as client:
        consumer = await client.subscribe(TOPIC, subscription, sub_type=SubType.EXCLUSIVE,
                                          initial_position="earliest", receiver_queue_size=5000)
        while True:
            try:
                msg = await consumer.receive(timeout=5)
            except Timeout:
                return received
            received.append((msg.message_id.offset, struct.unpack(">Q", msg.payload)[0]))
            await consumer.ack(msg)


@pytest.mark.slow
@pytest.mark.parametrize("stop", ["kill -9", "clean stop"])
async def test_a_flipped_bit_in_the_active_wal_is_corruption_never_a_silent_loss(broker_factory, tmp_path: Path,
                                                                                 stop: str) -> None:
    """The end-to-end reproduction, after kill -9 and after a clean stop (see the module
    docstring): nothing acknowledged is silently lost, no offset is reused."""
    broker = broker_factory()
    offsets = await produce(broker.url, [struct.pack(">Q", seq) for seq in range(MESSAGES)])
    assert offsets == list(range(MESSAGES))
    broker.stop(signal.SIGKILL if stop == "kill -9" else signal.SIGTERM)
    wal_dir = tmp_path / "data" / "wal" / "default" / "damaged"
    path, position = flip_bit_in_record(wal_dir, DAMAGED)
    damaged_bytes = path.read_bytes()

    broker = broker_factory(url=broker.url, admin_url=broker.admin_url)
    with pytest.raises(DanubeError) as refused:
        await produce(broker.url, [b"refused"])
    assert refused.value.code == ErrorCode.UNAVAILABLE
    assert TOPIC in refused.value.message and "damaged" in refused.value.message
    assert path.read_bytes() == damaged_bytes  # untouched
    assert any(p.read_bytes() == damaged_bytes for p in (wal_dir / "quarantine").iterdir())
    log = "".join(broker.log().split())  # the console log wraps long lines
    assert "ERROR" in log and str(path) in log and f"byte{position}" in log

    described = admin(broker, "topics", "describe", TOPIC)
    assert described.returncode == 0, described.stderr
    assert "NOT SERVED" in described.stdout and f"byte{position}" in "".join(described.stdout.split()), \
        described.stdout

    dry_run = admin(broker, "topics", "repair", TOPIC)
    assert dry_run.returncode == 0, dry_run.stderr
    assert f"lost offsets: {DAMAGED}.." in dry_run.stdout and "nothing changed" in dry_run.stdout, dry_run.stdout
    assert f"acknowledged to producers among them: {DAMAGED}..{MESSAGES - 1}" in dry_run.stdout, dry_run.stdout
    assert path.read_bytes() == damaged_bytes

    repaired = admin(broker, "topics", "repair", TOPIC, "--accept-loss")
    assert repaired.returncode == 0, repaired.stderr
    assert f"lost offsets: {DAMAGED}.." in repaired.stdout and "served again" in repaired.stdout, repaired.stdout
    next_offset = int(repaired.stdout.rsplit("next offset is ", 1)[1].split()[0])
    assert next_offset >= MESSAGES

    after = await produce(broker.url, [struct.pack(">Q", MESSAGES + seq) for seq in range(10)])
    assert after == list(range(next_offset, next_offset + 10))  # never a reused offset
    received = await consume_all(broker.url, f"after-{stop.replace(' ', '-')}")
    expected = [(seq, seq) for seq in range(DAMAGED)] + [(next_offset + i, MESSAGES + i) for i in range(10)]
    assert received == expected
    assert os.path.exists(path)  # the repaired log keeps its readable prefix in place

"""A local-mode move's WAL transfer (storage/wal/handover.py and the sender, the
`HandOver` actor in actors/move/hand_over.py): a transfer whose connection breaks in the
middle resumes (a timer message) from the bytes the receiver holds, and what is
installed is the sender's WAL."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from types import SimpleNamespace

import crc32c
import pytest
import zmq.asyncio

from danube_zmq.actors.move.hand_over import HandOver
from danube_zmq.clock import SystemClock
from danube_zmq.runtime.actor import Actor
from danube_zmq.runtime.system import ActorSystem
from danube_zmq.storage.wal import WalLog, encode_batch
from danube_zmq.storage.wal.handover import Incoming, offered_files
from danube_zmq.transport import admin_protocol as ap
from danube_zmq.transport.codec import Message
from danube_zmq.transport.common import Ok
from danube_zmq.transport.errors import FailedPrecondition, Unavailable
from danube_zmq.transport.internal_protocol import (
    Done,
    FlushCursors,
    HandOverEnded,
    PersistedSubscriptions,
    SubscriptionsOf,
    SubscriptionState,
)

SEGMENT_BYTES = 8192
CHUNK_BYTES = 1500


def written_wal(directory: Path, count: int) -> list[bytes]:
    wal = WalLog.open(directory, segment_bytes_max=SEGMENT_BYTES, segment_age_ms_max=None, clock=SystemClock())
    payloads = [os.urandom(700) for _ in range(count)]
    for i, payload in enumerate(payloads):
        wal.append(encode_batch(i, [payload], [i], 7, "p"), 1)
    wal.sync()
    wal.close()
    return payloads


def read_all(directory: Path) -> list[bytes]:
    wal = WalLog.open(directory, segment_bytes_max=SEGMENT_BYTES, segment_age_ms_max=None, clock=SystemClock())
    try:
        return list(wal.read(0, max_bytes=1 << 30, upto_offset=wal.next_offset).payloads)
    finally:
        wal.close()


class Receiver:
    """The receiving broker's handlers over a real `Incoming`, and a connection that
    breaks once: before the receiver sees chunk `break_at` (`reply_lost` False) or after
    it wrote it (the answer lost)."""

    def __init__(self, staging: Path, wal_dir: Path, break_at: int, reply_lost: bool) -> None:
        self.staging, self.wal_dir = staging, wal_dir
        self.break_at, self.reply_lost = break_at, reply_lost
        self.incoming: Incoming | None = None
        self.chunks = 0
        self.sent: list[tuple[int, int]] = []  # (file, position) of every chunk written
        self.begins: list[list[int]] = []
        self.written_bytes = 0
        self.written_at_break = -1

    async def remote(self, url: str, make, timeout_ms: int | None = None):
        msg = make(1)
        if isinstance(msg, ap.BeginHandOver):
            self.incoming = Incoming(self.staging, msg.handover_id, [(f.name, f.size_bytes) for f in msg.files],
                                     msg.next_offset)
            held = self.incoming.begin()
            self.begins.append(held)
            return ap.HandOverProgress(request_id=1, held_bytes=held)
        assert self.incoming is not None
        if isinstance(msg, ap.HandOverChunk):
            self.chunks += 1
            if self.chunks == self.break_at and not self.reply_lost:
                self.written_at_break = self.written_bytes
                raise Unavailable("connection lost")
            self.incoming.write(msg.file_index, msg.position, msg.data, msg.crc32c)
            self.sent.append((msg.file_index, msg.position))
            self.written_bytes += len(msg.data)
            if self.chunks == self.break_at:
                self.written_at_break = self.written_bytes
                raise Unavailable("connection lost")
            return Ok(request_id=1)
        assert isinstance(msg, ap.CommitHandOver)
        self.incoming.verify_and_install(self.wal_dir, clock=SystemClock())
        return Ok(request_id=1)


class Broker(Actor):
    """Stands where the broker and its cursor flusher are: one subscription with its
    cursor at 0 (the whole WAL is offered), cursors flushed at once, and the
    `HandOverEnded` it is told kept."""

    def __init__(self, ended: list[HandOverEnded]) -> None:
        self.ended = ended

    def handle_SubscriptionsOf(self, msg: SubscriptionsOf) -> Message:
        return PersistedSubscriptions(states=[SubscriptionState(name="s", sub_type=0, cursor=0, acked_above=[])])

    def handle_FlushCursors(self, msg: FlushCursors) -> Message:
        return Done()

    def handle_HandOverEnded(self, msg: HandOverEnded) -> None:
        self.ended.append(msg)


class Sender(HandOver):
    """The real hand-over actor, its admin connection the `Receiver` and its ownership
    switch (a metadata transaction) only recorded."""

    receiver: Receiver
    switched: list[int]

    async def _call(self, build, *, bounded: bool = True) -> Message:  # type: ignore[no-untyped-def]
        return await self.receiver.remote("tcp://receiver", build)

    async def _switch(self, offer) -> None:  # type: ignore[no-untyped-def]
        self.switched.append(offer.next_offset)


async def send_offer(receiver: Receiver, wal_dir: Path) -> tuple[list[HandOverEnded], list[int]]:
    """Run one hand-over of `wal_dir` to `receiver` in a real actor system, to its end."""
    ended: list[HandOverEnded] = []
    switched: list[int] = []
    # Chunks smaller than the config allows (4 KiB), so a small WAL takes many.
    config = SimpleNamespace(storage=SimpleNamespace(wal_segment_bytes_max=SEGMENT_BYTES), cluster=SimpleNamespace(
        move_chunk_bytes_max=CHUNK_BYTES, move_bytes_max=1 << 30, move_timeout_ms=60_000, request_timeout_ms=5_000))
    system = ActorSystem(zmq.asyncio.Context(), clock=SystemClock(), mailbox_messages_max=100)
    try:
        broker = await system.spawn(lambda: Broker(ended), name="broker")

        def factory() -> HandOver:
            sender = Sender(topic="/ns/t", target=SimpleNamespace(admin_url="tcp://receiver", broker_id=2),  # type: ignore[arg-type]
                            refusal=None, marker=None, handover_id=42, broker_id=1, broker_endpoint=broker,
                            flusher_endpoint=broker, metadata=None, config=config,  # type: ignore[arg-type]
                            wal_dir=wal_dir,
                            done=None)
            sender.receiver, sender.switched = receiver, switched
            return sender

        await system.spawn(factory, name="hand-over /ns/t", parent=broker)
        for _ in range(3_000):
            if ended:
                break
            await asyncio.sleep(0.01)
    finally:
        await system.shutdown()
    return ended, switched


@pytest.mark.parametrize("reply_lost", [False, True])
@pytest.mark.parametrize("break_at", [1, 4, 9])
def test_a_broken_transfer_resumes_from_the_bytes_the_receiver_holds(tmp_path: Path, break_at: int,
                                                                     reply_lost: bool) -> None:
    """The connection breaks at chunk `break_at` of a three-segment WAL (the chunk not
    received, or received and its answer lost): the sender begins again, the receiver
    answers how many bytes of each file it holds, and the sender sends only the rest:
    no byte is written twice, and the installed WAL holds every record in order."""
    payloads = written_wal(tmp_path / "sent", 30)
    offer = offered_files(tmp_path / "sent", 0, segment_bytes_max=SEGMENT_BYTES, clock=SystemClock())
    assert len(offer.files) >= 3
    receiver = Receiver(tmp_path / "staging", tmp_path / "received", break_at, reply_lost)
    ended, switched = asyncio.run(send_offer(receiver, tmp_path / "sent"))
    assert [(e.topic, e.error) for e in ended] == [("/ns/t", None)], ended
    assert switched == [offer.next_offset]
    assert len(receiver.begins) == 2, "one resume"
    assert sum(receiver.begins[1]) == receiver.written_at_break, receiver.begins
    assert receiver.written_at_break > 0 or (break_at == 1 and not reply_lost)
    assert len(receiver.sent) == len(set(receiver.sent)), "a chunk written twice"
    assert sum(1 for _ in receiver.sent) == sum(-(-f.size_bytes // CHUNK_BYTES) for f in offer.files)
    assert read_all(tmp_path / "received") == payloads


def test_a_chunk_not_where_the_receivers_copy_ends_or_with_a_bad_crc_is_refused(tmp_path: Path) -> None:
    """The receiver writes a chunk only at the end of what it holds and with its CRC32C:
    a replayed, skipped or damaged chunk changes nothing; a new attempt with the same
    move id keeps the held bytes, one with another id starts again."""
    written_wal(tmp_path / "sent", 5)
    offer = offered_files(tmp_path / "sent", 0, segment_bytes_max=SEGMENT_BYTES, clock=SystemClock())
    files = [(f.name, f.size_bytes) for f in offer.files]
    data = offer.files[0].path.read_bytes()
    incoming = Incoming(tmp_path / "staging", 7, files, offer.next_offset)
    assert incoming.begin() == [0]
    incoming.write(0, 0, data[:100], crc32c.crc32c(data[:100]))
    for position, chunk, checksum in [(0, data[:100], crc32c.crc32c(data[:100])),
                                      (200, data[200:300], crc32c.crc32c(data[200:300])),
                                      (100, data[100:200], crc32c.crc32c(data[100:200]) ^ 1)]:
        with pytest.raises(FailedPrecondition):
            incoming.write(0, position, chunk, checksum)
    assert Incoming(tmp_path / "staging", 7, files, offer.next_offset).begin() == [100]
    assert Incoming(tmp_path / "staging", 8, files, offer.next_offset).begin() == [0]


def test_an_empty_active_segment_is_handed_over(tmp_path: Path) -> None:
    """A WAL whose active segment holds no record yet (just rolled, or started past the
    offsets a repair gave up) offers it at 0 bytes: no chunk carries it, yet the receiver
    installs it and the moved log continues at its offset."""
    source = tmp_path / "source"
    source.mkdir()
    WalLog.open(source, segment_bytes_max=SEGMENT_BYTES, segment_age_ms_max=None, clock=SystemClock()).close()
    WalLog.repair(source, resume_offset=200, clock=SystemClock())
    offer = offered_files(source, None, segment_bytes_max=SEGMENT_BYTES, clock=SystemClock())
    assert [f.size_bytes for f in offer.files] == [0] and offer.next_offset == 200
    incoming = Incoming(tmp_path / "staging", 7, [(f.name, f.size_bytes) for f in offer.files], offer.next_offset)
    assert incoming.begin() == [0]
    target = tmp_path / "target"
    assert incoming.verify_and_install(target, clock=SystemClock()) == 200
    moved = WalLog.open(target, segment_bytes_max=SEGMENT_BYTES, segment_age_ms_max=None, clock=SystemClock())
    assert moved.next_offset == 200
    moved.close()

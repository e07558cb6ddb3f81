"""A local-mode move's WAL transfer (storage/wal/handover.py and the sender, the
`HandOver` actor in actors/move/hand_over.py): a transfer whose connection breaks in the
middle resumes (a timer message) from the bytes the receiver holds, and what is
installed is the sender's WAL, with its compacted ledger (checked whole: a damaged one
refuses the move)."""

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
from danube_zmq.storage.wal import HEADER_BYTES, WalLog, encode_batch, segment_file_name
from danube_zmq.storage.wal.compacted import Ledger, LedgerWriter, ledger_file_name
from danube_zmq.storage.wal.handover import Incoming, offered_files
from danube_zmq.storage.wal.segment import parse_segment_file_name
from danube_zmq.transport import admin_protocol as ap
from danube_zmq.transport.codec import Message
from danube_zmq.transport.common import Ok
from danube_zmq.transport.errors import FailedPrecondition, InvalidArgument, Unavailable
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


# ---- the compacted ledger moves with the WAL ----

def written_ledger(wal_dir: Path, horizon: int) -> Path:
    """A compacted ledger beside the WAL in `wal_dir`: every other record below `horizon`."""
    wal = WalLog.open(wal_dir, segment_bytes_max=SEGMENT_BYTES, segment_age_ms_max=None, clock=SystemClock())
    try:
        batch = wal.read(0, max_bytes=1 << 30, upto_offset=horizon)
    finally:
        wal.close()
    with LedgerWriter(wal_dir, horizon) as writer:
        writer.append(batch, [offset % 2 == 0 for offset in batch.offsets])
        return writer.commit()


def ledger_rows(path: Path) -> list[tuple[int, bytes]]:
    with Ledger.open(path) as ledger:
        return [(o, p) for batch in ledger.records() for o, p in zip(batch.offsets, batch.payloads, strict=True)]


def test_the_newest_compacted_ledger_is_offered_last_and_the_log_from_its_horizon(tmp_path: Path) -> None:
    """With no subscription only the active segment is offered; a compacted ledger adds
    the segments from its horizon on (a compacted reader goes on in the log there) and
    itself, last, at its whole size; an older ledger left beside it is not offered, and
    a subscription's cursor above the horizon does not shorten the offer."""
    wal_dir = tmp_path / "wal"
    written_wal(wal_dir, 30)
    clock = SystemClock()
    plain = offered_files(wal_dir, None, segment_bytes_max=SEGMENT_BYTES, clock=clock)
    written_ledger(wal_dir, 6)
    newest = written_ledger(wal_dir, 14)
    for needed_from in (None, 25):
        offer = offered_files(wal_dir, needed_from, segment_bytes_max=SEGMENT_BYTES, clock=clock)
        *segments, ledger = offer.files
        assert (ledger.name, ledger.size_bytes, ledger.path) == (newest.name, newest.stat().st_size, newest)
        assert [parse_segment_file_name(f.name) is not None for f in segments] == [True] * len(segments)
        assert segments[-1] == plain.files[-1] and len(segments) > len(plain.files)
        bases = [parse_segment_file_name(f.name) for f in segments]
        assert bases[0] <= 14 and all(base > 14 for base in bases[1:]), bases  # the horizon's segment first
        assert offer.next_offset == plain.next_offset == 30


@pytest.mark.parametrize("reply_lost", [False, True])
def test_a_hand_over_carries_the_compacted_ledger_and_resumes_inside_it(tmp_path: Path, reply_lost: bool) -> None:
    """The `HandOver` actor sends the ledger after the segments, in chunks like them; the
    connection breaks at the ledger's second chunk and the move resumes from the bytes
    the receiver holds: the installed WAL holds every record and the ledger the same
    view, byte for byte."""
    payloads = written_wal(tmp_path / "sent", 30)
    ledger = written_ledger(tmp_path / "sent", 20)
    offer = offered_files(tmp_path / "sent", 0, segment_bytes_max=SEGMENT_BYTES, clock=SystemClock())
    assert offer.files[-1].name == ledger.name and offer.files[-1].size_bytes > 2 * CHUNK_BYTES
    segment_chunks = sum(-(-f.size_bytes // CHUNK_BYTES) for f in offer.files[:-1])
    receiver = Receiver(tmp_path / "staging", tmp_path / "received", segment_chunks + 2, reply_lost)
    sent_view = ledger_rows(ledger)
    ended, _ = asyncio.run(send_offer(receiver, tmp_path / "sent"))
    assert [(e.topic, e.error) for e in ended] == [("/ns/t", None)], ended
    assert len(receiver.begins) == 2 and receiver.begins[1][-1] > 0, receiver.begins  # resumed inside the ledger
    installed = tmp_path / "received" / ledger.name
    assert installed.read_bytes() == ledger.read_bytes()
    assert ledger_rows(installed) == sent_view and [o for o, _ in sent_view] == list(range(0, 20, 2))
    assert read_all(tmp_path / "received") == payloads


def _flip_a_body_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[HEADER_BYTES + 3] ^= 0x40  # the first record's body: its CRC no longer matches
    path.write_bytes(bytes(data))


def _cut_the_last_record(path: Path) -> None:
    os.truncate(path, path.stat().st_size - 5)


@pytest.mark.parametrize("damage", [_flip_a_body_byte, _cut_the_last_record])
def test_a_damaged_compacted_ledger_refuses_the_hand_over(tmp_path: Path, damage) -> None:  # type: ignore[no-untyped-def]
    """A ledger damaged on the sender's disk (a flipped bit, a torn last record) passes
    the chunks' CRC32Cs (they cover what was read) but not `Ledger.open` at commit: the
    hand-over is refused naming the ledger, and the WAL the receiver held stays."""
    sent = tmp_path / "sent"
    written_wal(sent, 30)
    ledger = written_ledger(sent, 20)
    damage(ledger)
    offer = offered_files(sent, None, segment_bytes_max=SEGMENT_BYTES, clock=SystemClock())
    incoming = Incoming(tmp_path / "staging", 7, [(f.name, f.size_bytes) for f in offer.files], offer.next_offset)
    assert incoming.begin() == [0] * len(offer.files)
    for index, offered in enumerate(offer.files):
        data = offered.path.read_bytes()
        if data:
            incoming.write(index, 0, data, crc32c.crc32c(data))
    target = tmp_path / "target"
    target.mkdir()
    (target / "earlier").write_bytes(b"an earlier turn's WAL")
    with pytest.raises(FailedPrecondition, match=f"compacted ledger {ledger.name} is damaged"):
        incoming.verify_and_install(target, clock=SystemClock())
    assert [p.name for p in target.iterdir()] == ["earlier"]


SEGMENT = (segment_file_name(0), 100)
LEDGER = (ledger_file_name(20), 100)


@pytest.mark.parametrize("files", [
    [LEDGER, SEGMENT],  # a ledger before a segment
    [SEGMENT, LEDGER, LEDGER],  # two ledgers
    [SEGMENT, (ledger_file_name(10), 100), LEDGER],
    [LEDGER],  # no segment
    [SEGMENT, (LEDGER[0] + ".tmp", 100)],  # a writer's unfinished one
    [SEGMENT, ("../" + LEDGER[0], 100)],
    [SEGMENT, ("x" + LEDGER[0], 100)],
    [SEGMENT, (LEDGER[0], -1)],
    [SEGMENT, (ledger_file_name(31), 100)],  # past the WAL's end
])
def test_the_receiver_takes_segments_then_one_compacted_ledger_only(tmp_path: Path, files) -> None:  # type: ignore[no-untyped-def]
    """The receiver's name check stays strict: segment files, then at most one compacted
    ledger, last, at or below the WAL's end; anything else is refused before a byte is
    staged."""
    with pytest.raises(InvalidArgument):
        Incoming(tmp_path / "staging", 7, files, 30)
    assert not (tmp_path / "staging").exists()
    Incoming(tmp_path / "staging", 7, [SEGMENT, LEDGER], 30)  # the well-formed offer

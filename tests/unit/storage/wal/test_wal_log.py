"""The WAL of one topic: recovery from torn and damaged files, rolling, reading, deleting."""

from __future__ import annotations

import errno
import itertools
import logging
import os
import random
import re
import shutil
import stat
import threading
from pathlib import Path

import pytest

from danube_zmq.clock import ManualClock
from danube_zmq.storage.wal import (
    HEADER,
    HEADER_BYTES,
    CorruptRecord,
    OffsetOutOfRange,
    RecordBatch,
    WalDamaged,
    WalLog,
    encode_batch,
    segment_file_name,
)
from danube_zmq.storage.wal import files as wal_files
from danube_zmq.transport.errors import FailedPrecondition


@pytest.fixture
def no_fsync(monkeypatch: pytest.MonkeyPatch) -> None:
    """fsync as a no-op, for tests of logic that open, roll and close hundreds of times:
    on a busy disk each real fsync can take milliseconds, and no crash is simulated."""
    monkeypatch.setattr(wal_files.current, "fsync", lambda fd: None)


def open_log(directory: Path, clock: ManualClock | None = None, **options: object) -> WalLog:
    settings: dict = {"segment_bytes_max": 1 << 20, "segment_age_ms_max": None, "index_interval_bytes": 256}
    settings.update(options)
    return WalLog.open(directory, clock=clock or ManualClock(), **settings)


def append_payloads(wal: WalLog, payloads: list[bytes], *, key: str | None = None) -> int:
    encoded = encode_batch(
        wal.next_offset, payloads, list(range(len(payloads))), 7, "producer", keys=[key] * len(payloads) if key else None
    )
    return wal.append(encoded, len(payloads))


def record_starts(path: Path) -> list[int]:
    data = path.read_bytes()
    starts, position = [], 0
    while position < len(data):
        starts.append(position)
        position += HEADER_BYTES + HEADER.unpack_from(data, position)[1]
    return starts


def read_all(wal: WalLog, start_offset: int = 0) -> list[bytes]:
    return wal.read(start_offset, max_bytes=1 << 30, upto_offset=wal.next_offset).payloads


def small_log(directory: Path) -> tuple[Path, list[bytes]]:
    """One segment of five records in three batches, closed (synced)."""
    payloads = [b"one", b"two" * 5, b"", b"four" * 2, b"five"]
    with open_log(directory) as wal:
        append_payloads(wal, payloads[:2])
        append_payloads(wal, payloads[2:3], key="k")
        append_payloads(wal, payloads[3:])
    return directory / segment_file_name(0), payloads


def unacknowledged_tail(path: Path, base_offset: int, payloads: list[bytes]) -> bytes:
    """Records appended to the file after its last sync (written, in the page cache, never
    acknowledged): what a crash may tear."""
    tail = encode_batch(base_offset, payloads, list(range(len(payloads))), 7, "producer")
    with open(path, "ab") as file:
        file.write(tail)
    return tail


def test_every_truncation_point_of_the_unacknowledged_tail_keeps_every_acknowledged_record(
        tmp_path: Path, no_fsync: None) -> None:
    """Exhaustive over a small file: five acknowledged records, then three written and
    never synced. A cut anywhere in those three is a torn tail: the log keeps exactly
    the whole records (all five acknowledged ones at least), cuts the file there,
    reports the bytes dropped, and appends continue at the next offset."""
    path, payloads = small_log(tmp_path / "original")
    acknowledged_size = path.stat().st_size
    unacknowledged_tail(path, 5, [b"six", b"seven" * 9, b"eight"])
    payloads = [*payloads, b"six", b"seven" * 9, b"eight"]
    size = path.stat().st_size
    boundaries = [*record_starts(path), size]
    for cut in range(acknowledged_size, size + 1):
        copy = tmp_path / f"cut-{cut}"
        shutil.copytree(path.parent, copy)
        with open(copy / path.name, "r+b") as file:
            file.truncate(cut)
        kept = max(i for i, boundary in enumerate(boundaries) if boundary <= cut)
        assert kept >= 5
        with open_log(copy) as wal:
            report = wal.recovery()
            assert (wal.next_offset, report.next_offset, report.records) == (kept, kept, kept)
            assert report.truncated_bytes == cut - boundaries[kept]
            assert (copy / path.name).stat().st_size == boundaries[kept]
            assert read_all(wal) == payloads[:kept]
            assert append_payloads(wal, [b"after"]) == kept
        with open_log(copy) as wal:
            assert read_all(wal) == [*payloads[:kept], b"after"]
        shutil.rmtree(copy)


def test_every_truncation_point_inside_acknowledged_records_is_damage_not_a_cut(
        tmp_path: Path, no_fsync: None) -> None:
    """Exhaustive: a file cut anywhere below its acknowledged end (recorded in the
    frontier at sync) is refused with WalDamaged naming file, byte and the lost range;
    the file is left exactly as found and a copy is set aside in quarantine/."""
    path, _ = small_log(tmp_path / "original")
    original = path.read_bytes()
    boundaries = record_starts(path)
    for cut in range(len(original)):
        copy = tmp_path / f"cut-{cut}"
        shutil.copytree(path.parent, copy)
        with open(copy / path.name, "r+b") as file:
            file.truncate(cut)
        kept = max(i for i, boundary in enumerate(boundaries) if boundary <= cut)
        with pytest.raises(WalDamaged) as caught:
            open_log(copy)
        assert (caught.value.valid_end, caught.value.claimed_end, caught.value.acknowledged_offset) == (kept, 5, 5)
        assert (copy / path.name).read_bytes() == original[:cut]
        assert caught.value.quarantined is not None and caught.value.quarantined.read_bytes() == original[:cut]
        shutil.rmtree(copy)


@pytest.mark.parametrize("frontier_kept", [True, False])
def test_flipped_bit_in_the_active_segment_is_damage_never_a_cut(tmp_path: Path, no_fsync: None,
                                                                 frontier_kept: bool) -> None:
    """Exhaustive over a small acknowledged file, one bit per byte: open refuses with
    WalDamaged at the damaged record's byte, nothing is cut. Without the frontier file
    (lost with a power failure), a valid record after the damage still proves it: only
    damage in the last record then reads as a torn tail."""
    path, _ = small_log(tmp_path / "original")
    original = path.read_bytes()
    starts = record_starts(path)
    for position in range(len(original)):
        damaged = bytearray(original)
        damaged[position] ^= 1 << (position % 8)
        path.write_bytes(bytes(damaged))
        if not frontier_kept:
            (path.parent / "frontier").unlink(missing_ok=True)
        record = max(i for i, start in enumerate(starts) if start <= position)
        if not frontier_kept and record == len(starts) - 1:
            with open_log(path.parent) as wal:
                assert wal.next_offset == record
            path.write_bytes(original)
            continue
        with pytest.raises(WalDamaged) as caught:
            open_log(path.parent)
        assert caught.value.position == starts[record] and caught.value.valid_end == record, position
        assert path.read_bytes() == bytes(damaged)
    path.write_bytes(original)


def test_damage_is_logged_at_error_with_file_and_byte(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Damage is an ERROR naming the file, the byte and the first offset lost; a torn
    tail stays a WARNING with the bytes dropped."""
    path, _ = small_log(tmp_path)
    starts = record_starts(path)
    data = bytearray(path.read_bytes())
    data[starts[2] + HEADER_BYTES] ^= 0x01
    path.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger="danube_zmq.storage.wal"), pytest.raises(WalDamaged):
        open_log(tmp_path)
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert any(str(path) in m and f"byte {starts[2]}" in m and "offset 2 on" in m for m in errors), errors


def test_recovery_logs_a_warning_with_the_bytes_dropped(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A torn tail is logged at WARNING with the number of bytes dropped."""
    path, _ = small_log(tmp_path)
    with open(path, "ab") as file:
        file.write(b"\x00" * 10)
    with caplog.at_level(logging.WARNING, logger="danube_zmq.storage.wal"):
        open_log(tmp_path).close()
    assert any("dropped 10 bytes" in record.getMessage() and record.levelno == logging.WARNING for record in caplog.records)


def test_repair_keeps_the_prefix_and_continues_past_every_offset_given_out(tmp_path: Path) -> None:
    """After damage in record 2 of 5 (records 3 and 4 still valid), repair with the
    topic's reserved end 9 gives up exactly offsets 2..8 (2..4 acknowledged), keeps 0..1
    readable, sets the damaged file aside, and the log continues at 9 across reopens;
    a read into the lost range stops there and `gap_end` says where the log goes on."""
    path, payloads = small_log(tmp_path)
    starts = record_starts(path)
    data = bytearray(path.read_bytes())
    data[starts[2] + HEADER_BYTES + 1] ^= 0x04
    path.write_bytes(bytes(data))
    with pytest.raises(WalDamaged):
        open_log(tmp_path)
    report = WalLog.repair(tmp_path, resume_offset=9, clock=ManualClock())
    assert (report.lost, report.acknowledged_lost, report.next_offset) == ((2, 9), (2, 5), 9)
    assert any(p.read_bytes() == bytes(data) for p in report.quarantined)
    for _ in range(2):
        with open_log(tmp_path) as wal:
            assert wal.next_offset >= 9 and read_all(wal) == payloads[:2]
            assert wal.gap_end(2) == 9 and wal.gap_end(8) == 9 and wal.gap_end(1) is None and wal.gap_end(9) is None
            if wal.next_offset == 9:
                assert append_payloads(wal, [b"nine"]) == 9
    with open_log(tmp_path) as wal:
        assert wal.read(9, max_bytes=1 << 20, upto_offset=wal.next_offset).payloads == [b"nine"]
        assert wal.read(3, max_bytes=1 << 20, upto_offset=wal.next_offset).payloads == []


def test_repair_of_a_whole_log_below_its_resume_offset_starts_past_it(tmp_path: Path) -> None:
    """A whole log that ends below what the topic gave out (its last segment file lost):
    repair gives up the missing offsets only, and keeps every record."""
    _, payloads = small_log(tmp_path)
    report = WalLog.repair(tmp_path, resume_offset=20, clock=ManualClock())
    assert (report.lost, report.acknowledged_lost, report.next_offset, report.quarantined) == ((5, 20), None, 20, [])
    with open_log(tmp_path) as wal:
        assert wal.next_offset == 20 and read_all(wal) == payloads


def test_corrupt_record_in_a_sealed_segment_makes_open_raise(tmp_path: Path) -> None:
    """Damage in the middle of a sealed segment is not a torn tail: open raises
    CorruptRecord naming the file and the damaged record's byte position."""
    with open_log(tmp_path, segment_bytes_max=400) as wal:
        for number in range(30):
            append_payloads(wal, [b"%d" % number * 10])
        sealed = [info for info in wal.segments() if info.sealed]
    assert len(sealed) >= 2
    victim = sealed[0].path
    starts = record_starts(victim)
    middle = starts[len(starts) // 2]
    data = bytearray(victim.read_bytes())
    data[middle + HEADER_BYTES + 2] ^= 0x10
    victim.write_bytes(bytes(data))
    with pytest.raises(CorruptRecord) as caught:
        open_log(tmp_path, segment_bytes_max=400)
    assert caught.value.path == victim
    assert caught.value.position == middle
    assert victim.name in str(caught.value) and f"byte {middle}" in str(caught.value)
    assert "bad_crc" in caught.value.reason


def test_torn_tail_of_a_sealed_segment_makes_open_raise(tmp_path: Path) -> None:
    """A sealed segment was fsynced whole before the next one was created, so a short
    one is damage too, and so is a gap between segment files."""
    with open_log(tmp_path, segment_bytes_max=200) as wal:
        for _ in range(10):
            append_payloads(wal, [b"x" * 50])
        paths = [info.path for info in wal.segments()]
    assert len(paths) >= 4
    with open(paths[0], "r+b") as file:
        file.truncate(paths[0].stat().st_size - 1)
    with pytest.raises(CorruptRecord, match=re.escape(paths[0].name)):
        open_log(tmp_path)
    paths[0].unlink()
    paths[2].unlink()
    with pytest.raises(CorruptRecord, match="segment starts at offset"):
        open_log(tmp_path)


def test_randomized_appends_rolls_and_reopens_keep_offsets_continuous(tmp_path: Path, no_fsync: None) -> None:
    """Seeded random sequences of appends (small and large batches), syncs, age and size
    rolls, seals, closes and reopens, deletions and reads with random max_bytes: offsets
    stay continuous, reads return exactly the model's records from start_offset, never
    more than max_bytes of records (except a single record) and never stop early."""
    for seed in range(10):
        rng = random.Random(seed)
        clock = ManualClock()
        directory = tmp_path / f"seed-{seed}"
        options = {"segment_bytes_max": rng.choice([300, 1000, 5000]), "segment_age_ms_max": rng.choice([None, 50])}
        wal = open_log(directory, clock, index_interval_bytes=rng.choice([1, 64, 512]), **options)
        model: list[tuple[bytes, int]] = []  # (payload, record bytes) by offset
        log_start = 0
        for _ in range(300):
            action = rng.random()
            if action < 0.45:
                count = rng.choice([1, 1, 2, 5, 20])
                payloads = [rng.randbytes(rng.choice([0, 5, 40, 300])) for _ in range(count)]
                encoded = encode_batch(wal.next_offset, payloads, [clock.monotonic_ms()] * count, 3, "p", keys=["key"] * count)
                assert wal.append(encoded, count) == len(model)
                starts = record_starts_of(encoded)
                model += [(p, end - start) for p, start, end in zip(payloads, starts, [*starts[1:], len(encoded)], strict=True)]
            elif action < 0.55:
                wal.sync()
            elif action < 0.6:
                clock.advance(rng.choice([10, 60]))
            elif action < 0.63:
                wal.seal_active()
            elif action < 0.68:
                wal.close()
                wal = open_log(directory, clock, index_interval_bytes=rng.choice([1, 64, 512]), **options)
                assert wal.next_offset == len(model)
                assert wal.log_start_offset == log_start
                assert wal.recovery().truncated_bytes == 0
            elif action < 0.71:
                wal.delete_segments_before(rng.randint(0, len(model)))
                log_start = wal.log_start_offset
                assert wal.segments()[-1].sealed is False
            else:
                if len(model) == log_start:
                    continue
                start = rng.randint(log_start, len(model))
                upto = rng.randint(start, len(model))
                max_bytes = rng.choice([1, 50, 200, 1000, 100_000])
                records = wal.read(start, max_bytes=max_bytes, upto_offset=upto)
                check_read(records, model, start, upto, max_bytes)
            infos = wal.segments()
            assert all(a.next_offset == b.base_offset for a, b in itertools.pairwise(infos))
            assert infos[-1].next_offset == wal.next_offset == len(model)
            assert infos[0].base_offset == wal.log_start_offset == log_start
        assert read_all(wal, log_start) == [payload for payload, _ in model[log_start:]]
        wal.close()


def record_starts_of(encoded: bytes) -> list[int]:
    starts, position = [], 0
    while position < len(encoded):
        starts.append(position)
        position += HEADER_BYTES + HEADER.unpack_from(encoded, position)[1]
    return starts


def check_read(records: RecordBatch, model: list[tuple[bytes, int]], start: int, upto: int, max_bytes: int) -> None:
    assert records.offsets == list(range(start, start + len(records)))
    assert records.payloads == [payload for payload, _ in model[start : start + len(records)]]
    end = start + len(records)
    assert end <= upto
    if start < upto:
        assert len(records) >= 1
    taken = sum(size for _, size in model[start:end])
    assert taken <= max_bytes or len(records) == 1
    if end < upto:
        assert taken + model[end][1] > max_bytes, "read stopped before max_bytes was reached"


def test_damage_after_recovery_is_caught_by_the_read(tmp_path: Path) -> None:
    """Reads check CRCs too: bytes damaged under a running log raise CorruptRecord
    naming the file and the record's position, records before it still read."""
    with open_log(tmp_path) as wal:
        append_payloads(wal, [b"a" * 20, b"b" * 20, b"c" * 20])
        wal.sync()
        path = wal.segments()[0].path
        starts = record_starts(path)
        with open(path, "r+b") as file:
            file.seek(starts[1] + HEADER_BYTES + 5)
            file.write(b"X")
        assert wal.read(0, max_bytes=1 << 20, upto_offset=1).payloads == [b"a" * 20]
        with pytest.raises(CorruptRecord) as caught:
            wal.read(0, max_bytes=1 << 20, upto_offset=3)
        assert (caught.value.path, caught.value.position) == (path, starts[1])
        assert "bad_crc" in caught.value.reason


def test_read_spans_segments_and_respects_upto_offset(tmp_path: Path) -> None:
    """A read crosses segment files in order and stops at upto_offset (the committed frontier)."""
    with open_log(tmp_path, segment_bytes_max=150) as wal:
        for number in range(20):
            append_payloads(wal, [b"%02d" % number * 10])
        assert len(wal.segments()) > 5
        records = wal.read(3, max_bytes=1 << 20, upto_offset=17)
        assert records.offsets == list(range(3, 17))
        assert records.payloads == [b"%02d" % n * 10 for n in range(3, 17)]
        assert records.keys == [None] * 14 and records.producer_names == ["producer"] * 14
        assert len(wal.read(20, max_bytes=100, upto_offset=20)) == 0
        assert len(wal.read(25, max_bytes=100, upto_offset=30)) == 0


def test_record_larger_than_max_bytes_and_index_window_is_read_whole(tmp_path: Path) -> None:
    """A record bigger than max_bytes is returned alone, and one bigger than the recovery
    window (the index interval) is scanned whole at open."""
    big = os.urandom(200_000)
    with open_log(tmp_path, index_interval_bytes=64 * 1024) as wal:
        append_payloads(wal, [b"small", big, b"tail"])
    with open_log(tmp_path, index_interval_bytes=64 * 1024) as wal:
        assert wal.next_offset == 3 and wal.recovery().truncated_bytes == 0
        assert wal.read(1, max_bytes=100, upto_offset=3).payloads == [big]
        assert wal.read(0, max_bytes=100, upto_offset=3).payloads == [b"small"]
        assert wal.read(2, max_bytes=1, upto_offset=3).payloads == [b"tail"]


def test_segments_roll_by_size_and_by_age(tmp_path: Path) -> None:
    """The active segment rolls before an append that would take it above
    segment_bytes_max (a lone larger batch still fits), or once it is old enough."""
    clock = ManualClock()
    with open_log(tmp_path, clock, segment_bytes_max=100, segment_age_ms_max=1000) as wal:
        append_payloads(wal, [b"x" * 200])  # larger than a segment: alone in the first one
        assert len(wal.segments()) == 1
        append_payloads(wal, [b"y"])
        assert [info.base_offset for info in wal.segments()] == [0, 1]
        append_payloads(wal, [b"z"])
        assert len(wal.segments()) == 2
        clock.advance(999)
        assert not wal.should_roll()
        clock.advance(1)
        assert wal.should_roll()
        append_payloads(wal, [b"w"])
        infos = wal.segments()
        assert [(i.base_offset, i.next_offset, i.sealed) for i in infos] == [(0, 1, True), (1, 3, True), (3, 4, False)]
        assert [i.path.name for i in infos] == [segment_file_name(0), segment_file_name(1), segment_file_name(3)]
        assert segment_file_name(3) == "00000000000000000003.wal"


def test_seal_active_makes_the_segment_immutable(tmp_path: Path) -> None:
    """seal_active rolls: the sealed file is synced and no longer written; an empty
    active segment has nothing to seal."""
    with open_log(tmp_path) as wal:
        assert wal.seal_active() is None
        append_payloads(wal, [b"a", b"b"])
        sealed = wal.seal_active()
        assert sealed is not None and sealed.sealed and (sealed.base_offset, sealed.next_offset) == (0, 2)
        size = sealed.path.stat().st_size
        append_payloads(wal, [b"c"])
        assert sealed.path.stat().st_size == size
        assert wal.segments()[-1].base_offset == 2
        assert read_all(wal) == [b"a", b"b", b"c"]


def test_delete_segments_before_keeps_active_and_later_records(tmp_path: Path) -> None:
    """Only sealed segments whose records all lie below the limit go; the active one
    stays even when entirely below; reads below the new start raise OffsetOutOfRange."""
    with open_log(tmp_path, segment_bytes_max=200) as wal:
        for number in range(12):
            append_payloads(wal, [b"%d" % number * 30])
        infos = wal.segments()
        assert len(infos) >= 4
        limit = infos[2].base_offset + 1  # inside the third segment
        assert wal.delete_segments_before(limit) == 2
        assert wal.log_start_offset == infos[2].base_offset
        assert not infos[0].path.exists() and not infos[1].path.exists() and infos[2].path.exists()
        with pytest.raises(OffsetOutOfRange) as caught:
            wal.read(0, max_bytes=100, upto_offset=wal.next_offset)
        assert caught.value.log_start_offset == infos[2].base_offset
        assert wal.read(wal.log_start_offset, max_bytes=1 << 20, upto_offset=12).offsets == list(range(infos[2].base_offset, 12))
        wal.delete_segments_before(10**9)
        assert len(wal.segments()) == 1 and not wal.segments()[0].sealed
        assert wal.log_start_offset == infos[-1].base_offset
        assert wal.statistics().segments == 1
    with open_log(tmp_path) as wal:
        assert wal.log_start_offset == infos[-1].base_offset and wal.next_offset == 12


def test_empty_directory_starts_at_zero_or_at_start_offset(tmp_path: Path) -> None:
    """A new log starts at 0, or at start_offset when resuming after durable segments;
    a local log behind that start offset is refused rather than reusing offsets."""
    with open_log(tmp_path / "new") as wal:
        assert (wal.log_start_offset, wal.next_offset) == (0, 0)
        assert wal.recovery().segments == 1
    with open_log(tmp_path / "moved", start_offset=500) as wal:
        assert (wal.log_start_offset, wal.next_offset) == (500, 500)
        assert append_payloads(wal, [b"a"]) == 500
        with pytest.raises(OffsetOutOfRange):
            wal.read(499, max_bytes=10, upto_offset=501)
    with open_log(tmp_path / "moved", start_offset=501) as wal:
        assert wal.next_offset == 501
    with pytest.raises(FailedPrecondition):
        open_log(tmp_path / "moved", start_offset=600)


def test_append_asserts_records_start_at_next_offset(tmp_path: Path) -> None:
    """Encoding at the wrong offset is our bug: an assertion, and nothing is written."""
    with open_log(tmp_path) as wal:
        append_payloads(wal, [b"a"])
        with pytest.raises(AssertionError):
            wal.append(encode_batch(5, [b"b"], [0], 1, "p"), 1)
        assert wal.next_offset == 1 and read_all(wal) == [b"a"]


def test_write_error_propagates_unchanged_and_leaves_no_partial_batch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An OSError (ENOSPC) in the middle of a write reaches the caller as is; the partial
    batch is cut off, so the next append and a reopen see a whole log."""
    wal = open_log(tmp_path)
    append_payloads(wal, [b"kept"])
    real_pwrite = os.pwrite
    calls = []

    def failing_pwrite(fd: int, data: memoryview, position: int) -> int:
        calls.append(position)
        if len(calls) == 1:
            return real_pwrite(fd, bytes(data[:10]), position)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(wal_files.current, "pwrite", failing_pwrite)
    with pytest.raises(OSError) as caught:
        append_payloads(wal, [b"lost" * 10])
    assert caught.value.errno == errno.ENOSPC
    monkeypatch.setattr(wal_files.current, "pwrite", real_pwrite)
    assert wal.next_offset == 1
    assert append_payloads(wal, [b"next"]) == 1
    wal.close()
    with open_log(tmp_path) as reopened:
        assert read_all(reopened) == [b"kept", b"next"] and reopened.recovery().truncated_bytes == 0


def test_sync_fsyncs_the_directory_after_a_new_segment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A new segment file's name is made durable by an fsync of the directory at the next sync."""
    synced: list[int] = []
    real_fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        synced.append(os.fstat(fd).st_mode)
        real_fsync(fd)

    monkeypatch.setattr(wal_files.current, "fsync", recording_fsync)
    with open_log(tmp_path, segment_bytes_max=50) as wal:
        wal.sync()
        assert any(stat.S_ISDIR(mode) for mode in synced)  # the first segment's creation
        synced.clear()
        append_payloads(wal, [b"x" * 40])
        wal.sync()
        assert [stat.S_ISDIR(mode) for mode in synced] == [False]  # data only
        synced.clear()
        append_payloads(wal, [b"y" * 40])  # rolls; x was synced already
        assert synced == []
        append_payloads(wal, [b"z" * 40])  # rolls: y, not yet synced, is fsynced first
        assert [stat.S_ISDIR(mode) for mode in synced] == [False]
        wal.sync()
        assert [stat.S_ISDIR(mode) for mode in synced] == [False, False, True]  # new segment, then directory
        stats = wal.statistics()
        assert (stats.appends, stats.syncs, stats.segments, stats.next_offset) == (3, 3, 3, 3)


def test_bad_segment_file_name_is_refused_and_other_files_ignored(tmp_path: Path) -> None:
    """Only `<20 digits>.wal` files are segments; a malformed .wal name is an error."""
    (tmp_path / "notes.txt").write_text("hello")
    with open_log(tmp_path) as wal:
        append_payloads(wal, [b"a"])
    (tmp_path / "42.wal").write_bytes(b"")
    with pytest.raises(CorruptRecord, match=re.escape("42.wal")):
        open_log(tmp_path)


def test_reader_thread_sees_committed_records_while_the_writer_appends(tmp_path: Path) -> None:
    """A reader thread reading up to the synced frontier while the writer appends, rolls
    and deletes sees continuous, intact records or OffsetOutOfRange, nothing else."""
    wal = open_log(tmp_path, segment_bytes_max=2000, index_interval_bytes=128)
    committed = 0
    done = threading.Event()
    failures: list[BaseException] = []

    def reader() -> None:
        rng = random.Random(1)
        while not done.is_set() or rng.random() < 0.5:
            frontier = committed
            start = rng.randint(max(0, frontier - 200), max(0, frontier))
            try:
                records = wal.read(start, max_bytes=rng.choice([100, 5000]), upto_offset=frontier)
            except OffsetOutOfRange:
                continue
            except BaseException as exc:  # reported to the main thread
                failures.append(exc)
                return
            if records.offsets != list(range(start, start + len(records))) or any(
                payload != b"%d" % offset * 5 for offset, payload in zip(records.offsets, records.payloads, strict=True)
            ):
                failures.append(AssertionError(f"bad read at {start}"))
                return

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for _ in range(300):
            base = wal.next_offset
            append_payloads(wal, [b"%d" % offset * 5 for offset in range(base, base + 4)])
            wal.sync()
            committed = wal.next_offset
            if base % 40 == 0:
                wal.delete_segments_before(base - 100)
    finally:
        done.set()
        thread.join()
        wal.close()
    assert not failures, failures

"""The pure recovery core: a torn tail is only a bad suffix with nothing valid after it,
above the acknowledged frontier; anything else is corruption, never a silent cut."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from danube_zmq.storage.wal import HEADER, HEADER_BYTES, encode_batch, scan
from danube_zmq.storage.wal import frontier as wal_frontier
from danube_zmq.storage.wal.recovery import Survey, judge, resync, survey


def written(base_offset: int, sizes: list[int], seed: int) -> tuple[bytes, list[int]]:
    """Records of the given payload sizes (random bytes), and each record's start byte."""
    rng = random.Random(seed)
    parts = [encode_batch(base_offset + i, [rng.randbytes(size)], [1_700_000_000_000 + i], 3, "p")
             for i, size in enumerate(sizes)]
    buf = b"".join(parts)
    starts, position = [], 0
    for part in parts:
        starts.append(position)
        position += len(part)
    return buf, starts


def verdict_of(buf: bytes, *, base_offset: int, acknowledged_offset: int | None) -> tuple[int, bool | None]:
    """What recovery of a lone active segment decides: (records kept, corrupt?) with
    None for a whole file."""
    result = scan(buf, expected_offset=base_offset, decode=False)
    assert result.next_offset is not None
    if result.fault is None:
        if acknowledged_offset is not None and result.next_offset < acknowledged_offset:
            return result.next_offset - base_offset, True
        return result.next_offset - base_offset, None
    after = survey(buf, fault_position=result.fault.position, expected_offset=result.next_offset)
    verdict = judge(fault=result.fault, fault_offset=result.next_offset, after=after,
                    acknowledged_offset=acknowledged_offset)
    return result.next_offset - base_offset, verdict.corrupt


_sizes = st.lists(st.integers(min_value=0, max_value=600), min_size=1, max_size=12)


@settings(max_examples=60, deadline=None)
@given(sizes=_sizes, acknowledged=st.integers(min_value=0, max_value=12), base=st.integers(0, 2**40),
       seed=st.integers(0, 2**32), data=st.data())
def test_no_truncation_point_loses_an_acknowledged_record(sizes: list[int], acknowledged: int, base: int, seed: int,
                                                          data: st.DataObject) -> None:
    """Records [0, acknowledged) were fsynced, the rest written only. A cut anywhere in
    the unacknowledged part is a torn tail that keeps every acknowledged record; a cut
    inside the acknowledged part is corruption, never a silent cut."""
    acknowledged = min(acknowledged, len(sizes))
    buf, starts = written(base, sizes, seed)
    for cut in data.draw(st.lists(st.integers(0, len(buf)), min_size=1, max_size=40)):
        kept, corrupt = verdict_of(buf[:cut], base_offset=base, acknowledged_offset=base + acknowledged)
        acknowledged_end = starts[acknowledged] if acknowledged < len(starts) else len(buf)
        if cut < acknowledged_end:
            assert corrupt is True, cut
        else:
            assert corrupt is not True and kept >= acknowledged, cut


@settings(max_examples=40, deadline=None)
@given(sizes=_sizes, base=st.integers(0, 2**40), seed=st.integers(0, 2**32),
       frontier_known=st.booleans(), data=st.data())
def test_a_flipped_bit_in_any_header_or_body_is_never_a_silent_loss(sizes: list[int], base: int, seed: int,
                                                                    frontier_known: bool, data: st.DataObject) -> None:
    """All records acknowledged; one bit flipped at sampled positions of every record
    (each header byte and some body bytes). Always corruption when the frontier is
    known; without it (lost with a power failure), corruption whenever a record follows
    the damaged one, and only the last record can read as a torn tail."""
    buf, starts = written(base, sizes, seed)
    ends = [*starts[1:], len(buf)]
    positions = []
    for start, end in zip(starts, ends, strict=True):
        positions += range(start, start + HEADER_BYTES)
        positions += data.draw(st.lists(st.integers(start, end - 1), max_size=4))
    for position in positions:
        damaged = bytearray(buf)
        damaged[position] ^= 1 << data.draw(st.integers(0, 7))
        record = max(i for i, start in enumerate(starts) if start <= position)
        acknowledged = base + len(sizes) if frontier_known else None
        kept, corrupt = verdict_of(bytes(damaged), base_offset=base, acknowledged_offset=acknowledged)
        assert kept == record, (position, kept, record)
        if frontier_known or record < len(sizes) - 1:
            assert corrupt is True, position
        else:
            assert corrupt is False, position


def test_resync_finds_the_record_after_a_damaged_length() -> None:
    """A length field that points past the next record: resync finds the next record's
    header by its offset and CRC, at its true position."""
    buf, starts = written(100, [50, 50, 50], 1)
    damaged = bytearray(buf)
    HEADER.pack_into(damaged, starts[0], 100, 60, HEADER.unpack_from(buf, starts[0])[2])
    found = resync(bytes(damaged), start=1, expected_offset=100)
    assert found is not None and (found.position, found.offset) == (starts[1], 101)


def test_resync_skips_zero_runs_and_finds_nothing_in_them() -> None:
    """Megabytes of zeros after a fault (a zero-filled block) hold no record; resync
    says so without trying each position, and finds a record placed after them."""
    zeros = bytes(4 << 20)
    assert resync(zeros, start=0, expected_offset=0) is None
    record, _ = written(7, [10], 2)
    found = resync(zeros + record, start=0, expected_offset=5)
    assert found is not None and (found.position, found.offset) == (len(zeros), 7)


def test_resync_ignores_valid_records_below_the_expected_offset() -> None:
    """Only offsets at or above the damaged record's count: an older record (a copy of
    an earlier one inside a payload) is not evidence of later data."""
    old, _ = written(3, [10], 3)
    assert resync(b"\x01" * 7 + old, start=0, expected_offset=4) is None
    assert resync(b"\x01" * 7 + old, start=0, expected_offset=3) is not None


def test_survey_reports_the_highest_offset_after_the_fault() -> None:
    """Two runs of good records separated by damage: the survey's end is one past the
    last good record of the file."""
    buf, starts = written(10, [20] * 6, 4)
    damaged = bytearray(buf)
    damaged[starts[1] + 20] ^= 0x10
    damaged[starts[4] + 20] ^= 0x10
    after = survey(bytes(damaged), fault_position=starts[1], expected_offset=11)
    assert after.first is not None and after.first.offset == 12
    assert after.end_offset == 16


def test_judge_names_the_reason() -> None:
    """The verdict's reason names the fault kind, the byte and the record, and why it is
    corruption (a valid record after it, or below the frontier)."""
    buf, starts = written(0, [5, 5], 5)
    fault = scan(buf[: len(buf) - 1], expected_offset=0, decode=False).fault
    assert fault is not None
    torn = judge(fault=fault, fault_offset=1, after=Survey(first=None, end_offset=None), acknowledged_offset=1)
    assert not torn.corrupt and "torn tail" in torn.reason
    below = judge(fault=fault, fault_offset=1, after=Survey(first=None, end_offset=None), acknowledged_offset=2)
    assert below.corrupt and f"byte {starts[1]}" in below.reason and "acknowledged frontier 2" in below.reason


def test_frontier_slots_survive_a_torn_write(tmp_path) -> None:
    """The frontier file keeps two CRC'd slots written in turn: the highest valid one is
    read; a torn (garbled) slot falls back to the other; no valid slot is unknown."""
    writer = wal_frontier.FrontierFile(tmp_path)
    for offset in (5, 9, 12):
        writer.advance(offset)
    writer.advance(3)  # never moves back
    writer.sync()
    writer.close()
    assert wal_frontier.read(tmp_path) == 12
    data = bytearray((tmp_path / wal_frontier.FRONTIER_FILE).read_bytes())
    data[2] ^= 0xFF  # slot 0 holds 12 (written first and third)
    assert wal_frontier.decode(bytes(data)) == 9
    data[18] ^= 0xFF
    assert wal_frontier.decode(bytes(data)) is None
    assert wal_frontier.read(tmp_path / "absent") is None

"""The compacted ledger file: records at their own sparse offsets in the WAL's format,
every field kept, reads by offset and size, and any damage raised, never skipped."""

from __future__ import annotations

import os
import struct
import tempfile
from pathlib import Path
from unittest import mock

import crc32c
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from danube_zmq.storage.wal import HEADER_BYTES, CorruptRecord, RecordBatch, encode_batch, encode_checkpoints
from danube_zmq.storage.wal import files as wal_files
from danube_zmq.storage.wal.compacted import (
    Ledger,
    LedgerWriter,
    ledger_file_name,
    ledgers_in,
    parse_ledger_file_name,
    remove_ledgers_except,
)
from danube_zmq.transport.errors import InternalError

FIELDS = ("offsets", "payloads", "keys", "attributes", "publish_times", "producer_ids", "producer_names", "schema_ids",
          "schema_versions", "sequence_ids")


def batch_of(rows: list[tuple]) -> RecordBatch:
    """A RecordBatch of rows, each the record's fields in `FIELDS` order."""
    columns = [list(column) for column in zip(*rows, strict=True)] if rows else [[] for _ in FIELDS]
    return RecordBatch(**dict(zip(FIELDS, columns, strict=True)))


def rows_of(batch: RecordBatch) -> list[tuple]:
    return list(zip(*(getattr(batch, name) for name in FIELDS), strict=True))


def sample_rows() -> list[tuple]:
    """Sparse offsets, every field varied: attributes, schema ids, sequence ids None and int."""
    return [
        (3, b"alpha", "k1", {"a": "1", "b": "2"}, 1_700_000_000_000, 7, "producer-a", 4, 2, 11),
        (4, b"beta" * 100, None, None, 2, 7, "producer-a", None, None, None),
        (9, b"", "k2", {}, 3, 2**40, "", 1, None, 0),
        (10, b"\x00" * 70_000, "", None, 2**33, 8, "b", None, 5, 2**40),
        (57, b"last", "k3", {"x": ""}, 5, 9, "c", 2**32, 2**32, None),
    ]


def record_bytes(row: tuple) -> int:
    """A record's size in the file, header included."""
    offset, payload, key, attributes, publish_time, producer_id, producer_name, schema_id, schema_version, sequence = row
    return len(encode_batch(offset, [payload], [publish_time], producer_id, producer_name, keys=[key],
                            attributes=[attributes], schema_id=schema_id, schema_version=schema_version,
                            sequence_ids=None if sequence is None else [sequence]))


def write_ledger(directory: Path, horizon: int, rows: list[tuple], *, split: int = 2) -> Path:
    """Commit a ledger of `rows`, appended in two batches with a few records masked out
    (rows with payload b"drop" are masked)."""
    with LedgerWriter(directory, horizon) as writer:
        for part in (rows[:split], rows[split:]):
            batch = batch_of(part)
            writer.append(batch, [payload != b"drop" for payload in batch.payloads])
        return writer.commit()


def record_starts(rows: list[tuple]) -> list[int]:
    starts, position = [], 0
    for row in rows:
        starts.append(position)
        position += record_bytes(row)
    return starts


def test_round_trip_keeps_every_field_at_sparse_offsets(tmp_path: Path) -> None:
    """What the writer was given (minus the masked records) reads back field for field,
    at the original, non-consecutive offsets; counters match the file."""
    rows = sample_rows()
    with_dropped = rows[:2] + [(5, b"drop", "k9", None, 0, 0, "", None, None, None)] + rows[2:]
    with LedgerWriter(tmp_path, 100) as writer:
        batch = batch_of(with_dropped)
        writer.append(batch, [payload != b"drop" for payload in batch.payloads])
        path = writer.commit()
    assert path == tmp_path / "00000000000000000100.compacted"
    assert writer.records == len(rows) and writer.bytes == path.stat().st_size == sum(map(record_bytes, rows))
    with Ledger.open(path) as ledger:
        assert ledger.horizon == 100 and ledger.path == path
        assert len(ledger) == len(rows) and ledger.size_bytes == writer.bytes
        assert rows_of(ledger.read(0, 1 << 30)) == rows
        chunks = list(ledger.records(batch_bytes=1))
        assert [len(chunk) for chunk in chunks] == [1] * len(rows)
        assert [row for chunk in chunks for row in rows_of(chunk)] == rows


def test_read_from_inside_a_gap_starts_at_the_next_record(tmp_path: Path) -> None:
    """A start between two offsets reads from the next offset held; past the last, nothing."""
    rows = sample_rows()
    with Ledger.open(write_ledger(tmp_path, 100, rows)) as ledger:
        assert ledger.read(5, 1 << 30).offsets == [9, 10, 57]
        assert ledger.read(11, 1 << 30).offsets == [57]
        assert ledger.read(0, 1 << 30).offsets == [3, 4, 9, 10, 57]
        assert len(ledger.read(58, 1 << 30)) == 0


def test_read_stops_at_max_bytes_but_returns_one(tmp_path: Path) -> None:
    """Records are taken while their bytes (headers included) stay within max_bytes, and
    the first one always, however large."""
    rows = sample_rows()
    sizes = list(map(record_bytes, rows))
    with Ledger.open(write_ledger(tmp_path, 100, rows)) as ledger:
        assert ledger.read(3, sizes[0] + sizes[1]).offsets == [3, 4]
        assert ledger.read(3, sizes[0] + sizes[1] - 1).offsets == [3]
        assert ledger.read(3, 1).offsets == [3]
        assert ledger.read(10, 1).offsets == [10]
        assert ledger.read(4, sum(sizes[1:4])).offsets == [4, 9, 10]
        assert ledger.read(4, sum(sizes[1:4]) - 1).offsets == [4, 9]


def test_first_offset_at_or_after(tmp_path: Path) -> None:
    """The next offset held at or after any offset; None past the last."""
    with Ledger.open(write_ledger(tmp_path, 100, sample_rows())) as ledger:
        assert [ledger.first_offset_at_or_after(o) for o in (0, 3, 4, 5, 10, 11, 57, 58, 99)] == [
            3, 3, 4, 9, 10, 57, 57, None, None]


def test_empty_ledger(tmp_path: Path) -> None:
    """A ledger may hold nothing (every key deleted): an empty file that opens and reads empty."""
    path = write_ledger(tmp_path, 7, [])
    assert path.stat().st_size == 0
    with Ledger.open(path) as ledger:
        assert len(ledger) == 0 and ledger.horizon == 7
        assert len(ledger.read(0, 1 << 20)) == 0
        assert ledger.first_offset_at_or_after(0) is None
        assert list(ledger.records()) == []


def test_flipped_byte_raises_corrupt_record_naming_the_file(tmp_path: Path) -> None:
    """A byte flipped anywhere in a record (header or body) fails its CRC at open: the
    error names the file and the record's first byte."""
    rows = sample_rows()
    path = write_ledger(tmp_path, 100, rows)
    starts = record_starts(rows)
    original = path.read_bytes()
    for record, where in ((1, 20), (2, 2), (3, 13), (4, 20)):  # body, offset field, stored crc, body
        data = bytearray(original)
        data[starts[record] + where] ^= 0x40
        path.write_bytes(bytes(data))
        with pytest.raises(CorruptRecord) as raised:
            Ledger.open(path)
        assert raised.value.path == path and raised.value.position == starts[record]
        assert str(path) in str(raised.value) and "crc32c mismatch" in raised.value.reason


def test_damage_after_open_raises_on_read(tmp_path: Path) -> None:
    """A read checks CRCs again: bytes changed on disk after `open` raise, not decode."""
    rows = sample_rows()
    path = write_ledger(tmp_path, 100, rows)
    with Ledger.open(path) as ledger:
        with path.open("r+b") as file:
            file.seek(record_starts(rows)[3] + 30)
            file.write(b"\xff")
        before_damage = sum(map(record_bytes, rows[:3]))
        assert ledger.read(3, before_damage).offsets == [3, 4, 9]  # the damage is in record 3 (offset 10)
        with pytest.raises(CorruptRecord) as raised:
            ledger.read(9, 1 << 30)
        assert raised.value.path == path


def test_crc_clean_undecodable_body_raises_on_read(tmp_path: Path) -> None:
    """A record whose CRC matches but whose body is not a record (a writer's bug) passes
    `open` (which reads no bodies) and raises on the read that decodes it."""
    body = b"\xc1"  # a byte msgpack never uses
    prefix = struct.pack(">QI", 4, len(body))
    bad = struct.pack(">QII", 4, len(body), crc32c.crc32c(body, crc32c.crc32c(prefix))) + body
    good = encode_batch(2, [b"p"], [1], 1, "p")
    path = tmp_path / ledger_file_name(10)
    path.write_bytes(good + bad)
    with Ledger.open(path) as ledger:
        assert ledger.read(0, len(good)).offsets == [2]
        with pytest.raises(CorruptRecord, match="undecodable") as raised:
            ledger.read(0, 1 << 20)
        assert raised.value.position == len(good)


@pytest.mark.parametrize(("offsets", "horizon", "reason"), [
    ((5, 3), 100, "offset 3 not above the previous record's 5"),
    ((5, 5), 100, "offset 5 not above the previous record's 5"),
    ((5, 100), 100, "offset 100 at or above the ledger's horizon 100"),
])
def test_offsets_must_increase_below_the_horizon(tmp_path: Path, offsets: tuple[int, ...], horizon: int,
                                                 reason: str) -> None:
    """Records with CRC-clean headers but offsets out of order, repeated, or at or above
    the horizon of the file's name are damage: the error points at the bad record."""
    encoded = [encode_batch(offset, [b"p"], [1], 1, "p", keys=["k"]) for offset in offsets]
    path = tmp_path / ledger_file_name(horizon)
    path.write_bytes(b"".join(encoded))
    with pytest.raises(CorruptRecord) as raised:
        Ledger.open(path)
    assert raised.value.position == len(encoded[0])
    assert raised.value.reason == reason


def test_truncated_file_raises(tmp_path: Path) -> None:
    """A file cut inside a body or inside a header raises; never a silently shorter ledger."""
    rows = sample_rows()
    path = write_ledger(tmp_path, 100, rows)
    whole = path.read_bytes()
    last = record_starts(rows)[-1]
    for cut, words in ((len(whole) - 1, "partial body"), (last + HEADER_BYTES - 3, "partial header")):
        path.write_bytes(whole[:cut])
        with pytest.raises(CorruptRecord) as raised:
            Ledger.open(path)
        assert raised.value.position == last and words in raised.value.reason


def test_a_wrong_name_or_a_checkpoint_is_not_a_ledger(tmp_path: Path) -> None:
    """A file not named as a ledger, or holding a cursor checkpoint record, is refused."""
    path = tmp_path / "ledger.compacted"
    path.write_bytes(b"")
    with pytest.raises(CorruptRecord):
        Ledger.open(path)
    path = tmp_path / ledger_file_name(10)
    path.write_bytes(encode_batch(1, [b"p"], [1], 1, "p") + encode_checkpoints(2, [("sub", b"state")]))
    with pytest.raises(CorruptRecord, match="checkpoint"):
        Ledger.open(path)


def test_crashed_writer_leaves_no_ledger_and_its_tmp_is_cleared(tmp_path: Path) -> None:
    """A writer that never commits (the process died) leaves only a `.tmp`: no ledger is
    listed, and `remove_ledgers_except` deletes the `.tmp`. A writer leaving its `with`
    on an exception deletes its `.tmp` itself."""
    crashed = LedgerWriter(tmp_path, 50)
    crashed.append(batch_of(sample_rows()[:2]), [True, True])
    crashed._flush()
    os.close(crashed._fd)  # the process died: no abort, no commit
    assert crashed.tmp_path.exists() and crashed.tmp_path.name == "00000000000000000050.compacted.tmp"
    assert ledgers_in(tmp_path) == []
    remove_ledgers_except(tmp_path, None)
    assert list(tmp_path.iterdir()) == []

    with pytest.raises(RuntimeError), LedgerWriter(tmp_path, 60) as writer:
        writer.append(batch_of(sample_rows()), [True] * 5)
        raise RuntimeError("phase 2 failed")
    assert list(tmp_path.iterdir()) == []


def test_ledgers_in_order_and_removal(tmp_path: Path) -> None:
    """`ledgers_in` lists committed ledgers by horizon, ignoring `.tmp` and other files;
    `remove_ledgers_except` deletes all ledgers but the one kept, and every `.tmp`."""
    paths = {horizon: write_ledger(tmp_path, horizon, []) for horizon in (30, 5, 100, 7)}
    (tmp_path / "00000000000000000200.compacted.tmp").write_bytes(b"x")
    (tmp_path / "00000000000000000000.wal").write_bytes(b"")
    (tmp_path / "notes.compacted").write_bytes(b"")
    assert ledgers_in(tmp_path) == [(h, paths[h]) for h in (5, 7, 30, 100)]
    remove_ledgers_except(tmp_path, paths[30])
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "00000000000000000000.wal", "00000000000000000030.compacted", "notes.compacted"]
    assert ledgers_in(tmp_path / "missing") == []


def test_file_names() -> None:
    """Names are 20 zero-padded digits then `.compacted`; anything else parses to None."""
    assert ledger_file_name(42) == "00000000000000000042.compacted"
    assert parse_ledger_file_name("00000000000000000042.compacted") == 42
    for name in ("00000000000000000042.compacted.tmp", "42.compacted", "00000000000000000042.wal",
                 "0000000000000000004x.compacted", "０0000000000000000042.compacted"):
        assert parse_ledger_file_name(name) is None


def test_read_after_close_raises(tmp_path: Path) -> None:
    """A closed ledger's descriptor is gone: a late read fails cleanly."""
    ledger = Ledger.open(write_ledger(tmp_path, 100, sample_rows()))
    ledger.close()
    ledger.close()
    with pytest.raises(InternalError):
        ledger.read(0, 100)


_rows = st.lists(
    st.tuples(
        st.integers(min_value=1, max_value=4),  # gap to the previous offset
        st.binary(max_size=40),
        st.one_of(st.none(), st.text(max_size=4)),
        st.one_of(st.none(), st.dictionaries(st.text(max_size=3), st.text(max_size=3), max_size=2)),
        st.one_of(st.none(), st.integers(min_value=0, max_value=2**40)),
    ),
    max_size=30,
)


@settings(max_examples=60, deadline=None)
@given(_rows, st.data())
def test_reads_equal_a_model(drawn: list[tuple], data: st.DataObject) -> None:
    """Against the list of rows written: any read(start, max_bytes) returns the rows at
    or after start, at least one, and as many as fit in max_bytes."""
    rows, offset = [], -1
    for gap, payload, key, attributes, sequence in drawn:
        offset += gap
        rows.append((offset, payload, key, attributes, offset * 10, 1, "p", None, 3, sequence))
    horizon = offset + data.draw(st.integers(min_value=1, max_value=3))
    with tempfile.TemporaryDirectory() as name, mock.patch.object(wal_files.current, "fsync", lambda fd: None):
        path = write_ledger(Path(name), horizon, rows, split=data.draw(st.integers(min_value=0, max_value=len(rows))))
        with Ledger.open(path) as ledger:
            for _ in range(5):
                start = data.draw(st.integers(min_value=0, max_value=horizon + 1))
                max_bytes = data.draw(st.integers(min_value=1, max_value=600))
                after = [row for row in rows if row[0] >= start]
                taken, total = [], 0
                for row in after:
                    total += record_bytes(row)
                    if taken and total > max_bytes:
                        break
                    taken.append(row)
                assert rows_of(ledger.read(start, max_bytes)) == taken

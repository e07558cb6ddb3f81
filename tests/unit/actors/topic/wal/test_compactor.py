"""One compaction (`compact`): the new ledger holds exactly the latest non-tombstone
record of each key plus the keyless records below the horizon, in offset order, with
every field; incremental runs over a previous ledger agree with a run over everything;
and a failed run leaves no file."""

from __future__ import annotations

import tempfile
from bisect import bisect_left
from collections.abc import Callable
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from danube_zmq.actors.topic.compaction import TooManyKeys
from danube_zmq.actors.topic.wal.compactor import CompactionResult, compact
from danube_zmq.clock import ManualClock
from danube_zmq.storage.wal import RecordBatch, WalLog, encode_batch, scan
from danube_zmq.storage.wal import files as wal_files
from danube_zmq.storage.wal.compacted import Ledger, ledgers_in
from danube_zmq.transport.errors import InternalError

FIELDS = ("offsets", "payloads", "keys", "attributes", "publish_times", "producer_ids", "producer_names", "schema_ids",
          "schema_versions", "sequence_ids")

Message = tuple[str | None, bytes]  # (key, payload); b"" is a tombstone when keyed


def rows_of(batch: RecordBatch) -> list[tuple]:
    return list(zip(*(getattr(batch, name) for name in FIELDS), strict=True))


class MemoryLog:
    """A log in memory: records at given offsets (gaps allowed), read back as the WAL
    reads (consecutive offsets from the first at or after `position`, within
    `max_bytes` of records, at least one), decoded by `scan` from `encode_batch`."""

    def __init__(self) -> None:
        self.offsets: list[int] = []
        self.messages: list[Message] = []

    def append(self, messages: list[Message], *, at: int | None = None) -> None:
        offset = at if at is not None else (self.offsets[-1] + 1 if self.offsets else 0)
        assert not self.offsets or offset > self.offsets[-1]
        for message in messages:
            self.offsets.append(offset)
            self.messages.append(message)
            offset += 1

    def read(self, position: int, max_bytes: int) -> RecordBatch:
        first = bisect_left(self.offsets, position)
        end, total = first, 0
        while end < len(self.offsets) and (end == first or (
                self.offsets[end] == self.offsets[end - 1] + 1 and total + 16 + len(self.messages[end][1]) <= max_bytes)):
            total += 16 + len(self.messages[end][1])
            end += 1
        if first == end:
            return RecordBatch.empty()
        base = self.offsets[first]
        messages = self.messages[first:end]
        offsets = range(base, base + len(messages))  # the fields depend on the offset, not on the batching
        encoded = encode_batch(
            base, [payload for _, payload in messages], list(offsets), 42, "producer",
            keys=[key for key, _ in messages],
            attributes=[{"at": str(offset)} if offset % 2 else None for offset in offsets],
            schema_id=3, schema_version=1,
            sequence_ids=[offset if offset % 3 else None for offset in offsets],  # type: ignore[misc]
        )
        return scan(encoded, expected_offset=base).records

    def rows(self, below: int) -> list[tuple]:
        """Every record below `below`, all fields, as the log reads them."""
        rows: list[tuple] = []
        position = 0
        while batch := self.read(position, 1 << 30):
            rows += [row for row in rows_of(batch) if row[0] < below]
            position = batch.offsets[-1] + 1
        return rows


def model(rows: list[tuple]) -> list[tuple]:
    """The compacted view, computed apart: keyless rows, and for each key its last row
    if that one is not a tombstone; in offset order."""
    last: dict[str, tuple] = {}
    for row in rows:
        if row[2] is not None:
            last[row[2]] = row
    kept = [row for row in rows if row[2] is None] + [row for row in last.values() if row[1]]
    return sorted(kept)


def ledger_rows(path: Path) -> list[tuple]:
    with Ledger.open(path) as ledger:
        return [row for batch in ledger.records(batch_bytes=64) for row in rows_of(batch)]


def run(read: Callable[[int, int], RecordBatch], directory: Path, *, start: int, horizon: int,
        previous: Path | None = None, keys_max: int = 1000, batch_bytes: int = 64) -> CompactionResult:
    if previous is None:
        return compact(read, start=start, horizon=horizon, previous=None, directory=directory, keys_max=keys_max,
                       batch_bytes=batch_bytes)
    with Ledger.open(previous) as ledger:
        return compact(read, start=start, horizon=horizon, previous=ledger, directory=directory, keys_max=keys_max,
                       batch_bytes=batch_bytes)


def test_compacts_a_real_wal(tmp_path: Path) -> None:
    """Over a WalLog (several segments, reads in small batches): latest value per key,
    a deleted key gone, keyless records all there, every field as the log holds it."""
    messages: list[Message] = [("a", b"a1"), ("b", b"b1"), (None, b"x1"), ("a", b"a2"), ("c", b"c1"), ("b", b""),
                               (None, b""), ("c", b"c2"), ("d", b"d1"), ("a", b"a3")]
    with WalLog.open(tmp_path / "wal", clock=ManualClock(), segment_bytes_max=200, segment_age_ms_max=None,
                     index_interval_bytes=64) as wal:
        for first in range(0, len(messages), 3):
            chunk = messages[first : first + 3]
            encoded = encode_batch(wal.next_offset, [p for _, p in chunk], [first] * len(chunk), 5, "p",
                                   keys=[k for k, _ in chunk], attributes=[{"n": str(first)}] * len(chunk),
                                   schema_id=9, schema_version=2, sequence_ids=list(range(first, first + len(chunk))))
            wal.append(encoded, len(chunk))
        wal.sync()
        assert len(wal.segments()) > 1

        def read(position: int, max_bytes: int) -> RecordBatch:
            return wal.read(position, max_bytes=max_bytes, upto_offset=wal.next_offset)

        everything = rows_of(read(0, 1 << 30))
        result = run(read, tmp_path, start=0, horizon=wal.next_offset)
    rows = ledger_rows(result.path)
    assert [(row[0], row[2], row[1]) for row in rows] == [(2, None, b"x1"), (6, None, b""), (7, "c", b"c2"),
                                                          (8, "d", b"d1"), (9, "a", b"a3")]
    assert rows == model(everything)
    assert result == CompactionResult(path=tmp_path / "00000000000000000010.compacted", horizon=10, records_read=10,
                                      records_kept=5, keys=3, bytes=result.path.stat().st_size)


def test_incremental_compaction_over_the_previous_ledger(tmp_path: Path) -> None:
    """A second compaction reads the previous ledger then the log from its horizon: a key
    deleted after the previous horizon disappears, an updated key moves to its new
    offset, the rest stays; the result equals one compaction of everything."""
    log = MemoryLog()
    log.append([("a", b"a1"), ("b", b"b1"), ("c", b"c1"), (None, b"x"), ("a", b"a2")])
    first = run(log.read, tmp_path, start=0, horizon=5)
    assert [row[0] for row in ledger_rows(first.path)] == [1, 2, 3, 4]
    log.append([("b", b""), ("c", b"c2"), (None, b"y"), ("e", b"e1")])
    second = run(log.read, tmp_path, start=5, horizon=9, previous=first.path)
    rows = ledger_rows(second.path)
    assert [(row[0], row[2]) for row in rows] == [(3, None), (4, "a"), (6, "c"), (7, None), (8, "e")]
    assert rows == model(log.rows(below=9))
    assert (second.records_read, second.records_kept, second.keys) == (4 + 4, 5, 3)
    assert [horizon for horizon, _ in ledgers_in(tmp_path)] == [5, 9]  # the caller removes the previous one


def test_horizon_excludes_later_records(tmp_path: Path) -> None:
    """Records at or above the horizon are not read into the ledger: a key updated or
    deleted after it keeps its version from below."""
    log = MemoryLog()
    log.append([("a", b"a1"), ("b", b"b1"), (None, b"x"), ("a", b"a2"), ("b", b""), ("a", b"a3"), (None, b"z")])
    result = run(log.read, tmp_path, start=0, horizon=4, batch_bytes=1 << 20)
    rows = ledger_rows(result.path)
    assert [(row[0], row[1]) for row in rows] == [(1, b"b1"), (2, b"x"), (3, b"a2")]
    assert result.records_read == 4 and result.horizon == 4


def test_gaps_in_the_log_are_crossed(tmp_path: Path) -> None:
    """A log with a gap (offsets a repair gave up, or a start below the first record):
    reading goes on past the gap from the last offset read + 1."""
    log = MemoryLog()
    log.append([("a", b"a1"), ("b", b"b1")], at=3)
    log.append([("a", b"a2"), (None, b"x")], at=10)
    log.append([("b", b"b2")], at=20)
    result = run(log.read, tmp_path, start=0, horizon=25)
    assert [row[0] for row in ledger_rows(result.path)] == [10, 11, 20]
    assert ledger_rows(result.path) == model(log.rows(below=25))


def test_nothing_to_compact_gives_an_empty_ledger(tmp_path: Path) -> None:
    """An empty log range still commits a ledger (empty) for the horizon."""
    result = run(MemoryLog().read, tmp_path, start=0, horizon=0)
    assert (result.records_read, result.records_kept, result.bytes) == (0, 0, 0)
    assert ledger_rows(result.path) == []


def test_too_many_keys_leaves_no_file(tmp_path: Path) -> None:
    """Past keys_max live keys the compaction raises TooManyKeys, before writing: the
    directory holds nothing new, neither a ledger nor a `.tmp`."""
    log = MemoryLog()
    log.append([(f"k{i}", b"v") for i in range(10)])
    with pytest.raises(TooManyKeys):
        run(log.read, tmp_path, start=0, horizon=10, keys_max=9)
    assert list(tmp_path.iterdir()) == []
    assert run(log.read, tmp_path, start=0, horizon=10, keys_max=10).keys == 10


def test_log_changing_between_phases_raises_and_leaves_no_file(tmp_path: Path) -> None:
    """If phase 2 does not read what phase 1 read (the log cut or rewritten under the
    compaction), a key's latest record could be lost: the run raises, writes nothing."""
    log = MemoryLog()
    log.append([("a", b"a1"), ("b", b"b1"), ("a", b"a2")])
    positions: list[int] = []

    def read(position: int, max_bytes: int) -> RecordBatch:
        positions.append(position)
        if positions.count(0) == 2:  # phase 2 starts over: offset 2 now holds another key
            log.messages[2] = ("c", b"c1")
        return log.read(position, max_bytes)

    with pytest.raises(InternalError, match="changed between the phases"):
        run(read, tmp_path, start=0, horizon=3, batch_bytes=1 << 20)
    assert list(tmp_path.iterdir()) == []


_messages = st.lists(st.tuples(st.one_of(st.none(), st.sampled_from("abcdef")), st.sampled_from([b"", b"v1", b"v22"])),
                     max_size=50)


@settings(max_examples=80, deadline=None)
@given(_messages, st.data())
def test_two_compactions_equal_the_model(messages: list[Message], data: st.DataObject) -> None:
    """Random keyed, keyless and tombstone records, compacted in two runs split at a
    random horizon (the second over the first's ledger), with random batch sizes: each
    ledger equals the model of the log below its horizon."""
    log = MemoryLog()
    log.append(messages, at=data.draw(st.integers(min_value=0, max_value=3)))
    end = (log.offsets[-1] + 1) if log.offsets else 0
    middle = data.draw(st.integers(min_value=0, max_value=end))
    horizon = data.draw(st.integers(min_value=middle, max_value=end + 2))
    batch_bytes = data.draw(st.integers(min_value=1, max_value=200))
    with tempfile.TemporaryDirectory() as name, mock.patch.object(wal_files.current, "fsync", lambda fd: None):
        directory = Path(name)
        first = run(log.read, directory, start=0, horizon=middle, batch_bytes=batch_bytes)
        assert ledger_rows(first.path) == model(log.rows(below=middle))
        second = run(log.read, directory, start=middle, horizon=horizon, previous=first.path, batch_bytes=batch_bytes)
        expected = model(log.rows(below=horizon))
        assert ledger_rows(second.path) == expected
        assert second.records_kept == len(expected)
        assert second.keys == len([row for row in expected if row[2] is not None])

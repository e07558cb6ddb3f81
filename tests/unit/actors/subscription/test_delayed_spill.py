"""The delayed index's spill files (`actors/subscription/delayed_spill.py`): FileRunStore on a
tmp directory, then 200,000 delayed entries through a DelayedIndex spilling to it."""

from __future__ import annotations

import random
import struct
from pathlib import Path

import pytest

from danube_zmq.actors.dispatch.delayed_index import DelayedIndex
from danube_zmq.actors.subscription.delayed_spill import FileRunStore

ENTRIES = [(-5, 0), (0, 1), (1, 2), (2**62, 3), (7, 2**40), (8, -(2**63)), (9, 2**63 - 1), (10, 10), (11, 11), (12, 12)]


def test_a_run_is_one_file_of_little_endian_pairs(tmp_path: Path) -> None:
    """Run 7 is `000000000007.run`, 16 bytes an entry, `<qq` each."""
    store = FileRunStore(tmp_path / "a" / "b")
    store.write(7, ENTRIES)
    path = tmp_path / "a" / "b" / "000000000007.run"
    assert store.path(7) == path
    assert path.read_bytes() == b"".join(struct.pack("<qq", t, o) for t, o in ENTRIES)


def test_read_returns_the_range_asked_and_fewer_at_the_end(tmp_path: Path) -> None:
    store = FileRunStore(tmp_path)
    store.write(1, ENTRIES)
    store.write(2, [(1, 1)])
    assert store.read(1, 0, 10) == ENTRIES
    assert store.read(1, 3, 4) == ENTRIES[3:7]
    assert store.read(1, 8, 5) == ENTRIES[8:]
    assert store.read(1, 10, 3) == []
    assert store.read(1, 50, 1) == []
    assert store.read(1, 2, 0) == []
    assert store.read(2, 0, 9) == [(1, 1)]
    store.write(2, [(3, 3), (4, 4)])  # written again: replaced
    assert store.read(2, 0, 9) == [(3, 3), (4, 4)]


def test_delete_removes_one_run_and_a_missing_one_is_fine(tmp_path: Path) -> None:
    store = FileRunStore(tmp_path)
    store.write(1, ENTRIES)
    store.write(2, ENTRIES)
    store.delete(1)
    store.delete(1)
    store.delete(3)
    assert not store.path(1).exists() and store.read(2, 0, 1) == ENTRIES[:1]
    with pytest.raises(FileNotFoundError):
        store.read(1, 0, 1)


def test_clear_removes_run_files_only_and_recreates_the_directory(tmp_path: Path) -> None:
    directory = tmp_path / "spill"
    store = FileRunStore(directory)
    for run_id in range(3):
        store.write(run_id, ENTRIES)
    (directory / "notes.txt").write_text("kept")
    store.clear()
    assert sorted(p.name for p in directory.iterdir()) == ["notes.txt"]
    (directory / "notes.txt").unlink()
    directory.rmdir()
    store.clear()
    assert directory.is_dir()
    store.write(0, ENTRIES[:2])
    assert store.read(0, 0, 5) == ENTRIES[:2]


def test_200k_delayed_entries_spill_to_files_and_come_back_in_order(tmp_path: Path) -> None:
    """200,000 entries with random delivery times, buckets of 10,000 and segments of 500:
    RAM never holds more than 10,000 + runs * 500 entries, and every entry comes back in
    (deliver_at_ms, offset) order; the directory is empty at the end."""
    rng = random.Random(11)
    store = FileRunStore(tmp_path / "delayed")
    idx = DelayedIndex(store=store, entries_max=200_000, open_entries_max=10_000, segment_entries=500)
    entries = [(rng.randrange(1_000_000), offset) for offset in range(200_000)]
    peak = 0
    for deliver_at_ms, offset in entries:
        idx.add(deliver_at_ms, offset)
        peak = max(peak, idx.memory_entries())
    assert idx.runs() == 20 and len(list(store.directory.glob("*.run"))) == 20
    assert peak <= 10_000 + idx.runs_max * 500
    assert idx.memory_entries() == 20 * 500 and idx.low_offset() == 0
    got: list[tuple[int, int]] = []
    now_ms = 0
    while len(idx):
        now_ms += 10_000
        batch = idx.pop_due(now_ms, 5_000)
        got += batch
        assert idx.memory_entries() <= 10_000 + idx.runs() * 500
    assert got == sorted(entries)
    assert idx.runs() == 0 and list(store.directory.iterdir()) == []

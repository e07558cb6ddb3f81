"""The durable storage of one Raft peer: LevelDB log and hard state, snapshot files, node id."""

from __future__ import annotations

import logging
import multiprocessing
import os
import shutil
import signal
import tempfile
import time
from pathlib import Path
from typing import Any

import plyvel
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from danube_zmq.consensus.log_store import (
    LOG_DIR,
    SNAPSHOT_DIR,
    LogCompacted,
    LogStoreCorruption,
    RaftLogStore,
    decode_struct,
    encode_snapshot,
    encode_struct,
)
from danube_zmq.consensus.types import Entry, EntryKind, HardState, Membership, SnapshotMeta
from danube_zmq.transport.errors import FailedPrecondition, InvalidArgument, ResourceExhausted

M3 = Membership(voters=[1, 2, 3], learners=[])
M5 = Membership(voters=[1, 2, 3, 4, 5], learners=[9])


def cmd(index: int, term: int, data: bytes | None = None) -> Entry:
    return Entry(index=index, term=term, kind=EntryKind.COMMAND, data=data if data is not None else b"c%d" % index)


def config(index: int, term: int, membership: Membership) -> Entry:
    return Entry(index=index, term=term, kind=EntryKind.CONFIG, data=encode_struct(membership))


def hs(term: int, voted_for: int | None = None, commit: int = 0) -> HardState:
    return HardState(term=term, voted_for=voted_for, commit_index=commit)


def reopen(store: RaftLogStore) -> RaftLogStore:
    store.close()
    return RaftLogStore.open(store.data_dir)


def whole_log(store: RaftLogStore) -> list[Entry]:
    return store.entries(store.first_index(), store.last_index() + 1, 1 << 40)


@pytest.fixture
def store(tmp_path: Path) -> Any:
    s = RaftLogStore.open(tmp_path / "peer")
    yield s
    s.close()


# ----------------------------------------------------------------------------- append and reopen


def test_appended_entries_and_hard_state_survive_reopen(store: RaftLogStore) -> None:
    """Entries and hard state written by `append` are read back identically after a reopen."""
    assert (store.first_index(), store.last_index(), store.last_term()) == (1, 0, 0)
    assert store.term_of(0) == 0 and store.term_of(1) is None
    assert store.hard_state() == hs(0) and store.membership() is None
    entries = [cmd(1, 1), cmd(2, 1), cmd(3, 2, b""), cmd(4, 2, b"x" * 1000)]
    store.append(entries[:2], hard_state=hs(1, 7))
    store.append(entries[2:], hard_state=hs(2, None, 3))
    store = reopen(store)
    try:
        assert whole_log(store) == entries
        assert store.hard_state() == hs(2, None, 3)
        assert (store.first_index(), store.last_index(), store.last_term()) == (1, 4, 2)
        assert [store.term_of(i) for i in range(6)] == [0, 1, 1, 2, 2, None]
        assert store.entries(2, 4, 1 << 20) == entries[1:3]
        assert store.entries(2, 2, 1 << 20) == []
        # max_bytes stops early but always yields one entry, so a huge entry still moves.
        assert store.entries(4, 5, 1) == entries[3:]
        assert len(store.entries(1, 5, 17)) == 2  # two 8-byte encoded entries fit, the third would not
        stats = store.statistics()
        assert (stats.entries, stats.term, stats.commit_index) == (4, 2, 3)
    finally:
        store.close()


def test_save_hard_state_alone_is_durable(store: RaftLogStore) -> None:
    """A vote is saved (fsynced) on its own, before the peer answers RequestVote."""
    store.save_hard_state(hs(5, 3))
    store = reopen(store)
    try:
        assert store.hard_state() == hs(5, 3)
    finally:
        store.close()


def test_second_handle_on_the_same_directory_is_refused(store: RaftLogStore) -> None:
    """LevelDB locks its directory: a second open in the same process fails cleanly."""
    with pytest.raises(FailedPrecondition, match="one handle"):
        RaftLogStore.open(store.data_dir)


def test_invariant_violations_are_assertions(store: RaftLogStore) -> None:
    """Our bugs are asserted: gaps, decreasing terms, vote changes within a term, commit past the end."""
    store.append([cmd(1, 2), cmd(2, 2)], hard_state=hs(2, 1, 1))
    with pytest.raises(AssertionError):
        store.append([cmd(4, 2)])  # gap
    with pytest.raises(AssertionError):
        store.append([cmd(3, 1)])  # term goes back along the log
    with pytest.raises(AssertionError):
        store.append([cmd(3, 2), cmd(5, 2)])  # gap inside the batch
    with pytest.raises(AssertionError):
        store.save_hard_state(hs(1))  # term decreases
    with pytest.raises(AssertionError):
        store.save_hard_state(hs(2, 3, 1))  # second vote in term 2
    with pytest.raises(AssertionError):
        store.save_hard_state(hs(2, 1, 3))  # commit past last_index
    with pytest.raises(AssertionError):
        store.append([cmd(1, 3)], truncate_from=1)  # truncating a committed entry
    # Nothing of the refused calls reached the disk.
    store = reopen(store)
    try:
        assert whole_log(store) == [cmd(1, 2), cmd(2, 2)]
        assert store.hard_state() == hs(2, 1, 1)
    finally:
        store.close()


def test_bounds_are_typed_errors(tmp_path: Path) -> None:
    """An oversized entry or a log past its bound is refused with a typed error and writes nothing."""
    with RaftLogStore.open(tmp_path, entry_bytes_max=10, log_entries_max=3) as store:
        with pytest.raises(InvalidArgument, match="bytes"):
            store.append([cmd(1, 1, b"x" * 11)])
        store.append([cmd(1, 1), cmd(2, 1), cmd(3, 1)])
        with pytest.raises(ResourceExhausted, match="compact"):
            store.append([cmd(4, 1)])
        with pytest.raises(InvalidArgument, match="Membership"):
            store.append([Entry(index=3, term=1, kind=EntryKind.CONFIG, data=b"\x01")], truncate_from=3)
        assert store.last_index() == 3


# ----------------------------------------------------------------------------- truncate + append


class _RecordingDb:
    """Wraps the plyvel handle and records each write call, to show what one `append` does."""

    def __init__(self, db: plyvel.DB) -> None:
        self._db = db
        self.writes: list[tuple[str, Any]] = []

    def write_batch(self, **kwargs: Any) -> Any:
        self.writes.append(("write_batch", kwargs))
        return self._db.write_batch(**kwargs)

    def put(self, *args: Any, **kwargs: Any) -> None:
        self.writes.append(("put", kwargs))
        self._db.put(*args, **kwargs)

    def delete(self, *args: Any, **kwargs: Any) -> None:
        self.writes.append(("delete", kwargs))
        self._db.delete(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._db, name)


def test_truncate_and_append_is_one_synced_batch(store: RaftLogStore) -> None:
    """A follower overwriting a conflicting suffix does it in ONE write_batch(sync=True) with its
    entries and hard state; reopening after each operation shows only whole operations."""
    store.append([cmd(i, 1) for i in range(1, 6)], hard_state=hs(1, 1, 2))
    store = reopen(store)
    assert [e.index for e in whole_log(store)] == [1, 2, 3, 4, 5]

    recorder = _RecordingDb(store._db)
    store._db = recorder  # type: ignore[assignment]
    store.append([cmd(3, 2, b"new3"), cmd(4, 2, b"new4")], truncate_from=3, hard_state=hs(2, 4, 2))
    assert recorder.writes == [("write_batch", {"sync": True, "transaction": True})]
    store._db = recorder._db

    store = reopen(store)
    try:
        assert whole_log(store) == [cmd(1, 1), cmd(2, 1), cmd(3, 2, b"new3"), cmd(4, 2, b"new4")]
        assert store.hard_state() == hs(2, 4, 2)
        assert store.statistics().entries == 4
        # Truncation alone (no new entries) is also one batch and also durable.
        store.append([], truncate_from=4)
        store = reopen(store)
        assert (store.last_index(), store.last_term()) == (3, 2)
        store.append([cmd(4, 3)])
        store = reopen(store)
        assert [store.term_of(i) for i in range(1, 5)] == [1, 1, 2, 3]
    finally:
        store.close()


def _truncate_append_forever(data_dir: str, ready: Any) -> None:
    """Child process: op k truncates the last 3 entries and appends 5 of term k, with hard state term k."""
    store = RaftLogStore.open(Path(data_dir))
    ready.set()
    k = store.hard_state().term
    while True:
        k += 1
        last = store.last_index()
        start = max(1, last - 2)
        entries = [cmd(i, k, b"%d@%d" % (i, k)) for i in range(start, start + 5)]
        store.append(entries, truncate_from=start if start <= last else None, hard_state=hs(k))


def _model_after(ops: int) -> list[Entry]:
    log: list[Entry] = []
    for k in range(1, ops + 1):
        start = max(1, len(log) - 2)
        del log[start - 1:]
        log.extend(cmd(i, k, b"%d@%d" % (i, k)) for i in range(start, start + 5))
    return log


def test_kill_9_during_truncate_and_append_leaves_a_whole_operation(tmp_path: Path) -> None:
    """kill -9 a process looping truncate-and-append; after each kill the reopened log is exactly
    the log after op k, where k is the hard state's term (written in the same batch)."""
    ctx = multiprocessing.get_context("spawn")
    rng_delays = [0.05, 0.13, 0.21, 0.08, 0.17]
    for delay in rng_delays:
        ready = ctx.Event()
        child = ctx.Process(target=_truncate_append_forever, args=(str(tmp_path), ready))
        child.start()
        assert ready.wait(30)
        time.sleep(delay)
        assert child.pid is not None
        os.kill(child.pid, signal.SIGKILL)
        child.join(10)
        with RaftLogStore.open(tmp_path) as store:
            k = store.hard_state().term
            assert k > 0
            assert whole_log(store) == _model_after(k)


# ----------------------------------------------------------------------------- compaction


def _log_with_terms(store: RaftLogStore, terms: list[int], commit: int) -> None:
    store.append([cmd(i, t) for i, t in enumerate(terms, start=1)], hard_state=hs(max(terms), None, commit))


def test_compaction_keeps_the_term_at_the_snapshot_boundary(store: RaftLogStore) -> None:
    """After compacting to i, term_of(i) is the snapshot's last term, older indexes are gone,
    and reading them raises LogCompacted; all of it survives a reopen."""
    _log_with_terms(store, [1, 1, 2, 2, 3, 3, 3, 4, 4, 5], commit=8)
    store.save_snapshot(SnapshotMeta(last_index=6, last_term=3, membership=M3), b"state@6")
    store.compact(6, 3)
    for reopened in (False, True):
        if reopened:
            store = reopen(store)
        assert (store.first_index(), store.last_index(), store.last_term()) == (7, 10, 5)
        assert [store.term_of(i) for i in range(4, 12)] == [None, None, 3, 3, 4, 4, 5, None]
        assert [e.index for e in whole_log(store)] == [7, 8, 9, 10]
        with pytest.raises(LogCompacted):
            store.entries(6, 8, 1 << 20)
        assert store.statistics().entries == 4
    store.compact(6, 3)  # idempotent
    store.compact(3, 999)  # below the compacted prefix: nothing to do
    # Compacting everything: the log is empty but still knows where it ends.
    store.save_hard_state(hs(5, None, 10))
    store.save_snapshot(SnapshotMeta(last_index=10, last_term=5, membership=M3), b"state@10")
    store.compact(10, 5)
    store = reopen(store)
    try:
        assert (store.first_index(), store.last_index(), store.last_term()) == (11, 10, 5)
        assert store.term_of(10) == 5 and store.term_of(9) is None and whole_log(store) == []
        with pytest.raises(AssertionError):
            store.append([cmd(11, 4)])  # term below the snapshot's last term
        store.append([cmd(11, 6)])
        assert store.term_of(11) == 6
    finally:
        store.close()


def test_compaction_needs_a_covering_snapshot(store: RaftLogStore) -> None:
    """Compacting entries no snapshot covers would lose them: asserted."""
    _log_with_terms(store, [1, 1, 1], commit=3)
    with pytest.raises(AssertionError, match="no snapshot"):
        store.compact(2, 1)


def test_membership_follows_config_entries_through_truncation_and_compaction(store: RaftLogStore) -> None:
    """membership() is the last CONFIG entry in the log; truncating it reverts to the previous
    one; compacting it away keeps it as the base."""
    store.append([config(1, 1, M3), cmd(2, 1)], hard_state=hs(1, None, 2))
    assert store.membership() == M3
    store.append([config(3, 1, M5)])
    assert store.membership() == M5
    store.append([cmd(3, 2)], truncate_from=3)
    assert store.membership() == M3
    store.save_snapshot(SnapshotMeta(last_index=2, last_term=1, membership=M3), b"s")
    store.compact(2, 1)
    store = reopen(store)
    try:
        assert store.membership() == M3
        store.append([config(4, 2, M5)])
        store = reopen(store)
        assert store.membership() == M5
    finally:
        store.close()


# ----------------------------------------------------------------------------- snapshots


def _snapshot_names(store: RaftLogStore) -> list[str]:
    return sorted(p.name for p in (store.data_dir / SNAPSHOT_DIR).iterdir())


def test_only_the_newest_two_snapshot_files_are_kept(store: RaftLogStore) -> None:
    """Each save writes `{index:020d}-{term:020d}.snap` and deletes all but the newest two."""
    _log_with_terms(store, [1, 1, 2, 2, 2, 3], commit=6)
    paths = [
        store.save_snapshot(SnapshotMeta(last_index=i, last_term=store.term_of(i) or 0, membership=M3), b"s%d" % i)
        for i in (2, 4, 6)
    ]
    assert paths[-1].name == "00000000000000000006-00000000000000000003.snap"
    assert _snapshot_names(store) == [p.name for p in paths[1:]]
    assert store.latest_snapshot() == (SnapshotMeta(last_index=6, last_term=3, membership=M3), b"s6")
    assert store.statistics().snapshots == 2


def _flip_byte(path: Path, offset: int) -> None:
    raw = bytearray(path.read_bytes())
    raw[offset] ^= 0x40
    path.write_bytes(bytes(raw))


def test_corrupt_newest_snapshot_falls_back_to_the_older_one(
    store: RaftLogStore, caplog: pytest.LogCaptureFixture
) -> None:
    """A flipped bit in the newest file fails its CRC32C: logged, and the older file is used,
    as long as the log still holds everything after it."""
    _log_with_terms(store, [1] * 20, commit=20)
    store.save_snapshot(SnapshotMeta(last_index=10, last_term=1, membership=M3), b"ten" * 100)
    newest = store.save_snapshot(SnapshotMeta(last_index=15, last_term=1, membership=M5), b"fifteen" * 100)
    store.compact(10, 1)  # keep the log back to the older snapshot: the fallback stays usable
    _flip_byte(newest, newest.stat().st_size - 5)
    store = reopen(store)
    try:
        with caplog.at_level(logging.ERROR, logger="danube_zmq.raft.log_store"):
            meta, data = store.latest_snapshot()  # type: ignore[misc]
        assert (meta.last_index, data) == (10, b"ten" * 100)
        assert "crc32c mismatch" in caplog.text
        assert store.statistics().snapshots_corrupt == 1
        # Once the log is compacted past the older snapshot, no fallback is possible: an error,
        # never a silent hole in the state.
        store.save_snapshot(SnapshotMeta(last_index=18, last_term=1, membership=M5), b"18")
        store.compact(18, 1)
        latest = store.data_dir / SNAPSHOT_DIR / "00000000000000000018-00000000000000000001.snap"
        latest.write_bytes(latest.read_bytes()[:-1])  # torn
        with pytest.raises(LogStoreCorruption, match="no intact snapshot"):
            store.latest_snapshot()
    finally:
        store.close()


def test_no_snapshot_on_a_fresh_store(store: RaftLogStore) -> None:
    """A store that never compacted has no snapshot and needs none."""
    assert store.latest_snapshot() is None


def test_install_snapshot_resets_a_conflicting_log(store: RaftLogStore) -> None:
    """A follower installing a snapshot its log does not match drops the whole log; the next
    entry goes right after the snapshot; everything survives a reopen."""
    _log_with_terms(store, [1, 1, 1, 1, 1], commit=2)
    store.save_hard_state(hs(3, 2, 2))
    store.install_snapshot(SnapshotMeta(last_index=8, last_term=3, membership=M5), b"leader-state")
    for reopened in (False, True):
        if reopened:
            store = reopen(store)
        assert (store.first_index(), store.last_index(), store.last_term()) == (9, 8, 3)
        assert store.term_of(8) == 3 and store.term_of(5) is None and whole_log(store) == []
        assert store.membership() == M5
        assert store.hard_state() == hs(3, 2, 8)
        assert store.latest_snapshot() == (SnapshotMeta(last_index=8, last_term=3, membership=M5), b"leader-state")
    store.append([cmd(9, 3)], hard_state=hs(3, 2, 9))
    assert store.last_index() == 9
    store.close()


def test_install_snapshot_keeps_the_suffix_after_a_matching_entry(store: RaftLogStore) -> None:
    """Raft §7 rule 6: when the log holds the snapshot's last entry (same index and term), the
    entries after it are kept and only the covered prefix is dropped."""
    _log_with_terms(store, [1, 1, 2, 2, 2, 2], commit=1)
    store.install_snapshot(SnapshotMeta(last_index=4, last_term=2, membership=M3), b"s4")
    assert (store.first_index(), store.last_index()) == (5, 6)
    assert store.hard_state().commit_index == 4
    assert [e.index for e in whole_log(store)] == [5, 6]
    with pytest.raises(AssertionError, match="stale"):
        store.install_snapshot(SnapshotMeta(last_index=3, last_term=2, membership=M3), b"s3")


def test_install_interrupted_after_its_file_is_finished_at_open(tmp_path: Path) -> None:
    """A crash after the snapshot file was fsynced but before the log batch: open finishes the install."""
    with RaftLogStore.open(tmp_path) as store:
        _log_with_terms(store, [1, 1, 1], commit=1)
    meta = SnapshotMeta(last_index=7, last_term=2, membership=M5)
    (tmp_path / SNAPSHOT_DIR / "00000000000000000007-00000000000000000002.snap").write_bytes(
        encode_snapshot(meta, b"seven")
    )
    (tmp_path / SNAPSHOT_DIR / "00000000000000000009-00000000000000000002.snap.tmp").write_bytes(b"half")
    with RaftLogStore.open(tmp_path) as store:
        assert (store.first_index(), store.last_index(), store.last_term()) == (8, 7, 2)
        assert store.hard_state().commit_index == 7
        assert store.membership() == M5
        assert store.latest_snapshot() == (meta, b"seven")
        assert _snapshot_names(store) == ["00000000000000000007-00000000000000000002.snap"]


def test_a_gap_in_the_stored_log_is_corruption_at_open(tmp_path: Path) -> None:
    """Open scans the whole log: a missing entry (damage, or a bug) is an error, not a silent gap."""
    with RaftLogStore.open(tmp_path) as store:
        _log_with_terms(store, [1, 1, 1], commit=0)
    db = plyvel.DB(str(tmp_path / LOG_DIR))
    db.delete(b"log/" + (2).to_bytes(8, "big"))
    db.close()
    with pytest.raises(LogStoreCorruption, match="index 3 where 2"):
        RaftLogStore.open(tmp_path)


# ----------------------------------------------------------------------------- node id


def test_node_id_is_created_once_and_stable_across_reopen(store: RaftLogStore) -> None:
    """The first call creates and fsyncs the id; later calls and later opens read it back."""
    calls: list[int] = []

    def create() -> int:
        calls.append(1)
        return 0x5EED_1234_5678_9ABC

    assert store.node_id(create) == 0x5EED_1234_5678_9ABC
    assert store.node_id(create) == 0x5EED_1234_5678_9ABC
    store = reopen(store)
    try:
        assert store.node_id(lambda: 1) == 0x5EED_1234_5678_9ABC
        assert len(calls) == 1
        assert (store.data_dir / "node_id").read_text() == f"{0x5EED_1234_5678_9ABC}\n"
    finally:
        store.close()
    (store.data_dir / "node_id").write_text("not-a-number")
    with RaftLogStore.open(store.data_dir) as again, pytest.raises(LogStoreCorruption):
        again.node_id(lambda: 1)


# ----------------------------------------------------------------------------- model test


class LogStoreAgainstModel(RuleBasedStateMachine):
    """Random append / truncate / compact / install / reopen sequences; after every step the
    store's reads equal a plain in-memory model's."""

    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="raftlog-"))
        self.store = RaftLogStore.open(self.dir)
        self.log: dict[int, Entry] = {}
        self.first = 1
        self.prev_term = 0
        self.term = 1
        self.commit = 0
        self.snapshot_index = 0
        self.base_membership: Membership | None = None
        self.hard = hs(0)

    @initialize()
    def start(self) -> None:
        pass

    def last(self) -> int:
        return self.first - 1 + len(self.log)

    def last_term(self) -> int:
        return self.log[self.last()].term if self.log else self.prev_term

    def _entries(self, start: int, n: int, term_bump: int, config_at: int | None) -> list[Entry]:
        self.term += term_bump
        out = []
        for i in range(start, start + n):
            if config_at == i - start:
                out.append(config(i, self.term, M5 if i % 2 else M3))
            else:
                out.append(cmd(i, self.term, bytes([i % 256]) * (i % 7)))
        return out

    @rule(n=st.integers(0, 6), term_bump=st.integers(0, 1), config_at=st.none() | st.integers(0, 5),
          commit_to_end=st.booleans())
    def append(self, n: int, term_bump: int, config_at: int | None, commit_to_end: bool) -> None:
        entries = self._entries(self.last() + 1, n, term_bump, config_at)
        commit = self.last() + n if commit_to_end else self.commit
        self.hard = hs(self.term, None, commit)
        self.store.append(entries, hard_state=self.hard)
        self.log.update((e.index, e) for e in entries)
        self.commit = commit

    @precondition(lambda self: self.last() > max(self.commit, self.snapshot_index, self.first - 1))
    @rule(back=st.integers(0, 5), n=st.integers(0, 4), config_at=st.none() | st.integers(0, 3))
    def truncate_and_append(self, back: int, n: int, config_at: int | None) -> None:
        lowest = max(self.commit, self.snapshot_index, self.first - 1) + 1
        start = max(lowest, self.last() - back)
        entries = self._entries(start, n, 1, config_at)
        self.hard = hs(self.term, None, self.commit)
        self.store.append(entries, truncate_from=start, hard_state=self.hard)
        for i in range(start, self.last() + 1):
            del self.log[i]
        self.log.update((e.index, e) for e in entries)

    @precondition(lambda self: self.commit >= self.first)
    @rule(data=st.data())
    def snapshot_and_compact(self, data: st.DataObject) -> None:
        upto = data.draw(st.integers(self.first, self.commit))
        term = self.log[upto].term
        member = self.model_membership(upto)
        self.store.save_snapshot(SnapshotMeta(last_index=upto, last_term=term, membership=member or M3), b"s")
        self.snapshot_index = upto
        self.store.compact(upto, term)
        self.base_membership = member
        for i in range(self.first, upto + 1):
            del self.log[i]
        self.first, self.prev_term = upto + 1, term

    @rule(ahead=st.integers(1, 4))
    def install_conflicting_snapshot(self, ahead: int) -> None:
        self.term += 1
        index = self.last() + ahead
        self.store.save_hard_state(hs(self.term, None, self.commit))
        self.store.install_snapshot(SnapshotMeta(last_index=index, last_term=self.term, membership=M5), b"i")
        self.log.clear()
        self.first, self.prev_term = index + 1, self.term
        self.commit = self.snapshot_index = index
        self.hard = hs(self.term, None, index)
        self.base_membership = M5

    @rule()
    def reopen(self) -> None:
        self.store = reopen(self.store)

    def model_membership(self, upto: int) -> Membership | None:
        for i in range(upto, self.first - 1, -1):
            if self.log[i].kind == EntryKind.CONFIG:
                return decode_struct(Membership, self.log[i].data, "model config")
        return self.base_membership

    @invariant()
    def reads_match_the_model(self) -> None:
        s = self.store
        assert (s.first_index(), s.last_index(), s.last_term()) == (self.first, self.last(), self.last_term())
        for i in range(max(0, self.first - 3), self.last() + 3):
            expected = self.prev_term if i == self.first - 1 else (self.log[i].term if i in self.log else None)
            assert s.term_of(i) == expected, i
        assert whole_log(s) == [self.log[i] for i in range(self.first, self.last() + 1)]
        if self.log:
            assert s.entries(self.first, self.last() + 1, 0) == [self.log[self.first]]
        assert s.hard_state() == self.hard
        assert s.membership() == self.model_membership(self.last())

    def teardown(self) -> None:
        self.store.close()
        shutil.rmtree(self.dir, ignore_errors=True)


TestLogStoreAgainstModel = LogStoreAgainstModel.TestCase
TestLogStoreAgainstModel.settings = settings(
    max_examples=60,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


# ----------------------------------------------------------------------------- throughput


def test_synced_append_rate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Measure fsynced appends/s for batches of 1 and 64 entries of 200 bytes (printed; the
    floor asserted is far below the measured rate, it only catches a lost group commit)."""
    results = {}
    for batch in (1, 64):
        with RaftLogStore.open(tmp_path / f"b{batch}") as store:
            payload = b"p" * 200
            index, appends = 1, 0
            start = time.perf_counter()
            while time.perf_counter() - start < 1.0:
                store.append([cmd(i, 1, payload) for i in range(index, index + batch)])
                index += batch
                appends += 1
            elapsed = time.perf_counter() - start
            results[batch] = (appends / elapsed, (index - 1) / elapsed)
            assert store.statistics().syncs == appends
    with capsys.disabled():
        for batch, (per_s, entries_per_s) in results.items():
            print(f"\nsynced appends, batch {batch:>2} x 200 B: {per_s:,.0f} appends/s, {entries_per_s:,.0f} entries/s")
    assert results[1][0] > 50 and results[64][1] > results[1][1]

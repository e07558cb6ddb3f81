"""The durable storage of one Raft peer: hard state, log entries, snapshots, node id.

Synchronous and blocking: the peer actor calls it from one worker thread at a time
(it is not safe for concurrent callers; the actor serialises them). Raft requires
that term, vote and entries are on disk before a peer answers a vote or acknowledges
an append (paper §5, Figure 2 "persistent state"), so every write defaults to
`sync=True` and one `append` is ONE LevelDB `write_batch(sync=True)`: a follower's
truncation of a conflicting suffix, its new entries and its hard state land together
or not at all. A crash between "truncate" and "append" is impossible by construction.

Layout of `data_dir`:

    data_dir/
      node_id                                   text, one decimal integer (fsynced once)
      raft-log/                                 LevelDB (plyvel), one handle per process
        log/<index u64 BE>      -> msgpack Entry.to_wire()  [index, term, kind, data]
        meta/hard_state         -> msgpack HardState.to_wire() [term, voted_for, commit_index]
        meta/membership         -> msgpack Membership.to_wire(): the membership as of
                                   first_index - 1 (from the snapshot / compacted prefix)
        meta/first_index        -> msgpack [first_index, prev_term]: the first index held
                                   after compaction, and the term of first_index - 1 (the
                                   snapshot's last term), so term_of works at the boundary
      snapshots/{last_index:020d}-{last_term:020d}.snap   the newest `snapshots_kept` (2)

Big-endian index keys make LevelDB's byte order the index order, so a range of the log
is one iterator. Snapshot names are zero-padded so listing order is index order.

A snapshot file is a 24-byte header, then the meta, then the state-machine bytes:

    | magic 8s "DZRSNAP1" | meta_len u32 BE | data_len u64 BE | crc32c u32 BE | meta | data |

The CRC32C covers the header's first 20 bytes, the meta and the data. It is written to a
temp file, fsynced, renamed into place and the directory fsynced; a corrupt newest file
is logged and the older one used.

Invariants (asserted on every write, verified at open): indexes contiguous from
first_index with no gaps, terms non-decreasing along the log (starting at >= prev_term),
the hard state's term never decreases and its vote never changes within a term,
commit_index never decreases and never passes last_index, committed entries are never
truncated.

Recovery (`open`): scan the whole log once (verifies the invariants above and builds the
in-memory term runs and configuration index list, so `term_of` and `membership` never
read the disk), delete leftover `*.tmp` snapshot files, and finish an `install_snapshot`
that crashed after its file was fsynced but before its log batch.
"""

from __future__ import annotations

import bisect
import logging
import os
import struct
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import crc32c
import msgpack
import plyvel

from danube_zmq.consensus.types import Entry, EntryKind, HardState, Membership, SnapshotMeta
from danube_zmq.transport.codec import Struct, unpack
from danube_zmq.transport.errors import (
    FailedPrecondition,
    InternalError,
    InvalidArgument,
    ResourceExhausted,
)

log = logging.getLogger("danube_zmq.raft.log_store")

LOG_DIR = "raft-log"
SNAPSHOT_DIR = "snapshots"
NODE_ID_FILE = "node_id"

_LOG_PREFIX = b"log/"
_LOG_END = b"log0"  # the first key after every `log/` key ("0" follows "/" in ASCII)
_KEY_HARD_STATE = b"meta/hard_state"
_KEY_MEMBERSHIP = b"meta/membership"
_KEY_FIRST_INDEX = b"meta/first_index"

INDEX_MAX = (1 << 64) - 1
NODE_ID_MAX = (1 << 63) - 1

_SNAPSHOT_MAGIC = b"DZRSNAP1"
_SNAPSHOT_HEADER = struct.Struct(">8sIQI")
_SNAPSHOT_CRC_PREFIX_BYTES = 20  # magic + meta_len + data_len: everything before the CRC
_SNAPSHOT_META_BYTES_MAX = 1 << 20
_SNAPSHOT_SUFFIX = ".snap"
_TMP_SUFFIX = ".tmp"

_KINDS = frozenset(int(k) for k in EntryKind)

# Defaults for the bounds; the peer's config may pass others to `open`.
ENTRY_BYTES_MAX = 16 * 1024 * 1024  # one command; a frame is at most 16 MiB by default
APPEND_ENTRIES_MAX = 65_536  # entries in one append batch
LOG_ENTRIES_MAX = 10_000_000  # entries held without compaction before appends are refused
SNAPSHOT_BYTES_MAX = 1 << 32  # state-machine bytes in one snapshot
SNAPSHOTS_KEPT = 2

_S = TypeVar("_S", bound=Struct)


class LogStoreCorruption(InternalError):
    """Something on disk does not decode or breaks a log invariant: damage, or a bug that wrote it."""


class LogCompacted(FailedPrecondition):
    """The requested entries were compacted into a snapshot; send the snapshot instead."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LogStoreStatistics:
    first_index: int  # the first index held (snapshot's last_index + 1)
    last_index: int  # the last index held (first_index - 1 when the log is empty)
    last_term: int
    entries: int  # entries held = last_index - first_index + 1
    entry_bytes: int  # encoded bytes of the entries held
    term: int  # hard state
    voted_for: int | None
    commit_index: int
    snapshots: int  # snapshot files on disk
    snapshot_last_index: int | None  # newest snapshot file's last index
    appends: int  # since open: append calls that wrote something
    appended_entries: int
    appended_bytes: int
    truncated_entries: int
    compacted_entries: int
    syncs: int  # synced LevelDB writes and snapshot fsync groups since open
    snapshots_saved: int
    snapshots_installed: int
    snapshots_corrupt: int  # corrupt snapshot files found by `latest_snapshot` since open


# ----------------------------------------------------------------------------- encoding


def _index_key(index: int) -> bytes:
    return _LOG_PREFIX + index.to_bytes(8, "big")


def _key_index(key: bytes) -> int:
    assert len(key) == len(_LOG_PREFIX) + 8 and key.startswith(_LOG_PREFIX), key
    return int.from_bytes(key[len(_LOG_PREFIX):], "big")


def _pack(value: Any) -> bytes:
    return msgpack.packb(value, use_bin_type=True)


def encode_struct(value: Struct) -> bytes:
    """msgpack of the codec's wire array (the order of the declared fields)."""
    return _pack(value.to_wire())


def decode_struct(cls: type[_S], raw: bytes, what: str) -> _S:
    """Decode `encode_struct` output with the codec's own field list and checks.

    Every field is required here (what we wrote has them all); any fault is a
    `LogStoreCorruption` naming `what`.
    """
    try:
        items = unpack(raw)
        if type(items) is not list or len(items) != len(cls._fields):
            raise InvalidArgument(f"expected a {len(cls._fields)}-field array, got {items!r:.80}")
        kwargs = {
            name: check(item, f"{cls.__name__}.{name}")
            for name, check, item in zip(cls._fields, cls._checks, items, strict=True)
        }
    except InvalidArgument as exc:
        raise LogStoreCorruption(f"{what} does not decode as {cls.__name__}: {exc}") from None
    return cls(**kwargs)


def _snapshot_name(last_index: int, last_term: int) -> str:
    return f"{last_index:020d}-{last_term:020d}{_SNAPSHOT_SUFFIX}"


def _parse_snapshot_name(name: str) -> tuple[int, int] | None:
    if not name.endswith(_SNAPSHOT_SUFFIX):
        return None
    stem = name[: -len(_SNAPSHOT_SUFFIX)]
    parts = stem.split("-")
    if len(parts) != 2 or not all(len(p) == 20 and p.isdigit() for p in parts):
        return None
    return int(parts[0]), int(parts[1])


def encode_snapshot(meta: SnapshotMeta, data: bytes) -> bytes:
    """The whole snapshot file: header, meta, data (see the module docstring)."""
    meta_bytes = encode_struct(meta)
    assert len(meta_bytes) <= _SNAPSHOT_META_BYTES_MAX, "snapshot meta too large"
    prefix = _SNAPSHOT_HEADER.pack(_SNAPSHOT_MAGIC, len(meta_bytes), len(data), 0)[:_SNAPSHOT_CRC_PREFIX_BYTES]
    crc = crc32c.crc32c(data, crc32c.crc32c(meta_bytes, crc32c.crc32c(prefix)))
    header = _SNAPSHOT_HEADER.pack(_SNAPSHOT_MAGIC, len(meta_bytes), len(data), crc)
    return b"".join((header, meta_bytes, data))


def decode_snapshot(raw: bytes, what: str) -> tuple[SnapshotMeta, bytes]:
    """Check and split a snapshot file; any fault is a `LogStoreCorruption`."""
    if len(raw) < _SNAPSHOT_HEADER.size:
        raise LogStoreCorruption(f"{what}: {len(raw)} bytes, shorter than the header")
    magic, meta_len, data_len, stored_crc = _SNAPSHOT_HEADER.unpack_from(raw)
    if magic != _SNAPSHOT_MAGIC:
        raise LogStoreCorruption(f"{what}: bad magic {magic!r}")
    if meta_len > _SNAPSHOT_META_BYTES_MAX or _SNAPSHOT_HEADER.size + meta_len + data_len != len(raw):
        raise LogStoreCorruption(
            f"{what}: lengths meta={meta_len} data={data_len} do not match the file size {len(raw)}"
        )
    view = memoryview(raw)
    computed = crc32c.crc32c(view[_SNAPSHOT_HEADER.size:], crc32c.crc32c(view[:_SNAPSHOT_CRC_PREFIX_BYTES]))
    if computed != stored_crc:
        raise LogStoreCorruption(f"{what}: crc32c mismatch: stored {stored_crc:#010x}, computed {computed:#010x}")
    body_start = _SNAPSHOT_HEADER.size
    meta = decode_struct(SnapshotMeta, bytes(view[body_start:body_start + meta_len]), f"{what} meta")
    return meta, bytes(view[body_start + meta_len:])


# ----------------------------------------------------------------------------- files


def _fsync_directory(directory: Path) -> None:
    """fsync a directory so that file creations, renames and deletions in it survive a crash."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_file_durably(path: Path, chunks: Iterable[bytes]) -> None:
    """Temp file, fsync, rename over `path`, fsync the directory: all or nothing after a crash."""
    tmp = path.with_name(path.name + _TMP_SUFFIX)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        for chunk in chunks:
            view = memoryview(chunk)
            while view:
                written = os.write(fd, view)
                view = view[written:]
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        tmp.unlink(missing_ok=True)
        raise
    os.close(fd)
    os.replace(tmp, path)
    _fsync_directory(path.parent)


# ----------------------------------------------------------------------------- store


class RaftLogStore:
    """Term, vote and log entries in LevelDB; snapshots as files; the node id. See the module docstring."""

    def __init__(
        self,
        data_dir: Path,
        db: plyvel.DB,
        *,
        entry_bytes_max: int,
        append_entries_max: int,
        log_entries_max: int,
        snapshot_bytes_max: int,
        snapshots_kept: int,
    ) -> None:
        # Use `RaftLogStore.open`; this only wires fields, `_recover` fills them.
        self._data_dir = data_dir
        self._snapshot_dir = data_dir / SNAPSHOT_DIR
        self._db: plyvel.DB | None = db
        self._entry_bytes_max = entry_bytes_max
        self._append_entries_max = append_entries_max
        self._log_entries_max = log_entries_max
        self._snapshot_bytes_max = snapshot_bytes_max
        self._snapshots_kept = snapshots_kept
        self._node_id: int | None = None

        self._hard_state = HardState(term=0, voted_for=None, commit_index=0)
        self._base_membership: Membership | None = None  # as of first_index - 1
        self._first_index = 1
        self._prev_term = 0  # term of first_index - 1 (0 for index 0)
        self._last_index = 0
        # Term runs: (first index of the run, term), ascending in both. Terms change rarely,
        # so this is tiny and term_of is a bisect, never a disk read.
        self._run_starts: list[int] = []
        self._run_terms: list[int] = []
        self._config_indexes: list[int] = []  # indexes of CONFIG entries held, ascending
        self._entry_bytes = 0
        self._snapshot_index = 0  # the newest snapshot file's last index (0: none)

        self._appends = 0
        self._appended_entries = 0
        self._appended_bytes = 0
        self._truncated_entries = 0
        self._compacted_entries = 0
        self._syncs = 0
        self._snapshots_saved = 0
        self._snapshots_installed = 0
        self._snapshots_corrupt = 0

    @classmethod
    def open(
        cls,
        data_dir: Path,
        *,
        entry_bytes_max: int = ENTRY_BYTES_MAX,
        append_entries_max: int = APPEND_ENTRIES_MAX,
        log_entries_max: int = LOG_ENTRIES_MAX,
        snapshot_bytes_max: int = SNAPSHOT_BYTES_MAX,
        snapshots_kept: int = SNAPSHOTS_KEPT,
    ) -> RaftLogStore:
        """Open (creating if missing) the store in `data_dir` and recover it."""
        assert entry_bytes_max > 0 and append_entries_max > 0 and log_entries_max > 0
        assert snapshot_bytes_max > 0 and snapshots_kept >= 1
        data_dir = Path(data_dir)
        (data_dir / SNAPSHOT_DIR).mkdir(parents=True, exist_ok=True)
        try:
            # paranoid_checks: a corrupt table is an error at open, not silently skipped entries.
            db = plyvel.DB(str(data_dir / LOG_DIR), create_if_missing=True, paranoid_checks=True)
        except plyvel.IOError as exc:
            raise FailedPrecondition(
                f"cannot open raft log {data_dir / LOG_DIR}: {exc} (one handle per directory per process)"
            ) from exc
        except plyvel.CorruptionError as exc:
            raise LogStoreCorruption(f"raft log {data_dir / LOG_DIR} is corrupt: {exc}") from exc
        store = cls(
            data_dir,
            db,
            entry_bytes_max=entry_bytes_max,
            append_entries_max=append_entries_max,
            log_entries_max=log_entries_max,
            snapshot_bytes_max=snapshot_bytes_max,
            snapshots_kept=snapshots_kept,
        )
        try:
            store._recover()
        except BaseException:
            store.close()
            raise
        return store

    @property
    def data_dir(self) -> Path:
        return self._data_dir

    def _live(self) -> plyvel.DB:
        if self._db is None:
            raise FailedPrecondition(f"raft log store {self._data_dir} is closed")
        return self._db

    # -- recovery ---------------------------------------------------------------------

    def _recover(self) -> None:
        db = self._live()
        raw = db.get(_KEY_HARD_STATE)
        if raw is not None:
            self._hard_state = decode_struct(HardState, raw, "meta/hard_state")
        raw = db.get(_KEY_MEMBERSHIP)
        if raw is not None:
            self._base_membership = decode_struct(Membership, raw, "meta/membership")
        raw = db.get(_KEY_FIRST_INDEX)
        if raw is not None:
            self._first_index, self._prev_term = _decode_first_index(raw)
        self._scan_log()
        hs = self._hard_state
        if hs.commit_index > self._last_index:
            raise LogStoreCorruption(f"commit_index {hs.commit_index} > last_index {self._last_index}")
        for tmp in self._snapshot_dir.glob("*" + _TMP_SUFFIX):
            # A crash while writing it: it was never renamed into place, so never relied on.
            log.warning("deleting unfinished snapshot file %s", tmp)
            tmp.unlink()
        self._finish_interrupted_install()

    def _scan_log(self) -> None:
        """Read every entry once: verify contiguity and term order, build the in-memory indexes."""
        expected = self._first_index
        prev_term = self._prev_term
        with self._live().iterator(prefix=_LOG_PREFIX) as it:
            for key, value in it:
                index = _key_index(key)
                if index != expected:
                    raise LogStoreCorruption(f"raft log has index {index} where {expected} was expected")
                entry = decode_struct(Entry, value, f"log entry {index}")
                if entry.index != index:
                    raise LogStoreCorruption(f"log key {index} holds entry {entry.index}")
                if entry.term < prev_term:
                    raise LogStoreCorruption(f"log entry {index} has term {entry.term} < previous {prev_term}")
                self._note_entry(entry, len(value))
                prev_term = entry.term
                expected = index + 1
        self._last_index = expected - 1

    def _note_entry(self, entry: Entry, size: int) -> None:
        if not self._run_terms or entry.term != self._run_terms[-1]:
            self._run_starts.append(entry.index)
            self._run_terms.append(entry.term)
        if entry.kind == EntryKind.CONFIG:
            self._config_indexes.append(entry.index)
        self._entry_bytes += size

    def _finish_interrupted_install(self) -> None:
        """Make the log agree with the newest snapshot file after a crash.

        A file that disagrees with the log (its index beyond the log, or a different term
        there) can only be an `install_snapshot` whose file was fsynced but whose log batch
        was not: finish it. A file that agrees but is past the stored commit_index (an
        install that kept the log suffix, or an own snapshot whose commit was not persisted
        yet) raises commit_index: whatever a snapshot holds is committed.
        """
        names = self._snapshot_files()
        if not names:
            return
        (index, term), path = names[-1]
        self._snapshot_index = index
        if index < self._first_index - 1:
            return  # older than the compacted prefix: only `latest_snapshot` cares
        if self.term_of(index) == term and index <= self._hard_state.commit_index:
            return
        try:
            meta, _ = decode_snapshot(path.read_bytes(), str(path))
        except LogStoreCorruption as exc:
            # The log does not depend on it (it never got past writing the file), so the log
            # is consistent without it; `latest_snapshot` will skip it too.
            log.error("ignoring corrupt snapshot found at recovery: %s", exc)
            return
        log.warning("recovering raft log to agree with snapshot %s", path.name)
        self._apply_snapshot(meta, compact=False)

    # -- reads ------------------------------------------------------------------------

    def hard_state(self) -> HardState:
        return self._hard_state

    def membership(self) -> Membership | None:
        """The newest membership the store knows: the last CONFIG entry in the log (committed
        or not, as Raft §6 uses it), else the one as of the snapshot, else None."""
        if self._config_indexes:
            index = self._config_indexes[-1]
            return decode_struct(Membership, self._entry(index).data, f"config entry {index}")
        return self._base_membership

    def first_index(self) -> int:
        return self._first_index

    def last_index(self) -> int:
        return self._last_index

    def last_term(self) -> int:
        return self._run_terms[-1] if self._run_terms else self._prev_term

    def term_of(self, index: int) -> int | None:
        """The term of entry `index`; the snapshot's last term at first_index - 1 (0 at index 0);
        None when compacted further back or beyond the end."""
        if index == self._first_index - 1:
            return self._prev_term
        if index < self._first_index or index > self._last_index:
            return None
        return self._run_terms[bisect.bisect_right(self._run_starts, index) - 1]

    def entries(self, lo: int, hi: int, max_bytes: int) -> list[Entry]:
        """Entries with lo <= index < hi, stopping before max_bytes of encoded entries are
        passed, but always at least one if lo < hi (so a huge entry still makes progress)."""
        assert max_bytes >= 0, max_bytes
        if lo < self._first_index:
            raise LogCompacted(f"entries from {lo} were compacted; the log starts at {self._first_index}")
        assert lo <= hi <= self._last_index + 1, (lo, hi, self._last_index)
        out: list[Entry] = []
        if lo == hi:
            return out
        total = 0
        with self._live().iterator(start=_index_key(lo), stop=_index_key(hi)) as it:
            for key, value in it:
                total += len(value)
                if out and total > max_bytes:
                    break
                entry = decode_struct(Entry, value, f"log entry {_key_index(key)}")
                assert entry.index == lo + len(out), (entry.index, lo, len(out))
                out.append(entry)
        assert out, (lo, hi)
        return out

    def _entry(self, index: int) -> Entry:
        raw = self._live().get(_index_key(index))
        if raw is None:
            raise LogStoreCorruption(f"log entry {index} is missing (log {self._first_index}..{self._last_index})")
        return decode_struct(Entry, raw, f"log entry {index}")

    # -- writes -----------------------------------------------------------------------

    def append(
        self,
        entries: Sequence[Entry],
        *,
        truncate_from: int | None = None,
        hard_state: HardState | None = None,
        sync: bool = True,
    ) -> None:
        """One atomic (and by default fsynced) batch: delete entries >= truncate_from, put
        `entries` (which must continue the log that is kept), put `hard_state`."""
        db = self._live()
        keep_last = self._last_index
        if truncate_from is not None:
            assert self._first_index <= truncate_from <= self._last_index + 1, (
                f"truncate_from {truncate_from} outside {self._first_index}..{self._last_index + 1}"
            )
            # The stored commit may lag the peer's; a snapshot's index is committed for sure.
            assert truncate_from > max(self._hard_state.commit_index, self._snapshot_index), (
                f"truncating committed entries: {truncate_from} <= commit {self._hard_state.commit_index}"
                f" or snapshot {self._snapshot_index}"
            )
            keep_last = truncate_from - 1
        count = len(entries)
        assert count <= self._append_entries_max, f"append of {count} entries > {self._append_entries_max}"
        if count and keep_last - self._first_index + 1 + count > self._log_entries_max:
            raise ResourceExhausted(
                f"raft log would hold more than {self._log_entries_max} entries: compact after a snapshot"
            )
        prev_term = self._prev_term if keep_last < self._first_index else self.term_of(keep_last)
        assert prev_term is not None
        encoded: list[tuple[Entry, bytes]] = []
        for i, entry in enumerate(entries):
            _check_entry(entry, keep_last + 1 + i, prev_term)
            if len(entry.data) > self._entry_bytes_max:
                raise InvalidArgument(f"log entry of {len(entry.data)} bytes > {self._entry_bytes_max}")
            if entry.kind == EntryKind.CONFIG:
                # A config entry that cannot be read back would wedge membership(): refuse it now.
                try:
                    decode_struct(Membership, entry.data, "config entry")
                except LogStoreCorruption as exc:
                    raise InvalidArgument(str(exc)) from None
            encoded.append((entry, encode_struct(entry)))
            prev_term = entry.term
        new_last = keep_last + count
        if hard_state is not None:
            self._check_hard_state(hard_state, new_last)
        if truncate_from is None and not count and hard_state is None:
            return

        truncated: list[tuple[int, int]] = []  # (index, encoded size) of the entries to drop
        if keep_last < self._last_index:
            with db.iterator(start=_index_key(keep_last + 1), stop=_LOG_END) as it:
                for key, value in it:
                    truncated.append((_key_index(key), len(value)))
            assert [i for i, _ in truncated] == list(range(keep_last + 1, self._last_index + 1))
        # transaction=True: if building the batch raises, nothing is written.
        with db.write_batch(sync=sync, transaction=True) as batch:
            for index, _ in truncated:
                batch.delete(_index_key(index))
            for entry, value in encoded:
                batch.put(_index_key(entry.index), value)
            if hard_state is not None:
                batch.put(_KEY_HARD_STATE, encode_struct(hard_state))

        # The batch is on disk: bring the in-memory view along.
        if truncated:
            self._drop_suffix(keep_last + 1, sum(size for _, size in truncated))
            self._truncated_entries += len(truncated)
        for entry, value in encoded:
            self._note_entry(entry, len(value))
            self._last_index = entry.index
        assert self._last_index == new_last, (self._last_index, new_last)
        if hard_state is not None:
            self._hard_state = hard_state
        self._appends += 1
        self._appended_entries += count
        self._appended_bytes += sum(len(value) for _, value in encoded)
        self._syncs += sync

    def save_hard_state(self, hs: HardState, *, sync: bool = True) -> None:
        """Persist term, vote and commit index (fsynced by default: before answering a vote)."""
        self._check_hard_state(hs, self._last_index)
        self._live().put(_KEY_HARD_STATE, encode_struct(hs), sync=sync)
        self._hard_state = hs
        self._syncs += sync

    def _check_hard_state(self, hs: HardState, last_index: int) -> None:
        old = self._hard_state
        assert type(hs) is HardState, type(hs)
        assert hs.term >= old.term, f"term decreases: {old.term} -> {hs.term}"
        assert hs.term > old.term or old.voted_for is None or hs.voted_for == old.voted_for, (
            f"vote changes within term {hs.term}: {old.voted_for} -> {hs.voted_for}"
        )
        assert hs.commit_index >= old.commit_index, f"commit decreases: {old.commit_index} -> {hs.commit_index}"
        assert hs.commit_index <= last_index, f"commit_index {hs.commit_index} > last_index {last_index}"

    def compact(self, upto_index: int, upto_term: int) -> None:
        """Delete entries <= upto_index (a snapshot covers them) and record the new first index.

        Idempotent: compacting to or below what is already compacted does nothing. Keeps the
        membership as of upto_index (the last CONFIG entry deleted) in `meta/membership`.
        """
        db = self._live()
        if upto_index < self._first_index:
            assert upto_index != self._first_index - 1 or upto_term == self._prev_term, (upto_index, upto_term)
            return
        assert upto_index <= self._last_index, f"compact to {upto_index} past last_index {self._last_index}"
        assert self._snapshot_index >= upto_index, f"compact to {upto_index}: no snapshot covers it"
        assert self.term_of(upto_index) == upto_term, (upto_index, upto_term, self.term_of(upto_index))
        k = bisect.bisect_right(self._config_indexes, upto_index)
        membership = self._base_membership
        if k:
            index = self._config_indexes[k - 1]
            membership = decode_struct(Membership, self._entry(index).data, f"config entry {index}")
        dropped_bytes = 0
        keys: list[bytes] = []
        with db.iterator(start=_LOG_PREFIX, stop=_index_key(upto_index + 1)) as it:
            for key, value in it:
                keys.append(key)
                dropped_bytes += len(value)
        assert len(keys) == upto_index - self._first_index + 1, (len(keys), upto_index, self._first_index)
        with db.write_batch(sync=True, transaction=True) as batch:
            for key in keys:
                batch.delete(key)
            batch.put(_KEY_FIRST_INDEX, _pack([upto_index + 1, upto_term]))
            if membership is not None:
                batch.put(_KEY_MEMBERSHIP, encode_struct(membership))
        self._syncs += 1
        self._compacted_entries += len(keys)
        self._entry_bytes -= dropped_bytes
        self._base_membership = membership
        del self._config_indexes[:k]
        self._first_index = upto_index + 1
        self._prev_term = upto_term
        # Drop the term runs wholly below the new first index; the run containing it starts there.
        r = bisect.bisect_right(self._run_starts, upto_index + 1) - 1
        if r >= 0 and upto_index < self._last_index:
            del self._run_starts[:r]
            del self._run_terms[:r]
            self._run_starts[0] = upto_index + 1
        else:
            self._run_starts.clear()
            self._run_terms.clear()

    def _drop_suffix(self, from_index: int, dropped_bytes: int) -> None:
        r = bisect.bisect_left(self._run_starts, from_index)
        del self._run_starts[r:]
        del self._run_terms[r:]
        del self._config_indexes[bisect.bisect_left(self._config_indexes, from_index):]
        self._entry_bytes -= dropped_bytes
        self._last_index = from_index - 1

    # -- snapshots --------------------------------------------------------------------

    def save_snapshot(self, meta: SnapshotMeta, data: bytes) -> Path:
        """Write this peer's own snapshot (of applied, hence committed, entries) durably and
        keep the newest `snapshots_kept`. Does not compact: call `compact` after, choosing
        how much log to keep (compacting only to the previous snapshot's index keeps the
        fallback to the older file usable if the newest one rots)."""
        assert self._first_index - 1 <= meta.last_index <= self._last_index, (
            f"snapshot at {meta.last_index} outside the log {self._first_index - 1}..{self._last_index}"
        )
        assert meta.last_index >= 1, meta
        assert self.term_of(meta.last_index) == meta.last_term, (meta, self.term_of(meta.last_index))
        path = self._write_snapshot(meta, data)
        self._snapshots_saved += 1
        return path

    def install_snapshot(self, meta: SnapshotMeta, data: bytes) -> Path:
        """A follower receiving InstallSnapshot: save the file, then in one synced batch drop
        the whole log, set first_index = meta.last_index + 1 and commit_index to at least
        meta.last_index.

        The caller ignores snapshots at or below its commit index (stale or duplicate
        messages; etcd does the same). Raft §7 (Figure 13, rule 6): if the log holds an
        entry with the snapshot's last index and term, only the covered prefix is compacted
        and the entries after it are kept, so a late InstallSnapshot never erases entries
        this peer has already acknowledged.
        """
        assert meta.last_index >= 1 and meta.last_term >= 1, meta
        assert meta.last_index > self._hard_state.commit_index, (
            f"stale snapshot at {meta.last_index} <= commit_index {self._hard_state.commit_index}"
        )
        path = self._write_snapshot(meta, data)
        self._apply_snapshot(meta, compact=True)
        self._snapshots_installed += 1
        return path

    def _apply_snapshot(self, meta: SnapshotMeta, *, compact: bool) -> None:
        """Make the log continue from a snapshot already on disk (install, or its recovery)."""
        index, term = meta.last_index, meta.last_term
        if self.term_of(index) != term:
            self._reset_to_snapshot(meta)
            return
        hs = self._hard_state
        if index > hs.commit_index:
            self.save_hard_state(HardState(term=hs.term, voted_for=hs.voted_for, commit_index=index))
        if compact:
            self.compact(index, term)

    def _reset_to_snapshot(self, meta: SnapshotMeta) -> None:
        """Drop the whole log; the log restarts after the snapshot. One synced batch."""
        db = self._live()
        hs = self._hard_state
        if hs.commit_index < meta.last_index:
            # Everything in a snapshot is committed by definition.
            hs = HardState(term=hs.term, voted_for=hs.voted_for, commit_index=meta.last_index)
        with db.iterator(prefix=_LOG_PREFIX, include_value=False) as it:
            keys = list(it)
        with db.write_batch(sync=True, transaction=True) as batch:
            for key in keys:
                batch.delete(key)
            batch.put(_KEY_FIRST_INDEX, _pack([meta.last_index + 1, meta.last_term]))
            batch.put(_KEY_MEMBERSHIP, encode_struct(meta.membership))
            batch.put(_KEY_HARD_STATE, encode_struct(hs))
        self._syncs += 1
        self._hard_state = hs
        self._truncated_entries += len(keys)
        self._base_membership = meta.membership
        self._config_indexes.clear()
        self._run_starts.clear()
        self._run_terms.clear()
        self._entry_bytes = 0
        self._first_index = meta.last_index + 1
        self._prev_term = meta.last_term
        self._last_index = meta.last_index

    def _write_snapshot(self, meta: SnapshotMeta, data: bytes) -> Path:
        assert type(meta) is SnapshotMeta and type(data) is bytes, (type(meta), type(data))
        if len(data) > self._snapshot_bytes_max:
            raise ResourceExhausted(f"snapshot of {len(data)} bytes > {self._snapshot_bytes_max}")
        path = self._snapshot_dir / _snapshot_name(meta.last_index, meta.last_term)
        encoded = encode_snapshot(meta, data)
        _write_file_durably(path, (encoded,))
        self._syncs += 1
        files = self._snapshot_files()
        self._snapshot_index = files[-1][0][0]
        stale = files[: -self._snapshots_kept]
        for _, old in stale:
            old.unlink()
        if stale:
            _fsync_directory(self._snapshot_dir)
        return path

    def _snapshot_files(self) -> list[tuple[tuple[int, int], Path]]:
        """Snapshot files, oldest first (name order is (index, term) order)."""
        out = []
        for path in self._snapshot_dir.iterdir():
            parsed = _parse_snapshot_name(path.name)
            if parsed is not None:
                out.append((parsed, path))
        out.sort()
        return out

    def latest_snapshot(self) -> tuple[SnapshotMeta, bytes] | None:
        """The newest intact snapshot; a corrupt file is logged and the older one used.

        Raises `LogStoreCorruption` when no intact snapshot reaches first_index - 1: the
        entries between would be lost, and a peer must not run with a hole in its state.
        """
        floor = self._first_index - 1
        for (index, term), path in reversed(self._snapshot_files()):
            try:
                raw = path.read_bytes()
                if len(raw) > self._snapshot_bytes_max + _SNAPSHOT_HEADER.size + _SNAPSHOT_META_BYTES_MAX:
                    raise LogStoreCorruption(f"{path}: {len(raw)} bytes is over the snapshot bound")
                meta, data = decode_snapshot(raw, str(path))
                if (meta.last_index, meta.last_term) != (index, term):
                    raise LogStoreCorruption(f"{path}: holds a snapshot at {meta.last_index} (term {meta.last_term})")
            except LogStoreCorruption as exc:
                self._snapshots_corrupt += 1
                log.error("corrupt raft snapshot, falling back to an older one: %s", exc)
                continue
            if index < floor:
                raise LogStoreCorruption(
                    f"no intact snapshot covers the compacted log up to {floor} (newest intact: {index})"
                )
            return meta, data
        if floor > 0:
            raise LogStoreCorruption(f"no intact snapshot covers the compacted log up to {floor}")
        return None

    # -- node id ----------------------------------------------------------------------

    def node_id(self, create: Callable[[], int]) -> int:
        """This peer's id: read from `data_dir/node_id`, or `create()`d once and fsynced there."""
        if self._node_id is not None:
            return self._node_id
        path = self._data_dir / NODE_ID_FILE
        try:
            text = path.read_text(encoding="ascii")
        except FileNotFoundError:
            node_id = create()
            assert type(node_id) is int and 0 < node_id <= NODE_ID_MAX, node_id
            _write_file_durably(path, (f"{node_id}\n".encode("ascii"),))
        else:
            stripped = text.strip()
            if not stripped.isdigit() or not 0 < int(stripped) <= NODE_ID_MAX:
                raise LogStoreCorruption(f"{path} does not hold a node id: {text!r:.40}")
            node_id = int(stripped)
        self._node_id = node_id
        return node_id

    # -- lifecycle --------------------------------------------------------------------

    def statistics(self) -> LogStoreStatistics:
        files = self._snapshot_files() if self._db is not None else []
        hs = self._hard_state
        return LogStoreStatistics(
            first_index=self._first_index,
            last_index=self._last_index,
            last_term=self.last_term(),
            entries=self._last_index - self._first_index + 1,
            entry_bytes=self._entry_bytes,
            term=hs.term,
            voted_for=hs.voted_for,
            commit_index=hs.commit_index,
            snapshots=len(files),
            snapshot_last_index=files[-1][0][0] if files else None,
            appends=self._appends,
            appended_entries=self._appended_entries,
            appended_bytes=self._appended_bytes,
            truncated_entries=self._truncated_entries,
            compacted_entries=self._compacted_entries,
            syncs=self._syncs,
            snapshots_saved=self._snapshots_saved,
            snapshots_installed=self._snapshots_installed,
            snapshots_corrupt=self._snapshots_corrupt,
        )

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None

    def __enter__(self) -> RaftLogStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _decode_first_index(raw: bytes) -> tuple[int, int]:
    try:
        value = unpack(raw)
    except InvalidArgument as exc:
        raise LogStoreCorruption(f"meta/first_index does not decode: {exc}") from None
    if (
        type(value) is not list
        or len(value) != 2
        or not all(type(v) is int for v in value)
        or not 1 <= value[0] <= INDEX_MAX
        or value[1] < 0
    ):
        raise LogStoreCorruption(f"meta/first_index is not [first_index, prev_term]: {value!r:.80}")
    return value[0], value[1]


def _check_entry(entry: Entry, index: int, prev_term: int) -> None:
    """Our bugs, asserted: the caller's entries must continue the kept log exactly."""
    assert type(entry) is Entry, type(entry)
    assert entry.index == index, f"entry index {entry.index} where {index} continues the log"
    assert 1 <= entry.index <= INDEX_MAX, entry.index
    assert type(entry.term) is int and entry.term >= max(prev_term, 1), (
        f"entry {entry.index} term {entry.term} < previous term {prev_term}"
    )
    assert entry.kind in _KINDS, entry.kind
    assert type(entry.data) is bytes, type(entry.data)

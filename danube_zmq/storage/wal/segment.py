"""One WAL segment file: appends at its end, positional reads anywhere, a sparse index.

A segment is named `f"{base_offset:020d}.wal"` (listing order is offset order) and
holds the records `base_offset .. next_offset - 1` in the format of `format.py`.

Two file descriptors, on purpose: the writer's (`O_WRONLY`, `os.pwrite` at the end,
`os.fsync`), used by one writer thread only; and the readers' (`O_RDONLY`, `os.pread`
only, so no shared file position), usable from another thread at the same time. The
pair `(next_offset, size_bytes)` is replaced as one tuple after each write, so a reader
never sees an offset whose bytes are not yet in the file. The reader's descriptor is
closed under a lock when the segment is deleted, so a concurrent read fails cleanly
(`SegmentDeleted`) instead of reading a recycled descriptor.

The sparse index maps offsets to byte positions: an entry at a batch start every
`index_interval_bytes` of appends, and at open one every window of the recovery scan
(same interval). A read hops headers from the nearest entry, reading no bodies.
"""

from __future__ import annotations

import errno
import mmap
import os
import threading
from bisect import bisect_left, bisect_right
from dataclasses import dataclass, replace
from operator import itemgetter
from pathlib import Path

from danube_zmq.clock import Clock
from danube_zmq.storage.wal import files as wal_files
from danube_zmq.storage.wal.errors import CorruptRecord
from danube_zmq.storage.wal.format import (
    CHECKPOINT_FLAG,
    HEADER,
    HEADER_BYTES,
    RECORD_BODY_BYTES_MAX,
    Checkpoint,
    Fault,
    FaultKind,
    RecordBatch,
    scan,
    skip_to,
)
from danube_zmq.storage.wal.recovery import Survey, survey
from danube_zmq.transport.errors import InternalError

SEGMENT_SUFFIX = ".wal"
INDEX_INTERVAL_BYTES = 64 * 1024

_index_offset = itemgetter(0)
_run_start = itemgetter(0)


def segment_file_name(base_offset: int) -> str:
    """`00000000000000000042.wal`: zero-padded so that name order is offset order."""
    assert 0 <= base_offset < 10**20, base_offset
    return f"{base_offset:020d}{SEGMENT_SUFFIX}"


def parse_segment_file_name(name: str) -> int | None:
    """The base offset in a segment file name, or None if the name is not one."""
    stem, suffix = name[: -len(SEGMENT_SUFFIX)], name[-len(SEGMENT_SUFFIX) :]
    if suffix != SEGMENT_SUFFIX or len(stem) != 20 or not stem.isdigit() or not stem.isascii():
        return None
    return int(stem)


class SegmentDeleted(Exception):
    """A read raced with `delete`; the log turns it into `OffsetOutOfRange`."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SegmentInfo:
    """One segment as `WalLog.segments()` lists it; `next_offset` is one past its last record."""

    base_offset: int
    next_offset: int
    size_bytes: int
    sealed: bool
    path: Path


class Segment:
    """One segment file. Writer methods from one thread; `read` from any thread."""

    def __init__(
        self,
        path: Path,
        base_offset: int,
        *,
        created_ms: int,
        write_fd: int | None,
        read_fd: int,
        index_interval_bytes: int,
        body_bytes_max: int,
    ) -> None:
        assert index_interval_bytes > 0
        self.path = path
        self.base_offset = base_offset
        self.created_ms = created_ms
        self._write_fd = write_fd
        self._read_fd: int | None = read_fd
        self._read_lock = threading.Lock()
        self._index_interval_bytes = index_interval_bytes
        # Reads while scanning or hopping headers: at least a header, so each one moves on.
        self._window_bytes = max(index_interval_bytes, HEADER_BYTES)
        self._body_bytes_max = body_bytes_max
        # (next_offset, size_bytes), replaced as one object: readers take one snapshot.
        self._end = (base_offset, 0)
        # (offset, position) pairs, offsets increasing; only ever appended to.
        self._index: list[tuple[int, int]] = [(base_offset, 0)]
        self._unsynced = False
        self._broken = False
        self._file_bytes = 0  # size found on disk at `recover`, torn tail included
        # The cursor checkpoints `recover` found in the whole records, in file order.
        self.checkpoints: list[Checkpoint] = []
        # Runs of checkpoint records: (start, end, checkpoint bytes from the file's start
        # to end), by position; only ever appended to (or replaced whole by a cut), one
        # per checkpoint append at most, so a reader's snapshot is always consistent.
        self._checkpoint_runs: list[tuple[int, int, int]] = []
        # The end the last successful fsync covered: where `truncate_to_synced` cuts back
        # to after a failed write or fsync. Records found at open count as synced once
        # `sync_recovered` has fsynced them.
        self._synced_end = (base_offset, 0)

    # -- lifecycle ----------------------------------------------------------------

    @classmethod
    def create(
        cls,
        directory: Path,
        base_offset: int,
        *,
        clock: Clock,
        index_interval_bytes: int = INDEX_INTERVAL_BYTES,
        body_bytes_max: int = RECORD_BODY_BYTES_MAX,
    ) -> Segment:
        """A new, empty, writable segment file (`O_EXCL`: never reuse a file)."""
        path = directory / segment_file_name(base_offset)
        write_fd = wal_files.current.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        try:
            read_fd = wal_files.current.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except BaseException:
            wal_files.current.close(write_fd)
            raise
        return cls(
            path,
            base_offset,
            created_ms=clock.monotonic_ms(),
            write_fd=write_fd,
            read_fd=read_fd,
            index_interval_bytes=index_interval_bytes,
            body_bytes_max=body_bytes_max,
        )

    @classmethod
    def open(
        cls,
        path: Path,
        *,
        clock: Clock,
        writable: bool,
        index_interval_bytes: int = INDEX_INTERVAL_BYTES,
        body_bytes_max: int = RECORD_BODY_BYTES_MAX,
    ) -> Segment:
        """An existing segment file, empty until `recover` scans it."""
        base_offset = parse_segment_file_name(path.name)
        if base_offset is None:
            raise CorruptRecord(path, 0, "segment file name is not a 20-digit offset followed by .wal")
        read_fd = wal_files.current.open(path, os.O_RDONLY | os.O_CLOEXEC)
        write_fd = None
        if writable:
            try:
                write_fd = wal_files.current.open(path, os.O_WRONLY | os.O_CLOEXEC)
            except BaseException:
                wal_files.current.close(read_fd)
                raise
        return cls(
            path,
            base_offset,
            created_ms=clock.monotonic_ms(),
            write_fd=write_fd,
            read_fd=read_fd,
            index_interval_bytes=index_interval_bytes,
            body_bytes_max=body_bytes_max,
        )

    def close(self) -> None:
        """Close both descriptors without syncing (`WalLog.close` syncs first)."""
        if self._write_fd is not None:
            wal_files.current.close(self._write_fd)
            self._write_fd = None
        with self._read_lock:
            if self._read_fd is not None:
                wal_files.current.close(self._read_fd)
                self._read_fd = None

    def delete(self) -> None:
        """Close and unlink. A read running now finishes first; later ones raise SegmentDeleted."""
        self.close()
        try:
            wal_files.current.unlink(self.path)
        except FileNotFoundError:
            pass

    # -- state ----------------------------------------------------------------------

    @property
    def next_offset(self) -> int:
        return self._end[0]

    @property
    def size_bytes(self) -> int:
        return self._end[1]

    @property
    def sealed(self) -> bool:
        return self._write_fd is None

    def info(self) -> SegmentInfo:
        next_offset, size_bytes = self._end
        return SegmentInfo(
            base_offset=self.base_offset, next_offset=next_offset, size_bytes=size_bytes, sealed=self.sealed, path=self.path
        )

    # -- recovery -------------------------------------------------------------------

    def recover(self) -> Fault | None:
        """Scan the whole file, rebuild the index, and take the whole-record prefix as the
        segment's content. Returns the first fault (position relative to the file), or
        None if the file is whole. Nothing on disk changes; see `truncate_torn_tail`."""
        assert self._read_fd is not None
        fd = self._read_fd
        file_bytes = os.fstat(fd).st_size
        window_bytes = self._window_bytes
        position = 0
        expected = self.base_offset
        index = [(self.base_offset, 0)]
        fault: Fault | None = None
        checkpoints: list[Checkpoint] = []
        needed_bytes = 0  # a record larger than a window is read whole
        while position < file_bytes:
            if position > index[-1][1]:
                index.append((expected, position))
            buf = os.pread(fd, min(max(window_bytes, needed_bytes), file_bytes - position), position)
            result = scan(buf, expected_offset=expected, decode=False, body_bytes_max=self._body_bytes_max)
            window_start = position
            position += result.valid_bytes
            checkpoints += [replace(c, position=window_start + c.position) for c in result.checkpoints]
            assert result.next_offset is not None
            expected = result.next_offset
            needed_bytes = 0
            if result.fault is None:
                if not buf:  # the file shrank under us: treat the rest as missing
                    break
                continue
            window_cut = window_start + len(buf) < file_bytes
            if result.fault.kind is FaultKind.TRUNCATED and window_cut:
                # The window, not the file, ended inside this record: read on from it.
                # A window is at least 16 bytes whenever the file goes on past it.
                if result.valid_bytes == 0:
                    needed_bytes = HEADER_BYTES + (HEADER.unpack_from(buf, 0)[1] & ~CHECKPOINT_FLAG)
                continue
            fault = result.fault.shifted(window_start)
            break
        self._index = index
        self.checkpoints = checkpoints
        runs: list[tuple[int, int, int]] = []
        for checkpoint in checkpoints:
            if runs and runs[-1][1] == checkpoint.position:
                start, _, total = runs[-1]
                runs[-1] = (start, checkpoint.position + checkpoint.size, total + checkpoint.size)
            else:
                runs.append((checkpoint.position, checkpoint.position + checkpoint.size,
                             (runs[-1][2] if runs else 0) + checkpoint.size))
        self._checkpoint_runs = runs
        self._end = (expected, position)
        self._file_bytes = file_bytes
        return fault

    def survey_after(self, fault: Fault) -> Survey:
        """What lies after `fault` in the file (found by `recover`): valid records, and the
        highest offset they carry. The file is mapped, not read into memory."""
        assert self._read_fd is not None
        if self._file_bytes <= fault.position + HEADER_BYTES:
            return Survey(first=None, end_offset=None)  # no room for a record after it
        with mmap.mmap(self._read_fd, self._file_bytes, access=mmap.ACCESS_READ) as mapped:
            return survey(mapped, fault_position=fault.position, expected_offset=self.next_offset,
                          body_bytes_max=self._body_bytes_max)

    @property
    def file_bytes(self) -> int:
        """The file's size as `recover` found it (torn or damaged bytes included)."""
        return self._file_bytes

    def truncate_torn_tail(self) -> int:
        """Cut the file to the whole records `recover` found, fsync, and return the bytes dropped."""
        assert self._write_fd is not None, "only the writable (active) segment is truncated"
        size_bytes = self.size_bytes
        dropped = self._file_bytes - size_bytes
        if dropped > 0:
            wal_files.current.ftruncate(self._write_fd, size_bytes)
            wal_files.current.fsync(self._write_fd)
            self._file_bytes = size_bytes
        return dropped

    # -- writer side (one thread) ---------------------------------------------------

    def append(self, encoded: bytes | bytearray | memoryview, count: int) -> None:
        """Write `count` encoded records at the end of the file; no fsync.

        An OSError propagates unchanged after the partial write is cut off again; if
        even that fails, the segment refuses further appends (its tail is unknown).
        """
        assert self._write_fd is not None, "append to a sealed segment"
        assert count >= 0  # 0: cursor checkpoints only
        if self._broken:
            raise InternalError(f"WAL segment {self.path} is unusable after a failed write and truncate")
        fd = self._write_fd
        next_offset, size_bytes = self._end
        view = memoryview(encoded)
        written = 0
        try:
            while written < len(view):
                n = wal_files.current.pwrite(fd, view[written:], size_bytes + written)
                if n <= 0:
                    raise OSError(errno.EIO, f"pwrite wrote nothing to {self.path}")
                written += n
        except OSError:
            try:
                wal_files.current.ftruncate(fd, size_bytes)
            except OSError:
                self._broken = True
            raise
        if size_bytes - self._index[-1][1] >= self._index_interval_bytes:
            self._index.append((next_offset, size_bytes))
        if count == 0:
            runs = self._checkpoint_runs
            runs.append((size_bytes, size_bytes + written, (runs[-1][2] if runs else 0) + written))
        self._unsynced = True
        self._end = (next_offset + count, size_bytes + written)

    def sync(self) -> bool:
        """fsync if anything was written since the last sync; True if it did."""
        if not self._unsynced:
            return False
        if self._broken:  # the end is unknown after a failed cut-back: claim nothing
            raise InternalError(f"WAL segment {self.path} is unusable after a failed write and truncate")
        assert self._write_fd is not None
        end = self._end
        wal_files.current.fsync(self._write_fd)
        self._unsynced = False
        self._synced_end = end
        return True

    @property
    def broken(self) -> bool:
        return self._broken

    def sync_recovered(self) -> None:
        """At open: fsync what recovery kept (it may have been in the page cache only,
        after a crash of the process), making it the synced end."""
        assert self._write_fd is not None
        wal_files.current.fsync(self._write_fd)
        self._synced_end = self._end

    def truncate_to_synced(self) -> int:
        """After a failed write or fsync: cut the file back to the end its last successful
        fsync covered, and fsync the cut. Linux marks pages whose write-back failed as
        clean, so what follows them in the page cache may never reach the disk; cutting
        drops them, and later writes dirty fresh pages. Returns the new next offset."""
        assert self._write_fd is not None, "only the writable (active) segment is truncated"
        next_offset, size_bytes = self._synced_end
        try:
            wal_files.current.ftruncate(self._write_fd, size_bytes)
            wal_files.current.fsync(self._write_fd)
        except OSError:
            self._broken = True
            raise
        self._end = self._synced_end
        self._file_bytes = size_bytes
        self._index = [entry for entry in self._index if entry[1] <= size_bytes]
        self._checkpoint_runs = [run for run in self._checkpoint_runs if run[1] <= size_bytes]
        self._unsynced = False
        return next_offset

    def checkpoint_bytes(self, start: int, end: int) -> int:
        """Bytes of checkpoint records between byte positions `start` and `end` (record
        boundaries): what a count of message bytes between them leaves out."""
        runs = self._checkpoint_runs  # one snapshot
        first = bisect_left(runs, start, key=_run_start)
        last = bisect_left(runs, end, key=_run_start)
        if last <= first:
            return 0
        return runs[last - 1][2] - (runs[first - 1][2] if first else 0)

    def seal(self) -> None:
        """fsync and close the writer's descriptor: the file is immutable from now on."""
        self.sync()
        assert self._write_fd is not None
        fd, self._write_fd = self._write_fd, None
        wal_files.current.close(fd)

    # -- reader side (any thread) ---------------------------------------------------

    def position_of(self, offset: int) -> int:
        """Byte position of record `offset` in the file; `next_offset` gives the end.
        Uses the sparse index and header hops: no body is read."""
        next_offset, size_bytes = self._end
        assert self.base_offset <= offset <= next_offset, (offset, self.base_offset, next_offset)
        if offset == next_offset:
            return size_bytes
        with self._read_lock:
            fd = self._read_fd
            if fd is None:
                raise SegmentDeleted(self.path)
            return self._locate(fd, offset, size_bytes)

    def read(self, start_offset: int, *, max_bytes: int, upto_offset: int, min_one_record: bool) -> tuple[RecordBatch, int]:
        """Records from `start_offset` below `upto_offset` within `max_bytes` of records
        (headers included; the first record is returned whatever its size when
        `min_one_record`). Returns the records and the bytes they take in the file.

        Raises `CorruptRecord` for damage in the bytes a read covers, `SegmentDeleted`
        if the segment was deleted.
        """
        next_offset, size_bytes = self._end
        end_offset = min(upto_offset, next_offset)
        assert start_offset >= self.base_offset, (start_offset, self.base_offset)
        if start_offset >= end_offset:
            return RecordBatch.empty(), 0
        with self._read_lock:
            fd = self._read_fd
            if fd is None:
                raise SegmentDeleted(self.path)
            position = self._locate(fd, start_offset, size_bytes)
            want = min(max(max_bytes, HEADER_BYTES), size_bytes - position)
            buf = self._pread_exactly(fd, want, position)
            result = scan(
                buf,
                expected_offset=start_offset,
                upto_offset=end_offset,
                max_bytes=max_bytes,
                min_one_record=min_one_record,
                body_bytes_max=self._body_bytes_max,
            )
            fault = result.fault
            cut_by_read = position + len(buf) < size_bytes
            first_cut = fault is not None and fault.kind is FaultKind.TRUNCATED and cut_by_read
            while result.record_count == 0 and min_one_record and first_cut:
                # The first record is larger than max_bytes: read it whole (with the
                # checkpoints before it). Each pass reads more, to the file's end at most.
                assert fault is not None
                want = fault.position + HEADER_BYTES
                if len(buf) >= want:
                    want += HEADER.unpack_from(buf, fault.position)[1] & ~CHECKPOINT_FLAG
                want = min(max(want, len(buf) + 1), size_bytes - position)
                buf = self._pread_exactly(fd, want, position)
                result = scan(buf, expected_offset=start_offset, upto_offset=end_offset, body_bytes_max=self._body_bytes_max)
                fault = result.fault
                cut_by_read = position + len(buf) < size_bytes
                first_cut = fault is not None and fault.kind is FaultKind.TRUNCATED and cut_by_read
        if fault is not None and not (fault.kind is FaultKind.TRUNCATED and cut_by_read):
            raise CorruptRecord(self.path, position + fault.position, f"{fault.kind}: {fault.reason}")
        return result.records, result.valid_bytes

    def _locate(self, fd: int, start_offset: int, size_bytes: int) -> int:
        """Byte position of record `start_offset` (which must be in this segment)."""
        offset, position = self._index[bisect_right(self._index, start_offset, key=_index_offset) - 1]
        while offset < start_offset:
            if position + HEADER_BYTES > size_bytes:
                raise CorruptRecord(self.path, position, f"offset {offset} lies beyond the end of the file")
            buf = os.pread(fd, min(self._window_bytes, size_bytes - position), position)
            hop, offset_after = skip_to(buf, offset=offset, start_offset=start_offset, body_bytes_max=self._body_bytes_max)
            if hop == 0:
                result = scan(buf, expected_offset=offset, decode=False, max_bytes=HEADER_BYTES, min_one_record=True)
                reason = f"{result.fault.kind}: {result.fault.reason}" if result.fault else "record header not found"
                raise CorruptRecord(self.path, position, reason)
            position += hop
            offset = offset_after
        return position

    def _pread_exactly(self, fd: int, length: int, position: int) -> bytes:
        buf = os.pread(fd, length, position)
        if len(buf) != length:
            raise CorruptRecord(self.path, position + len(buf), f"file ends {length - len(buf)} bytes early")
        return buf

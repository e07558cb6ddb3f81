"""A topic's WAL handed from one broker's disk to another's (storage.mode local moves).

    sender:   offered_files(wal dir, needed_from) -> the segment files to send, in order,
                                                    then the newest compacted ledger
              read_chunk(path, position, size) -> bytes
    receiver: Incoming(staging dir) .begin -> bytes held per file (resume)
                                    .write(file, position, data, crc32c)
                                    .verify_and_install(wal dir) -> next offset

The sender offers the segments that hold an offset at or after `needed_from` (the
oldest offset a subscription still needs) up to the active one, each at its whole-record
size, then the topic's newest compacted ledger (`compacted.py`), whole, when it has one:
the compacted view moves with the topic. A ledger also moves `needed_from` down to its
horizon: a `read_compacted` reader goes on in the log at the horizon, and without the
records from there a key rewritten after it would read as its compacted, older value.
The receiver writes them into a staging directory named by the move's id (so bytes
of an abandoned attempt are never mixed in, and a resumed attempt continues at the bytes
it holds), checks a CRC32C per chunk, and at the end scans every record of every file
(`Segment.recover`: record CRCs, continuous offsets; `Ledger.open`: every record's CRC,
offsets below its horizon) before it swaps the staging directory in for its own WAL of
the topic. Every function here blocks: run in a thread.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import crc32c

from danube_zmq.clock import Clock
from danube_zmq.storage.wal import files as wal_files
from danube_zmq.storage.wal.compacted import Ledger, ledgers_in, parse_ledger_file_name
from danube_zmq.storage.wal.errors import CorruptRecord
from danube_zmq.storage.wal.log import WalLog
from danube_zmq.storage.wal.segment import Segment, parse_segment_file_name
from danube_zmq.transport.errors import FailedPrecondition, InvalidArgument


@dataclass(frozen=True, slots=True)
class OfferedFile:
    name: str
    size_bytes: int
    path: Path


@dataclass(frozen=True, slots=True)
class Offer:
    files: tuple[OfferedFile, ...]
    next_offset: int

    @property
    def total_bytes(self) -> int:
        return sum(f.size_bytes for f in self.files)


def offered_files(wal_dir: Path, needed_from: int | None, *, segment_bytes_max: int, clock: Clock) -> Offer:
    """The segments of the (closed) WAL in `wal_dir` holding offsets from `needed_from`
    on (None: only the active one), the active one always included, then the newest
    compacted ledger, whose horizon lowers `needed_from` to it. Opening the WAL recovers
    it first, so every segment's size is a whole-record prefix; a ledger is whole or
    absent (written to a `.tmp`, renamed), and no compaction runs: the topic stopped."""
    ledgers = ledgers_in(wal_dir)
    ledger = ledgers[-1] if ledgers else None
    if ledger is not None:
        needed_from = ledger[0] if needed_from is None else min(needed_from, ledger[0])
    wal = WalLog.open(wal_dir, segment_bytes_max=segment_bytes_max, segment_age_ms_max=None, clock=clock)
    try:
        infos = wal.segments()
        next_offset = wal.next_offset
    finally:
        wal.close()
    chosen = [info for n, info in enumerate(infos)
              if n == len(infos) - 1 or (needed_from is not None and info.next_offset > needed_from)]
    files = [OfferedFile(name=Path(i.path).name, size_bytes=i.size_bytes, path=Path(i.path)) for i in chosen]
    if ledger is not None:
        path = ledger[1]
        files.append(OfferedFile(name=path.name, size_bytes=path.stat().st_size, path=path))
    return Offer(files=tuple(files), next_offset=next_offset)


def read_chunk(path: Path, position: int, size: int) -> bytes:
    with open(path, "rb") as f:
        f.seek(position)
        return f.read(size)


class Incoming:
    """The receiving side of one move: a staging directory `staging/<handover_id>`."""

    def __init__(self, staging: Path, handover_id: int, files: list[tuple[str, int]], next_offset: int) -> None:
        # Strict: segment files, then at most one compacted ledger, last; nothing else
        # (these names become paths here).
        horizon = parse_ledger_file_name(files[-1][0]) if files else None
        segments = files[:-1] if horizon is not None else files
        for index, (name, size) in enumerate(files):
            is_ledger = horizon is not None and index == len(files) - 1
            if (not is_ledger and parse_segment_file_name(name) is None) or size < 0:
                raise InvalidArgument(f"a handed-over WAL file must be a segment (or, last, a compacted ledger) name"
                                      f" and size, got {name[:64]!r}{'...' if len(name) > 64 else ''} {size}")
        if not segments:
            raise InvalidArgument("a hand-over offers at least the active segment")
        if horizon is not None and horizon > next_offset:
            raise InvalidArgument(f"a handed-over compacted ledger up to offset {horizon} is past the WAL's end"
                                  f" {next_offset}")
        self.root = staging
        self.directory = staging / f"{handover_id:020d}"
        self.files = files
        self.segments = segments
        self.ledger = files[-1] if horizon is not None else None
        self.next_offset = next_offset

    def begin(self) -> list[int]:
        """Drop other attempts, keep this one's bytes: how many of each file are held."""
        self.root.mkdir(parents=True, exist_ok=True)
        for other in self.root.iterdir():
            if other != self.directory:
                shutil.rmtree(other, ignore_errors=True)
        self.directory.mkdir(exist_ok=True)
        held = []
        for name, size in self.files:
            path = self.directory / name
            have = path.stat().st_size if path.exists() else 0
            if have > size:  # not this offer's file: start it again
                wal_files.current.unlink(path)
                have = 0
            # An empty segment (no record yet) gets no chunk but is installed.
            wal_files.current.close(wal_files.current.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644))
            held.append(have)
        return held

    def write(self, file_index: int, position: int, data: bytes, checksum: int) -> None:
        if not 0 <= file_index < len(self.files):
            raise InvalidArgument(f"file {file_index} was not offered ({len(self.files)} files)")
        name, size = self.files[file_index]
        if crc32c.crc32c(data) != checksum:
            raise FailedPrecondition(f"chunk of {name} at byte {position}: CRC32C mismatch")
        path = self.directory / name
        have = path.stat().st_size if path.exists() else 0
        if position != have:
            raise FailedPrecondition(f"chunk of {name} at byte {position}: this broker holds {have} bytes of it")
        if position + len(data) > size:
            raise InvalidArgument(f"chunk of {name} ends at byte {position + len(data)}, past its {size} bytes")
        fd = wal_files.current.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            wal_files.current.pwrite(fd, data, position)
        finally:
            wal_files.current.close(fd)

    def verify_and_install(self, wal_dir: Path, *, clock: Clock) -> int:
        """fsync, scan every record, then swap in for `wal_dir`; the next offset."""
        expected = None
        for name, size in self.segments:
            path = self._synced(name, size)
            segment = Segment.open(path, clock=clock, writable=False)
            try:
                fault = segment.recover()
                if fault is not None:
                    raise FailedPrecondition(f"handed-over {name}: {fault.kind} at byte {fault.position}: {fault.reason}")
                if expected is not None and segment.base_offset != expected:
                    raise FailedPrecondition(f"handed-over {name} starts at offset {segment.base_offset},"
                                             f" the file before ends at {expected}")
                expected = segment.next_offset
            finally:
                segment.close()
        if expected != self.next_offset:
            raise FailedPrecondition(f"handed-over WAL ends at offset {expected}, the offer said {self.next_offset}")
        if self.ledger is not None:
            self._verify_ledger(*self.ledger)
        _fsync_dir(self.directory)
        aside = wal_dir.with_name(wal_dir.name + ".replaced")
        shutil.rmtree(aside, ignore_errors=True)
        wal_dir.parent.mkdir(parents=True, exist_ok=True)
        if wal_dir.exists():
            wal_files.current.rename(wal_dir, aside)  # an earlier turn's WAL here: the offer supersedes it
        wal_files.current.rename(self.directory, wal_dir)
        _fsync_dir(wal_dir.parent)
        shutil.rmtree(aside, ignore_errors=True)
        shutil.rmtree(self.root, ignore_errors=True)
        return expected

    def abort(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)

    def _synced(self, name: str, size: int) -> Path:
        """The staged file `name`, checked to hold its offered `size` bytes, fsynced."""
        path = self.directory / name
        have = path.stat().st_size if path.exists() else 0
        if have != size:
            raise FailedPrecondition(f"handed-over {name} has {have} of its {size} bytes")
        fd = wal_files.current.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            wal_files.current.fsync(fd)
        finally:
            wal_files.current.close(fd)
        return path

    def _verify_ledger(self, name: str, size: int) -> None:
        """The compacted ledger is checked whole (every record's CRC, offsets increasing
        below its horizon): a damaged one refuses the hand-over, never a short view."""
        path = self._synced(name, size)
        try:
            Ledger.open(path).close()
        except CorruptRecord as exc:
            raise FailedPrecondition(f"handed-over compacted ledger {name} is damaged: {exc.message}") from exc


def _fsync_dir(directory: Path) -> None:
    wal_files.current.fsync_directory(directory)

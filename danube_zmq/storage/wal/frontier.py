"""The acknowledged frontier of a WAL, kept beside its segments in `frontier`.

The frontier is an offset F such that every record below F was fsynced (so may have
been acknowledged). Recovery must never end below it: a log that does is damaged,
not torn (see `recovery.py`).

Why this is cheap and still sound:
- It is written after each successful `WalLog.sync`, as one 16-byte `pwrite` and no
  fsync of its own: one extra syscall per group commit, not one fsync per ack.
- It only has to be a lower bound of what was acknowledged. It is written after the
  records' fsync, so it can never run ahead of what is durable; after a kill -9 the
  page cache still holds the newest value (the exact frontier); after a power loss it
  may be older (whatever the kernel wrote back, at most ~30 s, or the fsync of a roll
  or a close), still a lower bound.
- What a stale (older) frontier cannot see, the other rule does: any valid record
  after a fault means damage, whatever the frontier. A single bad record is caught by
  it unless it is the very last one in the file, and the last one is below a fresh
  frontier. Only damage confined to records after a stale frontier with nothing valid
  behind it (a power loss and a damaged last record together) reads as a torn tail.
- Two slots, each `[u64 next_offset][u32 crc32c][u32 zero]`, written alternately: a
  torn slot write leaves the other slot, and reading takes the highest valid value
  (the frontier only grows). A file with no valid slot gives None (unknown).
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

import crc32c

from danube_zmq.storage.wal import files as wal_files

FRONTIER_FILE = "frontier"
_SLOT = struct.Struct(">QII")
_VALUE = struct.Struct(">Q")


def _slot(offset: int) -> bytes:
    return _SLOT.pack(offset, crc32c.crc32c(_VALUE.pack(offset)), 0)


def decode(data: bytes) -> int | None:
    """The highest valid slot value in the file's bytes, None when no slot is valid."""
    best: int | None = None
    for start in range(0, min(len(data), 2 * _SLOT.size) - _SLOT.size + 1, _SLOT.size):
        offset, stored_crc, _ = _SLOT.unpack_from(data, start)
        if crc32c.crc32c(_VALUE.pack(offset)) == stored_crc and (best is None or offset > best):
            best = offset
    return best


def read(directory: Path) -> int | None:
    try:
        return decode((directory / FRONTIER_FILE).read_bytes())
    except FileNotFoundError:
        return None


class FrontierFile:
    """The writer's handle on `frontier`: `advance` writes the next slot (no fsync),
    `sync` fsyncs it (at a roll and a close, which fsync anyway)."""

    def __init__(self, directory: Path) -> None:
        path = directory / FRONTIER_FILE
        self.value = read(directory)
        self._fd = wal_files.current.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        self._slot = 0
        self._unsynced = False

    def advance(self, offset: int) -> None:
        if self.value is not None and offset <= self.value:
            return
        wal_files.current.pwrite(self._fd, _slot(offset), self._slot * _SLOT.size)
        self._slot ^= 1
        self.value = offset
        self._unsynced = True

    def sync(self) -> None:
        if self._unsynced:
            wal_files.current.fsync(self._fd)
            self._unsynced = False

    def close(self) -> None:
        if self._fd >= 0:
            wal_files.current.close(self._fd)
            self._fd = -1

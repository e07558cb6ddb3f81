"""Offset ranges a repaired WAL no longer holds, kept beside its segments in `gaps`.

Only `WalLog.repair` writes it (an operator accepted the loss of damaged records):
the log keeps its readable prefix and continues past every offset it may have given
out, so the lost range lies between two segment files. Recovery accepts exactly these
jumps between segments, and readers skip them. A msgpack list of `[start, end]` pairs
(end exclusive), replaced whole (write, fsync, rename, fsync the directory).
"""

from __future__ import annotations

import os
from pathlib import Path

import msgpack

GAPS_FILE = "gaps"


def read(directory: Path) -> frozenset[tuple[int, int]]:
    try:
        data = (directory / GAPS_FILE).read_bytes()
    except FileNotFoundError:
        return frozenset()
    return frozenset((int(start), int(end)) for start, end in msgpack.unpackb(data, raw=False))


def write(directory: Path, gaps: frozenset[tuple[int, int]]) -> None:
    temporary = directory / f"{GAPS_FILE}.tmp"
    with open(temporary, "wb") as file:
        file.write(msgpack.packb(sorted(gaps), use_bin_type=True))
        file.flush()
        os.fsync(file.fileno())
    os.replace(temporary, directory / GAPS_FILE)
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

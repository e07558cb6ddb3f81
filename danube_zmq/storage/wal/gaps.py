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

from danube_zmq.storage.wal import files as wal_files

GAPS_FILE = "gaps"


def read(directory: Path) -> frozenset[tuple[int, int]]:
    try:
        data = (directory / GAPS_FILE).read_bytes()
    except FileNotFoundError:
        return frozenset()
    return frozenset((int(start), int(end)) for start, end in msgpack.unpackb(data, raw=False))


def write(directory: Path, gaps: frozenset[tuple[int, int]]) -> None:
    layer = wal_files.current
    temporary = directory / f"{GAPS_FILE}.tmp"
    data = msgpack.packb(sorted(gaps), use_bin_type=True)
    fd = layer.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        written = 0
        while written < len(data):
            written += layer.pwrite(fd, data[written:], written)
        layer.fsync(fd)
    finally:
        layer.close(fd)
    layer.replace(temporary, directory / GAPS_FILE)
    layer.fsync_directory(directory)

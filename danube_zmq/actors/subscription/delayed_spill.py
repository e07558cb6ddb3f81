"""Spill files of the delayed-delivery index: `RunStore` (`actors/dispatch/delayed_index.py`) on a directory.

The index keeps the delayed messages it may deliver soonest in RAM and writes the rest
as sorted runs; this shell keeps those runs, one file each, `{run_id:012d}.run` (so
listing order is run order), holding little-endian `<qq` pairs
`(deliver_at_ms, offset)`, 16 bytes an entry.

A scratch directory: the index is rebuilt from the topic's log at every start and
clears the directory first, so nothing here is fsynced and a crash may leave torn or
stale files behind without harm. A run is written with one write call and a segment is
read with one `os.pread` of just its bytes.
"""

from __future__ import annotations

import os
import struct
import sys
from array import array
from collections.abc import Sequence
from itertools import chain
from pathlib import Path

__all__ = ["FileRunStore"]

_ENTRY = struct.Struct("<qq")
_SUFFIX = ".run"


class FileRunStore:
    """Runs of `(deliver_at_ms, offset)` entries, one file each, in `directory` (created if missing)."""

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)

    def path(self, run_id: int) -> Path:
        assert run_id >= 0, run_id
        return self.directory / f"{run_id:012d}{_SUFFIX}"

    def write(self, run_id: int, entries: Sequence[tuple[int, int]]) -> None:
        """Write run `run_id` (replacing any file of that name): one write of 16 bytes an entry."""
        # array('q') packs a flat sequence of ints in one C loop, in the machine's order.
        flat = array("q", chain.from_iterable(entries))
        if sys.byteorder != "little":
            flat.byteswap()
        with open(self.path(run_id), "wb") as file:
            file.write(flat.tobytes())

    def read(self, run_id: int, start: int, count: int) -> list[tuple[int, int]]:
        """Entries `start .. start + count - 1` of run `run_id`, fewer at its end."""
        assert start >= 0 and count >= 0, (start, count)
        if count == 0:
            return []
        fd = os.open(self.path(run_id), os.O_RDONLY)
        try:
            data = os.pread(fd, count * _ENTRY.size, start * _ENTRY.size)
        finally:
            os.close(fd)
        # A short file gives fewer whole entries, never a part of one; the index asserts the count it expects.
        whole = len(data) - len(data) % _ENTRY.size
        return list(_ENTRY.iter_unpack(memoryview(data)[:whole]))

    def delete(self, run_id: int) -> None:
        """Remove run `run_id`'s file; a missing one is fine."""
        self.path(run_id).unlink(missing_ok=True)

    def clear(self) -> None:
        """Remove every run file in the directory (created if missing); other files stay."""
        self.directory.mkdir(parents=True, exist_ok=True)
        for path in self.directory.glob(f"*{_SUFFIX}"):
            path.unlink(missing_ok=True)

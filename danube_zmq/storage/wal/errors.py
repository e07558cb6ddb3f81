"""Errors of the write-ahead log, placed in the one `DanubeError` tree.

`CorruptRecord` is the world's fault (a disk or a crash damaged bytes we had written);
`OffsetOutOfRange` is a reader asking for records the log no longer holds.
"""

from __future__ import annotations

from pathlib import Path

from danube_zmq.transport.errors import InternalError, NotFound


class CorruptRecord(InternalError):
    """A WAL record failed its checks where the log must be whole (a sealed segment, or
    the committed part of a segment being read). The message names the file and byte."""

    def __init__(self, path: Path | str, position: int, reason: str) -> None:
        super().__init__(f"corrupt WAL record in {path} at byte {position}: {reason}")
        self.path = Path(path)
        self.position = position
        self.reason = reason


class OffsetOutOfRange(NotFound):
    """A read started below the log's first offset (its segments were deleted, for
    example after upload to the durable store); read from there instead."""

    def __init__(self, start_offset: int, log_start_offset: int) -> None:
        super().__init__(f"offset {start_offset} is below the WAL's first offset {log_start_offset}")
        self.start_offset = start_offset
        self.log_start_offset = log_start_offset


class WalDamaged(CorruptRecord):
    """Recovery found damage, not a torn tail: a bad record with valid records after it,
    a log ending below its acknowledged frontier, or a damaged sealed segment. Nothing
    was cut; the damaged file was copied to `quarantined`.

    `valid_end` is where the whole prefix of the log ends (the first offset that cannot
    be read); `claimed_end` is one past the highest offset the log is known to have held
    (from the frontier, the valid records after the fault, later segment files);
    `acknowledged_offset` is the frontier (None: unknown). The lost offsets, if the log is
    repaired, are `valid_end .. claimed_end - 1` at least.
    """

    def __init__(self, path: Path | str, position: int, reason: str, *, valid_end: int, claimed_end: int,
                 acknowledged_offset: int | None, quarantined: Path | None) -> None:
        super().__init__(path, position, reason)
        self.valid_end = valid_end
        self.claimed_end = claimed_end
        self.acknowledged_offset = acknowledged_offset
        self.quarantined = quarantined

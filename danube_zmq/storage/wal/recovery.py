"""The pure decision of WAL recovery: is a fault in the active segment a torn tail, or damage?

A crash can only tear what was written and not yet fsynced, that is, unacknowledged
records at the very end of the active segment. So a fault is a torn tail only if

1. no whole, CRC-valid record lies anywhere after it in the file (`resync` looks for
   one at every byte position after the fault), and
2. the record at the fault is at or above the acknowledged frontier: the offset below
   which every record was fsynced and may have been acknowledged (`frontier.py`).

Anything else is corruption: a bad record with good records after it, or a log that
ends below what was acknowledged. Cutting it would silently drop acknowledged records
(and later reuse their offsets), so recovery refuses and reports it instead.

No I/O here: buffers in (bytes, bytearray or an mmap of the file), a verdict out.
"""

from __future__ import annotations

import mmap
import re
import struct
from dataclasses import dataclass

import crc32c

from danube_zmq.storage.wal.format import (
    CHECKPOINT_FLAG,
    CRC_PREFIX_BYTES,
    HEADER,
    HEADER_BYTES,
    RECORD_BODY_BYTES_MAX,
    Fault,
    scan,
)

_OFFSET = struct.Struct(">Q")
_NON_ZERO = re.compile(rb"[^\x00]")
# A header of sixteen zero bytes is never valid: its CRC field (0) differs from the
# CRC32C of twelve zero bytes. This lets `resync` jump over runs of zeros (preallocated
# or zero-filled blocks a crash can leave) instead of trying each of their positions.
assert crc32c.crc32c(bytes(CRC_PREFIX_BYTES)) != 0

Buffer = bytes | bytearray | mmap.mmap


@dataclass(frozen=True, slots=True, kw_only=True)
class Resync:
    """A whole, CRC-valid record found after a fault: where, and its offset."""

    position: int
    offset: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Survey:
    """What lies after a fault in one file: the first valid record (None if there is
    none), and one past the highest offset any valid record after the fault carries
    (None if there is none): the offsets the file claims to have held."""

    first: Resync | None
    end_offset: int | None


@dataclass(frozen=True, slots=True, kw_only=True)
class Verdict:
    """`corrupt` False: the fault is a torn tail; cut the file at it. True: keep the file
    as it is and stop; `reason` says why in words for the log and the operator."""

    corrupt: bool
    reason: str


def resync(
    buf: Buffer, *, start: int, expected_offset: int, body_bytes_max: int = RECORD_BODY_BYTES_MAX
) -> Resync | None:
    """The first position at or after `start` holding a whole record with a valid CRC
    and an offset at or above `expected_offset` (the damaged record's own), or None.

    Any record after a fault carries an offset from `expected_offset` to one more per
    16 bytes left; their 8-byte big-endian encodings share a prefix (at least the top
    bytes), so candidates are found with `find` in C and only those are checked.
    """
    size = len(buf)
    remaining_records = max(0, size - start) // HEADER_BYTES
    low, high = _OFFSET.pack(expected_offset), _OFFSET.pack(expected_offset + remaining_records)
    prefix_bytes = 0
    while prefix_bytes < 8 and low[prefix_bytes] == high[prefix_bytes]:
        prefix_bytes += 1
    prefix = low[:prefix_bytes]
    zero_prefix = not prefix.strip(b"\x00")
    unpack_header = HEADER.unpack_from
    crc = crc32c.crc32c
    view = memoryview(buf)
    high_offset = expected_offset + remaining_records
    position = start
    try:
        while position + HEADER_BYTES <= size:
            if prefix:
                position = buf.find(prefix, position)
                if position < 0 or position + HEADER_BYTES > size:
                    return None
            if zero_prefix and not any(view[position : position + HEADER_BYTES]):
                found = _NON_ZERO.search(buf, position)
                if found is None:
                    return None
                position = max(position + 1, found.start() - HEADER_BYTES + 1)
                continue
            offset, length, stored_crc = unpack_header(buf, position)
            length &= ~CHECKPOINT_FLAG  # a checkpoint after a fault is a valid record too
            end = position + HEADER_BYTES + length
            if (expected_offset <= offset <= high_offset and length <= body_bytes_max and end <= size
                    and crc(view[position + HEADER_BYTES : end], crc(view[position : position + CRC_PREFIX_BYTES]))
                    == stored_crc):
                return Resync(position=position, offset=offset)
            position += 1
        return None
    finally:
        view.release()


def survey(
    buf: Buffer, *, fault_position: int, expected_offset: int, body_bytes_max: int = RECORD_BODY_BYTES_MAX
) -> Survey:
    """Walk everything after a fault at `fault_position`: resynchronize, scan the run of
    good records found there, resynchronize after its end, and so on to the end of
    `buf`. Linear in the bytes after the fault."""
    first: Resync | None = None
    end_offset: int | None = None
    position = fault_position + 1
    expected = expected_offset
    while True:
        found = resync(buf, start=position, expected_offset=expected, body_bytes_max=body_bytes_max)
        if found is None:
            return Survey(first=first, end_offset=end_offset)
        first = first or found
        with memoryview(buf) as view:
            run = scan(view[found.position :], expected_offset=found.offset, decode=False, body_bytes_max=body_bytes_max)
        assert run.valid_bytes > 0 and run.next_offset is not None, "resync returned a record scan refuses"
        end_offset = run.next_offset
        expected = run.next_offset
        position = found.position + max(run.valid_bytes, 1)


def judge(*, fault: Fault, fault_offset: int, after: Survey, acknowledged_offset: int | None) -> Verdict:
    """Torn tail or corruption, for a fault at record `fault_offset` of the active
    segment (`after`: what `survey` found behind it; `acknowledged_offset`: the durable
    acknowledged frontier, None when unknown)."""
    where = f"{fault.kind} at byte {fault.position} (record {fault_offset}: {fault.reason})"
    if after.first is not None:
        return Verdict(corrupt=True, reason=f"{where}, with a valid record {after.first.offset} after it at byte"
                                            f" {after.first.position}")
    if acknowledged_offset is not None and fault_offset < acknowledged_offset:
        return Verdict(corrupt=True, reason=f"{where}, below the acknowledged frontier {acknowledged_offset}")
    return Verdict(corrupt=False, reason=f"torn tail: {where}")

"""The on-disk record format of the WAL, and its pure encoder and scanner.

A segment file holds records back to back, nothing else (no file header, no footer):

    +--------------------+------------------+------------------+------------------------+
    | offset  u64 BE     | length  u32 BE   | crc32c  u32 BE   | body (length bytes)    |
    +--------------------+------------------+------------------+------------------------+
    |<--------------- 16-byte header, struct ">QII" --------->|

- `offset`: the record's offset in the topic; consecutive within a file, the first
  equals the base offset in the file name.
- `length`: the body's byte count; above `RECORD_BODY_BYTES_MAX` it is taken as damage.
- `crc32c`: CRC32C (Castagnoli, package `crc32c`) over the header's first 12 bytes
  (offset and length) followed by the body, so a flipped bit in the offset or the
  length is caught as surely as one in the body.
- body: one msgpack array (`use_bin_type=True`; strings UTF-8, payload as bin):
  `[payload: bin, key: str|nil, attributes: map str->str|nil, publish_time: int ms,
  producer_id: int, producer_name: str, schema_id: int|nil, schema_version: int|nil,
  sequence_id: int|nil]`. `sequence_id` is the producer's own number for the message
  (deduplication); records written before it existed have 8 fields and read as nil.

A second record kind, the cursor checkpoint, has bit 31 of `length` set
(`CHECKPOINT_FLAG`; real lengths stay below 2**26) and the body `[subscription: str,
state: bin|nil]` (`state` is opaque here: the topic's encoded cursor; nil: the
subscription was deleted). It takes no offset: its `offset` field is the offset of the
next message record (the end of the messages it follows), it is CRC'd like a message,
and `scan` returns it apart (`ScanResult.checkpoints`) and never among the records, so
readers for delivery never see it and offsets stay consecutive for every reader.

`encode_batch` writes the records of one producer batch; `scan` is the pure recovery
and read core: it decodes from the start of a buffer to its end or to the first fault
and never raises on bad data. It reports the fault and how many bytes were whole, and
the shells (`segment.py`, `log.py`) decide: truncate a torn tail, or raise
`CorruptRecord` where the log must be whole.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from itertools import repeat

import crc32c
import msgpack

HEADER = struct.Struct(">QII")
HEADER_BYTES = HEADER.size
# The CRC covers offset and length: the header's first 12 bytes.
_CRC_PREFIX = struct.Struct(">QI")
CRC_PREFIX_BYTES = _CRC_PREFIX.size

# Larger than any record a broker accepts (a frame is at most 16 MiB by default);
# a bigger length field is damage, and believing it would make us read gigabytes.
RECORD_BODY_BYTES_MAX = 64 * 1024 * 1024
# Set in a header's length field: the record is a cursor checkpoint, not a message.
CHECKPOINT_FLAG = 1 << 31
_LENGTH_MASK = CHECKPOINT_FLAG - 1

BODY_FIELDS = 9
_OLD_BODY_FIELDS = 8  # records written before `sequence_id`: read with it nil
# Pieces of a record body as msgpack writes them (`encode_batch`): the fixarray header
# of the 9 fields is folded into the payload's bin header.
_FIXARRAY = 0x90 | BODY_FIELDS
_BIN8_HEADERS = [bytes((_FIXARRAY, 0xC4, size)) for size in range(0x100)]
_BIN16 = struct.Struct(">BBH").pack
_BIN32 = struct.Struct(">BBI").pack
_UINT64 = struct.Struct(">BQ").pack
_UINT32 = struct.Struct(">BI").pack
_UINT16 = struct.Struct(">BH").pack
_UINT32_END, _UINT64_END = 1 << 32, 1 << 64
_NIL = b"\xc0"
# Average body size from which `_decode_bodies` decodes each body alone.
_JOIN_BELOW_BYTES = 384
_NO_LIMIT = 1 << 65  # above every u64 offset and every buffer size


class FaultKind(enum.StrEnum):
    TRUNCATED = "truncated"  # partial header or body: the end of the buffer cut a record
    BAD_CRC = "bad_crc"  # the stored CRC does not match the one computed
    BAD_LENGTH = "bad_length"  # length above the cap, or a body msgpack cannot decode
    OFFSET_GAP = "offset_gap"  # offset is not the previous + 1 (or the expected first)


@dataclass(frozen=True, slots=True, kw_only=True)
class Fault:
    """The first record `scan` could not accept.

    `position` is the record's first byte in the scanned buffer. `expected` and `actual`
    are set for `bad_crc` (stored CRC, computed CRC) and `offset_gap` (expected offset,
    offset found); `reason` says it in words for logs and `CorruptRecord`.
    """

    kind: FaultKind
    position: int
    reason: str
    expected: int | None = None
    actual: int | None = None

    def shifted(self, base_position: int) -> Fault:
        """The same fault with `position` made relative to a file, not a buffer."""
        return replace(self, position=base_position + self.position)


@dataclass(frozen=True, slots=True, kw_only=True)
class RecordBatch:
    """Decoded records, one list per field (columnar, like the wire's `Send`)."""

    offsets: list[int]
    payloads: list[bytes]
    keys: list[str | None]
    attributes: list[dict[str, str] | None]
    publish_times: list[int]
    producer_ids: list[int]
    producer_names: list[str]
    schema_ids: list[int | None]
    schema_versions: list[int | None]
    sequence_ids: list[int | None]

    def __len__(self) -> int:
        return len(self.offsets)

    @property
    def bytes_size(self) -> int:
        """Payload bytes (not keys, attributes or framing)."""
        return sum(map(len, self.payloads))

    def head(self, count: int) -> RecordBatch:
        """The first `count` records."""
        if count >= len(self.offsets):
            return self
        return self._from_columns(self.offsets[:count], [column[:count] for column in self._body_columns()])

    @classmethod
    def empty(cls) -> RecordBatch:
        return cls._from_columns([], [[] for _ in range(BODY_FIELDS)])

    @classmethod
    def concat(cls, batches: Sequence[RecordBatch]) -> RecordBatch:
        """One batch of several, in order; offsets must continue from batch to batch."""
        if len(batches) == 1:
            return batches[0]
        offsets: list[int] = []
        columns: list[list[object]] = [[] for _ in range(BODY_FIELDS)]
        for batch in batches:
            assert not offsets or not batch.offsets or batch.offsets[0] == offsets[-1] + 1, "concat of discontinuous batches"
            offsets += batch.offsets
            for column, values in zip(columns, batch._body_columns(), strict=True):
                column += values
        return cls._from_columns(offsets, columns)

    def _body_columns(self) -> tuple[list[object], ...]:
        # Order of the msgpack body array.
        return (
            self.payloads,
            self.keys,
            self.attributes,
            self.publish_times,
            self.producer_ids,
            self.producer_names,
            self.schema_ids,
            self.schema_versions,
            self.sequence_ids,
        )  # type: ignore[return-value]

    @classmethod
    def _from_columns(cls, offsets: list[int], columns: list[list[object]]) -> RecordBatch:
        (payloads, keys, attributes, publish_times, producer_ids, producer_names, schema_ids, schema_versions,
         sequence_ids) = columns
        return cls(
            offsets=offsets,
            payloads=payloads,  # type: ignore[arg-type]
            keys=keys,  # type: ignore[arg-type]
            attributes=attributes,  # type: ignore[arg-type]
            publish_times=publish_times,  # type: ignore[arg-type]
            producer_ids=producer_ids,  # type: ignore[arg-type]
            producer_names=producer_names,  # type: ignore[arg-type]
            schema_ids=schema_ids,  # type: ignore[arg-type]
            schema_versions=schema_versions,  # type: ignore[arg-type]
            sequence_ids=sequence_ids,  # type: ignore[arg-type]
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class ScanResult:
    """What `scan` found: the whole records, where they end, and the first fault.

    `valid_bytes` is the length of the buffer's prefix made of whole, checked records
    (where a torn file is truncated, where the next read starts). `next_offset` is the
    offset after the last whole record (the `expected_offset` given when there is none).
    `record_count` equals `len(records)` except with `decode=False`, where `records` is
    empty. `fault` is None when the scan stopped at the buffer's end or at a limit.
    """

    records: RecordBatch
    valid_bytes: int
    next_offset: int | None
    fault: Fault | None
    record_count: int
    # With `with_sizes`: each record's bytes in the log (header included), in order.
    sizes: list[int] | None = None
    # The cursor checkpoints met, in order (also with `decode=False`).
    checkpoints: tuple[Checkpoint, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class Checkpoint:
    """A cursor checkpoint record: `offset` is the end of the messages before it;
    `state` None says the subscription was deleted."""

    offset: int
    subscription: str
    state: bytes | None
    # Where the record lies in the scanned buffer and its bytes (header included): the
    # log's byte counts of messages leave checkpoints out (`Segment.checkpoint_bytes`).
    position: int = field(default=0, compare=False)
    size: int = field(default=0, compare=False)


def encode_checkpoints(offset: int, checkpoints: Iterable[tuple[str, bytes | None]]) -> bytes:
    """Checkpoint records (subscription, state) to append when the log's next offset is
    `offset`; they take no offset."""
    pack_prefix, pack_header, crc = _CRC_PREFIX.pack, HEADER.pack, crc32c.crc32c
    out: list[bytes] = []
    for subscription, state in checkpoints:
        body = msgpack.packb([subscription, state], use_bin_type=True)
        length = len(body)
        assert length <= RECORD_BODY_BYTES_MAX, "checkpoint body above RECORD_BODY_BYTES_MAX"
        flagged = length | CHECKPOINT_FLAG
        out.append(pack_header(offset, flagged, crc(body, crc(pack_prefix(offset, flagged)))))
        out.append(body)
    return b"".join(out)


def _decode_checkpoint(offset: int, body: memoryview, position: int = 0, size: int = 0) -> Checkpoint | None:
    try:
        row = msgpack.unpackb(body, raw=False, use_list=False, max_ext_len=0)
    except Exception:  # any msgpack error means damage, as in _decode_bodies
        return None
    if (type(row) is not tuple or len(row) != 2 or type(row[0]) is not str
            or not (row[1] is None or type(row[1]) is bytes)):
        return None
    return Checkpoint(offset=offset, subscription=row[0], state=row[1], position=position, size=size)


def encode_batch(
    base_offset: int,
    payloads: Sequence[bytes],
    publish_times: Sequence[int],
    producer_id: int,
    producer_name: str,
    keys: Sequence[str | None] | None = None,
    attributes: Sequence[dict[str, str] | None] | None = None,
    schema_id: int | None = None,
    schema_version: int | None = None,
    sequence_ids: Sequence[int] | None = None,
) -> bytes:
    """The records of one producer batch, offsets `base_offset ..` consecutive.

    The hot path of reliable topics. Each body is the msgpack array msgpack itself would
    write (a test holds the two byte for byte), put together from pieces: the fields
    every record of the batch shares are packed once, a payload's bin header and a
    publish time come from struct, and the payload is copied once into the body. A
    `msgpack.Packer` per record cost 2.2 µs at 1 KiB against 0.9 µs this way (it
    copies the payload into its own buffer and out again). Then per record two struct
    packs, two `crc32c` calls (prefix, then body continuing the CRC) and two list
    appends; one join at the end (a growing bytearray copied a 1 MiB batch again at
    every reallocation and once more into bytes).
    """
    count = len(payloads)
    assert base_offset >= 0, base_offset
    assert len(publish_times) == count, "publish_times must match payloads"
    assert keys is None or len(keys) == count, "keys must match payloads"
    assert attributes is None or len(attributes) == count, "attributes must match payloads"
    assert sequence_ids is None or len(sequence_ids) == count, "sequence_ids must match payloads"
    key_column: Iterable[str | None] = repeat(None) if keys is None else keys
    attribute_column: Iterable[dict[str, str] | None] = repeat(None) if attributes is None else attributes
    sequence_column: Iterable[int | None] = repeat(None) if sequence_ids is None else sequence_ids
    # The four fields before the last are the batch's: packed once, without their array header.
    tail = msgpack.packb([producer_id, producer_name, schema_id, schema_version], use_bin_type=True)[1:]
    pack_prefix, pack_header = _CRC_PREFIX.pack, HEADER.pack
    crc = crc32c.crc32c
    join = b"".join
    out: list[bytes] = []
    append = out.append
    offset = base_offset
    for payload, key, record_attributes, publish_time, sequence_id in zip(
            payloads, key_column, attribute_column, publish_times, sequence_column, strict=False):
        # strict=False: the columns may be repeat(None); their lengths are asserted above.
        size = len(payload)
        body = join((
            _BIN8_HEADERS[size] if size < 0x100
            else _BIN16(_FIXARRAY, 0xC5, size) if size < 0x10000 else _BIN32(_FIXARRAY, 0xC6, size),
            payload,
            _NIL if key is None else msgpack.packb(key),
            _NIL if record_attributes is None else msgpack.packb(record_attributes),
            _UINT64(0xCF, publish_time) if _UINT32_END <= publish_time < _UINT64_END else msgpack.packb(publish_time),
            tail,
            # msgpack's own encodings of an int, by struct (packb is 0.5 µs a call).
            _NIL if sequence_id is None else _UINT32(0xCE, sequence_id) if 0x10000 <= sequence_id < _UINT32_END
            else _UINT16(0xCD, sequence_id) if 0x100 <= sequence_id < 0x10000 else msgpack.packb(sequence_id),
        ))
        length = len(body)
        # Pairs with scan's cap: a bigger body would read back as damage. The broker's
        # frame limit (16 MiB) keeps every record far below, so this is our bug.
        assert length <= RECORD_BODY_BYTES_MAX, "record body above RECORD_BODY_BYTES_MAX"
        append(pack_header(offset, length, crc(body, crc(pack_prefix(offset, length)))))
        append(body)
        offset += 1
    return join(out)


def scan(
    buf: bytes | bytearray | memoryview,
    *,
    expected_offset: int | None,
    upto_offset: int | None = None,
    max_bytes: int | None = None,
    min_one_record: bool = True,
    decode: bool = True,
    body_bytes_max: int = RECORD_BODY_BYTES_MAX,
    with_sizes: bool = False,
) -> ScanResult:
    """Decode records from the start of `buf` until its end, a limit, or the first fault.

    Checks, in order, for each record: a whole header (else `truncated`), length within
    `body_bytes_max` (else `bad_length`), a whole body (else `truncated`), the CRC (else
    `bad_crc`), the offset equal to `expected_offset` for the first record and previous
    + 1 after (else `offset_gap`; with `expected_offset=None` the first record sets it),
    and, with `decode`, a msgpack array of 9 fields, or 8 of an older record (else
    `bad_length`).

    Limits stop the scan without a fault: the record at `upto_offset` is not read, and a
    record that would take the whole records' bytes (headers included) above `max_bytes`
    is not taken, unless it is the first and `min_one_record`. `decode=False` checks
    everything but the msgpack body and returns no records (recovery, index building).
    Never raises on bad data: damage is reported in `fault`.
    """
    view = memoryview(buf)
    size = len(view)
    unpack_header = HEADER.unpack_from
    crc = crc32c.crc32c
    stop_offset = _NO_LIMIT if upto_offset is None else upto_offset
    budget_bytes = _NO_LIMIT if max_bytes is None else max_bytes
    # Without an expected offset the first record's own (CRC-checked below) sets it.
    offset_unknown = expected_offset is None
    if expected_offset is not None:
        expected = expected_offset
    elif size >= HEADER_BYTES:
        expected = unpack_header(view, 0)[0]
    else:
        expected = 0  # never compared: no whole header
    first_offset = expected
    position = 0
    bodies: list[memoryview] = []
    collect_body = bodies.append
    checkpoints: list[Checkpoint] = []
    checkpoint_counts: list[int] = []  # messages before each checkpoint
    count = 0
    fault: Fault | None = None
    # Pass 1 walks headers and checks CRCs and offsets; pass 2 decodes every body in
    # one msgpack call. Per record this loop is the whole Python cost of a read.
    while expected < stop_offset:
        remaining = size - position
        if remaining < HEADER_BYTES:
            if remaining:
                fault = Fault(kind=FaultKind.TRUNCATED, position=position, reason=f"partial header: {remaining} of 16 bytes")
            break
        offset, length, stored_crc = unpack_header(view, position)
        is_checkpoint = length & CHECKPOINT_FLAG
        if is_checkpoint:
            length &= _LENGTH_MASK
        if length > body_bytes_max:
            reason = f"record length {length} above the cap {body_bytes_max}"
            fault = Fault(kind=FaultKind.BAD_LENGTH, position=position, reason=reason)
            break
        end = position + HEADER_BYTES + length
        if end > size:
            reason = f"partial body: {remaining - HEADER_BYTES} of {length} bytes"
            fault = Fault(kind=FaultKind.TRUNCATED, position=position, reason=reason)
            break
        if end > budget_bytes and (count or not min_one_record):
            break
        body = view[position + HEADER_BYTES : end]
        computed_crc = crc(body, crc(view[position : position + CRC_PREFIX_BYTES]))
        if computed_crc != stored_crc:
            reason = f"crc32c mismatch: stored {stored_crc:#010x}, computed {computed_crc:#010x}"
            fault = Fault(kind=FaultKind.BAD_CRC, position=position, reason=reason, expected=stored_crc, actual=computed_crc)
            break
        if offset != expected:
            reason = f"offset {offset} where {expected} was expected"
            fault = Fault(kind=FaultKind.OFFSET_GAP, position=position, reason=reason, expected=expected, actual=offset)
            break
        if is_checkpoint:
            checkpoint = _decode_checkpoint(offset, body, position, end - position)
            if checkpoint is None:
                fault = Fault(kind=FaultKind.BAD_LENGTH, position=position,
                              reason="undecodable checkpoint: not a msgpack array [str, bin|nil]")
                break
            checkpoints.append(checkpoint)
            checkpoint_counts.append(count)
            position = end
            continue  # takes no offset
        if decode:
            collect_body(body)
        count += 1
        expected = offset + 1
        position = end
    if offset_unknown and not count:
        next_offset: int | None = None  # no record vouched for an offset
    else:
        next_offset = expected
    if not (decode and count):
        empty = RecordBatch.empty()
        return ScanResult(records=empty, valid_bytes=position, next_offset=next_offset, fault=fault, record_count=count,
                          sizes=[] if with_sizes else None, checkpoints=tuple(checkpoints))
    rows = _decode_bodies(bodies)
    if len(rows) < count:
        # A CRC-clean body msgpack cannot read (a writer's bug, or damage the CRC
        # missed): the scan ends before it, as for any other fault.
        count = len(rows)
        position = _position_of(view, count)
        checkpoints = [c for n, c in zip(checkpoint_counts, checkpoints, strict=True) if n <= count]
        next_offset = None if offset_unknown and not count else first_offset + count
        fault = Fault(kind=FaultKind.BAD_LENGTH, position=position, reason="undecodable body: not a msgpack array of 9 fields")
    if count:
        columns = [list(column) for column in zip(*rows, strict=True)]
        records = RecordBatch._from_columns(list(range(first_offset, first_offset + count)), columns)
    else:
        records = RecordBatch.empty()
    sizes = [HEADER_BYTES + len(body) for body in bodies[:count]] if with_sizes else None
    return ScanResult(records=records, valid_bytes=position, next_offset=next_offset, fault=fault, record_count=count,
                      sizes=sizes, checkpoints=tuple(checkpoints))


def _decode_bodies(bodies: list[memoryview]) -> Sequence[Sequence[object]]:
    """Decode bodies; on a bad body, the rows before it.

    Small bodies go in one msgpack call (joined as one array): a call per record cost a
    third more at 100 B. Large ones go a call each: joining copies every byte once more
    (a 1 MiB buffer per read), which at 1 KiB took 1.4-2.0 µs a record against 0.4-0.5.
    Bodies that msgpack cannot split exactly as written make the joined call fail
    (extra or missing data) or yield rows that are not 9-field arrays; then each body
    is decoded alone to find the first bad one (or to pad an older record's 8 fields).
    Rows are tuples (`use_list=False`): cheaper to build.
    """
    if sum(map(len, bodies)) < _JOIN_BELOW_BYTES * len(bodies):
        packed = b"\xdd" + len(bodies).to_bytes(4, "big") + b"".join(bodies)
        try:
            rows = msgpack.unpackb(packed, raw=False, use_list=False, strict_map_key=True, max_ext_len=0)
        except Exception:  # msgpack raises a zoo of types; any of them means damage: find the body
            rows = None
        if rows is not None and set(map(type, rows)) == {tuple} and set(map(len, rows)) == {BODY_FIELDS}:
            return rows
    good: list[Sequence[object]] = []
    unpack = msgpack.unpackb
    for body in bodies:
        try:
            row = unpack(body, raw=False, use_list=False, strict_map_key=True, max_ext_len=0)
        except Exception:  # as above
            break
        if type(row) is not tuple or len(row) != BODY_FIELDS:
            if type(row) is not tuple or len(row) != _OLD_BODY_FIELDS:
                break
            row = (*row, None)
        good.append(row)
    return good


def _position_of(view: memoryview, index: int) -> int:
    """Byte position of the `index`-th message record of a buffer whose headers were
    checked (checkpoints before it are hopped over, not counted)."""
    position = 0
    seen = 0
    while True:
        length = HEADER.unpack_from(view, position)[1]
        if not length & CHECKPOINT_FLAG:
            if seen == index:
                return position
            seen += 1
        position += HEADER_BYTES + (length & _LENGTH_MASK)


def skip_to(
    buf: bytes | bytearray | memoryview,
    *,
    offset: int,
    start_offset: int,
    body_bytes_max: int = RECORD_BODY_BYTES_MAX,
) -> tuple[int, int]:
    """Hop record headers from the start of `buf`, whose first record is `offset`, to the
    first record at or after `start_offset`; return its (position, offset).

    Bodies are neither read nor checked (a read checks the records it returns). The
    position may lie beyond `len(buf)` when a body crosses the end; the hop also stops
    at a partial header or at a header that does not fit (wrong offset, length above
    the cap), leaving `scan` to report that fault.
    """
    unpack_header = HEADER.unpack_from
    size = len(buf)
    position = 0
    while offset < start_offset and position + HEADER_BYTES <= size:
        record_offset, length, _ = unpack_header(buf, position)
        is_checkpoint = length & CHECKPOINT_FLAG
        length &= _LENGTH_MASK
        if record_offset != offset or length > body_bytes_max:
            break
        position += HEADER_BYTES + length
        if not is_checkpoint:  # a checkpoint takes no offset
            offset += 1
    return position, offset

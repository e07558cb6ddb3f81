"""The WAL record format: encode/scan round trips, and every kind of damage is reported."""

from __future__ import annotations

import itertools
import struct

import crc32c
import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from danube_zmq.storage.wal import (
    HEADER,
    HEADER_BYTES,
    RECORD_BODY_BYTES_MAX,
    CorruptRecord,
    FaultKind,
    OffsetOutOfRange,
    RecordBatch,
    encode_batch,
    scan,
)
from danube_zmq.storage.wal.format import Fault, ScanResult, skip_to
from danube_zmq.transport.errors import InternalError, NotFound

_text = st.text(max_size=12)
_attributes = st.one_of(st.none(), st.dictionaries(_text, _text, max_size=3))
_optional_int = st.one_of(st.none(), st.integers(min_value=0, max_value=2**32))


@st.composite
def batches(draw: st.DrawFn) -> dict:
    count = draw(st.integers(min_value=1, max_value=12))
    column = st.lists
    return {
        "base_offset": draw(st.integers(min_value=0, max_value=2**62)),
        "payloads": draw(column(st.binary(max_size=300), min_size=count, max_size=count)),
        "publish_times": draw(column(st.integers(min_value=0, max_value=2**63 - 1), min_size=count, max_size=count)),
        "producer_id": draw(st.integers(min_value=0, max_value=2**63 - 1)),
        "producer_name": draw(_text),
        "keys": draw(st.one_of(st.none(), column(st.one_of(st.none(), _text), min_size=count, max_size=count))),
        "attributes": draw(st.one_of(st.none(), column(_attributes, min_size=count, max_size=count))),
        "schema_id": draw(_optional_int),
        "schema_version": draw(_optional_int),
        "sequence_ids": draw(st.one_of(st.none(), column(st.integers(min_value=0, max_value=2**63 - 1),
                                                          min_size=count, max_size=count))),
    }


def small_file() -> tuple[bytes, list[int]]:
    """Five records in two batches (with keys and attributes), and each record's start byte."""
    first = encode_batch(0, [b"alpha", b"", b"gamma" * 3], [1, 2, 3], 9, "producer-a", keys=["k", None, "k"])
    second = encode_batch(3, [b"delta", b"e"], [4, 5], 10, "b", attributes=[{"a": "1"}, None], schema_id=2, schema_version=1)
    buf = first + second
    starts = []
    position = 0
    while position < len(buf):
        starts.append(position)
        position += HEADER_BYTES + HEADER.unpack_from(buf, position)[1]
    return buf, starts


def raw_record(offset: int, body: bytes) -> bytes:
    """A record with a correct CRC around any body bytes."""
    prefix = struct.pack(">QI", offset, len(body))
    return prefix + crc32c.crc32c(body, crc32c.crc32c(prefix)).to_bytes(4, "big") + body


@settings(max_examples=150, deadline=None)
@given(batch=batches())
def test_encode_then_scan_returns_every_field(batch: dict) -> None:
    """A random producer batch encodes to records that scan back field for field."""
    buf = encode_batch(**batch)
    count = len(batch["payloads"])
    result = scan(buf, expected_offset=batch["base_offset"])
    assert result.fault is None
    assert result.valid_bytes == len(buf)
    assert result.next_offset == batch["base_offset"] + count
    records = result.records
    assert records.offsets == list(range(batch["base_offset"], batch["base_offset"] + count))
    assert records.payloads == batch["payloads"]
    assert records.keys == (batch["keys"] or [None] * count)
    assert records.attributes == (batch["attributes"] or [None] * count)
    assert records.publish_times == batch["publish_times"]
    assert records.producer_ids == [batch["producer_id"]] * count
    assert records.producer_names == [batch["producer_name"]] * count
    assert records.schema_ids == [batch["schema_id"]] * count
    assert records.schema_versions == [batch["schema_version"]] * count
    assert records.sequence_ids == (batch["sequence_ids"] or [None] * count)
    assert len(records) == count
    assert records.bytes_size == sum(map(len, batch["payloads"]))


@settings(max_examples=50, deadline=None)
@given(data=st.data())
def test_consecutive_batches_scan_as_one_log(data: st.DataObject) -> None:
    """Batches appended back to back scan as one continuous run of offsets."""
    offset = data.draw(st.integers(min_value=0, max_value=1000))
    start = offset
    buf = b""
    payloads: list[bytes] = []
    for _ in range(data.draw(st.integers(min_value=1, max_value=4))):
        batch = data.draw(st.lists(st.binary(max_size=50), min_size=1, max_size=5))
        buf += encode_batch(offset, batch, [0] * len(batch), 1, "p")
        payloads += batch
        offset += len(batch)
    result = scan(memoryview(buf), expected_offset=None)
    assert result.fault is None
    assert result.records.offsets == list(range(start, offset))
    assert result.records.payloads == payloads
    assert result.next_offset == offset


def test_empty_buffer_scans_to_nothing() -> None:
    """An empty buffer is a whole (empty) log: no fault, next offset as expected."""
    result = scan(b"", expected_offset=7)
    assert (len(result.records), result.valid_bytes, result.next_offset, result.fault) == (0, 0, 7, None)
    assert scan(b"", expected_offset=None).next_offset is None


def test_every_cut_of_a_buffer_scans_to_the_last_whole_record() -> None:
    """Exhaustive over a small buffer: a cut inside a record is `truncated` at that
    record's start; a cut on a boundary is no fault; the whole records before are kept."""
    buf, starts = small_file()
    whole = scan(buf, expected_offset=0).records
    boundaries = [*starts, len(buf)]
    for cut in range(len(buf) + 1):
        result = scan(buf[:cut], expected_offset=0)
        kept = max(i for i, boundary in enumerate(boundaries) if boundary <= cut)
        assert result.valid_bytes == boundaries[kept]
        assert result.next_offset == kept
        assert result.records.payloads == whole.payloads[:kept]
        if cut == boundaries[kept]:
            assert result.fault is None
        else:
            assert result.fault is not None
            assert result.fault.kind is FaultKind.TRUNCATED
            assert result.fault.position == boundaries[kept]


def test_flipped_bit_anywhere_is_detected_at_its_record() -> None:
    """Exhaustive over a small buffer: every bit of every header and body byte, flipped
    alone, makes scan stop with a fault at the damaged record, returning exactly the
    intact records before it and never the damaged one."""
    buf, starts = small_file()
    whole = scan(buf, expected_offset=0).records
    for position in range(len(buf)):
        record = max(i for i, start in enumerate(starts) if start <= position)
        for bit in range(8):
            damaged = bytearray(buf)
            damaged[position] ^= 1 << bit
            result = scan(bytes(damaged), expected_offset=0)
            assert result.fault is not None, (position, bit)
            assert result.fault.position == starts[record], (position, bit, result.fault)
            assert result.valid_bytes == starts[record]
            assert result.records.offsets == whole.offsets[:record]
            assert result.records.payloads == whole.payloads[:record]


def test_crc_fault_reports_stored_and_computed_crc() -> None:
    """A damaged body is `bad_crc` with the stored and the computed CRC."""
    buf = bytearray(encode_batch(0, [b"payload"], [1], 1, "p"))
    stored = HEADER.unpack_from(buf, 0)[2]
    buf[-1] ^= 0xFF
    fault = scan(bytes(buf), expected_offset=0).fault
    assert fault is not None and fault.kind is FaultKind.BAD_CRC
    assert fault.expected == stored
    assert fault.actual != stored
    assert "crc32c mismatch" in fault.reason


def test_offset_gap_is_reported_for_first_and_later_records() -> None:
    """An offset other than the expected one (first record) or previous + 1 is `offset_gap`."""
    first = encode_batch(5, [b"a", b"b"], [0, 0], 1, "p")
    fault = scan(first, expected_offset=4).fault
    assert fault is not None and fault.kind is FaultKind.OFFSET_GAP
    assert (fault.position, fault.expected, fault.actual) == (0, 4, 5)

    gap = first + encode_batch(8, [b"c"], [0], 1, "p")
    result = scan(gap, expected_offset=5)
    assert result.fault is not None and result.fault.kind is FaultKind.OFFSET_GAP
    assert (result.fault.position, result.fault.expected, result.fault.actual) == (len(first), 7, 8)
    assert result.records.offsets == [5, 6]
    assert result.next_offset == 7

    replay = first + first
    assert scan(replay, expected_offset=None).fault.kind is FaultKind.OFFSET_GAP


def test_length_above_the_cap_is_bad_length() -> None:
    """A length field above the sanity cap is `bad_length`, not a request for gigabytes."""
    buf = encode_batch(0, [b"x" * 100], [0], 1, "p")
    fault = scan(buf, expected_offset=0, body_bytes_max=50).fault
    assert fault is not None and fault.kind is FaultKind.BAD_LENGTH
    huge = struct.pack(">QII", 0, 2**32 - 1, 0)
    assert scan(huge, expected_offset=0).fault.kind is FaultKind.BAD_LENGTH


@pytest.mark.parametrize(
    "body",
    [b"\xc1", msgpack.packb([b"a", None, None]), msgpack.packb({"a": 1}), b"\x98" + b"\xc0" * 7, msgpack.packb([1] * 8) + b"!",
     msgpack.packb([b"a", None, {1: "x"}, 0, 1, "p", None, None], use_bin_type=True)],
)
def test_undecodable_body_with_good_crc_is_bad_length(body: bytes) -> None:
    """A CRC-clean body that is not a msgpack array of 8 fields, or whose attributes map
    has a key that is not a string, is `bad_length`, whether decoded with its neighbours
    or alone; the records before it are still returned."""
    good = encode_batch(0, [b"a", b"b"], [0, 0], 1, "p")
    result = scan(good + raw_record(2, body), expected_offset=0)
    assert result.fault is not None and result.fault.kind is FaultKind.BAD_LENGTH
    assert result.fault.position == len(good)
    assert result.records.offsets == [0, 1]
    assert result.valid_bytes == len(good)
    alone = scan(raw_record(2, body), expected_offset=2)
    assert alone.fault.kind is FaultKind.BAD_LENGTH and len(alone.records) == 0 and alone.next_offset == 2


@settings(max_examples=300, deadline=None)
@given(junk=st.binary(max_size=200), prefix_records=st.integers(min_value=0, max_value=3))
def test_scan_never_raises_on_arbitrary_bytes(junk: bytes, prefix_records: int) -> None:
    """Whatever follows whole records, scan returns them and reports, never raises."""
    good = encode_batch(0, [b"r"] * prefix_records, [0] * prefix_records, 1, "p") if prefix_records else b""
    result = scan(good + junk, expected_offset=0)
    assert result.records.offsets[:prefix_records] == list(range(prefix_records))
    assert result.valid_bytes >= len(good)


def test_upto_offset_and_max_bytes_stop_without_a_fault() -> None:
    """Limits end a scan cleanly: records from upto_offset on are not read, and a record
    taking the bytes above max_bytes is left, except a first one with min_one_record."""
    buf = encode_batch(10, [b"x" * 10] * 5, [0] * 5, 1, "p")
    record_bytes = len(buf) // 5
    assert scan(buf, expected_offset=10, upto_offset=13).records.offsets == [10, 11, 12]
    assert scan(buf, expected_offset=10, upto_offset=10).records.offsets == []
    limited = scan(buf, expected_offset=10, max_bytes=2 * record_bytes + 1)
    assert limited.records.offsets == [10, 11] and limited.fault is None
    assert limited.valid_bytes == 2 * record_bytes
    assert scan(buf, expected_offset=10, max_bytes=1).records.offsets == [10]
    assert scan(buf, expected_offset=10, max_bytes=1, min_one_record=False).records.offsets == []
    verified = scan(buf, expected_offset=10, decode=False)
    assert verified.record_count == 5 and len(verified.records) == 0 and verified.next_offset == 15


def test_skip_to_hops_headers_to_the_start_offset() -> None:
    """skip_to finds a record's position from headers alone, even past the buffer's end."""
    buf, starts = small_file()
    for target in range(5):
        assert skip_to(buf, offset=0, start_offset=target) == (starts[target], target)
    assert skip_to(buf[: starts[2] + 3], offset=0, start_offset=4) == (starts[2], 2)
    assert skip_to(buf[: starts[2] + 20], offset=0, start_offset=4) == (starts[3], 3)
    assert skip_to(buf, offset=1, start_offset=3) == (0, 1)  # wrong offset: stop, scan reports


def test_record_batch_concat_and_empty() -> None:
    """Batches concatenate column by column; an empty batch is falsy and sized zero."""
    buf = encode_batch(0, [b"ab", b"c", b"def"], [1, 2, 3], 1, "p", keys=["x", None, "z"])
    whole = scan(buf, expected_offset=0).records
    first = scan(buf, expected_offset=0, upto_offset=1).records
    second_start, _ = skip_to(buf, offset=0, start_offset=1)
    rest = scan(buf[second_start:], expected_offset=None).records
    assert RecordBatch.concat([first, RecordBatch.empty(), rest]) == whole
    assert whole.bytes_size == 6
    assert not RecordBatch.empty() and RecordBatch.empty().bytes_size == 0


def test_concat_of_one_batch_is_that_batch_and_of_none_is_empty() -> None:
    """Concatenating a single batch hands it back as is (a read of one segment copies
    no column), and concatenating nothing gives an empty batch rather than an error."""
    batch = scan(encode_batch(0, [b"a", b"b"], [1, 2], 1, "p"), expected_offset=0).records
    assert RecordBatch.concat([batch]) is batch
    assert RecordBatch.concat([]) == RecordBatch.empty()


@pytest.mark.parametrize("kind", [Fault, RecordBatch, ScanResult])
def test_scan_results_are_immutable_keyword_only_slotted_values(kind: type) -> None:
    """Faults, batches and scan results are shared between readers and caches: they
    cannot be changed in place, take their fields by name only (no positional mix-up
    of same-typed columns) and carry no per-instance dict."""
    import dataclasses

    buf = encode_batch(0, [b"a"], [1], 1, "p")
    samples = {
        Fault: Fault(kind=FaultKind.TRUNCATED, position=0, reason="cut"),
        RecordBatch: scan(buf, expected_offset=0).records,
        ScanResult: scan(buf, expected_offset=0),
    }
    value = samples[kind]
    field = dataclasses.fields(value)[0].name
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(value, field, getattr(value, field))
    with pytest.raises(TypeError):
        kind(*[getattr(value, f.name) for f in dataclasses.fields(value)])
    assert not hasattr(value, "__dict__")


def test_errors_name_the_file_and_position() -> None:
    """CorruptRecord is an InternalError naming file and byte; OffsetOutOfRange a NotFound
    carrying the log's first offset."""
    error = CorruptRecord("/data/t/00000000000000000042.wal", 1234, "bad_crc: mismatch")
    assert isinstance(error, InternalError)
    assert "00000000000000000042.wal" in str(error) and "byte 1234" in str(error)
    assert (error.position, error.reason) == (1234, "bad_crc: mismatch")
    missing = OffsetOutOfRange(3, 100)
    assert isinstance(missing, NotFound) and missing.log_start_offset == 100 and not missing.retriable


@settings(max_examples=150, deadline=None)
@given(batch=batches())
def test_record_bodies_are_the_bytes_msgpack_writes(batch: dict) -> None:
    """`encode_batch` builds bodies from pieces; each must be byte for byte the array
    msgpack packs for the record, so any msgpack reader (Spark's export, other tools)
    reads it the same."""
    buf = encode_batch(**batch)
    position = 0
    count = len(batch["payloads"])
    rows = zip(batch["payloads"], batch["keys"] or [None] * count, batch["attributes"] or [None] * count,
               batch["publish_times"], batch["sequence_ids"] or [None] * count, strict=True)
    for payload, key, attributes, publish_time, sequence_id in rows:
        length = HEADER.unpack_from(buf, position)[1]
        body = buf[position + HEADER_BYTES:position + HEADER_BYTES + length]
        assert body == msgpack.packb([payload, key, attributes, publish_time, batch["producer_id"],
                                      batch["producer_name"], batch["schema_id"], batch["schema_version"],
                                      sequence_id], use_bin_type=True)
        position += HEADER_BYTES + length
    assert position == len(buf)


@pytest.mark.parametrize("size", [0, 255, 256, 65535, 65536, 200_000])
def test_payload_sizes_at_each_bin_header_width_round_trip(size: int) -> None:
    payload = bytes(range(256)) * (size // 256) + bytes(size % 256)
    buf = encode_batch(7, [payload], [1_763_800_000_000], 1, "p")
    assert buf[HEADER_BYTES:] == msgpack.packb([payload, None, None, 1_763_800_000_000, 1, "p", None, None, None])
    assert scan(buf, expected_offset=7).records.payloads == [payload]


@pytest.mark.parametrize("size", [10, 1000])
def test_records_written_before_sequence_ids_read_with_none(size: int) -> None:
    """A WAL written by a broker before `sequence_id` holds 8-field bodies; they read
    back whole, with a None sequence id, alone or next to new records (either side)."""
    old = [raw_record(offset, msgpack.packb([b"o" * size, "k", None, 5, 1, "p", None, None], use_bin_type=True))
           for offset in (0, 1)]
    new = encode_batch(2, [b"n" * size], [6], 2, "q", sequence_ids=[41])
    result = scan(b"".join(old) + new, expected_offset=0)
    assert result.fault is None
    assert result.records.sequence_ids == [None, None, 41]
    assert result.records.payloads == [b"o" * size, b"o" * size, b"n" * size]
    assert result.records.keys == ["k", "k", None]
    later = raw_record(3, msgpack.packb([b"x", None, None, 7, 1, "p", None, None], use_bin_type=True))
    assert scan(new + later, expected_offset=2).records.sequence_ids == [41, None]


def test_scan_sizes_are_each_records_bytes_in_the_log() -> None:
    """With `with_sizes`, `sizes` lists each returned record's bytes (16-byte header plus
    body) in order; they sum to `valid_bytes`, also when a limit or a bad body ends the
    scan early, and are empty when nothing is returned. Without it, `sizes` is None.
    (Snapshot export builds its per-record byte columns from them.)"""
    payloads = [b"", b"x" * 10, b"y" * 300, b"z" * 70000]
    buf = encode_batch(4, payloads, [0] * 4, 1, "p", keys=["k", None, "key", None])
    starts = [0]
    for _ in payloads:
        starts.append(starts[-1] + HEADER_BYTES + HEADER.unpack_from(buf, starts[-1])[1])
    expected = [b - a for a, b in itertools.pairwise(starts)]
    whole = scan(buf, expected_offset=4, with_sizes=True)
    assert whole.sizes == expected and sum(whole.sizes) == whole.valid_bytes == len(buf)
    assert scan(buf, expected_offset=4).sizes is None
    limited = scan(buf, expected_offset=4, upto_offset=6, with_sizes=True)
    assert limited.sizes == expected[:2] and sum(limited.sizes) == limited.valid_bytes
    budget = scan(buf, expected_offset=4, max_bytes=starts[3], with_sizes=True)
    assert budget.sizes == expected[:3]
    bad_body = scan(buf[: starts[2]] + raw_record(6, b"\xc1"), expected_offset=4, with_sizes=True)
    assert bad_body.sizes == expected[:2] and bad_body.fault is not None
    assert scan(b"", expected_offset=0, with_sizes=True).sizes == []
    assert scan(buf[:5], expected_offset=4, with_sizes=True).sizes == []


def test_record_length_at_the_cap_is_accepted_and_one_above_is_bad_length() -> None:
    """The cap is inclusive: a body of exactly `body_bytes_max` bytes is a record, one
    byte more is `bad_length` (in `scan` and where `skip_to` stops); the default cap is
    64 MiB and a length of cap + 1 is refused before any body byte is looked for."""
    buf = encode_batch(0, [b"x" * 100, b"y"], [0, 0], 1, "p")
    first = HEADER.unpack_from(buf, 0)[1]
    at_cap = scan(buf, expected_offset=0, body_bytes_max=first)
    assert at_cap.fault is None and at_cap.records.offsets == [0, 1]
    above = scan(buf, expected_offset=0, body_bytes_max=first - 1)
    assert above.fault is not None and above.fault.kind is FaultKind.BAD_LENGTH and above.fault.position == 0
    assert str(first) in above.fault.reason and str(first - 1) in above.fault.reason
    assert skip_to(buf, offset=0, start_offset=1, body_bytes_max=first) == (HEADER_BYTES + first, 1)
    assert skip_to(buf, offset=0, start_offset=1, body_bytes_max=first - 1) == (0, 0)
    assert RECORD_BODY_BYTES_MAX == 64 * 1024 * 1024
    header_only = struct.pack(">QII", 0, RECORD_BODY_BYTES_MAX + 1, 0)
    fault = scan(header_only, expected_offset=0).fault
    assert fault is not None and fault.kind is FaultKind.BAD_LENGTH
    truncated = scan(struct.pack(">QII", 0, RECORD_BODY_BYTES_MAX, 0), expected_offset=0).fault
    assert truncated is not None and truncated.kind is FaultKind.TRUNCATED

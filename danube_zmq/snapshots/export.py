"""WAL records -> Parquet: one row per record, the columns Spark reads (`RECORD_SCHEMA`).

A segment file (or the active segment up to the cut) is scanned in windows of
`_WINDOW_BYTES` with the WAL's own checks (CRC, offsets); each window becomes one
Parquet row group, so memory stays bounded whatever the segment's size. Damage is a
`CorruptSegment` naming the file and byte, never a partial file passed off as whole.
The Parquet footer carries the offsets and byte total (`danube.*` metadata), so a shared
segment file already exported is described again without reading its rows.
"""

from __future__ import annotations

import mmap
from pathlib import Path
from typing import IO, Any

import pyarrow as pa
import pyarrow.parquet as pq

from danube_zmq.storage.wal.format import RecordBatch, scan
from danube_zmq.transport.errors import InternalError

__all__ = ["RECORD_SCHEMA", "CorruptSegment", "ExportedFile", "export_segment", "read_footer"]

_WINDOW_BYTES = 16 * 1024 * 1024

RECORD_SCHEMA = pa.schema([
    pa.field("topic", pa.string(), nullable=False),
    pa.field("partition", pa.int32()),
    pa.field("offset", pa.int64(), nullable=False),
    pa.field("publish_time", pa.timestamp("ms", tz="UTC"), nullable=False),
    pa.field("key", pa.string()),
    pa.field("size", pa.int32(), nullable=False),  # payload bytes
    pa.field("record_bytes", pa.int32(), nullable=False),  # the record in the WAL, header included
    pa.field("producer_id", pa.int64(), nullable=False),
    pa.field("producer", pa.string(), nullable=False),
    pa.field("attributes", pa.map_(pa.string(), pa.string())),
    pa.field("schema_id", pa.int64()),
    pa.field("schema_version", pa.int32()),
    pa.field("payload", pa.binary()),  # null unless the snapshot includes payloads
])


class CorruptSegment(InternalError):
    """A WAL segment could not be read whole up to the cut."""

    def __init__(self, where: str, position: int, reason: str) -> None:
        super().__init__(f"WAL segment {where} is damaged at byte {position}: {reason}")
        self.where = where


class ExportedFile:
    __slots__ = ("base_offset", "last_offset", "record_bytes", "records")

    def __init__(self, base_offset: int, last_offset: int, records: int, record_bytes: int) -> None:
        self.base_offset = base_offset
        self.last_offset = last_offset
        self.records = records
        self.record_bytes = record_bytes


def _table(batch: RecordBatch, sizes: list[int], topic: str, partition: int | None, payloads: bool) -> pa.Table:
    n = len(batch)
    attributes = [list(a.items()) if a else None for a in batch.attributes]
    columns: list[Any] = [
        pa.array([topic] * n, pa.string()),
        pa.array([partition] * n, pa.int32()),
        pa.array(batch.offsets, pa.int64()),
        pa.array(batch.publish_times, pa.timestamp("ms", tz="UTC")),
        pa.array(batch.keys, pa.string()),
        pa.array([len(p) for p in batch.payloads], pa.int32()),
        pa.array(sizes, pa.int32()),
        pa.array(batch.producer_ids, pa.int64()),
        pa.array(batch.producer_names, pa.string()),
        pa.array(attributes, pa.map_(pa.string(), pa.string())),
        pa.array(batch.schema_ids, pa.int64()),
        pa.array(batch.schema_versions, pa.int32()),
        pa.array(batch.payloads if payloads else [None] * n, pa.binary()),
    ]
    return pa.Table.from_arrays(columns, schema=RECORD_SCHEMA)


def export_segment(
    source: Path, out: IO[bytes], *, where: str, topic: str, partition: int | None, base_offset: int,
    upto_offset: int, payloads: bool,
) -> ExportedFile:
    """Write the records `base_offset .. upto_offset - 1` of the segment file `source`
    to `out` as Parquet. Raises `CorruptSegment` if the file does not hold them all."""
    with open(source, "rb") as file:
        size = file.seek(0, 2)
        if size == 0:
            raise CorruptSegment(where, 0, f"empty, where offsets {base_offset}..{upto_offset - 1} were expected")
        with mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
            view = memoryview(mapped)
            try:
                return _export_view(view, out, where=where, topic=topic, partition=partition,
                                    base_offset=base_offset, upto_offset=upto_offset, payloads=payloads)
            finally:
                view.release()


def _export_view(view: memoryview, out: IO[bytes], *, where: str, topic: str, partition: int | None,
                 base_offset: int, upto_offset: int, payloads: bool) -> ExportedFile:
    position, expected, records, record_bytes = 0, base_offset, 0, 0
    metadata = {b"danube.topic": topic.encode(), b"danube.base_offset": str(base_offset).encode()}
    writer = pq.ParquetWriter(out, RECORD_SCHEMA.with_metadata(metadata), compression="zstd")
    try:
        while expected < upto_offset:
            result = scan(view[position:], expected_offset=expected, upto_offset=upto_offset, max_bytes=_WINDOW_BYTES,
                          with_sizes=True)
            if result.record_count == 0:
                if result.fault is not None:
                    raise CorruptSegment(where, position + result.fault.position, result.fault.reason)
                raise CorruptSegment(where, position, f"ends at offset {expected}, before the cut at {upto_offset}")
            assert result.sizes is not None and result.next_offset is not None
            writer.write_table(_table(result.records, result.sizes, topic, partition, payloads))
            records += result.record_count
            record_bytes += result.valid_bytes
            position += result.valid_bytes
            expected = result.next_offset
        writer.add_key_value_metadata({"danube.last_offset": str(expected - 1), "danube.records": str(records),
                                       "danube.record_bytes": str(record_bytes)})
    finally:
        writer.close()
    return ExportedFile(base_offset, expected - 1, records, record_bytes)


def read_footer(file: IO[bytes], where: str) -> ExportedFile:
    """What `export_segment` wrote, from the file's footer alone."""
    try:
        meta = pq.read_metadata(file).metadata or {}
        return ExportedFile(int(meta[b"danube.base_offset"]), int(meta[b"danube.last_offset"]),
                            int(meta[b"danube.records"]), int(meta[b"danube.record_bytes"]))
    except (KeyError, ValueError, OSError, pa.ArrowException) as exc:
        raise CorruptSegment(where, 0, f"not an exported segment ({type(exc).__name__}: {exc})") from None

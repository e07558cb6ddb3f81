"""One Spark task's read: a partition's offsets `[start, end)` as Arrow batches.

A reader (no durable subscription, no cursor the broker keeps) starts at `start` and
stops at `end`; the broker serves the offsets from its cache, its WAL or durable
segments, as it holds them. Offsets missing below the log's start were removed by
retention: lost data, which fails the task (`fail_on_data_loss`) or is logged and
skipped. Other missing offsets are not lost: the tail of a chunked message that began
in the previous range, or keys the compacted view dropped (`read_compacted`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa

from danube_zmq.client.client import DanubeClient
from danube_zmq.client.message import Message
from danube_zmq.client.reader import Reader
from danube_zmq.schemas.types import SchemaType
from danube_zmq.spark.offsets import Range
from danube_zmq.spark.options import SourceOptions
from danube_zmq.spark.schema_columns import value_decoder
from danube_zmq.transport.errors import FailedPrecondition, InvalidArgument, Timeout
from danube_zmq.transport.topic_name import parse_topic

__all__ = ["BATCH_BYTES", "BATCH_ROWS", "DataLoss", "SchemaValues", "arrow_schema", "read_range"]

log = logging.getLogger("danube_zmq.spark")

BATCH_ROWS = 10_000
BATCH_BYTES = 16 * 1024 * 1024  # an Arrow batch ends at this many payload bytes, or BATCH_ROWS rows
_POLL_S = 0.2  # how long a read waits before asking where the log stands
_DECODERS_MAX = 64  # schema versions a task keeps a decoder for


class DataLoss(FailedPrecondition):
    """Offsets a query was to read were removed before it read them."""


def arrow_schema(value_type: pa.DataType) -> pa.Schema:
    """What Spark expects of the batches: timestamps in microseconds, a map's entries
    named `entries`, every field nullable."""
    return pa.schema([
        ("key", pa.string()), ("value", value_type), ("topic", pa.string()), ("partition", pa.int32()),
        ("offset", pa.int64()), ("publish_time", pa.timestamp("us", tz="UTC")), ("producer_name", pa.string()),
        ("attributes", pa.map_(pa.string(), pa.string())),
    ])


class SchemaValues:
    """value_format=schema: each message's value decoded into the column's type, the
    type of `definition` (the version the query reads with). A message written with
    another version of the subject is decoded from it (Avro resolves the two)."""

    def __init__(self, schema_type: str, definition: bytes) -> None:
        self.schema_type, self.definition = schema_type, definition
        self._decoders: dict[bytes | None, Callable[[bytes], Any]] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_decoders": {}}  # closures stay where they are made

    def __call__(self, msg: Message) -> Any:
        writer = msg.schema.definition if msg.schema is not None else None
        decode = self._decoders.get(writer)
        if decode is None:
            if len(self._decoders) >= _DECODERS_MAX:
                self._decoders.clear()
            decode = self._decoders[writer] = value_decoder(SchemaType(self.schema_type), self.definition,
                                                            writer=writer)
        try:
            return decode(msg.payload)
        except InvalidArgument as exc:
            raise InvalidArgument(f"{msg.topic} offset {msg.offset}: its value does not decode with the"
                                  f" query's schema (value_format=schema): {exc}") from None


def read_range(options: SourceOptions, part: Range, value: SchemaValues | None,
               schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    """The range's messages in offset order, in batches of `BATCH_ROWS` rows or
    `BATCH_BYTES` payload bytes. `value` decodes a payload (value_format=schema), None
    keeps the bytes."""
    name = parse_topic(part.partition)
    base, index = name.base.full, name.partition_index
    client = options.connection.client("danube-spark-read")
    try:
        walk = _Walk(options, part, client.run(_reader(client.client, options, part)))
        while True:
            messages = client.run(walk.next_batch(BATCH_ROWS))
            if not messages:
                return
            yield _batch(messages, base, -1 if index is None else index, value, schema)
    finally:
        client.close()


async def _reader(client: DanubeClient, options: SourceOptions, part: Range) -> Reader:
    try:
        return await client.create_reader(part.partition, start=part.start, read_compacted=options.read_compacted)
    except InvalidArgument:
        # The log no longer holds `start` (retention removed it since the range was
        # planned): read from where it starts, and the walk names what was lost.
        return await client.create_reader(part.partition, start="earliest", read_compacted=options.read_compacted)


class _Walk:
    """Where the read stands in its range, and how it tells lost data from offsets
    that were never there to read."""

    def __init__(self, options: SourceOptions, part: Range, reader: Reader) -> None:
        self.options, self.part, self.reader = options, part, reader
        self.expected = part.start

    async def next_batch(self, rows: int, size: int = BATCH_BYTES) -> list[Message]:
        batch: list[Message] = []
        waited_since = time.monotonic()
        while self.expected < self.part.end and len(batch) < rows and size > 0:
            try:
                msg = await self.reader.read_next(_POLL_S)
            except Timeout:
                if await self._settled_without_message():
                    break
                if time.monotonic() - waited_since > self.options.read_timeout_s:
                    raise Timeout(f"{self.part.partition}: no message at offset {self.expected} within"
                                  f" {self.options.read_timeout_s:g} s while reading {self.part.start}.."
                                  f"{self.part.end - 1} (danube option read_timeout_ms)") from None
                continue
            waited_since = time.monotonic()
            if msg.offset < self.expected:
                continue  # read before (a chunked message's tail after a restart)
            if msg.offset > self.expected:
                await self._gap(min(msg.offset, self.part.end))
            if msg.offset >= self.part.end:
                self.expected = self.part.end
                break
            batch.append(msg)
            size -= len(msg.payload)
            self.expected = max(msg.chunk_offsets or (msg.offset,)) + 1
        return batch

    async def _settled_without_message(self) -> bool:
        """Nothing came: either the log lost what is left of the range, or the reader
        passed it without a message (the compacted view dropped the rest), or the
        message is yet to come (a broker restarting, a move)."""
        (bounds,) = (await self.reader.last_offsets()).values()
        log_start = bounds.log_start_offset or 0
        if not self.options.read_compacted:
            # The log has no holes: what the reader passed without a message is gone.
            log_start = max(log_start, bounds.cursor + 1)
        if log_start > self.expected:
            self._lost(min(log_start, self.part.end), log_start)
            return self.expected >= self.part.end
        if bounds.cursor >= self.part.end - 1:
            self.expected = self.part.end
            return True
        return False

    async def _gap(self, upto: int) -> None:
        """Offsets `expected..upto-1` did not come. Lost if the log starts above them;
        else never there to read (a compacted view, a chunked message's tail)."""
        if not self.options.read_compacted:
            (bounds,) = (await self.reader.last_offsets()).values()
            self._lost(upto, bounds.log_start_offset or 0)
        self.expected = upto

    def _lost(self, upto: int, log_start: int) -> None:
        if log_start > self.expected:
            lost_end = min(log_start, upto) - 1
            what = (f"{self.part.partition}: offsets {self.expected}..{lost_end} were removed by retention"
                    f" before the query read them (the log now starts at {log_start})")
            if self.options.fail_on_data_loss:
                raise DataLoss(what + "; danube option fail_on_data_loss=false skips them")
            log.warning("%s; skipped (fail_on_data_loss=false)", what)
        self.expected = upto


def _batch(messages: list[Message], topic: str, partition: int, value: SchemaValues | None,
           schema: pa.Schema) -> pa.RecordBatch:
    count = len(messages)
    return pa.RecordBatch.from_arrays([
        pa.array([m.key for m in messages], pa.string()),
        pa.array([m.payload for m in messages] if value is None else [value(m) for m in messages],
                 schema.field("value").type),
        pa.array([topic] * count, pa.string()),
        pa.array([partition] * count, pa.int32()),
        pa.array([m.offset for m in messages], pa.int64()),
        pa.array([m.publish_time * 1000 for m in messages], pa.timestamp("us", tz="UTC")),
        pa.array([m.producer_name for m in messages], pa.string()),
        pa.array([list(m.attributes.items()) for m in messages], pa.map_(pa.string(), pa.string())),
    ], schema=schema)

"""Topics as a Spark sink: `df.writeStream.format("danube")` and `df.write.format("danube")`.

Exactly once into topics, with producer deduplication: each task writes under the
producer name `{name}-{task}`, and its i-th row gets the sequence id
`batch_id * 2**32 + i`. A micro-batch that Spark replays after a failure (a task
retried, a driver restarted from its checkpoint) writes the same rows under the same
names and ids; rows whose ids the topic stored already are skipped, and the rest are
written once. `name` is the query's id, which survives restarts from its checkpoint
(or option `producer_name`). The target topics need the `deduplication` policy: without
it the sink refuses to start, unless option `exactly_once` is false (at least once).

A replayed task must see its rows in the same order, which Spark gives for plans
without a shuffle (a partition's range is read in offset order); after one (an
aggregation, a join) Spark gives no order, and option `row_order=sorted` makes each
task sort its rows (up to `sort_buffer_bytes`) before it writes them.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import BinaryType, IntegerType, LongType, MapType, StringType, StructType

from danube_zmq.client.client import DanubeClient
from danube_zmq.client.producer import Producer
from danube_zmq.client.routing import partition_for_key
from danube_zmq.spark.options import SinkOptions
from danube_zmq.transport.errors import (
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    ProducerBusy,
    ResourceExhausted,
)
from danube_zmq.transport.topic_name import parse_topic

__all__ = ["TopicBatchWriter", "TopicStreamWriter", "check_sink_schema"]

log = logging.getLogger("danube_zmq.spark")

ROWS_MAX = 1 << 32  # rows a task may write in one micro-batch: the low bits of a sequence id
_WINDOW = 5_000  # rows queued before the previous window's receipts are awaited
_BUSY_WAIT_S = 60.0  # longer than a broker's session timeout (5 s by default)
_COLUMNS = {"value": (BinaryType, StringType), "key": (StringType,), "topic": (StringType,),
            "attributes": (MapType,), "partition": (IntegerType, LongType)}


def check_sink_schema(schema: StructType, options: SinkOptions) -> None:
    """The columns the sink writes, with a clear error for any other."""
    names = {f.name: f.dataType for f in schema.fields}
    if "value" not in names:
        raise InvalidArgument(f"the danube sink needs a 'value' column (binary or string); the DataFrame has"
                              f" {', '.join(names) or 'none'}")
    for name, kind in names.items():
        if name not in _COLUMNS:
            raise InvalidArgument(f"the danube sink writes the columns value, key, topic, attributes and"
                                  f" partition; {name!r} is not one of them (select or drop it first)")
        strings = not isinstance(kind, MapType) or (isinstance(kind.keyType, StringType)
                                                    and isinstance(kind.valueType, StringType))
        if not isinstance(kind, _COLUMNS[name]) or not strings:
            expected = "map<string,string>" if name == "attributes" else " or ".join(t.typeName() for t in _COLUMNS[name])
            raise InvalidArgument(f"the danube sink's {name!r} column is {kind.simpleString()}, expected {expected}")
    if "topic" not in names and options.topic is None:
        raise InvalidArgument("the danube sink needs option('topic', '/ns/topic') or a 'topic' column")


@dataclass
class SinkCommit(WriterCommitMessage):  # type: ignore[misc]
    task: int
    written: int
    skipped: int  # stored by an earlier attempt of the same batch


def _commit(messages: list[SinkCommit | None], name: str, batch: int) -> None:
    skipped = sum(m.skipped for m in messages if m is not None)
    if skipped:
        log.info("danube sink %s batch %d: %d rows were stored by an earlier attempt and skipped",
                 name, batch, skipped)


class TopicStreamWriter(DataSourceStreamArrowWriter):  # type: ignore[misc]
    def __init__(self, options: SinkOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommit:
        context = TaskContext.get()
        batch = context.getLocalProperty("streaming.sql.batchId")
        query = context.getLocalProperty("sql.streaming.queryId")
        if batch is None or query is None:
            raise FailedPrecondition("the danube stream sink runs inside a streaming query's micro-batch")
        name = self.options.producer_name or f"spark-{query}"
        return _TaskWrite(self.options, name, int(batch), context.partitionId()).run(iterator)

    def commit(self, messages: list[SinkCommit | None], batchId: int) -> None:
        _commit(messages, self.options.producer_name or "of this query", batchId)


class TopicBatchWriter(DataSourceArrowWriter):  # type: ignore[misc]
    """A batch write: its name is `producer_name` (running the same write again then
    adds nothing) or a fresh one (a task retried adds nothing)."""

    def __init__(self, options: SinkOptions) -> None:
        self.options = options
        self.name = options.producer_name or f"spark-{secrets.token_hex(8)}"

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommit:
        return _TaskWrite(self.options, self.name, 0, TaskContext.get().partitionId()).run(iterator)

    def commit(self, messages: list[SinkCommit | None]) -> None:
        _commit(messages, self.name, 0)


class _TaskWrite:
    """One task's rows into their topics' partitions, one producer per partition topic."""

    def __init__(self, options: SinkOptions, name: str, batch: int, task: int) -> None:
        self.options, self.name, self.task = options, f"{name}-{task}", task
        self.base = batch * ROWS_MAX
        self.row = 0
        self.written = self.skipped = 0

    def run(self, batches: Iterator[pa.RecordBatch]) -> SinkCommit:
        if self.options.row_order == "sorted":
            batches = _sorted(batches, self.options.sort_buffer_bytes)
        client = self.options.connection.client("danube-spark-write")
        try:
            sends = _Sends(self, client.client)
            for batch in batches:
                client.run(sends.batch(batch))
            client.run(sends.close())
        finally:
            client.close()
        return SinkCommit(self.task, self.written, self.skipped)


def _sorted(batches: Iterator[pa.RecordBatch], bound: int) -> Iterator[pa.RecordBatch]:
    """The task's rows in one order whatever order they came in (`row_order=sorted`),
    held in memory up to `bound` bytes."""
    held: list[pa.RecordBatch] = []
    size = 0
    for batch in batches:
        size += batch.nbytes
        if size > bound:
            raise ResourceExhausted(f"a danube sink task holds more than sort_buffer_bytes ({bound}) to sort its"
                                    " rows (row_order=sorted): raise the option or spread the rows over more"
                                    " partitions")
        held.append(batch)
    if not held:
        return iter(())
    table = pa.Table.from_batches(held)
    if "attributes" in table.column_names:
        # A map cannot be sorted on: its items, sorted, as text can.
        text = [None if a is None else repr(sorted(a)) for a in table.column("attributes").to_pylist()]
        table = table.append_column("__attributes", pa.array(text, pa.string()))
    keys = [(c, "ascending") for c in table.column_names if c != "attributes"]
    ordered = table.sort_by(keys)
    if "__attributes" in ordered.column_names:
        ordered = ordered.drop_columns(["__attributes"])
    return iter(ordered.to_batches())


class _Sends:
    """The producers of one task and the receipts it waits for (at most two windows)."""

    def __init__(self, write: _TaskWrite, client: DanubeClient) -> None:
        self.write, self.client = write, client
        self.partitions: dict[str, list[str]] = {}
        self.producers: dict[str, Producer] = {}
        self.pending: list[asyncio.Future[Any]] = []

    async def batch(self, batch: pa.RecordBatch) -> None:
        columns = {name: batch.column(name).to_pylist() for name in batch.schema.names}
        values = columns["value"]
        none = [None] * len(values)
        keys, topics = columns.get("key", none), columns.get("topic", none)
        attributes, partitions = columns.get("attributes", none), columns.get("partition", none)
        for start in range(0, len(values), _WINDOW):
            window: list[asyncio.Future[Any]] = []
            for i in range(start, min(start + _WINDOW, len(values))):
                await self._row(window, values[i], keys[i], topics[i], attributes[i], partitions[i])
            await self._settle(window)

    async def _row(self, window: list[asyncio.Future[Any]], value: bytes | str | None, key: str | None,
                   topic: str | None, attributes: list[tuple[str, str]] | None, partition: int | None) -> None:
        write = self.write
        sequence = write.base + write.row
        write.row += 1
        if write.row > ROWS_MAX:
            raise FailedPrecondition(f"a danube sink task writes at most {ROWS_MAX} rows a micro-batch:"
                                     " repartition the DataFrame")
        if value is None:
            raise InvalidArgument("the danube sink's 'value' column is null in a row: a message needs a value"
                                  " (an empty one is b'')")
        target = await self._partition(topic or write.options.topic, key, partition, sequence)
        producer = await self._producer(target)
        if write.options.exactly_once and sequence <= producer.last_sequence_id:
            write.skipped += 1
            return
        window.append(producer.send_nowait(value, key=key, attributes=dict(attributes) if attributes else None,
                                           sequence_id=sequence if write.options.exactly_once else None))
        write.written += 1

    async def _partition(self, topic: str | None, key: str | None, partition: int | None, sequence: int) -> str:
        if topic is None:
            raise InvalidArgument("a row of the danube sink has a null 'topic' and no option('topic') is set")
        names = self.partitions.get(topic)
        if names is None:
            parse_topic(topic)
            try:
                names = await self.client.get_partitions(topic)
            except NotFound:
                names = [topic]  # the producer creates it, reliable and not partitioned, as the broker allows
            self.partitions[topic] = names
        if partition is not None:
            if names == [topic]:
                raise InvalidArgument(f"{topic} is not partitioned: the danube sink's 'partition' is null for it")
            if not 0 <= partition < len(names):
                raise InvalidArgument(f"the danube sink's 'partition' {partition} is not a partition of {topic}"
                                      f" (0..{len(names) - 1})")
            return names[partition]
        if len(names) == 1:
            return names[0]
        # By key as the client routes, else by row: the same row goes to the same partition when replayed.
        return names[partition_for_key(key, len(names)) if key is not None else sequence % len(names)]

    async def _producer(self, topic: str) -> Producer:
        producer = self.producers.get(topic)
        if producer is None:
            options = self.write.options
            deadline = time.monotonic() + _BUSY_WAIT_S
            while True:
                try:
                    producer = await self.client.create_producer(
                        topic, name=self.write.name, dispatch="reliable", batch_messages_max=options.batch_messages_max,
                        batch_delay_ms=options.batch_delay_ms, compression=options.compression,
                        chunking=options.chunking, pending_messages_max=2 * _WINDOW)
                    break
                except ProducerBusy:
                    # An earlier attempt of this task (on an executor that died) holds the
                    # name until its session times out on the broker.
                    if time.monotonic() > deadline:
                        raise
                    await asyncio.sleep(0.5)
            self.producers[topic] = producer
            if options.exactly_once and not producer.deduplication:
                raise FailedPrecondition(
                    f"{topic} does not deduplicate, so the danube sink cannot write it exactly once: turn its"
                    " deduplication policy on (danube admin topics policies set TOPIC --deduplication true, or on"
                    " its namespace), or set option('exactly_once', 'false') for at-least-once writes")
        return producer

    async def _settle(self, window: list[asyncio.Future[Any]]) -> None:
        previous, self.pending = self.pending, window
        if previous:
            await asyncio.gather(*previous)

    async def close(self) -> None:
        await self._settle([])
        for producer in self.producers.values():
            await producer.close()

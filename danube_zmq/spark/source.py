"""Topics as a Spark source: `spark.readStream.format("danube")` (micro-batches) and
`spark.read.format("danube")` (one batch between two offsets).

The driver asks where each partition's log ends (`Heads`) and plans ranges; each
range is one Spark task, read on an executor (`ranges.read_range`). The source holds
no durable subscription and moves no cursor the broker keeps: the query's position is
its offsets in Spark's checkpoint, so a restarted query reads on from the last
committed micro-batch, and a replayed one reads the same offsets again.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow

from danube_zmq.client.reader import Reader
from danube_zmq.spark.offsets import EARLIEST, LATEST, Offsets, Range, cap, ranges
from danube_zmq.spark.options import SourceOptions
from danube_zmq.spark.ranges import SchemaValues, read_range
from danube_zmq.transport.errors import InvalidArgument, NotFound, Timeout

__all__ = ["TopicBatchReader", "TopicStreamReader"]


@dataclass(frozen=True)
class _RangePartition(InputPartition):  # type: ignore[misc]
    range: Range


class Heads:
    """Where each partition's log ends, asked through one reader per partition kept
    open on the driver (a reader at `latest` holds no cursor and costs the broker one
    idle subscription)."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self.client = options.connection.client("danube-spark-driver")
        self._readers: dict[str, Reader] = {}

    def topics(self) -> list[str]:
        """The source's topics; with `topics_pattern`, those of its namespace whose name
        matches, as they are now (new ones join)."""
        if self.options.pattern is None:
            return list(self.options.topics)
        namespace, regex = self.options.pattern
        return [t for t in self.client.get_topics(namespace) if regex.fullmatch(t.rsplit("/", 1)[1])]

    def partitions(self) -> list[str]:
        """The partition topics of the source's topics, as they are now (a topic may
        have gained partitions)."""
        found = []
        for topic in self.topics():
            try:
                found.extend(self.client.get_partitions(topic))
            except NotFound:
                if self.options.pattern is None:
                    raise
                # Deleted since it was listed: it no longer matches.
        return sorted(found)

    def now(self) -> Offsets:
        """The offset after each partition's last message."""
        return self.client.run(self._now(self.partitions()))

    async def _now(self, partitions: list[str]) -> Offsets:
        heads: Offsets = {}
        for partition in partitions:
            reader = self._readers.get(partition)
            if reader is None:
                reader = await self.client.client.create_reader(partition, start="latest", receiver_queue_size=1)
                self._readers[partition] = reader
            (bounds,) = (await reader.last_offsets()).values()
            heads[partition] = bounds.offset + 1
        return heads

    def first(self, heads: Offsets, publish_time_ms: int | None = None) -> Offsets:
        """Each partition's first offset still in its log (retention may have removed
        the ones before), or the first published at or after `publish_time_ms`; its
        head when it holds none."""
        return self.client.run(self._first(heads, publish_time_ms))

    async def _first(self, heads: Offsets, publish_time_ms: int | None) -> Offsets:
        found: Offsets = {}
        for partition, head in heads.items():
            start = {"start": "earliest"} if publish_time_ms is None else {"start_publish_time_ms": publish_time_ms}
            async with await self.client.client.create_reader(partition, receiver_queue_size=1, **start) as reader:
                if not await reader.has_message_available():
                    found[partition] = head
                    continue
                try:
                    first = await reader.read_next(self.options.read_timeout_s)
                except Timeout:
                    raise Timeout(f"{partition} holds messages, yet none came within {self.options.read_timeout_s:g}"
                                  " s (danube option read_timeout_ms)") from None
                found[partition] = min(first.offset, head)
        return found

    def close(self) -> None:
        self.client.close()


def _start(options: SourceOptions, heads: Heads) -> Offsets:
    now = heads.now()
    if options.starting_timestamp_ms is not None:
        return heads.first(now, options.starting_timestamp_ms)
    if options.starting is not None:
        unknown = sorted(set(options.starting) - set(now))
        if unknown:
            raise InvalidArgument(f"danube option 'starting_offsets' names {', '.join(unknown)}, which are not"
                                  f" partitions of the source's topics ({', '.join(now) or 'none'})")
    wanted = {p: (options.starting or {}).get(p, options.starting_default) for p in now}
    first = heads.first({p: now[p] for p, w in wanted.items() if w == EARLIEST})
    return {p: now[p] if w == LATEST else first[p] if w == EARLIEST else w for p, w in wanted.items()}


class _RangeReads:
    """What both readers do on the executors: read one range. Pickled to them without
    the driver's client."""

    options: SourceOptions
    value: SchemaValues | None
    arrow: pa.Schema
    _heads: Heads | None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_heads": None}

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if isinstance(partition, _RangePartition):  # with no range to read Spark asks for a plain InputPartition
            yield from read_range(self.options, partition.range, self.value, self.arrow)

    @property
    def heads(self) -> Heads:
        if self._heads is None:
            self._heads = Heads(self.options)
        return self._heads


class TopicBatchReader(_RangeReads, DataSourceReader):  # type: ignore[misc]
    """`spark.read`: from `starting_offsets` to `ending_offsets` (latest: the heads
    when the read is planned)."""

    def __init__(self, options: SourceOptions, value: SchemaValues | None, arrow: pa.Schema) -> None:
        self.options, self.value, self.arrow, self._heads = options, value, arrow, None

    def partitions(self) -> list[InputPartition]:
        try:
            start = _start(self.options, self.heads)
            now = self.heads.now()
            ending = self.options.ending or {}
            end = {p: now[p] if ending.get(p, LATEST) == LATEST else max(start[p], min(ending[p], now[p]))
                   for p in start}
        finally:
            self.heads.close()
            self._heads = None
        return [_RangePartition(r) for r in ranges(start, end)]


class TopicStreamReader(_RangeReads, DataSourceStreamReader, SupportsTriggerAvailableNow):  # type: ignore[misc]
    """`spark.readStream`: each micro-batch reads from where the last one ended to the
    heads, within `max_offsets_per_trigger`."""

    def __init__(self, options: SourceOptions, value: SchemaValues | None, arrow: pa.Schema) -> None:
        self.options, self.value, self.arrow, self._heads = options, value, arrow, None
        self._target: Offsets | None = None  # Trigger.AvailableNow: what there was when the query started

    def initialOffset(self) -> dict[str, int]:
        return _start(self.options, self.heads)

    def getDefaultReadLimit(self) -> ReadLimit:
        limit = self.options.max_offsets_per_trigger
        return ReadAllAvailable() if limit is None else ReadMaxRows(limit)

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self.heads.now()

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        heads = self.heads.now()
        if self._target is not None:
            heads = {p: min(h, self._target.get(p, h)) for p, h in heads.items()}
        end = cap(start, heads, limit.max_rows if isinstance(limit, ReadMaxRows) else None)
        # A partition the query has not read yet (a topic gained partitions) joins at its
        # first offset, with nothing to read in this micro-batch: the next reads from there.
        new = {p: h for p, h in heads.items() if p not in start}
        return end | self.heads.first(new) if new else end

    def reportLatestOffset(self) -> dict[str, int] | None:
        return self.heads.now()

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[InputPartition]:
        return [_RangePartition(r) for r in ranges(start, end)]

    def commit(self, end: dict[str, int]) -> None:
        """Nothing to do: the broker keeps nothing of this query's."""

    def stop(self) -> None:
        if self._heads is not None:
            self._heads.close()
            self._heads = None

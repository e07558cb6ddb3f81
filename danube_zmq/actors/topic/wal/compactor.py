"""One compaction of a topic's log into a new compacted ledger, run in a worker thread.

Two phases, as Pulsar's TwoPhaseCompactor: phase 1 reads the previous ledger (if any)
then the log from `start` up to `horizon`, and learns each live key's latest offset
(`CompactionKeys`); phase 2 reads the same records again and writes those the table
keeps into a new ledger for `horizon` (`LedgerWriter`), then commits it. Reading twice
instead of holding the records keeps the memory to one dict entry per live key, which
`keys_max` bounds.

Pure apart from the ledger files: the log comes in as a `read(position, max_bytes)`
function, so the topic decides how it is read (its WAL, its durable segments) and a
test can feed batches from a list. On any exception, the new ledger's `.tmp` is
deleted and nothing else changed; the previous ledger is only read (its owner removes
it once the new one is in use).
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from danube_zmq.actors.topic.compaction import CompactionKeys
from danube_zmq.storage.wal.compacted import Ledger, LedgerWriter
from danube_zmq.storage.wal.format import RecordBatch
from danube_zmq.transport.errors import InternalError

# The thread pauses after each batch (64 KiB of records, about 2 ms of work): the
# GIL goes to the broker's event loop, which otherwise waits out the 5 ms switch interval
# at every socket or fsync call. Measured with 1,000,000 messages over 10,000 keys
# (benchmarks/compaction.py): without it a producer sending one message at a time fell
# from 900 to 47 msg/s during the compaction (p99 42 ms); with it 401 msg/s (p99 5 ms),
# the compaction taking 8.9 s instead of 4.7.
_PAUSE_S = 0.0005


@dataclass(frozen=True, slots=True, kw_only=True)
class CompactionResult:
    """A committed ledger: `path` holds the compacted view of offsets below `horizon`.
    `records_read` counts the records phase 1 read (previous ledger and log),
    `records_kept` those written, `keys` the live keys, `bytes` the file's size."""

    path: Path
    horizon: int
    records_read: int
    records_kept: int
    keys: int
    bytes: int


def compact(
    read: Callable[[int, int], RecordBatch],
    *,
    start: int,
    horizon: int,
    previous: Ledger | None,
    directory: Path,
    keys_max: int,
    batch_bytes: int = 1 << 16,
) -> CompactionResult:
    """Compact `previous` (the view below its horizon) and the log's records
    `start .. horizon - 1` into a new ledger for `horizon` in `directory`.

    `read(position, max_bytes)` returns log records at offsets >= position, consecutive,
    empty when the log holds no more. Raises TooManyKeys past `keys_max` live keys, and
    InternalError if the log's records changed between the two phases.
    """
    assert previous is None or previous.horizon <= start, (previous.horizon if previous else None, start)
    assert start <= horizon, (start, horizon)
    keys = CompactionKeys(keys_max)
    records_read = 0
    for batch in _records(read, previous, start=start, horizon=horizon, batch_bytes=batch_bytes):
        keys.add(batch.offsets, batch.keys, batch.payloads)
        records_read += len(batch)
    records_seen = keyed_kept = 0
    with LedgerWriter(directory, horizon) as writer:
        for batch in _records(read, previous, start=start, horizon=horizon, batch_bytes=batch_bytes):
            keeps = keys.keeps
            mask = [keeps(offset, key, payload) for offset, key, payload in zip(
                batch.offsets, batch.keys, batch.payloads, strict=True)]
            writer.append(batch, mask)
            records_seen += len(batch)
            keyed_kept += sum(kept and key is not None for kept, key in zip(mask, batch.keys, strict=True))
        # Each live key's latest record is written exactly once, if phase 2 read what phase 1 read.
        if records_seen != records_read or keyed_kept != len(keys):
            raise InternalError(f"compaction to {horizon}: the log changed between the phases (read {records_read} then"
                                f" {records_seen} records; {keyed_kept} keyed records kept for {len(keys)} keys)")
        path = writer.commit()
    return CompactionResult(path=path, horizon=horizon, records_read=records_read, records_kept=writer.records,
                            keys=len(keys), bytes=writer.bytes)


def _records(read: Callable[[int, int], RecordBatch], previous: Ledger | None, *, start: int, horizon: int,
             batch_bytes: int) -> Iterator[RecordBatch]:
    """The previous ledger's records, then the log's from `start` below `horizon`, in
    offset order, in batches."""
    if previous is not None:
        for batch in previous.records(batch_bytes):
            yield batch
            time.sleep(_PAUSE_S)
    position = start
    while position < horizon:
        batch = read(position, batch_bytes)
        if not batch:
            return
        assert batch.offsets[0] >= position, f"read({position}) returned offset {batch.offsets[0]}"
        below = bisect_left(batch.offsets, horizon)
        if below < len(batch):
            if below:
                yield batch.head(below)
            return
        yield batch
        time.sleep(_PAUSE_S)
        # Past the batch's last record, not `position + len`: the log may have a gap.
        position = batch.offsets[-1] + 1


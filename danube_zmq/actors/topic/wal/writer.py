"""What runs in a reliable topic's WAL worker thread, off the actor's loop: a flush's
write (`write_flush`), the fsync (`timed_sync`), the cursor tail's publication
(`publish_cursor_tail`), and the hand-back of a flush's outcome to the loop
(`to_loop`). The log is the flush's thread's until the flush's `FlushDone`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
from collections.abc import Callable

from danube_zmq.actors.metrics import METRICS
from danube_zmq.storage.durable import DurableStore, cursors_key
from danube_zmq.storage.wal import WalLog
from danube_zmq.transport.errors import DanubeError

log = logging.getLogger("danube_zmq.topic")

# A flush's publication of the cursor tail failed: tried again at the next flush or stop.
PUBLISH_FAILED = -1


def timed_sync(wal: WalLog) -> None:
    """`wal.sync()`, its time observed (in the flush's worker thread)."""
    started = time.perf_counter()
    wal.sync()
    METRICS.wal_fsync_latency.observe(time.perf_counter() - started)


def write_flush(wal: WalLog, chunks: list[tuple[bytes, int]], checkpoints: list[tuple[str, bytes | None]],
           settled: list[str], sync: bool, seal: bool, publish: DurableStore | None, published: list[int | None],
           topic: str) -> None:
    """One flush, in the WAL's worker thread: the batches, then the checkpoints."""
    try:
        for encoded, count in chunks:
            wal.append(encoded, count)
        wal.append_checkpoints(checkpoints)
        wal.settle_deletions(settled)
        if sync:
            timed_sync(wal)
        if seal:  # each flush its own segment, uploaded at once: the dead-disk loss window
            wal.seal_active()
    except OSError:
        # Cut back to the last successful fsync: pages whose write-back failed are
        # never trusted (the handler reopens the log if even this fails).
        try:
            wal.rollback_unsynced()
        except OSError:
            log.exception("%s: WAL rollback after a failed flush failed", wal.directory)
        raise
    if publish is not None:
        try:
            published.append(publish_cursor_tail(wal, publish, topic))
        except (OSError, DanubeError) as exc:  # the cursors only: the flush stands
            log.error("%s: cursor checkpoints not published to the durable store (%s); tried again"
                      " at the next flush", topic, exc)
            published.append(PUBLISH_FAILED)


def to_loop(loop: asyncio.AbstractEventLoop, fn: Callable[[concurrent.futures.Future[None]], None],
             written: concurrent.futures.Future[None]) -> None:
    """Run `fn(written)` on `loop` (from the write thread); a loop already closed (the
    broker stopped while the write ran) has nobody left to tell."""
    if not loop.is_closed():
        try:
            loop.call_soon_threadsafe(fn, written)
        except RuntimeError:  # closed meanwhile
            pass


def publish_cursor_tail(wal: WalLog, store: DurableStore, topic: str) -> int | None:
    """Publish the active segment as it is when it holds cursor checkpoints and no
    record (it cannot be sealed: its successor would take its base offset), under
    `cursors_key`; the base offset published, or None when the segment holds records
    (sealed and uploaded, it carries its checkpoints itself). Runs in the WAL's thread."""
    info = wal.segments()[-1]
    if info.next_offset != info.base_offset or info.size_bytes == 0:
        return None
    store.publish(info.path, cursors_key(topic, info.base_offset))
    return info.base_offset

"""Keeps CPython's full garbage collections short on a broker that holds a large state.

A generation-2 collection scans every object the collector tracks, on the event loop:
with the metadata of 10,000 partitions and their topic actors in memory one took
570 ms (`benchmarks/metadata_scale.py`), during which no admin Ping was answered, no
Raft heartbeat sent and no lease renewed; the pauses grow with the state. Almost all
of that state is long-lived (store entries, topic actors) and almost none of it is
cyclic garbage: a refcount frees it when it goes.

`GcPacer` moves every object that survived to the permanent generation
(`gc.freeze()`) every `FREEZE_INTERVAL_S`, so a full collection scans only what is
younger than that. The price: a reference cycle among frozen objects that becomes
garbage later is not collected until the next thaw; every `THAW_INTERVAL_S` the
pacer unfreezes everything and runs one full collection (one pause of the old length,
that often, instead of one at each quarter of growth).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import time

log = logging.getLogger("danube_zmq.gc")

FREEZE_INTERVAL_S = 1.0
THAW_INTERVAL_S = 3600.0


class GcPacer:
    """One task per broker process: `start()` after the state is loaded, `stop()` last."""

    def __init__(self, *, freeze_interval_s: float = FREEZE_INTERVAL_S,
                 thaw_interval_s: float = THAW_INTERVAL_S) -> None:
        self.freeze_interval_s = freeze_interval_s
        self.thaw_interval_s = thaw_interval_s
        self.freezes = 0
        self.thaws = 0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        gc.freeze()  # what the start loaded (the metadata store's state) is long-lived
        self.freezes += 1
        self._task = asyncio.get_running_loop().create_task(self._run(), name="gc pacing")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        thawed_at = time.monotonic()
        while True:
            await asyncio.sleep(self.freeze_interval_s)
            if time.monotonic() - thawed_at >= self.thaw_interval_s:
                thawed_at = time.monotonic()
                gc.unfreeze()
                started = time.perf_counter()
                collected = gc.collect()
                self.thaws += 1
                log.info("full collection after a thaw: %d objects freed in %.0f ms", collected,
                         (time.perf_counter() - started) * 1000)
            gc.freeze()
            self.freezes += 1

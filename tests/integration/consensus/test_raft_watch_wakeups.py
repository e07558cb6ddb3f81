"""Watches wake for changes under their prefix: a burst of writes elsewhere costs a
watcher of a quiet prefix nothing (on the Raft leader every watch woke at every apply,
scanned the new events and found none: a share of the CPU of every write)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from danube_zmq.consensus.metadata_store import embedded_store
from danube_zmq.consensus.state_machine import WatchEvent

_DEADLINE_S = 30.0  # generous: the machine may be slow
_WRITES = 50


async def test_a_watch_of_a_quiet_prefix_is_not_woken_by_writes_elsewhere(tmp_path: Path) -> None:
    """A watch of `/quiet/` while 50 puts (each its own apply) go to `/busy/`, then one
    put under `/quiet/`: the watch yields exactly that event, and looked for events
    under its prefix at most a few times, not once per apply."""
    async with embedded_store(tmp_path / "meta") as store:
        state = store.peer.state
        events_since = state.events_since
        scans: list[str] = []

        def counting(prefix: str, revision: int) -> list[WatchEvent]:
            scans.append(prefix)
            return events_since(prefix, revision)

        state.events_since = counting  # type: ignore[method-assign]
        seen: list[WatchEvent] = []

        async def watch() -> None:
            async for event in store.watch("/quiet/", store.local_revision()):
                seen.append(event)
                return

        watcher = asyncio.create_task(watch())
        await asyncio.sleep(0)  # the watch is waiting before the writes start
        async with asyncio.timeout(_DEADLINE_S):
            for i in range(_WRITES):
                await store.put(f"/busy/{i}", b"x")
            await store.put("/quiet/one", b"y")
            await watcher
        assert [e.key for e in seen] == ["/quiet/one"]
        quiet_scans = scans.count("/quiet/")
        assert quiet_scans <= 3, quiet_scans


async def test_a_waiting_watch_ends_when_the_store_stops(tmp_path: Path) -> None:
    """A watch waiting on a quiet prefix is woken by the stop (and raises), not left
    waiting for a change that will never come."""
    store = embedded_store(tmp_path / "meta")
    await store.__aenter__()
    outcome: list[Any] = []

    async def watch() -> None:
        try:
            async for _ in store.watch("/quiet/", store.local_revision()):
                pass
        except Exception as exc:
            outcome.append(exc)

    watcher = asyncio.create_task(watch())
    await asyncio.sleep(0)
    await store.put("/busy/0", b"x")
    await store.__aexit__(None, None, None)
    async with asyncio.timeout(_DEADLINE_S):
        await watcher
    assert outcome and type(outcome[0]).__name__ == "Unavailable", outcome

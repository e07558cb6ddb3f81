"""A task writing to the metadata store that is cancelled ends cancelled, even when the
write applied just before the cancel. Python 3.11's `asyncio.wait_for` returns the
result instead when the awaited future is already done as the cancel arrives: the
cancel was swallowed, and `ActorSystem.stop`, which cancels an actor's task and waits
for it, hung for ever on a cursor flusher whose timer write had just applied
(`test_cursor_flusher.py::test_what_the_store_refused_is_written_at_the_next_timer`
hung about 1 run in 10 at its teardown)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from danube_zmq.consensus.metadata_store import embedded_store


def test_a_write_cancelled_as_it_applies_ends_cancelled(tmp_path: Path) -> None:
    """A `put` is cancelled the moment its value is seen applied in the local replica
    (its proposal's future is resolved then, its task not resumed yet): the task ends
    cancelled, not with the write's result; the value stays written."""

    async def run() -> None:
        async with embedded_store(tmp_path) as store:
            writer = asyncio.create_task(store.put("/k", b"v"))
            while store.local_get("/k") is None:
                assert not writer.done(), f"the put ended before it was seen applied: {writer}"
                await asyncio.sleep(0)
            writer.cancel()
            await asyncio.gather(writer, return_exceptions=True)
            assert writer.cancelled(), "the cancel was swallowed: the put returned its result"
            value = store.local_get("/k")
            assert value is not None and value.value == b"v"

    asyncio.run(run())


def test_a_linearizable_read_cancelled_as_it_is_confirmed_ends_cancelled(tmp_path: Path) -> None:
    """The same for a read barrier: cancelled once its read index is confirmed but
    before its task resumes, it ends cancelled."""

    async def run() -> None:
        async with embedded_store(tmp_path) as store:
            await store.put("/k", b"v")
            pending = store.peer._reads  # request id -> its future, popped as the index is confirmed
            reader = asyncio.create_task(store.peer.read_barrier())
            while not pending:
                await asyncio.sleep(0)
            while pending:
                assert not reader.done(), f"the read ended before its index was confirmed: {reader}"
                await asyncio.sleep(0)
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)
            assert reader.cancelled(), "the cancel was swallowed: the read returned its index"

    asyncio.run(run())

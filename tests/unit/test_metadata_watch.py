"""`RaftMetadataStore.watch` over a state machine whose history is short: the watch
logic is the real one; the peer around it is a stand-in that applies commands in log
order and wakes the watcher after each, as the Raft shell does."""

from __future__ import annotations

import asyncio

from danube_zmq.consensus.metadata_store import RaftMetadataStore
from danube_zmq.consensus.state_machine import MetadataStateMachine, Put, encode_command


class AppliedLog:
    """What `watch` reads of a peer: its applied state, whether it runs, and a wake-up
    after every change."""

    def __init__(self, history_events_max: int) -> None:
        self.state = MetadataStateMachine(history_events_max=history_events_max)
        self.running = True
        self.node_id = 1
        self._changed = asyncio.Event()
        self._index = 0

    def apply(self, key: str) -> None:
        self._index += 1
        self.state.apply(self._index, encode_command(Put(key=key, value=b"v")))
        self._changed.set()

    async def wait_changed(self, timeout: float | None = None) -> None:
        await self._changed.wait()
        self._changed.clear()


def test_a_watch_on_a_quiet_prefix_survives_writes_elsewhere() -> None:
    """A watcher of `/quiet/` while 50 writes go to `/busy/`, with a history of 8
    events: it has seen every revision up to now, so it must neither fall behind the
    history (a `Compacted` makes its owner re-read the whole prefix: the broker's
    assignment watch re-listed every assignment) nor scan the same events again each
    time; the one later write under `/quiet/` arrives."""

    async def run() -> list[str]:
        log = AppliedLog(history_events_max=8)
        store = RaftMetadataStore(log)  # type: ignore[arg-type]
        seen: list[str] = []

        async def watch() -> None:
            async for event in store.watch("/quiet/"):
                seen.append(event.key)

        task = asyncio.create_task(watch())
        await asyncio.sleep(0)
        for i in range(50):
            log.apply(f"/busy/{i}")
            await asyncio.sleep(0)  # the watcher runs after each change, as it would
        log.apply("/quiet/one")
        for _ in range(10):
            await asyncio.sleep(0)
        assert not task.done(), task.exception() if task.done() else None
        task.cancel()
        return seen

    assert asyncio.run(run()) == ["/quiet/one"]

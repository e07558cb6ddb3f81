"""The leader's task-free proposal (`RaftPeer.propose_then`, `RaftMetadataStore.put_then`,
the admin gateway's path for a plain put): the callback gets the applied value, a
refusal, a timeout or the peer's stop, exactly once, and nothing is left behind."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from danube_zmq.consensus.metadata_store import embedded_store
from danube_zmq.consensus.state_machine import Put, VersionedValue
from danube_zmq.transport.errors import DanubeError, Timeout, Unavailable

_DEADLINE_S = 30.0


async def _outcome(outcomes: list[Any]) -> Any:
    async with asyncio.timeout(_DEADLINE_S):
        while not outcomes:
            await asyncio.sleep(0.005)
    await asyncio.sleep(0.05)  # a second call would show up here
    assert len(outcomes) == 1, outcomes
    return outcomes[0]


async def test_a_put_without_a_task_answers_the_applied_value_once(tmp_path: Path) -> None:
    """The callback gets the value as the state holds it, and the peer keeps no entry for it."""
    async with embedded_store(tmp_path / "raft") as store:
        outcomes: list[VersionedValue | DanubeError] = []
        assert store.put_then("/a", b"1", outcomes.append)
        value = await _outcome(outcomes)
        assert isinstance(value, VersionedValue) and value.value == b"1"
        assert store.local_get("/a") == value
        peer = store.peer
        assert not peer._proposals and not peer._by_index and not peer._appended


async def test_a_put_without_a_task_times_out_and_leaves_nothing_behind(tmp_path: Path) -> None:
    """A proposal that never commits (its event is lost here) ends in `Timeout` after the
    peer's request timeout, and its bookkeeping is gone."""
    async with embedded_store(tmp_path / "raft") as store:
        peer = store.peer
        peer.request_timeout_s = 0.2
        peer._enqueue = lambda event: None  # type: ignore[method-assign]
        outcomes: list[Any] = []
        assert peer.propose_then(Put(key="/a", value=b"1"), outcomes.append)
        assert isinstance(await _outcome(outcomes), Timeout)
        assert not peer._proposals and not peer._by_index and not peer._appended


async def test_a_put_without_a_task_pending_at_stop_is_answered_unavailable(tmp_path: Path) -> None:
    """Stopping the peer answers what it still holds: the caller is never left waiting."""
    store = embedded_store(tmp_path / "raft")
    await store.start()
    peer = store.peer
    peer._enqueue = lambda event: None  # type: ignore[method-assign]
    outcomes: list[Any] = []
    assert peer.propose_then(Put(key="/a", value=b"1"), outcomes.append)
    await store.stop()
    assert isinstance(await _outcome(outcomes), Unavailable)


async def test_a_stopped_peer_refuses_a_put_without_a_task_so_the_caller_takes_the_other_path(tmp_path: Path) -> None:
    """False, and the callback is never called: the gateway then answers through `put`."""
    store = embedded_store(tmp_path / "raft")
    await store.start()
    await store.stop()
    outcomes: list[Any] = []
    assert not store.put_then("/a", b"1", outcomes.append)
    await asyncio.sleep(0.05)
    assert outcomes == []

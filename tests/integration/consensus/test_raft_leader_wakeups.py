"""When the write thread wakes a leader's loop for the end of its own append: only when a
commit waits for that copy. Against two hand-driven followers on real sockets
(`FakeFollowers`: node 2 holds its acknowledgement of the marked entry until released,
node 3 never acknowledges it), with ticks stopped once the leader is settled, so every
round the loop steps is one something woke it for."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from danube_zmq.consensus.peer import RaftPeer
from danube_zmq.consensus.raft import LogPersisted, RaftConfig
from danube_zmq.consensus.raft.messages import AppendEntriesResponse
from danube_zmq.consensus.state_machine import Put
from tests.integration.consensus.test_raft_leader_commit import _MARKER, FakeFollowers, _free_port

_DEADLINE_S = 30.0  # generous: the machine may be slow


async def _settled_leader(tmp_path: Path, followers: FakeFollowers) -> RaftPeer:
    listen = f"tcp://127.0.0.1:{_free_port()}"
    config = RaftConfig(node_id=1, election_ticks_min=2, election_ticks_max=4)
    leader = RaftPeer(1, tmp_path / "leader", listen, {1: listen, **followers.addresses}, config, tick_ms=100)
    followers.start(listen)
    await leader.start()
    async with asyncio.timeout(_DEADLINE_S):
        # Elected, the members' addresses published and applied.
        while (not leader.is_leader or len(leader._book) < 3
               or leader.state.last_applied_index < leader._node.last_index):
            await asyncio.sleep(0.01)
    leader.tick_s = 3600.0  # no more ticks (after the one already waiting, if any)
    await asyncio.sleep(0.3)
    return leader


def _watch_rounds(leader: RaftPeer) -> list[list[Any]]:
    """Every round the loop steps from now on, as its list of events."""
    rounds: list[list[Any]] = []
    step_batch = leader._step_batch

    async def watched(events: list[Any]) -> None:
        rounds.append(list(events))
        await step_batch(events)

    leader._step_batch = watched  # type: ignore[method-assign]
    return rounds


def _around_marked_append(leader: Any, *, before: Callable[[], None] | None = None,
                          after: Callable[[], None] | None = None) -> None:
    """Call `before()` / `after()` around the leader's log append of the marked entry
    (on its write thread)."""
    store = leader._store
    assert store is not None
    append = store.append

    def watched(entries: Any, **kwargs: Any) -> Any:
        marked = any(_MARKER in e.data for e in entries)
        if marked and before is not None:
            before()
        out = append(entries, **kwargs)
        if marked and after is not None:
            after()
        return out

    store.append = watched


def _is_ack(event: Any) -> bool:
    return type(getattr(event, "message", None)) is AppendEntriesResponse


async def test_the_end_of_the_leaders_own_append_wakes_no_round_while_no_follower_acknowledged(
        tmp_path: Path) -> None:
    """No follower holds the entry yet: its fsync returning commits nothing, so the write
    thread does not wake the loop for it (before, it was a round of its own with only
    `LogPersisted`, on every write). The acknowledgement's round then commits it."""
    followers = FakeFollowers()
    try:
        leader = await _settled_leader(tmp_path, followers)
        synced = threading.Event()
        _around_marked_append(leader, after=synced.set)
        rounds = _watch_rounds(leader)
        proposal = asyncio.ensure_future(leader.propose(Put(key="/held", value=_MARKER), timeout=_DEADLINE_S))
        async with asyncio.timeout(_DEADLINE_S):
            while not synced.is_set():
                await asyncio.sleep(0.01)
        await asyncio.sleep(0.3)  # time for any wake-up to come and be stepped
        after_sync = rounds[1:]  # rounds[0] stepped the proposal
        assert rounds and not any(all(type(e) is LogPersisted for e in r) for r in after_sync), rounds
        assert not proposal.done()
        followers.release.set()
        async with asyncio.timeout(_DEADLINE_S):
            await proposal
        committing = rounds[-1]
        assert any(_is_ack(e) for e in committing) and any(type(e) is LogPersisted for e in committing), rounds
    finally:
        await leader.stop()
        followers.close()


async def test_the_end_of_the_leaders_own_append_wakes_the_loop_when_a_commit_waits_for_it(
        tmp_path: Path) -> None:
    """A follower's acknowledgement is stepped before the leader's own fsync returns: the
    commit then waits only for that copy, and the write thread wakes the loop for it (no
    tick, no other message comes to step it with)."""
    followers = FakeFollowers()
    followers.release.set()  # node 2 acknowledges the marked entry at once
    try:
        leader = await _settled_leader(tmp_path, followers)
        acked = threading.Event()

        def acknowledged_first() -> None:
            assert acked.wait(_DEADLINE_S)  # the acknowledgement was stepped first

        _around_marked_append(leader, before=acknowledged_first)
        rounds = _watch_rounds(leader)
        step_batch = leader._step_batch

        async def watched(events: list[Any]) -> None:
            await step_batch(events)
            if any(_is_ack(e) and e.message.match_index >= leader._node.last_index for e in events):
                acked.set()

        leader._step_batch = watched  # type: ignore[method-assign]
        async with asyncio.timeout(_DEADLINE_S):
            await leader.propose(Put(key="/held", value=_MARKER), timeout=_DEADLINE_S)
        assert all(type(e) is LogPersisted for e in rounds[-1]), rounds
    finally:
        await leader.stop()
        followers.close()

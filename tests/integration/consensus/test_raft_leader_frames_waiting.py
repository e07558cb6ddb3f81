"""Frames left on a leader's ROUTER after a round read its most (`_STEP_BATCH_MAX`) are
read in a later round even when none of the frames it read was an event for the core.

Against `FakeFollowers` (node 2 holds its acknowledgement of the marked entry), with ticks
stopped once the leader is settled, so only the frames themselves can wake the loop. The
test sends the frames over inproc from a DEALER in the leader's own context: once `send`
returns, a message is in the ROUTER's queue, so the whole burst waits there before the
loop runs again (no timing)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import zmq

from danube_zmq.consensus.peer import _STEP_BATCH_MAX, PEER_PROTOCOL
from danube_zmq.consensus.raft.messages import AppendEntriesResponse, HeartbeatResponse
from danube_zmq.consensus.state_machine import Put
from tests.integration.consensus.test_raft_leader_commit import _MARKER, FakeFollowers
from tests.integration.consensus.test_raft_leader_wakeups import _DEADLINE_S, _settled_leader

_STEPPED_S = 10.0  # the acknowledgement is stepped at once; this only bounds a hang


async def test_frames_waiting_past_a_full_read_of_frames_that_are_no_event_are_read(tmp_path: Path) -> None:
    """`_STEP_BATCH_MAX` frames that give the core no event (addressed to another node),
    then node 2's acknowledgement of the held entry, all waiting on the socket at once: the
    round reads the maximum and leaves the acknowledgement waiting. The descriptor does not
    fire again for it, so the loop must come back by itself. Before, the `_WAKE` that
    `_read_frames` queued for this was taken by the same round (its batch was short), the
    acknowledgement waited for a tick that never came, and the proposal never committed."""
    followers = FakeFollowers()
    leader = None
    dealer = None
    try:
        leader = await _settled_leader(tmp_path, followers)
        proposal = asyncio.ensure_future(leader.propose(Put(key="/held", value=_MARKER), timeout=_DEADLINE_S))
        async with asyncio.timeout(_DEADLINE_S):
            # Node 2 holds the marked entry, and the leader's own copy is on disk.
            while not (any(m.to_id == 2 for m in followers.held)
                       and leader._synced is not None and leader._synced[0] >= leader._node.last_index):
                await asyncio.sleep(0.01)
        await asyncio.sleep(0.3)  # time for any wake-up to come and be stepped
        assert not proposal.done()
        held = next(m for m in followers.held if m.to_id == 2)
        ack = AppendEntriesResponse(from_id=2, to_id=1, term=held.term, success=True,
                                    match_index=held.prev_log_index + len(held.entries), context=held.context)
        not_for_me = PEER_PROTOCOL.encode(HeartbeatResponse(from_id=2, to_id=3, term=held.term))

        router = leader._router
        assert router is not None
        endpoint = f"inproc://raft-frames-waiting-{id(leader)}"
        router.bind(endpoint)  # in the loop's thread, which owns the socket
        dealer = leader._sync_ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.setsockopt(zmq.IDENTITY, b"2")  # takes over node 2's identity (ROUTER_HANDOVER)
        dealer.connect(endpoint)
        # No await from here on: the loop cannot read before the whole burst waits.
        for _ in range(_STEP_BATCH_MAX):
            dealer.send(not_for_me, zmq.NOBLOCK)
        dealer.send(PEER_PROTOCOL.encode(ack), zmq.NOBLOCK)
        invalid = leader._invalid

        try:
            async with asyncio.timeout(_STEPPED_S):
                await asyncio.shield(proposal)
        except TimeoutError:
            raise AssertionError(
                f"not committed in {_STEPPED_S}s: {leader._invalid - invalid} frames read as no event, "
                f"frames waiting: {leader._frames_waiting}, queued events: {leader._events.qsize()}") from None
        assert leader._invalid - invalid == _STEP_BATCH_MAX
        assert leader.state.last_applied_index == leader._node.last_index
    finally:
        if dealer is not None:
            dealer.close(linger=0)
        if leader is not None:
            await leader.stop()
        followers.close()

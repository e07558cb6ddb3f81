"""R3's finding, on the pure Raft core: a follower whose log lost its acknowledged tail
(a torn last record, chaos/power.py `tear_raft_log`: a disk that dropped a synced
write) used to be never repaired by the leader, which treats its rejections at or below
the match index as stale (`test_a_rejection_at_or_below_a_replicating_followers_match_is_stale`).
Each start draws a new `incarnation`, carried by the follower's answers: a leader that
sees it change forgets the follower's match and probes it again."""

from __future__ import annotations

import random

from danube_zmq.consensus.raft import Propose, RaftConfig, RaftNode, Restore
from danube_zmq.consensus.types import HardState
from tests.unit.test_raft_core import Cluster


def test_a_follower_that_lost_its_acknowledged_tail_is_caught_up_by_the_leader() -> None:
    """Node 2 acknowledged every entry, then restarts with its last entry gone (what
    `tear_raft_log` does to its LevelDB log): within a few heartbeats the leader sends
    it the missing entry again and node 2 holds the leader's whole log."""
    c = Cluster([1, 2, 3])
    c.elect(1)
    for request_id in range(1, 6):
        c.step(1, Propose(request_id=request_id, data=b"x%d" % request_id))
        c.tick(n=2)
    leader, follower = c.nodes[1], c.nodes[2]
    assert follower.last_index == leader.last_index and leader.progress[2].match == leader.last_index
    kept = [follower.entry_at(i) for i in range(1, follower.last_index)]  # the last one torn off
    # A new boot, a new random stream (the peer shell seeds from the OS): the same seed
    # would replay the same incarnation, i.e. pretend to be the same boot.
    restarted = RaftNode(RaftConfig(node_id=2), random.Random(20))
    c.nodes[2] = restarted
    hs = follower.hard_state()  # its stored commit index is never past what it holds
    c.step(2, Restore(hard_state=HardState(term=hs.term, voted_for=hs.voted_for,
                                           commit_index=min(hs.commit_index, len(kept))), entries=kept))
    assert restarted.last_index == leader.last_index - 1
    c.tick(n=20)
    assert c.nodes[2].last_index == leader.last_index

"""R3's finding, on the pure Raft core: a follower whose log lost its acknowledged tail
(a torn last record, tests/chaos/harness/power.py `tear_raft_log`: a disk that dropped a synced
write) used to be never repaired by the leader, which treats its rejections at or below
the match index as stale (`test_a_rejection_at_or_below_a_replicating_followers_match_is_stale`).
Each start draws a new `incarnation`, carried by the follower's answers: a leader that
sees it change forgets the follower's match and probes it again."""

from __future__ import annotations

import random

import msgpack

from danube_zmq.consensus.raft import Propose, RaftConfig, RaftNode, Receive, Restore
from danube_zmq.consensus.raft.messages import RAFT_PROTOCOL, AppendEntriesResponse
from danube_zmq.consensus.simulator import Faults, Simulation
from danube_zmq.consensus.types import HardState
from tests.unit.consensus.raft.test_raft_core import Cluster


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


def test_an_answer_without_an_incarnation_decodes_as_unknown_and_keeps_the_match() -> None:
    """A frame from a peer that predates incarnations (no last field) decodes with
    incarnation 0, and 0 never resets what the leader knows of that follower."""
    c = Cluster([1, 2, 3])
    c.elect(1)
    c.tick(n=2)
    leader = c.nodes[1]
    pr = leader.progress[2]
    match, state = pr.match, pr.state
    assert match > 0 and pr.incarnation == c.nodes[2].incarnation != 0
    old = msgpack.packb([AppendEntriesResponse.TAG, 2, 1, leader.term, True, match, 0, 0, 0, 0])
    answer = RAFT_PROTOCOL.decode(old)
    assert isinstance(answer, AppendEntriesResponse) and answer.incarnation == 0
    c.step(1, Receive(message=answer))
    assert (pr.state, pr.match, pr.incarnation) == (state, match, c.nodes[2].incarnation)


def test_a_new_incarnation_sends_a_follower_back_to_probing_from_match_zero() -> None:
    """The leader forgets what a restarted follower acknowledged: its first answer from
    a new incarnation (here a rejection below the old match, which the same incarnation
    could only send as a late, stale answer) puts it back to probing with match 0."""
    c = Cluster([1, 2, 3])
    c.elect(1)
    c.tick(n=2)
    leader = c.nodes[1]
    pr = leader.progress[2]
    match = pr.match
    rejection = AppendEntriesResponse(from_id=2, to_id=1, term=leader.term, success=False, match_index=0,
                                      rejected_index=match, conflict_term=0, conflict_index=match,
                                      incarnation=pr.incarnation)
    assert c.step(1, Receive(message=rejection)) == [] and pr.match == match  # same boot: stale
    c.step(1, Receive(message=AppendEntriesResponse(
        from_id=2, to_id=1, term=leader.term, success=False, match_index=0, rejected_index=match,
        conflict_term=0, conflict_index=match, incarnation=pr.incarnation + 1)))
    assert pr.match == 0 and pr.incarnation == rejection.incarnation + 1


def _torn_tail_faults(rng: random.Random) -> Faults:
    """Hostile networks and frequent crashes, every crash tearing the log's tail."""
    return Faults(
        drop_rate=rng.choice([0.0, 0.05]),
        duplicate_rate=rng.choice([0.0, 0.05]),
        delay_ticks_max=rng.randint(1, 6),
        long_delay_rate=rng.choice([0.0, 0.02]),
        partition_rate=rng.choice([0.0, 0.02]),
        heal_rate=0.1,
        crash_rate=rng.choice([0.02, 0.05]),
        restart_ticks_max=rng.choice([3, 10]),
        transfer_rate=rng.choice([0.0, 0.01]),
        tear_rate=1.0,
    )


def test_peers_restarting_with_torn_logs_stay_safe_and_all_catch_up() -> None:
    """Simulated clusters (3 and 5 peers) where every crash may also drop the last 1..3
    entries of the crashed peer's log, acknowledged or not, whenever a quorum of the
    other voters still holds them: every safety invariant of the simulator holds, and
    after healing every member catches up with the leader (the liveness check fails if
    a torn peer stays behind, as it did before incarnations)."""
    failures, tears = [], 0
    for peers, seeds in ((3, range(100)), (5, range(50))):
        for seed in seeds:
            faults = _torn_tail_faults(random.Random(seed))
            result = Simulation(seed, peers, faults=faults, chaos_ticks=300).run()
            tears += result.stats.tears
            if result.failure:
                failures.append(result.failure)
    assert not failures, f"{len(failures)} seeds failed; first: {failures[0]}"
    assert tears >= 200, f"only {tears} torn tails: the test exercises too little"

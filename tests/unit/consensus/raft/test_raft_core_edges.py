"""The Raft core at its edges: behaviours a mutation run of consensus/raft/core.py showed
no test pinned (issue 19, sections 3 and 9). Each test drives `RaftNode`s by hand with
the `Cluster` helper of test_raft_core.py and fails if the guarded line is changed."""

from __future__ import annotations

import itertools
import random

import msgpack

from danube_zmq.consensus.raft import (
    RAFT_PROTOCOL,
    AddLearner,
    ApplySnapshot,
    PromoteVoter,
    ProposalResult,
    Propose,
    ProposeConfig,
    RaftConfig,
    RaftError,
    RaftNode,
    ReadIndex,
    ReadReady,
    Receive,
    RemoveVoter,
    Restore,
    Role,
    Send,
    SnapshotTaken,
    Tick,
    TransferLeadership,
    bootstrap,
)
from danube_zmq.consensus.raft.messages import (
    AppendEntries,
    AppendEntriesResponse,
    Heartbeat,
    HeartbeatResponse,
    InstallSnapshot,
    RequestVoteResponse,
    TimeoutNow,
    encode_membership,
)
from danube_zmq.consensus.types import Entry, EntryKind, HardState, Membership, SnapshotMeta
from tests.unit.consensus.raft.test_raft_core import Cluster, restore


def _config_change(c: Cluster, leader: int, change, request_id: int = 1) -> ProposalResult:
    (result,) = [e for e in c.step(leader, ProposeConfig(request_id=request_id, change=change))
                 if isinstance(e, ProposalResult)]
    return result


# ------------------------------------------------------------ promoting a learner (section 3)


def test_a_learner_that_never_answered_is_not_promoted():
    """The reported bug: a sole voter adds node 2 at an address where nothing listens,
    then promotes it. The learner never acknowledged anything, so the promotion is
    refused (LEARNER_BEHIND) and node 1 stays the only voter and keeps committing; a
    promotion would have made two voters with one of them dead: no leader, ever."""
    c = Cluster([1], others=[2])
    c.isolated.add(2)
    assert c.nodes[1].role is Role.LEADER
    assert _config_change(c, 1, AddLearner(node_id=2)).error is None
    c.tick(n=3)
    assert c.nodes[1].last_index < c.nodes[1].config.append_entries_max  # the log is short
    assert _config_change(c, 1, PromoteVoter(node_id=2), 2).error is RaftError.LEARNER_BEHIND
    assert c.nodes[1].membership == Membership(voters=[1], learners=[2])
    (result,) = [e for e in c.step(1, Propose(request_id=3, data=b"x")) if isinstance(e, ProposalResult)]
    assert c.nodes[1].commit_index == result.index


def test_a_learner_is_promoted_once_it_has_acknowledged_the_log():
    """The same learner, once reachable, catches up and acknowledges: now it is promoted."""
    c = Cluster([1], others=[2])
    c.isolated.add(2)
    _config_change(c, 1, AddLearner(node_id=2))
    c.tick(n=2)
    c.isolated.clear()
    c.tick(n=3)
    assert c.nodes[2].last_index == c.nodes[1].last_index
    assert _config_change(c, 1, PromoteVoter(node_id=2), 2).error is None
    c.tick(n=3)
    assert c.nodes[2].membership.voters == [1, 2]


def test_a_learner_must_acknowledge_in_the_leaders_own_term():
    """Node 4 caught up under leader 1, then went silent. Node 2 takes over: it has not
    heard from node 4 in its term, so it refuses to promote it (what node 4 matched
    under an earlier leader says nothing about whether it is alive now). Once node 4
    answers node 2, the promotion goes through."""
    c = Cluster([1, 2, 3], others=[4])
    c.elect(1)
    c.tick(n=2)
    _config_change(c, 1, AddLearner(node_id=4))
    c.tick(n=3)
    assert c.nodes[4].last_index == c.nodes[1].last_index
    c.isolated.add(4)
    c.step(1, TransferLeadership(target_id=2))
    c.deliver()
    assert c.leader() == 2
    c.tick(n=2)
    assert _config_change(c, 2, PromoteVoter(node_id=4), 2).error is RaftError.LEARNER_BEHIND
    c.isolated.clear()
    c.tick(n=3)
    assert _config_change(c, 2, PromoteVoter(node_id=4), 3).error is None


def test_a_learner_that_went_silent_is_not_promoted():
    """A learner that acknowledged earlier in this term but has not answered for a whole
    check-quorum round (election_ticks_min ticks) is refused: it may be gone."""
    c = Cluster([1], others=[2])
    _config_change(c, 1, AddLearner(node_id=2))
    c.tick(n=3)
    c.isolated.add(2)
    c.tick(n=2 * c.nodes[1].config.election_ticks_min)
    assert c.nodes[1].progress[2].match == c.nodes[1].last_index
    assert _config_change(c, 1, PromoteVoter(node_id=2), 2).error is RaftError.LEARNER_BEHIND


def test_a_learner_within_append_entries_max_of_the_leader_is_promoted():
    """The boundary: a learner whose acknowledged match is exactly append_entries_max
    entries behind the leader's last index is caught up; one entry more is too far."""
    c = Cluster([1], others=[2], append_entries_max=2)
    _config_change(c, 1, AddLearner(node_id=2))
    c.tick(n=3)
    c.isolated.add(2)
    match = c.nodes[1].progress[2].match
    for k in range(2):
        c.step(1, Propose(request_id=10 + k, data=b"x"))
    assert c.nodes[1].last_index == match + 2
    fork = c.nodes[1].clone()
    (ok,) = [e for e in fork.step(ProposeConfig(request_id=2, change=PromoteVoter(node_id=2)))
             if isinstance(e, ProposalResult)]
    assert ok.error is None
    c.step(1, Propose(request_id=12, data=b"x"))
    assert _config_change(c, 1, PromoteVoter(node_id=2), 3).error is RaftError.LEARNER_BEHIND


# ------------------------------------------------------------------------- reads


def test_a_read_before_the_new_leaders_first_commit_is_not_answered_early():
    """A leader re-elected after an earlier term's read round sends its old read context
    with its first AppendEntries. A ReadIndex that arrives before its NOOP commits
    must wait for that commit (its commit index is unknown until then): answering it
    on the first acknowledgement would hand back a stale read index."""
    c = Cluster([1, 2, 3])
    c.elect(1)
    c.tick(n=2)
    c.step(1, ReadIndex(request_id=1))
    c.deliver()
    assert len(c.of_type(1, ReadReady)) == 1 and c.nodes[1].read_seq >= 1
    c.step(1, TransferLeadership(target_id=2))
    c.deliver()
    c.tick(n=2)
    assert c.leader() == 2
    c.step(2, TransferLeadership(target_id=1))
    c.campaign(1)
    node = c.nodes[1]
    noop = node.leader_first_index
    assert node.commit_index < noop
    c.step(1, ReadIndex(request_id=2))
    while c.inbox:
        m = c.inbox.pop(0)
        c.step(m.to_id, Receive(message=m))
        for ready in c.of_type(1, ReadReady):
            if ready.request_id == 2:
                assert node.commit_index >= noop, "a read answered before the leader's first commit"
                assert ready.read_index >= noop
    c.tick(n=2)
    assert [r.request_id for r in c.of_type(1, ReadReady)] == [1, 2]


# --------------------------------------------------------------------- elections


def test_vote_replies_arriving_after_the_election_is_won_change_nothing():
    """Five voters: node 1 wins with three votes; the two late grants must not make it
    become leader again (a second NOOP, progress reset) nor do anything else."""
    c = Cluster([1, 2, 3, 4, 5])
    c.isolated = {4, 5}
    c.campaign(1)
    node = c.nodes[1]
    term, last = node.term, node.last_index
    for voter in (4, 5):
        fx = c.step(1, Receive(message=RequestVoteResponse(from_id=voter, to_id=1, term=term, granted=True)))
        assert fx == []
    fx = c.step(1, Receive(message=RequestVoteResponse(from_id=4, to_id=1, term=term, granted=False)))
    assert fx == [] and node.role is Role.LEADER and node.last_index == last


# -------------------------------------------------------------------- snapshots


def test_a_follower_serves_the_snapshot_it_installed_not_its_old_one():
    """Node 3 installs leader 1's snapshot; later node 3 leads and sends a snapshot to a
    lagging peer: it must send the bytes it installed, not what it held before."""
    voters = [1, 2, 3]
    old = SnapshotMeta(last_index=1, last_term=1, membership=Membership(voters=voters, learners=[]))
    node = RaftNode(RaftConfig(node_id=3), random.Random(3))
    node.step(Restore(hard_state=HardState(term=2, voted_for=None, commit_index=1), snapshot=old,
                      snapshot_data=b"old", entries=[]))
    meta = SnapshotMeta(last_index=5, last_term=2, membership=Membership(voters=voters, learners=[]))
    fx = node.step(Receive(message=InstallSnapshot(from_id=1, to_id=3, term=2, meta=meta, data=b"new")))
    assert [e.data for e in fx if isinstance(e, ApplySnapshot)] == [b"new"]
    assert node.snapshot == meta and node.snapshot_data == b"new"
    # Node 3 campaigns and wins (votes by hand), then node 2 turns out to be empty.
    node.step(Receive(message=TimeoutNow(from_id=1, to_id=3, term=2)))
    for voter in (1, 2):
        node.step(Receive(message=RequestVoteResponse(from_id=voter, to_id=3, term=node.term, granted=True)))
    assert node.role is Role.LEADER
    fx = node.step(Receive(message=AppendEntriesResponse(
        from_id=2, to_id=3, term=node.term, success=False, match_index=0, rejected_index=node.last_index - 1,
        conflict_term=0, conflict_index=1)))
    (snap,) = [e.message for e in fx if isinstance(e, Send) and isinstance(e.message, InstallSnapshot)]
    assert snap.data == b"new" and snap.meta == meta


def test_a_snapshot_taken_is_the_one_sent_to_a_lagging_follower():
    """SnapshotTaken replaces the leader's snapshot bytes: a follower that needs a snapshot
    afterwards gets the newest one."""
    c = Cluster([1, 2, 3], log_entries_max=4)
    c.elect(1)
    c.tick(n=2)
    c.isolated.add(3)
    for k in range(3):
        c.step(1, Propose(request_id=k, data=b"x"))
        c.tick(1, 2)
    applied = c.nodes[1].applied_index
    c.step(1, SnapshotTaken(last_index=applied - 1, data=b"first"))
    c.step(1, SnapshotTaken(last_index=applied, data=b"second"))
    c.isolated.clear()
    c.tick(n=5)
    assert [m.data for m in c.sent(InstallSnapshot)] == [b"second"]


# ------------------------------------------------------------------- replication


def test_a_rejected_append_is_answered_at_once_with_an_earlier_probe():
    """Fast backtracking: the rejection's hint makes the leader send the next probe in
    the same step, not a heartbeat period later."""
    voters = [1, 2, 3]
    log = [*bootstrap(voters).entries, *(Entry(index=i, term=2, kind=EntryKind.COMMAND, data=b"d")
                                         for i in range(2, 8))]
    c = Cluster(voters, restores={
        1: Restore(hard_state=HardState(term=2, voted_for=None, commit_index=1), entries=log),
        2: Restore(hard_state=HardState(term=2, voted_for=None, commit_index=1), entries=log[:2]),
        3: Restore(hard_state=HardState(term=2, voted_for=None, commit_index=1), entries=log),
    })
    c.isolated.add(2)
    c.campaign(1)
    c.deliver()
    c.isolated.clear()
    probe = AppendEntries(from_id=1, to_id=2, term=c.nodes[1].term, prev_log_index=c.nodes[1].last_index - 1,
                          prev_log_term=c.nodes[1].term_at(c.nodes[1].last_index - 1), entries=[], leader_commit=1)
    c.nodes[1].progress[2].next = probe.prev_log_index + 1
    c.nodes[1].progress[2].paused = True
    fx = c.step(2, Receive(message=probe))
    (reject,) = [e.message for e in fx if isinstance(e, Send)]
    assert not reject.success
    c.inbox.clear()
    fx = c.step(1, Receive(message=reject))
    (retry,) = [e.message for e in fx if isinstance(e, Send) and isinstance(e.message, AppendEntries)]
    assert retry.to_id == 2 and retry.prev_log_index == 2 and retry.entries


# ---------------------------------------------------------------- leadership transfer


def test_a_removed_voter_is_never_a_transfer_target():
    """After the leader removes voter 3 (the change takes effect when appended), a
    TransferLeadership to 3 is ignored: no TimeoutNow, proposals still accepted."""
    c = Cluster([1, 2, 3])
    c.elect(1)
    c.tick(n=2)
    assert _config_change(c, 1, RemoveVoter(node_id=3)).error is None
    fx = c.step(1, TransferLeadership(target_id=3))
    assert fx == [] and c.nodes[1].transfer_target is None
    (result,) = [e for e in c.step(1, Propose(request_id=5, data=b"x")) if isinstance(e, ProposalResult)]
    assert result.error is None
    c.tick(n=3)
    assert not [m for m in c.sent(TimeoutNow) if m.to_id == 3]


def test_a_learner_is_never_a_transfer_target():
    c = Cluster([1, 2, 3], others=[4])
    c.elect(1)
    c.tick(n=2)
    _config_change(c, 1, AddLearner(node_id=4))
    c.tick(n=3)
    assert c.step(1, TransferLeadership(target_id=4)) == []
    assert c.nodes[1].transfer_target is None


# ------------------------------------------------------- more survivors of the mutation run


def test_proposals_are_refused_while_a_transfer_catches_the_target_up():
    """TransferLeadership to a lagging voter: the leader refuses proposals (TRANSFERRING)
    while it catches the target up, and sends TimeoutNow once it has."""
    c = Cluster([1, 2, 3])
    c.elect(1)
    c.tick(n=2)
    c.isolated.add(3)
    c.step(1, Propose(request_id=1, data=b"x"))
    c.tick(1, 2, n=2)
    c.isolated.clear()
    c.inbox.clear()
    c.step(1, TransferLeadership(target_id=3))
    assert not c.sent(TimeoutNow)
    (refused,) = [e for e in c.step(1, Propose(request_id=2, data=b"y")) if isinstance(e, ProposalResult)]
    assert refused.error is RaftError.TRANSFERRING
    c.tick(n=6)
    assert c.sent(TimeoutNow) and c.leader() == 3


def test_a_voter_in_a_leader_lease_answers_a_pre_vote_with_a_refusal():
    """A follower that heard from its leader within election_ticks_min refuses a higher-term
    PreVote explicitly (granted False), so the pre-candidate gives up early."""
    from danube_zmq.consensus.raft.messages import PreVote, PreVoteResponse

    c = Cluster([1, 2, 3])
    c.elect(1)
    c.tick(n=2)
    fx = c.step(2, Receive(message=PreVote(from_id=3, to_id=2, term=9, last_log_index=99, last_log_term=9)))
    (answer,) = [e.message for e in fx if isinstance(e, Send)]
    assert isinstance(answer, PreVoteResponse) and answer.granted is False and c.nodes[2].term == 2


def test_a_candidate_that_hears_from_the_terms_leader_becomes_its_follower():
    """Two candidates in one term: the loser gets AppendEntries from the winner of that
    term and follows it (FOLLOWER, leader known), instead of staying a candidate."""
    node = RaftNode(RaftConfig(node_id=2, pre_vote=False), random.Random(2))
    node.step(bootstrap([1, 2, 3]))
    while node.role is not Role.CANDIDATE:
        node.step(Tick())
    term = node.term
    node.step(Receive(message=AppendEntries(from_id=1, to_id=2, term=term, prev_log_index=1, prev_log_term=1,
                                            entries=[], leader_commit=1)))
    assert node.role is Role.FOLLOWER and node.leader_id == 1 and node.term == term


def test_entries_below_the_followers_commit_index_are_skipped_not_refused():
    """An AppendEntries whose prev index is below the follower's commit index: the part it
    already committed is skipped and the rest appended; the answer matches the end."""
    voters = [1, 2, 3]
    log = [*bootstrap(voters).entries, *(Entry(index=i, term=2, kind=EntryKind.COMMAND, data=b"d%d" % i)
                                         for i in range(2, 7))]
    node = RaftNode(RaftConfig(node_id=2), random.Random(2))
    node.step(Restore(hard_state=HardState(term=2, voted_for=None, commit_index=4), entries=log[:4]))
    fx = node.step(Receive(message=AppendEntries(from_id=1, to_id=2, term=2, prev_log_index=1, prev_log_term=1,
                                                 entries=log[1:6], leader_commit=4)))
    (answer,) = [e.message for e in fx if isinstance(e, Send)]
    assert answer.success and answer.match_index == 6 and node.last_index == 6
    assert [e.index for e in node.log] == [1, 2, 3, 4, 5, 6]


def test_a_truncated_uncommitted_config_entry_is_forgotten():
    """A follower holds an uncommitted CONFIG entry (learner 4 added) that the new leader
    never had: when the leader's entries overwrite it, the follower's membership goes
    back to the one before."""
    voters = [1, 2, 3]
    boot = bootstrap(voters).entries
    config = Entry(index=2, term=2, kind=EntryKind.CONFIG,
                   data=encode_membership(Membership(voters=voters, learners=[4])))
    node = RaftNode(RaftConfig(node_id=2), random.Random(2))
    node.step(Restore(hard_state=HardState(term=2, voted_for=None, commit_index=1), entries=[*boot, config]))
    assert node.membership.learners == [4]
    other = Entry(index=2, term=3, kind=EntryKind.NOOP, data=b"")
    node.step(Receive(message=AppendEntries(from_id=3, to_id=2, term=3, prev_log_index=1, prev_log_term=1,
                                            entries=[other], leader_commit=1)))
    assert node.membership == Membership(voters=voters, learners=[]) and node.config_index == 1


def test_a_lost_append_in_replicate_state_is_resent_after_the_stall_period():
    """Replicate state: an AppendEntries lost on the way is resent, from the follower's
    match, after max(2, election_ticks_min // 2) ticks without progress, not before."""
    c = Cluster([1, 2, 3], election_ticks_min=2, election_ticks_max=3, check_quorum=False)
    c.elect(1)
    c.tick(n=2)
    c.isolated.add(3)
    match = c.nodes[1].progress[3].match
    c.step(1, Propose(request_id=1, data=b"x"))
    c.deliver()
    c.isolated.clear()

    def appends_to_3(fx) -> list:
        return [e.message for e in fx if isinstance(e, Send) and isinstance(e.message, AppendEntries)
                and e.message.to_id == 3]

    assert appends_to_3(c.step(1, Tick())) == []
    c.inbox.clear()
    (resent,) = appends_to_3(c.step(1, Tick()))
    assert resent.prev_log_index == match and resent.entries


def test_heartbeats_go_out_every_heartbeat_ticks():
    """With heartbeat_ticks=3 the leader sends one heartbeat round per three ticks."""
    from danube_zmq.consensus.raft.messages import Heartbeat

    c = Cluster([1, 2, 3], heartbeat_ticks=3)
    c.elect(1)
    c.tick(n=3)
    rounds = []
    for _ in range(9):
        fx = c.step(1, Tick())
        rounds.append(sum(1 for e in fx if isinstance(e, Send) and isinstance(e.message, Heartbeat)))
        c.deliver()
    assert sorted(rounds) == [0, 0, 0, 0, 0, 0, 2, 2, 2]


# ------------------------------------------------- budgets and timers (issue 19, section 9)


def _appends_to(fx, peer: int) -> list[AppendEntries]:
    return [e.message for e in fx if isinstance(e, Send) and isinstance(e.message, AppendEntries)
            and e.message.to_id == peer]


def test_append_bytes_max_cuts_each_append_by_entry_bytes():
    """append_bytes_max bounds the entry data of one AppendEntries: entries go in while
    their bytes add up to at most the budget (exactly the budget fits), and an entry
    larger than the budget goes alone rather than never."""
    from danube_zmq.consensus.raft import ProposeBatch

    c = Cluster([1, 2], append_bytes_max=10)
    c.elect(1)
    c.tick(n=2)
    sizes = [4, 6, 3, 12, 1]
    batch = ProposeBatch(proposals=tuple(Propose(request_id=k, data=b"x" * n) for k, n in enumerate(sizes)))
    sent = _appends_to(c.step(1, batch), 2)
    assert [[len(e.data) for e in m.entries] for m in sent] == [[4, 6], [3], [12], [1]]
    c.deliver()
    assert c.nodes[2].last_index == c.nodes[1].last_index == c.nodes[1].commit_index


def test_the_default_append_bytes_max_is_one_mebibyte():
    """By default one AppendEntries carries at most 1 MiB of entry data: two 512 KiB
    entries fill it exactly, the third goes in the next message."""
    from danube_zmq.consensus.raft import ProposeBatch

    c = Cluster([1, 2])
    c.elect(1)
    c.tick(n=2)
    batch = ProposeBatch(proposals=tuple(Propose(request_id=k, data=bytes(1 << 19)) for k in range(3)))
    assert [len(m.entries) for m in _appends_to(c.step(1, batch), 2)] == [2, 1]


def test_an_unanswered_snapshot_suggestion_is_repeated_after_election_ticks_max():
    """The core suggests a snapshot (TakeSnapshot) once, then stays quiet for
    election_ticks_max ticks while the shell works on it; if no SnapshotTaken came by
    then, the next commit suggests it again."""
    from danube_zmq.consensus.raft import TakeSnapshot

    c = Cluster([1], log_entries_max=2)
    ticks = c.nodes[1].config.election_ticks_max

    def propose(k: int) -> list:
        return [e for e in c.step(1, Propose(request_id=k, data=b"x")) if isinstance(e, TakeSnapshot)]

    suggested = [k for k in range(5) if propose(k)]
    assert suggested == [0]  # the log (bootstrap entry, NOOP, x) outgrew log_entries_max
    c.tick(n=ticks - 1)
    assert propose(10) == []
    c.tick()
    assert len(propose(11)) == 1


def test_a_caught_up_follower_in_replicate_state_gets_no_appends_from_the_stall_timer():
    """The stall timer only runs for a follower that is behind: a follower holding the
    whole log is never sent an empty AppendEntries nor dropped back to probing, however
    many ticks pass (heartbeats keep it), so new entries still go out pipelined, one
    AppendEntries per proposal without waiting for answers."""
    c = Cluster([1, 2, 3], election_ticks_min=2, election_ticks_max=3, check_quorum=False)
    c.elect(1)
    assert c.nodes[2].last_index == c.nodes[1].last_index
    c.delivered.clear()
    for _ in range(12):
        c.step(1, Tick())
        c.deliver()
    assert c.sent(AppendEntries) == []
    sent = [m for k in range(3) for m in _appends_to(c.step(1, Propose(request_id=k, data=b"x")), 2)]
    assert len(sent) == 3


def test_a_transfer_to_a_lagging_target_sends_it_the_missing_entries_at_once():
    """TransferLeadership to a voter that lacks entries the leader held back (its
    in-flight window was full) sends them in the same step, instead of waiting for
    the stall timer."""
    c = Cluster([1, 2, 3], inflight_appends_max=1)
    c.elect(1)
    c.tick(n=2)
    c.isolated.add(3)
    c.step(1, Propose(request_id=1, data=b"x"))  # lost on the way to 3; its window is full
    (y,) = [e for e in c.step(1, Propose(request_id=2, data=b"y")) if isinstance(e, ProposalResult)]
    c.deliver()
    c.isolated.clear()
    c.tick()  # a heartbeat answer from 3 frees a slot in its window, sends nothing
    assert c.nodes[3].last_index < y.index
    sent = _appends_to(c.step(1, TransferLeadership(target_id=3)), 3)
    assert [e.index for m in sent for e in m.entries] == [y.index]
    c.deliver()
    assert c.leader() == 3 and c.nodes[3].term_at(y.index) == y.term


def test_a_repeated_append_is_not_persisted_again():
    """An AppendEntries the follower already holds (a resend) is acknowledged without a
    PersistEntries effect: no write, no fsync for nothing."""
    from danube_zmq.consensus.raft import PersistEntries

    c = Cluster([1, 2, 3])
    c.elect(1)
    c.tick(n=2)
    (append,) = _appends_to(c.step(1, Propose(request_id=1, data=b"x")), 2)
    first = c.nodes[2].step(Receive(message=append))
    again = c.nodes[2].step(Receive(message=append))
    assert [type(e) for e in first if isinstance(e, PersistEntries)] == [PersistEntries]
    assert [e for e in again if isinstance(e, PersistEntries)] == []
    (ack,) = [e.message for e in again if isinstance(e, Send)]
    assert ack.success and ack.match_index == append.entries[-1].index


def test_an_unanswered_install_snapshot_is_resent_every_election_ticks_min():
    """A follower that never gets InstallSnapshot (so never answers it) is sent it again
    exactly election_ticks_min leader ticks after each send: not sooner, not later."""
    c = Cluster([1, 2, 3], log_entries_max=4)
    c.elect(1)
    c.tick(n=2)
    c.isolated.add(3)
    for k in range(8):
        c.step(1, Propose(request_id=k, data=b"x"))
        c.tick(1, 2)
    c.step(1, SnapshotTaken(last_index=c.nodes[1].applied_index, data=b"state"))
    c.step(1, Propose(request_id=99, data=b"after"))
    c.isolated.clear()
    sent_at = []
    for t in range(60):  # node 3 hears everything but the snapshot, which never arrives
        c.step(1, Tick())
        while c.inbox:
            m = c.inbox.pop(0)
            if isinstance(m, InstallSnapshot):
                sent_at.append(t)
            else:
                c.step(m.to_id, Receive(message=m))
    period = c.nodes[1].config.election_ticks_min
    assert len(sent_at) >= 3
    assert {b - a for a, b in itertools.pairwise(sent_at)} == {period}


def test_a_new_leaders_check_quorum_rounds_count_from_its_election():
    """The check-quorum clock restarts when a candidate wins, whatever it counted as a
    candidate: a leader cut off at once steps down after exactly two rounds
    (2 x election_ticks_min ticks: the first round credits every peer)."""
    c = Cluster([1, 2, 3], pre_vote=False)
    from danube_zmq.consensus.raft.messages import RequestVote

    for _ in range(100):
        c.step(1, Tick())
        if any(isinstance(m, RequestVote) for m in c.inbox):
            break
    c.step(1, Tick())
    c.step(1, Tick())  # the votes arrive late: the candidate counted these ticks
    c.campaign(1)
    c.isolated.update({2, 3})
    c.inbox.clear()
    rounds = c.nodes[1].config.election_ticks_min
    c.tick(1, n=2 * rounds - 1)
    assert c.nodes[1].role is Role.LEADER
    c.tick(1)
    assert c.nodes[1].role is Role.FOLLOWER


def test_entry_at_is_none_outside_the_log_held():
    """entry_at answers None for the snapshot's index and below (compacted) and past the
    last index, and the entry itself in between."""
    c = Cluster([1], log_entries_max=2)
    for k in range(3):
        c.step(1, Propose(request_id=k, data=b"%d" % k))
    node = c.nodes[1]
    c.step(1, SnapshotTaken(last_index=3, data=b"s"))
    assert node.snapshot.last_index == 3
    assert [node.entry_at(i) for i in (0, 3, node.last_index + 1)] == [None, None, None]
    assert [node.entry_at(i).index for i in range(4, node.last_index + 1)] == list(range(4, node.last_index + 1))


def test_a_snapshot_no_newer_than_the_one_held_is_ignored():
    """SnapshotTaken at or below the current snapshot's index (a late shell answer)
    saves and compacts nothing."""
    c = Cluster([1], log_entries_max=2)
    for k in range(4):
        c.step(1, Propose(request_id=k, data=b"x"))
    assert c.step(1, SnapshotTaken(last_index=4, data=b"new"))
    assert c.step(1, SnapshotTaken(last_index=4, data=b"again")) == []
    assert c.step(1, SnapshotTaken(last_index=3, data=b"older")) == []
    assert c.nodes[1].snapshot_data == b"new"


def test_pre_vote_refusals_arriving_after_the_election_is_won_change_nothing():
    """Late PreVoteResponse refusals reach a node that already leads: it ignores them
    (they answer a round it left), rather than counting them as an election lost."""
    from danube_zmq.consensus.raft.messages import PreVoteResponse

    c = Cluster([1, 2, 3])
    c.elect(1)
    term = c.nodes[1].term
    for peer in (2, 3):
        assert c.step(1, Receive(message=PreVoteResponse(from_id=peer, to_id=1, term=term, granted=False))) == []
    assert c.nodes[1].role is Role.LEADER


def test_granting_a_vote_restarts_the_voters_election_timer():
    """A voter that grants a vote, again to a candidate's resent RequestVote in the same
    term, gives the candidate a whole election timeout to win from that grant before
    standing itself, however long it had waited already."""
    from danube_zmq.consensus.raft.messages import RequestVote

    c = Cluster([1, 2, 3], pre_vote=False)
    voter = c.nodes[2]
    request = RequestVote(from_id=1, to_id=2, term=voter.term + 1, last_log_index=voter.last_index,
                          last_log_term=voter.last_term)
    for _ in range(2):  # the request, then its resend
        for _ in range(voter.election_timeout - 1):
            c.step(2, Tick())
        fx = c.step(2, Receive(message=request))
        (answer,) = [e.message for e in fx if isinstance(e, Send)]
        assert answer.granted
    for _ in range(voter.election_timeout - 1):
        c.step(2, Tick())
    assert voter.role is Role.FOLLOWER and voter.voted_for == 1 and voter.term == request.term


def test_an_append_wholly_below_the_followers_commit_is_acknowledged_at_the_commit():
    """A resent AppendEntries whose entries the follower has all committed is still
    answered (success, match = its commit index), so the leader's view moves on."""
    c = Cluster([1, 2, 3])
    c.elect(1)
    c.tick(n=2)
    (append,) = _appends_to(c.step(1, Propose(request_id=1, data=b"x")), 2)
    c.deliver()
    c.tick(n=2)
    follower = c.nodes[2]
    assert follower.commit_index > append.entries[-1].index - 1
    fx = follower.step(Receive(message=append))
    (ack,) = [e.message for e in fx if isinstance(e, Send)]
    assert isinstance(ack, AppendEntriesResponse) and ack.success and ack.match_index == follower.commit_index


def test_a_rejection_at_or_below_a_replicating_followers_match_is_stale():
    """In replicate state, a rejection of an index the follower has since matched (a
    late answer to an old probe) changes nothing: no fall back to probing, no resend."""
    c = Cluster([1, 2, 3])
    c.elect(1)
    c.tick(n=2)
    leader = c.nodes[1]
    pr = leader.progress[2]
    match, state = pr.match, pr.state
    stale = AppendEntriesResponse(from_id=2, to_id=1, term=leader.term, success=False, match_index=0,
                                  rejected_index=match, conflict_term=0, conflict_index=match)
    assert c.step(1, Receive(message=stale)) == []
    assert (pr.state, pr.match, pr.next) == (state, match, match + 1)


def test_a_follower_holding_everything_learns_a_commit_without_waiting_for_a_heartbeat():
    """Once a quorum acknowledges an entry, a follower that holds the whole log is told
    the new commit index at once (a heartbeat sent on commit), not a tick later."""
    c = Cluster([1, 2, 3])
    c.elect(1)
    c.tick(n=2)
    (result,) = [e for e in c.step(1, Propose(request_id=1, data=b"x")) if isinstance(e, ProposalResult)]
    c.deliver()  # no tick: no periodic heartbeat
    assert c.nodes[1].commit_index == result.index
    assert c.nodes[2].commit_index == c.nodes[3].commit_index == result.index


def test_a_commit_notice_is_not_answered():
    """The heartbeat sent on commit only carries the commit index: it asks for no answer
    and gets none (the AppendEntries answer before it told the leader all it needs), so a
    sequential write to three voters costs six peer messages, not eight."""
    c = Cluster([1, 2, 3])
    c.elect(1)
    c.tick(n=2)
    c.delivered.clear()
    (result,) = [e for e in c.step(1, Propose(request_id=1, data=b"x")) if isinstance(e, ProposalResult)]
    c.deliver()  # no tick: no periodic heartbeat
    assert c.nodes[2].commit_index == c.nodes[3].commit_index == result.index
    notices = c.sent(Heartbeat)
    assert {m.to_id for m in notices} == {2, 3} and not any(m.answer for m in notices)
    assert c.sent(HeartbeatResponse) == []
    assert len(c.delivered) == 6  # AppendEntries, its answer and the notice, to each follower


def test_a_commit_notice_asks_for_an_answer_while_a_read_waits():
    """While a read waits for its leadership round, the commit notice carries the round
    and asks for an answer: the answers confirm the round and release the read. The read
    arrives after the AppendEntries left (their answers echo an older round), its own
    heartbeats are lost and no tick comes."""
    c = Cluster([1, 2, 3])
    c.elect(1)
    c.tick(n=2)
    c.step(1, Propose(request_id=1, data=b"x"))
    c.step(1, ReadIndex(request_id=7))
    c.inbox = [m for m in c.inbox if not isinstance(m, Heartbeat)]  # the read round's are lost
    c.delivered.clear()
    c.deliver()
    notices = c.sent(Heartbeat)
    assert notices and all(m.answer for m in notices)
    (ready,) = c.of_type(1, ReadReady)
    assert ready.request_id == 7 and ready.error is None


def test_a_heartbeat_from_an_older_peer_asks_for_an_answer():
    """A Heartbeat encoded by a peer that predates `answer` (one field short) decodes with
    answer=True, and the follower answers it as before."""
    frame = msgpack.packb([Heartbeat.TAG, 1, 2, 3, 0, 0], use_bin_type=True)
    beat = RAFT_PROTOCOL.decode(frame)
    assert type(beat) is Heartbeat and beat.answer is True
    node = RaftNode(RaftConfig(node_id=2), random.Random(2))
    node.step(restore([1, 2, 3], 3, []))
    sent = [e.message for e in node.step(Receive(message=beat)) if isinstance(e, Send)]
    assert [type(m) for m in sent] == [HeartbeatResponse]


def test_a_single_voter_answers_a_read_at_once():
    """A sole voter is its own quorum: ReadIndex is answered in the same step, at the
    commit index."""
    c = Cluster([1])
    (ready,) = [e for e in c.step(1, ReadIndex(request_id=7)) if isinstance(e, ReadReady)]
    assert ready.error is None and ready.read_index == c.nodes[1].commit_index


def test_a_follower_stands_exactly_election_timeout_ticks_after_its_timer_restarts():
    """The election timer counts from zero at each restart: a follower that hears
    nothing stands on its election_timeout-th tick, not one tick earlier or later."""
    from danube_zmq.consensus.raft.messages import PreVote

    c = Cluster([1, 2, 3])
    node = c.nodes[2]
    timeout = node.election_timeout
    for _ in range(timeout - 1):
        assert not [e for e in c.step(2, Tick()) if isinstance(e, Send)]
    assert node.role is Role.FOLLOWER
    sent = [e.message for e in c.step(2, Tick()) if isinstance(e, Send)]
    assert sent and all(isinstance(m, PreVote) for m in sent)


def test_a_candidate_refused_by_a_quorum_keeps_its_vote_for_the_term():
    """A candidate that loses steps back to follower in the same term still having voted
    for itself: no second vote in that term, no hard-state write."""
    from danube_zmq.consensus.raft import PersistHardState
    from danube_zmq.consensus.raft.messages import RequestVote

    c = Cluster([1, 2, 3], pre_vote=False)
    for _ in range(100):
        c.step(1, Tick())
        if c.nodes[1].role is Role.CANDIDATE:
            break
    term = c.nodes[1].term
    c.inbox.clear()
    fx = [e for peer in (2, 3) for e in c.step(1, Receive(message=RequestVoteResponse(
        from_id=peer, to_id=1, term=term, granted=False)))]
    assert c.nodes[1].role is Role.FOLLOWER and c.nodes[1].voted_for == 1 and c.nodes[1].term == term
    assert [e for e in fx if isinstance(e, PersistHardState)] == []
    fx = c.step(1, Receive(message=RequestVote(from_id=2, to_id=1, term=term, last_log_index=99, last_log_term=term)))
    (answer,) = [e.message for e in fx if isinstance(e, Send)]
    assert not answer.granted


def test_an_unanswered_pre_vote_round_is_repeated_only_after_another_timeout():
    """A pre-candidate nobody answers waits a whole election timeout (at least
    election_ticks_min ticks) before its next round of PreVotes, not one tick."""
    from danube_zmq.consensus.raft.messages import PreVote

    c = Cluster([1, 2, 3])
    c.isolated.update({2, 3})
    rounds = []
    for t in range(60):
        if any(isinstance(e, Send) and isinstance(e.message, PreVote) for e in c.step(1, Tick())):
            rounds.append(t)
    c.inbox.clear()
    assert len(rounds) >= 2
    assert min(b - a for a, b in itertools.pairwise(rounds)) >= c.nodes[1].config.election_ticks_min


def test_a_leader_that_commits_its_own_removal_sends_no_more_appends():
    """The acknowledgement that commits the leader's own removal makes it step down in
    that step; entries it still held back for that follower (its in-flight window was
    full) are not sent by the former leader."""
    c = Cluster([1, 2, 3], inflight_appends_max=1)
    c.elect(1)
    c.tick(n=2)
    assert _config_change(c, 1, RemoveVoter(node_id=1)).error is None
    c.step(1, Propose(request_id=2, data=b"held back"))  # windows full: not sent yet
    stepped_down = None
    while c.inbox:
        m = c.inbox.pop(0)
        was_leader = c.nodes[1].role is Role.LEADER
        fx = c.step(m.to_id, Receive(message=m))
        if m.to_id == 1 and was_leader and c.nodes[1].role is not Role.LEADER:
            stepped_down = fx
            break
    assert stepped_down is not None, "the removal was committed"
    assert _appends_to(stepped_down, 2) == _appends_to(stepped_down, 3) == []


def test_a_rejection_naming_a_term_the_leader_holds_resumes_after_its_last_entry_of_that_term():
    """Node 2 holds entries 4-6 of term 3; the leader holds 4 of term 3, then 5-6 of
    term 4. Node 2 rejects the first probe (prev 6) naming term 3: the leader, which has
    term 3, probes next from its last entry of term 3 (prev 4, accepted), not from the
    follower's first entry of that term (prev 3)."""
    from tests.unit.consensus.raft.test_raft_core import restore

    voters = [1, 2, 3]
    c = Cluster(voters, restores={1: restore(voters, 4, [2, 2, 3, 4, 4]), 2: restore(voters, 4, [2, 2, 3, 3, 3]),
                                  3: restore(voters, 4, [2, 2, 3, 4, 4])})
    c.isolated.add(3)
    c.elect(1)
    probes = [m.prev_log_index for m in c.sent(AppendEntries) if m.to_id == 2]
    assert probes[:2] == [6, 4]
    assert [(e.index, e.term) for e in c.nodes[2].log] == [(e.index, e.term) for e in c.nodes[1].log]


def test_reads_beyond_reads_pending_max_are_refused_busy():
    """ReadIndex requests waiting for confirmation are bounded: past reads_pending_max
    the next one is refused at once with BUSY (and the leader as hint)."""
    c = Cluster([1, 2, 3], reads_pending_max=1)
    c.elect(1)
    c.tick(n=2)
    c.isolated.update({2, 3})  # no confirmation comes back: the first read waits
    assert [e for e in c.step(1, ReadIndex(request_id=1)) if isinstance(e, ReadReady)] == []
    (busy,) = [e for e in c.step(1, ReadIndex(request_id=2)) if isinstance(e, ReadReady)]
    assert (busy.request_id, busy.error, busy.leader_hint) == (2, RaftError.BUSY, 1)


def test_a_vote_request_from_an_older_term_is_refused_with_our_term():
    """A RequestVote carrying a term below ours is answered (not dropped) with a refusal
    in our term, which makes the stale candidate step down."""
    from danube_zmq.consensus.raft.messages import RequestVote

    c = Cluster([1, 2, 3])
    c.elect(1)
    term = c.nodes[2].term
    fx = c.step(2, Receive(message=RequestVote(from_id=3, to_id=2, term=term - 1, last_log_index=99, last_log_term=term)))
    (answer,) = [e.message for e in fx if isinstance(e, Send)]
    assert isinstance(answer, RequestVoteResponse) and not answer.granted and answer.term == term


def test_followers_that_hear_their_leader_never_stand():
    """Every message from the term's leader restarts a follower's election timer: with
    heartbeats every tick, no follower ever starts a (pre-)vote."""
    from danube_zmq.consensus.raft.messages import PreVote

    c = Cluster([1, 2, 3])
    c.elect(1)
    c.tick(n=3 * c.nodes[1].config.election_ticks_max)
    assert [m for m in c.delivered if isinstance(m, PreVote) and m.from_id != 1] == []
    assert c.leader() == 1


def test_a_snapshot_taken_lets_the_next_one_be_suggested_without_waiting():
    """Once the shell reports SnapshotTaken, the suggestion is answered: the next time
    the log outgrows log_entries_max a new TakeSnapshot comes at once, not after
    election_ticks_max ticks."""
    from danube_zmq.consensus.raft import TakeSnapshot

    c = Cluster([1], log_entries_max=2)
    c.step(1, Propose(request_id=0, data=b"x"))
    c.step(1, SnapshotTaken(last_index=c.nodes[1].applied_index, data=b"s"))
    suggested = [k for k in range(1, 5)
                 if any(isinstance(e, TakeSnapshot) for e in c.step(1, Propose(request_id=k, data=b"x")))]
    assert suggested == [3]  # the log past the snapshot reached 3 entries


def test_the_default_log_entries_max_is_ten_thousand():
    """By default a snapshot is suggested when the log holds more than 10,000 entries:
    at the 10,001st, not before."""
    from danube_zmq.consensus.raft import TakeSnapshot

    c = Cluster([1])
    node = c.nodes[1]
    while node.last_index < 10_000:
        assert not any(isinstance(e, TakeSnapshot) for e in node.step(Propose(request_id=0, data=b"")))
    assert any(isinstance(e, TakeSnapshot) for e in node.step(Propose(request_id=0, data=b"")))

"""The Raft core by example: each test drives a few `RaftNode`s by hand (no simulator)
through one behaviour of the algorithm and checks the effects it emits."""

from __future__ import annotations

import random

import pytest

from danube_zmq.consensus.raft import (
    RAFT_PROTOCOL,
    AddLearner,
    Apply,
    ApplySnapshot,
    CompactLog,
    Effect,
    Event,
    PersistEntries,
    PersistHardState,
    PromoteVoter,
    ProposalResult,
    Propose,
    ProposeBatch,
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
    RoleChanged,
    SaveSnapshot,
    Send,
    SnapshotTaken,
    TakeSnapshot,
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
    InstallSnapshotResponse,
    PreVote,
    PreVoteResponse,
    RaftMessage,
    RequestVote,
    RequestVoteResponse,
    TimeoutNow,
    decode_membership,
    encode_membership,
)
from danube_zmq.consensus.types import Entry, EntryKind, HardState, Membership, SnapshotMeta
from danube_zmq.transport.errors import InvalidArgument


class Cluster:
    """A few cores wired by a FIFO in-memory network; `isolated` peers send and receive nothing."""

    def __init__(self, voters: list[int], others: list[int] = (), restores: dict[int, Restore] | None = None, **cfg):
        self.nodes: dict[int, RaftNode] = {}
        self.effects: dict[int, list[Effect]] = {}
        self.inbox: list[RaftMessage] = []
        self.isolated: set[int] = set()
        self.delivered: list[RaftMessage] = []
        restores = restores or {}
        for i in [*voters, *others]:
            self.nodes[i] = RaftNode(RaftConfig(node_id=i, **cfg), random.Random(i))
            self.effects[i] = []
            if i in restores:
                self.step(i, restores[i])
            elif i in voters:
                self.step(i, bootstrap(voters))
            else:
                self.step(i, Restore(hard_state=HardState(term=0, voted_for=None, commit_index=0)))

    def step(self, i: int, event: Event) -> list[Effect]:
        fx = self.nodes[i].step(event)
        self.effects[i].extend(fx)
        self.inbox.extend(e.message for e in fx if isinstance(e, Send))
        return fx

    def deliver(self, rounds_max: int = 10_000) -> None:
        for _ in range(rounds_max):
            if not self.inbox:
                return
            m = self.inbox.pop(0)
            if m.from_id in self.isolated or m.to_id in self.isolated:
                continue
            self.delivered.append(m)
            self.step(m.to_id, Receive(message=m))
        raise AssertionError("the network did not go quiet")

    def tick(self, *ids: int, n: int = 1) -> None:
        for _ in range(n):
            for i in ids or list(self.nodes):
                self.step(i, Tick())
            self.deliver()

    def campaign(self, i: int) -> None:
        """Tick node `i` and deliver one message at a time; stop the moment it leads
        (its first AppendEntries are still in the inbox)."""
        for _ in range(10_000):
            if self.nodes[i].role is Role.LEADER:
                return
            if self.inbox:
                m = self.inbox.pop(0)
                if m.from_id not in self.isolated and m.to_id not in self.isolated:
                    self.step(m.to_id, Receive(message=m))
            else:
                self.step(i, Tick())
        raise AssertionError(f"node {i} was not elected")

    def elect(self, i: int) -> None:
        """Tick node `i` alone until it leads."""
        for _ in range(100):
            self.step(i, Tick())
            self.deliver()
            if self.nodes[i].role is Role.LEADER:
                return
        raise AssertionError(f"node {i} was not elected")

    def leader(self) -> int | None:
        leaders = [i for i, n in self.nodes.items() if n.role is Role.LEADER]
        assert len(leaders) <= 1
        return leaders[0] if leaders else None

    def applied(self, i: int) -> list[Entry]:
        return [entry for e in self.effects[i] if isinstance(e, Apply) for entry in e.entries]

    def of_type(self, i: int, kind: type) -> list:
        return [e for e in self.effects[i] if isinstance(e, kind)]

    def sent(self, kind: type) -> list:
        return [m for m in self.delivered if isinstance(m, kind)]


def entries(start: int, terms: list[int]) -> list[Entry]:
    return [Entry(index=start + k, term=t, kind=EntryKind.COMMAND, data=f"{start + k}@{t}".encode()) for k, t in enumerate(terms)]


def restore(voters: list[int], term: int, log_terms: list[int], voted_for: int | None = None) -> Restore:
    """A peer whose log is the bootstrap entry followed by entries of the given terms."""
    founding = bootstrap(voters)
    return Restore(
        hard_state=HardState(term=term, voted_for=voted_for, commit_index=1),
        entries=[*founding.entries, *entries(2, log_terms)],
    )


# ------------------------------------------------------------------------ elections


def test_a_voter_that_times_out_is_elected_and_commits_a_noop():
    """Node 1 times out first: pre-vote, vote, then leadership in term 2, and its NOOP
    commits once a follower acknowledges it; every peer applies it."""
    c = Cluster([1, 2, 3])
    c.elect(1)
    assert c.leader() == 1 and c.nodes[1].term == 2
    c.tick(1)
    assert all(n.leader_id == 1 and n.term == 2 for n in c.nodes.values())
    assert c.nodes[1].commit_index == 2
    c.tick(1)
    for i in (1, 2, 3):
        assert [(e.index, e.kind) for e in c.applied(i)] == [(1, EntryKind.CONFIG), (2, EntryKind.NOOP)]


def test_election_timeouts_are_randomized_within_the_configured_range():
    """Timeouts come from the injected rng, in [election_ticks_min, election_ticks_max)."""
    seen = set()
    for seed in range(50):
        node = RaftNode(RaftConfig(node_id=1), random.Random(seed))
        node.step(bootstrap([1, 2, 3]))
        seen.add(node.election_timeout)
    assert seen <= set(range(10, 20)) and len(seen) > 5


def test_pre_vote_keeps_a_partitioned_peer_from_disrupting_the_leader():
    """An isolated follower keeps timing out but only pre-votes, so its term stays put;
    when it rejoins, the leader of the same term keeps leading."""
    c = Cluster([1, 2, 3])
    c.elect(1)
    c.tick(n=3)
    c.isolated.add(3)
    c.tick(n=100)
    assert c.nodes[3].term == 2 and c.nodes[3].role is Role.PRE_CANDIDATE
    c.isolated.clear()
    c.tick(n=5)
    assert c.leader() == 1 and all(n.term == 2 for n in c.nodes.values())
    assert c.nodes[3].leader_id == 1


def test_without_pre_vote_a_rejoining_peer_forces_a_new_election():
    """The contrast: with pre-vote off, the isolated peer's term races ahead and its
    return deposes the healthy leader."""
    c = Cluster([1, 2, 3], pre_vote=False, check_quorum=False)
    c.elect(1)
    c.tick(n=3)
    c.isolated.add(3)
    c.tick(n=100)
    assert c.nodes[3].term > 2
    c.isolated.clear()
    c.tick(n=50)
    assert c.nodes[1].term > 2


def test_a_voter_that_hears_from_its_leader_ignores_vote_requests():
    """Leader lease (thesis §4.2.3): a RequestVote with a higher term from a peer is
    ignored, term unchanged, while the leader was heard from within election_ticks_min."""
    c = Cluster([1, 2, 3])
    c.elect(1)
    c.tick(n=2)
    fx = c.step(2, Receive(message=RequestVote(from_id=3, to_id=2, term=9, last_log_index=99, last_log_term=9)))
    assert fx == [] and c.nodes[2].term == 2


def test_a_vote_is_persisted_before_it_is_sent():
    """The effect list puts PersistHardState (term and vote) before the granting answer:
    the shell fsyncs before it sends."""
    c = Cluster([1, 2, 3])
    fx = c.step(2, Receive(message=RequestVote(from_id=1, to_id=2, term=5, last_log_index=1, last_log_term=1)))
    kinds = [type(e) for e in fx]
    persist = kinds.index(PersistHardState)
    answer = next(k for k, e in enumerate(fx) if isinstance(e, Send) and isinstance(e.message, RequestVoteResponse))
    assert persist < answer
    assert fx[persist].hard_state == HardState(term=5, voted_for=1, commit_index=1)
    assert fx[answer].message.granted


def test_entries_are_persisted_before_they_are_acknowledged():
    """A follower's PersistEntries comes before its successful AppendEntriesResponse."""
    c = Cluster([1, 2, 3])
    c.elect(1)
    c.tick(1)
    c.step(1, Propose(request_id=1, data=b"x"))
    m = next(m for m in c.inbox if isinstance(m, AppendEntries) and m.to_id == 2)
    c.inbox.clear()
    fx = c.step(2, Receive(message=m))
    persist = next(k for k, e in enumerate(fx) if isinstance(e, PersistEntries))
    ack = next(k for k, e in enumerate(fx) if isinstance(e, Send) and isinstance(e.message, AppendEntriesResponse))
    assert persist < ack and fx[ack].message.success


def test_a_candidate_with_a_stale_log_is_refused():
    """§3.6.1: votes go only to candidates whose log is at least as up to date."""
    c = Cluster([1, 2, 3], restores={1: restore([1, 2, 3], 3, [2]), 2: restore([1, 2, 3], 3, [3]), 3: restore([1, 2, 3], 3, [3])})
    fx = c.step(2, Receive(message=RequestVote(from_id=1, to_id=2, term=4, last_log_index=2, last_log_term=2)))
    answer = next(e.message for e in fx if isinstance(e, Send))
    assert isinstance(answer, RequestVoteResponse) and not answer.granted
    fx = c.step(3, Receive(message=PreVote(from_id=1, to_id=3, term=4, last_log_index=2, last_log_term=2)))
    answer = next(e.message for e in fx if isinstance(e, Send))
    assert isinstance(answer, PreVoteResponse) and not answer.granted and c.nodes[3].term == 3


def test_check_quorum_makes_an_isolated_leader_step_down():
    """A leader that hears from no quorum for election_ticks_min ticks becomes a
    follower, and answers a pending read with NOT_LEADER."""
    c = Cluster([1, 2, 3])
    c.elect(1)
    c.tick(n=2)
    c.isolated.add(1)
    c.step(1, ReadIndex(request_id=5))
    c.tick(1, n=25)
    assert c.nodes[1].role is Role.FOLLOWER
    (ready,) = c.of_type(1, ReadReady)
    assert ready.request_id == 5 and ready.error is RaftError.NOT_LEADER


def test_leadership_transfer_elects_the_target_at_once():
    """TransferLeadership: the leader catches the target up and sends TimeoutNow; the
    target campaigns past the others' lease and wins the next term."""
    c = Cluster([1, 2, 3])
    c.elect(1)
    c.tick(n=2)
    c.step(1, TransferLeadership(target_id=3))
    c.deliver()
    assert c.sent(TimeoutNow)
    assert c.leader() == 3 and c.nodes[3].term == 3


# ---------------------------------------------------------------------- replication


def test_replication_repairs_a_divergent_follower_with_one_backtrack():
    """Node 2 holds 30 stale entries of term 3 after the shared prefix; the conflict hint
    (term 3 starts at index 11, the leader has no term 3) lets the leader jump straight
    to index 11: one rejection, not thirty. Node 2's log then equals the leader's."""
    voters = [1, 2, 3]
    c = Cluster(
        voters,
        restores={
            1: restore(voters, 4, [2] * 9 + [4] * 20),
            2: restore(voters, 4, [2] * 9 + [3] * 30),
            3: restore(voters, 4, [2] * 9 + [4] * 20),
        },
    )
    c.elect(1)
    c.tick(n=3)
    rejections = [m for m in c.sent(AppendEntriesResponse) if m.from_id == 2 and not m.success]
    assert len(rejections) == 1
    assert (rejections[0].conflict_term, rejections[0].conflict_index) == (3, 11)
    assert [(e.index, e.term) for e in c.nodes[2].log] == [(e.index, e.term) for e in c.nodes[1].log]
    (truncation,) = [e for e in c.of_type(2, PersistEntries) if e.truncate_from is not None]
    assert truncation.truncate_from == 11


def test_a_short_follower_is_probed_from_its_last_index():
    """A follower missing entries answers with conflict_index = its last index + 1."""
    voters = [1, 2, 3]
    c = Cluster(voters, restores={1: restore(voters, 2, [2] * 10), 2: restore(voters, 2, [2] * 2), 3: restore(voters, 2, [2] * 10)})
    c.elect(1)
    c.tick(n=2)
    rejections = [m for m in c.sent(AppendEntriesResponse) if m.from_id == 2 and not m.success]
    assert [(m.conflict_term, m.conflict_index) for m in rejections] == [(0, 4)]
    assert c.nodes[2].last_index == c.nodes[1].last_index


def test_append_limits_bound_each_message():
    """append_entries_max caps entries per AppendEntries, inflight_appends_max the
    messages in flight to one follower."""
    c = Cluster([1, 2, 3], append_entries_max=2, inflight_appends_max=3)
    c.elect(1)
    c.tick(n=2)
    for k in range(20):
        c.step(1, Propose(request_id=k, data=b"x"))
    to_2 = [m for m in c.inbox if isinstance(m, AppendEntries) and m.to_id == 2]
    assert len(to_2) == 3 and all(len(m.entries) <= 2 for m in to_2)
    c.tick(n=10)
    assert c.nodes[2].last_index == c.nodes[1].last_index == c.nodes[1].commit_index


def test_old_term_entries_commit_only_through_a_current_term_entry():
    """Figure 3.7 (Figure 8 of the paper). Node 1 leads term 4 holding (2, term 2);
    node 3 holds (2, term 3). Node 1 replicates (2, 2) to node 2 (a majority holds it)
    but must NOT commit it: node 3 can still win term 5 with node 2's vote and
    overwrite it. Only once node 1's own term-4 entry reaches a majority do both commit."""
    voters = [1, 2, 3]

    def start() -> Cluster:
        c = Cluster(
            voters,
            append_entries_max=1,
            restores={1: restore(voters, 3, [2]), 2: restore(voters, 3, []), 3: restore(voters, 3, [3])},
        )
        c.isolated.add(3)
        c.campaign(1)  # votes from 1 and 2; its NOOP is (3, 4)
        assert c.nodes[1].term == 4 and c.nodes[1].entry_at(3).kind == EntryKind.NOOP
        return c

    # (a) Only (2, 2) reaches node 2, then node 1 dies: nothing may be committed.
    c = start()
    c.inbox.clear()
    c.step(2, Receive(message=AppendEntries(
        from_id=1, to_id=2, term=4, prev_log_index=1, prev_log_term=1, entries=c.nodes[1].log[1:2], leader_commit=1)))
    ack = next(m for m in c.inbox if isinstance(m, AppendEntriesResponse))
    c.inbox.clear()
    c.step(1, Receive(message=ack))
    assert c.nodes[1].progress[2].match == 2
    assert c.nodes[1].commit_index == 1, "an entry of term 2 was committed by counting in term 4"
    c.inbox.clear()
    c.isolated = {1}
    for _ in range(60):  # node 2's lease on node 1 runs out; node 3's last term 3 > node 2's 2: it wins
        c.tick(2, 3)
    assert c.nodes[3].role is Role.LEADER and c.nodes[3].term >= 5  # (node 1, cut off, still thinks it leads term 4)
    assert c.nodes[2].entry_at(2).term == 3  # (2, 2) overwritten: committing it would have lost it

    # (b) The term-4 NOOP reaches node 2 too: index 3 commits, and index 2 with it.
    c = start()
    c.tick(1, 2, n=4)
    assert c.nodes[1].commit_index == 3
    assert [(e.index, e.term) for e in c.applied(1)] == [(1, 1), (2, 2), (3, 4)]


def test_a_follower_commits_no_further_than_what_the_leader_vouched_for():
    """The follower's commit index is min(leader_commit, last index of THIS message):
    a stale tail beyond what the leader just matched must not be committed."""
    voters = [1, 2, 3]
    node = RaftNode(RaftConfig(node_id=2), random.Random(2))
    node.step(restore(voters, 3, [2, 2, 2, 2]))  # (2..5, term 2), only (2, 2) matches the leader
    node.step(Receive(message=AppendEntries(
        from_id=1, to_id=2, term=3, prev_log_index=2, prev_log_term=2, entries=[], leader_commit=5)))
    assert node.commit_index == 2


def test_heartbeats_carry_no_commit_beyond_the_followers_match():
    """A lagging follower's heartbeat says commit = its known match index, never more."""
    c = Cluster([1, 2, 3])
    c.elect(1)
    c.tick(n=2)
    c.isolated.add(3)
    for k in range(3):
        c.step(1, Propose(request_id=k, data=b"x"))
    c.tick(1, 2, n=2)
    c.isolated.clear()
    c.inbox.clear()
    c.step(1, Tick())
    beat = next(m for m in c.inbox if isinstance(m, Heartbeat) and m.to_id == 3)
    assert beat.leader_commit == c.nodes[1].progress[3].match < c.nodes[1].commit_index


def test_install_snapshot_drops_a_log_that_disagrees_at_the_snapshot_index():
    """A follower whose entry at the snapshot's last index has another term discards its
    log (truncate, then compact); one that agrees keeps the entries after the snapshot."""
    voters = [1, 2, 3]
    meta = SnapshotMeta(last_index=3, last_term=3, membership=Membership(voters=voters, learners=[]))
    node = RaftNode(RaftConfig(node_id=2), random.Random(2))
    node.step(restore(voters, 3, [2, 2, 2, 2]))
    fx = node.step(Receive(message=InstallSnapshot(from_id=1, to_id=2, term=3, meta=meta, data=b"s")))
    kinds = [type(e) for e in fx if not isinstance(e, RoleChanged)]
    assert kinds == [SaveSnapshot, PersistEntries, CompactLog, ApplySnapshot, Send]
    assert fx[1] == PersistEntries(entries=[], truncate_from=4)
    assert node.log == [] and node.last_index == 3 and node.commit_index == 3

    node = RaftNode(RaftConfig(node_id=2), random.Random(2))
    node.step(restore(voters, 3, [2, 3, 3, 3]))
    fx = node.step(Receive(message=InstallSnapshot(from_id=1, to_id=2, term=3, meta=meta, data=b"s")))
    kinds = [type(e) for e in fx if not isinstance(e, RoleChanged)]
    assert kinds == [SaveSnapshot, CompactLog, ApplySnapshot, Send]
    assert [e.index for e in node.log] == [4, 5]


def test_a_follower_reports_proposals_refused_with_the_leader_hint():
    c = Cluster([1, 2, 3])
    c.elect(1)
    c.tick(n=2)
    (result,) = [e for e in c.step(2, Propose(request_id=9, data=b"x")) if isinstance(e, ProposalResult)]
    assert result.error is RaftError.NOT_LEADER and result.leader_hint == 1


def test_a_proposal_is_applied_everywhere_at_the_index_the_leader_gave():
    c = Cluster([1, 2, 3])
    c.elect(1)
    c.tick(n=2)
    (result,) = [e for e in c.step(1, Propose(request_id=9, data=b"cmd")) if isinstance(e, ProposalResult)]
    assert result.error is None
    c.tick(n=2)
    for i in (1, 2, 3):
        entry = c.applied(i)[-1]
        assert (entry.index, entry.term, entry.data) == (result.index, result.term, b"cmd")


def test_uncommitted_entries_are_bounded():
    """Past uncommitted_entries_max the leader answers BUSY instead of growing its log."""
    c = Cluster([1, 2, 3], uncommitted_entries_max=3)
    c.elect(1)
    c.tick(n=2)
    c.isolated = {2, 3}
    results = [e for k in range(5) for e in c.step(1, Propose(request_id=k, data=b"x")) if isinstance(e, ProposalResult)]
    assert [r.error for r in results] == [None, None, None, RaftError.BUSY, RaftError.BUSY]


def test_a_batch_of_proposals_goes_out_in_one_append_per_follower():
    c = Cluster([1, 2, 3], uncommitted_entries_max=4)
    c.elect(1)
    c.tick(n=2)
    batch = ProposeBatch(proposals=tuple(Propose(request_id=k, data=b"c%d" % k) for k in range(6)))
    effects = c.step(1, batch)
    results = [e for e in effects if isinstance(e, ProposalResult)]
    # Answered one by one, as if proposed alone: the bound applies inside the batch.
    assert [r.request_id for r in results] == list(range(6))
    assert [r.error for r in results] == [None] * 4 + [RaftError.BUSY] * 2
    assert [r.index for r in results[:4]] == [results[0].index + k for k in range(4)]
    appends = [e.message for e in effects if isinstance(e, Send) and isinstance(e.message, AppendEntries)]
    assert sorted(m.to_id for m in appends) == [2, 3]
    assert all([x.data for x in m.entries] == [b"c0", b"c1", b"c2", b"c3"] for m in appends)
    c.tick(n=2)
    for i in (1, 2, 3):
        assert [e.data for e in c.applied(i)[-4:]] == [b"c0", b"c1", b"c2", b"c3"]
    refused = [e for e in c.step(2, batch) if isinstance(e, ProposalResult)]
    assert [r.error for r in refused] == [RaftError.NOT_LEADER] * 6


# ------------------------------------------------------------------------ snapshots


def test_snapshot_compacts_the_log_and_catches_up_a_lagging_follower():
    """With log_entries_max=4 the leader suggests a snapshot; SnapshotTaken saves it and
    compacts the log; node 3, cut off meanwhile, gets InstallSnapshot, replaces its state
    machine, then receives the entries after the snapshot."""
    c = Cluster([1, 2, 3], log_entries_max=4)
    c.elect(1)
    c.tick(n=2)
    c.isolated.add(3)
    for k in range(8):
        c.step(1, Propose(request_id=k, data=f"cmd{k}".encode()))
        c.tick(1, 2)
    (suggestion, *_) = c.of_type(1, TakeSnapshot)
    applied = c.nodes[1].applied_index
    assert suggestion.applied_index <= applied
    fx = c.step(1, SnapshotTaken(last_index=applied, data=b"state@%d" % applied))
    save, compact = fx
    assert isinstance(save, SaveSnapshot) and isinstance(compact, CompactLog)
    assert save.meta.last_index == applied and save.meta.last_term == c.nodes[1].term_at(applied)
    assert save.meta.membership == Membership(voters=[1, 2, 3], learners=[])
    assert c.nodes[1].snapshot.last_index == applied and c.nodes[1].log == []
    c.step(1, Propose(request_id=99, data=b"after"))
    c.isolated.clear()
    c.tick(n=5)
    assert [m.to_id for m in c.sent(InstallSnapshot)] == [3]
    (installed,) = c.of_type(3, ApplySnapshot)
    assert installed.data == b"state@%d" % applied
    assert c.nodes[3].commit_index == c.nodes[1].commit_index == applied + 1
    assert c.applied(3)[-1].data == b"after"


def test_restart_applies_the_snapshot_then_the_committed_entries():
    """Restore: ApplySnapshot first, then the committed entries after it, in order."""
    meta = SnapshotMeta(last_index=5, last_term=2, membership=Membership(voters=[1, 2, 3], learners=[]))
    node = RaftNode(RaftConfig(node_id=1), random.Random(1))
    fx = node.step(Restore(hard_state=HardState(term=3, voted_for=None, commit_index=7), snapshot=meta,
                           snapshot_data=b"s", entries=entries(6, [2, 3, 3])))
    assert isinstance(fx[0], ApplySnapshot) and fx[0].data == b"s"
    assert isinstance(fx[1], Apply) and [e.index for e in fx[1].entries] == [6, 7]
    assert node.last_index == 8 and node.commit_index == 7


def test_restart_finishes_an_interrupted_snapshot_install():
    """A crash after SaveSnapshot but before the conflicting log was dropped: the core
    notices (the entry at the snapshot index has another term) and drops it."""
    meta = SnapshotMeta(last_index=4, last_term=3, membership=Membership(voters=[1, 2, 3], learners=[]))
    node = RaftNode(RaftConfig(node_id=1), random.Random(1))
    fx = node.step(Restore(hard_state=HardState(term=3, voted_for=None, commit_index=1), snapshot=meta,
                           snapshot_data=b"s", entries=entries(2, [2, 2, 2, 2, 2])))
    assert PersistEntries(entries=[], truncate_from=5) in fx and CompactLog(upto_index=4) in fx
    assert node.log == [] and node.last_index == 4


# ----------------------------------------------------------------------- membership


def test_membership_add_learner_promote_then_remove_the_leader():
    """Node 4 joins empty as a learner (it replicates, does not count), is promoted, and
    then the leader removes itself: once that commits it steps down, hands over with
    TimeoutNow, and a remaining voter leads. A second change while one is uncommitted
    is refused."""
    c = Cluster([1, 2, 3], others=[4])
    c.elect(1)
    c.tick(n=2)

    def change(request_id: int, change) -> ProposalResult:
        (result,) = [e for e in c.step(1, ProposeConfig(request_id=request_id, change=change)) if isinstance(e, ProposalResult)]
        return result

    assert change(1, AddLearner(node_id=4)).error is None
    assert change(2, PromoteVoter(node_id=4)).error is RaftError.CONFIG_CHANGE_IN_PROGRESS
    c.tick(n=3)
    assert c.nodes[4].membership == Membership(voters=[1, 2, 3], learners=[4])
    assert c.nodes[4].last_index == c.nodes[1].last_index

    # A learner does not count toward commit.
    c.isolated = {2, 3}
    (result,) = [e for e in c.step(1, Propose(request_id=3, data=b"x")) if isinstance(e, ProposalResult)]
    c.tick(1, 4, n=2)
    assert c.nodes[4].last_index == result.index and c.nodes[1].commit_index < result.index
    c.isolated = set()
    c.tick(n=10)  # the AppendEntries lost to 2 and 3 are resent after election_ticks_min // 2 ticks
    assert c.nodes[1].commit_index == result.index

    assert change(4, PromoteVoter(node_id=2)).error is RaftError.INVALID_CONFIG_CHANGE
    assert change(5, PromoteVoter(node_id=4)).error is None
    c.tick(n=3)
    assert all(n.membership.voters == [1, 2, 3, 4] for n in c.nodes.values())

    assert change(6, RemoveVoter(node_id=1)).error is None
    c.tick(n=3)
    assert c.nodes[1].role is Role.FOLLOWER and not c.nodes[1].is_voter()
    assert c.sent(TimeoutNow)
    c.tick(2, 3, 4, n=30)
    new = c.leader()
    assert new in (2, 3, 4) and c.nodes[new].membership.voters == [2, 3, 4]


def test_invalid_membership_changes_are_refused():
    c = Cluster([1])
    c.elect(1)
    results = [
        e.error
        for change in (PromoteVoter(node_id=7), RemoveVoter(node_id=7), RemoveVoter(node_id=1), AddLearner(node_id=1))
        for e in c.step(1, ProposeConfig(request_id=1, change=change))
        if isinstance(e, ProposalResult)
    ]
    assert results == [RaftError.INVALID_CONFIG_CHANGE] * 4


def test_a_single_voter_commits_alone():
    c = Cluster([1])
    c.elect(1)
    fx = c.step(1, Propose(request_id=1, data=b"x"))
    assert [type(e) for e in fx] == [PersistEntries, ProposalResult, Apply]


# ---------------------------------------------------------------------------- reads


def test_read_index_waits_for_a_quorum_to_confirm_leadership():
    """ReadIndex: nothing until a heartbeat round is answered by a quorum, then
    ReadReady with the commit index taken when the read arrived."""
    c = Cluster([1, 2, 3])
    c.elect(1)
    c.tick(n=2)
    commit = c.nodes[1].commit_index
    fx = c.step(1, ReadIndex(request_id=7))
    assert not any(isinstance(e, ReadReady) for e in fx)
    assert {m.to_id for m in c.inbox if isinstance(m, Heartbeat)} == {2, 3}
    c.deliver()
    (ready,) = c.of_type(1, ReadReady)
    assert (ready.request_id, ready.read_index, ready.error) == (7, commit, None)


def test_read_index_without_a_quorum_never_answers():
    c = Cluster([1, 2, 3])
    c.elect(1)
    c.tick(n=2)
    c.isolated = {2, 3}
    c.step(1, ReadIndex(request_id=7))
    c.tick(1, n=3)
    assert c.of_type(1, ReadReady) == []


def test_read_index_on_a_new_leader_waits_for_its_noop():
    """A leader does not know its commit index before an entry of its term commits."""
    c = Cluster([1, 2, 3])
    c.campaign(1)
    assert c.nodes[1].commit_index < c.nodes[1].last_index
    c.step(1, ReadIndex(request_id=3))
    assert c.of_type(1, ReadReady) == []
    c.deliver()
    c.tick(n=2)
    (ready,) = c.of_type(1, ReadReady)
    assert ready.read_index >= 2 and ready.error is None


def test_read_index_on_a_follower_is_refused_with_the_leader_hint():
    c = Cluster([1, 2, 3])
    c.elect(1)
    c.tick(n=2)
    (ready,) = [e for e in c.step(3, ReadIndex(request_id=1)) if isinstance(e, ReadReady)]
    assert ready.error is RaftError.NOT_LEADER and ready.leader_hint == 1


# ----------------------------------------------------------------------- wire, config


def test_every_raft_message_round_trips_through_the_codec():
    meta = SnapshotMeta(last_index=3, last_term=2, membership=Membership(voters=[1, 2], learners=[3]))
    samples = [
        PreVote(from_id=1, to_id=2, term=3, last_log_index=4, last_log_term=2),
        PreVoteResponse(from_id=2, to_id=1, term=3, granted=True),
        RequestVote(from_id=1, to_id=2, term=3, last_log_index=4, last_log_term=2, transfer=True),
        RequestVoteResponse(from_id=2, to_id=1, term=3, granted=False),
        AppendEntries(from_id=1, to_id=2, term=3, prev_log_index=1, prev_log_term=1, entries=entries(2, [2, 3]),
                      leader_commit=2, context=5),
        AppendEntriesResponse(from_id=2, to_id=1, term=3, success=False, match_index=0, rejected_index=4,
                              conflict_term=2, conflict_index=3, context=5),
        Heartbeat(from_id=1, to_id=2, term=3, leader_commit=2, context=1),
        HeartbeatResponse(from_id=2, to_id=1, term=3, context=1),
        InstallSnapshot(from_id=1, to_id=2, term=3, meta=meta, data=b"\x00snap"),
        InstallSnapshotResponse(from_id=2, to_id=1, term=3, match_index=3),
        TimeoutNow(from_id=1, to_id=2, term=3),
    ]
    assert {type(m) for m in samples} == set(RAFT_PROTOCOL.message_types())
    for m in samples:
        assert RAFT_PROTOCOL.decode(RAFT_PROTOCOL.encode(m)) == m
    assert min(cls.TAG for cls in RAFT_PROTOCOL.message_types()) >= 16


def test_membership_entries_round_trip_and_reject_garbage():
    m = Membership(voters=[1, 2, 3], learners=[4])
    assert decode_membership(encode_membership(m)) == m
    with pytest.raises(InvalidArgument):
        decode_membership(b"\x93\x01\x02\x03")


@pytest.mark.parametrize(
    "bad",
    [
        {"heartbeat_ticks": 10, "election_ticks_min": 10},
        {"election_ticks_min": 20, "election_ticks_max": 20},
        {"heartbeat_ticks": 0},
        {"append_entries_max": 0},
    ],
)
def test_config_is_validated(bad):
    with pytest.raises(InvalidArgument):
        RaftConfig(node_id=1, **bad)


def test_a_node_is_deterministic_given_its_seed():
    """Same config, same seed, same events: same effects (the simulator relies on it)."""

    def run() -> list[Effect]:
        c = Cluster([1, 2, 3])
        c.elect(2)
        c.tick(n=5)
        return [e for fx in c.effects.values() for e in fx]

    assert run() == run()

"""The Raft algorithm as a pure core: no sockets, no disk, no clock, no global randomness.

`RaftNode.step(event) -> effects` is the issue's `step(state, event) -> (state,
effects)` with the state updated in place: a `RaftNode` is owned by exactly one
caller (the peer actor, or one simulated peer), which never shares it, so copying
the whole log on every event would buy nothing. Given the same `RaftConfig`, the
same seeded `random.Random` and the same events, a node emits the same effects.
`clone()` forks a node (tests that explore two futures).

What it implements (Raft thesis chapters 3, 4, 5, 6, 9; etcd's raft where the thesis
leaves a choice open):
  - elections with randomized timeouts, pre-vote (§9.6) and check-quorum: a peer
    that was partitioned does not raise terms, and a voter that heard from a leader
    within `election_ticks_min` ignores elections, unless the leader asked for one
    (leadership transfer, `TimeoutNow`); a leader that does not hear from a quorum
    for `election_ticks_min` ticks steps down;
  - log replication with the consistency check, probe / replicate / snapshot states
    per follower, `inflight_appends_max` messages in flight, fast backtracking with
    the (conflict_term, conflict_index) hint;
  - commit of current-term entries only, by counting voters' match indexes (§3.6.2);
    a new leader appends a NOOP so that earlier entries commit;
  - ReadIndex (§6.4): the leader records its commit index, confirms its leadership
    with one heartbeat round answered by a quorum, then hands back the read index;
  - snapshots: the shell's `SnapshotTaken` compacts the log; a follower whose next
    entry was compacted gets `InstallSnapshot`;
  - single-server membership changes (§4.1): a CONFIG entry takes effect when
    appended; a second change is refused while one is uncommitted, and until the
    leader's NOOP commits (Ongaro's 2015 fix for single-server changes, raft-dev);
    learners replicate but neither vote nor count; a removed leader steps down once
    its removal commits.

The effect-ordering contract (persist before anything that follows) is described
in events.py.
"""

from __future__ import annotations

import copy
import random
from collections import deque
from dataclasses import dataclass

from danube_zmq.consensus.raft.events import (
    AddLearner,
    Apply,
    ApplySnapshot,
    CompactLog,
    Effect,
    Event,
    LogPersisted,
    PersistEntries,
    PersistHardState,
    PromoteVoter,
    ProposalResult,
    Propose,
    ProposeBatch,
    ProposeConfig,
    RaftError,
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

_EMPTY_MEMBERSHIP = Membership(voters=[], learners=[])


@dataclass(frozen=True, slots=True, kw_only=True)
class RaftConfig:
    """One peer's Raft settings. Time is counted in ticks (the shell's timer period)."""

    node_id: int
    heartbeat_ticks: int = 1  # a leader sends heartbeats every this many ticks
    election_ticks_min: int = 10  # election timeouts are drawn from [min, max); also the
    election_ticks_max: int = 20  # leader lease (pre-vote, check-quorum) length
    log_entries_max: int = 10_000  # suggest a snapshot when the log holds more than this
    append_entries_max: int = 512  # entries per AppendEntries
    append_bytes_max: int = 1 << 20  # entry data bytes per AppendEntries (at least one entry)
    inflight_appends_max: int = 64  # AppendEntries in flight per follower (replicate state)
    uncommitted_entries_max: int = 4096  # proposals beyond this are refused with BUSY
    reads_pending_max: int = 1024  # ReadIndex requests waiting for confirmation
    pre_vote: bool = True
    check_quorum: bool = True
    # A leader's own appends as `PersistEntries(background=True)`: it replicates while its
    # fsync runs and counts itself toward a commit only after `LogPersisted` (thesis
    # 10.2.1). Off for a shell that runs every persist before what follows it.
    leader_persist_async: bool = False

    def __post_init__(self) -> None:
        if not 0 < self.heartbeat_ticks < self.election_ticks_min < self.election_ticks_max:
            raise InvalidArgument(
                "raft: need 0 < heartbeat_ticks < election_ticks_min < election_ticks_max, got "
                f"{self.heartbeat_ticks}, {self.election_ticks_min}, {self.election_ticks_max}"
            )
        for name in (
            "log_entries_max",
            "append_entries_max",
            "append_bytes_max",
            "inflight_appends_max",
            "uncommitted_entries_max",
            "reads_pending_max",
        ):
            if getattr(self, name) < 1:
                raise InvalidArgument(f"raft: {name} must be at least 1")


def bootstrap(voters: list[int]) -> Restore:
    """What every founding voter starts from (identically): entry 1 is the initial
    membership at term 1, committed by fiat. Joining peers start empty instead."""
    if not voters or len(set(voters)) != len(voters):
        raise InvalidArgument("raft: bootstrap needs distinct voter ids")
    data = encode_membership(Membership(voters=sorted(voters), learners=[]))
    entry = Entry(index=1, term=1, kind=EntryKind.CONFIG, data=data)
    return Restore(hard_state=HardState(term=1, voted_for=None, commit_index=1), entries=[entry])


def force_new_cluster(node_id: int, hard_state: HardState, last_index: int, last_term: int) -> tuple[Entry, HardState]:
    """Disaster recovery (etcd's `--force-new-cluster`): the entry and hard state one
    surviving member persists to become the only voter of a new configuration, keeping
    its log and state. The entry's term is past every term the member knew, and like the
    bootstrap entry it is committed by fiat, and with it every entry before it, whether
    the lost quorum committed it or not (as etcd does). Only for a quorum lost for good:
    what only the lost members held is gone."""
    if node_id < 1:
        raise InvalidArgument(f"raft: node id must be at least 1, got {node_id}")
    term = max(hard_state.term, last_term) + 1
    data = encode_membership(Membership(voters=[node_id], learners=[]))
    entry = Entry(index=last_index + 1, term=term, kind=EntryKind.CONFIG, data=data)
    return entry, HardState(term=term, voted_for=None, commit_index=entry.index)


def quorum(voters: list[int]) -> int:
    return len(voters) // 2 + 1


_PROBE, _REPLICATE, _SNAPSHOT = 0, 1, 2


class Progress:
    """The leader's view of one follower (etcd's Progress)."""

    __slots__ = (
        "acked_context",
        "commit_sent",
        "incarnation",
        "inflight",
        "match",
        "next",
        "paused",
        "recent_active",
        "snapshot_elapsed",
        "snapshot_index",
        "stall_elapsed",
        "state",
    )

    def __init__(self, next_index: int) -> None:
        self.match = 0  # highest index known to match the leader's log
        self.next = next_index  # next index to send
        self.state = _PROBE
        self.paused = False  # probe: one AppendEntries at a time, until answered or a heartbeat answer
        self.inflight: deque[int] = deque()  # replicate: last index of each AppendEntries in flight
        self.recent_active = True  # heard from since the last check-quorum round
        self.snapshot_index = 0  # snapshot: the index of the snapshot sent
        self.snapshot_elapsed = 0
        self.stall_elapsed = 0  # replicate: ticks since match last advanced while behind
        self.acked_context = 0  # highest read-index round this follower confirmed
        self.commit_sent = 0  # highest commit index this follower was told (bounded by its match)
        self.incarnation = 0  # the follower's incarnation in its latest answer (0: none yet)


class _PendingRead:
    __slots__ = ("context", "read_index", "request_id")

    def __init__(self, request_id: int) -> None:
        self.request_id = request_id
        self.read_index = 0
        self.context = 0  # 0: waiting for the leader's first commit in its term


class RaftNode:
    """One Raft peer's volatile and persistent state; see the module docstring."""

    def __init__(self, config: RaftConfig, rng: random.Random) -> None:
        self.config = config
        self.id = config.node_id
        self.rng = rng
        self.restored = False
        self.incarnation = 0  # drawn at Restore: tells a leader this peer restarted
        # persistent (mirrored on disk through the Persist* effects)
        self.term = 0
        self.voted_for: int | None = None
        self.log: list[Entry] = []  # entries after the snapshot; log[k].index == snapshot_index + 1 + k
        self.snapshot = SnapshotMeta(last_index=0, last_term=0, membership=_EMPTY_MEMBERSHIP)
        self.snapshot_data = b""
        # volatile
        self.role = Role.FOLLOWER
        self.leader_id: int | None = None
        self.commit_index = 0
        self.applied_index = 0
        # Our log is on disk up to here (entries after it may be a leader's background
        # writes in flight); the leader counts this, not last_index, as its own match.
        self.durable_index = 0
        self.membership = _EMPTY_MEMBERSHIP
        self.config_index = 0  # index of the entry (or snapshot) that defines `membership`
        self.election_elapsed = 0
        self.heartbeat_elapsed = 0
        self.election_timeout = config.election_ticks_min
        self.votes: dict[int, bool] = {}
        self.progress: dict[int, Progress] = {}
        self.leader_first_index = 0  # index of this leader's NOOP
        self.reads: list[_PendingRead] = []
        self.read_seq = 0  # read-index rounds; never reset within a node lifetime
        self.transfer_target: int | None = None
        self.transfer_elapsed = 0
        self.snapshot_suggested_elapsed: int | None = None
        self._fx: list[Effect] = []

    # ------------------------------------------------------------------ public

    def step(self, event: Event) -> list[Effect]:
        """Process one event; return the effects for the shell to execute in order."""
        assert self.restored or type(event) is Restore, "the first event must be Restore"
        self._fx = fx = []
        before = (self.role, self.term, self.leader_id)
        term_before = self.term
        _HANDLERS[type(event)](self, event)
        if (self.role, self.term, self.leader_id) != before:
            fx.append(RoleChanged(role=self.role, term=self.term, leader_id=self.leader_id))
        self._check(term_before)
        self._fx = []
        return fx

    def clone(self) -> RaftNode:
        """An independent copy (the rng too), for tests that fork a node."""
        return copy.deepcopy(self)

    @property
    def last_index(self) -> int:
        return self.log[-1].index if self.log else self.snapshot.last_index

    @property
    def last_term(self) -> int:
        return self.log[-1].term if self.log else self.snapshot.last_term

    def term_at(self, index: int) -> int | None:
        """The term of the entry at `index`; None if compacted away or beyond the log."""
        offset = index - self.snapshot.last_index
        if offset == 0:
            return self.snapshot.last_term
        if offset < 0 or offset > len(self.log):
            return None
        return self.log[offset - 1].term

    def entry_at(self, index: int) -> Entry | None:
        offset = index - self.snapshot.last_index
        if offset <= 0 or offset > len(self.log):
            return None
        return self.log[offset - 1]

    def hard_state(self) -> HardState:
        return HardState(term=self.term, voted_for=self.voted_for, commit_index=self.commit_index)

    def is_voter(self) -> bool:
        return self.id in self.membership.voters

    # ------------------------------------------------------------------ events

    def commit_waits_for_own_copy(self) -> int:
        """The lowest `LogPersisted` index that may commit something now, or 0 when none
        can: this node does not lead, or the voters' acknowledgements make no majority
        past the commit index even with all of our log on disk. Until a `LogPersisted`
        reaches it, stepping one changes nothing but `durable_index`, so a shell may step
        it late (with the next event) instead of waking for it."""
        voters = self.membership.voters
        if self.role is not Role.LEADER or self.id not in voters or self.durable_index >= self.last_index:
            return 0
        matches = sorted((self.last_index if v == self.id else self.progress[v].match for v in voters), reverse=True)
        candidate = matches[quorum(voters) - 1]
        if candidate <= self.commit_index or self.term_at(candidate) != self.term:
            return 0  # terms only grow along the log: no lower index commits by counting either
        # Our own copy at or below the commit index adds no vote past it.
        return max(self.durable_index, self.commit_index) + 1

    def _on_restore(self, ev: Restore) -> None:
        assert not self.restored, "Restore twice"
        self.restored = True
        self.incarnation = self.rng.getrandbits(63) or 1
        hs = ev.hard_state
        self.term = hs.term
        self.voted_for = hs.voted_for
        if ev.snapshot is not None:
            self.snapshot = ev.snapshot
            self.snapshot_data = ev.snapshot_data
        snap = self.snapshot
        kept: list[Entry] = []
        stale = conflict = False
        for entry in ev.entries:
            if entry.index < snap.last_index:
                stale = True
                continue
            if entry.index == snap.last_index:
                stale = True
                if entry.term != snap.last_term:
                    # A crash between SaveSnapshot and the truncation of a conflicting log:
                    # everything after the snapshot belongs to a history the snapshot replaced.
                    conflict = True
                    break
                continue
            assert entry.index == snap.last_index + 1 + len(kept), "log store returned a gap"
            kept.append(entry)
        if conflict:
            self._fx.append(PersistEntries(entries=[], truncate_from=snap.last_index + 1))
        if stale:
            # A crash between SaveSnapshot and CompactLog: finish the compaction, so the
            # store's log ends where ours does.
            self._fx.append(CompactLog(upto_index=snap.last_index))
        self.log = kept
        self.commit_index = max(hs.commit_index, snap.last_index)
        assert self.commit_index <= self.last_index, "persisted commit index beyond the log"
        self.applied_index = snap.last_index
        self.durable_index = self.last_index
        self._reload_membership()
        self._reset_election_timer()
        if snap.last_index > 0:
            self._fx.append(ApplySnapshot(meta=snap, data=self.snapshot_data))
        self._apply_committed()
        if self.membership.voters == [self.id]:
            # The sole voter needs nobody's vote: waiting out an election timeout (a
            # standalone broker's start) would serve nothing.
            self._campaign(transfer=False)

    def _on_tick(self, _ev: Tick) -> None:
        cfg = self.config
        if self.snapshot_suggested_elapsed is not None:
            self.snapshot_suggested_elapsed += 1
            if self.snapshot_suggested_elapsed >= cfg.election_ticks_max:
                self.snapshot_suggested_elapsed = None  # may suggest again
        if self.role is Role.LEADER:
            self._tick_leader()
            return
        self.election_elapsed += 1
        if self.election_elapsed >= self.election_timeout and self.is_voter():
            if cfg.pre_vote:
                self._campaign_pre_vote()
            else:
                self._campaign(transfer=False)

    def _tick_leader(self) -> None:
        cfg = self.config
        self.heartbeat_elapsed += 1
        self.election_elapsed += 1
        last = self.last_index
        stall_max = max(2, cfg.election_ticks_min // 2)  # no acknowledgement for this long: assume a loss
        for peer, pr in self.progress.items():
            if pr.state == _SNAPSHOT:
                pr.snapshot_elapsed += 1
                if pr.snapshot_elapsed >= cfg.election_ticks_min:
                    # No answer to InstallSnapshot: probe again (which resends it if still needed).
                    self._become_probe(pr, pr.match + 1)
                    self._send_append(peer, pr, allow_empty=True)
            elif pr.state == _REPLICATE and pr.match < last:
                pr.stall_elapsed += 1
                if pr.stall_elapsed >= stall_max:
                    # AppendEntries lost on the way: fall back to probing from the match.
                    self._become_probe(pr, pr.match + 1)
                    self._send_append(peer, pr, allow_empty=True)
        if self.transfer_target is not None:
            self.transfer_elapsed += 1
            if self.transfer_elapsed >= cfg.election_ticks_min:
                self.transfer_target = None
        if self.election_elapsed >= cfg.election_ticks_min:
            self.election_elapsed = 0
            if cfg.check_quorum and not self._quorum_active():
                self._become_follower(self.term, None)
                return
            for pr in self.progress.values():
                pr.recent_active = False
        if self.heartbeat_elapsed >= cfg.heartbeat_ticks:
            self.heartbeat_elapsed = 0
            self._broadcast_heartbeat()

    def _on_propose(self, ev: Propose) -> None:
        if self._append_proposal(ev):
            self._after_append()

    def _on_propose_batch(self, ev: ProposeBatch) -> None:
        appended = False
        for proposal in ev.proposals:
            appended = self._append_proposal(proposal) or appended
        if appended:
            self._after_append()

    def _append_proposal(self, ev: Propose) -> bool:
        error = self._refuse_proposal()
        if error is not None:
            self._fx.append(ProposalResult(request_id=ev.request_id, error=error, leader_hint=self.leader_id))
            return False
        entry = self._append(EntryKind.COMMAND, ev.data)
        self._fx.append(ProposalResult(request_id=ev.request_id, index=entry.index, term=entry.term))
        return True

    def _refuse_proposal(self) -> RaftError | None:
        if self.role is not Role.LEADER:
            return RaftError.NOT_LEADER
        if self.transfer_target is not None:
            return RaftError.TRANSFERRING
        if self.last_index - self.commit_index >= self.config.uncommitted_entries_max:
            return RaftError.BUSY
        return None

    def _on_propose_config(self, ev: ProposeConfig) -> None:
        error = self._refuse_proposal()
        if error is None:
            if self.commit_index < self.leader_first_index or self.config_index > self.commit_index:
                error = RaftError.CONFIG_CHANGE_IN_PROGRESS
        new: Membership | None = None
        if error is None:
            new, error = self._changed_membership(ev)
        if error is not None:
            self._fx.append(ProposalResult(request_id=ev.request_id, error=error, leader_hint=self.leader_id))
            return
        assert new is not None
        entry = self._append(EntryKind.CONFIG, encode_membership(new))
        self._fx.append(ProposalResult(request_id=ev.request_id, index=entry.index, term=entry.term))
        self._after_append()

    def _changed_membership(self, ev: ProposeConfig) -> tuple[Membership | None, RaftError | None]:
        voters, learners = list(self.membership.voters), list(self.membership.learners)
        change, node = ev.change, ev.change.node_id
        if isinstance(change, AddLearner):
            if node in voters or node in learners:
                return None, RaftError.INVALID_CONFIG_CHANGE
            learners.append(node)
        elif isinstance(change, PromoteVoter):
            if node not in learners:
                return None, RaftError.INVALID_CONFIG_CHANGE
            pr = self.progress.get(node)
            if pr is None or not self._caught_up(pr):
                return None, RaftError.LEARNER_BEHIND
            learners.remove(node)
            voters.append(node)
        elif isinstance(change, RemoveVoter):
            if node in voters:
                if len(voters) == 1:
                    return None, RaftError.INVALID_CONFIG_CHANGE
                voters.remove(node)
            elif node in learners:
                learners.remove(node)
            else:
                return None, RaftError.INVALID_CONFIG_CHANGE
        else:  # pragma: no cover - the type union is closed
            return None, RaftError.INVALID_CONFIG_CHANGE
        return Membership(voters=sorted(voters), learners=sorted(learners)), None

    def _caught_up(self, pr: Progress) -> bool:
        """May this learner become a voter? Only if it acknowledged, in this leader's term
        (progress is rebuilt at election, so match > 0 is an answer to us) and within the
        last check-quorum round, a log up to append_entries_max entries short of ours.
        A learner that never answered (a wrong address) would otherwise be promoted while
        the log is short, and a dead voter can cost the quorum for good (issue 19, §3)."""
        return pr.match > 0 and pr.recent_active and pr.match + self.config.append_entries_max >= self.last_index

    def _on_read_index(self, ev: ReadIndex) -> None:
        if self.role is not Role.LEADER:
            self._fx.append(ReadReady(request_id=ev.request_id, error=RaftError.NOT_LEADER, leader_hint=self.leader_id))
            return
        if len(self.reads) >= self.config.reads_pending_max:
            self._fx.append(ReadReady(request_id=ev.request_id, error=RaftError.BUSY, leader_hint=self.id))
            return
        read = _PendingRead(ev.request_id)
        self.reads.append(read)
        if self.term_at(self.commit_index) == self.term:
            self._start_read_round()
        # else: wait until this leader's NOOP commits (its commit index is not known before).

    def _on_snapshot_taken(self, ev: SnapshotTaken) -> None:
        snap = self.snapshot
        if ev.last_index <= snap.last_index:
            return  # an older snapshot than the one we have
        assert ev.last_index <= self.applied_index, "snapshot beyond the applied index"
        term = self.term_at(ev.last_index)
        assert term is not None
        meta = SnapshotMeta(last_index=ev.last_index, last_term=term, membership=self._membership_at(ev.last_index))
        self._fx.append(SaveSnapshot(meta=meta, data=ev.data))
        self._fx.append(CompactLog(upto_index=ev.last_index))
        del self.log[: ev.last_index - snap.last_index]
        self.snapshot = meta
        self.snapshot_data = ev.data
        self.snapshot_suggested_elapsed = None

    def _on_log_persisted(self, ev: LogPersisted) -> None:
        # Same (index, term) means the same entry and the same log before it (Log
        # Matching); otherwise the write was overtaken by a truncation, which was
        # itself a foreground write that already moved durable_index.
        if ev.index <= self.durable_index or ev.index > self.last_index:
            return
        if ev.index > self.snapshot.last_index and self.term_at(ev.index) != ev.term:
            return
        self.durable_index = ev.index
        if self.role is Role.LEADER:
            self._maybe_commit()

    def _on_transfer(self, ev: TransferLeadership) -> None:
        target = ev.target_id
        if self.role is not Role.LEADER or target == self.id or target not in self.membership.voters:
            return
        self.transfer_target = target
        self.transfer_elapsed = 0
        pr = self.progress[target]
        if pr.match == self.last_index:
            self._send(TimeoutNow(from_id=self.id, to_id=target, term=self.term))
        else:
            self._send_append(target, pr, allow_empty=False)

    # ------------------------------------------------------------------ messages

    def _on_receive(self, ev: Receive) -> None:
        m = ev.message
        assert m.to_id == self.id, f"message for {m.to_id} delivered to {self.id}"
        if m.term > self.term:
            if isinstance(m, (PreVote, RequestVote)):
                lease = (self.config.check_quorum or self.config.pre_vote) and self.leader_id is not None
                in_lease = lease and self.election_elapsed < self.config.election_ticks_min
                if in_lease and not (isinstance(m, RequestVote) and m.transfer):
                    # We hear from a leader: this peer was cut off, do not let it disrupt us.
                    if isinstance(m, PreVote):
                        self._send(PreVoteResponse(from_id=self.id, to_id=m.from_id, term=self.term, granted=False))
                    return
            if isinstance(m, PreVote) or (isinstance(m, PreVoteResponse) and m.granted):
                pass  # pre-votes never change terms
            else:
                leader = m.from_id if isinstance(m, (AppendEntries, Heartbeat, InstallSnapshot)) else None
                self._become_follower(m.term, leader)
        elif m.term < self.term:
            if isinstance(m, (AppendEntries, Heartbeat, InstallSnapshot)):
                # A stale leader: our term in the answer makes it step down. (A peer whose
                # term ran ahead in a partition frees itself this way; pre-vote prevents that.)
                self._send(HeartbeatResponse(from_id=self.id, to_id=m.from_id, term=self.term, incarnation=self.incarnation))
            elif isinstance(m, PreVote):
                self._send(PreVoteResponse(from_id=self.id, to_id=m.from_id, term=self.term, granted=False))
            elif isinstance(m, RequestVote):
                self._send(RequestVoteResponse(from_id=self.id, to_id=m.from_id, term=self.term, granted=False))
            return
        _MESSAGE_HANDLERS[type(m)](self, m)

    def _on_pre_vote(self, m: PreVote) -> None:
        granted = m.term > self.term and self._log_ok(m.last_log_index, m.last_log_term)
        term = m.term if granted else self.term
        self._send(PreVoteResponse(from_id=self.id, to_id=m.from_id, term=term, granted=granted))

    def _on_pre_vote_response(self, m: PreVoteResponse) -> None:
        if self.role is not Role.PRE_CANDIDATE:
            return
        if m.granted and m.term != self.term + 1:
            return  # an answer to an older pre-vote round
        self.votes[m.from_id] = m.granted
        won = self._tally()
        if won is True:
            self._campaign(transfer=False)
        elif won is False:
            self._become_follower(self.term, None)

    def _on_request_vote(self, m: RequestVote) -> None:
        can_vote = self.voted_for == m.from_id or (self.voted_for is None and self.leader_id is None)
        granted = can_vote and self._log_ok(m.last_log_index, m.last_log_term)
        if granted:
            self.voted_for = m.from_id
            self._persist_hard_state()
            self._reset_election_timer()
        self._send(RequestVoteResponse(from_id=self.id, to_id=m.from_id, term=self.term, granted=granted))

    def _on_request_vote_response(self, m: RequestVoteResponse) -> None:
        if self.role is not Role.CANDIDATE:
            return
        self.votes[m.from_id] = m.granted
        won = self._tally()
        if won is True:
            self._become_leader()
        elif won is False:
            self._become_follower(self.term, None)

    def _follow(self, leader: int) -> None:
        """A message from this term's leader."""
        assert self.role is not Role.LEADER, f"two leaders in term {self.term}: {self.id} and {leader}"
        if self.role is not Role.FOLLOWER:
            self._become_follower(self.term, leader)
        self.leader_id = leader
        self.election_elapsed = 0

    def _on_append_entries(self, m: AppendEntries) -> None:
        self._follow(m.from_id)
        prev, prev_term, entries = m.prev_log_index, m.prev_log_term, m.entries
        if prev < self.commit_index:
            # Everything up to our commit index matches every later leader's log; skip it.
            skip = self.commit_index - prev
            if skip >= len(entries):
                self._respond_append(m, True, self.commit_index)
                return
            entries = entries[skip:]
            prev = self.commit_index
            prev_term = self.term_at(prev)
        last = self.last_index
        if prev > last:
            self._respond_append(m, False, 0, conflict_term=0, conflict_index=last + 1)
            return
        local_term = self.term_at(prev)
        assert local_term is not None  # prev >= commit_index >= snapshot index
        if local_term != prev_term:
            first = prev
            while first - 1 > self.commit_index and self.term_at(first - 1) == local_term:
                first -= 1
            self._respond_append(m, False, 0, conflict_term=local_term, conflict_index=first)
            return
        new: list[Entry] = []
        truncate_from: int | None = None
        for k, entry in enumerate(entries):
            if entry.index > last:
                new = entries[k:]
                break
            if self.term_at(entry.index) != entry.term:
                assert entry.index > self.commit_index, "a leader contradicts a committed entry"
                truncate_from = entry.index
                new = entries[k:]
                break
        if truncate_from is not None:
            del self.log[truncate_from - self.snapshot.last_index - 1 :]
        if new:
            assert new[0].index == self.last_index + 1
            self.log.extend(new)
        if truncate_from is not None or new:
            self._fx.append(PersistEntries(entries=list(new), truncate_from=truncate_from))
            self.durable_index = self.last_index  # a foreground write: durable before what follows
            config = next((e for e in reversed(new) if e.kind == EntryKind.CONFIG), None)
            if config is not None:
                self._set_membership(decode_membership(config.data), config.index)
            elif truncate_from is not None and self.config_index >= truncate_from:
                self._reload_membership()
        last_new = prev + len(entries)
        self._respond_append(m, True, last_new)
        commit = min(m.leader_commit, last_new)
        if commit > self.commit_index:
            self.commit_index = commit
            self._apply_committed()

    def _respond_append(
        self, m: AppendEntries, success: bool, match_index: int, conflict_term: int = 0, conflict_index: int = 0
    ) -> None:
        self._send(
            AppendEntriesResponse(
                from_id=self.id,
                to_id=m.from_id,
                term=self.term,
                success=success,
                match_index=match_index,
                rejected_index=0 if success else m.prev_log_index,
                conflict_term=conflict_term,
                conflict_index=conflict_index,
                context=m.context,
                incarnation=self.incarnation,
            )
        )

    def _on_heartbeat(self, m: Heartbeat) -> None:
        self._follow(m.from_id)
        commit = min(m.leader_commit, self.last_index)
        if m.answer:
            self._send(
                HeartbeatResponse(
                    from_id=self.id, to_id=m.from_id, term=self.term, context=m.context, incarnation=self.incarnation
                )
            )
        if commit > self.commit_index:
            self.commit_index = commit
            self._apply_committed()

    def _on_install_snapshot(self, m: InstallSnapshot) -> None:
        self._follow(m.from_id)
        meta = m.meta
        if meta.last_index <= self.commit_index:
            self._send(
                InstallSnapshotResponse(
                    from_id=self.id,
                    to_id=m.from_id,
                    term=self.term,
                    match_index=self.commit_index,
                    incarnation=self.incarnation,
                )
            )
            return
        self._fx.append(SaveSnapshot(meta=meta, data=m.data))
        if self.term_at(meta.last_index) == meta.last_term:
            # Our log agrees up to the snapshot: keep what follows it.
            del self.log[: meta.last_index - self.snapshot.last_index]
        else:
            if self.last_index > meta.last_index:
                self._fx.append(PersistEntries(entries=[], truncate_from=meta.last_index + 1))
            self.log = []
        self._fx.append(CompactLog(upto_index=meta.last_index))
        self.snapshot = meta
        self.snapshot_data = m.data
        self.commit_index = meta.last_index
        self.applied_index = meta.last_index
        self.durable_index = self.last_index
        self._reload_membership()
        self._fx.append(ApplySnapshot(meta=meta, data=m.data))
        self._send(
            InstallSnapshotResponse(
                from_id=self.id, to_id=m.from_id, term=self.term, match_index=meta.last_index, incarnation=self.incarnation
            )
        )

    def _on_timeout_now(self, m: TimeoutNow) -> None:
        if self.role is not Role.LEADER and self.is_voter():
            self._campaign(transfer=True)

    def _on_append_response(self, m: AppendEntriesResponse) -> None:
        pr = self._leader_progress(m.from_id, m.context, m.incarnation)
        if pr is None:
            return
        if m.success:
            if m.match_index > pr.match:
                self._update_match(m.from_id, pr, m.match_index)
            self._send_more(m.from_id, pr)
            self._notify_commit_to(m.from_id, pr)
            return
        if pr.state == _REPLICATE:
            if m.rejected_index <= pr.match:
                return  # stale: we already know more
        elif pr.state == _PROBE:
            if m.rejected_index != pr.next - 1:
                return  # an answer to an earlier probe
        else:
            return  # waiting for the snapshot to be installed
        self._become_probe(pr, max(pr.match + 1, min(self._backtrack(m), m.rejected_index)))
        self._send_append(m.from_id, pr, allow_empty=True)

    def _backtrack(self, m: AppendEntriesResponse) -> int:
        """The next index to try after a rejection, from the follower's hint."""
        if m.conflict_term > 0:
            i = min(m.rejected_index, self.last_index)
            while i > self.snapshot.last_index and (self.term_at(i) or 0) > m.conflict_term:
                i -= 1
            if self.term_at(i) == m.conflict_term:
                return i + 1  # we have that term: resume after our last entry of it
        return m.conflict_index

    def _on_heartbeat_response(self, m: HeartbeatResponse) -> None:
        pr = self._leader_progress(m.from_id, m.context, m.incarnation)
        if pr is None:
            return
        if pr.state == _REPLICATE and len(pr.inflight) >= self.config.inflight_appends_max:
            pr.inflight.popleft()  # let one more through: something was probably lost
        if pr.state == _PROBE:
            pr.paused = False
            if pr.match < self.last_index:
                self._send_append(m.from_id, pr, allow_empty=True)

    def _on_install_snapshot_response(self, m: InstallSnapshotResponse) -> None:
        pr = self._leader_progress(m.from_id, 0, m.incarnation)
        if pr is None:
            return
        if m.match_index > pr.match:
            self._update_match(m.from_id, pr, m.match_index)
        elif pr.state == _SNAPSHOT:
            self._become_probe(pr, pr.match + 1)
        self._send_more(m.from_id, pr)

    def _leader_progress(self, peer: int, context: int, incarnation: int) -> Progress | None:
        if self.role is not Role.LEADER:
            return None
        pr = self.progress.get(peer)
        if pr is None:
            return None
        pr.recent_active = True
        if incarnation and incarnation != pr.incarnation:
            if pr.incarnation:
                # It restarted, and a disk may drop even a synced write: what it acknowledged
                # before may be gone, so forget its match (a commit never goes back, so this
                # only delays the next one) and probe until the logs agree. Without this, its
                # rejections at or below the old match look stale and it never catches up.
                pr.match = 0
                pr.commit_sent = 0
                self._become_probe(pr, pr.next)
            pr.incarnation = incarnation
        if context > pr.acked_context:
            pr.acked_context = context
            self._release_reads()
        return pr

    # ------------------------------------------------------------------ leader

    def _update_match(self, peer: int, pr: Progress, match: int) -> None:
        assert match <= self.last_index, f"peer {peer} claims match {match} beyond our last index {self.last_index}"
        pr.match = match
        pr.stall_elapsed = 0
        if pr.next <= match:
            pr.next = match + 1
        if pr.state != _REPLICATE:
            pr.state = _REPLICATE
            pr.next = match + 1
            pr.inflight.clear()
        while pr.inflight and pr.inflight[0] <= match:
            pr.inflight.popleft()
        self._maybe_commit()
        if self.role is Role.LEADER and peer == self.transfer_target and match == self.last_index:
            self._send(TimeoutNow(from_id=self.id, to_id=peer, term=self.term))

    def _send_more(self, peer: int, pr: Progress) -> None:
        if self.role is not Role.LEADER or peer not in self.progress:
            return
        if pr.state == _PROBE:
            pr.paused = False
        while pr.next <= self.last_index and self._send_append(peer, pr, allow_empty=False):
            pass

    def _become_probe(self, pr: Progress, next_index: int) -> None:
        pr.state = _PROBE
        pr.next = next_index
        pr.paused = False
        pr.inflight.clear()
        pr.stall_elapsed = 0

    def _send_append(self, peer: int, pr: Progress, allow_empty: bool) -> bool:
        """Send one AppendEntries (or the snapshot) if the follower's state allows it."""
        if pr.state == _SNAPSHOT or (pr.state == _PROBE and pr.paused):
            return False
        if pr.state == _REPLICATE and len(pr.inflight) >= self.config.inflight_appends_max:
            return False
        prev = pr.next - 1
        prev_term = self.term_at(prev)
        if prev_term is None:
            assert prev < self.snapshot.last_index
            self._send_snapshot(peer, pr)
            return False
        start = prev - self.snapshot.last_index  # offset of pr.next in self.log
        stop = min(len(self.log), start + self.config.append_entries_max)
        entries = self.log[start:stop]
        if not entries and not allow_empty:
            return False
        budget = self.config.append_bytes_max
        for k, entry in enumerate(entries):
            budget -= len(entry.data)
            if budget < 0 and k > 0:
                del entries[k:]
                break
        self._send(
            AppendEntries(
                from_id=self.id,
                to_id=peer,
                term=self.term,
                prev_log_index=prev,
                prev_log_term=prev_term,
                entries=entries,
                leader_commit=self.commit_index,
                context=self.read_seq,
            )
        )
        pr.commit_sent = max(pr.commit_sent, min(self.commit_index, entries[-1].index if entries else prev))
        if pr.state == _REPLICATE:
            if entries:
                pr.next = entries[-1].index + 1
                pr.inflight.append(pr.next - 1)
        else:
            pr.paused = True
        return True

    def _send_snapshot(self, peer: int, pr: Progress) -> None:
        pr.state = _SNAPSHOT
        pr.snapshot_index = self.snapshot.last_index
        pr.snapshot_elapsed = 0
        pr.inflight.clear()
        self._send(
            InstallSnapshot(from_id=self.id, to_id=peer, term=self.term, meta=self.snapshot, data=self.snapshot_data)
        )

    def _broadcast_append(self) -> None:
        for peer, pr in self.progress.items():
            if pr.state == _REPLICATE:
                while pr.next <= self.last_index and self._send_append(peer, pr, allow_empty=False):
                    pass
            else:
                self._send_append(peer, pr, allow_empty=False)

    def _broadcast_heartbeat(self) -> None:
        for peer, pr in self.progress.items():
            self._send(
                Heartbeat(
                    from_id=self.id,
                    to_id=peer,
                    term=self.term,
                    leader_commit=min(self.commit_index, pr.match),
                    context=self.read_seq,
                )
            )

    def _append(self, kind: int, data: bytes) -> Entry:
        entry = Entry(index=self.last_index + 1, term=self.term, kind=kind, data=data)
        self.log.append(entry)
        # A sole member has nobody to replicate to while it syncs: a foreground write
        # commits in the same step (a standalone broker starts with its state applied).
        members = self.membership
        background = self.config.leader_persist_async and len(members.voters) + len(members.learners) > 1
        self._fx.append(PersistEntries(entries=[entry], truncate_from=None, background=background))
        if not background:
            self.durable_index = entry.index
        if kind == EntryKind.CONFIG:
            self._set_membership(decode_membership(data), entry.index)
        return entry

    def _after_append(self) -> None:
        self._broadcast_append()
        self._maybe_commit()

    def _maybe_commit(self) -> None:
        voters = self.membership.voters
        if not voters:
            return
        matches = sorted(
            (self.durable_index if v == self.id else self.progress[v].match for v in voters), reverse=True
        )
        candidate = matches[quorum(voters) - 1]
        if candidate <= self.commit_index or self.term_at(candidate) != self.term:
            return  # only entries of the current term commit by counting (§3.6.2, Figure 3.7)
        first_in_term = self.commit_index < self.leader_first_index
        self.commit_index = candidate
        self._apply_committed()
        self._notify_commit()
        if first_in_term:
            self._start_read_round()  # reads that waited for the NOOP
        if not self.is_voter() and self.config_index <= self.commit_index:
            # Our own removal is committed: hand over to the most up-to-date voter and go.
            best = max(voters, key=lambda v: self.progress[v].match)
            if self.progress[best].match == self.last_index:
                self._send(TimeoutNow(from_id=self.id, to_id=best, term=self.term))
            self._become_follower(self.term, None)

    def _notify_commit(self) -> None:
        """Tell followers that hold everything sent to them about the new commit index now,
        not at the next heartbeat: they apply (and answer a forwarded write, serve a
        watch) a round trip after the commit instead of up to a heartbeat period later.
        Followers with entries still to receive learn it from those AppendEntries."""
        for peer, pr in self.progress.items():
            self._notify_commit_to(peer, pr)

    def _notify_commit_to(self, peer: int, pr: Progress) -> None:
        if self.role is not Role.LEADER or pr.state != _REPLICATE or pr.next <= self.last_index:
            return
        known = min(self.commit_index, pr.match)
        if known <= pr.commit_sent:
            return
        pr.commit_sent = known
        # Its answer would tell nothing the AppendEntries answer just did not (the peer is
        # active, its incarnation), unless a read waits for this leadership round.
        self._send(Heartbeat(from_id=self.id, to_id=peer, term=self.term, leader_commit=known,
                             context=self.read_seq, answer=bool(self.reads)))

    def _quorum_active(self) -> bool:
        voters = self.membership.voters
        active = sum(1 for v in voters if v == self.id or self.progress[v].recent_active)
        return active >= quorum(voters)

    def _start_read_round(self) -> None:
        waiting = [r for r in self.reads if r.context == 0]
        if not waiting:
            return
        self.read_seq += 1
        for read in waiting:
            read.read_index = self.commit_index
            read.context = self.read_seq
        self._release_reads()
        if self.reads:
            self._broadcast_heartbeat()

    def _release_reads(self) -> None:
        if not self.reads:
            return
        voters = self.membership.voters
        acked = sorted(
            (self.read_seq if v == self.id else self.progress[v].acked_context for v in voters), reverse=True
        )
        confirmed = acked[quorum(voters) - 1]
        keep: list[_PendingRead] = []
        for read in self.reads:
            if 0 < read.context <= confirmed:
                self._fx.append(ReadReady(request_id=read.request_id, read_index=read.read_index))
            else:
                keep.append(read)
        self.reads = keep

    # ------------------------------------------------------------------ roles

    def _reset_election_timer(self) -> None:
        self.election_elapsed = 0
        self.election_timeout = self.rng.randrange(self.config.election_ticks_min, self.config.election_ticks_max)

    def _become_follower(self, term: int, leader: int | None) -> None:
        if term > self.term:
            self.term = term
            self.voted_for = None
            self._persist_hard_state()
        if self.role is Role.LEADER:
            for read in self.reads:
                self._fx.append(ReadReady(request_id=read.request_id, error=RaftError.NOT_LEADER, leader_hint=leader))
            self.reads = []
            self.progress = {}
            self.transfer_target = None
        self.role = Role.FOLLOWER
        self.leader_id = leader
        self.votes = {}
        self._reset_election_timer()

    def _campaign_pre_vote(self) -> None:
        self.role = Role.PRE_CANDIDATE
        self.leader_id = None
        self.votes = {self.id: True}
        self._reset_election_timer()
        if self._tally() is True:
            self._campaign(transfer=False)
            return
        for v in self.membership.voters:
            if v != self.id:
                self._send(
                    PreVote(
                        from_id=self.id, to_id=v, term=self.term + 1, last_log_index=self.last_index, last_log_term=self.last_term
                    )
                )

    def _campaign(self, transfer: bool) -> None:
        self.role = Role.CANDIDATE
        self.leader_id = None
        self.term += 1
        self.voted_for = self.id
        self._persist_hard_state()
        self.votes = {self.id: True}
        self._reset_election_timer()
        if self._tally() is True:
            self._become_leader()
            return
        for v in self.membership.voters:
            if v != self.id:
                self._send(
                    RequestVote(
                        from_id=self.id,
                        to_id=v,
                        term=self.term,
                        last_log_index=self.last_index,
                        last_log_term=self.last_term,
                        transfer=transfer,
                    )
                )

    def _tally(self) -> bool | None:
        """True: a quorum granted; False: a quorum refused; None: undecided."""
        voters = self.membership.voters
        need = quorum(voters)
        granted = sum(1 for v in voters if self.votes.get(v) is True)
        refused = sum(1 for v in voters if self.votes.get(v) is False)
        if granted >= need:
            return True
        if len(voters) - refused < need:
            return False
        return None

    def _become_leader(self) -> None:
        self.role = Role.LEADER
        self.leader_id = self.id
        self.votes = {}
        self.heartbeat_elapsed = 0
        self.election_elapsed = 0
        self.reads = []
        self.transfer_target = None
        self.progress = {}
        self._sync_progress()
        noop = self._append(EntryKind.NOOP, b"")
        self.leader_first_index = noop.index
        self._after_append()

    # ------------------------------------------------------------------ helpers

    def _send(self, message: RaftMessage) -> None:
        self._fx.append(Send(message=message))

    def _persist_hard_state(self) -> None:
        effect = PersistHardState(hard_state=self.hard_state())
        if self._fx and isinstance(self._fx[-1], PersistHardState):
            self._fx[-1] = effect  # a new term and a vote for it: one write, one fsync
        else:
            self._fx.append(effect)

    def _log_ok(self, last_index: int, last_term: int) -> bool:
        """Is a candidate's log at least as up to date as ours (§3.6.1)?"""
        my_term = self.last_term
        return last_term > my_term or (last_term == my_term and last_index >= self.last_index)

    def _apply_committed(self) -> None:
        if self.applied_index >= self.commit_index:
            return
        base = self.snapshot.last_index
        entries = self.log[self.applied_index - base : self.commit_index - base]
        assert entries and entries[0].index == self.applied_index + 1
        self._fx.append(Apply(entries=entries))
        self.applied_index = self.commit_index
        if (
            self.snapshot_suggested_elapsed is None
            and self.last_index - base > self.config.log_entries_max
            and self.applied_index > base
        ):
            self.snapshot_suggested_elapsed = 0
            self._fx.append(TakeSnapshot(applied_index=self.applied_index))

    def _set_membership(self, membership: Membership, index: int) -> None:
        self.membership = membership
        self.config_index = index
        if self.role is Role.LEADER:
            self._sync_progress()
            self._release_reads()

    def _sync_progress(self) -> None:
        members = [*self.membership.voters, *self.membership.learners]
        for peer in members:
            if peer != self.id and peer not in self.progress:
                self.progress[peer] = Progress(self.last_index + 1)
        for peer in [p for p in self.progress if p not in members]:
            del self.progress[peer]
        if self.transfer_target is not None and self.transfer_target not in self.membership.voters:
            self.transfer_target = None

    def _reload_membership(self) -> None:
        for entry in reversed(self.log):
            if entry.kind == EntryKind.CONFIG:
                self._set_membership(decode_membership(entry.data), entry.index)
                return
        self._set_membership(self.snapshot.membership, self.snapshot.last_index)

    def _membership_at(self, index: int) -> Membership:
        for entry in reversed(self.log[: index - self.snapshot.last_index]):
            if entry.kind == EntryKind.CONFIG:
                return decode_membership(entry.data)
        return self.snapshot.membership

    def _check(self, term_before: int) -> None:
        """Invariants after every step (our bugs, not the world's faults)."""
        assert self.term >= term_before, "term decreased"
        assert self.snapshot.last_index <= self.applied_index <= self.commit_index <= self.last_index, (
            self.snapshot.last_index,
            self.applied_index,
            self.commit_index,
            self.last_index,
        )
        assert not self.log or self.log[0].index == self.snapshot.last_index + 1
        assert self.durable_index <= self.last_index, (self.durable_index, self.last_index)
        assert self.role is not Role.LEADER or self.voted_for == self.id


_HANDLERS = {
    Restore: RaftNode._on_restore,
    Tick: RaftNode._on_tick,
    Receive: RaftNode._on_receive,
    Propose: RaftNode._on_propose,
    ProposeBatch: RaftNode._on_propose_batch,
    ProposeConfig: RaftNode._on_propose_config,
    ReadIndex: RaftNode._on_read_index,
    SnapshotTaken: RaftNode._on_snapshot_taken,
    TransferLeadership: RaftNode._on_transfer,
    LogPersisted: RaftNode._on_log_persisted,
}

_MESSAGE_HANDLERS = {
    PreVote: RaftNode._on_pre_vote,
    PreVoteResponse: RaftNode._on_pre_vote_response,
    RequestVote: RaftNode._on_request_vote,
    RequestVoteResponse: RaftNode._on_request_vote_response,
    AppendEntries: RaftNode._on_append_entries,
    AppendEntriesResponse: RaftNode._on_append_response,
    Heartbeat: RaftNode._on_heartbeat,
    HeartbeatResponse: RaftNode._on_heartbeat_response,
    InstallSnapshot: RaftNode._on_install_snapshot,
    InstallSnapshotResponse: RaftNode._on_install_snapshot_response,
    TimeoutNow: RaftNode._on_timeout_now,
}

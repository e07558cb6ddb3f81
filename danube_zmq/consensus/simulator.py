"""Deterministic simulation of a Raft cluster (TigerBeetle's VOPR, FoundationDB's simulator).

N peers (`RaftNode` cores, consensus/raft/core.py) run in one thread on a fake clock
(ticks) and an in-memory network. Everything random comes from one seed, so a failing
seed replays exactly: `python -m danube_zmq.consensus.simulator --seed 1234`.

Faults, each drawn per seed (some seeds are calm, some are hostile):
  - messages dropped, duplicated, delayed by 1..`delay_ticks_max` ticks (so reordered),
    now and then delayed beyond an election timeout;
  - partitions: one peer isolated, one direction of a peer cut (asymmetric), a
    minority/majority split, a bridge (two sides that only one peer hears), one link;
  - crashes at any point between the effects of a step (a later write or send never
    happens), restarts from the simulated disk (hard state, entries, snapshot) with a
    fresh state machine rebuilt from the snapshot and the log;
  - clock skew (a peer misses a tick), membership changes (add a learner, promote it,
    remove a voter, the leader included), leadership transfers, snapshots whenever the
    core suggests one (small `log_entries_max`), small append and in-flight limits.

Checked after every step (a violation stops the run and names the seed and tick):
  - election safety: at most one leader per term;
  - log matching: every entry (index, term) anywhere has the same data and the same
    predecessor term, so two logs holding it agree on everything before it;
  - leader completeness: an entry committed in term t is in the log of every leader of
    a later term (checked when a leader is elected and when an entry commits; the
    commit term is bounded from above by the term of the peer that saw the commit);
  - state machine safety: no two peers apply different entries at one index, and the
    state (a rolling hash) after each index is the same everywhere, snapshots included;
  - committed entries are never lost: after any truncation, the peers that lack a
    committed entry cannot form a quorum of the latest committed membership;
  - plus every assertion inside the core (term never decreases, commit <= last index...).
Liveness: after `chaos_ticks`, the network heals and every peer restarts; within
`liveness_ticks_max` ticks a leader must be elected, commit a fresh entry, every member
must apply it, and every client operation must have completed.

Clients (3) put, get and compare-and-swap on three keys; `Simulation.history` is what
they saw, for the linearizability checker (consensus/linearizability.py).
"""

from __future__ import annotations

import argparse
import heapq
import random
import sys
import time
import traceback
import zlib
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import msgpack

from danube_zmq.consensus.raft.core import RaftConfig, RaftNode, bootstrap, force_new_cluster, quorum
from danube_zmq.consensus.raft.events import (
    AddLearner,
    Apply,
    ApplySnapshot,
    CompactLog,
    Event,
    LogPersisted,
    PersistEntries,
    PersistHardState,
    PromoteVoter,
    ProposalResult,
    Propose,
    ProposeBatch,
    ProposeConfig,
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
from danube_zmq.consensus.raft.messages import RAFT_PROTOCOL, RaftMessage, decode_membership
from danube_zmq.consensus.types import Entry, EntryKind, HardState, Membership, SnapshotMeta


class InvariantViolation(AssertionError):
    """A safety or liveness property of Raft does not hold in this run."""


# ----------------------------------------------------------------------------- parts


@dataclass(slots=True, kw_only=True)
class Faults:
    """What can go wrong in one run; drawn from the seed by `Faults.draw`."""

    drop_rate: float = 0.0
    duplicate_rate: float = 0.0
    delay_ticks_max: int = 1
    long_delay_rate: float = 0.0  # chance a message is delayed up to long_delay_ticks_max
    long_delay_ticks_max: int = 30
    partition_rate: float = 0.0  # per tick, when the network is whole
    heal_rate: float = 0.1  # per tick, when it is not
    crash_rate: float = 0.0  # per tick: a live peer (the leader half the time) crashes; and per
    restart_ticks_max: int = 30  # step, crash_rate / 20 (/ 3 in a leader's critical steps): mid-step
    pause_rate: float = 0.0  # per tick: a peer stops (no ticks, messages wait) like a long GC pause
    pause_ticks_max: int = 40
    skip_tick_rate: float = 0.0
    membership_rate: float = 0.0
    transfer_rate: float = 0.0
    # Per crash: the disk also loses the last 1..3 log entries, synced or not (tests/chaos/harness/power.py
    # `tear_raft_log`), when a quorum of the other voters still holds each of them (losing
    # more is beyond what any replication of this degree survives). Never drawn: the
    # torn-tail tests set it, so every other seed replays as before.
    tear_rate: float = 0.0

    @classmethod
    def draw(cls, rng: random.Random) -> Faults:
        calm = rng.random() < 0.05
        if calm:
            return cls(delay_ticks_max=rng.randint(1, 3))
        return cls(
            drop_rate=rng.choice([0.0, 0.01, 0.05, 0.15]),
            duplicate_rate=rng.choice([0.0, 0.02, 0.1]),
            delay_ticks_max=rng.randint(1, 6),
            long_delay_rate=rng.choice([0.0, 0.005, 0.02, 0.05]),
            partition_rate=rng.choice([0.0, 0.01, 0.03, 0.08]),
            heal_rate=rng.choice([0.03, 0.1, 0.3]),
            crash_rate=rng.choice([0.0, 0.005, 0.02, 0.05]),
            restart_ticks_max=rng.choice([3, 10, 40]),
            pause_rate=rng.choice([0.0, 0.01, 0.03]),
            skip_tick_rate=rng.choice([0.0, 0.05]),
            membership_rate=rng.choice([0.0, 0.0, 0.02, 0.05]),
            transfer_rate=rng.choice([0.0, 0.005, 0.02]),
        )


class Disk:
    """One peer's durable state: written only by Persist* effects, survives crashes."""

    def __init__(self) -> None:
        self.hard_state = HardState(term=0, voted_for=None, commit_index=0)
        self.entries: list[Entry] = []
        self.snapshot: SnapshotMeta | None = None
        self.snapshot_data = b""

    @property
    def snapshot_index(self) -> int:
        return self.snapshot.last_index if self.snapshot is not None else 0

    def last_index(self) -> int:
        return self.entries[-1].index if self.entries else self.snapshot_index

    def term_at(self, index: int) -> int | None:
        if self.entries and self.entries[0].index <= index <= self.entries[-1].index:
            return self.entries[index - self.entries[0].index].term
        if self.snapshot is not None and index == self.snapshot.last_index:
            return self.snapshot.last_term
        return 0 if index == 0 else None

    def holds(self, index: int, term: int) -> bool:
        """Is the committed entry (index, term) durable here (in the log or the snapshot)?"""
        if index <= self.snapshot_index:
            return True
        return self.term_at(index) == term

    def truncate(self, index: int) -> list[Entry]:
        """Delete entries >= index; return them."""
        if not self.entries or index > self.entries[-1].index:
            return []
        cut = max(0, index - self.entries[0].index)
        removed = self.entries[cut:]
        del self.entries[cut:]
        return removed

    def append(self, entries: list[Entry]) -> None:
        if not entries:
            return
        expected = self.last_index() + 1
        if entries[0].index != expected:
            raise InvariantViolation(f"append at {entries[0].index} to a log ending at {expected - 1}")
        self.entries.extend(entries)

    def compact(self, upto: int) -> None:
        if self.entries and self.entries[0].index <= upto:
            del self.entries[: upto - self.entries[0].index + 1]

    def restore_event(self) -> Restore:
        return Restore(
            hard_state=self.hard_state, snapshot=self.snapshot, snapshot_data=self.snapshot_data, entries=list(self.entries)
        )


class KvMachine:
    """The toy state machine: a dict of registers with put and compare-and-swap, plus a
    rolling CRC over every applied entry, so two peers' states compare in O(1)."""

    def __init__(self) -> None:
        self.kv: dict[str, bytes] = {}
        self.applied_index = 0
        self.digest = 0

    def apply(self, entry: Entry) -> Any:
        assert entry.index == self.applied_index + 1, f"apply {entry.index} after {self.applied_index}"
        self.applied_index = entry.index
        self.digest = zlib.crc32(entry.data, zlib.crc32(entry.index.to_bytes(8, "little"), self.digest))
        if entry.kind != EntryKind.COMMAND:
            return None
        _client, _seq, op, key, value, expected = msgpack.unpackb(entry.data, raw=False)
        current = self.kv.get(key)
        if op == "put":
            self.kv[key] = value
            return None
        assert op == "cas"
        if current == expected:
            self.kv[key] = value
            return True
        return False

    def snapshot(self) -> bytes:
        return msgpack.packb([self.applied_index, self.digest, self.kv], use_bin_type=True)

    def load(self, data: bytes) -> None:
        self.applied_index, self.digest, self.kv = msgpack.unpackb(data, raw=False)


@dataclass(slots=True, kw_only=True)
class ClientOp:
    """One client operation as the client saw it. status: "ok" (completed with
    `result`), "fail" (definitely not executed), "info" (unknown: it may take effect at
    any time after `invoke_tick`, even after `complete_tick`, when the client gave up)."""

    client: int
    op: str  # "put" | "get" | "cas"
    key: str
    value: bytes | None = None
    expected: bytes | None = None
    result: Any = None
    invoke_tick: int
    complete_tick: int | None = None
    status: str = "pending"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class Peer:
    """One simulated server: a core (None while crashed), its disk, its state machine."""

    def __init__(self, node_id: int) -> None:
        self.id = node_id
        self.node: RaftNode | None = None
        self.disk = Disk()
        self.sm = KvMachine()
        self.seen_commit = 0  # commit index already recorded as globally committed
        self.proposals: dict[int, tuple[ClientOp, int]] = {}  # index -> (op, term)
        self.reads: dict[int, ClientOp] = {}  # request_id -> get waiting for ReadReady
        self.ready_reads: list[tuple[int, ClientOp]] = []  # (read_index, get) waiting for apply
        self.snapshot_due: int | None = None  # tick at which to take the suggested snapshot
        self.down_until = 0
        self.paused_until = 0  # no ticks, and messages wait, until this tick
        self.marker: tuple[int, int] | None = None  # liveness: (index, term) of the marker entry
        # A leader's background appends: (tick due, write) not on the disk yet, in order;
        # a crash loses them (or a prefix reached the disk first). `persisted` holds the
        # LogPersisted events of writes that completed, stepped at the next tick.
        self.writes: list[tuple[int, PersistEntries]] = []
        self.persisted: list[LogPersisted] = []


@dataclass(slots=True)
class Stats:
    steps: int = 0
    messages_sent: int = 0
    messages_delivered: int = 0
    messages_dropped: int = 0
    messages_duplicated: int = 0
    partitions: int = 0
    crashes: int = 0
    tears: int = 0
    pauses: int = 0
    restarts: int = 0
    elections: int = 0
    commits: int = 0
    snapshots_taken: int = 0
    snapshots_installed: int = 0
    config_changes: int = 0
    transfers: int = 0
    client_ops: int = 0

    def faults(self) -> int:
        return self.messages_dropped + self.messages_duplicated + self.partitions + self.crashes + self.pauses


@dataclass(slots=True, kw_only=True)
class SimResult:
    seed: int
    peers: int
    failure: str | None
    ticks: int
    trace_hash: int
    stats: Stats
    history: list[ClientOp] = field(default_factory=list)


# ------------------------------------------------------------------------ simulation

_KEYS = ("a", "b", "c")
_CLIENT_TIMEOUT_TICKS = 40


class Simulation:
    """One seeded run. `run()` returns a `SimResult`; nothing here reads a clock or the
    module-level `random`."""

    def __init__(
        self,
        seed: int,
        peers: int = 3,
        *,
        spares: int = 1,
        chaos_ticks: int = 300,
        liveness_ticks_max: int = 200,
        clients: int = 3,
        wire: bool = True,
        faults: Faults | None = None,
        silent_spares: bool = False,
    ) -> None:
        assert peers >= 1 and spares >= 0
        self.seed = seed
        self.rng = random.Random(seed)
        self.faults = faults if faults is not None else Faults.draw(self.rng)
        self.chaos_ticks = chaos_ticks
        self.liveness_ticks_max = liveness_ticks_max
        self.wire = wire  # encode and decode every message with RAFT_PROTOCOL
        self.now = 0
        self.stats = Stats()
        self.trace = 0
        self.chaos = True
        self.voter_ids = list(range(1, peers + 1))
        self.peer_count = peers
        self.peers = {i: Peer(i) for i in range(1, peers + spares + 1)}
        # Silent spares never start (an address where nothing listens): added as learners,
        # they must never be promoted (issue 19, section 3).
        self.silent = set(range(peers + 1, peers + spares + 1)) if silent_spares else set()
        if self.silent:
            self.faults.membership_rate = max(self.faults.membership_rate, 0.05)  # so they are tried
        self.config_base = self._draw_config()
        # network: (deliver_tick, seq, message)
        self.in_flight: list[tuple[int, int, RaftMessage]] = []
        self.seq = 0
        self.cut: set[tuple[int, int]] = set()
        # global knowledge for the invariants
        self.leaders: dict[int, int] = {}  # term -> leader id
        self.committed: dict[int, tuple[int, int, bytes]] = {}  # index -> (term, kind, data)
        self.commit_terms: dict[int, int] = {}  # index -> a term >= the term in which it committed
        self.entry_shape: dict[tuple[int, int], tuple[int, bytes]] = {}  # (index, term) -> (prev term, data)
        self.digests: dict[int, int] = {}  # index -> state digest after applying it
        self.committed_membership = Membership(voters=sorted(self.voter_ids), learners=[])
        self.committed_membership_index = 1
        # clients
        self.clients = [_Client(c, self.rng.choice(self.voter_ids)) for c in range(clients)]
        self.history: list[ClientOp] = []
        self.request_seq = 0
        self.requests: dict[int, ClientOp] = {}  # request_id -> op (Propose or ReadIndex in flight)
        self.marker_request = -1

    def _draw_config(self) -> dict[str, Any]:
        r = self.rng
        return {
            "heartbeat_ticks": r.choice([1, 1, 2]),
            "election_ticks_min": 10,
            "election_ticks_max": r.choice([12, 20]),
            "log_entries_max": r.choice([4, 16, 64, 10_000]),
            "append_entries_max": r.choice([1, 3, 64]),
            "inflight_appends_max": r.choice([1, 4, 64]),
            "uncommitted_entries_max": r.choice([8, 4096]),
            "reads_pending_max": r.choice([2, 1024]),
            "pre_vote": r.random() < 0.9,
            "check_quorum": r.random() < 0.9,
            "leader_persist_async": r.random() < 0.5,
        }

    # ------------------------------------------------------------------ running

    def run(self) -> SimResult:
        """Chaos, then healing: a leader commits, and every member catches up."""
        return self._run(self._heal_and_converge)

    def run_disaster(self) -> SimResult:
        """Chaos, then every member but one is lost for good (its disk too); the survivor
        is recovered with `force_new_cluster` (as `danube admin cluster recover` does to
        its store) and restarted. Checked: it leads alone at once, keeps every entry it
        had committed with the same state, and serves clients (commits a fresh entry)."""
        return self._run(self._recover_and_serve)

    def _run(self, ending: Callable[[], None]) -> SimResult:
        """Bootstrap, start every peer, run the chaos ticks, then `ending`; every invariant
        is checked at the end. A failing seed is a result, whatever broke."""
        failure: str | None = None
        try:
            founding = bootstrap(self.voter_ids)
            for voter in self.voter_ids:
                self.peers[voter].disk.hard_state = founding.hard_state
                self.peers[voter].disk.append(founding.entries)
            for entry in founding.entries:
                self._check_entry_shape(entry, 0)
            for peer in self.peers.values():
                self._start(peer)
            for _ in range(self.chaos_ticks):
                self._tick()
            ending()
            self._check_all()
        except Exception as exc:
            kind = "invariant" if isinstance(exc, InvariantViolation) else type(exc).__name__
            where = traceback.extract_tb(exc.__traceback__)[-1]
            failure = f"seed {self.seed} tick {self.now}: {kind}: {exc} ({where.name}:{where.lineno})"
        return SimResult(seed=self.seed, peers=self.peer_count, failure=failure, ticks=self.now,
                         trace_hash=self.trace, stats=self.stats, history=self.history)

    def _heal_and_converge(self) -> None:
        self._heal_all()
        deadline = self.now + self.liveness_ticks_max
        while not self._committed_after_heal():
            if self.now >= deadline:
                raise InvariantViolation(
                    f"liveness: no leader commit {self.liveness_ticks_max} ticks after healing ({self._describe()})"
                )
            self._tick()
        # Catching up every member may take one round trip per append_entries_max entries.
        leader = self._a_leader()
        assert leader is not None and leader.node is not None
        lag = leader.node.last_index - min(p.node.applied_index for p in self.peers.values() if p.node is not None)
        deadline = self.now + self.liveness_ticks_max + 4 * lag // self.config_base["append_entries_max"]
        while not self._converged():
            if self.now >= deadline:
                raise InvariantViolation(f"liveness: members did not catch up with the leader ({self._describe()})")
            self._tick()

    def _recover_and_serve(self) -> None:
        self._recover_one()
        deadline = self.now + self.liveness_ticks_max
        while not self._converged():
            if self.now >= deadline:
                raise InvariantViolation(f"liveness: the recovered member does not serve ({self._describe()})")
            self._tick()

    def _recover_one(self) -> None:
        rng = self.rng
        candidates = [i for i in self.committed_membership.voters if self.peers[i].disk.last_index() > 0]
        survivor = self.peers[rng.choice(candidates)]
        for peer in list(self.peers.values()):
            if peer.node is not None:
                self._crash(peer, 1)
        for op in self.requests.values():
            self._complete(op, "info")
        self.requests.clear()
        self.peers = {survivor.id: survivor}
        self.in_flight.clear()
        disk = survivor.disk
        kept = disk.hard_state.commit_index
        entry, hard_state = force_new_cluster(survivor.id, disk.hard_state, disk.last_index(),
                                              disk.term_at(disk.last_index()) or 0)
        # The lost members' logs went with them: only the survivor's entries constrain
        # log matching now (a lost member's data must never come back; the docs say so).
        held = {(e.index, e.term) for e in disk.entries}
        self.entry_shape = {key: shape for key, shape in self.entry_shape.items() if key in held}
        self.leaders = {term: leader for term, leader in self.leaders.items() if leader == survivor.id}
        self._check_entry_shape(entry, disk.term_at(disk.last_index()))
        disk.append([entry])
        disk.hard_state = hard_state
        # What the lost quorum committed beyond the survivor's commit index may be gone
        # (that is the price of this recovery); what it had committed must stay, same state.
        for index in [i for i in self.committed if i > kept]:
            del self.committed[index]
            del self.commit_terms[index]
        for index in [i for i in self.digests if i > kept]:
            del self.digests[index]
        self.committed_membership = Membership(voters=[survivor.id], learners=[])
        self.committed_membership_index = entry.index
        self.voter_ids = [survivor.id]
        for client in self.clients:
            client.leader_guess = survivor.id
        self._heal_all()
        node = survivor.node
        if node is None or node.role is not Role.LEADER or node.membership.voters != [survivor.id]:
            raise InvariantViolation(f"the recovered member does not lead alone at once ({self._describe()})")

    def _tick(self) -> None:
        self.now += 1
        rng, f = self.rng, self.faults
        if self.chaos:
            self._inject_faults()
        self._deliver_due()
        for peer in self.peers.values():
            if peer.node is None:
                if self.chaos is False or self.now >= peer.down_until:
                    self._start(peer)
                continue
            if self.chaos and (peer.paused_until > self.now or (f.skip_tick_rate and rng.random() < f.skip_tick_rate)):
                continue
            self._complete_writes(peer, upto_tick=self.now)
            while peer.persisted and peer.node is not None:
                self._step_persisted(peer, peer.persisted.pop(0))
            if peer.node is None:
                continue
            self._step(peer, Tick())
        self._clients_act()
        for peer in self.peers.values():
            if peer.node is not None and peer.snapshot_due is not None and self.now >= peer.snapshot_due:
                peer.snapshot_due = None
                if peer.sm.applied_index > peer.node.snapshot.last_index:
                    self.stats.snapshots_taken += 1
                    self._step(peer, SnapshotTaken(last_index=peer.sm.applied_index, data=peer.sm.snapshot()))
        if self.now % 50 == 0:
            self._check_all()

    def _inject_faults(self) -> None:
        rng, f = self.rng, self.faults
        ids = sorted(self.peers)
        if not self.cut:
            if f.partition_rate and rng.random() < f.partition_rate:
                self._partition(rng, ids)
        elif rng.random() < f.heal_rate:
            self.cut.clear()
        if f.crash_rate and rng.random() < f.crash_rate:
            live = [p for p in self.peers.values() if p.node is not None]
            leader = self._a_leader()
            if live:
                victim = leader if leader is not None and rng.random() < 0.5 else rng.choice(live)
                self._crash(victim, rng.randint(1, f.restart_ticks_max))
        if f.pause_rate and rng.random() < f.pause_rate:
            leader = self._a_leader()
            victim = leader if leader is not None and rng.random() < 0.5 else self.peers[rng.choice(ids)]
            victim.paused_until = max(victim.paused_until, self.now + rng.randint(1, f.pause_ticks_max))
            self.stats.pauses += 1
        if f.membership_rate and rng.random() < f.membership_rate:
            self._change_membership(rng)
        if f.transfer_rate and rng.random() < f.transfer_rate:
            leader = self._a_leader()
            if leader is not None and leader.node is not None:
                others = [v for v in leader.node.membership.voters if v != leader.id]
                if others:
                    self.stats.transfers += 1
                    self._step(leader, TransferLeadership(target_id=rng.choice(others)))

    def _partition(self, rng: random.Random, ids: list[int]) -> None:
        self.stats.partitions += 1
        kind = rng.randrange(5)
        cut = self.cut
        leader = self._a_leader()
        if kind == 0:  # one peer isolated (the leader half the time), both directions
            x = leader.id if leader is not None and rng.random() < 0.5 else rng.choice(ids)
            for y in ids:
                if y != x:
                    cut.add((x, y))
                    cut.add((y, x))
        elif kind == 1:  # asymmetric: a peer can send but not receive, or the reverse
            x = rng.choice(ids)
            outbound = rng.random() < 0.5
            for y in ids:
                if y != x:
                    cut.add((x, y) if outbound else (y, x))
        elif kind == 2:  # minority / majority
            shuffled = ids[:]
            rng.shuffle(shuffled)
            k = rng.randint(1, len(ids) // 2)
            side = set(shuffled[:k])
            for x in ids:
                for y in ids:
                    if (x in side) != (y in side):
                        cut.add((x, y))
        elif kind == 3:  # bridge: two sides, one peer hears both
            shuffled = ids[:]
            rng.shuffle(shuffled)
            rest = shuffled[1:]  # shuffled[0] is the bridge: it keeps every link
            half = len(rest) // 2
            left, right = set(rest[:half]), set(rest[half:])
            for x in left:
                for y in right:
                    cut.add((x, y))
                    cut.add((y, x))
        else:  # one link, one direction
            x, y = rng.sample(ids, 2) if len(ids) > 1 else (ids[0], ids[0])
            if x != y:
                cut.add((x, y))

    def _change_membership(self, rng: random.Random) -> None:
        leader = self._a_leader()
        if leader is None or leader.node is None:
            return
        m = leader.node.membership
        outsiders = [i for i in sorted(self.peers) if i not in m.voters and i not in m.learners]
        choices: list[Any] = []
        if outsiders:
            choices.append(AddLearner(node_id=rng.choice(outsiders)))
        if m.learners:
            choices.append(PromoteVoter(node_id=rng.choice(m.learners)))
            choices.append(RemoveVoter(node_id=rng.choice(m.learners)))
        if len(m.voters) > self.peer_count:
            choices.append(RemoveVoter(node_id=rng.choice(m.voters)))
        if not choices:
            return
        self._step(leader, ProposeConfig(request_id=self._request_id(), change=rng.choice(choices)))

    def _heal_all(self) -> None:
        """The liveness phase: no more faults, the network heals, every peer restarts."""
        self.chaos = False
        self.cut.clear()
        for peer in self.peers.values():
            peer.paused_until = min(peer.paused_until, self.now)
        self.faults.drop_rate = 0.0
        self.faults.duplicate_rate = 0.0
        self.faults.long_delay_rate = 0.0
        self.faults.delay_ticks_max = min(self.faults.delay_ticks_max, 2)
        for peer in self.peers.values():
            if peer.node is None:
                self._start(peer)

    # ------------------------------------------------------------------ network

    def _send(self, message: RaftMessage) -> None:
        rng, f = self.rng, self.faults
        self.stats.messages_sent += 1
        if f.drop_rate and rng.random() < f.drop_rate:
            self.stats.messages_dropped += 1
            return
        if self.wire:
            # Deliver what the wire delivers: plain ints for enums, lists for lists.
            decoded = RAFT_PROTOCOL.decode(RAFT_PROTOCOL.encode(message))
            assert decoded == message, f"{type(message).__name__} does not round-trip"
            message = decoded
        copies = 1
        if f.duplicate_rate and rng.random() < f.duplicate_rate:
            copies = 2
            self.stats.messages_duplicated += 1
        for _ in range(copies):
            if f.long_delay_rate and rng.random() < f.long_delay_rate:
                delay = rng.randint(1, f.long_delay_ticks_max)
            else:
                delay = rng.randint(1, f.delay_ticks_max)
            self.seq += 1
            heapq.heappush(self.in_flight, (self.now + delay, self.seq, message))

    def _deliver_due(self) -> None:
        flight = self.in_flight
        while flight and flight[0][0] <= self.now:
            _, _, message = heapq.heappop(flight)
            peer = self.peers[message.to_id]
            if peer.node is None or (message.from_id, message.to_id) in self.cut:
                self.stats.messages_dropped += 1
                continue
            if peer.paused_until > self.now:
                self.seq += 1
                heapq.heappush(flight, (peer.paused_until, self.seq, message))
                continue
            self.stats.messages_delivered += 1
            self.trace = hash((self.trace, self.now, message.from_id, message.to_id, message.TAG, message.term))
            self._step(peer, Receive(message=message))

    # ------------------------------------------------------------------ peers

    def _start(self, peer: Peer) -> None:
        if peer.node is not None or peer.id in self.silent:
            return
        if peer.down_until:
            self.stats.restarts += 1
        config = RaftConfig(node_id=peer.id, **self.config_base)
        peer.node = RaftNode(config, random.Random(self.rng.getrandbits(64)))
        peer.sm = KvMachine()
        peer.seen_commit = 0
        peer.proposals = {}
        peer.reads = {}
        peer.ready_reads = []
        peer.snapshot_due = None
        peer.marker = None
        self._step(peer, peer.disk.restore_event())
        if peer.node is not None:
            peer.seen_commit = peer.node.commit_index

    def _crash(self, peer: Peer, down_ticks: int) -> None:
        """The process dies: memory is gone, the disk stays."""
        self.stats.crashes += 1
        # Background writes in flight: a prefix of them may have reached the disk.
        reached = self.rng.randint(0, len(peer.writes))
        for _, write in peer.writes[:reached]:
            self._write(peer, write)
        peer.writes, peer.persisted = [], []
        if self.faults.tear_rate and self.rng.random() < self.faults.tear_rate:
            self._tear(peer.disk, peer.id)
        peer.node = None
        peer.down_until = self.now + down_ticks
        for op, _term in peer.proposals.values():
            self._complete(op, "info")
        for op in peer.reads.values():
            self._complete(op, "info")
        for _, op in peer.ready_reads:
            self._complete(op, "info")
        peer.proposals, peer.reads, peer.ready_reads = {}, {}, []
        self.trace = hash((self.trace, self.now, -1, peer.id))

    def _tear(self, disk: Disk, peer_id: int) -> None:
        """Drop the tail of a crashed peer's log (and clamp its stored commit index to
        what is left: in the real store a torn write batch loses both), if the other voters keep a quorum
        of copies of every entry lost. The peer comes back having acknowledged entries it
        no longer holds: the leader must notice and send them again."""
        torn = disk.entries[max(0, len(disk.entries) - self.rng.randint(1, 3)) :]
        voters = self.committed_membership.voters
        for entry in torn:
            holders = sum(1 for v in voters if v != peer_id and self.peers[v].disk.holds(entry.index, entry.term))
            if holders < quorum(voters):
                return
        if not torn:
            return
        del disk.entries[len(disk.entries) - len(torn) :]
        hs = disk.hard_state
        if hs.commit_index > disk.last_index():
            disk.hard_state = HardState(term=hs.term, voted_for=hs.voted_for, commit_index=disk.last_index())
        self.stats.tears += 1

    def _step(self, peer: Peer, event: Event) -> None:
        node = peer.node
        assert node is not None
        self.stats.steps += 1
        was_leader, commit_before = node.role is Role.LEADER, node.commit_index
        effects = node.step(event)
        self._check_roles(peer)
        crash_at = -1
        if self.chaos and self.faults.crash_rate and effects:
            # Crash part way through a step now and then; more often in the steps where
            # entries exist on a leader alone (a proposal, a won election) or where a
            # leader's commit moves: the moments Figure 3.7 of the thesis is made of.
            critical = type(event) in (Propose, ProposeBatch) or (node.role is Role.LEADER and (
                was_leader is False or node.commit_index != commit_before
            ))
            rate = self.faults.crash_rate / (3 if critical else 20)
            if self.rng.random() < rate:
                crash_at = self.rng.randrange(len(effects))
        for k, effect in enumerate(effects):
            if k == crash_at:
                self._crash(peer, self.rng.randint(1, self.faults.restart_ticks_max))
                return
            _EFFECT_HANDLERS[type(effect)](self, peer, effect)
        self._record_commits(peer)

    # ------------------------------------------------------------------ effects

    def _do_send(self, peer: Peer, e: Send) -> None:
        assert e.message.from_id == peer.id
        self._send(e.message)

    def _step_persisted(self, peer: Peer, event: LogPersisted) -> None:
        """A shell wakes for a `LogPersisted` only from `commit_waits_for_own_copy()` on
        (and steps it late, with other events, below): one below must commit nothing."""
        node = peer.node
        assert node is not None
        wake_at, commit = node.commit_waits_for_own_copy(), node.commit_index
        self._step(peer, event)
        if peer.node is node and node.commit_index > commit and not (wake_at and event.index >= wake_at):
            raise InvariantViolation(
                f"peer {peer.id}: LogPersisted({event.index}) committed {node.commit_index} (from {commit})"
                f" though no commit waited for it (commit_waits_for_own_copy() was {wake_at})")

    def _complete_writes(self, peer: Peer, upto_tick: int | None = None) -> None:
        """Background writes due by `upto_tick` (all of them: None) reach the disk, in order."""
        while peer.writes and (upto_tick is None or peer.writes[0][0] <= upto_tick):
            _, write = peer.writes.pop(0)
            self._write(peer, write)
            last = write.entries[-1]
            peer.persisted.append(LogPersisted(index=last.index, term=last.term))

    def _do_persist_hard_state(self, peer: Peer, e: PersistHardState) -> None:
        self._complete_writes(peer)  # a foreground write waits for the background ones
        if e.hard_state.term < peer.disk.hard_state.term:
            raise InvariantViolation(f"peer {peer.id} persisted term {e.hard_state.term} after {peer.disk.hard_state.term}")
        peer.disk.hard_state = e.hard_state

    def _do_persist_entries(self, peer: Peer, e: PersistEntries) -> None:
        if e.background:
            assert e.truncate_from is None and e.entries, e
            # Sends and the rest of the step go on; the write lands 0-4 ticks later.
            peer.writes.append((self.now + self.rng.randint(0, 4), e))
            return
        self._complete_writes(peer)
        self._write(peer, e)

    def _write(self, peer: Peer, e: PersistEntries) -> None:
        disk = peer.disk
        removed: list[Entry] = []
        if e.truncate_from is not None:
            removed = disk.truncate(e.truncate_from)
        if e.entries:
            prev_term = disk.term_at(e.entries[0].index - 1)
            for entry in e.entries:
                self._check_entry_shape(entry, prev_term)
                prev_term = entry.term
            disk.append(e.entries)
        for entry in removed:
            self._check_durable(entry.index)

    def _do_save_snapshot(self, peer: Peer, e: SaveSnapshot) -> None:
        self._complete_writes(peer)
        known = self.committed.get(e.meta.last_index)
        if known is not None and known[0] != e.meta.last_term:
            raise InvariantViolation(f"peer {peer.id} saved a snapshot at {e.meta.last_index} of term {e.meta.last_term}")
        peer.disk.snapshot = e.meta
        peer.disk.snapshot_data = e.data

    def _do_compact(self, peer: Peer, e: CompactLog) -> None:
        self._complete_writes(peer)
        peer.disk.compact(e.upto_index)

    def _do_apply(self, peer: Peer, e: Apply) -> None:
        sm = peer.sm
        for entry in e.entries:
            self._record_committed(entry.index, entry.term, entry.kind, entry.data, peer)
            result = sm.apply(entry)
            digest = self.digests.setdefault(entry.index, sm.digest)
            if digest != sm.digest:
                raise InvariantViolation(f"peer {peer.id}: state after index {entry.index} differs from another peer's")
            pending = peer.proposals.pop(entry.index, None)
            if pending is not None:
                op, term = pending
                if term == entry.term:
                    op.result = result
                    self._complete(op, "ok")
                else:
                    self._complete(op, "fail")  # another entry took that index: ours never applies
            if peer.marker is not None and peer.marker[0] == entry.index and peer.marker[1] != entry.term:
                peer.marker = None
        self.trace = hash((self.trace, self.now, peer.id, e.entries[-1].index))
        self._serve_reads(peer)

    def _do_apply_snapshot(self, peer: Peer, e: ApplySnapshot) -> None:
        peer.sm.load(e.data)
        self.stats.snapshots_installed += 1
        sm = peer.sm
        if sm.applied_index != e.meta.last_index:
            raise InvariantViolation(f"peer {peer.id}: snapshot data at {sm.applied_index}, meta at {e.meta.last_index}")
        digest = self.digests.setdefault(sm.applied_index, sm.digest)
        if digest != sm.digest:
            raise InvariantViolation(f"peer {peer.id}: snapshot state at {sm.applied_index} differs from the applied state")
        for index in [i for i in peer.proposals if i <= sm.applied_index]:
            op, _ = peer.proposals.pop(index)
            self._complete(op, "info")  # covered by the snapshot: applied or not, we cannot tell here
        self._serve_reads(peer)

    def _do_proposal_result(self, peer: Peer, e: ProposalResult) -> None:
        if e.request_id == self.marker_request:
            if e.error is None:
                peer.marker = (e.index, e.term)
            return
        op = self.requests.pop(e.request_id, None)
        if op is None:
            return  # a configuration change
        if e.error is not None:
            self._complete(op, "fail", leader_hint=e.leader_hint)
            return
        peer.proposals[e.index] = (op, e.term)

    def _do_read_ready(self, peer: Peer, e: ReadReady) -> None:
        op = self.requests.pop(e.request_id, None)
        peer.reads.pop(e.request_id, None)
        if op is None:
            return
        if e.error is not None:
            self._complete(op, "fail", leader_hint=e.leader_hint)
            return
        peer.ready_reads.append((e.read_index, op))
        self._serve_reads(peer)

    def _do_take_snapshot(self, peer: Peer, e: TakeSnapshot) -> None:
        peer.snapshot_due = self.now + self.rng.randint(0, 3)

    def _do_role_changed(self, peer: Peer, e: RoleChanged) -> None:
        self.trace = hash((self.trace, self.now, peer.id, int(e.role), e.term))

    def _serve_reads(self, peer: Peer) -> None:
        if not peer.ready_reads:
            return
        keep = []
        for read_index, op in peer.ready_reads:
            if peer.sm.applied_index >= read_index:
                op.result = peer.sm.kv.get(op.key)
                self._complete(op, "ok")
            else:
                keep.append((read_index, op))
        peer.ready_reads = keep

    # ------------------------------------------------------------------ clients

    def _request_id(self) -> int:
        self.request_seq += 1
        return self.request_seq

    def _clients_act(self) -> None:
        rng = self.rng
        proposals: dict[int, list[Propose]] = {}
        for client in self.clients:
            op = client.pending
            if op is not None:
                if self.now - op.invoke_tick >= _CLIENT_TIMEOUT_TICKS:
                    self._complete(op, "info")
                continue
            if not self.chaos or rng.random() >= 0.5:
                continue
            kind = rng.choice(("put", "put", "get", "get", "get", "cas"))
            key = rng.choice(_KEYS)
            client.seq += 1
            value = f"{client.id}.{client.seq}".encode() if kind != "get" else None
            expected = None
            if kind == "cas":
                expected = rng.choice([None, *(f"{c.id}.{s}".encode() for c in self.clients for s in (c.seq - 1, c.seq - 2))])
            op = ClientOp(client=client.id, op=kind, key=key, value=value, expected=expected, invoke_tick=self.now)
            self.history.append(op)
            self.stats.client_ops += 1
            client.pending = op
            peer = self.peers[client.leader_guess]
            if peer.node is None:
                self._complete(op, "fail")  # connection refused: never reached a server
                continue
            request_id = self._request_id()
            self.requests[request_id] = op
            if kind == "get":
                peer.reads[request_id] = op
                self._step(peer, ReadIndex(request_id=request_id))
            else:
                data = msgpack.packb([client.id, client.seq, kind, key, value, expected], use_bin_type=True)
                proposals.setdefault(peer.id, []).append(Propose(request_id=request_id, data=data))
        # Proposals reaching one peer in the same tick go in as one batch (the shell's
        # group commit), so both Propose and ProposeBatch are exercised.
        for peer_id, batch in proposals.items():
            peer = self.peers[peer_id]
            if peer.node is not None:
                self._step(peer, batch[0] if len(batch) == 1 else ProposeBatch(proposals=tuple(batch)))

    def _complete(self, op: ClientOp, status: str, leader_hint: int | None = None) -> None:
        if op.status != "pending":
            return
        op.status = status
        op.complete_tick = self.now
        client = self.clients[op.client]
        if client.pending is op:
            client.pending = None
            if status != "ok":
                client.leader_guess = leader_hint if leader_hint is not None else self.rng.choice(sorted(self.peers))

    # ------------------------------------------------------------------ invariants

    def _check_roles(self, peer: Peer) -> None:
        node = peer.node
        if node is None or node.role is not Role.LEADER:
            return
        holder = self.leaders.get(node.term)
        if holder is None:
            self.leaders[node.term] = peer.id
            self.stats.elections += 1
            # Leader completeness: the new leader holds every entry committed in an earlier term.
            for index, (term, _kind, data) in self.committed.items():
                if index <= node.snapshot.last_index or self.commit_terms[index] >= node.term:
                    continue
                entry = node.entry_at(index)
                if entry is None or entry.term != term or entry.data != data:
                    raise InvariantViolation(f"leader {peer.id} of term {node.term} lacks committed entry {index}")
        elif holder != peer.id:
            raise InvariantViolation(f"two leaders in term {node.term}: {holder} and {peer.id}")

    def _check_entry_shape(self, entry: Entry, prev_term: int | None) -> None:
        """Log matching, incrementally: an (index, term) pair always has the same data and
        follows the same term, so by induction two logs agree up to any pair they share."""
        key = (entry.index, entry.term)
        shape = self.entry_shape.get(key)
        if shape is None:
            assert prev_term is not None
            self.entry_shape[key] = (prev_term, entry.data)
        elif shape != (prev_term, entry.data):
            raise InvariantViolation(f"log matching: entry {key} differs between logs")

    def _record_commits(self, peer: Peer) -> None:
        node = peer.node
        if node is None or node.commit_index <= peer.seen_commit:
            return
        start = max(peer.seen_commit, node.snapshot.last_index) + 1
        for index in range(start, node.commit_index + 1):
            entry = node.entry_at(index)
            assert entry is not None
            self._record_committed(index, entry.term, entry.kind, entry.data, peer)
        peer.seen_commit = node.commit_index

    def _record_committed(self, index: int, term: int, kind: int, data: bytes, by: Peer) -> None:
        assert by.node is not None
        seen_in = by.node.term
        known = self.committed.get(index)
        if known is not None:
            if known != (term, kind, data):
                raise InvariantViolation(f"state machine safety: peer {by.id} commits a different entry at {index}")
            if seen_in < self.commit_terms[index]:
                self.commit_terms[index] = seen_in
            return
        self.committed[index] = (term, kind, data)
        self.commit_terms[index] = seen_in
        self.stats.commits += 1
        if kind == EntryKind.CONFIG and index > self.committed_membership_index:
            if self.silent & set(decode_membership(data).voters):
                raise InvariantViolation(f"a learner that never answered was promoted at {index}")
            self.committed_membership = decode_membership(data)
            self.committed_membership_index = index
            self.stats.config_changes += 1
        for peer in self.peers.values():
            node = peer.node
            if node is None or node.role is not Role.LEADER or node.term <= seen_in:
                continue
            if index > node.snapshot.last_index and node.term_at(index) != term:
                raise InvariantViolation(f"leader {peer.id} of term {node.term} lacks entry {index} committed by term {seen_in}")
        self._check_durable(index)

    def _check_durable(self, index: int) -> None:
        known = self.committed.get(index)
        if known is None:
            return
        term = known[0]
        voters = self.committed_membership.voters
        lacking = sum(1 for v in voters if not self.peers[v].disk.holds(index, term))
        if lacking >= quorum(voters):
            raise InvariantViolation(f"committed entry {index} (term {term}) is durable on too few voters")

    def _check_all(self) -> None:
        """The full, non-incremental checks (every 50 ticks and at the end)."""
        for index in self.committed:
            self._check_durable(index)
        live = [p for p in self.peers.values() if p.node is not None]
        for peer in live:
            node = peer.node
            assert node is not None
            prev = node.snapshot.last_term
            writing = peer.writes[0][1].entries[0].index if peer.writes else None  # checked once written
            for entry in node.log:
                if writing is not None and entry.index >= writing:
                    break
                shape = self.entry_shape.get((entry.index, entry.term))
                if shape is None or shape != (prev, entry.data):
                    raise InvariantViolation(f"peer {peer.id}: entry {entry.index} was never persisted as it is")
                prev = entry.term

    # ------------------------------------------------------------------ liveness

    def _a_leader(self) -> Peer | None:
        """The leader of the highest term among the live peers, if any."""
        best: Peer | None = None
        best_term = -1
        for peer in self.peers.values():
            node = peer.node
            if node is not None and node.role is Role.LEADER and node.term > best_term:
                best, best_term = peer, node.term
        return best

    def _committed_after_heal(self) -> bool:
        """A leader committed a fresh entry (the marker) and every client operation completed."""
        if any(c.pending is not None for c in self.clients):
            return False
        leader = self._a_leader()
        if leader is None or leader.node is None:
            return False
        node = leader.node
        if leader.marker is None:
            if node.term_at(node.commit_index) == node.term:
                self.marker_request = self._request_id()
                data = msgpack.packb([-1, self.marker_request, "put", "_marker", b"", None], use_bin_type=True)
                self._step(leader, Propose(request_id=self.marker_request, data=data))
            return False
        return node.commit_index >= leader.marker[0]

    def _converged(self) -> bool:
        """Every member of the leader's configuration follows it and applied the marker."""
        if not self._committed_after_heal():
            return False
        leader = self._a_leader()
        assert leader is not None and leader.node is not None and leader.marker is not None
        node = leader.node
        index, term = leader.marker
        members = [*node.membership.voters, *node.membership.learners]
        for member in members:
            if member in self.silent:
                continue
            other = self.peers[member].node
            if other is None or other.applied_index < index or other.term_at(index) not in (term, None):
                return False
            if other.leader_id != leader.id:
                return False
        return True

    def _describe(self) -> str:
        parts = []
        for peer in self.peers.values():
            node = peer.node
            if node is None:
                parts.append(f"{peer.id}:down")
            else:
                parts.append(
                    f"{peer.id}:{node.role.name.lower()} t{node.term} c{node.commit_index} l{node.last_index} "
                    f"leader={node.leader_id} v={node.membership.voters} ln={node.membership.learners}"
                )
        return "; ".join(parts)


class _Client:
    __slots__ = ("id", "leader_guess", "pending", "seq")

    def __init__(self, client_id: int, leader_guess: int) -> None:
        self.id = client_id
        self.leader_guess = leader_guess
        self.pending: ClientOp | None = None
        self.seq = 0


_EFFECT_HANDLERS = {
    Send: Simulation._do_send,
    PersistHardState: Simulation._do_persist_hard_state,
    PersistEntries: Simulation._do_persist_entries,
    SaveSnapshot: Simulation._do_save_snapshot,
    CompactLog: Simulation._do_compact,
    Apply: Simulation._do_apply,
    ApplySnapshot: Simulation._do_apply_snapshot,
    ProposalResult: Simulation._do_proposal_result,
    ReadReady: Simulation._do_read_ready,
    TakeSnapshot: Simulation._do_take_snapshot,
    RoleChanged: Simulation._do_role_changed,
}


def run_seed(seed: int, peers: int = 3, **kwargs: Any) -> SimResult:
    return Simulation(seed, peers, **kwargs).run()


def run_disaster_seed(seed: int, peers: int = 3, **kwargs: Any) -> SimResult:
    return Simulation(seed, peers, **kwargs).run_disaster()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m danube_zmq.consensus.simulator", description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=100, help="how many seeds to run")
    parser.add_argument("--start", type=int, default=0, help="first seed")
    parser.add_argument("--seed", type=int, default=None, help="replay this one seed")
    parser.add_argument("--peers", type=int, default=3, help="founding voters (3 or 5)")
    parser.add_argument("--ticks", type=int, default=300, help="chaos ticks per seed before healing")
    args = parser.parse_args(argv)
    seeds = [args.seed] if args.seed is not None else range(args.start, args.start + args.seeds)
    total = Stats()
    first_failure: SimResult | None = None
    failures = 0
    began = time.perf_counter()
    for seed in seeds:
        result = run_seed(seed, args.peers, chaos_ticks=args.ticks)
        for name in Stats.__slots__:
            setattr(total, name, getattr(total, name) + getattr(result.stats, name))
        if result.failure is not None:
            failures += 1
            if first_failure is None:
                first_failure = result
                print(result.failure, file=sys.stderr)
        if args.seed is not None:
            print(f"seed {seed}: trace {result.trace_hash:#x}, {result.ticks} ticks")
    elapsed = time.perf_counter() - began
    print(
        f"{len(seeds)} seeds x {args.peers} peers in {elapsed:.1f} s: {total.steps} steps, "
        f"{total.faults()} faults ({total.messages_dropped} drops, {total.messages_duplicated} duplicates, "
        f"{total.partitions} partitions, {total.crashes} crashes), {total.elections} elections, "
        f"{total.commits} commits, {total.snapshots_taken} snapshots, {total.config_changes} config changes"
    )
    if first_failure is not None:
        print(f"FAILED: {failures} seeds; first failing seed {first_failure.seed} "
              f"(replay: python -m danube_zmq.consensus.simulator --seed {first_failure.seed} --peers {args.peers})")
        return 1
    print("all seeds passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())

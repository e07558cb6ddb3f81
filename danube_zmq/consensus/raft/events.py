"""What goes into the Raft core (events) and what comes out of it (effects).

Plain frozen dataclasses, never on the wire: the I/O shell (the peer actor, or the
simulator) builds events from sockets, timers and client calls, and executes effects.

Effect order is part of the contract. The shell executes the effects of one step
IN LIST ORDER, and a `PersistHardState`, `PersistEntries`, `SaveSnapshot` or
`CompactLog` must be durable (fsynced) before the shell executes ANY later effect of
that list: a vote, an append acknowledgement, an `Apply` or a `ProposalResult` is
only ever placed after the persistence it depends on. A shell may group-commit by
queueing everything that follows an un-synced write until one fsync covers it.
When `step` returns, the core assumes every effect of earlier steps has happened;
if the process dies part way, the core is rebuilt from disk with `Restore`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from danube_zmq.consensus.raft.messages import RaftMessage
from danube_zmq.consensus.types import Entry, HardState, SnapshotMeta

_frozen = dataclass(frozen=True, slots=True, kw_only=True)


class Role(enum.IntEnum):
    FOLLOWER = 0  # also every learner and every node outside the membership
    PRE_CANDIDATE = 1
    CANDIDATE = 2
    LEADER = 3


class RaftError(enum.IntEnum):
    """Why a proposal, configuration change or read was refused. None of these change state."""

    NOT_LEADER = 1  # retry at `leader_hint` (None: no leader known yet)
    CONFIG_CHANGE_IN_PROGRESS = 2  # an earlier change (or the new leader's no-op) is not committed yet; retry
    INVALID_CONFIG_CHANGE = 3  # e.g. promoting a node that is not a learner; do not retry
    BUSY = 4  # uncommitted_entries_max or reads_pending_max reached; retry later
    TRANSFERRING = 5  # a leadership transfer is under way; retry at the new leader
    LEARNER_BEHIND = 6  # the learner to promote has not caught up yet; retry later


# --------------------------------------------------------------------------- events


@_frozen
class Restore:
    """The first event of every node lifetime: what is on disk. A brand-new peer that
    joins an existing cluster passes `HardState(term=0, voted_for=None, commit_index=0)`
    and nothing else; the founding voters pass `bootstrap(voters)` (core.py)."""

    hard_state: HardState
    snapshot: SnapshotMeta | None = None
    snapshot_data: bytes = b""
    entries: list[Entry] = field(default_factory=list)


@_frozen
class Tick:
    """One unit of logical time (the shell's timer; e.g. 100 ms)."""


@_frozen
class Receive:
    """A message from a peer, already decoded with `RAFT_PROTOCOL`."""

    message: RaftMessage


@_frozen
class Propose:
    """A client command for the state machine (leader only)."""

    request_id: int
    data: bytes


@_frozen
class ProposeBatch:
    """Several proposals at once: each is answered as if proposed alone, but the entries
    go out to each follower in one AppendEntries (the shell's group commit)."""

    proposals: tuple[Propose, ...]


@_frozen
class AddLearner:
    node_id: int


@_frozen
class PromoteVoter:
    node_id: int


@_frozen
class RemoveVoter:
    """Remove a member: a voter, or a learner that should stop replicating."""

    node_id: int


ConfigChange = AddLearner | PromoteVoter | RemoveVoter


@_frozen
class ProposeConfig:
    """A single-server membership change (leader only; one at a time)."""

    request_id: int
    change: ConfigChange


@_frozen
class ReadIndex:
    """A linearizable read: answered by `ReadReady` once leadership is confirmed."""

    request_id: int


@_frozen
class SnapshotTaken:
    """The shell's state machine serialized itself after applying `last_index` (<= the
    last `Apply`d index) and asks the core to compact the log up to it. The core adds
    the term and membership at that index (`SaveSnapshot.meta`)."""

    last_index: int
    data: bytes


@_frozen
class TransferLeadership:
    """Hand leadership to the voter `target_id` (leader only; best effort)."""

    target_id: int


@_frozen
class LogPersisted:
    """A `PersistEntries(background=True)` whose last entry is (`index`, `term`) is on
    disk (fsynced). Only then does a leader count those entries as its own copy."""

    index: int
    term: int


Event = (
    Restore
    | Tick
    | Receive
    | Propose
    | ProposeBatch
    | ProposeConfig
    | ReadIndex
    | SnapshotTaken
    | TransferLeadership
    | LogPersisted
)


# -------------------------------------------------------------------------- effects


@_frozen
class Send:
    message: RaftMessage


@_frozen
class PersistHardState:
    """Write and fsync the term and vote. `commit_index` is a lower bound of the commit
    index at that moment (the core does not ask for an fsync per commit)."""

    hard_state: HardState


@_frozen
class PersistEntries:
    """Delete every entry with index >= `truncate_from` (when not None), then append
    `entries` (contiguous, may be empty), then fsync.

    `background` (a leader's own appends, with `RaftConfig.leader_persist_async`): the
    effects after it need not wait for this write (the leader sends AppendEntries while
    its own fsync runs, Raft thesis 10.2.1); the shell steps `LogPersisted` once it is
    durable, and the core does not count these entries as the leader's copy before.
    Writes still reach the disk in effect order: a later foreground persist, snapshot
    or compaction waits for every background write before it."""

    entries: list[Entry]
    truncate_from: int | None = None
    background: bool = False


@_frozen
class SaveSnapshot:
    """Write and fsync this snapshot, replacing the previous one."""

    meta: SnapshotMeta
    data: bytes


@_frozen
class CompactLog:
    """Delete every entry with index <= `upto_index` (covered by the saved snapshot).
    The next append may start at `upto_index + 1` even if the log ended before it."""

    upto_index: int


@_frozen
class Apply:
    """Committed entries, in order, each exactly once per node lifetime: the state
    machine applies COMMAND entries and skips NOOP and CONFIG (but counts their index)."""

    entries: list[Entry]


@_frozen
class ApplySnapshot:
    """Replace the state machine with this snapshot (after restart or InstallSnapshot)."""

    meta: SnapshotMeta
    data: bytes


@_frozen
class ProposalResult:
    """The proposal was appended at (`index`, `term`), or refused with `error`. It is
    committed and applied when an `Apply` carries an entry with that index AND term; an
    entry at `index` with another term means the proposal was lost (it never applies)."""

    request_id: int
    index: int = 0
    term: int = 0
    error: RaftError | None = None
    leader_hint: int | None = None


@_frozen
class ReadReady:
    """Serve read `request_id` once the state machine has applied `read_index`."""

    request_id: int
    read_index: int = 0
    error: RaftError | None = None
    leader_hint: int | None = None


@_frozen
class TakeSnapshot:
    """A suggestion: the log holds more than `log_entries_max` entries; snapshot the
    state machine (at any applied index >= the last one) and send `SnapshotTaken`."""

    applied_index: int


@_frozen
class RoleChanged:
    """This node's role, term or known leader changed during the step."""

    role: Role
    term: int
    leader_id: int | None


Effect = (
    Send
    | PersistHardState
    | PersistEntries
    | SaveSnapshot
    | CompactLog
    | Apply
    | ApplySnapshot
    | ProposalResult
    | ReadReady
    | TakeSnapshot
    | RoleChanged
)

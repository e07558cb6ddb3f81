"""The Raft peer-to-peer protocol (broker <-> broker): one `@wire` message per Raft RPC.

Every message carries `from_id`, `to_id` and the sender's `term`. Tags start at 16
(1..15 are reserved for the shared messages of `transport/common.py` on every
boundary). The leader's id is `from_id` of AppendEntries, Heartbeat and
InstallSnapshot; there is no separate `leader_id` field.

The three answers to a leader carry the follower's `incarnation`, drawn at random each
time it starts (0 from a peer that predates the field: unknown). A leader that sees a
follower's incarnation change knows it restarted, so it may have lost the tail of its
log even after acknowledging it (a disk that dropped a synced write), and probes it
again from scratch instead of trusting the match index it had.

Also here: the encoding of a `Membership` as the data of a CONFIG log entry.
"""

from __future__ import annotations

import msgpack

from danube_zmq.consensus.types import Entry, Membership, SnapshotMeta
from danube_zmq.transport.codec import Message, Protocol, unpack, wire
from danube_zmq.transport.errors import InvalidArgument


@wire
class PreVote(Message):
    """"Would you vote for me at `term`?" (thesis §9.6). Sent with `term` = the sender's
    term + 1 without changing any state, so a partitioned peer does not inflate terms."""

    TAG = 16
    from_id: int
    to_id: int
    term: int
    last_log_index: int
    last_log_term: int


@wire
class PreVoteResponse(Message):
    """`term` is the pre-vote term when granted, the responder's own term when not."""

    TAG = 17
    from_id: int
    to_id: int
    term: int
    granted: bool


@wire
class RequestVote(Message):
    """A real election. `transfer` marks a campaign started by `TimeoutNow`: voters then
    grant even while they still hear from the current leader (the leader asked for it)."""

    TAG = 18
    from_id: int
    to_id: int
    term: int
    last_log_index: int
    last_log_term: int
    transfer: bool = False


@wire
class RequestVoteResponse(Message):
    TAG = 19
    from_id: int
    to_id: int
    term: int
    granted: bool


@wire
class AppendEntries(Message):
    """Replicate `entries` after (prev_log_index, prev_log_term); `context` is the
    leader's read-index round, echoed back so one answer also confirms leadership."""

    TAG = 20
    from_id: int
    to_id: int
    term: int
    prev_log_index: int
    prev_log_term: int
    entries: list[Entry]
    leader_commit: int
    context: int = 0


@wire
class AppendEntriesResponse(Message):
    """On success `match_index` = prev_log_index + len(entries) (or the follower's commit
    index when that is larger: a committed prefix matches every later leader's log).
    On rejection `rejected_index` is the rejected prev_log_index (so the leader can drop
    stale answers) and the hint for fast backtracking: `conflict_term` is the follower's
    term at prev_log_index (0 when its log is shorter) and `conflict_index` the first
    index it holds of that term (its last index + 1 when shorter)."""

    TAG = 21
    from_id: int
    to_id: int
    term: int
    success: bool
    match_index: int
    rejected_index: int = 0
    conflict_term: int = 0
    conflict_index: int = 0
    context: int = 0
    incarnation: int = 0


@wire
class Heartbeat(Message):
    """The leader's periodic "still here", with no log check (as etcd's MsgHeartbeat).
    `leader_commit` is min(leader commit, the peer's known match index), so the follower
    can always commit it. `context` is the latest read-index round. `answer` False: a
    commit notice, which the follower does not answer (True from a peer that predates it)."""

    TAG = 22
    from_id: int
    to_id: int
    term: int
    leader_commit: int
    context: int = 0
    answer: bool = True


@wire
class HeartbeatResponse(Message):
    TAG = 23
    from_id: int
    to_id: int
    term: int
    context: int = 0
    incarnation: int = 0


@wire
class InstallSnapshot(Message):
    """The leader's whole latest snapshot, for a follower whose next entry was compacted."""

    TAG = 24
    from_id: int
    to_id: int
    term: int
    meta: SnapshotMeta
    data: bytes


@wire
class InstallSnapshotResponse(Message):
    """`match_index`: the follower's log now matches the leader's up to here."""

    TAG = 25
    from_id: int
    to_id: int
    term: int
    match_index: int
    incarnation: int = 0


@wire
class TimeoutNow(Message):
    """Leadership transfer: "start an election now, skip pre-vote" (thesis §3.10)."""

    TAG = 26
    from_id: int
    to_id: int
    term: int


RAFT_PROTOCOL = Protocol(
    "raft",
    1,
    [
        PreVote,
        PreVoteResponse,
        RequestVote,
        RequestVoteResponse,
        AppendEntries,
        AppendEntriesResponse,
        Heartbeat,
        HeartbeatResponse,
        InstallSnapshot,
        InstallSnapshotResponse,
        TimeoutNow,
    ],
    ignore_newer_fields=True,  # a rolling upgrade: peers of the next version add fields
)

RaftMessage = (
    PreVote
    | PreVoteResponse
    | RequestVote
    | RequestVoteResponse
    | AppendEntries
    | AppendEntriesResponse
    | Heartbeat
    | HeartbeatResponse
    | InstallSnapshot
    | InstallSnapshotResponse
    | TimeoutNow
)


def encode_membership(membership: Membership) -> bytes:
    """The data of a CONFIG entry: msgpack `[voters, learners]`."""
    return msgpack.packb(membership.to_wire(), use_bin_type=True)


def decode_membership(data: bytes) -> Membership:
    """Inverse of `encode_membership`; a malformed entry is `InvalidArgument`."""
    items = unpack(data)
    if type(items) is not list or len(items) != 2:
        raise InvalidArgument("malformed membership: expected [voters, learners]")
    for ids in items:
        if type(ids) is not list or not all(type(i) is int for i in ids):
            raise InvalidArgument("malformed membership: node ids must be integers")
    return Membership(voters=items[0], learners=items[1])

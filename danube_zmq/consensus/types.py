"""Types shared by the Raft core, its log store and the metadata state machine.

Everything here is plain data (frozen dataclasses), encodable with the project codec
(`transport/codec.py`): log entries and hard state are what the log store persists;
snapshot metadata is what a snapshot file starts with.
"""

from __future__ import annotations

import enum

from danube_zmq.transport.codec import Struct, wire


class EntryKind(enum.IntEnum):
    """What a log entry carries."""

    NOOP = 0  # a new leader's first entry (commits earlier terms' entries, Raft §5.4.2)
    COMMAND = 1  # an opaque state-machine command (msgpack bytes; see consensus/state_machine.py)
    CONFIG = 2  # a membership change: data is an encoded `Membership`


@wire
class Entry(Struct):
    """One Raft log entry. `index` starts at 1; `term` never decreases along the log."""

    index: int
    term: int
    kind: int
    data: bytes


@wire
class HardState(Struct):
    """What must be on disk (fsynced) before a peer answers a vote or an append."""

    term: int
    voted_for: int | None
    commit_index: int


@wire
class Membership(Struct):
    """The cluster's configuration: voters elect and commit; learners only replicate."""

    voters: list[int]
    learners: list[int]


@wire
class SnapshotMeta(Struct):
    """What a snapshot covers: the state after applying every entry up to
    `last_index` (whose term is `last_term`), and the membership at that point."""

    last_index: int
    last_term: int
    membership: Membership

"""Topic ownership decisions, pure: what the broker does with a topic when its
assignment changes, where a reliable topic loaded here starts its offsets, and what a
broker that stops serving a topic records for the next (the seal).

No I/O and no clock: the broker (`broker.py`) reads the metadata store and the local
WAL, calls these, and carries the decision out (spawn, stop, seal, drop a stale WAL,
mark a damaged one).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from danube_zmq.transport.cluster_records import TopicState, Unassigned

__all__ = ["Ownership", "Start", "damaged_wal_is_stale", "marks_sealed", "on_assignment", "reliable_start",
           "seal_state"]


class Ownership(enum.Enum):
    LOAD = "load"  # assigned here: serve it
    UNLOAD = "unload"  # assigned elsewhere (or waiting for a broker): stop, seal for the next owner
    DELETE = "delete"  # deleted: stop, no seal, its local files go
    NOTHING = "nothing"


def on_assignment(*, me: int, owner: int | None, served: bool, record_exists: bool) -> Ownership:
    """The assignment of a topic now names `owner` (None: no broker, or deleted).
    `served`: this broker serves it now; `record_exists`: its topic record is in the
    store (a topic without one, and without an owner, was deleted)."""
    if owner == me:
        return Ownership.LOAD
    if owner is None and not record_exists:
        return Ownership.DELETE
    return Ownership.UNLOAD if served else Ownership.NOTHING


@dataclass(frozen=True, slots=True)
class Start:
    """Where a reliable topic starts. `start_offset` None: nothing says where, its local
    WAL (if any) decides. `drop_local_wal`: the local WAL is from an earlier turn here and
    ends below the start (the topic moved on elsewhere). `damage`: the local WAL ends
    below where this broker recorded it; the topic must not be served from it."""

    start_offset: int | None
    drop_local_wal: bool = False
    damage: str | None = None
    claimed_end: int = 0  # with `damage`: the offsets the log should hold, up to
    # The local WAL is this broker's own and alone holds its records, but it may end below
    # offsets this broker gave out (`wal_sync: interval`, then a power loss): keep it and
    # continue at `start_offset`, the offsets between given up (`WalLog.repair`).
    continue_after_gap: bool = False


def reliable_start(*, me: int, state: TopicState | None, local_end: int | None, durable_end: int | None,
                   wal_exact: bool = True, cursors_in_segments: bool = False) -> Start:
    """`state`: the topic's `TopicState` record; `local_end`: the next offset of the
    WAL on this broker's disk (None: none); `durable_end`: one past the last durable
    segment's end (None: none); `wal_exact`: this broker's WAL holds every offset it
    gave out (`wal_sync: always`: nothing is delivered or acknowledged before its fsync).

    It starts where its last owner stopped, past every offset another broker reserved
    (some may have been acknowledged) and past its durable segments. Offsets this broker
    reserved itself are not skipped when its own WAL is here and exact: the WAL says
    where it stopped. With `wal_sync: interval` a power loss cuts the WAL below records
    already delivered and acknowledged, so its own reservation is skipped too: their
    offsets never name other messages (a cursor past them would skip those).
    `cursors_in_segments` (durable modes, cursors as WAL checkpoints): a local WAL of an
    earlier turn is dropped even when it ends at the start, as another broker may have
    moved cursors since with no message sent: its checkpoints would undo those
    acknowledgements (its records are in the durable store)."""
    floors = []
    if state is not None:
        floors.append(state.next_offset)
        if state.broker_id != me or local_end is None or not wal_exact:
            floors.append(state.reserved_until)
    if durable_end is not None:
        floors.append(durable_end)
    if not floors:
        return Start(start_offset=None)
    start = max(floors)
    if local_end is not None and state is not None and state.broker_id == me and local_end < state.next_offset:
        return Start(start_offset=start, damage=(
            f"the log ends at offset {local_end}, below offset {state.next_offset} where this broker"
            f" recorded it at its last stop"), claimed_end=max(start, state.reserved_until))
    behind = local_end is not None and local_end < start
    earlier_turn = state is not None and state.broker_id != me
    if cursors_in_segments and earlier_turn and local_end is not None and local_end <= start:
        return Start(start_offset=start, drop_local_wal=True)
    if behind and not wal_exact and state is not None and state.broker_id == me \
            and (durable_end is None or durable_end <= local_end):
        return Start(start_offset=start, continue_after_gap=True)
    return Start(start_offset=start, drop_local_wal=behind)


def damaged_wal_is_stale(*, me: int, state: TopicState | None, claimed_end: int) -> bool:
    """A damaged local WAL can be dropped (not repaired) only when it is from an earlier
    turn here, superseded: another broker served the topic since, past every offset the
    WAL claims to hold."""
    return state is not None and state.broker_id != me and claimed_end <= state.next_offset


def seal_state(*, me: int, reliable: bool, current: TopicState | None, next_offset: int,
               now_ms: int) -> TopicState | None:
    """What a broker that stopped serving a topic records: where its offsets stopped,
    the reservation ended there (the next broker continues without a gap). None: nothing
    is written, another broker reserved the reliable topic's offsets since (it took the
    topic over from this one: its record stands)."""
    if current is not None and reliable and current.broker_id != me:
        return None
    return TopicState(next_offset=next_offset, broker_id=me, sealed_ms=now_ms, reserved_until=next_offset)


def marks_sealed(*, me: int, marker: Unassigned) -> bool:
    """The topic's unassigned marker is marked sealed by the broker it leaves, once."""
    return marker.from_broker == me and not marker.sealed

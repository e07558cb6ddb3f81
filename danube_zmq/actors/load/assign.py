"""What the leader's load manager does to the assignments, given the cluster as the
metadata store has it: a pure function, no I/O and no clock of its own.

- An unassigned topic (or partition) whose topic still exists goes to a broker chosen
  by `placement.place`, never the broker it leaves unless that is the only ACTIVE one;
  a marker whose topic is gone is dropped. A topic with neither an assignment nor a
  marker (a big topic whose creator stopped between its metadata batches) is new.
- A topic assigned to a broker whose registration has been gone for `grace_ms` (its
  lease expired: it is dead, or fenced itself) is posted unassigned again, reason
  failover. The grace covers a fresh leader that has not yet seen a restarted broker
  renew, so a full-cluster restart does not reshuffle every topic.
- A topic being unloaded waits until the broker it leaves has sealed it (its offsets
  and cursors are in the store, its segments uploaded), or until that broker's lease
  is gone: then the new owner starts where the old one stopped.
- A topic assigned to a registered broker that is not ACTIVE stays where it is (a
  drain moves topics on purpose, through unload markers).
- A pinned topic (reliable, storage.mode local: its WAL is on its broker's disk only)
  is never orphaned, and its unsealed marker waits even when the broker is gone: it is
  served again when that broker comes back, or an operator forces it elsewhere
  (`topics reassign --force`, a sealed failover marker), accepting the loss.
- A damaged topic (its WAL is damaged and no durable segment covers it: its broker
  recorded it, `WalDamageRecord`) is held the same way in every storage mode: another
  broker would serve it from an empty log. It moves once repaired, or when forced.
"""

from __future__ import annotations

from collections.abc import Mapping, Set
from dataclasses import dataclass, field

from danube_zmq.actors.load.placement import Placer, Strategy
from danube_zmq.actors.load.reports import BrokerState, LoadReport, TopicLoad
from danube_zmq.transport.errors import Unavailable


@dataclass(frozen=True, slots=True)
class Waiting:
    """An unassigned marker as the planner needs it."""

    from_broker: int | None = None
    to_broker: int | None = None
    epoch: int = 0
    sealed: bool = True


@dataclass(frozen=True, slots=True)
class ClusterView:
    """`brokers`: every registered broker and its mode. `assignments`: topic -> (broker,
    epoch). `waiting`: unassigned topic -> marker. `exists`: whether a topic or
    partition name still names a topic. `absent_since_ms`: when the planner first saw
    each assigned-but-unregistered broker missing (the caller keeps it)."""

    brokers: Mapping[int, BrokerState]
    assignments: Mapping[str, tuple[int, int]]
    waiting: Mapping[str, Waiting]
    exists: Set[str]
    absent_since_ms: Mapping[int, int] = field(default_factory=dict)
    pinned: Set[str] = frozenset()  # topics whose data only their broker's disk holds
    damaged: Set[str] = frozenset()  # topics not served: their WAL is damaged (held like pinned ones)


@dataclass(frozen=True, slots=True)
class Assign:
    topic: str
    broker_id: int
    epoch: int  # the new assignment's epoch (the marker's + 1)


@dataclass(frozen=True, slots=True)
class Orphan:
    topic: str
    from_broker: int
    epoch: int


@dataclass(frozen=True, slots=True)
class Plan:
    assign: tuple[Assign, ...]
    orphans: tuple[Orphan, ...]
    drop: tuple[str, ...]  # markers of topics that no longer exist
    cursor: int
    absent_since_ms: dict[int, int]
    unplaced: int  # waiting topics no ACTIVE broker could take


def plan(view: ClusterView, strategy: Strategy, reports: Mapping[int, LoadReport], loads: Mapping[str, TopicLoad],
         *, now_ms: int, grace_ms: int, cursor: int = 0) -> Plan:
    absent = {b: view.absent_since_ms.get(b, now_ms)
              for b in {broker for broker, _ in view.assignments.values()} if b not in view.brokers}
    held = view.pinned | view.damaged
    orphans = tuple(Orphan(topic=t, from_broker=b, epoch=e) for t, (b, e) in sorted(view.assignments.items())
                    if b in absent and now_ms - absent[b] >= grace_ms and t in view.exists and t not in held)
    drop = tuple(sorted(t for t in view.waiting if t not in view.exists))
    # One Placer for the whole round: each placed topic updates the brokers' totals
    # (O(B)) instead of placement summing every assigned topic again for each one.
    placer = Placer(strategy, view.brokers, reports,
                    {t: b for t, (b, _) in view.assignments.items() if b in view.brokers}, loads)
    assign: list[Assign] = []
    unplaced = 0
    # A topic with neither an assignment nor a marker is new too: a topic too large for
    # one metadata batch is created in several, and its creator may stop between them.
    # (Never a damaged one: it was served, so it has an assignment or a marker.)
    bare = {t: Waiting() for t in view.exists
            if t not in view.assignments and t not in view.waiting and t not in view.damaged}
    for topic, marker in sorted((view.waiting | bare).items()):
        if topic not in view.exists or topic in view.assignments:
            continue
        if not marker.sealed and (marker.from_broker in view.brokers or topic in held):
            continue  # the broker it leaves is still sealing it (or has its only copy)
        exclude = frozenset() if marker.from_broker is None else frozenset({marker.from_broker})
        target = marker.to_broker
        if target is None or view.brokers.get(target) is not BrokerState.ACTIVE or target in exclude:
            try:
                chosen = placer.place(cursor=cursor, exclude=exclude)
            except Unavailable:
                try:  # the broker it leaves is the only ACTIVE one: back there (a reload)
                    chosen = placer.place(cursor=cursor)
                except Unavailable:
                    unplaced += 1
                    continue
            target, cursor = chosen.broker_id, chosen.cursor
        placer.add(topic, target)
        assign.append(Assign(topic=topic, broker_id=target, epoch=marker.epoch + 1))
    return Plan(assign=tuple(assign), orphans=orphans, drop=drop, cursor=cursor, absent_since_ms=absent,
                unplaced=unplaced)

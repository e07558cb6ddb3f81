"""Jepsen-style checkers: judge a recorded history (tests/chaos/harness/history.py) after a run.

Pure: no I/O beyond what the caller loaded, no clock. Each checker takes the ops (and,
for availability, the harness's fault records) and returns its findings; `check_run`
puts them together in a `Report`, one row of the table in docs/reliability.md.

The records they read (written by tests/chaos/harness/workload.py):

- `send` (a producer): `invoke` {producer, seq, topic, reliable}, then `ok` {producer,
  seq, topic, offset} (`topic` is the partition topic the receipt names), `fail`
  {producer, seq, error} (certainly not stored) or `info` {producer, seq, error} (may
  be stored). An invocation never completed counts as `info`.
- `subscribe` `ok` {subscription, sub_type}: the subscription exists from here on.
- `deliver` `ok` {subscription, sub_type, producer, seq, topic, offset, redelivery}; a
  payload the consumer could not read has producer and seq None.
- `put`/`get`/`cas`/`delete` (an admin client, one call at a time per process):
  `invoke` {key, value?, expected?}, then `ok` {result?}, `fail` or `info`.

What each promises, and why:

- **Queue** (Jepsen's total queue, per subscription: every subscription is created
  from the earliest offset before the first send, so each must see every message):
  lost = acknowledged but never delivered on that subscription (must be 0);
  unexpected = delivered but never attempted by any producer (must be 0);
  duplicates = deliveries past the first of a message on a subscription (allowed:
  at-least-once), with how many of them the broker marked as redeliveries; an `info`
  send may or may not land (never lost, never unexpected: counted as recovered when it
  did); a `fail` send that was delivered is counted (`failed_delivered`): its error was
  wrong to be definite.
- **Order**: per subscription of type Exclusive or Failover, per producer and
  partition topic, the first deliveries come in send order; each pair out of order is
  a `nonmonotonic` finding (a redelivery repeats an earlier message, it is not a first
  delivery, so it never counts).
- **Offsets** (reliable topics only: a non-reliable topic's offsets may repeat after a
  restart, docs/reliability.md): one offset of a partition topic names one message
  (`inconsistent`), in particular an acknowledged offset is never given to another
  message (`acked_reused`). Offsets are consecutive within one WAL, but a broker that
  takes a topic over starts past the offsets the previous one reserved, and a repair
  continues past every offset given out (docs/architecture.md, "Offset reservations";
  storage/wal/README.md): a gap among acknowledged offsets (offsets neither acknowledged
  nor delivered) is therefore a warning when a send failed or went unknown, or a fault
  was injected, between the two acknowledged sends around it, and an error otherwise.
- **Availability**: for each fault, the time from its heal to the first acknowledged
  write (a send, or a metadata put/cas/delete) and to the first delivery after it.
- **Raft**: at most one leader per term among (node, term, role) observations; the
  metadata operations are linearizable (consensus/linearizability.py, per key).
"""

from __future__ import annotations

import bisect
import itertools
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from danube_zmq.consensus.linearizability import CheckResult, Operation, check
from tests.chaos.harness.history import Op, pair_ops

__all__ = [
    "AvailabilityResult",
    "Fault",
    "OffsetResult",
    "OrderResult",
    "QueueResult",
    "RaftResult",
    "Report",
    "check_availability",
    "check_leaders",
    "check_offsets",
    "check_order",
    "check_queue",
    "check_raft",
    "check_run",
    "leader_observations",
    "metadata_operations",
]

# How many example findings a result keeps (the counts are always whole).
EXAMPLES_MAX = 20

ORDERED_SUB_TYPES = ("exclusive", "failover")

Message = tuple[str, int]  # (producer, seq): what a message is, whatever its offset


@dataclass(frozen=True, slots=True)
class Fault:
    """One injected fault, in `time.monotonic_ns()`: started at `start_ns`, healed (the
    process restarted or resumed, the partition removed) at `heal_ns`."""

    name: str
    start_ns: int
    heal_ns: int


@dataclass(frozen=True, slots=True)
class SendOutcome:
    """A send's invocation and how it ended: `ok`, `fail` or `info` (never completed
    counts as `info`)."""

    message: Message
    topic: str
    reliable: bool
    result: str
    invoke_ns: int
    complete_ns: int | None
    partition_topic: str | None = None
    offset: int | None = None


def send_outcomes(ops: Iterable[Op]) -> tuple[list[SendOutcome], int]:
    """Every send and its outcome, and the number of completions without an invocation
    (a recorder bug: reported, never guessed at)."""
    pairs, orphans = pair_ops(ops, "send", "seq")
    outcomes = []
    for invoke, done in pairs:
        value = invoke.value
        result = "info" if done is None else done.type
        offset = done.value.get("offset") if done is not None and done.type == "ok" else None
        outcomes.append(SendOutcome(
            message=(str(value["producer"]), int(value["seq"])), topic=str(value.get("topic", "")),
            reliable=bool(value.get("reliable", True)), result=result, invoke_ns=invoke.time_ns,
            complete_ns=None if done is None else done.time_ns,
            partition_topic=done.value.get("topic") if done is not None and done.type == "ok" else None,
            offset=offset))
    return outcomes, len(orphans)


def _message_of(value: dict[str, Any] | Any) -> Message | None:
    producer, seq = value.get("producer"), value.get("seq")
    if producer is None or seq is None:
        return None
    return (str(producer), int(seq))


@dataclass(frozen=True, slots=True)
class QueueResult:
    attempted: int
    acked: int
    failed: int
    info: int
    subscriptions: tuple[str, ...]
    deliveries: int
    lost: int
    lost_examples: tuple[tuple[str, Message], ...]
    unexpected: int
    unexpected_examples: tuple[Any, ...]
    duplicates: int
    redeliveries: int
    recovered: int  # info sends that were delivered
    failed_delivered: int
    orphan_completions: int

    @property
    def valid(self) -> bool:
        return self.lost == 0 and self.unexpected == 0


def check_queue(ops: Sequence[Op]) -> QueueResult:
    """The total-queue checker (module docstring), over every subscription the
    history shows (a `subscribe` or a `deliver` record names it)."""
    outcomes, orphans = send_outcomes(ops)
    attempted = {o.message for o in outcomes}
    by_result: dict[str, set[Message]] = defaultdict(set)
    for o in outcomes:
        by_result[o.result].add(o.message)
    acked = by_result["ok"]
    subscriptions: set[str] = set()
    delivered: dict[str, Counter[Message]] = defaultdict(Counter)
    unexpected: dict[Any, None] = {}
    deliveries = redeliveries = 0
    for op in ops:
        if op.type != "ok":
            continue
        if op.f == "subscribe":
            subscriptions.add(str(op.value["subscription"]))
        elif op.f == "deliver":
            sub = str(op.value["subscription"])
            subscriptions.add(sub)
            deliveries += 1
            if op.value.get("redelivery", 0):
                redeliveries += 1
            message = _message_of(op.value)
            if message is None or message not in attempted:
                unexpected.setdefault(message if message is not None else
                                      ("unreadable", op.value.get("topic"), op.value.get("offset")), None)
                continue
            delivered[sub][message] += 1
    lost = [(sub, m) for sub in sorted(subscriptions) for m in sorted(acked - delivered[sub].keys())]
    ever_delivered = set().union(*(c.keys() for c in delivered.values())) if delivered else set()
    duplicates = sum(n - 1 for c in delivered.values() for n in c.values())
    return QueueResult(
        attempted=len(attempted), acked=len(acked), failed=len(by_result["fail"] - acked),
        info=len(by_result["info"] - acked), subscriptions=tuple(sorted(subscriptions)), deliveries=deliveries,
        lost=len(lost), lost_examples=tuple(lost[:EXAMPLES_MAX]), unexpected=len(unexpected),
        unexpected_examples=tuple(list(unexpected)[:EXAMPLES_MAX]), duplicates=duplicates,
        redeliveries=redeliveries, recovered=len((by_result["info"] - acked) & ever_delivered),
        failed_delivered=len((by_result["fail"] - acked) & ever_delivered), orphan_completions=orphans)


@dataclass(frozen=True, slots=True)
class OrderResult:
    checked: int  # first deliveries on ordered subscriptions
    nonmonotonic: int
    examples: tuple[tuple[str, str, str, int, int], ...]  # (subscription, producer, topic, before, after)

    @property
    def valid(self) -> bool:
        return self.nonmonotonic == 0


def check_order(ops: Sequence[Op]) -> OrderResult:
    """First deliveries per (Exclusive or Failover subscription, producer, partition
    topic) in send order; each first delivery whose seq is below the highest seen
    before it is one finding."""
    first_seen: dict[str, set[Message]] = defaultdict(set)
    highest: dict[tuple[str, str, str], int] = {}
    checked = 0
    findings: list[tuple[str, str, str, int, int]] = []
    count = 0
    for op in ops:
        if op.type != "ok" or op.f != "deliver" or str(op.value.get("sub_type", "")).lower() not in ORDERED_SUB_TYPES:
            continue
        message = _message_of(op.value)
        if message is None:
            continue
        sub = str(op.value["subscription"])
        if message in first_seen[sub]:
            continue
        first_seen[sub].add(message)
        checked += 1
        stream = (sub, message[0], str(op.value.get("topic", "")))
        before = highest.get(stream)
        if before is not None and message[1] < before:
            count += 1
            if len(findings) < EXAMPLES_MAX:
                findings.append((*stream, before, message[1]))
        else:
            highest[stream] = message[1]
    return OrderResult(checked=checked, nonmonotonic=count, examples=tuple(findings))


@dataclass(frozen=True, slots=True)
class OffsetResult:
    topics: int
    offsets: int
    inconsistent: int  # offsets that name two or more messages
    acked_reused: int  # of those, offsets an acknowledgement had given to a message
    inconsistent_examples: tuple[tuple[str, int, tuple[Message, ...]], ...]
    gaps_explained: int  # warnings: a failed/unknown send or a fault between
    gaps_unexplained: int  # errors
    gap_examples: tuple[tuple[str, int, int, bool], ...]  # (topic, first missing, last missing, explained)

    @property
    def valid(self) -> bool:
        return self.inconsistent == 0 and self.gaps_unexplained == 0


def check_offsets(ops: Sequence[Op], faults: Sequence[Fault] = ()) -> OffsetResult:
    """The offset checker (module docstring), over reliable topics only."""
    outcomes, _ = send_outcomes(ops)
    reliable_topics = {o.topic for o in outcomes if o.reliable}
    names: dict[tuple[str, int], set[Message]] = defaultdict(set)
    acked_at: dict[str, dict[int, SendOutcome]] = defaultdict(dict)
    for o in outcomes:
        if o.result == "ok" and o.reliable and o.offset is not None:
            topic = o.partition_topic or o.topic
            names[(topic, o.offset)].add(o.message)
            acked_at[topic][o.offset] = o
    for op in ops:
        if op.type == "ok" and op.f == "deliver" and op.value.get("offset") is not None:
            topic = str(op.value.get("topic", ""))
            if not (topic in reliable_topics or topic in acked_at or _base_topic(topic) in reliable_topics):
                continue
            message = _message_of(op.value) or ("<unreadable>", -1)
            names[(topic, int(op.value["offset"]))].add(message)
    inconsistent = [(topic, offset, tuple(sorted(ms))) for (topic, offset), ms in sorted(names.items())
                    if len(ms) > 1]
    acked_reused = sum(1 for topic, offset, _ in inconsistent if offset in acked_at.get(topic, {}))

    # Windows in which a gap has an excuse: unknown or failed sends, and faults.
    excuses = sorted([(o.invoke_ns, o.complete_ns if o.complete_ns is not None else _END)
                      for o in outcomes if o.result != "ok"] + [(f.start_ns, f.heal_ns) for f in faults])
    seen: dict[str, set[int]] = defaultdict(set)
    for topic, offset in names:
        seen[topic].add(offset)
    gaps: list[tuple[str, int, int, bool]] = []
    for topic, acked in sorted(acked_at.items()):
        present = seen[topic]
        ordered_seen = sorted(present)
        for low, high in itertools.pairwise(sorted(acked)):
            # A skipped reservation can be millions of offsets wide: count, never list.
            inside = bisect.bisect_left(ordered_seen, high) - bisect.bisect_right(ordered_seen, low)
            if inside == high - low - 1:
                continue
            first, last = low + 1, high - 1
            while first in present:
                first += 1
            while last in present:
                last -= 1
            start = acked[low].invoke_ns
            end = acked[high].complete_ns if acked[high].complete_ns is not None else _END
            explained = any(s <= end and e >= start for s, e in excuses)
            gaps.append((topic, first, last, explained))
    explained = sum(1 for g in gaps if g[3])
    return OffsetResult(
        topics=len(seen), offsets=len(names), inconsistent=len(inconsistent), acked_reused=acked_reused,
        inconsistent_examples=tuple(inconsistent[:EXAMPLES_MAX]), gaps_explained=explained,
        gaps_unexplained=len(gaps) - explained, gap_examples=tuple(gaps[:EXAMPLES_MAX]))


_END = 2**63


def _base_topic(topic: str) -> str:
    base, sep, index = topic.rpartition("-part-")
    return base if sep and index.isdigit() else topic


# What counts as an acknowledged write for availability: a send, or a metadata write.
WRITE_FS = ("send", "put", "cas", "delete")


@dataclass(frozen=True, slots=True)
class AvailabilityResult:
    """Per fault (in the order given): nanoseconds from its heal to the first
    acknowledged write (a send's receipt, or a metadata put/cas/delete answered) and to
    the first delivery after it (None: none came)."""

    faults: tuple[str, ...]
    ack_after_heal_ns: tuple[int | None, ...]
    delivery_after_heal_ns: tuple[int | None, ...]

    @property
    def recovered(self) -> bool:
        return None not in self.ack_after_heal_ns


def check_availability(ops: Sequence[Op], faults: Sequence[Fault]) -> AvailabilityResult:
    acks = sorted(op.time_ns for op in ops if op.f in WRITE_FS and op.type == "ok")
    deliveries = sorted(op.time_ns for op in ops if op.f == "deliver" and op.type == "ok")
    return AvailabilityResult(
        faults=tuple(f.name for f in faults),
        ack_after_heal_ns=tuple(_first_after(acks, f.heal_ns) for f in faults),
        delivery_after_heal_ns=tuple(_first_after(deliveries, f.heal_ns) for f in faults))


def _first_after(times: list[int], t: int) -> int | None:
    i = bisect.bisect_left(times, t)
    return times[i] - t if i < len(times) else None


@dataclass(frozen=True, slots=True)
class RaftResult:
    terms: int
    split_terms: tuple[tuple[int, tuple[int, ...]], ...]  # (term, its leaders) where more than one
    linearizable: bool | None  # None: no metadata ops, or the search bound was hit
    explanation: str

    @property
    def valid(self) -> bool:
        return not self.split_terms and self.linearizable is not False


def check_leaders(observations: Iterable[tuple[int, int, str]]) -> tuple[int, tuple[tuple[int, tuple[int, ...]], ...]]:
    """Election Safety from (node, term, role) observations: the terms seen, and each
    term in which more than one node was seen as leader."""
    leaders: dict[int, set[int]] = defaultdict(set)
    terms: set[int] = set()
    for node, term, role in observations:
        terms.add(term)
        if str(role).lower() == "leader":
            leaders[term].add(node)
    split = tuple((term, tuple(sorted(nodes))) for term, nodes in sorted(leaders.items()) if len(nodes) > 1)
    return len(terms), split


def leader_observations(ops: Iterable[Op]) -> list[tuple[int, int, str]]:
    """(node, term, role) from the `status` records of an observer process
    (tests/chaos/harness/workload.py observe)."""
    return [(int(op.value["node"]), int(op.value["term"]), str(op.value["role"]))
            for op in ops if op.f == "status" and op.type == "ok"]


METADATA_FS = ("put", "get", "cas", "delete")


def metadata_operations(ops: Sequence[Op]) -> list[Operation]:
    """The metadata-op history as consensus/linearizability.py's operations: each
    admin process makes one call at a time, so an invocation's completion is the
    process's next record. `ok` gives the result; `info`, or no completion, an unknown
    outcome; `fail` (certainly not applied) is left out. Values are text, compared as
    their UTF-8 bytes."""
    clients = {name: i for i, name in enumerate(sorted({op.process for op in ops if op.f in METADATA_FS}))}
    pending: dict[str, Op] = {}
    out: list[Operation] = []

    def build(invoke: Op, done: Op | None) -> Operation | None:
        if done is not None and done.type == "fail":
            return None
        v = invoke.value
        known = done is not None and done.type == "ok"
        result: object = None
        if known and invoke.f == "get":
            result = _bytes(done.value.get("result"))
        elif known and invoke.f == "cas":
            result = bool(done.value.get("result"))
        return Operation(client=clients[invoke.process], op=invoke.f, key=str(v["key"]), value=_bytes(v.get("value")),
                         expected=_bytes(v.get("expected")), result=result, invoke=invoke.time_ns,
                         complete=done.time_ns if known else None)

    for op in ops:
        if op.f not in METADATA_FS:
            continue
        if op.type == "invoke":
            earlier = pending.pop(op.process, None)
            if earlier is not None:
                built = build(earlier, None)
                if built is not None:
                    out.append(built)
            pending[op.process] = op
        elif op.process in pending:
            built = build(pending.pop(op.process), op)
            if built is not None:
                out.append(built)
    for invoke in pending.values():
        built = build(invoke, None)
        if built is not None:
            out.append(built)
    return out


def _bytes(value: Any) -> bytes | None:
    return None if value is None else str(value).encode("utf-8")


def check_raft(ops: Sequence[Op], observations: Iterable[tuple[int, int, str]] = (), *,
               states_max: int = 1_000_000) -> RaftResult:
    terms, split = check_leaders(observations)
    history = metadata_operations(ops)
    if not history:
        return RaftResult(terms=terms, split_terms=split, linearizable=None, explanation="no metadata operations")
    result: CheckResult = check(history, states_max=states_max)
    return RaftResult(terms=terms, split_terms=split, linearizable=result.ok, explanation=result.explanation)


@dataclass(frozen=True, slots=True)
class Report:
    """All counts of one run, or of several merged (`merge`): what docs/reliability.md
    reports per scenario. Recovery samples are kept whole so merged percentiles are
    exact."""

    scenario: str
    runs: int = 1
    faults: int = 0
    attempted: int = 0
    acked: int = 0
    failed: int = 0
    info: int = 0
    deliveries: int = 0
    lost: int = 0
    unexpected: int = 0
    duplicates: int = 0
    redeliveries: int = 0
    recovered: int = 0
    failed_delivered: int = 0
    nonmonotonic: int = 0
    inconsistent_offsets: int = 0
    acked_offsets_reused: int = 0
    offset_gaps_explained: int = 0
    offset_gaps_unexplained: int = 0
    orphan_completions: int = 0
    split_terms: int = 0
    not_linearizable: int = 0
    never_recovered: int = 0  # faults after whose heal no send was acknowledged
    # A scenario's own pass criteria that failed (B1/B2's recovery time and duplicate
    # bound, B6's loss window, R3's Raft logs, R5's configuration), each named in `findings`.
    criteria_failed: int = 0
    recovery_ack_ms: tuple[float, ...] = ()
    recovery_delivery_ms: tuple[float, ...] = ()
    findings: tuple[str, ...] = field(default=(), compare=False)

    @property
    def valid(self) -> bool:
        return not (self.lost or self.unexpected or self.nonmonotonic or self.inconsistent_offsets
                    or self.offset_gaps_unexplained or self.orphan_completions or self.split_terms
                    or self.not_linearizable or self.never_recovered or self.criteria_failed)

    def merge(self, other: Report) -> Report:
        counts = {name: getattr(self, name) + getattr(other, name) for name in _SUMMED}
        return Report(scenario=self.scenario, **counts, recovery_ack_ms=self.recovery_ack_ms + other.recovery_ack_ms,
                      recovery_delivery_ms=self.recovery_delivery_ms + other.recovery_delivery_ms,
                      findings=(self.findings + other.findings)[:EXAMPLES_MAX])

    HEADER = ("| scenario | runs | faults | acknowledged | lost | duplicates | unexpected | out of order "
              "| offset faults | recovery to ack p50 / max (ms) | to delivery p50 / max (ms) |\n"
              "|---|---|---|---|---|---|---|---|---|---|---|")

    def row(self) -> str:
        """One row under `Report.HEADER`."""
        return (f"| {self.scenario} | {self.runs} | {self.faults} | {self.acked:,} | {self.lost} | "
                f"{self.duplicates:,} | {self.unexpected} | {self.nonmonotonic} | "
                f"{self.inconsistent_offsets + self.offset_gaps_unexplained} | "
                f"{_p50_max(self.recovery_ack_ms)} | {_p50_max(self.recovery_delivery_ms)} |")


_SUMMED = ("runs", "faults", "attempted", "acked", "failed", "info", "deliveries", "lost", "unexpected",
           "duplicates", "redeliveries", "recovered", "failed_delivered", "nonmonotonic", "inconsistent_offsets",
           "acked_offsets_reused", "offset_gaps_explained", "offset_gaps_unexplained", "orphan_completions",
           "split_terms", "not_linearizable", "never_recovered", "criteria_failed")


def _p50_max(values: Sequence[float]) -> str:
    if not values:
        return "-"
    ordered = sorted(values)
    return f"{ordered[len(ordered) // 2]:,.0f} / {ordered[-1]:,.0f}"


def check_run(scenario: str, ops: Sequence[Op], faults: Sequence[Fault] = (), *,
              observations: Iterable[tuple[int, int, str]] = (), check_linearizable: bool = True) -> Report:
    """Every checker over one run's history; the findings name what failed. Leader
    observations are the history's `status` records plus `observations`; the metadata
    operations, if any, are checked for linearizability unless told not to."""
    leaders = [*leader_observations(ops), *observations]
    queue = check_queue(ops)
    order = check_order(ops)
    offsets = check_offsets(ops, faults)
    availability = check_availability(ops, faults)
    raft = check_raft(ops, leaders) if check_linearizable else \
        RaftResult(*check_leaders(leaders), linearizable=None, explanation="not checked")
    findings: list[str] = []
    if queue.lost:
        findings.append(f"{queue.lost} acknowledged messages lost, e.g. {list(queue.lost_examples[:5])}")
    if queue.unexpected:
        findings.append(f"{queue.unexpected} unexpected messages, e.g. {list(queue.unexpected_examples[:5])}")
    if order.nonmonotonic:
        findings.append(f"{order.nonmonotonic} first deliveries out of order, e.g. {list(order.examples[:5])}")
    if offsets.inconsistent:
        findings.append(f"{offsets.inconsistent} offsets name two messages, e.g. "
                        f"{list(offsets.inconsistent_examples[:5])}")
    if offsets.gaps_unexplained:
        findings.append(f"{offsets.gaps_unexplained} offset gaps with no failed send or fault around them, e.g. "
                        f"{[g for g in offsets.gap_examples if not g[3]][:5]}")
    if queue.orphan_completions:
        findings.append(f"{queue.orphan_completions} send completions without an invocation (recorder bug)")
    if raft.split_terms:
        findings.append(f"two leaders in one term: {list(raft.split_terms[:5])}")
    if raft.linearizable is False:
        findings.append(raft.explanation)
    never = sum(1 for t in availability.ack_after_heal_ns if t is None)
    if never:
        findings.append(f"{never} faults never followed by an acknowledged send")
    return Report(
        scenario=scenario, faults=len(faults), attempted=queue.attempted, acked=queue.acked, failed=queue.failed,
        info=queue.info, deliveries=queue.deliveries, lost=queue.lost, unexpected=queue.unexpected,
        duplicates=queue.duplicates, redeliveries=queue.redeliveries, recovered=queue.recovered,
        failed_delivered=queue.failed_delivered, nonmonotonic=order.nonmonotonic,
        inconsistent_offsets=offsets.inconsistent, acked_offsets_reused=offsets.acked_reused,
        offset_gaps_explained=offsets.gaps_explained, offset_gaps_unexplained=offsets.gaps_unexplained,
        orphan_completions=queue.orphan_completions, split_terms=len(raft.split_terms),
        not_linearizable=int(raft.linearizable is False), never_recovered=never,
        recovery_ack_ms=tuple(t / 1e6 for t in availability.ack_after_heal_ns if t is not None),
        recovery_delivery_ms=tuple(t / 1e6 for t in availability.delivery_after_heal_ns if t is not None),
        findings=tuple(findings))

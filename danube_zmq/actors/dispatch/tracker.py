"""Delivery tracker: the pure core of a reliable subscription's at-least-once bookkeeping.

The subscription actor (the shell) reads messages from the topic's log, sends
them to consumers and receives their acks and nacks; this core only keeps
count, in topic offsets (STYLE 5). No I/O, no clock (every time is a `now_ms`
argument from the actor's monotonic clock), no randomness.

Every offset in `cursor+1 .. read_offset-1` is in exactly one state; offsets
<= `cursor` are settled and offsets >= `read_offset` were never delivered:

    acked         <= cursor, or in `acked_above` (acked out of order; Shared and
                  Key-Shared consumers ack in any order). Skipped offsets
                  (`skip`, the Drop poison policy, a dead letter republished)
                  count as acked: Danube's "acked-or-skipped".
    in flight     sent to one consumer: attempt number and ack deadline.
    waiting       in the redelivery queue with a ready time and the number of
                  deliveries already made; 0 for a hole never delivered yet.
    handed out    returned by `due`, between `due` and `delivered`/`requeue`.
    dead letter   poisoned; waits for the actor to republish it (`dead_lettered`).
    blocked       poisoned under the Block policy; stays unacked.

Paths (Danube's ReadyToSend -> AwaitingAck -> WaitingToRetry / RetryExhausted):

    1. new:       log[read_offset..] --delivered--> in flight
    2. ack:       in flight | waiting --ack--> acked; the cursor moves over every
                  gap closed
    3. failure:   in flight --nack | expire | consumer_gone--> waiting, or
                  poisoned when its deliveries exceed 1 + max_redelivery_count
    4. retry:     waiting --due (ready_at <= now)--> handed out
                  --delivered--> in flight, or --requeue--> waiting
    5. poison:    drop -> acked; dead_letter -> dead letter --dead_lettered--> acked;
                  block -> blocked: `due` returns nothing and
                  `may_deliver_new()` is False, so the subscription halts at that
                  offset as Danube's Block does (Key-Shared blocking one key only is
                  out of scope).

A message may be delivered at most `1 + max_redelivery_count` times; the
consumer sees `redelivery_count = attempt - 1`. Failure by disconnection
(`consumer_gone`) counts as a failed attempt like a nack or an ack timeout.

Bound (STYLE 8): `acked_above_max` bounds the span `read_offset - cursor - 1`,
which bounds both `acked_above` (what `snapshot` persists) and the holes. When
the span is full, `new_allowance()` is 0 and the actor must stop reading new
messages until the cursor moves: backpressure, not an error (Pulsar stops
dispatch on too many unacked "holes" the same way).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import repeat
from typing import NamedTuple

from danube_zmq.transport.errors import InvalidArgument

__all__ = [
    "BACKOFFS",
    "POISON_POLICIES",
    "CursorState",
    "DeliveryTracker",
    "FailurePolicy",
    "Poisoned",
    "Redelivery",
    "TrackerStatistics",
]

BACKOFFS = ("fixed", "exponential")
POISON_POLICIES = ("block", "drop", "dead_letter")

# Ready time of the holes found when a tracker is built from a persisted cursor:
# they were delivered before the restart (or before the topic moved) and may go
# again at once, but no `now_ms` exists yet. Any real clock reading is above it.
READY_AT_START_MS = -(2**62)

# 2**62 ms is beyond any sane `max_redelivery_delay_ms`, so a larger exponent
# changes nothing but would build a huge integer for a large attempt number.
_EXPONENT_MAX = 62


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True, slots=True, kw_only=True)
class FailurePolicy:
    """What a reliable subscription does when a delivery is not acknowledged.

    Danube's `SubscriptionFailurePolicy`, field by field, with its defaults.
    """

    # A message is delivered at most 1 + max_redelivery_count times; then the
    # poison policy applies.
    max_redelivery_count: int = 5
    # An unacked delivery fails this long after it was sent.
    ack_timeout_ms: int = 30_000
    # Delay before the first redelivery ("fixed": before every redelivery).
    base_redelivery_delay_ms: int = 1_000
    # Cap on any redelivery delay, including one a consumer asks for in a nack.
    max_redelivery_delay_ms: int = 60_000
    # "fixed": base every time; "exponential": base * 2**(attempt - 1).
    backoff: str = "exponential"
    # "block": halt the subscription at the message; "drop": skip it;
    # "dead_letter": republish it to `dead_letter_topic`, then skip it.
    poison_policy: str = "block"
    # Required (non-empty) by poison_policy "dead_letter".
    dead_letter_topic: str | None = None

    def __post_init__(self) -> None:
        """Check the policy; it comes from configuration or an admin request."""
        counts = {
            "max_redelivery_count": (self.max_redelivery_count, 0),
            "ack_timeout_ms": (self.ack_timeout_ms, 1),
            "base_redelivery_delay_ms": (self.base_redelivery_delay_ms, 0),
            "max_redelivery_delay_ms": (self.max_redelivery_delay_ms, 0),
        }
        for name, (value, minimum) in counts.items():
            if not _is_int(value) or value < minimum:
                raise InvalidArgument(f"{name} must be an integer >= {minimum}, not {value!r}")
        if self.max_redelivery_delay_ms < self.base_redelivery_delay_ms:
            raise InvalidArgument(
                f"max_redelivery_delay_ms ({self.max_redelivery_delay_ms}) must be >= "
                f"base_redelivery_delay_ms ({self.base_redelivery_delay_ms})"
            )
        if self.backoff not in BACKOFFS:
            raise InvalidArgument(f"backoff must be one of {', '.join(BACKOFFS)}, not {self.backoff!r}")
        if self.poison_policy not in POISON_POLICIES:
            raise InvalidArgument(f"poison_policy must be one of {', '.join(POISON_POLICIES)}, not {self.poison_policy!r}")
        if self.dead_letter_topic is not None and not isinstance(self.dead_letter_topic, str):
            raise InvalidArgument(f"dead_letter_topic must be a string, not {self.dead_letter_topic!r}")
        if self.poison_policy == "dead_letter" and not self.dead_letter_topic:
            raise InvalidArgument("dead_letter_topic is required by poison_policy dead_letter")

    def redelivery_delay_ms(self, failed_attempt: int, requested_delay_ms: int | None = None) -> int:
        """Delay before redelivering a message whose attempt number `failed_attempt` failed.

        max(policy delay, requested delay), capped at `max_redelivery_delay_ms`;
        the policy delay for attempt 1 is the base in both backoffs. A negative
        requested delay counts as none.
        """
        assert failed_attempt >= 1, failed_attempt
        base = self.base_redelivery_delay_ms
        if self.backoff == "fixed":
            policy_delay_ms = base
        else:
            policy_delay_ms = base << min(failed_attempt - 1, _EXPONENT_MAX)
        delay_ms = max(policy_delay_ms, requested_delay_ms or 0)
        return min(delay_ms, self.max_redelivery_delay_ms)


@dataclass(frozen=True, slots=True)
class Redelivery:
    """An offset `due` to be sent again (or, with count 0, a hole never sent)."""

    offset: int
    # What the consumer sees: deliveries already made.
    redelivery_count: int


@dataclass(frozen=True, slots=True)
class Poisoned:
    """An offset whose deliveries are exhausted, reported once by `poisoned`."""

    offset: int
    # Deliveries made, all failed: 1 + max_redelivery_count.
    attempts: int
    # The policy applied: "drop", "dead_letter" or "block".
    action: str


@dataclass(frozen=True, slots=True)
class CursorState:
    """What a subscription persists: enough to rebuild the tracker after a restart."""

    cursor: int
    # Ascending, every entry > cursor + 1.
    acked_above: tuple[int, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class TrackerStatistics:
    """A snapshot of one tracker's counts (STYLE 15)."""

    cursor: int
    read_offset: int
    # Deliveries awaiting an ack, over all consumers.
    in_flight: int
    # Entries in the redelivery queue (holes never delivered included).
    waiting_redelivery: int
    acked_above: int
    # Since creation: deliveries that were not the first of their offset.
    redeliveries_total: int
    # Since creation: offsets whose deliveries were exhausted.
    poisoned_total: int
    blocked_offset: int | None


# Named tuples built per offset go through `tuple.__new__`: their generated `__new__`
# is Python code, several times slower.
_new = tuple.__new__


def _next_run(offsets: Sequence[int], first: int) -> bool:
    """`offsets` are `first`, `first + 1`, ... in order (compared in C, not per item in Python)."""
    count = len(offsets)
    if not count or offsets[0] != first or offsets[-1] != first + count - 1:
        return False
    return list(offsets) == list(range(first, first + count))


class _InFlight(NamedTuple):
    attempt: int  # 1 for the first delivery
    deadline_ms: int


class _Waiting(NamedTuple):
    attempts: int  # deliveries already made; 0 for a hole never delivered
    ready_at_ms: int


class DeliveryTracker:
    """What one reliable subscription has delivered and what has been acknowledged."""

    __slots__ = (
        "_acked_above",
        "_acked_above_max",
        "_blocked",
        "_cursor",
        "_dead_letter",
        "_handed_out",
        "_in_flight",
        "_last_now_ms",
        "_poisoned_total",
        "_read_offset",
        "_redeliveries_total",
        "_unreported",
        "_waiting",
        "policy",
    )

    def __init__(
        self,
        *,
        cursor: int,
        acked_above: Iterable[int] = (),
        read_offset: int | None = None,
        policy: FailurePolicy,
        acked_above_max: int = 100_000,
    ) -> None:
        """Resume from a persisted cursor, or start a new subscription at `read_offset`.

        Resuming (`read_offset` None): delivery resumes at the cursor. Offsets
        between the cursor and the highest of `acked_above` that are not in it
        were delivered before and never acked; they wait for redelivery, ready
        at once, with redelivery_count 0 (the count is not persisted, as in
        Danube). Entries of `acked_above` at or below the cursor are ignored.

        New subscription (`read_offset` given, the caller's latest/earliest/offset
        choice): everything before `read_offset` counts as consumed, so the
        cursor starts at `read_offset - 1`; `cursor` must not be past that and
        `acked_above` must be empty.
        """
        assert cursor >= -1, cursor
        assert acked_above_max >= 1, acked_above_max
        self.policy = policy
        self._acked_above_max = acked_above_max
        self._cursor = cursor
        self._acked_above: set[int] = set()
        # consumer_id -> offset -> delivery; no empty inner dicts.
        self._in_flight: dict[int, dict[int, _InFlight]] = {}
        self._waiting: dict[int, _Waiting] = {}
        # Offset -> deliveries already made, for offsets `due` returned.
        self._handed_out: dict[int, int] = {}
        # Offset -> deliveries made, for poisoned offsets not yet settled.
        self._dead_letter: dict[int, int] = {}
        self._blocked: dict[int, int] = {}
        self._unreported: list[Poisoned] = []
        self._redeliveries_total = 0
        self._poisoned_total = 0
        self._last_now_ms: int | None = None
        if read_offset is not None:
            above = tuple(acked_above)
            assert not above, above
            assert read_offset >= 0 and cursor < read_offset, (cursor, read_offset)
            self._cursor = read_offset - 1
            self._read_offset = read_offset
            return
        self._read_offset = cursor + 1
        for offset in sorted(set(acked_above)):
            if offset <= self._cursor:
                continue
            self._take_new(offset, READY_AT_START_MS, check_bound=False)
            self._mark_acked(offset)

    # -- reading --------------------------------------------------------------

    @property
    def cursor(self) -> int:
        """Highest offset such that it and every offset below are acked or skipped; -1 when none."""
        return self._cursor

    @property
    def read_offset(self) -> int:
        """Next offset never delivered: new deliveries come from the log starting here."""
        return self._read_offset

    @property
    def acked_above_count(self) -> int:
        return len(self._acked_above)

    def settled(self) -> bool:
        """Nothing in flight and nothing waiting for (re)delivery: no deadline to watch."""
        return not self._in_flight and not self._waiting

    @property
    def acked_above(self) -> frozenset[int]:
        """Offsets above the cursor acked out of order."""
        return frozenset(self._acked_above)

    @property
    def blocked_offset(self) -> int | None:
        """Lowest offset halted by the Block poison policy, or None."""
        return min(self._blocked) if self._blocked else None

    def is_acked(self, offset: int) -> bool:
        """Whether `offset` is settled (acked, skipped, dropped or dead-lettered): O(1)."""
        return offset <= self._cursor or offset in self._acked_above

    def in_flight_count(self, consumer_id: int) -> int:
        """Deliveries to `consumer_id` awaiting an ack; the caller bounds it by its window."""
        return len(self._in_flight.get(consumer_id, ()))

    def new_allowance(self) -> int:
        """How many new offsets (from `read_offset` on) may be delivered now.

        0 while blocked, or while the span `read_offset - cursor - 1` is at
        `acked_above_max`. The actor caps its next read from the log by this, on
        top of the consumers' windows.
        """
        if self._blocked:
            return 0
        return max(0, self._acked_above_max - (self._read_offset - self._cursor - 1))

    def may_deliver_new(self) -> bool:
        """False while blocked (Danube halts the subscription at the blocked offset) or the span is full."""
        return self.new_allowance() > 0

    def next_deadline_ms(self) -> int | None:
        """Earliest ack deadline or redelivery ready time, so the actor knows when to wake.

        It may already be past: an entry ready but not sent (no permits) keeps
        it there, so the actor should also wait for permits rather than spin.
        Ready times are left out while blocked: nothing will be redelivered.
        O(tracked offsets); the actor calls it once per handled message at most.
        """
        deadlines = [entry.deadline_ms for flight in self._in_flight.values() for entry in flight.values()]
        if not self._blocked:
            deadlines += [entry.ready_at_ms for entry in self._waiting.values()]
        return min(deadlines, default=None)

    def backlog(self, next_offset_of_topic: int) -> int:
        """Messages of the topic not yet acked or skipped by this subscription."""
        assert next_offset_of_topic >= 0, next_offset_of_topic
        # Below 0 only for a subscription started past the topic's head.
        return max(0, next_offset_of_topic - 1 - self._cursor - len(self._acked_above))

    def snapshot(self) -> CursorState:
        """What to persist; `acked_above` holds at most `acked_above_max` entries."""
        assert len(self._acked_above) <= self._acked_above_max, len(self._acked_above)
        return CursorState(cursor=self._cursor, acked_above=tuple(sorted(self._acked_above)))

    def statistics(self) -> TrackerStatistics:
        """Counts for metrics and `admin ... describe`."""
        return TrackerStatistics(
            cursor=self._cursor,
            read_offset=self._read_offset,
            in_flight=sum(len(flight) for flight in self._in_flight.values()),
            waiting_redelivery=len(self._waiting),
            acked_above=len(self._acked_above),
            redeliveries_total=self._redeliveries_total,
            poisoned_total=self._poisoned_total,
            blocked_offset=self.blocked_offset,
        )

    # -- events ---------------------------------------------------------------

    def delivered(self, consumer_id: int, offsets: Sequence[int], now_ms: int) -> None:
        """Record that the actor sent `offsets` to `consumer_id` at `now_ms`.

        Each offset is one of: an offset `due` returned (a redelivery, or a hole
        sent for the first time); a hole below `read_offset` never delivered
        (redelivery_count 0 in the waiting queue); or a new offset >=
        `read_offset`, which moves `read_offset` past it. New offsets skipped
        over become holes waiting for delivery, ready now: a batch may be split
        across consumers and sent in any order, and nothing is lost if the
        actor keeps some of it back (Key-Shared leftovers). Use `skip` for
        offsets that nobody will ever take.

        Each delivery is in flight until its ack, with deadline now +
        ack_timeout_ms. The caller keeps within its window
        (`in_flight_count`) and `new_allowance`.
        """
        self._tick(now_ms)
        deadline_ms = now_ms + self.policy.ack_timeout_ms
        flight = self._in_flight.setdefault(consumer_id, {})
        if _next_run(offsets, self._read_offset):
            # First deliveries of the next offsets in a row, the steady state: none of
            # them is tracked yet (everything tracked lies below read_offset), so the
            # loop below would only add them in flight and move read_offset.
            assert not self._blocked, (offsets[0], self._blocked)
            assert offsets[-1] - self._cursor <= self._acked_above_max, (offsets[-1], self._cursor)
            flight.update(zip(offsets, repeat(_new(_InFlight, (1, deadline_ms)))))
            self._read_offset = offsets[-1] + 1
            return
        for offset in offsets:
            attempts = self._handed_out.pop(offset, None)
            if attempts is None:
                # Not a redelivery: a first delivery, which Block forbids.
                assert not self._blocked, (offset, self._blocked)
                waiting = self._waiting.get(offset)
                if waiting is not None and waiting.attempts == 0:
                    del self._waiting[offset]
                else:
                    self._take_new(offset, now_ms)
                attempts = 0
            elif attempts > 0:
                self._redeliveries_total += 1
            assert offset not in flight, (consumer_id, offset)
            assert attempts <= self.policy.max_redelivery_count, (offset, attempts)
            flight[offset] = _new(_InFlight, (attempts + 1, deadline_ms))
        if not flight:
            del self._in_flight[consumer_id]

    def skip(self, offsets: Iterable[int], now_ms: int) -> int:
        """Settle offsets that no consumer will ever take (Key-Shared: no filter matches); returns the cursor.

        Each offset is a hole never delivered or a new offset (>= read_offset,
        which moves past it). Skipped offsets count as acked.
        """
        self._tick(now_ms)
        for offset in offsets:
            waiting = self._waiting.get(offset)
            if waiting is not None and waiting.attempts == 0:
                del self._waiting[offset]
            else:
                self._take_new(offset, now_ms)
            self._mark_acked(offset)
        return self._cursor

    def skip_gap(self, start: int, end: int, now_ms: int) -> bool:
        """Settle offsets `start`..`end - 1`, which the log never held (a dead broker
        reserved them), starting at `read_offset`. At once when everything below is
        settled; one by one when the span stays within the bound; otherwise False (try
        again once more is acknowledged)."""
        assert start == self._read_offset and end > start, (start, end, self._read_offset)
        self._tick(now_ms)
        if self._cursor == start - 1:
            self._cursor = end - 1
            self._read_offset = end
            return True
        if end - 1 - self._cursor > self._acked_above_max:
            return False
        self.skip(range(start, end), now_ms)
        return True

    def forget(self, start: int, end: int, now_ms: int) -> int:
        """Settle the offsets of `start`..`end - 1` below `read_offset` that the log no
        longer holds (retention deleted them, or a new owner's log starts past them),
        whatever each one's state: waiting holes (a resumed subscription's unacked offsets
        among them) and deliveries in flight (a late ack is ignored); acked ones stay
        acked. Returns how many were settled without an ack. What lies at or past
        `read_offset` was never delivered: the caller settles it with `skip_gap`, which
        keeps within the bound."""
        self._tick(now_ms)
        settled = 0
        for consumer_id in list(self._in_flight):
            flight = self._in_flight[consumer_id]
            for offset in [o for o in flight if start <= o < end]:
                del flight[offset]
                self._mark_acked(offset)
                settled += 1
            if not flight:
                del self._in_flight[consumer_id]
        for offset in range(max(start, self._cursor + 1), min(end, self._read_offset)):
            if self._waiting.pop(offset, None) is not None:
                self._mark_acked(offset)
                settled += 1
        assert not any(start <= o < end for o in self._handed_out), "forget between due and delivered/requeue"
        return settled

    def expire_below(self, end: int, now_ms: int) -> int:
        """Acknowledge every offset below `end` (a message TTL ran out for them), whatever
        its state: never delivered, in flight (a late ack is ignored), waiting for
        redelivery, poisoned and held. Returns how many were not acknowledged before."""
        self._tick(now_ms)
        if end - 1 <= self._cursor:
            return 0
        below = [offset for offset in self._acked_above if offset < end]
        expired = end - 1 - self._cursor - len(below)
        self._acked_above.difference_update(below)
        for consumer_id in list(self._in_flight):
            flight = self._in_flight[consumer_id]
            for offset in [o for o in flight if o < end]:
                del flight[offset]
            if not flight:
                del self._in_flight[consumer_id]
        for held in (self._waiting, self._handed_out, self._dead_letter, self._blocked):
            for offset in [o for o in held if o < end]:
                del held[offset]
        self._unreported = [p for p in self._unreported if p.offset >= end]
        self._cursor = end - 1
        self._read_offset = max(self._read_offset, end)
        while self._cursor + 1 in self._acked_above:
            self._cursor += 1
            self._acked_above.remove(self._cursor)
        return expired

    def ack(self, consumer_id: int, offsets: Iterable[int]) -> int:
        """Acknowledge `offsets` from `consumer_id`; returns the cursor, moved over every gap closed.

        Counted: offsets in flight for this consumer, and offsets in the waiting
        queue (a late ack from a consumer whose delivery timed out or who
        disconnected is as good as any; a hole found on resuming may have been
        delivered before the restart). Ignored, since duplicate and late acks
        are harmless: offsets already acked, in flight for another consumer,
        never delivered, handed out by `due`, or poisoned (a poisoning is final).
        """
        flight = self._in_flight.get(consumer_id)
        if flight is not None and isinstance(offsets, Sequence) and _next_run(offsets, self._cursor + 1) \
                and all(map(flight.__contains__, offsets)):
            # The next offsets in a row, all in flight here, the steady state: acking them
            # one by one would move the cursor over each in turn.
            for offset in offsets:
                del flight[offset]
            if not flight:
                del self._in_flight[consumer_id]
            self._cursor = offsets[-1]
            while self._cursor + 1 in self._acked_above:
                self._cursor += 1
                self._acked_above.remove(self._cursor)
            return self._cursor
        for offset in offsets:
            if flight is not None and offset in flight:
                del flight[offset]
            elif offset in self._waiting:
                del self._waiting[offset]
            else:
                continue
            self._mark_acked(offset)
        if flight is not None and not flight:
            del self._in_flight[consumer_id]
        return self._cursor

    def nack(self, consumer_id: int, offsets: Iterable[int], now_ms: int, delay_ms: int | None = None) -> None:
        """Fail the deliveries of `offsets` to `consumer_id`: redeliver them later, or poison them.

        Ready at now + `FailurePolicy.redelivery_delay_ms` (max of the policy's
        backoff for the attempt that failed and `delay_ms`, capped). A nack for
        an offset not in flight for this consumer is late and ignored (Danube).
        """
        self._tick(now_ms)
        flight = self._in_flight.get(consumer_id)
        if flight is None:
            return
        for offset in offsets:
            entry = flight.pop(offset, None)
            if entry is not None:
                ready_at_ms = now_ms + self.policy.redelivery_delay_ms(entry.attempt, delay_ms)
                self._fail(offset, entry.attempt, ready_at_ms)
        if not flight:
            del self._in_flight[consumer_id]

    def undeliver(self, consumer_id: int, offsets: Iterable[int], now_ms: int) -> None:
        """The deliveries of `offsets` to `consumer_id` never left the broker (the
        gateway refused their frame): as if not made, ready now, attempts unchanged. An
        offset no longer in flight for this consumer is ignored."""
        self._tick(now_ms)
        flight = self._in_flight.get(consumer_id)
        if flight is None:
            return
        for offset in offsets:
            entry = flight.pop(offset, None)
            if entry is not None:
                self._waiting[offset] = _Waiting(entry.attempt - 1, now_ms)
        if not flight:
            del self._in_flight[consumer_id]

    def consumer_gone(self, consumer_id: int, now_ms: int) -> None:
        """Fail every delivery in flight to `consumer_id`; each is ready for redelivery now.

        The deliveries were made and not acked, so each counts as an attempt
        (and may poison its offset). Danube: a reconnecting consumer, or
        another one of a Shared subscription, gets them again.
        """
        self._tick(now_ms)
        flight = self._in_flight.pop(consumer_id, {})
        for offset in sorted(flight):
            self._fail(offset, flight[offset].attempt, now_ms)

    def expire(self, now_ms: int) -> int:
        """Fail every delivery whose ack deadline is <= now, as a nack without delay; returns how many."""
        self._tick(now_ms)
        expired = 0
        for consumer_id in list(self._in_flight):
            flight = self._in_flight[consumer_id]
            for offset in sorted(o for o, entry in flight.items() if entry.deadline_ms <= now_ms):
                entry = flight.pop(offset)
                self._fail(offset, entry.attempt, now_ms + self.policy.redelivery_delay_ms(entry.attempt))
                expired += 1
            if not flight:
                del self._in_flight[consumer_id]
        return expired

    def due(self, now_ms: int, limit: int) -> list[Redelivery]:
        """Take up to `limit` waiting offsets ready at `now_ms`, ascending; none while blocked.

        They leave the queue: the caller passes those it sends to `delivered`
        and gives the rest back with `requeue`, before handling anything else.
        O(waiting * log limit).
        """
        self._tick(now_ms)
        assert limit >= 0, limit
        if self._blocked:
            return []
        ready = heapq.nsmallest(limit, (o for o, entry in self._waiting.items() if entry.ready_at_ms <= now_ms))
        taken = []
        for offset in ready:
            attempts = self._waiting.pop(offset).attempts
            self._handed_out[offset] = attempts
            taken.append(Redelivery(offset, attempts))
        return taken

    def requeue(self, offsets: Iterable[int], now_ms: int) -> None:
        """Give back offsets from `due` that the caller could not send; ready now, attempt counts kept."""
        self._tick(now_ms)
        for offset in offsets:
            attempts = self._handed_out.pop(offset)
            self._waiting[offset] = _Waiting(attempts, now_ms)

    def poisoned(self, now_ms: int) -> list[Poisoned]:
        """Offsets poisoned since the last call, ascending, each reported once.

        Call after `nack`, `expire` and `consumer_gone`. By then the policy has
        already applied: "drop" offsets count as acked, "block" offsets halt the
        subscription; "dead_letter" offsets wait for the caller to republish
        them to `policy.dead_letter_topic` and call `dead_lettered`.
        """
        self._tick(now_ms)
        reported = sorted(self._unreported, key=lambda p: p.offset)
        self._unreported = []
        return reported

    def dead_lettered(self, offset: int) -> int:
        """The caller republished a reported dead letter; it now counts as acked. Returns the cursor."""
        assert offset in self._dead_letter, offset
        assert all(p.offset != offset for p in self._unreported), offset
        del self._dead_letter[offset]
        self._mark_acked(offset)
        return self._cursor

    def set_policy(self, policy: FailurePolicy, now_ms: int) -> None:
        """Apply `policy` from now on (an admin changed the subscription's failure policy).

        Deliveries in flight keep their ack deadlines and waiting redeliveries their
        ready times; the new timeout and backoff apply from the next delivery or
        failure. The redelivery bound applies at once, as if every offset had been
        judged under it from the start:

        - a waiting offset whose deliveries already exceed the new
          `max_redelivery_count` is poisoned now;
        - an offset poisoned under the old policy and not settled yet (blocked, or a
          dead letter not yet republished) is judged again: still exhausted, it meets
          the new poison policy (so block -> drop unblocks the subscription); no
          longer exhausted (the count was raised), it waits for redelivery, ready now;
        - an in-flight attempt number above the new bound is lowered to it, so its
          next failure poisons it.

        Report the resulting poisonings with `poisoned`. Not to be called between
        `due` and `delivered`/`requeue`.
        """
        self._tick(now_ms)
        assert not self._handed_out, self._handed_out
        unsettled = {**self._blocked, **self._dead_letter}
        self._blocked.clear()
        self._dead_letter.clear()
        self._unreported = [p for p in self._unreported if p.offset not in unsettled]
        self.policy = policy
        max_attempts = 1 + policy.max_redelivery_count
        for flight in self._in_flight.values():
            for offset, entry in flight.items():
                if entry.attempt > max_attempts:
                    flight[offset] = entry._replace(attempt=max_attempts)
        for offset in sorted(o for o, entry in self._waiting.items() if entry.attempts >= max_attempts):
            self._fail(offset, self._waiting.pop(offset).attempts, now_ms)
        for offset in sorted(unsettled):
            attempts = unsettled[offset]
            if attempts < max_attempts:
                self._waiting[offset] = _Waiting(attempts, now_ms)
            else:
                self._poisoned_total -= 1  # the same offset, counted when it was first poisoned
                self._fail(offset, attempts, now_ms)

    def seek(self, offset: int) -> None:
        """Restart the subscription at `offset`: everything below it counts as consumed.

        Forgets every delivery, redelivery, poisoning and block; the caller
        closes or resets its consumers, whose later acks are then ignored or
        harmless. Totals in `statistics` are kept.
        """
        assert offset >= 0, offset
        self._cursor = offset - 1
        self._read_offset = offset
        self._acked_above.clear()
        self._in_flight.clear()
        self._waiting.clear()
        self._handed_out.clear()
        self._dead_letter.clear()
        self._blocked.clear()
        self._unreported.clear()

    # -- invariants -----------------------------------------------------------

    def check_invariants(self) -> None:
        """Assert that every offset from cursor+1 to read_offset-1 is in exactly one state.

        O(tracked offsets): for tests and debugging, not for every event.
        """
        assert self._cursor >= -1, self._cursor
        assert self._read_offset > self._cursor, (self._cursor, self._read_offset)
        assert self._cursor + 1 not in self._acked_above, self._cursor
        assert len(self._acked_above) <= self._acked_above_max, len(self._acked_above)
        max_attempts = 1 + self.policy.max_redelivery_count
        claimed: set[int] = set()

        def claim(offsets: Iterable[int]) -> None:
            for offset in offsets:
                assert self._cursor < offset < self._read_offset, (offset, self._cursor, self._read_offset)
                assert offset not in claimed, offset
                claimed.add(offset)

        claim(self._acked_above)
        for flight in self._in_flight.values():
            assert flight, "no empty in-flight maps"
            claim(flight)
            assert all(1 <= entry.attempt <= max_attempts for entry in flight.values()), flight
        claim(self._waiting)
        assert all(0 <= entry.attempts < max_attempts for entry in self._waiting.values()), self._waiting
        claim(self._handed_out)
        claim(self._dead_letter)
        claim(self._blocked)
        assert len(claimed) == self._read_offset - self._cursor - 1, "an offset was lost"
        assert not self._dead_letter or self.policy.poison_policy == "dead_letter", self._dead_letter
        assert not self._blocked or self.policy.poison_policy == "block", self._blocked
        for p in self._unreported:
            assert p.offset in self._dead_letter or p.offset in self._blocked or self._is_acked(p.offset), p

    # -- internals ------------------------------------------------------------

    def _tick(self, now_ms: int) -> None:
        # The actor's clock is monotonic; going back would be our bug.
        assert self._last_now_ms is None or now_ms >= self._last_now_ms, (self._last_now_ms, now_ms)
        self._last_now_ms = now_ms

    def _is_acked(self, offset: int) -> bool:
        return offset <= self._cursor or offset in self._acked_above

    def _take_new(self, offset: int, ready_at_ms: int, *, check_bound: bool = True) -> None:
        """Move `read_offset` past new `offset`; offsets skipped over wait as holes."""
        assert offset >= self._read_offset, (offset, self._read_offset)
        # `new_allowance` keeps the span within the bound (not checked when
        # resuming from a snapshot taken under a larger bound).
        assert not check_bound or offset - self._cursor <= self._acked_above_max, (offset, self._cursor)
        for hole in range(self._read_offset, offset):
            self._waiting[hole] = _Waiting(0, ready_at_ms)
        self._read_offset = offset + 1

    def _mark_acked(self, offset: int) -> None:
        assert self._cursor < offset < self._read_offset, (offset, self._cursor, self._read_offset)
        assert offset not in self._acked_above, offset
        if offset != self._cursor + 1:
            self._acked_above.add(offset)
            return
        self._cursor = offset
        while self._cursor + 1 in self._acked_above:
            self._cursor += 1
            self._acked_above.remove(self._cursor)

    def _fail(self, offset: int, attempts: int, ready_at_ms: int) -> None:
        """A delivery of `offset` failed after `attempts` deliveries: wait for redelivery or poison it."""
        if attempts <= self.policy.max_redelivery_count:
            self._waiting[offset] = _Waiting(attempts, ready_at_ms)
            return
        action = self.policy.poison_policy
        self._poisoned_total += 1
        self._unreported.append(Poisoned(offset, attempts, action))
        if action == "drop":
            self._mark_acked(offset)
        elif action == "dead_letter":
            self._dead_letter[offset] = attempts
        else:
            self._blocked[offset] = attempts

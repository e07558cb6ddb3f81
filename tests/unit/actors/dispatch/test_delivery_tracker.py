"""Behaviour of the pure delivery tracker of reliable subscriptions (cursor, acks, nacks, redelivery, poison)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from danube_zmq.actors.dispatch.tracker import (
    BACKOFFS,
    POISON_POLICIES,
    READY_AT_START_MS,
    CursorState,
    DeliveryTracker,
    FailurePolicy,
    Poisoned,
    Redelivery,
)
from danube_zmq.transport.errors import InvalidArgument

A, B = 1, 2
SECOND = 1_000


def tracker(cursor: int = -1, **policy: object) -> DeliveryTracker:
    return DeliveryTracker(cursor=cursor, policy=FailurePolicy(**policy))  # type: ignore[arg-type]


def fail_until_poisoned(t: DeliveryTracker, offset: int, now: int) -> tuple[int, list[int]]:
    """Nack `offset`, in flight for A, and redeliver it until `due` stops returning it.

    Returns the time reached and the redelivery counts seen.
    """
    t.nack(A, [offset], now)
    counts = []
    while True:
        now += 60 * SECOND
        got = t.due(now, 10)
        if not got:
            return now, counts
        assert [r.offset for r in got] == [offset]
        counts.append(got[0].redelivery_count)
        t.delivered(A, [offset], now)
        t.nack(A, [offset], now)


# -- cursor and acks -----------------------------------------------------------


def test_cursor_is_the_highest_contiguously_acked_offset() -> None:
    """Acks in order move the cursor one by one; it starts at -1 with nothing acked."""
    t = tracker()
    assert t.cursor == -1
    t.delivered(A, [0, 1, 2], 0)
    assert t.ack(A, [0]) == 0
    assert t.ack(A, [1]) == 1
    assert t.ack(A, [2]) == 2
    assert t.acked_above == frozenset()
    assert t.backlog(3) == 0


def test_out_of_order_acks_wait_above_the_cursor_until_the_gap_closes() -> None:
    """Shared consumers ack out of order: acks above a gap are kept, then the cursor jumps over them."""
    t = tracker()
    t.delivered(A, [0, 1], 0)
    t.delivered(B, [2, 3, 4], 0)
    assert t.ack(B, [4, 2]) == -1
    assert t.acked_above == {2, 4}
    assert t.backlog(5) == 3
    assert t.ack(A, [0]) == 0
    assert t.ack(A, [1]) == 2, "closing the gap at 1 passes 2 as well"
    assert t.acked_above == {4}
    assert t.snapshot() == CursorState(cursor=2, acked_above=(4,))
    assert t.ack(B, [3]) == 4
    assert t.acked_above == frozenset()


def test_duplicate_late_and_foreign_acks_are_harmless() -> None:
    """Acks for acked offsets, offsets never sent, or offsets held by another consumer change nothing."""
    t = tracker()
    t.delivered(A, [0, 1], 0)
    t.delivered(B, [2], 0)
    assert t.ack(A, [0, 0]) == 0
    assert t.ack(A, [0, 7, -3]) == 0
    assert t.ack(A, [2]) == 0, "2 is in flight for B, not A"
    assert t.in_flight_count(B) == 1
    assert t.ack(B, [2]) == 0
    assert t.acked_above == {2}
    assert t.in_flight_count(A) == 1
    t.check_invariants()


def test_ack_for_an_offset_waiting_for_redelivery_counts_as_acked() -> None:
    """A consumer that acks after its delivery timed out settles the message; it is not sent again."""
    t = tracker()
    t.delivered(A, [0], 0)
    assert t.expire(30 * SECOND) == 1
    assert t.ack(A, [0]) == 0
    assert t.due(10 * 60 * SECOND, 10) == []
    assert t.next_deadline_ms() is None


def test_late_nack_is_ignored() -> None:
    """A nack for an offset not in flight for that consumer (acked, elsewhere, unknown) does nothing."""
    t = tracker()
    t.delivered(A, [0, 1], 0)
    t.ack(A, [0])
    t.nack(A, [0, 5], 10)
    t.nack(B, [1], 10)
    assert t.in_flight_count(A) == 1
    assert t.statistics().waiting_redelivery == 0


# -- backoff ---------------------------------------------------------------------


def test_exponential_backoff_doubles_from_the_base_and_caps_at_the_maximum() -> None:
    """Each nack of the same message waits 1 s, 2 s, 4 s ... and never more than 60 s."""
    t = tracker(max_redelivery_count=10)
    now = 0
    t.delivered(A, [0], now)
    delays = []
    for redelivery_count in range(1, 10):
        t.nack(A, [0], now)
        ready_at = t.next_deadline_ms()
        assert ready_at is not None
        delays.append(ready_at - now)
        assert t.due(ready_at - 1, 10) == [], "not before its time"
        now = ready_at
        assert t.due(now, 10) == [Redelivery(0, redelivery_count)]
        t.delivered(A, [0], now)
    assert [d // SECOND for d in delays] == [1, 2, 4, 8, 16, 32, 60, 60, 60]


def test_requested_nack_delay_wins_only_when_larger_and_is_capped() -> None:
    """Delay = max(policy delay, requested delay), capped at max_redelivery_delay_ms."""
    policy = FailurePolicy()
    assert policy.redelivery_delay_ms(1, 5 * SECOND) == 5 * SECOND
    assert policy.redelivery_delay_ms(3, 1 * SECOND) == 4 * SECOND
    assert policy.redelivery_delay_ms(1, 10 * 60 * SECOND) == 60 * SECOND
    assert policy.redelivery_delay_ms(1, -5) == 1 * SECOND
    t = tracker()
    t.delivered(A, [0, 1], 0)
    t.nack(A, [0], 0, delay_ms=7 * SECOND)
    t.nack(A, [1], 0, delay_ms=10)
    assert t.due(SECOND, 10) == [Redelivery(1, 1)]
    assert t.due(7 * SECOND - 1, 10) == []
    assert t.due(7 * SECOND, 10) == [Redelivery(0, 1)]


def test_fixed_backoff_waits_the_base_delay_every_time() -> None:
    """With backoff "fixed" every redelivery waits base_redelivery_delay_ms."""
    policy = FailurePolicy(backoff="fixed", base_redelivery_delay_ms=250)
    assert [policy.redelivery_delay_ms(attempt) for attempt in (1, 2, 5, 100)] == [250] * 4
    assert FailurePolicy().redelivery_delay_ms(10_000) == 60 * SECOND, "a huge attempt number is just capped"


@given(
    base=st.integers(0, 5_000),
    extra=st.integers(0, 100_000),
    attempt=st.integers(1, 80),
    requested=st.none() | st.integers(-10, 200_000),
    backoff=st.sampled_from(BACKOFFS),
)
@settings(max_examples=200, deadline=None)
def test_redelivery_delay_is_max_of_policy_and_request_within_the_cap(
    base: int, extra: int, attempt: int, requested: int | None, backoff: str
) -> None:
    """For any policy, the delay never exceeds the cap, honours the request and grows with the attempt."""
    policy = FailurePolicy(base_redelivery_delay_ms=base, max_redelivery_delay_ms=base + extra, backoff=backoff)
    delay = policy.redelivery_delay_ms(attempt, requested)
    own = base if backoff == "fixed" else base * 2 ** (attempt - 1)
    assert delay == min(max(own, requested or 0), base + extra)
    assert policy.redelivery_delay_ms(attempt + 1, requested) >= delay


# -- ack timeout and disconnection ---------------------------------------------


def test_ack_timeout_redelivers_with_increasing_redelivery_count() -> None:
    """An unacked delivery expires after ack_timeout_ms and comes back with redelivery_count + 1."""
    t = tracker(ack_timeout_ms=100, base_redelivery_delay_ms=10, max_redelivery_delay_ms=1_000)
    now = 0
    t.delivered(A, [0], now)
    seen = []
    for _ in range(3):
        deadline = t.next_deadline_ms()
        assert deadline == now + 100
        assert t.expire(deadline - 1) == 0
        now = deadline
        assert t.expire(now) == 1
        now = t.next_deadline_ms() or 0
        (redelivery,) = t.due(now, 10)
        seen.append(redelivery.redelivery_count)
        t.delivered(B, [redelivery.offset], now)
    assert seen == [1, 2, 3]
    assert t.statistics().redeliveries_total == 3


def test_consumer_gone_makes_its_in_flight_messages_due_now() -> None:
    """A disconnected consumer's unacked messages are ready at once, counted as a failed attempt."""
    t = tracker()
    t.delivered(A, [0, 1], 0)
    t.delivered(B, [2], 0)
    t.ack(A, [1])
    t.consumer_gone(A, 500)
    assert t.in_flight_count(A) == 0
    assert t.next_deadline_ms() == 500
    assert t.due(500, 10) == [Redelivery(0, 1)]
    t.delivered(B, [0], 500)
    assert t.ack(B, [0, 2]) == 2


def test_requeue_gives_back_unsent_redeliveries_with_their_counts() -> None:
    """Offsets `due` returned but not sent go back to the queue, ready now, with the same count."""
    t = tracker()
    t.delivered(A, [0, 1, 2], 0)
    t.consumer_gone(A, 0)
    got = t.due(0, 2)
    assert got == [Redelivery(0, 1), Redelivery(1, 1)]
    t.delivered(B, [0], 0)
    t.requeue([1], 0)
    assert t.due(0, 10) == [Redelivery(1, 1), Redelivery(2, 1)]


# -- poison ----------------------------------------------------------------------


def test_drop_skips_a_message_after_max_redelivery_count_redeliveries() -> None:
    """Drop: 1 + max_redelivery_count deliveries, then the message counts as acked and the cursor passes it."""
    t = tracker(max_redelivery_count=2, poison_policy="drop")
    t.delivered(A, [0, 1], 0)
    t.ack(A, [1])
    now, counts = fail_until_poisoned(t, 0, 0)
    assert counts == [1, 2]
    assert t.cursor == 1
    assert t.poisoned(now) == [Poisoned(0, 3, "drop")]
    assert t.poisoned(now) == [], "reported once"
    assert t.statistics().poisoned_total == 1


def test_dead_letter_is_reported_once_and_acked_after_republishing() -> None:
    """DeadLetter: the poisoned offset is returned once; it stays unacked until `dead_lettered`."""
    t = tracker(max_redelivery_count=1, poison_policy="dead_letter", dead_letter_topic="/default/dlq")
    t.delivered(A, [0, 1], 0)
    t.ack(A, [1])
    now, counts = fail_until_poisoned(t, 0, 0)
    assert counts == [1]
    assert t.poisoned(now) == [Poisoned(0, 2, "dead_letter")]
    assert t.poisoned(now) == []
    assert t.cursor == -1
    assert t.ack(A, [0]) == -1, "a poisoning is final: acks are ignored"
    assert t.may_deliver_new()
    assert t.dead_lettered(0) == 1


def test_block_halts_the_subscription_at_the_poisoned_offset() -> None:
    """Block: the offset stays unacked, blocked_offset is set, and nothing new or old is delivered."""
    t = tracker(max_redelivery_count=1)
    t.delivered(A, [0, 1, 2], 0)
    t.nack(A, [1, 2], 0)
    assert t.due(SECOND, 10) == [Redelivery(1, 1), Redelivery(2, 1)]
    t.delivered(A, [1], SECOND)
    t.requeue([2], SECOND)
    t.nack(A, [1], SECOND)
    assert t.poisoned(SECOND) == [Poisoned(1, 2, "block")]
    assert t.blocked_offset == 1
    assert not t.may_deliver_new()
    assert t.new_allowance() == 0
    assert t.due(10 * 60 * SECOND, 10) == [], "2 is ready but the subscription is blocked"
    assert t.ack(A, [0]) == 0, "acks still count"
    assert t.cursor == 0
    assert t.next_deadline_ms() is None
    assert t.statistics().blocked_offset == 1
    t.check_invariants()


# -- holes, skips, start and restart --------------------------------------------


def test_offsets_skipped_over_by_new_deliveries_wait_to_be_sent() -> None:
    """A batch sent out of order (Key-Shared leftovers) leaves holes that `due` hands out with count 0."""
    t = tracker()
    t.delivered(A, [0, 3], 10)
    assert t.read_offset == 4
    assert t.statistics().waiting_redelivery == 2
    t.delivered(B, [2], 10)
    assert t.due(10, 10) == [Redelivery(1, 0)]
    t.delivered(B, [1], 10)
    assert t.statistics().redeliveries_total == 0
    assert t.ack(B, [1, 2]) == -1
    assert t.ack(A, [3, 0]) == 3


def test_skip_settles_offsets_nobody_will_take() -> None:
    """Key-Shared messages matching no consumer are skipped and the cursor passes them."""
    t = tracker()
    t.delivered(A, [0, 2], 0)
    assert t.skip([1, 3], 0) == -1
    assert t.read_offset == 4
    assert t.ack(A, [0, 2]) == 3


def test_new_subscription_starts_at_the_given_offset() -> None:
    """A new subscription at latest/offset treats everything before the start as consumed."""
    t = DeliveryTracker(cursor=-1, read_offset=100, policy=FailurePolicy())
    assert (t.cursor, t.read_offset) == (99, 100)
    assert t.backlog(100) == 0
    assert t.backlog(110) == 10


def test_resuming_from_a_snapshot_redelivers_unacked_offsets_first() -> None:
    """After a restart, offsets between the cursor and the highest out-of-order ack are due at once."""
    before = tracker()
    before.delivered(A, [0, 1, 2, 3, 4], 0)
    before.ack(A, [0, 2, 4])
    state = before.snapshot()
    assert state == CursorState(cursor=0, acked_above=(2, 4))
    after = DeliveryTracker(cursor=state.cursor, acked_above=state.acked_above, policy=FailurePolicy())
    assert (after.cursor, after.read_offset, after.acked_above) == (0, 5, {2, 4})
    assert after.next_deadline_ms() == READY_AT_START_MS
    assert after.due(0, 10) == [Redelivery(1, 0), Redelivery(3, 0)]
    after.delivered(A, [1, 3, 5], 0)
    assert after.ack(A, [3, 1]) == 4
    after.check_invariants()


def test_a_message_ttl_acknowledges_everything_below_whatever_its_state() -> None:
    t = tracker()
    t.delivered(A, [0, 1, 2, 3], 0)
    t.ack(A, [2])
    t.nack(A, [1], 0)
    # 0 and 3 in flight, 1 waiting for redelivery, 2 acked, 4..5 never read.
    assert t.expire_below(6, 1) == 5
    assert (t.cursor, t.read_offset, t.in_flight_count(A)) == (5, 6, 0)
    assert t.ack(A, [0, 3]) == 5  # late acks are ignored
    assert t.expire_below(3, 2) == 0  # never back
    t.check_invariants()


def test_seek_forgets_everything_and_restarts_at_the_offset() -> None:
    """Seek moves the cursor anywhere, backwards too, and drops all deliveries and redeliveries."""
    t = tracker(max_redelivery_count=0)
    t.delivered(A, [0, 1, 2], 0)
    t.nack(A, [0], 0)
    assert t.blocked_offset == 0
    t.seek(1)
    assert (t.cursor, t.read_offset, t.blocked_offset, t.in_flight_count(A)) == (0, 1, None, 0)
    assert t.poisoned(0) == []
    assert t.ack(A, [1]) == 0, "acks from before the seek are ignored"
    t.delivered(B, [1], 0)
    assert t.ack(B, [1]) == 1
    t.check_invariants()


def test_out_of_order_span_is_bounded_by_acked_above_max() -> None:
    """New deliveries stop when read_offset - cursor - 1 reaches acked_above_max: backpressure, not growth."""
    t = DeliveryTracker(cursor=-1, policy=FailurePolicy(), acked_above_max=4)
    assert t.new_allowance() == 4
    t.delivered(A, [0, 1, 2, 3], 0)
    t.ack(A, [1, 2, 3])
    assert t.new_allowance() == 0
    assert not t.may_deliver_new()
    t.ack(A, [0])
    assert t.new_allowance() == 4


def test_statistics_count_what_the_tracker_holds() -> None:
    """statistics() reports cursor, read offset, in flight, waiting, out-of-order acks and totals."""
    t = tracker()
    t.delivered(A, [0, 1, 2], 0)
    t.delivered(B, [3], 0)
    t.ack(A, [1])
    t.nack(A, [2], 0)
    s = t.statistics()
    assert (s.cursor, s.read_offset, s.in_flight, s.waiting_redelivery, s.acked_above) == (-1, 4, 2, 1, 1)
    assert (s.redeliveries_total, s.poisoned_total, s.blocked_offset) == (0, 0, None)


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"poison_policy": "dead_letter"}, "dead_letter_topic"),
        ({"poison_policy": "dead_letter", "dead_letter_topic": ""}, "dead_letter_topic"),
        ({"base_redelivery_delay_ms": -1}, "base_redelivery_delay_ms"),
        ({"max_redelivery_delay_ms": -1}, "max_redelivery_delay_ms"),
        ({"base_redelivery_delay_ms": 5_000, "max_redelivery_delay_ms": 1_000}, "max_redelivery_delay_ms"),
        ({"max_redelivery_count": -1}, "max_redelivery_count"),
        ({"ack_timeout_ms": 0}, "ack_timeout_ms"),
        ({"backoff": "linear"}, "backoff"),
        ({"poison_policy": "retry"}, "poison_policy"),
    ],
)
def test_failure_policy_rejects_invalid_fields_by_name(fields: dict[str, object], named: str) -> None:
    """An invalid failure policy raises InvalidArgument naming the offending field."""
    with pytest.raises(InvalidArgument, match=named):
        FailurePolicy(**fields)  # type: ignore[arg-type]


# -- random interleavings against a model ---------------------------------------

CONSUMERS = (1, 2, 3)
WINDOW = 4
TIMEOUT_MS = 50
BASE_MS = 10
CAP_MS = 40
SPAN_MAX = 12


class TrackerMachine(RuleBasedStateMachine):
    """Drives a tracker with random events and checks it against a simple per-offset model.

    Model states per offset: ("acked",), ("flight", consumer, attempt, deadline),
    ("waiting", attempts, ready_at), ("out", attempts), ("dead", attempts),
    ("blocked", attempts). Offsets below `start` count as acked.
    """

    @initialize(
        max_redeliveries=st.integers(0, 3),
        backoff=st.sampled_from(BACKOFFS),
        poison=st.sampled_from(POISON_POLICIES),
        start=st.integers(0, 5),
    )
    def setup(self, max_redeliveries: int, backoff: str, poison: str, start: int) -> None:
        self.policy = FailurePolicy(
            max_redelivery_count=max_redeliveries,
            ack_timeout_ms=TIMEOUT_MS,
            base_redelivery_delay_ms=BASE_MS,
            max_redelivery_delay_ms=CAP_MS,
            backoff=backoff,
            poison_policy=poison,
            dead_letter_topic="/default/dlq" if poison == "dead_letter" else None,
        )
        self.t = DeliveryTracker(cursor=-1, read_offset=start, policy=self.policy, acked_above_max=SPAN_MAX)
        self.start = start
        self.now = 1_000
        self.read = start
        self.state: dict[int, tuple] = {}
        self.unreported: list[Poisoned] = []
        self.reported_dead: set[int] = set()
        self.highest_cursor = start - 1

    # model helpers

    def cursor(self) -> int:
        c = self.start - 1
        while self.state.get(c + 1) == ("acked",):
            c += 1
        return c

    def blocked(self) -> bool:
        return any(s[0] == "blocked" for s in self.state.values())

    def flight(self, consumer: int) -> list[int]:
        return sorted(o for o, s in self.state.items() if s[0] == "flight" and s[1] == consumer)

    def delay(self, attempt: int, requested: int | None = None) -> int:
        own = BASE_MS if self.policy.backoff == "fixed" else BASE_MS * 2 ** (attempt - 1)
        return min(max(own, requested or 0), CAP_MS)

    def fail(self, offset: int, attempts: int, ready_at: int) -> None:
        if attempts <= self.policy.max_redelivery_count:
            self.state[offset] = ("waiting", attempts, ready_at)
            return
        action = self.policy.poison_policy
        self.unreported.append(Poisoned(offset, attempts, action))
        self.state[offset] = {"drop": ("acked",), "dead_letter": ("dead", attempts), "block": ("blocked", attempts)}[action]

    def candidates(self) -> list[int]:
        return list(range(self.start - 2, self.read + 2))

    def allowance(self) -> int:
        if self.blocked():
            return 0
        return max(0, SPAN_MAX - (self.read - self.cursor() - 1))

    # rules

    @rule(ms=st.integers(0, 60))
    def tick(self, ms: int) -> None:
        self.now += ms

    @rule(consumer=st.sampled_from(CONSUMERS), count=st.integers(1, 3), gap=st.integers(0, 2))
    def deliver_new(self, consumer: int, count: int, gap: int) -> None:
        assert self.t.new_allowance() == self.allowance()
        if gap + count > self.allowance() or len(self.flight(consumer)) + count > WINDOW:
            return
        for hole in range(self.read, self.read + gap):
            self.state[hole] = ("waiting", 0, self.now)
        offsets = list(range(self.read + gap, self.read + gap + count))
        self.t.delivered(consumer, offsets, self.now)
        for o in offsets:
            self.state[o] = ("flight", consumer, 1, self.now + TIMEOUT_MS)
        self.read = offsets[-1] + 1

    @rule(consumer=st.sampled_from(CONSUMERS), data=st.data())
    def deliver_hole(self, consumer: int, data: st.DataObject) -> None:
        holes = sorted(o for o, s in self.state.items() if s[0] == "waiting" and s[1] == 0)
        if not holes or self.blocked() or len(self.flight(consumer)) >= WINDOW:
            return
        hole = data.draw(st.sampled_from(holes))
        self.t.delivered(consumer, [hole], self.now)
        self.state[hole] = ("flight", consumer, 1, self.now + TIMEOUT_MS)

    @rule(consumer=st.sampled_from(CONSUMERS), limit=st.integers(0, 4), data=st.data())
    def due_then_send_or_requeue(self, consumer: int, limit: int, data: st.DataObject) -> None:
        got = self.t.due(self.now, limit)
        ready = sorted(o for o, s in self.state.items() if s[0] == "waiting" and s[2] <= self.now)
        expected = [] if self.blocked() else [Redelivery(o, self.state[o][1]) for o in ready[:limit]]
        assert got == expected
        room = WINDOW - len(self.flight(consumer))
        sent = data.draw(st.sets(st.sampled_from([r.offset for r in got]), max_size=room)) if got and room else set()
        for r in got:
            self.state[r.offset] = ("out", r.redelivery_count)
        self.t.delivered(consumer, sorted(sent), self.now)
        for o in sent:
            self.state[o] = ("flight", consumer, self.state[o][1] + 1, self.now + TIMEOUT_MS)
        rest = [r.offset for r in got if r.offset not in sent]
        self.t.requeue(rest, self.now)
        for o in rest:
            self.state[o] = ("waiting", self.state[o][1], self.now)

    @rule(consumer=st.sampled_from(CONSUMERS), data=st.data())
    def ack(self, consumer: int, data: st.DataObject) -> None:
        pool = self.flight(consumer) + self.candidates()
        offsets = data.draw(st.lists(st.sampled_from(pool), max_size=4))
        for o in offsets:
            s = self.state.get(o)
            if s is not None and (s[0] == "waiting" or (s[0] == "flight" and s[1] == consumer)):
                self.state[o] = ("acked",)
        assert self.t.ack(consumer, offsets) == self.cursor()

    @rule(consumer=st.sampled_from(CONSUMERS), delay=st.none() | st.integers(0, 80), data=st.data())
    def nack(self, consumer: int, delay: int | None, data: st.DataObject) -> None:
        pool = self.flight(consumer) + self.candidates()
        offsets = data.draw(st.lists(st.sampled_from(pool), max_size=3))
        for o in offsets:
            s = self.state.get(o)
            if s is not None and s[0] == "flight" and s[1] == consumer:
                self.fail(o, s[2], self.now + self.delay(s[2], delay))
        self.t.nack(consumer, offsets, self.now, delay)

    @rule(consumer=st.sampled_from(CONSUMERS))
    def consumer_gone(self, consumer: int) -> None:
        for o in self.flight(consumer):
            self.fail(o, self.state[o][2], self.now)
        self.t.consumer_gone(consumer, self.now)

    @rule()
    def expire(self) -> None:
        late = sorted(o for o, s in self.state.items() if s[0] == "flight" and s[3] <= self.now)
        for o in late:
            attempt = self.state[o][2]
            self.fail(o, attempt, self.now + self.delay(attempt))
        assert self.t.expire(self.now) == len(late)

    @rule()
    def poisoned(self) -> None:
        assert self.t.poisoned(self.now) == sorted(self.unreported, key=lambda p: p.offset)
        self.reported_dead |= {p.offset for p in self.unreported if p.action == "dead_letter"}
        self.unreported = []

    @rule(data=st.data())
    def dead_lettered(self, data: st.DataObject) -> None:
        if not self.reported_dead:
            return
        o = data.draw(st.sampled_from(sorted(self.reported_dead)))
        self.reported_dead.remove(o)
        self.state[o] = ("acked",)
        assert self.t.dead_lettered(o) == self.cursor()

    @rule(data=st.data())
    def skip(self, data: st.DataObject) -> None:
        holes = sorted(o for o, s in self.state.items() if s[0] == "waiting" and s[1] == 0)
        if holes and data.draw(st.booleans()):
            o = data.draw(st.sampled_from(holes))
        elif self.allowance() >= 1:
            o = self.read
            self.read += 1
        else:
            return
        self.state[o] = ("acked",)
        assert self.t.skip([o], self.now) == self.cursor()

    @rule(data=st.data())
    def expire_below(self, data: st.DataObject) -> None:
        """A message TTL ran out below `end`: every offset there counts as acked,
        whatever its state, and those not acked before are counted."""
        end = data.draw(st.integers(self.start - 2, self.read + 3))
        cursor = self.cursor()
        expired = sum(1 for o in range(cursor + 1, end) if self.state.get(o) != ("acked",))
        for o in range(max(self.start, cursor + 1), end):
            self.state[o] = ("acked",)
        self.read = max(self.read, end)
        self.unreported = [p for p in self.unreported if p.offset >= end]
        self.reported_dead = {o for o in self.reported_dead if o >= end}
        assert self.t.expire_below(end, self.now) == expired

    @rule(max_redeliveries=st.integers(0, 3), poison=st.sampled_from(POISON_POLICIES), backoff=st.sampled_from(BACKOFFS))
    def change_policy(self, max_redeliveries: int, poison: str, backoff: str) -> None:
        """An admin sets a new failure policy: the bound applies at once (`set_policy`)."""
        self.policy = FailurePolicy(
            max_redelivery_count=max_redeliveries, ack_timeout_ms=TIMEOUT_MS, base_redelivery_delay_ms=BASE_MS,
            max_redelivery_delay_ms=CAP_MS, backoff=backoff, poison_policy=poison,
            dead_letter_topic="/default/dlq" if poison == "dead_letter" else None,
        )
        max_attempts = 1 + max_redeliveries
        unsettled = {o: s[1] for o, s in self.state.items() if s[0] in ("dead", "blocked")}
        self.unreported = [p for p in self.unreported if p.offset not in unsettled]
        self.reported_dead -= set(unsettled)
        for o, s in list(self.state.items()):
            if s[0] == "flight" and s[2] > max_attempts:
                self.state[o] = ("flight", s[1], max_attempts, s[3])
        for o in sorted(o for o, s in self.state.items() if s[0] == "waiting" and s[1] >= max_attempts):
            self.fail(o, self.state[o][1], self.now)
        for o in sorted(unsettled):
            if unsettled[o] < max_attempts:
                self.state[o] = ("waiting", unsettled[o], self.now)
            else:
                self.fail(o, unsettled[o], self.now)
        self.t.set_policy(self.policy, self.now)

    @rule()
    def restart_from_snapshot(self) -> None:
        """A broker restart keeps only the cursor and the out-of-order acks."""
        snap = self.t.snapshot()
        self.t = DeliveryTracker(
            cursor=snap.cursor, acked_above=snap.acked_above, policy=self.policy, acked_above_max=SPAN_MAX
        )
        self.read = max(snap.acked_above, default=snap.cursor) + 1
        self.state = {o: s for o, s in self.state.items() if o < self.read}
        for o in range(snap.cursor + 1, self.read):
            if self.state[o] != ("acked",):
                self.state[o] = ("waiting", 0, READY_AT_START_MS)
        self.unreported = []
        self.reported_dead = set()

    # invariants

    @invariant()
    def matches_the_model(self) -> None:
        self.t.check_invariants()
        cursor = self.cursor()
        assert self.t.cursor == cursor
        assert cursor >= self.highest_cursor, "the cursor never decreases"
        self.highest_cursor = cursor
        assert self.t.read_offset == self.read
        assert self.t.acked_above == {o for o, s in self.state.items() if s == ("acked",) and o > cursor}
        assert all(o in self.state for o in range(cursor + 1, self.read)), "no offset lost"
        for consumer in CONSUMERS:
            assert self.t.in_flight_count(consumer) == len(self.flight(consumer)) <= WINDOW
        blocked = [o for o, s in self.state.items() if s[0] == "blocked"]
        assert self.t.blocked_offset == (min(blocked) if blocked else None)
        assert self.t.may_deliver_new() == (self.allowance() > 0)
        stats = self.t.statistics()
        assert stats.waiting_redelivery == sum(1 for s in self.state.values() if s[0] == "waiting")
        assert stats.in_flight == sum(1 for s in self.state.values() if s[0] == "flight")
        times = [s[3] for s in self.state.values() if s[0] == "flight"]
        if not blocked:
            times += [s[2] for s in self.state.values() if s[0] == "waiting"]
        assert self.t.next_deadline_ms() == min(times, default=None)


TrackerMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
test_random_interleavings_lose_no_offset = TrackerMachine.TestCase


def _state(t: DeliveryTracker) -> tuple[object, ...]:
    return (t.snapshot(), t.read_offset, t.statistics(), {c: dict(f) for c, f in t._in_flight.items()},
            dict(t._waiting))


@given(
    earlier=st.lists(st.tuples(st.sampled_from((1, 2)), st.integers(1, 4), st.booleans()), max_size=6),
    run=st.integers(1, 12),
    acked=st.integers(0, 12),
)
@settings(max_examples=300, deadline=None)
def test_runs_in_order_take_the_fast_path_to_the_same_state(
    earlier: list[tuple[int, int, bool]], run: int, acked: int
) -> None:
    """Delivering the next offsets in a row, and acking the next ones after the cursor,
    end in the state the general path reaches with the same offsets in reverse."""
    fast, general = tracker(), tracker()
    now = 0
    for consumer, count, ack in earlier:  # some history: deliveries, some acked out of order
        for t in (fast, general):
            offsets = list(range(t.read_offset, t.read_offset + count))
            t.delivered(consumer, offsets, now)
            if ack:
                t.ack(consumer, offsets[1:])
    offsets = list(range(fast.read_offset, fast.read_offset + run))
    fast.delivered(3, offsets, now)
    general.delivered(3, offsets[::-1], now)
    assert _state(fast) == _state(general)
    fast.check_invariants()
    in_flight_3 = sorted(fast._in_flight.get(3, {}))
    start = fast.cursor + 1
    ackable = [o for o in range(start, start + acked) if o in in_flight_3]
    prefix = ackable[: next((i for i, o in enumerate(ackable) if o != start + i), len(ackable))]
    fast.ack(3, prefix)
    general.ack(3, prefix[::-1])
    assert _state(fast) == _state(general)
    fast.check_invariants()


def test_a_gap_in_the_log_is_settled_at_once_when_everything_below_is_settled() -> None:
    t = tracker()
    t.delivered(A, [0, 1], 0)
    t.ack(A, [0, 1])
    assert t.skip_gap(2, 5_000_000, 0)
    assert (t.cursor, t.read_offset) == (4_999_999, 5_000_000)
    t.delivered(A, [5_000_000], 0)
    assert t.ack(A, [5_000_000]) == 5_000_000
    t.check_invariants()


def test_a_gap_above_unacknowledged_deliveries_is_settled_within_the_bound_or_waits() -> None:
    t = DeliveryTracker(cursor=-1, policy=FailurePolicy(), acked_above_max=100)
    t.delivered(A, [0, 1], 0)
    assert not t.skip_gap(2, 200, 0), "past the bound of offsets held above the cursor"
    assert t.skip_gap(2, 50, 0)
    assert (t.cursor, t.read_offset) == (-1, 50)
    assert t.ack(A, [0, 1]) == 49, "the gap counts as acknowledged"
    assert t.skip_gap(50, 200, 0)
    assert t.cursor == 199
    t.check_invariants()


def test_undelivered_offsets_come_back_at_once_without_counting_an_attempt() -> None:
    """A delivery the gateway refused (never sent) is undone: the offsets are due at
    once with their previous redelivery count, so a connection over its byte budget
    never drives a message towards its poison policy; offsets of another consumer or
    not in flight are ignored."""
    t = tracker(max_redelivery_count=1)
    t.delivered(A, [0, 1, 2], 0)
    t.undeliver(A, [1, 2, 7], 5)
    t.undeliver(B, [0], 5)
    assert t.in_flight_count(A) == 1
    assert t.due(5, 10) == [Redelivery(1, 0), Redelivery(2, 0)]
    t.delivered(A, [1, 2], 6)
    t.nack(A, [1], 7, delay_ms=0)
    [again] = t.due(10 * SECOND, 10)
    t.delivered(A, [again.offset], 10 * SECOND)
    t.undeliver(A, [1], 10 * SECOND)
    assert t.due(10 * SECOND, 10) == [Redelivery(1, 1)] and t.poisoned(10 * SECOND) == []
    t.check_invariants()


def test_a_gap_reaching_exactly_the_bound_above_the_cursor_is_settled() -> None:
    """The bound is inclusive: a gap whose last offset is acked_above_max above the
    cursor is settled (one by one), one offset further it waits."""
    t = DeliveryTracker(cursor=-1, policy=FailurePolicy(), acked_above_max=100)
    t.delivered(A, [0, 1], 0)
    assert not t.skip_gap(2, 101, 0)
    assert (t.cursor, t.read_offset) == (-1, 2), "a refused gap changes nothing"
    assert t.skip_gap(2, 100, 0)
    assert t.read_offset == 100 and t.ack(A, [0, 1]) == 99
    t.check_invariants()


def test_the_tracker_is_settled_only_with_nothing_in_flight_and_nothing_waiting() -> None:
    """settled() means no deadline to watch: false while a delivery is in flight, false
    while a nacked offset waits for redelivery, true once both are gone."""
    t = tracker()
    assert t.settled()
    t.delivered(A, [0], 0)
    assert not t.settled(), "in flight"
    t.nack(A, [0], 0)
    assert t.in_flight_count(A) == 0 and not t.settled(), "waiting for redelivery"
    (redelivery,) = t.due(10**9, 10)
    t.delivered(A, [redelivery.offset], 10**9)
    t.ack(A, [redelivery.offset])
    assert t.settled()


def test_resuming_ignores_acked_offsets_at_or_below_the_cursor() -> None:
    """A persisted state whose acked_above still lists offsets the cursor has passed
    (written before the cursor moved) resumes as if they were absent: the cursor
    stays, the offsets above it are acked, the ones between wait as holes."""
    t = DeliveryTracker(cursor=5, policy=FailurePolicy(), acked_above=[3, 5, 8])
    assert (t.cursor, t.read_offset, t.acked_above) == (5, 9, frozenset({8}))
    assert sorted(r.offset for r in t.due(0, 10)) == [6, 7]
    t.check_invariants()


def test_forget_settles_a_resumed_subscriptions_holes_the_log_no_longer_holds() -> None:
    """A subscription resumed at cursor 1141 with 1145 and 1150 acked above it waits to
    redeliver 1142..1149 (but 1145); when the new owner's log starts at 4096 (the old
    owner's reservation), forgetting 1142..4095 settles those holes, and the rest, never
    delivered, is crossed with `skip_gap`: nothing of the range comes back from `due`,
    the cursor is 4095 and new deliveries start at 4096. (Skipping only from
    `read_offset` left the holes waiting, and the subscription failed on every Flow with
    a KeyError for a record it never read.)"""
    t = DeliveryTracker(cursor=1141, acked_above=[1145, 1150], policy=FailurePolicy())
    assert [r.offset for r in t.due(0, 100)] == [1142, 1143, 1144, 1146, 1147, 1148, 1149]
    t.requeue([1142, 1143, 1144, 1146, 1147, 1148, 1149], 0)
    assert t.forget(1142, 4096, SECOND) == 7
    assert (t.cursor, t.read_offset) == (1150, 1151)
    assert t.skip_gap(1151, 4096, SECOND)
    assert t.due(2 * SECOND, 100) == []
    assert (t.cursor, t.read_offset, t.acked_above_count) == (4095, 4096, 0)
    assert t.settled()


def test_forget_settles_deliveries_in_flight_and_ignores_their_late_acks() -> None:
    """Offsets in flight when the log loses them are settled (a late ack or nack is
    ignored); offsets after the range are untouched."""
    t = tracker()
    t.delivered(A, [0, 1, 2, 3], 0)
    assert t.forget(0, 3, SECOND) == 3
    assert t.cursor == 2 and t.in_flight_count(A) == 1
    t.ack(A, [0, 1])
    t.nack(A, [2], SECOND)
    assert t.due(60 * SECOND, 10) == []
    assert t.ack(A, [3]) == 3


@given(st.lists(st.tuples(st.sampled_from(["deliver", "ack", "nack"]), st.integers(0, 30)), max_size=40),
       st.integers(0, 40), st.integers(0, 40))
@settings(max_examples=300, deadline=None)
def test_forget_leaves_nothing_of_its_range_to_deliver(ops: list[tuple[str, int]], start: int, span: int) -> None:
    """Whatever was delivered, acked or nacked before, after forget(start, end) no offset
    of the range is waiting, in flight or ever due, nothing new is taken (`read_offset`
    stays), and offsets outside the range keep their state."""
    t = tracker()
    now = 0
    for op, offset in ops:
        now += 1
        if op == "deliver" and offset >= t.read_offset and offset - t.cursor <= 100:
            t.delivered(A, [offset], now)
        elif op == "ack":
            t.ack(A, [offset])
        elif op == "nack":
            t.nack(A, [offset], now)
    end = start + span
    read_offset, in_flight = t.read_offset, t.in_flight_count(A)
    later = now + 10**9  # nacked offsets wait out a backoff; in-flight ones stay (no expire)
    waiting = [r.offset for r in t.due(later, 10_000)]
    t.requeue(waiting, later)
    waiting_in_range = sum(1 for o in waiting if start <= o < end)
    settled = t.forget(start, end, later)
    assert t.read_offset == read_offset
    due = {r.offset for r in t.due(later, 10_000)}
    assert not any(start <= o < end for o in due)
    assert {o for o in waiting if not start <= o < end} <= due
    assert t.in_flight_count(A) == in_flight - (settled - waiting_in_range)

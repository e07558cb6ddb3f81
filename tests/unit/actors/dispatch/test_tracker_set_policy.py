"""`DeliveryTracker.set_policy`: an admin's new failure policy applies from then on,
and its redelivery bound at once (Danube's `set-failure-policy`)."""

from __future__ import annotations

from danube_zmq.actors.dispatch.tracker import DeliveryTracker, FailurePolicy, Poisoned, Redelivery

A = 1
SECOND = 1_000


def tracker(**policy: object) -> DeliveryTracker:
    return DeliveryTracker(cursor=-1, policy=FailurePolicy(**policy))  # type: ignore[arg-type]


def test_lowering_max_redelivery_count_poisons_exhausted_waiting_offsets_now() -> None:
    """Offset 0 failed twice under max 5; with max 1 it is exhausted and dropped at once,
    while offset 1 (failed once) keeps waiting and is poisoned at its next failure."""
    t = tracker(max_redelivery_count=5, poison_policy="drop")
    t.delivered(A, [0, 1], 0)
    t.nack(A, [0, 1], 0)
    assert t.due(60 * SECOND, 10) == [Redelivery(0, 1), Redelivery(1, 1)]
    t.delivered(A, [0], 60 * SECOND)
    t.requeue([1], 60 * SECOND)
    t.nack(A, [0], 60 * SECOND)  # offset 0: 2 deliveries failed; offset 1: 1
    t.set_policy(FailurePolicy(max_redelivery_count=1, poison_policy="drop"), 61 * SECOND)
    assert t.poisoned(61 * SECOND) == [Poisoned(0, 2, "drop")]
    assert t.cursor == 0
    assert t.due(200 * SECOND, 10) == [Redelivery(1, 1)]
    t.delivered(A, [1], 200 * SECOND)
    t.nack(A, [1], 200 * SECOND)
    assert t.poisoned(200 * SECOND) == [Poisoned(1, 2, "drop")]
    assert t.cursor == 1
    assert t.statistics().poisoned_total == 2
    t.check_invariants()


def test_in_flight_attempts_above_the_new_bound_poison_on_their_next_failure() -> None:
    """A delivery in flight as attempt 3 under max 5 fails under max 0: poisoned, not redelivered."""
    t = tracker(max_redelivery_count=5)
    t.delivered(A, [0], 0)
    now = 0
    for _ in range(2):
        t.nack(A, [0], now)
        now += 60 * SECOND
        assert [r.offset for r in t.due(now, 1)] == [0]
        t.delivered(A, [0], now)
    t.set_policy(FailurePolicy(max_redelivery_count=0), now)
    t.check_invariants()
    t.nack(A, [0], now)
    assert t.poisoned(now) == [Poisoned(0, 1, "block")]
    assert t.blocked_offset == 0


def test_switching_block_to_drop_unblocks_the_subscription() -> None:
    """A blocked offset is judged again under the new poison policy: drop skips it and
    new deliveries resume; it is counted as poisoned once."""
    t = tracker(max_redelivery_count=0)
    t.delivered(A, [0], 0)
    t.nack(A, [0], 0)
    assert t.poisoned(0) == [Poisoned(0, 1, "block")]
    assert not t.may_deliver_new()
    t.set_policy(FailurePolicy(max_redelivery_count=0, poison_policy="drop"), SECOND)
    assert t.poisoned(SECOND) == [Poisoned(0, 1, "drop")]
    assert t.blocked_offset is None and t.cursor == 0 and t.may_deliver_new()
    assert t.statistics().poisoned_total == 1
    t.check_invariants()


def test_raising_max_redelivery_count_retries_a_blocked_offset() -> None:
    """With a higher bound the blocked offset is no longer exhausted: it is redelivered now."""
    t = tracker(max_redelivery_count=0)
    t.delivered(A, [0], 0)
    t.nack(A, [0], 0)
    t.poisoned(0)
    t.set_policy(FailurePolicy(max_redelivery_count=2), SECOND)
    assert t.poisoned(SECOND) == []
    assert t.blocked_offset is None
    assert t.due(SECOND, 10) == [Redelivery(0, 1)]
    t.delivered(A, [0], SECOND)
    t.check_invariants()


def test_new_timeout_and_backoff_apply_to_the_next_delivery_and_failure() -> None:
    """Deadlines already set stay; the next delivery uses the new ack timeout, the next
    failure the new backoff."""
    t = tracker(ack_timeout_ms=30 * SECOND, base_redelivery_delay_ms=SECOND)
    t.delivered(A, [0], 0)
    t.set_policy(FailurePolicy(ack_timeout_ms=5 * SECOND, base_redelivery_delay_ms=7 * SECOND,
                               max_redelivery_delay_ms=60 * SECOND), 0)
    assert t.next_deadline_ms() == 30 * SECOND
    t.delivered(A, [1], 0)
    assert t.next_deadline_ms() == 5 * SECOND
    t.nack(A, [0], 0)
    assert t.due(6 * SECOND, 10) == []
    assert t.due(7 * SECOND, 10) == [Redelivery(0, 1)]


def test_a_blocked_offset_retried_under_a_raised_bound_stays_counted_as_poisoned_once() -> None:
    """The poisoning that blocked an offset happened: after the bound is raised and the
    offset waits for redelivery, poisoned_total still counts it, once; poisoned again
    later under the new bound, it counts a second time."""
    t = tracker(max_redelivery_count=0)
    t.delivered(A, [0], 0)
    t.nack(A, [0], 0)
    t.poisoned(0)
    assert t.statistics().poisoned_total == 1
    t.set_policy(FailurePolicy(max_redelivery_count=1), SECOND)
    assert t.statistics().poisoned_total == 1 and t.poisoned(SECOND) == []
    (again,) = t.due(SECOND, 10)
    t.delivered(A, [again.offset], SECOND)
    t.nack(A, [again.offset], SECOND)
    assert t.poisoned(SECOND) == [Poisoned(0, 2, "block")]
    assert t.statistics().poisoned_total == 2
    t.check_invariants()

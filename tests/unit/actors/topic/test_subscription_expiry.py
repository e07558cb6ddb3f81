"""What expires when (`actors/topic/expiry.py` `expired`): the pure core of the
subscription_expiration_ms policy."""

from __future__ import annotations

import random

from danube_zmq.actors.topic.expiry import expired


def test_idle_subscriptions_are_due_at_their_time_and_the_next_wait_is_the_earliest() -> None:
    idle = {"a": 1_000, "b": 1_500, "busy": None, "c": 4_000}
    assert expired(idle, 2_000, 2_999) == ([], 1)
    assert expired(idle, 2_000, 3_000) == (["a"], 500)  # exactly its time: due
    assert expired(idle, 2_000, 3_600) == (["a", "b"], 2_400)
    assert expired(idle, 2_000, 10_000_000) == (["a", "b", "c"], None)


def test_nothing_expires_with_a_policy_of_zero_or_without_an_idle_subscription() -> None:
    assert expired({"a": 0}, 0, 10**12) == ([], None)
    assert expired({"busy": None}, 1, 10**12) == ([], None)
    assert expired({}, 1, 0) == ([], None)


def test_randomized_a_subscription_is_due_exactly_when_idle_for_the_whole_period() -> None:
    """Due iff idle and idle_since + expiration <= now; the wait is the least positive
    remainder of the others: one timer at that time finds the next one due."""
    rng = random.Random(37)
    for _ in range(2_000):
        expiration = rng.choice([0, 1, rng.randrange(1, 10_000)])
        now = rng.randrange(0, 20_000)
        idle = {f"s{i}": rng.choice([None, rng.randrange(0, 20_000)]) for i in range(rng.randrange(0, 6))}
        due, wait = expired(idle, expiration, now)
        want = sorted(n for n, since in idle.items() if expiration and since is not None and since + expiration <= now)
        assert due == want
        rest = [since + expiration - now for since in idle.values()
                if expiration and since is not None and since + expiration > now]
        assert wait == (min(rest) if rest else None)
        if wait is not None:
            assert expired(idle, expiration, now + wait)[0] != due

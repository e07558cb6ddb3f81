"""The token bucket behind max_publish_rate and max_dispatch_rate, on a hand-moved clock."""

from __future__ import annotations

import random

from danube_zmq.actors.rate_limit import TokenBucket


def test_a_second_of_burst_then_the_rate() -> None:
    """200/s: 200 one-message batches pass at once, the 201st only after 5 ms."""
    bucket = TokenBucket(200, now_ms=0)
    assert all(bucket.take(1, 0) for _ in range(200))
    assert not bucket.take(1, 0)
    assert bucket.wait_ms(1, 0) == 5
    assert bucket.take(1, 5)


def test_a_batch_larger_than_a_second_waits_its_own_size() -> None:
    """A batch of 1,000 at 200/s passes after 4 s of refill past the first second's
    burst, not at once with a debt."""
    bucket = TokenBucket(200, now_ms=0)
    assert not bucket.take(1000, 0)
    assert bucket.wait_ms(1000, 0) == 4000
    assert not bucket.take(1000, 3999)
    assert bucket.take(1000, 4000)
    assert not bucket.take(1, 4000)


def test_the_rate_holds_over_time_whatever_the_batch_sizes() -> None:
    """Random batches asked in order on a clock moved by 1 ms: over 20 s at most
    rate * 20 s plus one second's burst plus the largest batch pass."""
    rng = random.Random(7)
    bucket = TokenBucket(500, now_ms=0)
    passed = 0
    head = rng.randint(1, 1500)
    for now_ms in range(20_000):
        while bucket.take(head, now_ms):
            passed += head
            head = rng.randint(1, 1500)
    assert 500 * 20 - 1500 <= passed <= 500 * 20 + 500 + 1500

"""A token bucket (the publish and dispatch rate policies): pure, on the caller's clock.

`rate` tokens a second, at most `rate` kept (one second's burst). A batch of `count`
messages passes once the bucket holds `count` tokens and takes them. A batch larger
than a second's allowance would never fit: while it waits the bucket keeps up to its
size instead, so it passes after `count / rate` seconds and the rate holds over time
whatever the batch sizes (the caller asks about its batches in order).

A dispatcher, which can cut what it sends to fit, asks `available` instead and
`spend`s what it sent.
"""

from __future__ import annotations


class TokenBucket:
    def __init__(self, rate: int, now_ms: int) -> None:
        assert rate > 0, "a rate of 0 is no limit: no bucket"
        self.rate = rate
        self.tokens = float(rate)
        self._at_ms = now_ms

    def _refill(self, count: int, now_ms: int) -> None:
        elapsed_ms = max(0, now_ms - self._at_ms)
        self.tokens = min(float(max(self.rate, count)), self.tokens + elapsed_ms * self.rate / 1000)
        self._at_ms = now_ms

    def take(self, count: int, now_ms: int) -> bool:
        """Take `count` tokens if the batch may pass now."""
        self._refill(count, now_ms)
        if self.tokens < count:
            return False
        self.tokens -= count
        return True

    def wait_ms(self, count: int, now_ms: int) -> int:
        """How long until a batch of `count` may pass (at least 1 ms when it may not now)."""
        self._refill(count, now_ms)
        missing = count - self.tokens
        if missing <= 0:
            return 0
        return max(1, int(missing * 1000 / self.rate + 0.999))

    def available(self, now_ms: int) -> int:
        """Whole tokens held now."""
        self._refill(1, now_ms)
        return int(self.tokens)

    def spend(self, count: int) -> None:
        self.tokens -= count

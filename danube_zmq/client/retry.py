"""Backoff for the client's retries and reconnects: a pure function of the attempt number.

Exponential from `BACKOFF_MS_MIN` to `BACKOFF_MS_MAX`, less up to 20% jitter so that
many clients that lost the same broker do not come back in lockstep.
"""

from __future__ import annotations

import random

BACKOFF_MS_MIN = 100
# Kafka's clients cap reconnect and retry backoff at 1 s by default: a broker back from
# a restart is found within a second, not up to 5 s later (chaos B1: first acks
# clustered at the 3.1 s and 6.3 s sums of a 100 ms doubling backoff).
BACKOFF_MS_MAX = 1_000
_JITTER = 0.2


def backoff_ms(attempt: int, rng: random.Random) -> float:
    """Delay before retry number `attempt` (0 = the first retry): 100, 200, 400, 800, 1000 ... ms."""
    assert attempt >= 0
    ceiling = min(BACKOFF_MS_MAX, BACKOFF_MS_MIN * (1 << min(attempt, 16)))
    return ceiling * (1.0 - _JITTER * rng.random())

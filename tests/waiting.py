"""Waiting on a condition in tests: a generous deadline, never an assertion on timing
(a slow machine makes a test slower, never red)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

DEADLINE_S = 30.0


async def until(condition: Callable[[], object], what: str, deadline_s: float = DEADLINE_S) -> None:
    """Return once `condition()` is true; fail naming `what` after `deadline_s`."""
    deadline = time.monotonic() + deadline_s
    while not condition():
        if time.monotonic() >= deadline:
            raise AssertionError(f"not within {deadline_s:g} s: {what}")
        await asyncio.sleep(0.01)

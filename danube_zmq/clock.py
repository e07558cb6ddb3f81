"""Time as an injected dependency: logic asks a `Clock`, never `time` directly.

A clock also runs timers (`call_later`), so what is due when (actor timer messages,
`ActorSystem.schedule_once`/`schedule_periodic`) follows the same clock as what
reads the time. `SystemClock` is real time on the running event loop;
`ManualClock` moves only when told (`advance`), for tests and simulations.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections.abc import Callable
from typing import Protocol


class TimerHandle(Protocol):
    def cancel(self) -> None:
        """The callback will not run (nothing happens if it ran already)."""
        ...


class Clock(Protocol):
    def monotonic_ms(self) -> int:
        """Milliseconds on a clock that never goes backwards (durations, timeouts)."""
        ...

    def now_ms(self) -> int:
        """Wall-clock milliseconds since the Unix epoch (publish times, reports)."""
        ...

    def call_later(self, delay_ms: int, callback: Callable[[], None]) -> TimerHandle:
        """Run `callback` once, `delay_ms` from now on this clock's monotonic time."""
        ...


class SystemClock:
    def monotonic_ms(self) -> int:
        return time.monotonic_ns() // 1_000_000

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def call_later(self, delay_ms: int, callback: Callable[[], None]) -> TimerHandle:
        # The running loop's timer: the one loop all of a process's actors run on.
        return asyncio.get_running_loop().call_later(delay_ms / 1000, callback)


class _ManualTimer:
    __slots__ = ("callback", "cancelled")

    def __init__(self, callback: Callable[[], None]) -> None:
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class ManualClock:
    """A clock that stands still until `advance`: both readings move together, and the
    timers that come due run then, in due order (those due at the same time in the
    order they were set), each seeing the clock at its due time. (Trio's `MockClock`.)"""

    def __init__(self, *, monotonic_ms: int = 1_000_000, now_ms: int = 1_700_000_000_000) -> None:
        self._monotonic_ms = monotonic_ms
        self._wall_offset_ms = now_ms - monotonic_ms
        self._due: list[tuple[int, int, _ManualTimer]] = []
        self._order = itertools.count()

    def monotonic_ms(self) -> int:
        return self._monotonic_ms

    def now_ms(self) -> int:
        return self._monotonic_ms + self._wall_offset_ms

    def step_wall(self, ms: int) -> None:
        """Step the wall reading alone by `ms`, either way (an NTP step, a wrong date set
        by hand); monotonic time and the timers do not move."""
        self._wall_offset_ms += ms

    def call_later(self, delay_ms: int, callback: Callable[[], None]) -> TimerHandle:
        timer = _ManualTimer(callback)
        heapq.heappush(self._due, (self._monotonic_ms + max(0, delay_ms), next(self._order), timer))
        return timer

    def pending(self) -> int:
        """Timers set and neither run nor cancelled."""
        return sum(1 for _due_ms, _order, timer in self._due if not timer.cancelled)

    def advance(self, ms: int) -> None:
        """Move the clock `ms` on, running every timer due by then (timers the callbacks
        set run too when they fall due within the same advance)."""
        assert ms >= 0, "a monotonic clock never goes back"
        until_ms = self._monotonic_ms + ms
        while self._due and self._due[0][0] <= until_ms:
            due_ms, _order, timer = heapq.heappop(self._due)
            if timer.cancelled:
                continue
            self._monotonic_ms = max(self._monotonic_ms, due_ms)
            timer.cancelled = True  # ran: a later cancel() does nothing
            timer.callback()
        self._monotonic_ms = until_ms

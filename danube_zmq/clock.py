"""Time as an injected dependency: logic asks a `Clock`, never `time` directly."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def monotonic_ms(self) -> int:
        """Milliseconds on a clock that never goes backwards (durations, timeouts)."""
        ...

    def now_ms(self) -> int:
        """Wall-clock milliseconds since the Unix epoch (publish times, reports)."""
        ...


class SystemClock:
    def monotonic_ms(self) -> int:
        return time.monotonic_ns() // 1_000_000

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000

"""How `danube bench` spreads its load and accounts for what it costs: producers dealt
over processes, each producer's send times offset so that many producers at one
total rate send evenly rather than all at once, and a process's CPU over a window.

Pure functions, no I/O: the runner reads clocks and psutil and passes numbers in.
"""

from __future__ import annotations

from dataclasses import dataclass

from danube_zmq.transport.errors import InvalidArgument

__all__ = ["CpuSamples", "CpuWindow", "cpu_percent", "deal", "send_offset_ns"]


def deal(producers: int, processes: int) -> list[list[int]]:
    """Producer indices dealt round-robin over `processes` processes: every index once,
    the processes' shares differing by at most one, none empty."""
    if producers < 1 or processes < 1:
        raise InvalidArgument("producers and processes must be >= 1")
    if processes > producers:
        raise InvalidArgument(f"{processes} producer processes for {producers} producers: some would have none")
    return [list(range(first, producers, processes)) for first in range(processes)]


def send_offset_ns(producer: int, producers: int, interval_ns: int) -> int:
    """When producer `producer` sends its first message, after the common start. Each
    producer sends every `interval_ns`; offsetting them by an equal share of it makes
    `producers` producers at R msg/s in all send one message every 1/R s, as independent
    services or devices do, instead of all of them in the same instant every interval."""
    if interval_ns <= 0 or producers <= 1:
        return 0
    return interval_ns * producer // producers


def cpu_percent(cpu_s: float, wall_s: float) -> float:
    """CPU time (user + system) used over a wall-clock window, as % of one core."""
    if wall_s <= 0:
        raise InvalidArgument("a CPU window needs a positive wall time")
    return round(100.0 * cpu_s / wall_s, 1)


@dataclass(frozen=True, slots=True)
class CpuWindow:
    """A process's CPU counters (user + system seconds) and the wall clock at a window's
    start; `percent` takes the same readings at its end."""

    cpu_s: float
    wall_s: float

    def percent(self, cpu_s: float, wall_s: float) -> float:
        return cpu_percent(cpu_s - self.cpu_s, wall_s - self.wall_s)

    def seconds(self, cpu_s: float) -> float:
        """CPU seconds used since the window started."""
        return cpu_s - self.cpu_s


class CpuSamples:
    """A consumer's CPU over the window from its first message to its last, read at most
    every `every_ns` instead of per message: `time.process_time()` is a system call
    (CLOCK_PROCESS_CPUTIME_ID has no vDSO path), and read per message at 10,000 msg/s
    after every wake-up it was a fifth of the bench consumer's samples. The window ends
    at the last reading, at most `every_ns` before the last message."""

    __slots__ = ("_every_ns", "_next_ns", "first", "last")

    def __init__(self, every_ns: int = 10_000_000) -> None:
        self._every_ns = every_ns
        self._next_ns = 0
        self.first: tuple[float, int] | None = None  # (cpu seconds, monotonic ns)
        self.last: tuple[float, int] | None = None

    def due(self, now_ns: int) -> bool:
        """Whether a reading at `now_ns` should be taken (the first always is)."""
        return now_ns >= self._next_ns

    def record(self, cpu_s: float, now_ns: int) -> None:
        if self.first is None:
            self.first = (cpu_s, now_ns)
        self.last = (cpu_s, now_ns)
        self._next_ns = now_ns + self._every_ns

    def percent(self) -> float | None:
        """% of one core between the first and the last reading; None before two readings
        a moment apart."""
        if self.first is None or self.last is None or self.last[1] <= self.first[1]:
            return None
        return cpu_percent(self.last[0] - self.first[0], (self.last[1] - self.first[1]) / 1e9)

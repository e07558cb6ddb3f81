"""How `danube bench` spreads its load and accounts for what it costs: producers dealt
over processes, each producer's send times offset so that many producers at one
total rate send evenly rather than all at once, and a process's CPU over a window.

Pure functions, no I/O: the runner reads clocks and psutil and passes numbers in.
"""

from __future__ import annotations

from dataclasses import dataclass

from danube_zmq.transport.errors import InvalidArgument

__all__ = ["CpuWindow", "cpu_percent", "deal", "send_offset_ns"]


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

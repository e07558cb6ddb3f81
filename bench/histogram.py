"""Latency percentiles with HdrHistogram (`hdrhistogram`, the Python port of Gil
Tene's): 1 µs to 1 hour at 3 significant digits, constant memory, mergeable across
processes through its compressed encoding."""

from __future__ import annotations

from hdrh.histogram import HdrHistogram

__all__ = ["LatencyHistogram"]

_LOWEST_US = 1
_HIGHEST_US = 3_600_000_000
_DIGITS = 3
PERCENTILES = (50.0, 90.0, 99.0, 99.9)


class LatencyHistogram:
    def __init__(self, encoded: bytes | None = None) -> None:
        self._h = HdrHistogram(_LOWEST_US, _HIGHEST_US, _DIGITS)
        if encoded:
            self._h.decode_and_add(encoded)

    def record_ns(self, ns: int) -> None:
        self._h.record_value(min(max(ns // 1000, _LOWEST_US), _HIGHEST_US))

    @property
    def count(self) -> int:
        return int(self._h.get_total_count())

    def merge(self, other: LatencyHistogram) -> None:
        self._h.add(other._h)

    def encode(self) -> bytes:
        return bytes(self._h.encode())

    def summary_us(self) -> dict[str, float | None]:
        """p50, p90, p99, p99.9 and max in µs (None when nothing was recorded)."""
        if not self.count:
            return {"p50": None, "p90": None, "p99": None, "p99.9": None, "max": None}
        out: dict[str, float | None] = {f"p{p:g}": float(self._h.get_value_at_percentile(p)) for p in PERCENTILES}
        out["max"] = float(self._h.get_max_value())
        return out

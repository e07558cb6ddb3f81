"""Latency percentiles with HdrHistogram (`hdrhistogram`, the Python port of Gil
Tene's): 1 µs to 1 hour at 3 significant digits, constant memory, mergeable across
processes through its compressed encoding.

The port records one value in ~2 µs of Python, too slow for a consumer at several
hundred thousand messages per second: `record_many_ns` maps a numpy array of values
to their HdrHistogram buckets at once (its own sub-bucket arithmetic, so nothing is
lost to rounding) and counts them in a numpy array; before the histogram is read, each
bucket that was hit goes in once with its count. `LatencyBuffer` gathers the arrays
of received batches and hands them over a few thousand values at a time."""

from __future__ import annotations

import numpy as np
from hdrh.histogram import HdrHistogram

__all__ = ["LatencyBuffer", "LatencyHistogram"]

_LOWEST_US = 1
_HIGHEST_US = 3_600_000_000
_DIGITS = 3
PERCENTILES = (50.0, 90.0, 99.0, 99.9)
_BUFFER_VALUES_MAX = 4096


class LatencyHistogram:
    def __init__(self, encoded: bytes | None = None) -> None:
        self._h = HdrHistogram(_LOWEST_US, _HIGHEST_US, _DIGITS)
        self._pending = np.zeros(self._h.counts_len, dtype=np.int64)
        if encoded:
            self._h.decode_and_add(encoded)

    def record_ns(self, ns: int) -> None:
        self._h.record_value(min(max(ns // 1000, _LOWEST_US), _HIGHEST_US))

    def record_many_ns(self, values_ns: np.ndarray) -> None:
        """`record_ns` of every value: the histogram ends up exactly as if each had been
        recorded alone."""
        self._pending += np.bincount(self._counts_index(np.asarray(values_ns, dtype=np.int64)),
                                     minlength=len(self._pending))

    def _counts_index(self, values_ns: np.ndarray) -> np.ndarray:
        """HdrHistogram's `_counts_index_for`, over an array."""
        h = self._h
        us = np.clip(values_ns // 1000, _LOWEST_US, _HIGHEST_US)
        # frexp's exponent is the bit length: exact, as values stay below 2**53.
        bit_length = np.frexp((us | h.sub_bucket_mask).astype(np.float64))[1].astype(np.int64)
        bucket = bit_length - h.unit_magnitude - (h.sub_bucket_half_count_magnitude + 1)
        sub_bucket = us >> (bucket + h.unit_magnitude)
        return ((bucket + 1) << h.sub_bucket_half_count_magnitude) + (sub_bucket - h.sub_bucket_half_count)

    def _settle(self) -> None:
        """Hand the buckets counted by `record_many_ns` to HdrHistogram: one
        `record_value` per bucket hit, with the bucket's lowest value and its count."""
        hit = np.flatnonzero(self._pending)
        for index, count in zip(hit.tolist(), self._pending[hit].tolist(), strict=True):
            self._h.record_value(self._h.get_value_from_index(index), count)
        self._pending[hit] = 0

    @property
    def count(self) -> int:
        self._settle()
        return int(self._h.get_total_count())

    def merge(self, other: LatencyHistogram) -> None:
        self._settle()
        other._settle()
        self._h.add(other._h)

    def encode(self) -> bytes:
        self._settle()
        return bytes(self._h.encode())

    def summary_us(self) -> dict[str, float | None]:
        """p50, p90, p99, p99.9 and max in µs (None when nothing was recorded)."""
        if not self.count:  # settles the pending counts too
            return {"p50": None, "p90": None, "p99": None, "p99.9": None, "max": None}
        out: dict[str, float | None] = {f"p{p:g}": float(self._h.get_value_at_percentile(p)) for p in PERCENTILES}
        out["max"] = float(self._h.get_max_value())
        return out


class LatencyBuffer:
    """Latencies on their way into a histogram, a received batch's array (or one value)
    at a time: recorded with `record_many_ns` once a few thousand are gathered (one call
    costs a fixed ~30 µs, a batch may be a handful of messages) and on `flush`, which
    must come before the histogram is read."""

    __slots__ = ("_arrays", "_count", "_histogram", "_values")

    def __init__(self, histogram: LatencyHistogram) -> None:
        self._histogram = histogram
        self._arrays: list[np.ndarray] = []
        self._values: list[int] = []
        self._count = 0

    def add(self, value_ns: int) -> None:
        self._values.append(value_ns)
        self._count += 1
        if self._count >= _BUFFER_VALUES_MAX:
            self.flush()

    def add_many(self, values_ns: np.ndarray) -> None:
        self._arrays.append(values_ns)
        self._count += len(values_ns)
        if self._count >= _BUFFER_VALUES_MAX:
            self.flush()

    def flush(self) -> None:
        if self._values:
            self._arrays.append(np.array(self._values, dtype=np.int64))
            self._values = []
        if self._arrays:
            self._histogram.record_many_ns(np.concatenate(self._arrays))
            self._arrays, self._count = [], 0

"""The side-by-side table: medians of repeated runs, and our ratio to each peer on the
workload where the two promise the same thing (non-reliable vs fire-and-forget peers,
reliable with fsync vs persistent peers)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

__all__ = ["COMPARISONS", "Row", "median_rates", "ratio_rows"]

# (our workload, the peer workload it is compared with)
COMPARISONS: tuple[tuple[str, str], ...] = (
    ("danube_non_reliable", "redis_pubsub"),
    ("danube_non_reliable", "nats_core"),
    ("danube_non_reliable", "mqtt_qos0"),
    ("danube_reliable", "redis_streams"),
    ("danube_reliable", "redis_streams_always"),
    ("danube_reliable", "nats_js"),
    ("danube_reliable", "rabbit_confirm"),
    ("danube_reliable", "mqtt_qos1"),
)


@dataclass(frozen=True, slots=True)
class Row:
    size: int
    ours: str
    ours_msg_s: float | None
    peer: str
    peer_msg_s: float | None

    @property
    def ratio(self) -> float | None:
        if not self.ours_msg_s or not self.peer_msg_s:
            return None
        return round(self.ours_msg_s / self.peer_msg_s, 2)


def median_rates(runs: list[dict[str, object]]) -> dict[tuple[str, int], float]:
    """{(workload, size): median msg/s received} over the runs (loss is reported beside)."""
    rates: dict[tuple[str, int], list[float]] = {}
    for run in runs:
        if isinstance(run.get("msg_s"), int | float):
            rates.setdefault((str(run["workload"]), int(run["size"])), []).append(float(run["msg_s"]))  # type: ignore[call-overload]
    return {key: statistics.median(values) for key, values in rates.items()}


def ratio_rows(medians: dict[tuple[str, int], float], sizes: list[int]) -> list[Row]:
    return [Row(size, ours, medians.get((ours, size)), peer, medians.get((peer, size)))
            for size in sizes for ours, peer in COMPARISONS
            if (peer, size) in medians or (ours, size) in medians]

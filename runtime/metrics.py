"""Prometheus counters the runtime itself keeps (served with the broker's, actors/metrics.py).

They live here, not in `actors/metrics.py`, so the runtime does not import the broker's
actors; the broker's `METRICS` names the same counter objects (a name registers once).
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import Counter


@dataclass(frozen=True, slots=True)
class _RuntimeMetrics:
    bad_frames: Counter
    frames_dropped: Counter
    actor_failures: Counter


RUNTIME_METRICS = _RuntimeMetrics(
    bad_frames=Counter("danube_broker_bad_frames_total", "Client frames rejected as malformed"),
    frames_dropped=Counter("danube_broker_frames_dropped_total",
                           "Frames to clients dropped because the client was gone or its queue full"),
    actor_failures=Counter("danube_actor_failures_total", "Actor handlers that raised (each restarts the actor)"),
)

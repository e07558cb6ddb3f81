"""Loaded by a broker started with this folder on PYTHONPATH (`metadata_scale.py
--gc-pauses`): every garbage collection over 30 ms is written to stderr as
`GCPAUSE gen<N> <ms> ms cpu <ms> ms`, the wall time it held the event loop and the
CPU it used (the two differ when the host's other processes take the cores)."""

import gc
import sys
import time

_started = [0.0, 0.0]


def _probe(phase: str, info: dict) -> None:
    if phase == "start":
        _started[0], _started[1] = time.perf_counter(), time.thread_time()
        return
    wall_ms = (time.perf_counter() - _started[0]) * 1000
    if wall_ms > 30:
        cpu_ms = (time.thread_time() - _started[1]) * 1000
        sys.stderr.write(f"GCPAUSE gen{info['generation']} {wall_ms:.0f} ms cpu {cpu_ms:.0f} ms\n")


gc.callbacks.append(_probe)

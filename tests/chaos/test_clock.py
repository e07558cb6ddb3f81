"""The wall-clock shim (tests/chaos/harness/clock.py) on a real running process: its wall clock
jumps when the offset file changes, its monotonic clock and its sleeps do not."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.chaos.harness.clock import Clocks, ClockUnavailable

# Prints (wall - real wall, monotonic) each time a line comes on stdin; sleeps between,
# as the broker does (Python 3.11's time.sleep is clock_nanosleep on CLOCK_MONOTONIC).
CHILD = """
import json, sys, time
for line in sys.stdin:
    time.sleep(0.01)
    print(json.dumps([time.time(), time.monotonic()]), flush=True)
"""


def clocks_or_skip(tmp_path: Path) -> Clocks:
    try:
        return Clocks(["h1", "h2"], tmp_path / "clocks")
    except ClockUnavailable as exc:
        pytest.skip(str(exc))


def test_a_running_process_sees_its_wall_clock_jump_forward_and_back_but_not_its_monotonic_clock(
        tmp_path: Path) -> None:
    """A child started with the host's environment reads time.time() +30 s, then -30 s,
    then real time again as the offset is changed while it runs; its time.monotonic()
    goes on steadily (no jump) and time.sleep works (libfaketime 0.9.10 fails it)."""
    with clocks_or_skip(tmp_path) as clocks:
        child = subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 text=True, env={**clocks.env("h1"), "PATH": "/usr/bin:/bin"})
        assert child.stdin is not None and child.stdout is not None
        try:
            seen = []
            for offset in (0.0, 30.0, -30.0, 0.0):
                clocks.set("h1", offset)
                before = time.time()
                child.stdin.write("\n")
                child.stdin.flush()
                wall, monotonic = json.loads(child.stdout.readline())
                seen.append((offset, wall - before, monotonic))
        finally:
            child.stdin.close()
            child.wait(30)
        assert child.returncode == 0
        for offset, skew, _ in seen:
            assert offset - 0.001 <= skew < offset + 20, seen  # read after `before`, within a slow machine's 20 s
        monotonic = [m for *_, m in seen]
        assert monotonic == sorted(monotonic) and monotonic[-1] - monotonic[0] < 20, seen
        assert clocks.offset("h2") == 0.0  # another host's clock is its own


def test_the_offset_applies_to_every_wall_clock_call_of_the_child(tmp_path: Path) -> None:
    """gettimeofday (via datetime.now), time() and CLOCK_REALTIME_COARSE (Linux clock id 5) follow the same
    offset, so no part of a process reads the real wall clock beside the shifted one."""
    code = ("import ctypes, datetime, time; libc = ctypes.CDLL(None);"
            "print(datetime.datetime.now().timestamp() - time.time(), libc.time(None) - time.time(),"
            " time.clock_gettime(5) - time.time())")
    with clocks_or_skip(tmp_path) as clocks:
        clocks.set("h2", -30.0)
        real = time.time()
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                             env={**clocks.env("h2"), "PATH": "/usr/bin:/bin"}, check=True).stdout.split()
        shifted = subprocess.run([sys.executable, "-c", "import time; print(time.time())"], capture_output=True,
                                 text=True, timeout=60, env=clocks.env("h2"), check=True).stdout
    assert all(abs(float(d)) < 1.5 for d in out), out
    assert -30.5 < float(shifted) - real < -29.0 + 20

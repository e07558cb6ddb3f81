"""How `danube bench` spreads producers over processes and over time, and how it turns
CPU counters into a share of a core (loadgen/spread.py)."""

from __future__ import annotations

from itertools import pairwise

import pytest
from hypothesis import given
from hypothesis import strategies as st

from danube_zmq.loadgen.runner import BenchConfig
from danube_zmq.loadgen.spread import CpuSamples, CpuWindow, cpu_percent, deal, send_offset_ns
from danube_zmq.transport.errors import InvalidArgument


@given(st.integers(1, 500), st.integers(1, 64))
def test_dealing_gives_every_producer_to_exactly_one_process_evenly(producers: int, processes: int) -> None:
    """Every producer index lands in one share, no process is left empty, and the shares
    differ by at most one: no process carries twice the load of another."""
    if processes > producers:
        with pytest.raises(InvalidArgument, match="some would have none"):
            deal(producers, processes)
        return
    shares = deal(producers, processes)
    assert len(shares) == processes
    assert sorted(i for share in shares for i in share) == list(range(producers))
    sizes = [len(share) for share in shares]
    assert min(sizes) >= 1 and max(sizes) - min(sizes) <= 1


@given(st.integers(1, 1000), st.integers(1, 10**9))
def test_offsets_spread_the_producers_evenly_over_one_interval(producers: int, interval_ns: int) -> None:
    """Producer i starts i/N of an interval after the common start: the offsets lie in
    [0, interval), never decrease with i, and consecutive ones are at most one share
    apart, so N producers at R msg/s in all send one message every ~1/R s rather than N
    in the same instant."""
    offsets = [send_offset_ns(i, producers, interval_ns) for i in range(producers)]
    assert offsets[0] == 0
    assert all(0 <= offset < interval_ns for offset in offsets)
    assert offsets == sorted(offsets)
    share = interval_ns / producers
    assert all(b - a <= share + 1 for a, b in pairwise(offsets))


def test_flat_out_or_single_producers_start_at_once() -> None:
    """With no rate (interval 0) or one producer there is nothing to spread."""
    assert send_offset_ns(3, 10, 0) == 0
    assert send_offset_ns(0, 1, 1_000_000) == 0


def test_cpu_percent_is_cpu_time_over_wall_time_of_one_core() -> None:
    """1.5 s of CPU in 3 s of wall time is half a core; 4 s in 2 s is two cores (a
    process with threads can pass 100%); a window with no wall time is refused."""
    assert cpu_percent(1.5, 3.0) == 50.0
    assert cpu_percent(4.0, 2.0) == 200.0
    window = CpuWindow(cpu_s=10.0, wall_s=100.0)
    assert window.percent(10.25, 101.0) == 25.0 and window.seconds(10.25) == 0.25
    with pytest.raises(InvalidArgument, match="positive wall time"):
        cpu_percent(1.0, 0.0)


def test_cpu_samples_read_the_clock_at_most_once_an_interval() -> None:
    """The first message always takes a reading; later ones only once `every_ns` has
    passed; the share of a core is over the first and the last reading."""
    samples = CpuSamples(every_ns=10_000_000)
    assert samples.percent() is None
    readings = 0
    for now_ns in range(0, 100_000_001, 1_000_000):  # a message a millisecond for 100 ms
        if samples.due(now_ns):
            readings += 1
            samples.record(now_ns / 4e9, now_ns)  # a quarter of a core
    assert readings == 11 and samples.first == (0.0, 0) and samples.last == (0.025, 100_000_000)
    assert samples.percent() == 25.0
    lone = CpuSamples()
    lone.record(1.0, 5)
    assert lone.percent() is None  # one reading is no window


def test_more_producer_processes_than_producers_is_refused() -> None:
    """A process with no producer would measure nothing: the config says so up front."""
    with pytest.raises(InvalidArgument, match="producer_processes must be <= producers"):
        BenchConfig(url="tcp://127.0.0.1:1", topic="/default/t", count=10, producers=2, producer_processes=3)
    assert BenchConfig(url="tcp://127.0.0.1:1", topic="/default/t", count=10, producers=4,
                       producer_processes=2).producer_processes == 2

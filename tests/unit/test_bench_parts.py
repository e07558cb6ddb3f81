"""The measuring parts of `danube bench`: stamps, loss/duplicate accounting, the
latency histogram and the run's configuration."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from danube_zmq.bench.accounting import Delivery
from danube_zmq.bench.histogram import LatencyHistogram
from danube_zmq.bench.runner import BenchConfig
from danube_zmq.bench.stamp import STAMP_BYTES, Stamper, read_stamp
from danube_zmq.transport.errors import InvalidArgument


def test_stamps_round_trip_at_the_requested_size() -> None:
    payload = Stamper(3, 100).payload(41, 123_456_789)
    assert len(payload) == 100 and read_stamp(payload) == (3, 41, 123_456_789)
    assert len(Stamper(0, STAMP_BYTES).payload(0, 0)) == STAMP_BYTES
    with pytest.raises(InvalidArgument, match="at least 20 bytes"):
        Stamper(0, 19)
    with pytest.raises(InvalidArgument, match="carries no benchmark stamp"):
        read_stamp(b"short")


@given(st.dictionaries(st.integers(0, 5), st.integers(0, 3000), max_size=4), st.randoms(use_true_random=False))
def test_loss_and_duplicates_are_exact_whatever_the_order(sent: dict[int, int], rng: random.Random) -> None:
    arrivals, lost, duplicates = [], 0, 0
    for producer, count in sent.items():
        for sequence in range(count):
            fate = rng.random()
            if fate < 0.1:
                lost += 1
                continue
            arrivals.append((producer, sequence))
            if fate > 0.95:
                arrivals.append((producer, sequence))
                duplicates += 1
    rng.shuffle(arrivals)
    delivery = Delivery()
    for producer, sequence in arrivals:
        delivery.record(producer, sequence)
    assert delivery.lost(sent) == lost
    assert delivery.duplicates == duplicates and delivery.received == len(arrivals)
    assert delivery.distinct() == len(arrivals) - duplicates


def test_implausible_stamps_are_counted_not_stored() -> None:
    delivery = Delivery()
    assert not delivery.record(1, 1 << 50)
    assert delivery.unexpected == 1 and delivery.received == 0


def test_histogram_percentiles_merge_across_processes() -> None:
    first, second = LatencyHistogram(), LatencyHistogram()
    for us in range(1, 501):
        first.record_ns(us * 1000)
    for us in range(501, 1001):
        second.record_ns(us * 1000)
    merged = LatencyHistogram(first.encode())
    merged.merge(LatencyHistogram(second.encode()))
    summary = merged.summary_us()
    assert merged.count == 1000 and summary["p50"] == 500 and summary["p99"] == 990 and summary["max"] == 1000
    assert LatencyHistogram().summary_us()["p50"] is None


def test_configuration_is_checked() -> None:
    config = BenchConfig(url="tcp://x:1", topic="/default/t", count=10, producers=3, topics=2)
    assert [config.quota(i) for i in range(3)] == [4, 3, 3]
    assert config.topic_names() == ["/default/t-0", "/default/t-1"]
    assert BenchConfig(url="u", topic="/default/t", duration_s=1).quota(0) is None
    for bad in ({}, {"count": 1, "duration_s": 1.0}, {"count": 0}, {"count": 1, "producers": 0}):
        with pytest.raises(InvalidArgument):
            BenchConfig(url="u", topic="/default/t", **bad)

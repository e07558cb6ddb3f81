"""The measuring parts of `danube bench`: stamps, loss/duplicate accounting, the
latency histogram and the run's configuration."""

from __future__ import annotations

import random
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from danube_zmq.loadgen import runner
from danube_zmq.loadgen.accounting import Delivery
from danube_zmq.loadgen.histogram import LatencyBuffer, LatencyHistogram
from danube_zmq.loadgen.runner import BenchConfig
from danube_zmq.loadgen.stamp import STAMP_BYTES, Stamper, read_stamp, read_stamps
from danube_zmq.transport.errors import InvalidArgument


def test_stamps_round_trip_at_the_requested_size() -> None:
    payload = Stamper(3, 100).payload(41, 123_456_789)
    assert len(payload) == 100 and read_stamp(payload) == (3, 41, 123_456_789)
    assert len(Stamper(0, STAMP_BYTES).payload(0, 0)) == STAMP_BYTES
    with pytest.raises(InvalidArgument, match="at least 20 bytes"):
        Stamper(0, 19)
    with pytest.raises(InvalidArgument, match="carries no benchmark stamp"):
        read_stamp(b"short")


def test_batches_of_stamps_read_like_single_ones_whatever_their_sizes() -> None:
    """One size (the joined-records path), mixed sizes (the per-message path) and an
    empty batch give what `read_stamp` gives message by message; a short payload is
    an error naming how many were short, and the others can then be read alone."""
    same = [Stamper(2, 100).payload(i, 10**15 + i) for i in range(50)]
    mixed = same[:10] + [Stamper(7, STAMP_BYTES).payload(3, 5), Stamper(1, 1024).payload(2**40, 2**62)] + same[10:]
    for batch in (same, mixed, same[:1]):
        stamps = read_stamps(batch)
        assert len(stamps) == len(batch)
        assert list(zip(stamps.producer.tolist(), stamps.sequence.tolist(), stamps.sent_ns.tolist(),
                        strict=True)) == [read_stamp(p) for p in batch]
    assert len(read_stamps([])) == 0
    with pytest.raises(InvalidArgument, match="2 of 52 messages carry no benchmark stamp"):
        read_stamps([*same, b"short", b"x" * (STAMP_BYTES - 1)])


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


arrival = st.tuples(st.integers(0, 3), st.one_of(st.integers(0, 5000), st.sampled_from([-3, -1, 2**31, 2**40])))


@given(st.lists(arrival, max_size=400), st.lists(st.integers(1, 50), min_size=1), st.randoms(use_true_random=False))
def test_record_many_accounts_like_record_one_by_one(arrivals: list[tuple[int, int]], sizes: list[int],
                                                     rng: random.Random) -> None:
    """Arrivals (repeats, out-of-range stamps, any order) recorded one by one, and in
    batches of random sizes split by producer, give the same duplicates per batch, the
    same counts and the same losses."""
    arrivals = arrivals + arrivals[::3]
    rng.shuffle(arrivals)
    one_by_one, batched = Delivery(), Delivery()
    start = 0
    for size in sizes * (len(arrivals) // len(sizes) + 1):
        chunk, start = arrivals[start:start + size], start + size
        for producer in {p for p, _ in chunk}:
            sequences = [s for p, s in chunk if p == producer]
            expected = sum(one_by_one.record(producer, s) for s in sequences)
            assert batched.record_many(producer, np.array(sequences, dtype=np.int64)) == expected
    sent = {producer: 6000 for producer in range(4)}
    assert (batched.received, batched.duplicates, batched.unexpected) == \
        (one_by_one.received, one_by_one.duplicates, one_by_one.unexpected) == \
        (sum(0 <= s < 2**31 for _, s in arrivals), one_by_one.duplicates, sum(not 0 <= s < 2**31 for _, s in arrivals))
    assert batched.distinct() == one_by_one.distinct() and batched.lost(sent) == one_by_one.lost(sent)


def test_record_many_counts_duplicates_inside_one_batch_and_against_earlier_ones() -> None:
    delivery = Delivery()
    assert delivery.record_many(0, np.array([5, 5, 5, 6, 7])) == 2
    assert delivery.record_many(0, np.array([7, 8, 8, 9])) == 2  # 7 seen before, 8 twice
    assert delivery.record_many(0, np.array([], dtype=np.int64)) == 0
    assert delivery.record_many(0, np.array([-1, 2**31, 9])) == 1
    assert (delivery.received, delivery.duplicates, delivery.unexpected) == (10, 5, 2)
    assert delivery.distinct() == 5 and delivery.lost({0: 10}) == 5  # 0..4 never came


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


@given(st.lists(st.one_of(st.integers(-10, 5_000_000), st.integers(0, 10**13)), min_size=1, max_size=300))
def test_histogram_of_a_batch_is_the_histogram_of_its_values_one_by_one(values_ns: list[int]) -> None:
    """`record_many_ns` rounds each value to its HdrHistogram bucket: the percentiles
    are those of recording each value alone, and within the histogram's precision (3
    significant digits) of the exact value at each percentile's rank."""
    one_by_one, batched = LatencyHistogram(), LatencyHistogram()
    for ns in values_ns:
        one_by_one.record_ns(ns)
    half = len(values_ns) // 2
    batched.record_many_ns(np.array(values_ns[:half], dtype=np.int64))
    batched.record_many_ns(np.array(values_ns[half:], dtype=np.int64))
    summary = batched.summary_us()
    assert summary == one_by_one.summary_us() and batched.count == len(values_ns)
    exact = sorted(min(max(ns // 1000, 1), 3_600_000_000) for ns in values_ns)
    for percentile in (50.0, 90.0, 99.0, 99.9):
        rank = max(int(percentile * len(exact) / 100 + 0.5), 1)
        value = summary[f"p{percentile:g}"]
        assert value is not None and exact[rank - 1] <= value <= exact[rank - 1] * 1.001 + 1


def test_latency_buffer_hands_every_value_over() -> None:
    histogram = LatencyHistogram()
    buffer = LatencyBuffer(histogram)
    for first in range(1, 2001, 50):  # below 2048 µs every µs has a bucket of its own
        buffer.add_many(np.arange(first, first + 50, dtype=np.int64) * 1000)
    buffer.add_many(np.arange(1, 2001, dtype=np.int64) * 1000)
    buffer.flush()
    summary = histogram.summary_us()
    assert histogram.count == 4000 and summary["p50"] == 1000 and summary["max"] == 2000


def test_latency_buffer_takes_single_values_beside_arrays() -> None:
    histogram = LatencyHistogram()
    buffer = LatencyBuffer(histogram)
    for first in range(1, 2001, 50):
        buffer.add_many(np.arange(first, first + 25, dtype=np.int64) * 1000)
        for value in range(first + 25, first + 50):
            buffer.add(value * 1000)
    buffer.flush()
    buffer.flush()  # nothing left: no second recording
    summary = histogram.summary_us()
    assert histogram.count == 2000 and summary["p50"] == 1000 and summary["max"] == 2000


stamped = st.tuples(st.integers(0, 3), st.one_of(st.integers(0, 3000), st.sampled_from([2**31, 2**63 + 5])),
                    st.integers(0, 10**9), st.sampled_from([20, 20, 100, 7]))


@given(st.lists(st.lists(stamped, max_size=12), max_size=30))
def test_small_batches_are_accounted_as_the_array_path_accounts_them(batches: list[list[tuple[int, int, int, int]]],
                                                                     ) -> None:
    """`_account` reads a batch of a few messages one by one (many slow producers) and a
    bigger one as arrays: the same batches through either give the same counts,
    duplicates, unexpected stamps and latencies; a payload too short for a stamp is an
    error either way."""
    def account(small_batch: int) -> tuple[Delivery, LatencyHistogram, list[str]]:
        delivery, histogram, errors = Delivery(), LatencyHistogram(), []
        latencies = LatencyBuffer(histogram)
        original, runner._SMALL_BATCH = runner._SMALL_BATCH, small_batch
        try:
            for batch in batches:
                messages = [SimpleNamespace(payload=Stamper(p, max(size, STAMP_BYTES)).payload(s, sent)[:size])
                            for p, s, sent, size in batch]
                runner._account(messages, delivery, errors, latencies, 10**9 + 1)
        finally:
            runner._SMALL_BATCH = original
        latencies.flush()
        return delivery, histogram, errors

    (small, small_latencies, small_errors), (arrays, array_latencies, array_errors) = account(100), account(0)
    assert (small.received, small.duplicates, small.unexpected, small.distinct()) == \
        (arrays.received, arrays.duplicates, arrays.unexpected, arrays.distinct())
    assert small_latencies.count == array_latencies.count
    assert small_latencies.summary_us() == array_latencies.summary_us()
    short = any(size < STAMP_BYTES for batch in batches for *_, size in batch)
    assert bool(small_errors) == bool(array_errors) == short


def test_configuration_is_checked() -> None:
    config = BenchConfig(url="tcp://x:1", topic="/default/t", count=10, producers=3, topics=2)
    assert [config.quota(i) for i in range(3)] == [4, 3, 3]
    assert config.topic_names() == ["/default/t-0", "/default/t-1"]
    assert BenchConfig(url="u", topic="/default/t", duration_s=1).quota(0) is None
    assert config.subscription_names() == ["bench"]
    assert BenchConfig(url="u", topic="/default/t", count=1, subscriptions=3).subscription_names() == \
        ["bench-0", "bench-1", "bench-2"]
    for bad in ({}, {"count": 1, "duration_s": 1.0}, {"count": 0}, {"count": 1, "producers": 0},
                {"count": 1, "subscriptions": 0}):
        with pytest.raises(InvalidArgument):
            BenchConfig(url="u", topic="/default/t", **bad)

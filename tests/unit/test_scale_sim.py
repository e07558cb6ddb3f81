"""The scale simulation (benchmarks/scale_sim.py) in its small mode: its accounting of
Raft writes against workloads whose rate can be computed by hand, and the pure cores
it drives (placement, rebalancing, the state machine's bounds)."""

from __future__ import annotations

import importlib.util
import math
import random
import sys

import pytest

from danube_zmq.consensus.state_machine import Batch, KeyValue, encode_command
from tests.paths import ROOT

_PATH = ROOT / "benchmarks" / "scale_sim.py"
_spec = importlib.util.spec_from_file_location("scale_sim", _PATH)
assert _spec is not None and _spec.loader is not None
sim = importlib.util.module_from_spec(_spec)
sys.modules["scale_sim"] = sim
_spec.loader.exec_module(sim)


def _uniform(scale, rate: float):
    """A workload where every topic sends `rate` messages/s with equal subscriptions."""
    per_topic = scale.subscriptions // scale.topics
    topics = [f"/ns/t-{i:05d}" for i in range(scale.topics)]
    return sim.Workload(topics=topics, rates=[rate] * scale.topics, subscriptions=[per_topic] * scale.topics)


def _round_robin(scale, work):
    return {t: 1 + i % scale.brokers for i, t in enumerate(work.topics)}


def test_busy_cursors_cost_one_entry_per_broker_per_flush_and_one_key_per_subscription():
    """Every topic busy (a message in every interval, almost surely): each broker writes
    one transaction per flush interval holding every one of its cursors, so entries/s =
    brokers x 10 and keys/s = subscriptions x 10, and the bytes are the encoded entries'."""
    scale = sim.Scale.small(brokers=4, topics=40, subscriptions=400, store=False)
    work = _uniform(scale, rate=10_000.0)  # 1 - exp(-1000) == 1
    assignments = _round_robin(scale, work)
    rng = random.Random(7)
    flushes = sim.cursor_flushes(scale, work, assignments, rng)
    assert sorted(len(b.puts) for b in flushes.values()) == [100] * 4
    sources = sim.raft_writes(scale, work, assignments, flushes, moves_per_hour=0, rng=rng)
    cursors = sources["cursors"]
    assert cursors.entries_s == pytest.approx(4 * 10)
    assert cursors.keys_s == pytest.approx(400 * 10)
    assert cursors.bytes_s == pytest.approx(10 * sum(sim.entry_bytes(encode_command(b)) for b in flushes.values()))
    assert sources["leases"].entries_s == pytest.approx(4 / 2.0)  # a renewal every 2 s (TTL 6 s / 3)
    assert sources["load_reports"].entries_s == pytest.approx(4 / 30.0)


def test_idle_topics_write_no_cursors_and_reserve_at_the_minimum_block():
    """A topic at 1 message/s moves its cursors in about 1 interval in 10.5
    (1 - exp(-0.1)), and reserves offsets every 2,048 messages (half the 4,096 block)."""
    scale = sim.Scale.small(brokers=2, topics=200, subscriptions=2_000, store=False)
    work = _uniform(scale, rate=1.0)
    assignments = _round_robin(scale, work)
    flushes = sim.cursor_flushes(scale, work, assignments, random.Random(3))
    keys = sum(len(b.puts) for b in flushes.values())
    expected = 2_000 * (1 - math.exp(-0.1))
    assert abs(keys - expected) < 5 * math.sqrt(expected)
    sources = sim.raft_writes(scale, work, assignments, flushes, moves_per_hour=0, rng=random.Random(3))
    assert sources["offset_reservations"].entries_s == pytest.approx(200 * 1.0 / 2048)
    assert sim.reserve_block(1.0) == 4096 and sim.reserve_block(5_000.0) == 16_384


def test_a_flush_larger_than_batch_keys_max_is_rejected_by_the_default_state_machine():
    """The apply measurement feeds the real state machine: a broker flushing more than
    4,096 changed cursors at once has its whole transaction rejected (BATCH_TOO_LARGE)."""
    big = Batch(puts=[KeyValue(key=f"/topics/ns/t/subscriptions/s{i}", value=b"c") for i in range(4_097)], deletes=[])
    small = Batch(puts=[KeyValue(key=f"/topics/ns/u/subscriptions/s{i}", value=b"c") for i in range(10)], deletes=[])
    cost = sim.apply_cost({1: big, 2: small}, keys_limit=5_000)
    assert cost["keys"] == 4_107 and cost["largest_flush_keys"] == 4_097
    assert cost["largest_flush_with_default_bounds"] == "rejected: BATCH_TOO_LARGE"
    assert sim.apply_cost({2: small}, keys_limit=10)["largest_flush_with_default_bounds"] == "applied"


def test_small_run_places_every_topic_and_accounts_for_every_source():
    """The whole small run: every topic placed, the drain moves every topic of the
    drained broker, rebalancing stays within its hourly cap, the totals are the sum of
    the sources, and the store holds a key per topic record and per cursor."""
    scale = sim.Scale.small(seed=5)
    result = sim.run(scale)
    low, high = result["placement"]["topics_per_broker_min_max"]
    assert low * scale.brokers <= scale.topics <= high * scale.brokers and high - low <= 1
    balancing = result["rebalancing"]
    assert balancing["drain_moves"] > 0
    assert balancing["moves_per_hour_max"] <= balancing["policy"]["max_moves_per_hour"]
    sources = result["raft_writes"]
    assert result["raft_total"]["entries_s"] == pytest.approx(sum(s["entries_s"] for s in sources.values()), abs=0.1)
    assert result["raft_total_cursors_out"]["keys_s"] == pytest.approx(
        result["raft_total"]["keys_s"] - sources["cursors"]["keys_s"], abs=0.2)
    # 4 records per topic (topic, assignment, state, producer) + one per cursor + 3 per broker.
    assert result["store"]["keys"] == 4 * scale.topics + scale.subscriptions + 3 * scale.brokers


def test_same_seed_same_figures():
    """A run replays from its seed: the accounted write rates are identical."""
    scale = sim.Scale.small(topics=500, subscriptions=3_000, hours=1.0, store=False, seed=11)
    assert sim.run(scale)["raft_writes"] == sim.run(scale)["raft_writes"]

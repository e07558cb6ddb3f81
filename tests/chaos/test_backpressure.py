"""The back-pressure scenarios P1-P3 (tests/chaos/harness/scenarios.py) on 3 namespace hosts, each
judged by the checkers (lost 0, unexpected 0, in order, offsets consistent) and by the
topic owner's resident memory, sampled from /proc during the pressure (`chaos`, 3
seeds each; 30 s of pressure here (P3: 10 s), 60 s with `run P1 --seed S --hold-s 60`).

Each run prints its JSON row (RSS start / peak / growth in MiB, rates, counts); a
failing seed replays with `python -m tests.chaos.harness.scenarios run P1 --seed S`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from danube_zmq.config.broker_config import LimitsSection
from tests.chaos.test_scenarios import run

HOLD_S = 30.0
FLOOD_HOLD_S = 10.0  # ~18,000 msg/s get acknowledged here: 10 s is already ~200k messages to check
SEEDS = (1, 2, 3)
MIB = 1024 * 1024


def assert_nothing_lost(report: Any, row: dict[str, Any]) -> str:
    replay = f"replay: python -m tests.chaos.harness.scenarios run {row['scenario']} --seed {row['seed']}"
    assert report.lost == 0 and report.unexpected == 0, (replay, report.findings)
    assert report.nonmonotonic == 0, (replay, report.findings)
    assert report.inconsistent_offsets == 0 and report.offset_gaps_unexplained == 0, (replay, report.findings)
    assert report.valid, (replay, report.findings)
    return replay


@pytest.mark.chaos
@pytest.mark.timeout(900)
@pytest.mark.parametrize("seed", SEEDS)
def test_p1_a_slow_consumer_backlog_stays_in_the_wal_not_in_memory(seed: int, tmp_path: Path) -> None:
    """P1: a subscription acknowledging 10 msg/s beside a fast one, under a 2,000 msg/s x
    1 KiB reliable stream: the owner's RSS grows less than 50 MiB while the slow backlog
    grows by tens of thousands of messages, the fast subscription delivers within 10% of
    what the producer gets acknowledged, and once the slow consumer speeds up every
    acknowledged message reaches both subscriptions."""
    report, row = run("P1", seed, tmp_path, hold_s=HOLD_S)
    replay = assert_nothing_lost(report, row)
    notes = row["notes"]
    assert notes["slow_backlog"] > 10 * notes["slow_delivered"], (replay, notes)  # a backlog did build
    assert notes["rss_growth_mib"] < 50, (replay, notes)
    assert notes["fast_ratio"] >= 0.9, (replay, notes)


@pytest.mark.chaos
@pytest.mark.timeout(900)
@pytest.mark.parametrize("seed", SEEDS)
def test_p2_a_stopped_shared_consumer_costs_no_memory_and_its_messages_go_to_the_other(
        seed: int, tmp_path: Path) -> None:
    """P2: one of two Shared consumers is stopped (SIGSTOP) for 30 s under the same
    stream: the owner's RSS grows less than 50 MiB, what the stopped one held
    unacknowledged is redelivered to the other consumer after the ack timeout (5 s
    here), and nothing acknowledged is lost on any subscription."""
    report, row = run("P2", seed, tmp_path, hold_s=HOLD_S)
    replay = assert_nothing_lost(report, row)
    notes = row["notes"]
    assert notes["rss_growth_mib"] < 50, (replay, notes)
    assert notes["redelivered_to_other"] > 0, (replay, notes)


@pytest.mark.chaos
@pytest.mark.timeout(900)
@pytest.mark.parametrize("seed", SEEDS)
def test_p3_a_producer_flood_is_held_back_within_the_memory_budget(seed: int, tmp_path: Path) -> None:
    """P3: 4 reliable producers each offering 20,000 msg/s x 1 KiB to one topic for 10 s
    (past what this machine stores): they are held back (acknowledged well below offered),
    the owner's RSS stays below its inbound budget (`limits.inbound_bytes_max`) + 100
    MiB, and every acknowledged message is consumed."""
    report, row = run("P3", seed, tmp_path, hold_s=FLOOD_HOLD_S)
    replay = assert_nothing_lost(report, row)
    notes = row["notes"]
    budget_mib = LimitsSection().inbound_bytes_max / MIB + 100
    assert notes["rss_peak_mib"] < budget_mib, (replay, notes)
    assert notes["acked_rate"] < notes["offered_rate"], (replay, notes)

"""Frame fuzzing of a real broker's client and admin ports (reliability.md S1-S3): the
broker ends serving, no actor failed, its RSS stayed within budget.

The seed is $DANUBE_FUZZ_SEED when set, else a fresh one; a failure prints the command
that replays it. Loopback only: no namespaces needed (the fuzzer is one peer, and what
it tests is the broker's parsing and bounds, not the network).
"""

from __future__ import annotations

import json
import os
import random

import pytest

from danube_zmq.chaos.fuzz import RSS_BUDGET_BYTES, Report, run


def _seed() -> int:
    return int(os.environ.get("DANUBE_FUZZ_SEED") or random.SystemRandom().randrange(2**32))


def _assert_passed(report: Report) -> None:
    print(json.dumps(report.to_json(), indent=2))  # the figures, shown with -s or on failure
    assert report.ok, (f"{report.problems}; replay: python -m danube_zmq.chaos.fuzz --seed {report.seed} "
                       f"--seconds {report.seconds:g}")
    # The run did what it claims: bad frames were answered with errors and connections
    # were cut (oversize frames), and the bystander's acknowledged messages were consumed.
    assert report.errors_answered and report.connections_cut > 0
    assert report.bystander_acked > 0 and report.bystander_consumed == report.bystander_acked
    # The attacks of issue 37 were made: connections with the bystander's routing id, and
    # schema definitions built to stall or bloat the registry.
    assert report.takeovers_tried > 0 and report.by_kind["hostile_schema"] > 0
    assert report.rss_peak_bytes <= report.rss_start_bytes + RSS_BUDGET_BYTES


@pytest.mark.chaos_smoke
@pytest.mark.timeout(300)  # 60 s of fuzzing, a broker start and the checks (up to 30 s each)
def test_sixty_seconds_of_bad_frames_leave_the_broker_serving_within_its_memory_budget() -> None:
    """60 s of generated frames (valid, mutated, truncated, wrong tags, msgpack bombs,
    oversize, too many parts, hostile schema definitions) over 4 client and 2 admin
    connections, with a producer sending valid batches alongside and other connections
    taking its routing id now and then (never answered for it): afterwards a produce/consume round trip finds every
    acknowledged message, the admin port answers, no actor failed
    (danube_actor_failures_total = 0, no handler failure in the log) and RSS grew by
    less than 64 MiB."""
    _assert_passed(run(_seed(), 60.0))


@pytest.mark.chaos
@pytest.mark.timeout(900)
def test_ten_minutes_of_bad_frames_leave_the_broker_serving_within_its_memory_budget() -> None:
    """The smoke's checks after 10 minutes of fuzzing (memory that grows slowly, rare
    frame shapes)."""
    _assert_passed(run(_seed(), 600.0))

"""Cluster time (consensus/cluster_time.py): the leader's monotonic reckoning of TTL
time, restarted at the log's time on election; wall readings only seed a new cluster."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from danube_zmq.consensus.cluster_time import ClusterTime

WALL = 1_700_000_000_000


def test_a_leader_counts_on_its_monotonic_clock_and_ignores_its_wall() -> None:
    """From the log's time at election, the leader's time moves with its monotonic
    reading only: a wall reading 30 s ahead (or back) later changes nothing."""
    time = ClusterTime()
    assert time.lead(term=3, log_time_ms=500_000, monotonic_ms=10, wall_ms=WALL) == 500_000
    assert time.lead(term=3, log_time_ms=500_000, monotonic_ms=2_010, wall_ms=WALL + 30_000) == 502_000
    assert time.lead(term=3, log_time_ms=500_000, monotonic_ms=3_010, wall_ms=WALL - 30_000) == 503_000


def test_a_new_term_restarts_at_the_log_time_and_a_new_cluster_at_the_wall() -> None:
    """A node that led before and leads again restarts at the log's time (time stands
    still over the election); with no stamp in the log yet, the wall reading seeds it."""
    time = ClusterTime()
    assert time.lead(term=1, log_time_ms=0, monotonic_ms=0, wall_ms=WALL) == WALL
    assert time.lead(term=1, log_time_ms=WALL, monotonic_ms=9_000, wall_ms=0) == WALL + 9_000
    assert time.lead(term=4, log_time_ms=WALL + 5_000, monotonic_ms=9_000, wall_ms=0) == WALL + 5_000


def test_a_follower_reckons_from_the_stamps_it_applies() -> None:
    """No reckoning before a stamp; then the latest stamp plus the monotonic time since;
    a stamp behind the reckoning (replication delay) does not pull it back."""
    time = ClusterTime()
    assert time.now_ms(5) is None
    time.observe(100_000, monotonic_ms=1_000)
    assert time.now_ms(1_500) == 100_500
    time.observe(100_200, monotonic_ms=1_600)
    assert time.now_ms(1_600) == 100_600
    time.observe(101_000, monotonic_ms=1_700)
    assert time.now_ms(1_700) == 101_000


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["lead", "observe", "now"]), st.integers(1, 5), st.integers(0, 10_000),
                          st.integers(0, 2_000)), max_size=30))
def test_within_a_term_cluster_time_never_goes_back(steps: list[tuple[str, int, int, int]]) -> None:
    """Whatever the stamps applied and the monotonic readings (which only grow), a
    leader's time within one term never decreases, nor a follower's reckoning."""
    time = ClusterTime()
    monotonic, log_time, last, term = 0, 0, None, 0
    for op, new_term, stamp, elapsed in steps:
        monotonic += elapsed
        log_time = max(log_time, stamp)
        if op == "lead":
            restarted = new_term != term
            term = new_term
            now = time.lead(term=term, log_time_ms=log_time, monotonic_ms=monotonic, wall_ms=WALL)
            assert now >= log_time
            if not restarted and last is not None:
                assert now >= last
            last = now
        elif op == "observe":
            time.observe(log_time, monotonic)
            now = time.now_ms(monotonic)
            assert now is None or now >= log_time
            if last is not None:
                assert now is not None and now >= last
            last = now
        else:
            now = time.now_ms(monotonic)
            if last is not None:
                assert now is not None and now >= last
                last = now

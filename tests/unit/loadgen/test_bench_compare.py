"""The side-by-side table: medians over repeated runs and our ratio to each peer."""

from __future__ import annotations

from danube_zmq.loadgen.compare import median_rates, ratio_rows


def test_medians_and_ratios() -> None:
    runs = [
        {"workload": "danube_non_reliable", "size": 100, "msg_s": v, "lost": 0} for v in (90_000, 110_000, 100_000)
    ] + [
        {"workload": "redis_pubsub", "size": 100, "msg_s": v, "lost": 0} for v in (50_000, 40_000, 60_000)
    ] + [
        {"workload": "danube_reliable", "size": 100, "msg_s": 30_000, "lost": 0},
        {"workload": "nats_js", "size": 1024, "msg_s": 10_000, "lost": 0},
        {"workload": "nats_core", "size": 100, "msg_s": None, "lost": 100},  # a failed run has no rate
    ]
    medians = median_rates(runs)
    assert medians[("danube_non_reliable", 100)] == 100_000 and medians[("redis_pubsub", 100)] == 50_000
    rows = {(r.size, r.ours, r.peer): r for r in ratio_rows(medians, [100, 1024])}
    assert rows[(100, "danube_non_reliable", "redis_pubsub")].ratio == 2.0
    assert rows[(100, "danube_non_reliable", "nats_core")].ratio is None  # the peer has no figure
    assert rows[(1024, "danube_reliable", "nats_js")].ours_msg_s is None
    assert (100, "danube_reliable", "nats_js") in rows and (1024, "danube_non_reliable", "redis_pubsub") not in rows

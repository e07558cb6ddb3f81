"""benchmarks/client_cpu.py's own processes against a real broker, briefly: each mode
delivers and reports a CPU figure per message (the benchmark's numbers are only worth
reading if its processes work). Paced, every message arrives; bulk on a non-reliable
topic may drop some when the consumer falls behind, as the topic allows."""

from __future__ import annotations

import sys

from tests.paths import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))

import client_cpu


def test_both_modes_deliver_and_report_cpu(broker) -> None:
    for mode, count in (("paced", 400), ("bulk", 2000)):
        produced, consumed = client_cpu.run_pair(sys.executable, "danube", broker.url, f"/default/cpu-{mode}",
                                                 mode, count, 2000.0)
        assert produced["sent"] == count, (mode, produced)
        assert (consumed["received"] == count) if mode == "paced" else (0 < consumed["received"] <= count), consumed
        assert produced["producer_us_per_msg"] > 0 and consumed["consumer_us_per_msg"] > 0

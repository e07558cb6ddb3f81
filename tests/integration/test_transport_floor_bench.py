"""benchmarks/transport_floor.py's own processes, briefly: on libzmq and on plain TCP
every message reaches the consumer, every receipt the producer, and each process
reports its CPU (the benchmark's figures are only worth reading if its shape works)."""

from __future__ import annotations

import sys

from tests.paths import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))

import transport_floor


def test_both_transports_deliver_every_message_and_receipt_and_report_cpu() -> None:
    for kind in ("zmq", "tcp"):
        result = transport_floor.run_once(kind, rate=2000.0, seconds=0.3, size=100)
        assert result["received"] == result["sent"] == 600, (kind, result)
        assert all(result[f"{role}_us"] > 0 for role in ("producer", "relay", "consumer")), (kind, result)
        if kind == "tcp":  # no libzmq I/O thread (zmq's are counted in 10 ms ticks: maybe none in 0.3 s)
            assert result["producer_io_us"] == result["relay_io_us"] == 0, result
        assert 0 < result["p50_us"] <= result["p99_us"], result

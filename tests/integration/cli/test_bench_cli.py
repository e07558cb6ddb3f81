"""`danube bench` against a real broker, with small counts: every message numbered,
received, none lost or duplicated, latencies and the broker's resources reported."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.integration.conftest import BrokerProcess

# One broker for the module (tests/integration/conftest.py): each test has topics of its own.
SHARED_BROKER = True


def bench(broker: BrokerProcess, *args: str) -> dict[str, object]:
    done = subprocess.run([sys.executable, "-m", "danube_zmq.cli.main", "bench", *args, "-s", broker.url, "--json"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_e2e_non_reliable_and_reliable_account_for_every_message(broker: BrokerProcess) -> None:
    plain = bench(broker, "e2e", "-t", "/default/bench-plain", "--count", "3000")
    assert (plain["sent"], plain["acked"], plain["received"], plain["lost"], plain["duplicates"]) == (3000, 3000, 3000, 0, 0)
    assert plain["msg_s"] > 0 and plain["e2e_latency_us"]["p50"] > 0 and plain["ack_latency_us"]["p99.9"] > 0
    assert plain["broker"]["rss_max_mb"] > 10 and plain["broker"]["pid"] > 0

    reliable = bench(broker, "e2e", "-t", "/default/bench-rel", "--reliable", "--count", "2000", "--producers", "2",
                     "--topics", "2", "--partitions", "2", "--consumers", "2", "--sub-type", "shared", "--size", "256")
    assert (reliable["received"], reliable["lost"], reliable["duplicates"]) == (2000, 0, 0)
    assert reliable["config"]["sent_per_producer"] == {"0": 1000, "1": 1000}


def test_produce_for_a_duration_at_a_rate(broker: BrokerProcess) -> None:
    produced = bench(broker, "produce", "-t", "/default/bench-rate", "--duration", "1", "--rate", "500")
    assert 100 <= produced["acked"] <= 550 and produced["failed"] == 0  # the limiter never runs ahead
    done = subprocess.run([sys.executable, "-m", "danube_zmq.cli.main", "bench", "produce", "-s", broker.url, "-t",
                           "/default/x", "--count", "5", "--duration", "1"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "not both" in done.stderr


def test_e2e_fans_out_to_every_subscription_without_loss(broker: BrokerProcess) -> None:
    """Two subscriptions on one topic each receive every message: the totals count both,
    and each subscription's own accounting shows no loss and no duplicates."""
    fanned = bench(broker, "e2e", "-t", "/default/bench-fanout", "--count", "2000", "--subscriptions", "2")
    assert (fanned["sent"], fanned["received"], fanned["lost"], fanned["duplicates"]) == (2000, 4000, 0, 0)
    assert fanned["per_subscription"] == {name: {"received": 2000, "lost": 0, "duplicates": 0}
                                          for name in ("bench-0", "bench-1")}


def test_e2e_spreads_paced_producers_over_processes_and_reports_their_cpu(broker: BrokerProcess) -> None:
    """Four paced producers dealt over two processes on two topics: every message is
    accounted for once, each producer sends its share, and the bench reports the CPU of
    each producer process and of the consumer process beside the broker's."""
    spread = bench(broker, "e2e", "-t", "/default/bench-spread", "--count", "2000", "--rate", "2000", "--producers", "4",
                   "--producer-processes", "2", "--topics", "2")
    assert (spread["sent"], spread["received"], spread["lost"], spread["duplicates"]) == (2000, 2000, 0, 0)
    assert spread["config"]["sent_per_producer"] == {str(i): 500 for i in range(4)}
    assert len(spread["clients"]["producer_cpu_percent"]) == 2
    assert all(cpu > 0 for cpu in spread["clients"]["producer_cpu_percent"])
    assert spread["clients"]["consumer_cpu_percent"] > 0 and spread["broker"]["cpu_s"] > 0

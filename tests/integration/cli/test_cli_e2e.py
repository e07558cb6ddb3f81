"""The `danube` command against a real broker: produce, consume, admin, errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

# One broker for the module (tests/integration/conftest.py): each test has topics of its own.
SHARED_BROKER = True


def danube(*args: str, timeout_s: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "danube_zmq.cli.main", *args], capture_output=True, text=True,
                          timeout=timeout_s)


def test_produce_then_consume_with_json(broker) -> None:
    """`produce --json` prints one message id per message; `consume --json` from the
    earliest position gets the same offsets, payloads, key and attributes."""
    sent = danube("produce", "-s", broker.url, "-t", "/default/cli", "-m", "hello", "-c", "5",
                  "-k", "k1", "-a", "color:red,size:xl", "--json")
    assert sent.returncode == 0, sent.stderr
    ids = [json.loads(line) for line in sent.stdout.splitlines()]
    assert [i["offset"] for i in ids] == [0, 1, 2, 3, 4] and ids[0]["topic"] == "/default/cli"
    got = danube("consume", "-s", broker.url, "-t", "/default/cli", "-m", "s1", "--initial-position", "earliest",
                 "-c", "5", "--timeout", "5", "--json")
    assert got.returncode == 0, got.stderr
    messages = [json.loads(line) for line in got.stdout.splitlines()]
    assert [m["offset"] for m in messages] == [0, 1, 2, 3, 4]
    assert messages[0]["payload"] == "hello" and messages[0]["key"] == "k1"
    assert messages[0]["attributes"] == {"color": "red", "size": "xl"} and messages[0]["partition"] is None


def test_admin_namespaces_and_topics(broker) -> None:
    """Create a namespace and a partitioned topic, list and describe them as JSON, delete."""
    assert danube("admin", "--endpoint", broker.admin_url, "namespaces", "create", "team").returncode == 0
    listed = danube("admin", "--endpoint", broker.admin_url, "namespaces", "list", "--output", "json")
    assert "team" in json.loads(listed.stdout)
    created = danube("admin", "--endpoint", broker.admin_url, "topics", "create", "/team/orders", "--partitions", "2")
    assert created.returncode == 0, created.stderr
    described = danube("admin", "--endpoint", broker.admin_url, "topics", "describe", "/team/orders", "--output", "json")
    assert described.returncode == 0, described.stderr
    assert "/team/orders-part-1" in described.stdout
    assert danube("admin", "--endpoint", broker.admin_url, "topics", "delete", "/team/orders").returncode == 0
    assert danube("admin", "--endpoint", broker.admin_url, "namespaces", "delete", "team").returncode == 0


def test_bad_input_is_one_clear_line(broker) -> None:
    """Invalid names, a missing namespace and an unreachable broker: non-zero exit, one
    `error:` line on stderr, no traceback."""
    cases = [
        danube("produce", "-s", broker.url, "-t", "/default/bad name", "-m", "x"),
        danube("produce", "-s", broker.url, "-t", "/nowhere/t", "-m", "x"),
        danube("consume", "-s", broker.url, "-t", "/nowhere/absent", "-m", "s", "--timeout", "1"),
        danube("admin", "--endpoint", "tcp://127.0.0.1:1", "namespaces", "list", timeout_s=60),
    ]
    for done in cases:
        assert done.returncode != 0
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        assert lines and lines[-1].startswith("error:"), done.stderr
        assert "Traceback" not in done.stderr
    assert "namespace 'nowhere' does not exist" in cases[1].stderr


def test_broker_start_on_a_busy_port_fails_fast(broker, tmp_path: Path) -> None:
    """A second broker on a port in use exits 1 at once with one line naming the endpoint."""
    done = danube("broker", "start", "--listen", broker.url, "--admin-listen", "tcp://127.0.0.1:0",
                  "--metrics-port", "0", "--data-dir", str(tmp_path / "second"), timeout_s=20)
    assert done.returncode == 1
    assert f"cannot listen for client connections on {broker.url}" in done.stderr
    assert "Traceback" not in done.stderr

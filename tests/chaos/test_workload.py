"""The chaos workload on a real broker: producer and consumer processes
(`python -m tests.chaos.harness.workload`) record their histories while the broker is
killed with SIGKILL and restarted on the same data dir, and the checkers judge them.

A loopback broker from tests/integration/conftest.py (free ports, a tmp data dir):
this is the workload's and the checkers' own test, not a scenario of the chaos table.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.chaos.harness.checkers import Fault, check_raft, check_run, leader_observations
from tests.chaos.harness.history import load_history
from tests.chaos.harness.workload import command
from tests.integration.conftest import broker_factory  # noqa: F401 - the fixture, used by name
from tests.integration.consensus.test_metadata_cluster import agreed_leader, start_cluster

MESSAGES = 3_000
RATE = 600  # messages per second: about 5 s of sending
DEADLINE_S = 120.0  # every wait; the test fails naming what never came, never on timing


def _acked(history_dir: Path, name: str) -> int:
    path = history_dir / f"{name}.jsonl"
    return path.read_text().count('"type":"ok"') if path.exists() else 0


def _has(history_dir: Path, name: str, text: str) -> bool:
    path = history_dir / f"{name}.jsonl"
    return path.exists() and text in path.read_text()


def _wait(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        assert time.monotonic() < deadline, f"not within {DEADLINE_S:g} s: {what}"
        time.sleep(0.05)


def test_no_acknowledged_message_is_lost_when_the_broker_is_killed_mid_run(
        broker_factory, tmp_path: Path) -> None:  # noqa: F811 - the fixture
    """A reliable producer sends 3,000 messages at 600/s to a topic read on three
    subscriptions (Exclusive, Shared with two consumers, Failover); after a third of the
    sends are acknowledged the broker is killed with SIGKILL and restarted on its data
    dir. The checkers find no acknowledged message lost on any subscription, nothing
    unexpected, first deliveries in order on Exclusive and Failover, one message per
    offset, and a send acknowledged after the restart."""
    history = tmp_path / "history"
    broker = broker_factory()
    topic = "/default/chaos-workload"
    consumers = [("consumer-ex", "ex", "exclusive"), ("consumer-sh-0", "sh", "shared"),
                 ("consumer-sh-1", "sh", "shared"), ("consumer-fo", "fo", "failover")]
    logs = tmp_path / "workload-logs"
    logs.mkdir()
    processes: list[subprocess.Popen[bytes]] = []

    def spawn(argv: list[str], name: str) -> subprocess.Popen[bytes]:
        with open(logs / f"{name}.log", "wb") as log:
            process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        processes.append(process)
        return process

    try:
        for name, sub, sub_type in consumers:
            spawn(command("consume", url=broker.url, topic=topic, name=name, history_dir=history,
                          subscription=sub, sub_type=sub_type, duration_s=DEADLINE_S), name)
        producer = spawn(command("produce", url=broker.url, topic=topic, name="producer-0", history_dir=history,
                                 reliable=True, count=MESSAGES, rate=RATE, duration_s=DEADLINE_S), "producer-0")
        _wait(lambda: all(_has(history, name, '"f":"subscribe"') for name, *_ in consumers), "every consumer subscribed")
        _wait(lambda: _acked(history, "producer-0") >= MESSAGES // 3, "a third of the sends acknowledged")

        killed_ns = time.monotonic_ns()
        broker.stop(signal.SIGKILL)
        broker = broker_factory(url=broker.url, admin_url=broker.admin_url)
        fault = Fault("broker kill -9", killed_ns, time.monotonic_ns())

        assert producer.wait(DEADLINE_S) == 0, (logs / "producer-0.log").read_text()
        for process in processes[:-1]:
            process.send_signal(signal.SIGUSR1)  # drain: exit once nothing more comes
        for process, (name, *_) in zip(processes[:-1], consumers, strict=True):
            assert process.wait(DEADLINE_S) == 0, (logs / f"{name}.log").read_text()
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()

    report = check_run("workload kill -9", load_history(history), [fault])
    print(f"\n{report.HEADER}\n{report.row()}")
    print(json.dumps({"acked": report.acked, "info": report.info, "failed": report.failed,
                      "duplicates": report.duplicates, "redeliveries": report.redeliveries,
                      "recovered": report.recovered}))
    assert report.valid, report.findings
    assert report.lost == 0 and report.unexpected == 0 and report.nonmonotonic == 0
    assert report.inconsistent_offsets == 0
    assert report.acked >= MESSAGES // 3
    assert report.attempted == MESSAGES
    assert len(report.recovery_ack_ms) == 1  # an acknowledged send after the restart


def test_sigterm_stops_the_workload_and_records_sends_in_flight_as_unknown(broker_factory, tmp_path: Path) -> None:  # noqa: F811
    """With the broker paused (SIGSTOP) under a producer, SIGTERM makes the producer
    exit 0 within its grace time, every invocation completed in the history and those
    never answered recorded `info` ("in flight at stop"); a consumer stops on SIGTERM
    too, and what it recorded is neither unexpected nor out of order."""
    history = tmp_path / "history"
    broker = broker_factory()
    topic = "/default/chaos-sigterm"
    producer = subprocess.Popen(command("produce", url=broker.url, topic=topic, name="producer-0",
                                        history_dir=history, reliable=True, count=100_000, rate=300, grace_s=1,
                                        duration_s=DEADLINE_S), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    consumer = subprocess.Popen(command("consume", url=broker.url, topic=topic, name="consumer-0",
                                        history_dir=history, subscription="s", sub_type="exclusive",
                                        duration_s=DEADLINE_S), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        _wait(lambda: _acked(history, "producer-0") >= 100, "sends acknowledged")
        broker.process.send_signal(signal.SIGSTOP)
        time.sleep(0.5)  # sends keep being invoked while nothing answers
        producer.send_signal(signal.SIGTERM)
        out, _ = producer.communicate(timeout=DEADLINE_S)
        assert producer.returncode == 0, out.decode()
        broker.process.send_signal(signal.SIGCONT)
        consumer.send_signal(signal.SIGTERM)
        out, _ = consumer.communicate(timeout=DEADLINE_S)
        assert consumer.returncode == 0, out.decode()
    finally:
        broker.process.send_signal(signal.SIGCONT)
        for process in (producer, consumer):
            if process.poll() is None:
                process.kill()
                process.wait()

    ops = load_history(history)
    sends = [op for op in ops if op.f == "send"]
    invoked = {op.value["seq"] for op in sends if op.type == "invoke"}
    completed = [op.value["seq"] for op in sends if op.type != "invoke"]
    assert sorted(completed) == sorted(invoked)  # each exactly once
    in_flight = [op for op in sends if op.type == "info" and op.value["error"] == "in flight at stop"]
    assert in_flight, "the broker was paused: some sends were in flight at the stop"
    report = check_run("sigterm", ops)
    assert report.unexpected == 0 and report.nonmonotonic == 0


@pytest.mark.cluster
async def test_metadata_history_stays_linearizable_through_a_leader_kill(tmp_path: Path) -> None:
    """Three metadata processes (`workload metadata`, seeded) put, get and cas 5 keys
    through all three nodes' admin ports of a 3-node cluster while an observer process
    records every node's (term, role); the leader is killed with SIGKILL and restarted
    on its data dir. The recorded history is linearizable (the WGL checker), no term had
    two leaders, and writes were acknowledged after the restart."""
    nodes = start_cluster(tmp_path, 3)
    history = tmp_path / "history"
    logs = tmp_path / "workload-logs"
    logs.mkdir()
    urls = [n.admin_url for n in nodes]
    processes: dict[str, subprocess.Popen[bytes]] = {}

    def spawn(argv: list[str], name: str) -> None:
        with open(logs / f"{name}.log", "wb") as log:
            processes[name] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)

    async def until(condition: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + DEADLINE_S
        while not condition():
            assert time.monotonic() < deadline, f"not within {DEADLINE_S:g} s: {what}"
            await asyncio.sleep(0.05)

    try:
        leader_id, term = await agreed_leader(nodes)
        spawn(command("observe", name="observer", history_dir=history, admin_url=urls, interval_ms=100,
                      request_timeout_ms=500, duration_s=DEADLINE_S), "observer")
        writers = [f"admin-{i}" for i in range(3)]
        for i, name in enumerate(writers):
            spawn(command("metadata", name=name, history_dir=history, admin_url=urls, ops=300, keys=5, seed=i,
                          pause_ms=5, request_timeout_ms=1500, duration_s=DEADLINE_S), name)
        await until(lambda: all(_acked(history, name) >= 30 for name in writers), "writes before the kill")
        leader = nodes[leader_id - 1]
        killed_ns = time.monotonic_ns()
        leader.kill()
        await agreed_leader(nodes, term_above=term)
        leader.start(nodes)
        fault = Fault("leader kill -9", killed_ns, time.monotonic_ns())
        for name in writers:
            await until(lambda name=name: processes[name].poll() is not None, f"{name} done")
            assert processes[name].returncode == 0, (logs / f"{name}.log").read_text()
        processes["observer"].send_signal(signal.SIGTERM)
        await until(lambda: processes["observer"].poll() is not None, "the observer stopped")
    finally:
        for process in processes.values():
            if process.poll() is None:
                process.kill()
                process.wait()
        for node in nodes:
            if node.process is not None:
                node.kill()

    ops = load_history(history)
    report = check_run("R1 leader kill", ops, [fault])
    raft = check_raft(ops, leader_observations(ops))
    print(f"\n{report.HEADER}\n{report.row()}\n{raft.explanation}; {raft.terms} terms observed")
    assert raft.linearizable is True, raft.explanation
    assert raft.terms >= 2 and not raft.split_terms
    assert report.valid, report.findings
    assert len(report.recovery_ack_ms) == 1

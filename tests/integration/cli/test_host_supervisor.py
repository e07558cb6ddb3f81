"""The supervisor's StartBroker on a broker its keeper gave up on: a real supervisor
(`python -m danube_zmq.cli.host_supervisor`) running a stand-in broker, a Python
one-liner that exits at once while a flag file exists and runs otherwise, so that its
keeper's restart budget (more than 10 restarts in a minute) is spent in seconds."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from danube_zmq.cli.cluster import _actor_system, _supervisor
from danube_zmq.cli.host_supervisor import (
    RESTARTS_PER_MINUTE_MAX,
    BrokerSpec,
    GetStatus,
    StartBroker,
    StartBrokers,
    Status,
    StopBrokers,
    Stopped,
)
from tests.integration.cli.test_cluster_cli import _leftovers, _ports

pytestmark = pytest.mark.cluster

_STAND_IN = "import os, sys, time\nif os.path.exists(sys.argv[1]):\n    sys.exit(3)\ntime.sleep(600)\n"


def test_start_broker_starts_a_broker_its_keeper_gave_up_on(tmp_path: Path) -> None:
    """The stand-in exits until its keeper gives up (not running, no more restarts);
    with the flag removed, StartBroker starts it again under a new keeper."""
    port = _ports(1)
    broken = tmp_path / "broken"
    broken.touch()
    # Its output to a file: the ActorSystem's admin process outlives the command and
    # holds the output it inherited (as `cluster up` starts it).
    log_path = tmp_path / "supervisor.log"
    with open(log_path, "wb") as log:
        done = subprocess.run([sys.executable, "-m", "danube_zmq.cli.host_supervisor", "--bind", "127.0.0.1",
                               "--port", str(port)], stdin=subprocess.DEVNULL, stdout=log, stderr=log, timeout=60)
    assert done.returncode == 0, log_path.read_text()
    system = _actor_system("127.0.0.1", port)
    try:
        supervisor = _supervisor(system)
        spec = BrokerSpec(name="broker-1", node_id=1, argv=[sys.executable, "-c", _STAND_IN, str(broken)], env={},
                          data_dir=str(tmp_path / "broker-1"), log_path=str(tmp_path / "broker-1.log"))
        assert isinstance(system.ask(supervisor, StartBrokers(specs=[spec]), 10), Status)
        deadline = time.monotonic() + 60
        while "not restarted" not in (broker := _broker(system)).last_exit:
            assert time.monotonic() < deadline, broker
            time.sleep(0.2)
        assert not broker.running and broker.restarts == RESTARTS_PER_MINUTE_MAX
        time.sleep(1)
        assert _broker(system).restarts == RESTARTS_PER_MINUTE_MAX, "the keeper did not give up"

        broken.unlink()
        assert isinstance(system.ask(supervisor, StartBroker(name="broker-1"), 10), Status)
        deadline = time.monotonic() + 30
        while not (broker := _broker(system)).running:
            assert time.monotonic() < deadline, broker
            time.sleep(0.2)
        time.sleep(1)
        assert _broker(system).running and _broker(system).pid == broker.pid
    finally:
        stopped = system.ask(_supervisor(system), StopBrokers(), 60)
        system.shutdown()
    assert isinstance(stopped, Stopped)
    deadline = time.monotonic() + 10
    while _leftovers(tmp_path, port) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _leftovers(tmp_path, port)


def _broker(system: object) -> object:
    answer = system.ask(_supervisor(system), GetStatus(), 10)  # type: ignore[attr-defined]
    assert isinstance(answer, Status)
    return answer.brokers[0]

"""`danube cluster up` and `join` check their ports before starting anything
(cli/cluster_ports.py): overlapping ranges are a usage error, a port in use is one
`error:` line naming it, and a running cluster's data dir is not started twice. No
supervisor or broker starts here: every case fails before that."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from danube_zmq.cli.cluster_ports import in_use
from danube_zmq.cli.main import cli
from tests.integration.conftest import free_port


def run(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args), prog_name="danube")


@pytest.fixture
def listening() -> Iterator[socket.socket]:
    """A socket listening on a free loopback port, as a standalone broker's would."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", free_port()))
        sock.listen()
        yield sock


def _up(data_dir: Path, *, supervisor_port: int | None = None, client_port: int | None = None,
        admin_port: int | None = None) -> Result:
    return run("cluster", "up", "--brokers", "3", "--data-dir", str(data_dir),
               "--client-port", str(client_port or free_port()), "--admin-port", str(admin_port or free_port()),
               "--raft-port", str(free_port()), "--metrics-port", "0",
               "--supervisor-port", str(supervisor_port or free_port()))


def test_overlapping_port_ranges_are_a_usage_error(tmp_path: Path) -> None:
    """--admin-port inside the three client ports: exit 2 naming both uses, nothing made."""
    client = free_port()
    result = _up(tmp_path / "cluster", client_port=client, admin_port=client + 2)
    assert result.exit_code == 2, result.output
    assert (f"port {client + 2} would be both the admin port of broker-1 (--admin-port) and the client port of"
            " broker-3 (--client-port)") in result.stderr
    assert not (tmp_path / "cluster").exists()


def test_a_busy_supervisor_port_fails_up_naming_it(tmp_path: Path, listening: socket.socket) -> None:
    port = listening.getsockname()[1]
    result = _up(tmp_path / "cluster", supervisor_port=port)
    assert result.exit_code == 1, result.output
    assert result.stderr.startswith(f"error: port {port} on 127.0.0.1 is in use; it would be the supervisor's admin"
                                    " port. Stop what listens there, or pass --supervisor-port ")
    assert len(result.stderr.splitlines()) == 1
    assert not (tmp_path / "cluster").exists()


def test_a_busy_supervisor_port_fails_join_naming_it(tmp_path: Path, listening: socket.socket) -> None:
    port = listening.getsockname()[1]
    result = run("cluster", "join", "--convention", f"127.0.0.1:{free_port()}", "--bind", "127.0.0.1",
                 "--supervisor-port", str(port), "--host-name", "b", "--data-dir", str(tmp_path / "b"))
    assert result.exit_code == 1, result.output
    assert f"port {port} on 127.0.0.1 is in use; it would be the supervisor port of host b" in result.stderr


def test_up_refuses_the_data_dir_of_a_cluster_that_is_up(tmp_path: Path, listening: socket.socket) -> None:
    """cluster.json names a supervisor that answers: a second `up` there would start a
    second set of brokers on the same broker directories."""
    data_dir = tmp_path / "cluster"
    data_dir.mkdir()
    port = listening.getsockname()[1]
    (data_dir / "cluster.json").write_text(json.dumps({"bind": "127.0.0.1", "supervisor_port": port, "brokers": []}))
    result = _up(data_dir)
    assert result.exit_code == 1, result.output
    assert f"the cluster in {data_dir} is up (its supervisor listens on 127.0.0.1:{port})" in result.stderr


def test_in_use_sees_listeners_and_skips_other_hosts_addresses(listening: socket.socket) -> None:
    port = listening.getsockname()[1]
    assert in_use("127.0.0.1", port)
    assert not in_use("127.0.0.1", free_port())
    # 192.0.2.1 (TEST-NET-1) is no address of this host: its own host checks its ports.
    assert not in_use("192.0.2.1", port)

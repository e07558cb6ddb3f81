"""Running a `danube cluster` day to day: `up` beside ports already in use fails at once
and leaves nothing behind, as does an `up` whose brokers cannot start; every broker
serves Prometheus metrics on its own port; one broker is stopped and started again
without its supervisor restarting it in between."""

from __future__ import annotations

import asyncio
import json
import socket
import time
import urllib.request
from pathlib import Path

import psutil
import pytest

from danube_zmq.client.admin import AdminClient
from danube_zmq.transport.admin_protocol import ClusterStatusInfo
from tests.integration.cli.test_cluster_cli import _leftovers, _ports, danube

pytestmark = pytest.mark.cluster


def _up_args(data_dir: Path, count: int, supervisor_port: int, metrics_port: int) -> list[str]:
    return ["cluster", "up", "--brokers", str(count), "--data-dir", str(data_dir), "--client-port", str(_ports(count)),
            "--admin-port", str(_ports(count)), "--raft-port", str(_ports(count)),
            "--metrics-port", str(metrics_port), "--supervisor-port", str(supervisor_port), "--output", "json"]


def _assert_nothing_left(data_dir: Path, supervisor_port: int) -> None:
    deadline = time.monotonic() + 10
    while _leftovers(data_dir, supervisor_port) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _leftovers(data_dir, supervisor_port)
    assert not _listening(supervisor_port)


def _listening(port: int) -> bool:
    # Not a bind test: the port's closed connections may still be in TIME_WAIT.
    return any(c.laddr[1] == port for c in psutil.net_connections("tcp") if c.status == psutil.CONN_LISTEN)


def test_up_on_a_busy_port_fails_at_once_naming_it_and_starts_nothing(tmp_path: Path) -> None:
    """A socket listening on the port broker-2's metrics would take: `up` exits 1 before
    starting anything, naming the port, what it was for and a free --metrics-port; no
    supervisor or broker runs afterwards and every other port is still free."""
    data_dir = tmp_path / "cluster"
    supervisor_port, metrics_port = _ports(1), _ports(3)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", metrics_port + 1))
        busy.listen()
        started = time.monotonic()
        done = danube(*_up_args(data_dir, 3, supervisor_port, metrics_port))
        elapsed_s = time.monotonic() - started
    assert done.returncode == 1, done.stderr + done.stdout
    assert f"port {metrics_port + 1} on 127.0.0.1 is in use; it would be the metrics port of broker-2" in done.stderr
    assert "pass --metrics-port " in done.stderr
    assert "Traceback" not in done.stderr
    assert elapsed_s < 10, f"`up` took {elapsed_s:.1f} s to refuse a busy port"
    assert not (data_dir / "cluster.json").exists()
    _assert_nothing_left(data_dir, supervisor_port)


def test_up_whose_brokers_exit_fails_at_once_and_stops_what_it_started(tmp_path: Path) -> None:
    """Brokers that exit at start (a config they refuse): `up` fails as soon as one has
    exited, with the broker's own error, instead of waiting a minute for a leader, and
    stops the keepers (which would start the brokers again), the brokers and the
    supervisor before exiting 1."""
    data_dir = tmp_path / "cluster"
    config = tmp_path / "broker.yml"
    config.write_text("broker:\n  metrics_connections_max: 0\n")
    supervisor_port = _ports(1)
    done = danube(*_up_args(data_dir, 3, supervisor_port, 0), "--config", str(config))
    assert done.returncode == 1, done.stderr + done.stdout
    assert "before the cluster formed: error:" in done.stderr and "metrics_connections_max" in done.stderr, done.stderr
    assert "the supervisor and the brokers it started are stopped" in done.stderr
    _assert_nothing_left(data_dir, supervisor_port)


def test_stop_broker_keeps_it_stopped_and_start_broker_brings_it_back(tmp_path: Path) -> None:
    """Three brokers with metrics ports: `up` prints each broker's metrics URL and one
    serves Prometheus text over HTTP; `stop-broker 2` stops broker-2 cleanly and its
    supervisor leaves it stopped (status after 3 s: stopped, no pid, no restart, Raft
    down, the other two still have a leader); `start-broker 2` starts it again and it is
    back in the Raft group."""
    data_dir = tmp_path / "cluster"
    supervisor_port, metrics_port = _ports(1), _ports(3)
    up = danube(*_up_args(data_dir, 3, supervisor_port, metrics_port))
    try:
        assert up.returncode == 0, up.stderr + up.stdout
        layout = json.loads(up.stdout)
        assert [b["metrics_url"] for b in layout["brokers"]] == [
            f"http://127.0.0.1:{metrics_port + i}/metrics" for i in range(3)]
        scraped = urllib.request.urlopen(layout["brokers"][0]["metrics_url"], timeout=10).read().decode()
        assert "# TYPE danube_" in scraped

        status = _status(data_dir)
        assert [b["metrics_url"] for b in status["brokers"]] == [b["metrics_url"] for b in layout["brokers"]]
        pid = status["brokers"][1]["pid"]

        stopped = danube("cluster", "stop-broker", "2", "--data-dir", str(data_dir))
        assert stopped.returncode == 0, stopped.stderr + stopped.stdout
        assert "broker-2 stopped" in stopped.stdout
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
        time.sleep(3)  # 15 of the keeper's checks: a supervisor that restarts it has done so
        status = _status(data_dir)
        second = status["brokers"][1]
        assert (second["stopped"], second["running"], second["pid"], second["restarts"], second["raft_role"]) == (
            True, False, None, 0, "down"), second
        assert [b["running"] for b in status["brokers"]] == [True, False, True]
        assert status["leader_node_id"] in (1, 3)
        again = danube("cluster", "stop-broker", "2", "--data-dir", str(data_dir))
        assert again.returncode == 0, again.stderr

        started = danube("cluster", "start-broker", "2", "--data-dir", str(data_dir))
        assert started.returncode == 0, started.stderr + started.stdout
        assert "broker-2 started: Raft follower" in started.stdout or "broker-2 started: Raft leader" in started.stdout
        status = _status(data_dir)
        second = status["brokers"][1]
        assert (second["stopped"], second["running"], second["restarts"]) == (False, True, 0), second
        assert second["raft_role"] in ("leader", "follower")
        raft = asyncio.run(_raft_status(layout["brokers"][1]["admin_url"]))
        assert raft.leader_id == status["leader_node_id"]
        assert sorted(m.node_id for m in raft.members if m.voter) == [1, 2, 3]

        refused = danube("cluster", "start-broker", "2", "--data-dir", str(data_dir))
        assert refused.returncode == 1 and "broker-2 is running" in refused.stderr, refused.stderr
        unknown = danube("cluster", "stop-broker", "7", "--data-dir", str(data_dir))
        assert unknown.returncode == 2 and "no broker 7 in this cluster" in unknown.stderr, unknown.stderr
    finally:
        down = danube("cluster", "down", "--data-dir", str(data_dir))
    assert down.returncode == 0, down.stderr + down.stdout
    _assert_nothing_left(data_dir, supervisor_port)
    assert not any(_listening(metrics_port + i) for i in range(3))


def _status(data_dir: Path) -> dict:
    done = danube("cluster", "status", "--data-dir", str(data_dir), "--output", "json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


async def _raft_status(admin_url: str) -> ClusterStatusInfo:
    async with AdminClient(admin_url, timeout_ms=5000) as admin:
        return await admin.cluster_status()



def test_danube_compat_gives_every_broker_its_grpc_doors(tmp_path: Path) -> None:
    """`up --danube-compat`: each broker serves Danube's gRPC client and admin APIs on
    ports of their own (counting up like the others), printed by `up` and `status`; the
    admin door of one broker lists both brokers, the client door answers a lookup."""
    import grpc

    from danube_zmq.transport.danube_proto import DanubeAdmin_pb2 as admin_pb
    from danube_zmq.transport.danube_proto import DanubeAdmin_pb2_grpc as admin_grpc
    from danube_zmq.transport.danube_proto import DanubeApi_pb2 as api_pb
    from danube_zmq.transport.danube_proto import DanubeApi_pb2_grpc as api_grpc

    data_dir = tmp_path / "cluster"
    supervisor_port, grpc_port, grpc_admin_port = _ports(1), _ports(2), _ports(2)
    up = danube(*_up_args(data_dir, 2, supervisor_port, 0), "--danube-compat", "--grpc-port", str(grpc_port),
                "--grpc-admin-port", str(grpc_admin_port))
    try:
        assert up.returncode == 0, up.stderr + up.stdout
        layout = json.loads(up.stdout)
        assert [(b["grpc_url"], b["grpc_admin_url"]) for b in layout["brokers"]] == [
            (f"http://127.0.0.1:{grpc_port + i}", f"http://127.0.0.1:{grpc_admin_port + i}") for i in range(2)]
        status = _status(data_dir)
        assert [b["grpc_admin_url"] for b in status["brokers"]] == [b["grpc_admin_url"] for b in layout["brokers"]]
        table = danube("cluster", "status", "--data-dir", str(data_dir))
        assert "GRPC-ADMIN-URL" in table.stdout and layout["brokers"][1]["grpc_url"] in table.stdout, table.stdout

        async def ask() -> tuple[list[str], int]:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{grpc_admin_port}") as channel:
                brokers = await admin_grpc.BrokerAdminStub(channel).ListBrokers(admin_pb.Empty(), timeout=10)
            async with grpc.aio.insecure_channel(f"127.0.0.1:{grpc_port + 1}") as channel:
                lookup = await api_grpc.DiscoveryStub(channel).TopicLookup(
                    api_pb.TopicLookupRequest(request_id=1, topic="/default/nowhere"), timeout=10)
            return sorted(b.broker_addr for b in brokers.brokers), lookup.response_type

        addresses, answer = asyncio.run(ask())
        assert addresses == sorted(b["url"] for b in layout["brokers"])
        assert answer == api_pb.TopicLookupResponse.Failed
    finally:
        down = danube("cluster", "down", "--data-dir", str(data_dir))
    assert down.returncode == 0, down.stderr + down.stdout
    _assert_nothing_left(data_dir, supervisor_port)


def test_danube_compat_checks_its_ports_and_refuses_security(tmp_path: Path) -> None:
    """A busy gRPC port fails `up --danube-compat` before anything starts, naming the
    option; with --security-dir but no TLS for the doors in the config it is refused."""
    data_dir = tmp_path / "cluster"
    supervisor_port, grpc_admin_port = _ports(1), _ports(2)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", grpc_admin_port + 1))
        busy.listen()
        done = danube(*_up_args(data_dir, 2, supervisor_port, 0), "--danube-compat", "--grpc-port", str(_ports(2)),
                      "--grpc-admin-port", str(grpc_admin_port))
    assert done.returncode == 1, done.stderr + done.stdout
    assert f"port {grpc_admin_port + 1} on 127.0.0.1 is in use; it would be the gRPC admin port of broker-2" \
        in done.stderr, done.stderr
    assert "pass --grpc-admin-port " in done.stderr
    _assert_nothing_left(data_dir, supervisor_port)
    secured = danube(*_up_args(data_dir, 1, supervisor_port, 0), "--danube-compat", "--security-dir",
                     str(tmp_path / "keys"))
    assert secured.returncode == 2, secured.stderr
    assert "--danube-compat with --security-dir needs TLS on the gRPC doors: give a --config that sets" \
        " security.grpc_tls_cert_file" in " ".join(secured.stderr.split()), secured.stderr
    assert not (tmp_path / "keys").exists()


def test_danube_compat_with_security_serves_tls_and_takes_the_admin_token(tmp_path: Path) -> None:
    """`up --danube-compat --security-dir` with a config naming the doors' certificate:
    the admin door answers over TLS with the admin token `up` wrote, and refuses a call
    without one; plaintext fails. `up`, `status` and ListBrokers' admin_addr name the
    doors https://, as they serve."""
    import grpc

    from danube_zmq.transport.danube_proto import DanubeAdmin_pb2 as admin_pb
    from danube_zmq.transport.danube_proto import DanubeAdmin_pb2_grpc as admin_grpc
    from tests.tls_certs import self_signed_cert

    cert, key = self_signed_cert(tmp_path)
    config = tmp_path / "tls.yml"
    config.write_text(f"security:\n  grpc_tls_cert_file: {cert}\n  grpc_tls_key_file: {key}\n")
    data_dir, keys = tmp_path / "cluster", tmp_path / "keys"
    supervisor_port, grpc_port, grpc_admin_port = _ports(1), _ports(1), _ports(1)
    up = danube(*_up_args(data_dir, 1, supervisor_port, 0), "--config", str(config), "--security-dir", str(keys),
                "--danube-compat", "--grpc-port", str(grpc_port), "--grpc-admin-port", str(grpc_admin_port))
    try:
        assert up.returncode == 0, up.stderr + up.stdout
        token = (keys / "admin.jwt").read_text().strip()
        doors = (f"https://127.0.0.1:{grpc_port}", f"https://127.0.0.1:{grpc_admin_port}")
        assert [(b["grpc_url"], b["grpc_admin_url"]) for b in json.loads(up.stdout)["brokers"]] == [doors]
        assert [(b["grpc_url"], b["grpc_admin_url"]) for b in _status(data_dir)["brokers"]] == [doors]
        table = danube("cluster", "status", "--data-dir", str(data_dir))
        assert all(url in table.stdout for url in doors), table.stdout

        async def ask() -> None:
            credentials = grpc.ssl_channel_credentials(cert.read_bytes())
            async with grpc.aio.secure_channel(f"127.0.0.1:{grpc_admin_port}", credentials) as channel:
                brokers = admin_grpc.BrokerAdminStub(channel)
                listed = await brokers.ListBrokers(admin_pb.Empty(), metadata=(("authorization", f"Bearer {token}"),),
                                                   timeout=10)
                assert [b.admin_addr for b in listed.brokers] == [doors[1]]
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await brokers.ListBrokers(admin_pb.Empty(), timeout=10)
                assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
            async with grpc.aio.insecure_channel(f"127.0.0.1:{grpc_admin_port}") as channel:
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await admin_grpc.BrokerAdminStub(channel).ListBrokers(admin_pb.Empty(), timeout=5)
                assert refused.value.code() == grpc.StatusCode.UNAVAILABLE

        asyncio.run(ask())
    finally:
        down = danube("cluster", "down", "--data-dir", str(data_dir))
    assert down.returncode == 0, down.stderr + down.stdout
    _assert_nothing_left(data_dir, supervisor_port)

"""The gRPC doors' bounds (`doors/grpc/limits.py`): what grpc is told, and the
descriptor budget the doors share with the native ports. The bounds at work, through
real sockets: tests/integration/doors/grpc/test_grpc_door_flood.py."""

from __future__ import annotations

import random

import pytest

from danube_zmq.client.admin import AdminClient
from danube_zmq.config.broker_config import BrokerConfig, BrokerSection, LimitsSection
from danube_zmq.doors.grpc import admin_clients as grpc_admin_clients
from danube_zmq.doors.grpc import client_door as grpc_door
from danube_zmq.doors.grpc import schemas as grpc_door_schemas
from danube_zmq.doors.grpc.limits import (
    CONTROL_CLIENTS,
    IDLE_ADMIN_CLIENTS,
    REGISTRY_CLIENTS,
    DoorLimits,
    check_fd_budget,
    door_fds,
    native_fds,
)
from danube_zmq.transport.errors import ConfigError

BOTH_DOORS = BrokerSection(grpc_listen="http://127.0.0.1:0", grpc_admin_listen="http://127.0.0.1:0")


def test_the_budget_counts_the_pools_the_doors_keep() -> None:
    """The budget's copies of the doors' pool sizes (kept here so that a broker without
    a door imports no grpc) are the doors' own."""
    assert CONTROL_CLIENTS == grpc_door.CONTROL_CLIENTS_MAX
    assert REGISTRY_CLIENTS == grpc_door_schemas.REGISTRY_CLIENTS_MAX
    assert IDLE_ADMIN_CLIENTS == grpc_admin_clients.IDLE_CALLERS_MAX * grpc_admin_clients.IDLE_CLIENTS_MAX


def test_server_options_carry_the_broker_limits() -> None:
    config = BrokerConfig(broker=BrokerSection(grpc_connections_max=7, grpc_admin_connections_max=3,
                                               grpc_handshake_timeout_ms=900, grpc_idle_timeout_ms=4000))
    options = dict(DoorLimits.client_door(config).server_options())
    assert options == {"grpc.max_allowed_incoming_connections": 7, "grpc.server_handshake_timeout_ms": 900,
                       "grpc.max_connection_idle_ms": 4000,
                       "grpc.max_receive_message_length": config.limits.frame_bytes_max,
                       "grpc.max_send_message_length": config.limits.frame_bytes_max}
    assert dict(DoorLimits.admin_door(config).server_options())["grpc.max_allowed_incoming_connections"] == 3


def test_no_door_no_budget() -> None:
    assert door_fds(BrokerConfig()) == 0
    check_fd_budget(BrokerConfig(), nofile=16)


def test_defaults_with_both_doors_fit_twenty_thousand_descriptors() -> None:
    config = BrokerConfig(broker=BOTH_DOORS)
    assert door_fds(config) + native_fds(config) <= 20_000
    check_fd_budget(config, nofile=20_000)


def test_doors_over_the_budget_stop_the_start_naming_the_settings() -> None:
    config = BrokerConfig(broker=BOTH_DOORS)
    with pytest.raises(ConfigError) as refused:
        check_fd_budget(config, nofile=1024)
    message = str(refused.value)
    for key in ("broker.grpc_connections_max", "broker.grpc_admin_connections_max", "broker.grpc_attachments_max",
                "limits.connections_max", "limits.connections_pending_max", "RLIMIT_NOFILE of 1024", "ulimit -Hn"):
        assert key in message, message
    # Lowering the native ports' share makes room for the same doors.
    smaller = BrokerConfig(broker=BOTH_DOORS, limits=LimitsSection(connections_max=100, connections_pending_max=100))
    check_fd_budget(smaller, nofile=door_fds(smaller) + native_fds(smaller))
    with pytest.raises(ConfigError):
        check_fd_budget(smaller, nofile=door_fds(smaller) + native_fds(smaller) - 1)


@pytest.mark.parametrize(("key", "value"), [("grpc_connections_max", 0), ("grpc_admin_connections_max", 0),
                                            ("grpc_handshake_timeout_ms", 99), ("grpc_idle_timeout_ms", 999)])
def test_door_bounds_are_range_checked(key: str, value: int) -> None:
    with pytest.raises(ConfigError, match=f"broker.{key}"):
        BrokerSection(**{key: value})


async def test_a_doors_native_clients_share_its_context_and_leave_it_open() -> None:
    """Every native client a door opens lives in the door's one ZeroMQ context (no I/O
    thread and descriptors of its own, NATIVE_CLIENT_FDS), and closing a client leaves
    that context to the door."""
    door = grpc_door.GrpcDoor(listen="http://127.0.0.1:0", advertised_url=None, client_url="tcp://127.0.0.1:1",
                              admin_url="tcp://127.0.0.1:2", broker_url="tcp://127.0.0.1:1", attachments_max=10,
                              metadata=None, rng=random.Random(7))
    context = door.security.context
    assert context is not None
    client = door.native_client("c", None)
    admin = AdminClient("tcp://127.0.0.1:2", **door.security.credentials(None))
    assert client._context is context and admin._shared_context is context
    await client.close()
    admin.close()
    assert not context.closed
    await door.stop()
    assert context.closed


def test_a_short_soft_limit_is_raised_up_to_the_hard_one() -> None:
    """A soft RLIMIT_NOFILE of 1024 (a shell's default) under a hard limit that fits the
    doors is raised, in a child process so this one's limit stays as it was."""
    import subprocess
    import sys

    code = (
        "import resource\n"
        "from danube_zmq.doors.grpc.limits import raise_nofile\n"
        "soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (min(1024, soft), hard))\n"
        "wanted = min(4096, hard)\n"
        "assert raise_nofile(wanted) == wanted, resource.getrlimit(resource.RLIMIT_NOFILE)\n"
        "assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == wanted\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr

"""Bounds of the gRPC doors: their connections, messages and file descriptors.

grpc's C core enforces them, given as channel arguments to `grpc.aio.server`
(`DoorLimits.server_options`): the connection cap is a per-server quota, so one door's
flood never takes another's places; a connection over it is accepted and closed at once,
before a byte is read. What is left to us is the descriptor budget: the doors share the
process's RLIMIT_NOFILE with the native client and admin ports (ZeroMQ ROUTER sockets,
which stop accepting when the process runs out) and the WAL, so the broker refuses to
start when the doors' worst case does not fit beside the native ports' (`check_fd_budget`).
"""

from __future__ import annotations

import resource
from dataclasses import dataclass

from danube_zmq.config.broker_config import BrokerConfig, ConfigError

# Descriptors kept for what is not a connection: WAL segments, the Raft log, listening
# sockets, the metrics endpoint, ZeroMQ's own (an eventfd per socket, epoll per I/O
# thread), the inbound watcher's pipes. A broker at rest holds about 50.
FDS_RESERVED = 1024
# What one native client a door opens costs this process beyond the connection's far
# end, which the client port counts in limits.connections_max: its TCP socket and the
# ZeroMQ sockets' mailboxes (measured: 20 attachments, 2.4 each). The door's clients
# share one ZeroMQ context, so none has an I/O thread or descriptors of its own.
NATIVE_CLIENT_FDS = 3
# An admin client's far end is on the admin port, where no session limit counts it.
ADMIN_CLIENT_FDS = NATIVE_CLIENT_FDS + 1
# The native clients a door keeps besides the client door's attachments: lookup clients
# (grpc_door.CONTROL_CLIENTS_MAX, client door only), schema registry clients
# (grpc_door_schemas.REGISTRY_CLIENTS_MAX) and idle admin clients (grpc_admin_clients:
# 64 callers x 4), on either door.
CONTROL_CLIENTS = 64
REGISTRY_CLIENTS = 64
IDLE_ADMIN_CLIENTS = 64 * 4
# Calls the admin door runs at once (grpc's maximum_concurrent_rpcs): each holds an admin
# client of its own; one more is answered RESOURCE_EXHAUSTED.
ADMIN_CALLS_MAX = 64


@dataclass(frozen=True, slots=True)
class DoorLimits:
    """One door's grpc bounds, from the broker's config."""

    connections_max: int
    handshake_timeout_ms: int
    idle_timeout_ms: int
    # Largest gRPC message either way: the broker's frame limit, so a message the native
    # port would take passes the door and one over policies.max_message_size is refused
    # by the broker with its own reason (grpc's default would be 4 MiB).
    message_bytes_max: int
    # The door's pooled admin clients are closed idle this long: well before the admin
    # port cuts an idle connection (limits.connect_timeout_ms), which a kept DEALER would
    # answer by reconnecting at once, over and over.
    admin_client_idle_ms: int = 5000

    @classmethod
    def client_door(cls, config: BrokerConfig) -> DoorLimits:
        return cls._of(config, config.broker.grpc_connections_max)

    @classmethod
    def admin_door(cls, config: BrokerConfig) -> DoorLimits:
        return cls._of(config, config.broker.grpc_admin_connections_max)

    @classmethod
    def _of(cls, config: BrokerConfig, connections_max: int) -> DoorLimits:
        broker = config.broker
        return cls(connections_max=connections_max, handshake_timeout_ms=broker.grpc_handshake_timeout_ms,
                   idle_timeout_ms=broker.grpc_idle_timeout_ms, message_bytes_max=config.limits.frame_bytes_max,
                   admin_client_idle_ms=config.limits.connect_timeout_ms // 2)

    def server_options(self) -> list[tuple[str, int]]:
        return [
            ("grpc.max_allowed_incoming_connections", self.connections_max),
            # Covers TLS and, after it, the client's HTTP/2 preface and SETTINGS: a
            # connection that sends nothing is closed with a GOAWAY when it runs out.
            ("grpc.server_handshake_timeout_ms", self.handshake_timeout_ms),
            ("grpc.max_connection_idle_ms", self.idle_timeout_ms),
            ("grpc.max_receive_message_length", self.message_bytes_max),
            ("grpc.max_send_message_length", self.message_bytes_max),
        ]


def door_fds(config: BrokerConfig) -> int:
    """The most descriptors the configured doors may hold: their connection caps and
    the native clients each keeps for its callers."""
    broker = config.broker
    total = 0
    if broker.grpc_listen is not None:
        native = broker.grpc_attachments_max + CONTROL_CLIENTS + REGISTRY_CLIENTS
        total += broker.grpc_connections_max + NATIVE_CLIENT_FDS * native + ADMIN_CLIENT_FDS * IDLE_ADMIN_CLIENTS
    if broker.grpc_admin_listen is not None:
        admin = IDLE_ADMIN_CLIENTS + ADMIN_CALLS_MAX
        total += broker.grpc_admin_connections_max + NATIVE_CLIENT_FDS * REGISTRY_CLIENTS + ADMIN_CLIENT_FDS * admin
    return total


def native_fds(config: BrokerConfig) -> int:
    """The most descriptors the native ports may hold (sessions, and connections without
    one on either port), and the reserve for everything else."""
    limits = config.limits
    return limits.connections_max + 2 * limits.connections_pending_max + FDS_RESERVED


def raise_nofile(wanted: int) -> int:
    """This process's soft RLIMIT_NOFILE, raised towards `wanted` as far as the hard
    limit allows (as Go's runtime does for nats-server): a soft limit of 1024 is a
    distribution's default for interactive shells, not a choice made for a broker."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= wanted:
        return soft
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if target > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):
            return soft
        return target
    return soft


def check_fd_budget(config: BrokerConfig, nofile: int | None = None) -> None:
    """Refuse a configuration whose doors could take descriptors the native ports need:
    both together must fit `nofile` (default: this process's soft RLIMIT_NOFILE, first
    raised up to the hard limit when that is short)."""
    doors = door_fds(config)
    if doors == 0:
        return
    native = native_fds(config)
    if nofile is None:
        nofile = raise_nofile(doors + native)
    if nofile == resource.RLIM_INFINITY or doors + native <= nofile:
        return
    broker = config.broker
    raise ConfigError(
        f"config key 'broker.grpc_connections_max': the gRPC doors may hold {doors} file descriptors"
        f" (broker.grpc_connections_max {broker.grpc_connections_max},"
        f" broker.grpc_admin_connections_max {broker.grpc_admin_connections_max},"
        f" broker.grpc_attachments_max {broker.grpc_attachments_max}) and the native ports {native}"
        f" (limits.connections_max {config.limits.connections_max}, 2 x limits.connections_pending_max"
        f" {config.limits.connections_pending_max}, {FDS_RESERVED} reserved): {doors + native} in all, over"
        f" this process's RLIMIT_NOFILE of {nofile} (its hard limit). Raise `ulimit -Hn` or lower these settings.")

"""The ports `danube cluster up` and `join` are about to bind, checked before anything
starts: a port in use (a standalone broker on 6650, another cluster's supervisor)
fails the command at once, naming the port, what it was for and a free alternative,
instead of a broker that exits and is restarted until `up` gives up.

A port is free when a socket can bind it as ZeroMQ, thespian and the metrics server
do (SO_REUSEADDR: a connection of a stopped broker in TIME_WAIT is no conflict). A
port on an address that is not this host's (a broker placed on another host with
`--place`) is that host's to check: skipped here.
"""

from __future__ import annotations

import errno
import socket
from collections import defaultdict
from dataclasses import dataclass

import click

from danube_zmq.transport.errors import FailedPrecondition

_PORT_MAX = 65535


@dataclass(frozen=True)
class PortUse:
    """One port the command will bind: where, for what, and the option that set it."""

    address: str
    port: int
    option: str  # "--client-port": the first of its ports; the others count up
    what: str  # "the client port of broker-1"


def check_ports(uses: list[PortUse]) -> None:
    """Raise click.UsageError if two uses share a port, FailedPrecondition naming the
    first port in use (and the option's next free range)."""
    owners: dict[tuple[str, int], PortUse] = {}
    for use in uses:
        other = owners.setdefault((use.address, use.port), use)
        if other is not use:
            raise click.UsageError(f"port {use.port} would be both {other.what} ({other.option}) and {use.what}"
                                   f" ({use.option}): give them ranges that do not overlap")
    for use in uses:
        if in_use(use.address, use.port):
            raise FailedPrecondition(f"port {use.port} on {use.address} is in use; it would be {use.what}."
                                     f" Stop what listens there, or {_alternative(use, uses)}")


def in_use(address: str, port: int) -> bool:
    """Whether `address:port` is bound by another socket on this host (False for an
    address that is not this host's, or a name that does not resolve here)."""
    try:
        family, kind, proto, _, sockaddr = socket.getaddrinfo(address, port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror:
        return False
    with socket.socket(family, kind, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(sockaddr)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return True
            if exc.errno == errno.EADDRNOTAVAIL:
                return False
            raise
    return False


def _alternative(busy: PortUse, uses: list[PortUse]) -> str:
    """`pass --client-port N`: the first N above the option's own from which all of its
    ports are free and clear of the other options' ports."""
    by_option: dict[str, list[PortUse]] = defaultdict(list)
    for use in uses:
        by_option[use.option].append(use)
    mine = sorted(by_option[busy.option], key=lambda u: u.port)
    first = mine[0].port
    others = {(u.address, u.port) for u in uses if u.option != busy.option}
    span = mine[-1].port - first
    for start in range(first + 1, _PORT_MAX - span + 1):
        moved = [(u.address, start + (u.port - first)) for u in mine]
        if not any(m in others or in_use(*m) for m in moved):
            free = f"{start} is free" if span == 0 else f"{start}-{start + span} are free"
            return f"pass {busy.option} {start} ({free})"
    return f"pass another {busy.option}"

"""The HOST:PORT a server of `danube admin serve` listens on, and whether it is loopback
(beyond loopback the MCP server asks every caller for a token and the console serves
HTTPS only)."""

from __future__ import annotations

import ipaddress

from danube_zmq.transport.errors import InvalidArgument

__all__ = ["host_port", "is_loopback"]


def host_port(text: str, example: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise InvalidArgument(f"--listen {text!r}: expected HOST:PORT, e.g. {example}")
    return host, int(port)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False

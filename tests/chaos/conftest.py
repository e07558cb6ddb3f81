"""Fixtures of the chaos suite: namespace hosts (skipped only where this machine cannot
make network namespaces: not root, no iproute2)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest

from tests.chaos.harness.hosts import Hosts, install_tools, missing_prerequisites


def require_hosts() -> None:
    reason = missing_prerequisites()
    if reason is not None:
        pytest.skip(f"namespace hosts unavailable: {reason}")


@pytest.fixture
def hosts() -> Iterator[Hosts]:
    require_hosts()
    install_tools()
    with Hosts(3) as made:
        yield made


def namespaces() -> set[str]:
    return set(subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split())


def links() -> set[str]:
    out = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    return {line.split(":")[1].strip().split("@")[0] for line in out.splitlines()}


def tcp_reachable(source: object, address: str, port: int) -> bool:
    """Whether a process in host `source` (or the root namespace for None) can open a TCP
    connection to `address:port` within 2 s."""
    code = f"import socket; socket.create_connection(({address!r}, {port}), timeout=2).close()"
    argv = [sys.executable, "-c", code]
    if source is None:
        return subprocess.run(argv, capture_output=True, timeout=30).returncode == 0
    return source.run(argv, timeout=30).returncode == 0  # type: ignore[attr-defined]

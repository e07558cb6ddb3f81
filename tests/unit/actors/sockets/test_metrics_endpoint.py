"""The metrics endpoint (actors/sockets/metrics_endpoint.py) in process, on its own registry.

What prometheus_client's server lacks: a client stuck in the TLS handshake does not
hold up other scrapes, and connections past metrics_connections_max are closed at once.
"""

from __future__ import annotations

import socket
import ssl
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter

from danube_zmq.actors.sockets.metrics_endpoint import MetricsServer, start_metrics_server
from tests.tls_certs import self_signed_cert


@pytest.fixture
def registry() -> CollectorRegistry:
    registry = CollectorRegistry()
    Counter("danube_test_scrapes", "a series to find", registry=registry).inc()
    return registry


@pytest.fixture
def servers() -> Iterator[list[MetricsServer]]:
    started: list[MetricsServer] = []
    yield started
    for server in started:
        server.close()


def scrape(url: str, context: ssl.SSLContext | None = None) -> str:
    with urllib.request.urlopen(url, timeout=30, context=context) as response:
        return response.read().decode()


def test_a_silent_tls_client_does_not_block_other_scrapes(tmp_path: Path, registry: CollectorRegistry,
                                                          servers: list[MetricsServer]) -> None:
    """A connection that never starts its TLS handshake holds one slot, not the acceptor:
    a real scrape beside it is served (prometheus_client's server handshakes in its one
    accepting thread and would wait on the silent client)."""
    cert, key = self_signed_cert(tmp_path)
    server = start_metrics_server("127.0.0.1", 0, tls_cert_file=str(cert), tls_key_file=str(key), registry=registry)
    servers.append(server)
    assert server.url.startswith("https://127.0.0.1:")
    silent = socket.create_connection(("127.0.0.1", server.port))
    try:
        time.sleep(0.2)  # let the acceptor take the silent connection first
        body = scrape(server.url, ssl.create_default_context(cafile=str(cert)))
        assert "danube_test_scrapes_total 1.0" in body
    finally:
        silent.close()


def test_connections_past_the_bound_are_closed_at_once(registry: CollectorRegistry,
                                                       servers: list[MetricsServer]) -> None:
    """With metrics_connections_max 1, a second connection while the first is open is closed
    without an answer; once the first goes, scrapes are served again."""
    server = start_metrics_server("127.0.0.1", 0, connections_max=1, registry=registry)
    servers.append(server)
    holder = socket.create_connection(("127.0.0.1", server.port))
    try:
        deadline = time.monotonic() + 30
        while True:  # the holder is accepted (its slot taken) asynchronously
            extra = socket.create_connection(("127.0.0.1", server.port))
            extra.settimeout(30)
            try:
                extra.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
                answer = extra.recv(100)
            except ConnectionResetError:
                answer = b""
            finally:
                extra.close()
            if answer == b"" or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert answer == b""
    finally:
        holder.close()
    deadline = time.monotonic() + 30
    while True:
        try:
            assert "danube_test_scrapes_total" in scrape(server.url)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)

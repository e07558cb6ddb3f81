"""The broker's Prometheus endpoint: `GET /metrics` over HTTP or HTTPS, with basic auth.

prometheus_client's own `start_http_server` takes TLS but no basic auth, and does the
TLS handshake in its one accepting thread (a client that connects and says nothing holds
up every other scrape). This server is the same WSGI app with the three things a metrics
port on a network needs:

1. TLS (`security.metrics_tls_cert_file` / `_key_file`), the handshake done in the
   connection's own thread under a timeout;
2. basic auth (`security.metrics_basic_auth_file`, security/basic_auth.py): 401 without
   the right user and password;
3. a bound: at most `broker.metrics_connections_max` connections at once, one thread
   each; one more is closed at once.

It binds `broker.metrics_host` (loopback by default) and runs in daemon threads.

What it serves: danube's own families first (`curl /metrics | head` shows the broker,
not the interpreter), then, with `broker.metrics_process_collectors` (default on),
prometheus_client's process_*, python_info and python_gc_* families. No `_created`
series: prometheus_client adds one to every counter and histogram child, doubling the
counter lines for a timestamp Prometheus does not ingest by default.
"""

from __future__ import annotations

import logging
import socket
import socketserver
import ssl
import threading
from collections.abc import Callable, Iterable
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import GC_COLLECTOR, PLATFORM_COLLECTOR, PROCESS_COLLECTOR, REGISTRY, disable_created_metrics, make_wsgi_app
from prometheus_client.core import Metric
from prometheus_client.registry import CollectorRegistry

from danube_zmq.security.basic_auth import BasicAuth
from danube_zmq.transport.errors import ConfigError

log = logging.getLogger("danube_zmq.metrics")

# A scrape that has not sent its request (or finished the TLS handshake) in this long is cut.
REQUEST_TIMEOUT_S = 10.0
_REALM = 'Basic realm="danube metrics", charset="UTF-8"'


# prometheus_client registers these in its default registry when imported, so they come
# before anything the broker registers; the endpoint serves them after danube's instead.
PROCESS_COLLECTORS = (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR)


class _Families:
    """One collector yielding everything a registry holds (danube's families)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._registry = registry

    def describe(self) -> list[Metric]:
        return []  # no names: a `name[]` query still reaches every family through it

    def collect(self) -> Iterable[Metric]:
        return self._registry.collect()


def exposition(registry: CollectorRegistry = REGISTRY, *, process_collectors: bool = True) -> CollectorRegistry:
    """What the endpoint serves: `registry`'s families, then the process collectors when
    asked for; no `_created` series (a process-wide switch of prometheus_client)."""
    disable_created_metrics()
    for collector in PROCESS_COLLECTORS:
        try:
            registry.unregister(collector)
        except KeyError:
            pass  # not there: another registry, or taken out by an earlier broker of this process
    served = CollectorRegistry(auto_describe=False)
    served.register(_Families(registry))
    if process_collectors:
        for collector in PROCESS_COLLECTORS:
            served.register(collector)
    return served


def _with_basic_auth(app: Callable[..., Iterable[bytes]], auth: BasicAuth) -> Callable[..., Iterable[bytes]]:
    def guarded(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if not auth.check(environ.get("HTTP_AUTHORIZATION")):
            start_response("401 Unauthorized", [("WWW-Authenticate", _REALM), ("Content-Type", "text/plain"),
                                                ("Content-Length", "13")])
            return [b"unauthorized\n"]
        return app(environ, start_response)

    return guarded


class _Handler(WSGIRequestHandler):
    timeout = REQUEST_TIMEOUT_S  # StreamRequestHandler applies it to the connection

    def setup(self) -> None:
        self.request.settimeout(self.timeout)
        if isinstance(self.request, ssl.SSLSocket):
            self.request.do_handshake()  # here, in this connection's thread, not the acceptor's
        super().setup()

    def log_message(self, format: str, *args: Any) -> None:
        """Scrapes are not logged (one line per scrape would flood the broker's log)."""


class _Server(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True
    block_on_close = False
    connections_max = 16
    refused = 0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._slots = threading.BoundedSemaphore(self.connections_max)
        super().__init__(*args, **kwargs)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self.refused += 1
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A failed handshake (plain HTTP to the TLS port), a timeout, a reset: the client's
        # fault, not the broker's; no traceback on stderr as socketserver's default prints.
        log.debug("metrics request from %s failed", client_address, exc_info=True)


class MetricsServer:
    """A running endpoint; `close()` stops it and frees the port."""

    def __init__(self, httpd: _Server, thread: threading.Thread, url: str) -> None:
        self._httpd = httpd
        self._thread = thread
        self.url = url

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=2)


def _tls_context(cert_file: str, key_file: str) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(cert_file, key_file)
    except FileNotFoundError as err:
        raise ConfigError(f"security.metrics_tls_cert_file / _key_file: {err.filename!r} does not exist") from None
    except (ssl.SSLError, OSError) as err:
        raise ConfigError(f"security.metrics_tls_cert_file / _key_file: cannot load {cert_file!r} and {key_file!r}:"
                          f" {err}") from None
    return context


def start_metrics_server(host: str, port: int, *, tls_cert_file: str | None = None, tls_key_file: str | None = None,
                         basic_auth_file: str | None = None, connections_max: int = 16,
                         registry: CollectorRegistry = REGISTRY, process_collectors: bool = True) -> MetricsServer:
    """Serve `registry` (see `exposition`) on host:port (port 0 picks one) in a daemon thread."""
    app = make_wsgi_app(exposition(registry, process_collectors=process_collectors))
    if basic_auth_file is not None:
        app = _with_basic_auth(app, BasicAuth.from_file(basic_auth_file))
    context = _tls_context(tls_cert_file, tls_key_file) if tls_cert_file and tls_key_file else None
    server_class = type("MetricsHTTPServer", (_Server,), {
        "connections_max": connections_max,
        "address_family": socket.AF_INET6 if ":" in host else socket.AF_INET,
    })
    httpd = make_server(host, port, app, server_class, handler_class=_Handler)
    if context is not None:
        httpd.socket = context.wrap_socket(httpd.socket, server_side=True, do_handshake_on_connect=False)
    thread = threading.Thread(target=httpd.serve_forever, name="danube-metrics", daemon=True)
    thread.start()
    bound = int(httpd.server_address[1])
    shown = f"[{host}]" if ":" in host else host
    url = f"{'https' if context is not None else 'http'}://{shown}:{bound}/metrics"
    return MetricsServer(httpd, thread, url)

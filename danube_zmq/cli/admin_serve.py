"""`danube admin serve`: the admin plane for programs other than the CLI.

`--mode mcp` runs the MCP server of doors/mcp/server.py over stdio (an agent spawns
it) or streamable HTTP (`--transport http --listen HOST:PORT`, path /mcp). Over stdio
it dials the broker with the credentials `danube admin` was given (--token-file,
--server-key, --client-keys); over HTTP with each call's bearer token (or, with
`--trust-loopback` on loopback, those of the server when a call has none). The broker's
RBAC decides what a tool may do.
Read-only unless `--allow-writes`. With `--prometheus-url` its PromQL tools ask that
Prometheus (client/promql.py).

`--mode ui` runs the web console of doors/console/ (Starlette, served by uvicorn) at
http://HOST:PORT/. Every user logs in with their own Danube token (the token
`danube admin` was given is never used for them); the broker's RBAC decides what each
sees and may do. Beyond loopback it serves HTTPS only (--tls-cert/--tls-key), since a
token typed at the login must not cross the network in clear.
"""

from __future__ import annotations

import logging
import os
import urllib.parse
from typing import Any

import click

from danube_zmq.doors.listen import host_port, is_loopback
from danube_zmq.transport.errors import InvalidArgument

__all__ = ["serve"]

log = logging.getLogger(__name__)

DEFAULT_HTTP_LISTEN = "127.0.0.1:8765"
DEFAULT_UI_LISTEN = "127.0.0.1:8780"


@click.command("serve")
@click.option("--mode", type=click.Choice(["mcp", "ui"]), required=True,
              help="mcp: the MCP server for LLM agents; ui: the web console.")
@click.option("--transport", type=click.Choice(["stdio", "http"]), default="stdio", show_default=True,
              help="stdio: spawned by the MCP client; http: streamable HTTP at http://HOST:PORT/mcp.")
@click.option("--listen", default=None, metavar="HOST:PORT",
              help=f"Where --transport http [default: {DEFAULT_HTTP_LISTEN}] or the console [default:"
                   f" {DEFAULT_UI_LISTEN}] listens. Every MCP request over HTTP must carry its caller's token as"
                   " 'Authorization: Bearer <jwt>' (but see --trust-loopback); beyond loopback the console needs"
                   " --tls-cert and --tls-key.")
@click.option("--trust-loopback", is_flag=True,
              help="--transport http on loopback: a call without a bearer token acts with the credentials this"
                   " server was started with (any local process may then act as you). Without it every HTTP"
                   " call must carry 'Authorization: Bearer <jwt>'.")
@click.option("--allow-writes", is_flag=True,
              help="Offer the tools that change the cluster (create/delete topics, policies, RBAC...).")
@click.option("-s", "--service-url", envvar="DANUBE_SERVICE_URL", show_envvar=True, default=None, metavar="URL",
              help="Broker client endpoint, for the schema registry [default: the connected broker's].")
@click.option("--metrics-url", default=None, metavar="URL",
              help="The Prometheus page the metrics tool and resource read [default: the connected broker's].")
@click.option("--prometheus-url", envvar="DANUBE_PROMETHEUS_URL", show_envvar=True, default=None, metavar="URL",
              help="Prometheus scraping the brokers (http://HOST:9090): for the MCP query_prometheus and"
                   " topic_metrics tools, and the console's charts (history and latency percentiles).")
@click.option("--tls-cert", type=click.Path(exists=True, dir_okay=False), default=None,
              help="--mode ui: serve HTTPS with this certificate (PEM); required beyond loopback.")
@click.option("--tls-key", type=click.Path(exists=True, dir_okay=False), default=None,
              help="--mode ui: the certificate's private key (PEM).")
@click.option("--allowed-host", "allowed_hosts", multiple=True, metavar="NAME",
              help="--mode ui: a host name the console is reached by, beside its --listen address and"
                   " localhost (repeatable). Requests naming any other Host are refused (DNS rebinding).")
@click.option("--refresh-ms", type=click.IntRange(250, 3_600_000), default=5000, show_default=True,
              help="--mode ui: how often a topic page's charts take a new sample.")
@click.pass_context
def serve(ctx: click.Context, mode: str, transport: str, listen: str | None, trust_loopback: bool,
          allow_writes: bool,
          service_url: str | None, metrics_url: str | None, tls_cert: str | None, tls_key: str | None,
          prometheus_url: str | None, refresh_ms: int, allowed_hosts: tuple[str, ...]) -> None:
    """Serve the admin API to MCP clients (LLM agents), or the web console.

    \b
    Examples:
      danube admin serve --mode mcp
      danube admin --token-file ops.jwt serve --mode mcp --allow-writes
      danube admin serve --mode mcp --transport http --listen 127.0.0.1:8765
      danube admin --token-file ops.jwt serve --mode mcp --transport http --trust-loopback
      danube admin serve --mode ui                      # http://127.0.0.1:8780/
      danube admin --server-key cluster.key serve --mode ui --listen 0.0.0.0:8443 \\
          --tls-cert console.crt --tls-key console.key
      danube admin serve --mode mcp --prometheus-url http://127.0.0.1:9090
    """
    settings = ctx.parent.obj if ctx.parent is not None else None
    assert settings is not None, "the admin group stores its settings"
    if prometheus_url is not None and urllib.parse.urlsplit(prometheus_url).scheme not in ("http", "https"):
        raise click.UsageError(f"--prometheus-url {prometheus_url!r}: expected http://HOST:PORT or https://...")
    if mode == "ui":
        if trust_loopback:
            raise click.UsageError("--trust-loopback applies to --mode mcp --transport http only")
        _serve_ui(settings, listen or DEFAULT_UI_LISTEN, service_url, tls_cert, tls_key, refresh_ms, prometheus_url,
                  allowed_hosts)
        return
    if tls_cert or tls_key or allowed_hosts:
        raise click.UsageError("--tls-cert, --tls-key and --allowed-host apply to --mode ui only")
    if listen is not None and transport != "http":
        raise click.UsageError("--listen applies to --transport http only")
    try:
        from danube_zmq.doors.mcp.server import McpSettings, build_server
    except ImportError as err:
        raise InvalidArgument(f"the MCP server needs the mcp package ({err}): pip install 'danube-zmq[mcp]'") from None

    host, port = host_port(listen or DEFAULT_HTTP_LISTEN, DEFAULT_HTTP_LISTEN)
    if trust_loopback and (transport != "http" or not is_loopback(host)):
        raise click.UsageError("--trust-loopback applies to --transport http on a loopback --listen only")
    server = build_server(McpSettings(
        admin_endpoint=settings.endpoint, timeout_ms=settings.timeout_ms, allow_writes=allow_writes,
        service_url=service_url, metrics_url=metrics_url, prometheus_url=prometheus_url,
        require_bearer=transport == "http" and not trust_loopback))
    if transport == "stdio":
        # stdout is the MCP channel: logs stay on stderr (the CLI's handler).
        server.run("stdio")
        return
    click.echo(f"MCP server on http://{host}:{port}/mcp ({'read-write' if allow_writes else 'read-only'})",
               err=True)
    server.run("streamable-http", host=host, port=port)


def _serve_ui(settings: Any, listen: str, service_url: str | None, tls_cert: str | None, tls_key: str | None,
              refresh_ms: int, prometheus_url: str | None, allowed_hosts: tuple[str, ...]) -> None:
    if (tls_cert is None) != (tls_key is None):
        raise click.UsageError("give --tls-cert and --tls-key together")
    host, port = host_port(listen, DEFAULT_UI_LISTEN)
    if not is_loopback(host) and tls_cert is None:
        raise click.UsageError(f"--listen {listen} is beyond loopback: the console takes users' tokens, so it"
                               " serves HTTPS only there; give --tls-cert and --tls-key")
    try:
        import uvicorn

        from danube_zmq.doors.console.app import build_app, console_hosts
        from danube_zmq.doors.console.backend import ConsoleSettings
    except ImportError as err:
        raise InvalidArgument(f"the web console needs its extra ({err}): pip install 'danube-zmq[ui]'") from None
    app = build_app(ConsoleSettings(admin_endpoint=settings.endpoint, timeout_ms=settings.timeout_ms,
                                    server_public_key=os.environ.get("DANUBE_SERVER_KEY") or None,
                                    service_url=service_url, refresh_ms=refresh_ms,
                                    prometheus_url=prometheus_url),
                    hosts=(hosts := console_hosts(host, allowed_hosts)), secure_cookies=tls_cert is not None)
    scheme = "https" if tls_cert else "http"
    click.echo(f"Danube console on {scheme}://{host}:{port}/ (broker {settings.endpoint}); it answers to the host"
               f" names {', '.join(sorted(hosts))}", err=True)
    uvicorn.run(app, host=host, port=port, ssl_certfile=tls_cert, ssl_keyfile=tls_key,
                log_level=logging.getLevelName(logging.getLogger().getEffectiveLevel()).lower(),
                server_header=False)

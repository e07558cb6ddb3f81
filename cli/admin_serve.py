"""`danube admin serve`: the admin plane for programs other than the CLI.

`--mode mcp` runs the MCP server of cli/mcp_server.py over stdio (an agent spawns
it) or streamable HTTP (`--transport http --listen HOST:PORT`, path /mcp). It
dials the broker with the credentials `danube admin` was given (--token-file,
--server-key, --client-keys), so the broker's RBAC decides what a tool may do.
Read-only unless `--allow-writes`. With `--prometheus-url` its PromQL tools ask that
Prometheus (cli/promql.py). `--mode ui` (the web console) is not built yet.
"""

from __future__ import annotations

import logging
import urllib.parse

import click

from danube_zmq.transport.errors import InvalidArgument

__all__ = ["serve"]

log = logging.getLogger(__name__)

DEFAULT_HTTP_LISTEN = "127.0.0.1:8765"


def _host_port(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise InvalidArgument(f"--listen {text!r}: expected HOST:PORT, e.g. {DEFAULT_HTTP_LISTEN}")
    return host, int(port)


@click.command("serve")
@click.option("--mode", type=click.Choice(["mcp", "ui"]), required=True,
              help="mcp: the MCP server for LLM agents; ui: the web console (not yet).")
@click.option("--transport", type=click.Choice(["stdio", "http"]), default="stdio", show_default=True,
              help="stdio: spawned by the MCP client; http: streamable HTTP at http://HOST:PORT/mcp.")
@click.option("--listen", default=None, metavar="HOST:PORT",
              help=f"Where --transport http listens [default: {DEFAULT_HTTP_LISTEN}]. Beyond loopback every"
                   " request must carry its caller's token as 'Authorization: Bearer <jwt>'.")
@click.option("--allow-writes", is_flag=True,
              help="Offer the tools that change the cluster (create/delete topics, policies, RBAC...).")
@click.option("-s", "--service-url", envvar="DANUBE_SERVICE_URL", show_envvar=True, default=None, metavar="URL",
              help="Broker client endpoint, for the schema registry [default: the connected broker's].")
@click.option("--metrics-url", default=None, metavar="URL",
              help="The Prometheus page the metrics tool and resource read [default: the connected broker's].")
@click.option("--prometheus-url", envvar="DANUBE_PROMETHEUS_URL", show_envvar=True, default=None, metavar="URL",
              help="Prometheus scraping the brokers (http://HOST:9090), for the query_prometheus and"
                   " topic_metrics tools [default: none; those tools say how to give one].")
@click.pass_context
def serve(ctx: click.Context, mode: str, transport: str, listen: str | None, allow_writes: bool,
          service_url: str | None, metrics_url: str | None, prometheus_url: str | None) -> None:
    """Serve the admin API to MCP clients (LLM agents).

    \b
    Examples:
      danube admin serve --mode mcp
      danube admin --token-file ops.jwt serve --mode mcp --allow-writes
      danube admin serve --mode mcp --transport http --listen 127.0.0.1:8765
      danube admin serve --mode mcp --prometheus-url http://127.0.0.1:9090
    """
    if mode == "ui":
        raise click.UsageError("--mode ui (the web console) is not built yet; use --mode mcp")
    if listen is not None and transport != "http":
        raise click.UsageError("--listen applies to --transport http only")
    if prometheus_url is not None and urllib.parse.urlsplit(prometheus_url).scheme not in ("http", "https"):
        raise click.UsageError(f"--prometheus-url {prometheus_url!r}: expected http://HOST:PORT or https://...")
    try:
        from danube_zmq.cli.mcp_server import McpSettings, build_server, is_loopback
    except ImportError as err:
        raise InvalidArgument(f"the MCP server needs the mcp package ({err}): pip install 'danube-zmq[mcp]'") from None

    settings = ctx.parent.obj if ctx.parent is not None else None
    assert settings is not None, "the admin group stores its settings"
    host, port = _host_port(listen or DEFAULT_HTTP_LISTEN)
    server = build_server(McpSettings(
        admin_endpoint=settings.endpoint, timeout_ms=settings.timeout_ms, allow_writes=allow_writes,
        service_url=service_url, metrics_url=metrics_url, prometheus_url=prometheus_url,
        require_bearer=transport == "http" and not is_loopback(host)))
    if transport == "stdio":
        # stdout is the MCP channel: logs stay on stderr (the CLI's handler).
        server.run("stdio")
        return
    click.echo(f"MCP server on http://{host}:{port}/mcp ({'read-write' if allow_writes else 'read-only'})",
               err=True)
    server.run("streamable-http", host=host, port=port)

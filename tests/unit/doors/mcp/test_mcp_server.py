"""The parts of the MCP server (doors/mcp/server.py) that need no broker: whose credentials
a call dials with, which listen addresses count as loopback, and the metric filter."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from mcp.server.mcpserver.exceptions import ResourceError, ToolError

from danube_zmq.doors.mcp import server as mcp_server
from danube_zmq.doors.mcp.server import McpSettings, is_loopback


def settings(**overrides: object) -> McpSettings:
    return McpSettings(**{"admin_endpoint": "tcp://127.0.0.1:1", "timeout_ms": 1000, "allow_writes": False,
                          **overrides})


def test_beyond_loopback_a_call_without_a_bearer_token_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """With require_bearer (HTTP beyond loopback) a request without `Authorization: Bearer`
    is refused before any connection; one with it dials with that token, the cluster's
    server key from the environment and a fresh key pair (use_env False), never the
    server's own token."""
    monkeypatch.setenv("DANUBE_SERVER_KEY", "K" * 40)
    monkeypatch.setenv("DANUBE_TOKEN", "the-servers-own")
    broker = mcp_server._Broker(settings(require_bearer=True))
    with pytest.raises(ToolError, match="Authorization: Bearer"):
        broker._credentials(SimpleNamespace(headers={}))
    with pytest.raises(ToolError, match="Authorization: Bearer"):
        broker._credentials(SimpleNamespace(headers={"authorization": "Basic eDp5"}))
    assert broker._credentials(SimpleNamespace(headers={"authorization": "Bearer abc.def"})) == {
        "token": "abc.def", "server_public_key": "K" * 40, "use_env": False}
    # On loopback (or stdio, no headers) the server's own credentials, from the environment.
    assert mcp_server._Broker(settings())._credentials(SimpleNamespace(headers=None)) == {}


@pytest.mark.parametrize(("host", "loopback"), [("127.0.0.1", True), ("127.0.0.2", True), ("::1", True),
                                                ("localhost", True), ("0.0.0.0", False), ("10.1.2.3", False),
                                                ("::", False), ("broker.example", False)])
def test_loopback_hosts(host: str, loopback: bool) -> None:
    """Only loopback addresses may serve HTTP without bearer tokens; a name other than
    localhost may resolve anywhere, so it is not loopback."""
    assert is_loopback(host) is loopback


METRICS = """\
# HELP danube_topic_messages_in_total Messages received.
# TYPE danube_topic_messages_in_total counter
danube_topic_messages_in_total{topic="/a/x"} 3.0
danube_topic_messages_in_total{topic="/a/y"} 4.0
# HELP process_cpu_seconds_total CPU.
# TYPE process_cpu_seconds_total counter
process_cpu_seconds_total 1.5
"""


def test_metric_samples_filter_by_prefix_and_labels_and_stop_at_the_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    """Samples are kept by name prefix and by every label pair given; past the bound the
    answer says it was truncated."""
    everything = mcp_server._metric_samples(METRICS, "", {})
    assert [s["name"] for s in everything["samples"]] == ["danube_topic_messages_in_total"] * 2 + [
        "process_cpu_seconds_total"]
    one = mcp_server._metric_samples(METRICS, "danube_", {"topic": "/a/y"})
    assert one == {"samples": [{"name": "danube_topic_messages_in_total", "labels": {"topic": "/a/y"},
                                "value": 4.0}], "truncated": False}
    monkeypatch.setattr(mcp_server, "METRIC_SAMPLES_MAX", 1)
    assert mcp_server._metric_samples(METRICS, "danube_", {})["truncated"] is True


async def test_beyond_loopback_the_metrics_resource_needs_a_metrics_url() -> None:
    """A resource read has no caller to take a bearer token from: beyond loopback without
    --metrics-url the metrics resource says what to give instead of using the server's
    own credentials."""
    server = mcp_server.build_server(settings(require_bearer=True))
    with pytest.raises(ResourceError, match="--metrics-url"):
        await server.read_resource(mcp_server.METRICS_URI)

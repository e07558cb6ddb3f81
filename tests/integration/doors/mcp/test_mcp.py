"""`danube admin serve --mode mcp` against a real broker, through the mcp SDK's own
`ClientSession`: over stdio (the session spawns the server, as an agent does) and over
streamable HTTP (the server started on a free port). Every read tool is called and its
answer checked against what the test put in the broker; write tools are absent and
refused without --allow-writes and work with it; on a secured broker the broker's RBAC
decides, with the token the server was started with or the HTTP caller's bearer token."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

from danube_zmq import DanubeClient
from danube_zmq.client.admin import AdminClient
from danube_zmq.client.schemas import SchemaRegistryClient
from danube_zmq.doors.mcp.server import METRICS_URI, WRITE_TOOLS
from danube_zmq.security.tokens import TokenSigner
from danube_zmq.transport.client_protocol import DispatchStrategy
from tests.integration.conftest import (
    BrokerProcess,
    allow_client_key,
    free_port,
    make_curve_keys,
    start_broker,
    write_jwt_secret,
)

TOPIC = "/mcpns/orders"
SUBSCRIPTION = "audit"
SUBJECT = "orders-value"
MESSAGES = 5
JSON_SCHEMA = '{"type": "object", "properties": {"id": {"type": "integer"}}}'

# Arguments for every read tool; a read tool missing here fails the listing test.
READ_ARGUMENTS: dict[str, dict[str, Any]] = {
    "cluster_status": {},
    "list_brokers": {},
    "get_leader": {},
    "get_cluster_balance": {},
    "list_namespaces": {},
    "get_namespace_policies": {"namespace": "mcpns"},
    "list_topics": {"namespace": "mcpns"},
    "describe_topic": {"topic": TOPIC},
    "list_subscriptions": {"topic": TOPIC},
    "get_topic_policies": {"topic": TOPIC},
    "get_subscription_policies": {"topic": TOPIC, "subscription": SUBSCRIPTION},
    "list_schema_subjects": {},
    "get_schema": {"subject": SUBJECT},
    "list_schema_versions": {"subject": SUBJECT},
    "get_schema_compatibility_mode": {"subject": SUBJECT},
    "check_schema_compatibility": {"subject": SUBJECT, "schema_type": "json_schema", "definition": JSON_SCHEMA},
    "list_roles": {},
    "list_bindings": {},
    "list_client_keys": {},
    "list_revoked_tokens": {},
    "analyze_consumer_lag": {"topic": TOPIC, "subscription": SUBSCRIPTION},
    "health_check": {},
    "get_metrics": {"name_prefix": "danube_"},
}
# Read tools that ask Prometheus: without --prometheus-url they say how to give one
# (tests/integration/doors/mcp/test_mcp_prometheus.py runs them against a fake Prometheus).
PROMETHEUS_ARGUMENTS: dict[str, dict[str, Any]] = {
    "query_prometheus": {"promql": "up"},
    "topic_metrics": {"topic": TOPIC},
}


def _server_args(broker: BrokerProcess | str, *extra: str, admin_flags: tuple[str, ...] = ()) -> list[str]:
    endpoint = broker if isinstance(broker, str) else broker.admin_url
    return ["-m", "danube_zmq.cli.main", "admin", "--endpoint", endpoint, *admin_flags,
            "serve", "--mode", "mcp", *extra]


@asynccontextmanager
async def stdio_session(broker: BrokerProcess | str, *extra: str,
                        admin_flags: tuple[str, ...] = ()) -> AsyncIterator[ClientSession]:
    # The SDK passes the server a filtered environment (no DANUBE_*): what it needs is in the flags.
    params = StdioServerParameters(command=sys.executable, args=_server_args(broker, *extra, admin_flags=admin_flags))
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        yield session


@asynccontextmanager
async def http_server(broker: BrokerProcess, *extra: str, admin_flags: tuple[str, ...] = ()) -> AsyncIterator[str]:
    """`serve --transport http` on a free loopback port; yields its /mcp URL. No DANUBE_*
    variable of the environment the tests run in reaches it: what it needs is in the flags."""
    port = free_port()
    env = {name: value for name, value in os.environ.items() if not name.startswith("DANUBE_")}
    process = subprocess.Popen([sys.executable, *_server_args(broker, "--transport", "http", "--listen",
                                                              f"127.0.0.1:{port}", *extra, admin_flags=admin_flags)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    try:
        deadline = time.monotonic() + 30
        while True:
            assert process.poll() is None, process.stderr.read().decode() if process.stderr else ""
            try:
                await asyncio.open_connection("127.0.0.1", port)
                break
            except OSError:
                assert time.monotonic() < deadline, "the MCP HTTP server did not listen within 30 s"
                await asyncio.sleep(0.1)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        process.terminate()
        process.wait(15)


@asynccontextmanager
async def http_session(url: str, bearer: str | None = None) -> AsyncIterator[ClientSession]:
    headers = {"Authorization": f"Bearer {bearer}"} if bearer else {}
    async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(60)) as http, \
            streamable_http_client(url, http_client=http) as (read, write), \
            ClientSession(read, write) as session:
        await session.initialize()
        yield session


def answer(result: Any) -> dict[str, Any]:
    assert not result.is_error, result.content
    return json.loads(result.content[0].text)


def refusal(result: Any) -> str:
    assert result.is_error, result.content
    return result.content[0].text


@pytest.fixture
def stocked(broker_factory) -> Iterator[BrokerProcess]:
    """A broker with metrics, a namespace, a reliable topic whose subscription `audit`
    holds MESSAGES unacknowledged messages and no consumer, a role and a schema subject."""
    broker = broker_factory("--metrics-port", str(free_port()))

    async def stock() -> None:
        async with AdminClient(broker.admin_url) as admin:
            await admin.create_namespace("mcpns")
            await admin.create_topic(TOPIC, 0, DispatchStrategy.RELIABLE)
            await admin.create_role("reader", ["Consume", "Lookup"])
        async with DanubeClient(broker.url) as client:
            consumer = await client.subscribe(TOPIC, SUBSCRIPTION, initial_position="earliest")
            await consumer.close()
            producer = await client.create_producer(TOPIC, dispatch=DispatchStrategy.RELIABLE)
            for index in range(MESSAGES):
                await producer.send(f"m{index}".encode())
        async with SchemaRegistryClient(broker.url) as registry:
            await registry.register(SUBJECT, "json_schema", JSON_SCHEMA.encode())

    asyncio.run(stock())
    yield broker


def check_read_answers(answers: dict[str, dict[str, Any]]) -> None:
    """What the stocked broker must show through the read tools."""
    assert answers["cluster_status"]["term"] >= 1
    assert answers["get_leader"]["leader_node_id"] == answers["cluster_status"]["leader_id"]
    assert answers["get_leader"]["broker"] == answers["list_brokers"]["brokers"][0]
    assert len(answers["list_brokers"]["brokers"]) == 1
    assert "mcpns" in answers["list_namespaces"]["namespaces"]
    assert [t["name"] for t in answers["list_topics"]["topics"]] == [TOPIC]
    assert answers["list_topics"]["topics"][0]["dispatch_strategy"] == "reliable"
    assert answers["describe_topic"]["partitions"][0]["next_offset"] == MESSAGES
    broker = answers["list_brokers"]["brokers"][0]
    assert (broker["name"], broker["node_id"]) == ("broker-1", 1)  # beside its id, as `cluster status` names it
    assert answers["describe_topic"]["broker_names"] == {str(broker["broker_id"]): "broker-1"}
    assert answers["list_topics"]["broker_names"] == {str(broker["broker_id"]): "broker-1"}
    assert answers["list_subscriptions"]["subscriptions"] == [SUBSCRIPTION]
    assert answers["get_namespace_policies"]["limits"]["topics_max_source"]
    assert answers["get_topic_policies"]["schema"] is None
    assert answers["get_topic_policies"]["policies"]["values"]["max_message_size"] > 0
    assert answers["get_namespace_policies"]["policies"]
    assert answers["get_namespace_policies"]["auto_topic_creation"]["auto_topic_creation_dispatch"] == "non_reliable"
    assert answers["get_subscription_policies"]["dispatch_config"]["max_unacked_messages"] >= 1
    assert [s["subject"] for s in answers["list_schema_subjects"]["subjects"]] == [SUBJECT]
    assert answers["get_schema"]["version"] == 1 and '"integer"' in answers["get_schema"]["definition"]
    assert [v["version"] for v in answers["list_schema_versions"]["versions"]] == [1]
    assert answers["get_schema_compatibility_mode"]["mode"]
    assert answers["check_schema_compatibility"]["compatible"] is True
    assert answers["list_roles"]["roles"] == [{"name": "reader", "permissions": ["Consume", "Lookup"]}]
    assert answers["list_bindings"]["bindings"] == []
    assert answers["list_client_keys"]["client_keys"] == []
    assert answers["list_revoked_tokens"]["revoked_tokens"] == []
    lag = answers["analyze_consumer_lag"]
    assert lag["lag_messages_total"] == MESSAGES
    assert any("no consumer" in finding for finding in lag["findings"]), lag
    health = answers["health_check"]
    assert health["healthy"] is False and health["topics_checked"] == 1
    assert health["problems"] == [f"subscription {SUBSCRIPTION} on {TOPIC} has {MESSAGES} messages waiting and"
                                  " no consumer"], health
    names = {sample["name"] for sample in answers["get_metrics"]["samples"]}
    assert names and all(name.startswith("danube_") for name in names)


async def test_stdio_lists_read_tools_only_and_answers_each_with_the_brokers_data(stocked: BrokerProcess) -> None:
    """Over stdio without --allow-writes: the tools listed are exactly the read tools
    (each with a description and an input schema describing its parameters); each, called, answers with what the
    broker holds; a write tool called by name is refused saying --allow-writes, and the
    broker is unchanged; the prompts and the metrics resource are there."""
    async with stdio_session(stocked) as session:
        tools = (await session.list_tools()).tools
        assert {tool.name for tool in tools} == set(READ_ARGUMENTS) | set(PROMETHEUS_ARGUMENTS)
        for tool in tools:
            assert tool.description and "changes nothing" in tool.description
            assert tool.input_schema["type"] == "object"
            assert tool.annotations is not None and tool.annotations.read_only_hint is True
            for name in ("topic", "namespace", "subscription", "subject"):
                if name in tool.input_schema["properties"]:
                    assert tool.input_schema["properties"][name].get("description"), (tool.name, name)

        answers = {name: answer(await session.call_tool(name, arguments))
                   for name, arguments in READ_ARGUMENTS.items()}
        check_read_answers(answers)
        for name, arguments in PROMETHEUS_ARGUMENTS.items():
            assert "--prometheus-url" in refusal(await session.call_tool(name, arguments))

        message = refusal(await session.call_tool("create_topic", {"topic": "/mcpns/sneaky"}))
        assert "read-only" in message and "--allow-writes" in message
        listed = answer(await session.call_tool("list_topics", {"namespace": "mcpns"}))
        assert [t["name"] for t in listed["topics"]] == [TOPIC]

        assert "NOT_FOUND" in refusal(await session.call_tool("describe_topic", {"topic": "/mcpns/missing"}))

        prompts = {prompt.name for prompt in (await session.list_prompts()).prompts}
        assert prompts == {"cluster_health", "lag_analysis"}
        lag_prompt = await session.get_prompt("lag_analysis", {"topic": TOPIC})
        assert "analyze_consumer_lag" in lag_prompt.messages[0].content.text

        resources = (await session.list_resources()).resources
        assert [str(r.uri) for r in resources] == [METRICS_URI]
        text = (await session.read_resource(METRICS_URI)).contents[0].text
        assert "# TYPE danube_" in text


async def test_http_with_allow_writes_lists_and_runs_write_tools(stocked: BrokerProcess) -> None:
    """Over streamable HTTP with --allow-writes: the write tools are listed too, marked as
    changing the cluster; create_topic creates a topic the broker then lists,
    set_dispatch_config changes what get_subscription_policies reads, delete_topic
    removes it; a broker's refusal comes back as the tool's error with its code."""
    async with http_server(stocked, "--allow-writes", "--trust-loopback") as url, http_session(url) as session:
        tools = {tool.name: tool for tool in (await session.list_tools()).tools}
        assert set(tools) == set(READ_ARGUMENTS) | set(PROMETHEUS_ARGUMENTS) | set(WRITE_TOOLS)
        assert tools["delete_topic"].description.startswith("CHANGES THE CLUSTER")
        assert tools["delete_topic"].annotations.destructive_hint is True

        answer(await session.call_tool("create_topic", {"topic": "/mcpns/made", "partitions": 2,
                                                        "dispatch_strategy": "reliable"}))
        listed = answer(await session.call_tool("list_topics", {"namespace": "mcpns"}))
        assert {t["name"]: t["partitions"] for t in listed["topics"]} == {TOPIC: 0, "/mcpns/made": 2}
        assert "ALREADY_EXISTS" in refusal(await session.call_tool("create_topic", {"topic": "/mcpns/made"}))

        answer(await session.call_tool("set_dispatch_config", {"topic": TOPIC, "subscription": SUBSCRIPTION,
                                                               "max_unacked_messages": 7}))
        policies = answer(await session.call_tool("get_subscription_policies",
                                                  {"topic": TOPIC, "subscription": SUBSCRIPTION}))
        assert policies["dispatch_config"] == {"max_unacked_messages": 7, "explicit": True}

        answer(await session.call_tool("delete_topic", {"topic": "/mcpns/made"}))
        listed = answer(await session.call_tool("list_topics", {"namespace": "mcpns"}))
        assert [t["name"] for t in listed["topics"]] == [TOPIC]


async def test_an_unreachable_broker_is_the_tools_error_and_the_server_keeps_serving() -> None:
    """With no broker at the endpoint a tool answers UNAVAILABLE naming the endpoint (an
    error the model reads, not a crash), and the server answers the next call too."""
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    async with stdio_session(endpoint, admin_flags=("--timeout-ms", "300")) as session:
        for _ in range(2):
            message = refusal(await session.call_tool("list_namespaces", {}))
            assert "UNAVAILABLE: no answer" in message and endpoint in message, message
        assert {tool.name for tool in (await session.list_tools()).tools} == set(READ_ARGUMENTS) | set(
            PROMETHEUS_ARGUMENTS)


def test_serve_refuses_bad_listen_and_tls_options() -> None:
    """--listen that is not HOST:PORT is named; a --prometheus-url that is not http(s) is
    refused before serving; the console beyond loopback without TLS is refused (users
    type their tokens into it), and the TLS options belong to the console only."""
    base = [sys.executable, "-m", "danube_zmq.cli.main", "admin", "serve"]
    done = subprocess.run([*base, "--mode", "ui", "--listen", "0.0.0.0:8780"], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2 and "serves HTTPS only there" in done.stderr
    done = subprocess.run([*base, "--mode", "mcp", "--tls-cert", __file__, "--tls-key", __file__],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "apply to --mode ui only" in done.stderr
    done = subprocess.run([*base, "--mode", "mcp", "--transport", "http", "--listen", "nowhere"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "expected HOST:PORT" in done.stderr
    done = subprocess.run([*base, "--mode", "mcp", "--prometheus-url", "127.0.0.1:9090"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "--prometheus-url" in done.stderr and "http://" in done.stderr


@pytest.fixture
def secured(tmp_path: Path) -> Iterator[tuple[BrokerProcess, dict[str, str], TokenSigner]]:
    """A broker in security.mode curve with JWTs; `alice` is a super admin. Yields the
    broker, the environment a client needs (the cluster's public key) and a signer."""
    keys = make_curve_keys(tmp_path / "keys")
    secret, secret_env = write_jwt_secret(tmp_path)
    broker = start_broker(tmp_path, env={**keys.broker_env(), **secret_env})
    try:
        allow_client_key([broker], keys)
        signer = TokenSigner("HS256", secret, issuer="danube", audience="danube", now_s=time.time)
        yield broker, {"DANUBE_SERVER_KEY": keys.server_public_key}, signer
    finally:
        code = broker.stop()
        assert code == 0, f"broker did not stop cleanly (exit {code}):\n{broker.log()}"


async def test_secured_broker_decides_with_the_callers_token(secured, tmp_path: Path) -> None:
    """On a secured broker the server dials with the token it was started with
    (--token-file, over CURVE with --server-key): a token bound to no role is refused
    PERMISSION_DENIED by the broker, for reads and, with --allow-writes, for writes, and
    nothing is created. Over HTTP a caller's bearer token is used instead: alice's (a super
    admin) reads and writes on the same server."""
    broker, env, signer = secured
    token_file = tmp_path / "nobody.jwt"
    token_file.write_text(signer.create("nobody", "user", 600))
    flags = ("--server-key", env["DANUBE_SERVER_KEY"], "--token-file", str(token_file))

    async with stdio_session(broker, "--allow-writes", admin_flags=flags) as session:
        assert "PERMISSION_DENIED" in refusal(await session.call_tool("list_namespaces", {}))
        assert "PERMISSION_DENIED" in refusal(await session.call_tool("create_namespace", {"namespace": "evil"}))

    async with http_server(broker, "--allow-writes", "--trust-loopback", admin_flags=flags) as url:
        async with http_session(url) as session:
            assert "PERMISSION_DENIED" in refusal(await session.call_tool("list_namespaces", {}))
        async with http_session(url, bearer=signer.create("alice", "user", 600)) as session:
            answer(await session.call_tool("create_namespace", {"namespace": "granted"}))
            namespaces = answer(await session.call_tool("list_namespaces", {}))["namespaces"]
            assert "granted" in namespaces and "evil" not in namespaces


async def test_an_http_call_without_a_bearer_never_acts_as_the_operator(secured, tmp_path: Path) -> None:
    """The server was started with a super admin's token. Over HTTP, even on loopback, a
    call that brings no bearer token is refused, saying what to send, and creates nothing;
    only `--trust-loopback` lets such a call act with the server's own token."""
    broker, env, signer = secured
    token_file = tmp_path / "alice.jwt"
    token_file.write_text(signer.create("alice", "user", 600))
    flags = ("--server-key", env["DANUBE_SERVER_KEY"], "--token-file", str(token_file))
    async with http_server(broker, "--allow-writes", admin_flags=flags) as url:
        async with http_session(url) as session:
            why = refusal(await session.call_tool("create_namespace", {"namespace": "stolen"}))
            assert "Authorization: Bearer" in why and "--trust-loopback" in why
            assert "Authorization: Bearer" in refusal(await session.call_tool("list_namespaces", {}))
    async with http_server(broker, "--allow-writes", "--trust-loopback", admin_flags=flags) as url:
        async with http_session(url) as session:
            namespaces = answer(await session.call_tool("list_namespaces", {}))["namespaces"]
            assert "stolen" not in namespaces
    done = subprocess.run([sys.executable, "-m", "danube_zmq.cli.main", "admin", "serve", "--mode", "mcp",
                           "--transport", "http", "--listen", "0.0.0.0:1", "--trust-loopback"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "--trust-loopback applies to" in done.stderr

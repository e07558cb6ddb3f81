"""The MCP server's PromQL tools (`query_prometheus`, `topic_metrics`) through the mcp
SDK's own `ClientSession` over stdio, with `--prometheus-url` pointing at a fake
Prometheus in a thread (tests/fake_prometheus.py) that records what it is asked and
answers canned JSON. No broker is needed: these tools ask Prometheus only (the admin
endpoint given is one nobody listens on)."""

from __future__ import annotations

import datetime
import json
import time
from typing import Any

from danube_zmq.client import promql
from tests.fake_prometheus import error, fake_prometheus, success
from tests.integration.conftest import free_port
from tests.integration.doors.mcp.test_mcp import answer, refusal, stdio_session

TOPIC = "/mcpns/orders"
VECTOR = {"resultType": "vector", "result": [{"metric": {"job": "danube"}, "value": [1764072000.0, "1"]}]}


def matrix(values: list[str]) -> dict[str, Any]:
    return {"resultType": "matrix", "result": [
        {"metric": {"topic": TOPIC, "subscription": "audit"},
         "values": [[1764072000.0 + 15 * i, value] for i, value in enumerate(values)]}]}


def nowhere() -> str:
    return f"tcp://127.0.0.1:{free_port()}"


async def test_query_prometheus_runs_instant_and_range_queries_and_passes_on_prometheus_errors() -> None:
    """Both tools are listed as read-only. An instant query is sent as given and its
    vector returned; `start` 600 (seconds ago) with step 30 is a range query from ten
    minutes ago to now; a query Prometheus refuses (bad_data) is the tool's error with
    Prometheus' own message, and the server answers the next call."""
    def answer_for(path: str, form: dict[str, str]) -> tuple[int, bytes]:
        if form["query"] == "up{":
            return error(400, "bad_data", "1:4: parse error: unexpected end of input")
        return success(VECTOR if path.endswith("/query") else matrix(["1", "2"]))

    with fake_prometheus(answer_for) as (url, fake):
        async with stdio_session(nowhere(), "--prometheus-url", url) as session:
            tools = {tool.name: tool for tool in (await session.list_tools()).tools}
            for name in ("query_prometheus", "topic_metrics"):
                assert tools[name].annotations.read_only_hint is True and "changes nothing" in tools[name].description

            instant = answer(await session.call_tool("query_prometheus", {"promql": 'up{job="danube"}'}))
            assert instant == {"promql": 'up{job="danube"}', "result_type": "vector", "result": VECTOR["result"],
                               "truncated": False}
            before = time.time()
            ranged = answer(await session.call_tool("query_prometheus", {"promql": "up", "start": 600, "step": 30}))
            assert ranged["result_type"] == "matrix" and len(ranged["result"][0]["values"]) == 2

            message = refusal(await session.call_tool("query_prometheus", {"promql": "up{"}))
            assert "INVALID_ARGUMENT" in message and "bad_data: 1:4: parse error" in message, message
            assert "end" in refusal(await session.call_tool("query_prometheus", {
                "promql": "up", "start": "2026-11-25T12:00:00Z", "end": "2026-11-25T11:00:00Z"}))
            answer(await session.call_tool("query_prometheus", {"promql": "up", "time": "2026-11-25T12:00:00Z"}))

    assert fake.requests[0] == ("POST", "/api/v1/query", {"query": 'up{job="danube"}'})
    _, path, form = fake.requests[1]
    assert path == "/api/v1/query_range" and form["query"] == "up" and float(form["step"]) == 30
    assert abs(float(form["end"]) - before) < 60 and float(form["end"]) - float(form["start"]) == 600
    noon = datetime.datetime(2026, 11, 25, 12, tzinfo=datetime.UTC).timestamp()
    assert fake.requests[-1][2] == {"query": "up", "time": str(noon)}


async def test_topic_metrics_runs_the_consoles_named_queries_for_the_topic() -> None:
    """topic_metrics(topic, subscription, minutes=30) sends each of the console's named
    queries (client/promql.py, as built for that topic and subscription) as a range query over
    the last 30 minutes, and answers each series' last, min and max (NaN, which JSON
    cannot carry, as null)."""
    with fake_prometheus(lambda path, form: success(matrix(["4", "NaN", "2", "7"]))) as (url, fake):
        async with stdio_session(nowhere(), "--prometheus-url", url) as session:
            metrics = answer(await session.call_tool("topic_metrics", {"topic": TOPIC, "subscription": "audit",
                                                                       "minutes": 30}))
            assert "minutes" in refusal(await session.call_tool("topic_metrics", {"topic": TOPIC, "minutes": 0}))

    expected = {name: build(TOPIC, "audit") for name, build in promql.CONSOLE_QUERIES.items()}
    assert {form["query"] for _, _, form in fake.requests} == set(expected.values())
    assert all(path == "/api/v1/query_range" for _, path, _ in fake.requests)
    form = fake.requests[0][2]
    assert float(form["end"]) - float(form["start"]) == 30 * 60
    assert set(metrics["queries"]) == set(expected)
    backlog = metrics["queries"]["backlog_messages"]
    assert backlog["promql"] == expected["backlog_messages"]
    [series] = backlog["series"]
    assert series["labels"] == {"topic": TOPIC, "subscription": "audit"}
    assert (series["last"], series["min"], series["max"]) == (7.0, 2.0, 7.0)
    json.dumps(metrics, allow_nan=False)  # no NaN slipped into the answer


async def test_without_prometheus_url_the_tools_say_how_to_give_one_and_an_unreachable_one_is_named() -> None:
    """Without --prometheus-url both tools answer an error naming the flag; with one
    nobody listens on, UNAVAILABLE naming its URL."""
    async with stdio_session(nowhere()) as session:
        for name, arguments in (("query_prometheus", {"promql": "up"}), ("topic_metrics", {"topic": TOPIC})):
            assert "--prometheus-url http://HOST:9090" in refusal(await session.call_tool(name, arguments))
    gone = f"http://127.0.0.1:{free_port()}"
    async with stdio_session(nowhere(), "--prometheus-url", gone) as session:
        message = refusal(await session.call_tool("topic_metrics", {"topic": TOPIC}))
        assert "UNAVAILABLE" in message and gone in message, message

"""client/promql.py: label values quoted so that no value breaks out of its PromQL string
(checked against JSON's decoder, whose escapes are a subset of PromQL's), topic
matchers that select a topic and its partitions only, and the HTTP API client against a
fake Prometheus in a thread: answers, Prometheus' own errors, an unreachable server, a
slow one and an answer over the byte bound."""

from __future__ import annotations

import json
import re
import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st

from danube_zmq.client import promql
from danube_zmq.transport.errors import InvalidArgument, ResourceExhausted, Timeout, Unavailable
from tests.fake_prometheus import fake_prometheus, success

# Text a label value may hold, tricky characters made likely.
label_values = st.text(alphabet=st.one_of(st.sampled_from('"\\\n\r\t\'`{}=~,/-_.*+?()[]|^$ é€😀\x00\x7f'),
                                          st.characters(blacklist_categories=("Cs",))))


@given(label_values)
def test_a_quoted_label_value_reads_back_as_itself(value: str) -> None:
    """The literal is one double-quoted string whose escapes decode to the value: no
    raw newline (PromQL refuses one), no quote left unescaped to end it early."""
    literal = promql.quote(value)
    assert literal.startswith('"') and literal.endswith('"') and "\n" not in literal
    assert json.loads(literal) == value
    # Every quote inside is escaped: dropping the escaped pairs leaves no quote.
    assert '"' not in re.sub(r'\\.', "", literal[1:-1])


def test_a_lone_surrogate_is_refused() -> None:
    """PromQL text is UTF-8; a value that cannot be encoded is an error, not mojibake."""
    with pytest.raises(InvalidArgument, match="UTF-8"):
        promql.quote("a\ud800b")


@given(st.text(alphabet=st.sampled_from("abz09/_-.+*?()[]{}|^$\\ \"é"), min_size=1), label_values)
def test_the_topic_matcher_selects_the_topic_and_its_partitions_only(topic: str, other: str) -> None:
    """The regex in the topic matcher (anchored, as Prometheus anchors it) matches the
    topic and `<topic>-part-N`, never another name: regex characters in the name are
    literal."""
    matchers = promql.topic_matchers(topic)
    label, _, literal = matchers.partition("=~")
    assert label == "topic"
    pattern = re.compile(json.loads(literal))
    assert pattern.fullmatch(topic) and pattern.fullmatch(f"{topic}-part-0") and pattern.fullmatch(f"{topic}-part-12")
    assert not pattern.fullmatch(f"{topic}-part-01") and not pattern.fullmatch(f"{topic}x")
    if other != topic and not re.fullmatch(re.escape(topic) + r"-part-(0|[1-9][0-9]*)", other):
        assert not pattern.fullmatch(other)


def test_every_console_query_names_its_metric_and_quotes_the_topic() -> None:
    """Each named query is a string for a topic (and subscription) with the values in
    their matchers; those per subscription select one when given."""
    topic, subscription = '/ns/we"ird', 'sub\\"x'
    for name, build in promql.CONSOLE_QUERIES.items():
        text = build(topic, subscription)
        assert "danube_" in text, name
        if name != "wal_fsync_p99_seconds":
            assert promql.quote(re.escape(topic) + "(-part-(0|[1-9][0-9]*))?") in text, name
    for name in ("backlog_messages", "backlog_bytes", "lag_messages", "unacked_messages",
                 "end_to_end_p99_seconds", "dispatch_rate"):
        assert f"subscription={promql.quote(subscription)}" in promql.CONSOLE_QUERIES[name](topic, subscription)
        assert "subscription=" not in promql.CONSOLE_QUERIES[name](topic)


# ----------------------------------------------------------------- the client
VECTOR = {"resultType": "vector", "result": [{"metric": {"topic": "/ns/t"}, "value": [1700000000.0, "3"]}]}


def test_instant_and_range_send_the_query_and_return_prometheus_data() -> None:
    """`instant` POSTs query (and time) to /api/v1/query, `range_` query, start, end and
    step to /api/v1/query_range; each returns Prometheus' data, warnings added."""
    with fake_prometheus(lambda path, form: success(VECTOR, warnings=["slow"])) as (url, fake):
        assert promql.instant(url + "/", 'up{job="x"}') == {**VECTOR, "warnings": ["slow"]}
        promql.instant(url, "up", time="2026-11-25T12:00:00Z")
        promql.range_(url, "up", start=1700000000, end=1700000600, step="30s")
    assert fake.requests == [
        ("POST", "/api/v1/query", {"query": 'up{job="x"}'}),
        ("POST", "/api/v1/query", {"query": "up", "time": "2026-11-25T12:00:00Z"}),
        ("POST", "/api/v1/query_range", {"query": "up", "start": "1700000000", "end": "1700000600", "step": "30s"}),
    ]


def test_prometheus_refusing_a_query_is_an_error_with_its_type_and_message() -> None:
    """A 400 with Prometheus' JSON error (bad_data) is INVALID_ARGUMENT carrying its
    errorType and error; a 503 timeout is UNAVAILABLE; status error in a 200 too."""
    answers = iter([
        (400, json.dumps({"status": "error", "errorType": "bad_data", "error": "parse error: unexpected }"}).encode()),
        (503, json.dumps({"status": "error", "errorType": "timeout", "error": "query timed out"}).encode()),
        (200, json.dumps({"status": "error", "errorType": "execution", "error": "many-to-many"}).encode()),
        (502, b"<html>bad gateway</html>"),
        (404, b"not found"),
        (200, b"this is not json"),
    ])
    with fake_prometheus(lambda path, form: next(answers)) as (url, _):
        with pytest.raises(InvalidArgument, match="bad_data: parse error: unexpected }"):
            promql.instant(url, "up{")
        with pytest.raises(Unavailable, match="timeout: query timed out"):
            promql.instant(url, "up")
        with pytest.raises(InvalidArgument, match="execution: many-to-many"):
            promql.instant(url, "up")
        with pytest.raises(Unavailable, match="HTTP 502"):
            promql.instant(url, "up")
        with pytest.raises(InvalidArgument, match="HTTP 404"):
            promql.instant(url, "up")
        with pytest.raises(Unavailable, match="no JSON status"):
            promql.instant(url, "up")


def test_an_unreachable_prometheus_is_unavailable_naming_it() -> None:
    """Nothing listens: UNAVAILABLE naming the URL, retriable."""
    with fake_prometheus(lambda path, form: success(VECTOR)) as (url, _):
        pass  # closed again: the port is free now
    with pytest.raises(Unavailable, match=re.escape(url)) as caught:
        promql.instant(url, "up", timeout_s=5)
    assert caught.value.retriable


def test_an_answer_over_the_byte_bound_is_refused() -> None:
    """An answer larger than `bytes_max` is RESOURCE_EXHAUSTED (read no further), one
    within it is returned."""
    big = {"resultType": "vector", "result": [{"metric": {"i": str(i)}, "value": [0, "1"]} for i in range(2000)]}
    with fake_prometheus(lambda path, form: success(big)) as (url, _):
        with pytest.raises(ResourceExhausted, match="exceeds 10000 bytes"):
            promql.instant(url, "up", bytes_max=10_000)
        assert len(promql.instant(url, "up", bytes_max=1_000_000)["result"]) == 2000


def test_a_prometheus_that_does_not_answer_in_time_is_a_timeout() -> None:
    """A server that holds the request past `timeout_s` is TIMEOUT."""
    release = threading.Event()

    def slow(path: str, form: dict[str, str]) -> tuple[int, bytes]:
        release.wait(10)
        return success(VECTOR)

    with fake_prometheus(slow) as (url, _):
        try:
            with pytest.raises(Timeout, match=r"within 0\.3 s"):
                promql.instant(url, "up", timeout_s=0.3)
        finally:
            release.set()

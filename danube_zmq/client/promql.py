"""The PromQL an operator's console asks about a topic, and a small client of
Prometheus' HTTP API (`/api/v1/query`, `/api/v1/query_range`).

    console / MCP tool ──CONSOLE_QUERIES[name](topic, subscription)──▶ PromQL text
                       ──instant(url, promql) / range_(url, promql, ...)──▶ Prometheus

1. A named query is a function of a topic (and, where the metric has one, a
   subscription) returning PromQL. Label values are written as PromQL string literals
   (`quote`): a topic name never breaks out of its matcher. A topic matches its
   partitions too (`/ns/t-part-N`), so one query serves both kinds.
2. The client is synchronous (urllib, the standard library: one request, no session
   to keep); the async callers run it in a thread (`asyncio.to_thread`). Each call has a
   timeout and a bound on the bytes it reads; what goes wrong is a `DanubeError` naming
   the server: UNAVAILABLE when it cannot be reached or fails (5xx), INVALID_ARGUMENT
   with Prometheus' own errorType and error when it refuses the query, RESOURCE_EXHAUSTED
   past the byte bound, TIMEOUT past the timeout.

Metric names are those of docs/operations.md's metrics table (actors/metrics.py and
actors/broker/broker_collector.py define them).
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import Any

from danube_zmq.transport.errors import InvalidArgument, ResourceExhausted, Timeout, Unavailable

__all__ = ["CONSOLE_QUERIES", "RESPONSE_BYTES_MAX", "TIMEOUT_S", "WINDOW", "instant", "quote", "range_",
           "topic_matchers"]

# The rate and quantile window: at Prometheus' usual 15 s scrape interval, four samples.
WINDOW = "1m"
# What one answer may hold: a range query over many series is large, and the caller
# (an MCP tool, a console page) wants an error rather than the whole of it.
RESPONSE_BYTES_MAX = 16 * 1024 * 1024
TIMEOUT_S = 10.0

# A partition of a topic is `<topic>-part-N`, N without leading zeros (transport/topic_name.py).
_PARTITIONS = "(-part-(0|[1-9][0-9]*))?"


def quote(value: str) -> str:
    """`value` as a PromQL double-quoted string literal. Only JSON's escapes are used
    (`\\"`, `\\\\`, `\\n`, `\\r`, `\\t`, `\\uXXXX` for other control characters), a subset
    of what PromQL's lexer and Go's strconv.Unquote read; other characters stay as they
    are (PromQL strings are UTF-8). A lone surrogate cannot be sent as UTF-8: refused."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidArgument(f"label value {value!r} is not valid UTF-8 text") from None
    # ensure_ascii off: PromQL reads \uXXXX but not a surrogate pair of them.
    return json.dumps(value, ensure_ascii=False)


def topic_matchers(topic: str, subscription: str | None = None) -> str:
    """The label matchers selecting `topic` and its partitions (and one subscription)."""
    matchers = f"topic=~{quote(re.escape(topic) + _PARTITIONS)}"
    if subscription is not None:
        matchers += f", subscription={quote(subscription)}"
    return matchers


def backlog_messages(topic: str, subscription: str | None = None, window: str = WINDOW) -> str:
    return f"sum by (topic, subscription) (danube_subscription_backlog_messages{{{topic_matchers(topic, subscription)}}})"


def backlog_bytes(topic: str, subscription: str | None = None, window: str = WINDOW) -> str:
    return f"sum by (topic, subscription) (danube_subscription_backlog_bytes{{{topic_matchers(topic, subscription)}}})"


def lag_messages(topic: str, subscription: str | None = None, window: str = WINDOW) -> str:
    return f"sum by (topic, subscription) (danube_subscription_lag_messages{{{topic_matchers(topic, subscription)}}})"


def unacked_messages(topic: str, subscription: str | None = None, window: str = WINDOW) -> str:
    return (f"sum by (topic, subscription) (danube_subscription_unacked_messages"
            f"{{{topic_matchers(topic, subscription)}}})")


def produce_ack_p99_seconds(topic: str, subscription: str | None = None, window: str = WINDOW) -> str:
    """Per topic: a producer's batch has no subscription."""
    return ("histogram_quantile(0.99, sum by (le, topic) "
            f"(rate(danube_producer_send_latency_seconds_bucket{{{topic_matchers(topic)}}}[{window}])))")


def end_to_end_p99_seconds(topic: str, subscription: str | None = None, window: str = WINDOW) -> str:
    return ("histogram_quantile(0.99, sum by (le, topic, subscription) (rate("
            f"danube_subscription_end_to_end_latency_seconds_bucket{{{topic_matchers(topic, subscription)}}}"
            f"[{window}])))")


def publish_rate(topic: str, subscription: str | None = None, window: str = WINDOW) -> str:
    """Messages/s published to the topic (per partition)."""
    return f"sum by (topic) (rate(danube_topic_messages_in_total{{{topic_matchers(topic)}}}[{window}]))"


def dispatch_rate(topic: str, subscription: str | None = None, window: str = WINDOW) -> str:
    """Messages/s delivered to the consumers of each subscription."""
    return (f"sum by (topic, subscription) (rate(danube_subscription_messages_out_total"
            f"{{{topic_matchers(topic, subscription)}}}[{window}]))")


def wal_fsync_p99_seconds(topic: str, subscription: str | None = None, window: str = WINDOW) -> str:
    """Per broker (`instance`): the WAL's fsyncs are the broker's, not a topic's; the
    topic's owner is among them."""
    return f"histogram_quantile(0.99, sum by (le, instance) (rate(danube_wal_fsync_latency_seconds_bucket[{window}])))"


# What a console asks about a topic (and optionally one subscription), by name.
CONSOLE_QUERIES: dict[str, Callable[..., str]] = {
    "backlog_messages": backlog_messages,
    "backlog_bytes": backlog_bytes,
    "lag_messages": lag_messages,
    "unacked_messages": unacked_messages,
    "produce_ack_p99_seconds": produce_ack_p99_seconds,
    "end_to_end_p99_seconds": end_to_end_p99_seconds,
    "publish_rate": publish_rate,
    "dispatch_rate": dispatch_rate,
    "wal_fsync_p99_seconds": wal_fsync_p99_seconds,
}


# ----------------------------------------------------------------- the HTTP API
def instant(url: str, promql: str, time: float | str | None = None, *, timeout_s: float = TIMEOUT_S,
            bytes_max: int = RESPONSE_BYTES_MAX) -> dict[str, Any]:
    """The value of `promql` at `time` (seconds since the epoch or RFC3339; now when
    None): Prometheus' `data` (`resultType`, `result`), with its `warnings` if any."""
    params = {"query": promql}
    if time is not None:
        params["time"] = str(time)
    return _call(url, "query", params, timeout_s, bytes_max)


def range_(url: str, promql: str, start: float | str, end: float | str, step: float | str, *,
           timeout_s: float = TIMEOUT_S, bytes_max: int = RESPONSE_BYTES_MAX) -> dict[str, Any]:
    """`promql` from `start` to `end` (seconds since the epoch or RFC3339) every `step`
    (seconds, or a duration such as 30s): Prometheus' `data` (`resultType` matrix,
    `result`), with its `warnings` if any."""
    params = {"query": promql, "start": str(start), "end": str(end), "step": str(step)}
    return _call(url, "query_range", params, timeout_s, bytes_max)


def _call(url: str, endpoint: str, params: dict[str, str], timeout_s: float, bytes_max: int) -> dict[str, Any]:
    page = f"{url.rstrip('/')}/api/v1/{endpoint}"
    # POST (form-encoded), which Prometheus takes on both endpoints: a long query does
    # not meet a URL length limit on the way.
    request = urllib.request.Request(page, data=urllib.parse.urlencode(params).encode(), method="POST",
                                     headers={"Content-Type": "application/x-www-form-urlencoded",
                                              "Accept": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            body = _read(response, page, bytes_max)
    except urllib.error.HTTPError as err:
        # Prometheus answers a refused query with a JSON error (400 bad_data, 422
        # execution, 503 timeout or canceled): read what it says.
        try:
            body = _read(err, page, bytes_max) if err.fp is not None else b""
        finally:
            err.close()
        answer = _json(body)
        if isinstance(answer, dict) and answer.get("status") == "error":
            _raise_prometheus_error(page, answer, err.code)
        if err.code >= 500:
            raise Unavailable(f"Prometheus at {page} failed: HTTP {err.code} {err.reason}") from None
        raise InvalidArgument(f"Prometheus at {page} refused the query: HTTP {err.code} {err.reason}") from None
    except TimeoutError:
        raise Timeout(f"Prometheus at {page} did not answer within {timeout_s:g} s") from None
    except urllib.error.URLError as err:
        if isinstance(err.reason, TimeoutError):
            raise Timeout(f"Prometheus at {page} did not answer within {timeout_s:g} s") from None
        raise Unavailable(f"cannot reach Prometheus at {page}: {err.reason}") from None
    except OSError as err:  # reset or refused mid-way
        raise Unavailable(f"cannot reach Prometheus at {page}: {err}") from None
    answer = _json(body)
    if not isinstance(answer, dict) or "status" not in answer:
        raise Unavailable(f"{page} did not answer as Prometheus' HTTP API does (no JSON status)")
    if answer["status"] != "success":
        _raise_prometheus_error(page, answer, 200)
    data = answer.get("data")
    if not isinstance(data, dict):
        raise Unavailable(f"{page} answered success without data")
    if answer.get("warnings"):
        data = {**data, "warnings": answer["warnings"]}
    return data


def _read(response: Any, page: str, bytes_max: int) -> bytes:
    try:
        body: bytes = response.read(bytes_max + 1)
    except TimeoutError:
        raise Timeout(f"Prometheus at {page} did not finish its answer in time") from None
    if len(body) > bytes_max:
        raise ResourceExhausted(f"the answer of Prometheus at {page} exceeds {bytes_max} bytes: ask for fewer"
                                " series, a shorter range or a longer step")
    return body


def _json(body: bytes) -> Any:
    try:
        return json.loads(body)
    except ValueError:
        return None


def _raise_prometheus_error(page: str, answer: dict[str, Any], status: int) -> None:
    kind = answer.get("errorType") or "error"
    text = f"Prometheus at {page}: {kind}: {answer.get('error') or '(no message)'}"
    if kind in ("timeout", "canceled", "unavailable", "internal") or status >= 500:
        raise Unavailable(text)
    raise InvalidArgument(text)

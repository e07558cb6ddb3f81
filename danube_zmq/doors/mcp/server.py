"""The MCP server of `danube admin serve --mode mcp`: Danube's admin operations as MCP
tools, two prompts and the broker's metrics as a resource, for an LLM agent.

    MCP client ──stdio or streamable HTTP──▶ McpServer (mcp SDK)
                                              │  one AdminClient / SchemaRegistryClient per call
                                              ▼
                                   broker admin port (RBAC decides) / client port (schemas)

1. A tool call opens an admin connection with the caller's credentials: over stdio the
   token and CURVE keys `danube admin` was given (--token-file, --server-key, DANUBE_*);
   over HTTP the request's `Authorization: Bearer <jwt>` (then a fresh CURVE key pair, so
   that the broker binds that token to this connection alone), required on every call
   unless `--trust-loopback` lets a loopback server's callers use the server's own. The
   broker's RBAC decides.
2. The answer is returned as JSON data (wire records by field, enums by name, bytes as
   text). A `DanubeError` is the tool's error, with its code, never a crash.
3. Tools that change the cluster are registered only with `allow_writes`; without it
   they are not listed, and calling one by name is an error that says how to allow it.

4. With `--prometheus-url`, two read tools ask Prometheus' HTTP API (client/promql.py):
   `query_prometheus` (any PromQL, instant or range) and `topic_metrics` (the console's
   named queries for a topic over the last minutes). Prometheus answers whatever it
   holds: the broker's RBAC does not filter it, so beyond loopback a caller's token is
   first checked by one admin call the broker must accept.

No state about topics or subscriptions is kept here: every answer is the broker's (or
Prometheus').
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
import logging
import math
import os
import time
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable, Iterator
from typing import Annotated, Any, TypeVar

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ResourceError, ToolError
from mcp.types import ToolAnnotations
from prometheus_client.parser import text_string_to_metric_families
from pydantic import Field

from danube_zmq.client import promql as prometheus_api
from danube_zmq.client.admin import AdminClient
from danube_zmq.client.json_records import jsonable as _jsonable
from danube_zmq.client.schemas import SchemaRegistryClient
from danube_zmq.doors.listen import is_loopback
from danube_zmq.doors.mcp.operations import TOOLS as DERIVED_TOOLS
from danube_zmq.doors.mcp.operations import tool_of
from danube_zmq.transport.admin_operations import by_name
from danube_zmq.transport.errors import DanubeError, InvalidArgument, NotFound

__all__ = ["WRITE_TOOLS", "McpSettings", "build_server", "is_loopback"]

T = TypeVar("T")

METRICS_URI = "danube://metrics"
# The metrics page of a broker with many topics is large; an agent gets at most this much.
METRICS_BYTES_MAX = 8 * 1024 * 1024
# Samples `get_metrics` returns at most (the model reads them all).
METRIC_SAMPLES_MAX = 2000
# Topics `health_check` describes at most, per call (each is one admin round trip).
HEALTH_TOPICS_MAX = 200
# Series a Prometheus tool returns at most per query (the model reads them all).
PROMETHEUS_SERIES_MAX = 500
# A range query without a step gets about this many points per series; one with a step
# may ask at most Prometheus' own limit (11,000 points per series).
RANGE_POINTS = 240
RANGE_POINTS_MAX = 11_000
# `topic_metrics` looks back at most a day.
TOPIC_METRICS_MINUTES_MAX = 24 * 60

# The parameters most tools share, described once for every tool's input schema.
Topic = Annotated[str, Field(description="A topic, /namespace/topic (one partition: /namespace/topic-part-N).")]
Namespace = Annotated[str, Field(description="A namespace name, e.g. default.")]
Subscription = Annotated[str, Field(description="A subscription name of the topic.")]
Subject = Annotated[str, Field(description="A schema subject (schemas are registered under subjects).")]
SchemaType = Annotated[str, Field(description="bytes, string, number, json_schema, avro or protobuf.")]
Definition = Annotated[str, Field(description="The schema's text: JSON Schema, Avro JSON or Protobuf source.")]
SomeSubscription = Annotated[str | None, Field(description="One subscription of the topic; all when left out.")]
PromQL = Annotated[str, Field(description="A PromQL expression, e.g. sum by (topic) (rate(danube_topic_messages_in_total[1m])).")]
When = Annotated[str | float | None, Field(
    description="A time: RFC3339 (2026-11-25T12:00:00Z), or a number of seconds ago (900: 15 minutes ago).")]
Step = Annotated[str | float | None, Field(
    description="Range queries: seconds between points, or a duration such as 30s [default: about 240 points].")]

_READ_ONLY = ToolAnnotations(read_only_hint=True, destructive_hint=False, open_world_hint=False)


@dataclasses.dataclass(frozen=True, slots=True)
class McpSettings:
    admin_endpoint: str
    timeout_ms: int
    allow_writes: bool
    # The broker's client port for the schema registry; None: the connected broker's, from its broker list.
    service_url: str | None = None
    # The Prometheus page for the metrics resource and tool; None: the connected broker's.
    metrics_url: str | None = None
    # Over HTTP (unless --trust-loopback): every call must bring its own bearer token, so
    # that no local process acts with the credentials the server was started with.
    require_bearer: bool = False
    # Prometheus' base URL (http://host:9090) for the PromQL tools; None: those tools say how to give one.
    prometheus_url: str | None = None


_TRUST_LOOPBACK_HINT = ("on loopback, `serve --trust-loopback` lets a call without one act with the credentials"
                        " the server was started with")


class _Broker:
    """Opens one admin (or schema registry) connection per call with the caller's credentials."""

    def __init__(self, settings: McpSettings) -> None:
        self.settings = settings

    def _credentials(self, ctx: Context | None) -> dict[str, Any]:
        headers = ctx.headers if ctx is not None else None
        authorization = (headers or {}).get("authorization", "")
        scheme, _, bearer = authorization.partition(" ")
        if scheme.lower() == "bearer" and bearer.strip():
            # The caller's own token; a fresh key pair, because the admin port binds a token
            # to the connection's CURVE key and callers must not share one.
            return {"token": bearer.strip(), "server_public_key": os.environ.get("DANUBE_SERVER_KEY") or None,
                    "use_env": False}
        if self.settings.require_bearer:
            raise ToolError(f"this MCP server serves HTTP: send your Danube token as 'Authorization: Bearer <jwt>'"
                            f" ({_TRUST_LOOPBACK_HINT})")
        return {}  # the token and keys `danube admin` was started with (DANUBE_TOKEN, ...)

    async def admin(self, ctx: Context | None, operation: Callable[[AdminClient], Awaitable[T]]) -> T:
        with _as_tool_error():  # the connect too: an unreachable broker is UNAVAILABLE
            async with AdminClient(self.settings.admin_endpoint, timeout_ms=self.settings.timeout_ms,
                                   client_name="danube-mcp", **self._credentials(ctx)) as client:
                return await operation(client)

    async def schemas(self, ctx: Context | None,
                      operation: Callable[[SchemaRegistryClient], Awaitable[T]]) -> T:
        url = self.settings.service_url or await self._own_broker(ctx, "broker_url")
        with _as_tool_error():
            async with SchemaRegistryClient(url, timeout_ms=self.settings.timeout_ms, client_name="danube-mcp",
                                            **self._credentials(ctx)) as client:
                return await operation(client)

    async def _own_broker(self, ctx: Context | None, field: str) -> str:
        """`field` of the broker whose admin endpoint we dial (else the first with one)."""
        brokers = await self.admin(ctx, lambda client: client.list_brokers())
        ours = [b for b in brokers if b.admin_url == self.settings.admin_endpoint] or brokers
        for broker in ours:
            if getattr(broker, field):
                return str(getattr(broker, field))
        raise ToolError(f"no broker reports a {field.replace('_', ' ')}"
                        + (" (start the broker with --metrics-port, or give --metrics-url)"
                           if field == "metrics_url" else ""))

    async def metrics_text(self, ctx: Context | None, broker_id: int | None = None) -> str:
        url = self.settings.metrics_url
        if broker_id is not None:
            brokers = await self.admin(ctx, lambda client: client.list_brokers())
            found = [b for b in brokers if b.broker_id == broker_id]
            if not found:
                raise ToolError(f"NOT_FOUND: no broker {broker_id}")
            if not found[0].metrics_url:
                raise ToolError(f"broker {broker_id} serves no metrics (started without --metrics-port)")
            url = found[0].metrics_url
        elif url is None:
            url = await self._own_broker(ctx, "metrics_url")
        page = url.rstrip("/") + ("" if url.rstrip("/").endswith("/metrics") else "/metrics")
        # In a thread: urllib blocks, and the loop serves every other session meanwhile.
        return await asyncio.to_thread(_fetch_metrics, page)


@contextlib.contextmanager
def _as_tool_error() -> Iterator[None]:
    """A DanubeError as the tool's error, with its code: the SDK shows the model only
    "Error executing tool" for any other exception."""
    try:
        yield
    except DanubeError as err:
        raise ToolError(f"{err.code.name}: {err}") from None


def _fetch_metrics(url: str) -> str:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            body = response.read(METRICS_BYTES_MAX + 1)
    except (urllib.error.URLError, OSError) as err:
        raise ToolError(f"cannot read the metrics at {url}: {getattr(err, 'reason', err)}") from None
    if len(body) > METRICS_BYTES_MAX:
        raise ToolError(f"the metrics at {url} exceed {METRICS_BYTES_MAX} bytes")
    return body.decode("utf-8", errors="replace")


class McpServer(MCPServer):
    """MCPServer that answers a call to a write tool it did not register with the reason."""

    def __init__(self, *args: Any, withheld: dict[str, str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.withheld = withheld

    async def call_tool(self, name: str, arguments: dict[str, Any], context: Any = None) -> Any:
        if name in self.withheld:
            raise ToolError(f"{name} changes the cluster ({self.withheld[name]}) and this MCP server is read-only:"
                            " start it with `danube admin serve --mode mcp --allow-writes`")
        return await super().call_tool(name, arguments, context)


# What each write tool changes: its description's first line, and the refusal's reason;
# a declared operation's is its help (transport/admin_operations.py).
WRITE_TOOLS: dict[str, str] = {
    **{name: by_name(name).help for name in DERIVED_TOOLS if by_name(name).writes},
    "set_failure_policy": "Sets a subscription's redelivery and dead-letter policy",
    "register_schema": "Registers a schema version under a subject",
    "set_schema_compatibility_mode": "Sets a schema subject's compatibility mode",
}


async def _with_names(client: Any, answer: Any) -> tuple[Any, dict[str, str]]:
    """An answer naming brokers by id, and {id: name} beside it (JSON keys are strings)."""
    result = await answer
    return result, {str(broker_id): name for broker_id, name in (await client.broker_names()).items()}


def _namespace(name: str) -> str:
    return name[1:] if name.startswith("/") and name.count("/") == 1 else name


def build_server(settings: McpSettings) -> McpServer:
    """The MCP server: read tools always, write tools only with `settings.allow_writes`."""
    broker = _Broker(settings)
    withheld = {} if settings.allow_writes else dict(WRITE_TOOLS)
    server = McpServer(
        "danube",
        instructions=(
            "Administer a danube-zmq cluster (Danube messaging on ZeroMQ). Topics are /namespace/topic. "
            "Read tools change nothing. "
            + ("Write tools change the cluster; the broker's RBAC decides what the caller may do."
               if settings.allow_writes else "This server is read-only: it offers no tool that changes the cluster.")
        ),
        withheld=withheld,
        # uvicorn's (HTTP) log level follows the CLI's --log-level, set on the root logger.
        log_level=logging.getLevelName(logging.getLogger().getEffectiveLevel()),
    )

    def read(description: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        def register(fn: Callable[..., Any]) -> Callable[..., Any]:
            server.add_tool(fn, description=f"{description} Reads only; changes nothing.", annotations=_READ_ONLY)
            return fn
        return register

    def write(*, destructive: bool, idempotent: bool = False) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        def register(fn: Callable[..., Any]) -> Callable[..., Any]:
            if settings.allow_writes:
                changes = WRITE_TOOLS[fn.__name__].rstrip(".")
                server.add_tool(fn, description=f"CHANGES THE CLUSTER: {changes}. {fn.__doc__ or ''}".strip(),
                                annotations=ToolAnnotations(read_only_hint=False, destructive_hint=destructive,
                                                            idempotent_hint=idempotent, open_world_hint=False))
            return fn
        return register

    # -- one operation each, as declared ---------------------------------------

    for name in DERIVED_TOOLS:
        op = by_name(name)
        (write(destructive=op.destructive, idempotent=op.idempotent) if op.writes else read(op.help))(
            tool_of(op, broker.admin))

    # -- cluster ---------------------------------------------------------------

    @read("The metadata cluster's Raft leader (node id, address, term) and the broker that holds the cluster's"
          " leadership (role leader, or the one standalone broker), with its URLs.")
    async def get_leader(ctx: Context) -> dict[str, Any]:
        status = await broker.admin(ctx, lambda c: c.cluster_status())
        brokers = await broker.admin(ctx, lambda c: c.list_brokers())
        leaders = [b for b in brokers if b.role in ("leader", "standalone")]  # standalone: it leads itself
        return {"leader_node_id": status.leader_id, "leader_address": status.leader_address, "term": status.term,
                "broker": _jsonable(leaders[0]) if leaders else None}

    @read("The policies in force for a namespace: the topic policies (producer, consumer and subscription"
          " limits, message size, publish and dispatch rates), topic and partition limits, backlog quota,"
          " auto topic creation (what subscribing to a missing topic creates), and where each is set"
          " (namespace or broker default).")
    async def get_namespace_policies(namespace: Namespace, ctx: Context) -> dict[str, Any]:
        namespace = _namespace(namespace)

        async def both(c: AdminClient) -> dict[str, Any]:
            return {"policies": _jsonable(await c.get_namespace_policies(namespace)),
                    "limits": _jsonable(await c.get_namespace_limits(namespace)),
                    "backlog_quota": _jsonable(await c.get_namespace_backlog_quota(namespace)),
                    "auto_topic_creation": _jsonable(await c.get_namespace_auto_topic_creation(namespace))}
        return {"namespace": namespace, **await broker.admin(ctx, both)}

    # -- topics and subscriptions ----------------------------------------------

    @read("The topics of a namespace: name, partitions, dispatch strategy (reliable or non_reliable), broker;"
          " broker_names maps each broker id to its name (broker-N, its Raft node).")
    async def list_topics(namespace: Namespace, ctx: Context) -> dict[str, Any]:
        namespace = _namespace(namespace)
        topics, names = await broker.admin(ctx, lambda c: _with_names(c, c.list_topics(namespace)))
        return {"namespace": namespace, "topics": _jsonable(topics), "broker_names": names}

    @read("A topic (/namespace/topic) in full: every partition's next offset, producers, counters, WAL damage,"
          " compaction status and horizon, and every subscription's type, consumers and (reliable topics) cursor,"
          " backlog and unacked messages;"
          " broker_names maps each broker id to its name (broker-N, its Raft node).")
    async def describe_topic(topic: Topic, ctx: Context) -> dict[str, Any]:
        description, names = await broker.admin(ctx, lambda c: _with_names(c, c.describe_topic(topic)))
        return {**_jsonable(description), "broker_names": names}

    @read("The policies in force for a topic: the topic policies (limits, message size, publish and dispatch"
          " rates), its backlog quota, each with where it is set, and its schema binding (null when none).")
    async def get_topic_policies(topic: Topic, ctx: Context) -> dict[str, Any]:
        async def both(c: AdminClient) -> dict[str, Any]:
            try:
                schema: Any = _jsonable(await c.get_topic_schema_config(topic))
            except NotFound:
                schema = None
            return {"policies": _jsonable(await c.get_topic_policies(topic)),
                    "backlog_quota": _jsonable(await c.get_topic_backlog_quota(topic)), "schema": schema}
        return {"topic": topic, **await broker.admin(ctx, both)}

    @read("A subscription's failure policy (redeliveries, ack timeout, backoff, poison policy, dead-letter"
          " topic) and dispatch window (max unacked messages) on a reliable topic.")
    async def get_subscription_policies(topic: Topic, subscription: Subscription, ctx: Context) -> dict[str, Any]:
        async def both(c: AdminClient) -> dict[str, Any]:
            return {"failure_policy": _jsonable(await c.get_failure_policy(topic, subscription)),
                    "dispatch_config": _jsonable(await c.get_dispatch_config(topic, subscription))}
        return {"topic": topic, "subscription": subscription, **await broker.admin(ctx, both)}

    # -- schemas ---------------------------------------------------------------

    @read("The schema subjects of the registry: type, latest version, compatibility mode.")
    async def list_schema_subjects(ctx: Context) -> dict[str, Any]:
        return {"subjects": _jsonable(await broker.schemas(ctx, lambda c: c.list_subjects()))}

    @read("A schema of a subject (the latest version unless `version` is given): its definition, type,"
          " id, fingerprint.")
    async def get_schema(subject: Subject, ctx: Context, version: int | None = None) -> dict[str, Any]:
        return _jsonable(await broker.schemas(ctx, lambda c: c.get_schema(subject=subject, version=version)))

    @read("The versions of a schema subject, with fingerprints and descriptions.")
    async def list_schema_versions(subject: Subject, ctx: Context) -> dict[str, Any]:
        return {"subject": subject, "versions": _jsonable(await broker.schemas(ctx, lambda c: c.versions(subject)))}

    @read("A schema subject's compatibility mode (backward, forward, full, none...).")
    async def get_schema_compatibility_mode(subject: Subject, ctx: Context) -> dict[str, Any]:
        return {"subject": subject, "mode": await broker.schemas(ctx, lambda c: c.get_compatibility(subject))}

    @read("Whether a candidate schema definition (text: JSON Schema, Avro JSON, Protobuf source) of"
          " `schema_type` is compatible with a subject, and why not; registers nothing.")
    async def check_schema_compatibility(subject: Subject, schema_type: SchemaType, definition: Definition, ctx: Context,
                                         mode: str | None = None) -> dict[str, Any]:
        check = await broker.schemas(ctx, lambda c: c.check(subject, schema_type, definition.encode(), mode=mode))
        return _jsonable(check)

    # -- diagnostics -----------------------------------------------------------

    @read("Consumer lag of a topic's subscriptions (one, or all): per partition the backlog in messages and"
          " bytes, unacked messages, redeliveries, cursor against the next offset, consumers, and findings"
          " (no consumer with a backlog, a subscription blocked at an offset, a damaged WAL).")
    async def analyze_consumer_lag(topic: Topic, ctx: Context, subscription: SomeSubscription = None) -> dict[str, Any]:
        description = await broker.admin(ctx, lambda c: c.describe_topic(topic))
        return _lag_report(description, subscription)

    @read("A health summary of the cluster: metadata leader and members, each broker's status, load balance,"
          " and every topic (up to 200) with a damaged WAL or a subscription blocked or without consumers.")
    async def health_check(ctx: Context) -> dict[str, Any]:
        return await broker.admin(ctx, _health)

    @read("Samples of the connected broker's (or broker `broker_id`'s) Prometheus metrics whose name starts"
          " with `name_prefix`, optionally only those whose labels contain every `labels` pair; at most 2000.")
    async def get_metrics(ctx: Context, name_prefix: str = "danube_", broker_id: int | None = None,
                          labels: dict[str, str] | None = None) -> dict[str, Any]:
        text = await broker.metrics_text(ctx, broker_id)
        return _metric_samples(text, name_prefix, labels or {})

    async def prometheus(ctx: Context) -> str:
        """Prometheus' URL, once the caller may ask it."""
        if settings.prometheus_url is None:
            raise ToolError("this MCP server has no Prometheus to ask: start it with"
                            " `danube admin serve --mode mcp --prometheus-url http://HOST:9090`"
                            " (Prometheus scraping the brokers' --metrics-port)")
        if settings.require_bearer:
            # The broker's RBAC does not see these queries: the token must at least be
            # one the broker accepts.
            await broker.admin(ctx, lambda c: c.cluster_status())
        return settings.prometheus_url

    @read("Run a PromQL query on the Prometheus that scrapes the brokers (--prometheus-url): at `time`"
          " (default now), or over a range when `start` is given (`end` default now, `step` default about"
          " 240 points). Metric names: danube_topic_*, danube_subscription_*, danube_wal_*, danube_raft_*,"
          " danube_broker_*; histograms have _bucket series for histogram_quantile. At most 500 series.")
    async def query_prometheus(promql: PromQL, ctx: Context, time: When = None, start: When = None,
                               end: When = None, step: Step = None) -> dict[str, Any]:
        url = await prometheus(ctx)
        now = _now()
        with _as_tool_error():
            if start is None and end is None and step is None:
                at = None if time is None else _when(time, now, "time")
                data = await asyncio.to_thread(prometheus_api.instant, url, promql, at)
            else:
                if start is None:
                    raise ToolError("a range query needs `start` (RFC3339, or seconds ago)")
                if time is not None:
                    raise ToolError("give `time` (an instant query) or `start`/`end`/`step` (a range), not both")
                first, last = _when(start, now, "start"), _when(end if end is not None else 0, now, "end")
                if last <= first:
                    raise ToolError(f"`end` ({last:.0f}) must be after `start` ({first:.0f})")
                every = _step(step, first, last)
                data = await asyncio.to_thread(prometheus_api.range_, url, promql, first, last, every)
        return {"promql": promql, **_series(data)}

    @read("A topic's console metrics from Prometheus (--prometheus-url) over the last `minutes` (default 15):"
          " per subscription backlog (messages, bytes), lag, unacked, dispatch rate and end-to-end p99; per"
          " topic publish rate and produce-ack p99; per broker WAL fsync p99. Each with the PromQL it ran, and"
          " per series its last, min and max value and its points. A partitioned topic's partitions are"
          " included.")
    async def topic_metrics(topic: Topic, ctx: Context, subscription: SomeSubscription = None,
                            minutes: int = 15) -> dict[str, Any]:
        if not 1 <= minutes <= TOPIC_METRICS_MINUTES_MAX:
            raise ToolError(f"minutes must be in 1..{TOPIC_METRICS_MINUTES_MAX}, got {minutes}")
        url = await prometheus(ctx)
        end = _now()
        start = end - minutes * 60
        step = max(15, minutes)  # 60 points, never finer than a usual scrape interval
        with _as_tool_error():
            queries = {name: build(topic, subscription) for name, build in prometheus_api.CONSOLE_QUERIES.items()}
            answers = await asyncio.to_thread(_run_console_queries, url, queries, start, end, step)
        return {"topic": topic, "subscription": subscription, "minutes": minutes, "step_seconds": step,
                "queries": answers}

    # -- writes ----------------------------------------------------------------

    @write(destructive=False, idempotent=True)
    async def set_failure_policy(topic: Topic, subscription: Subscription, ctx: Context, max_redelivery_count: int | None = None,
                                 ack_timeout_ms: int | None = None, base_redelivery_delay_ms: int | None = None,
                                 max_redelivery_delay_ms: int | None = None, backoff: str | None = None,
                                 poison_policy: str | None = None,
                                 dead_letter_topic: str | None = None) -> dict[str, Any]:
        """Fields left out keep their values; dead_letter_topic "" clears it. Returns the policy set."""
        policy = await broker.admin(ctx, lambda c: c.set_failure_policy(
            topic, subscription, max_redelivery_count=max_redelivery_count, ack_timeout_ms=ack_timeout_ms,
            base_redelivery_delay_ms=base_redelivery_delay_ms, max_redelivery_delay_ms=max_redelivery_delay_ms,
            backoff=backoff, poison_policy=poison_policy, dead_letter_topic=dead_letter_topic))
        return _jsonable(policy)

    @write(destructive=False)
    async def register_schema(subject: Subject, schema_type: SchemaType, definition: Definition, ctx: Context,
                              description: str = "") -> dict[str, Any]:
        """schema_type: bytes, string, number, json_schema, avro, protobuf; the subject's compatibility mode
        is checked first."""
        registered = await broker.schemas(ctx, lambda c: c.register(subject, schema_type, definition.encode(),
                                                                    description=description))
        return _jsonable(registered)

    @write(destructive=False, idempotent=True)
    async def set_schema_compatibility_mode(subject: Subject, mode: str, ctx: Context) -> dict[str, Any]:
        """Later registrations are checked against it."""
        return {"subject": subject, "mode": await broker.schemas(ctx, lambda c: c.set_compatibility(subject, mode))}

    # -- prompts and the metrics resource ----------------------------------------

    @server.prompt(description="Check the cluster's health and say what needs attention.")
    def cluster_health() -> str:
        return (
            "Check the health of this danube-zmq cluster. Call `health_check` first. Then: if a broker is not"
            " active or the metadata cluster has no leader, call `cluster_status` and `list_brokers` and say which"
            " node is missing; if the load is uneven (coefficient of variation above 0.3), show"
            " `get_cluster_balance`; for each topic the health check names, call `analyze_consumer_lag`. Read"
            " `get_metrics` with name_prefix `danube_` for rates and latencies when they help. End with a short"
            " list: what is wrong, how sure you are, and the operator command that would fix it (do not change"
            " anything yourself unless asked)."
        )

    @server.prompt(description="Analyse the consumer lag of a topic's subscriptions and its causes.")
    def lag_analysis(topic: Topic, subscription: Subscription = "") -> str:
        which = f"subscription `{subscription}` of topic `{topic}`" if subscription else f"the subscriptions of `{topic}`"
        return (
            f"Analyse the consumer lag of {which}. Call `analyze_consumer_lag` with topic `{topic}`"
            + (f" and subscription `{subscription}`" if subscription else "")
            + ". For each partition compare the backlog with the unacked messages and redeliveries: a backlog with"
            " no consumers means nobody reads; many unacked with redeliveries means consumers fail or time out"
            " (read `get_subscription_policies`); `blocked_offset` means a poison message holds the subscription."
            " Call `get_metrics` with name_prefix `danube_` and labels {\"topic\": ...} for rates. Say whether the"
            " lag grows, why, and what to change."
        )

    @server.resource(METRICS_URI, name="broker-metrics", mime_type="text/plain",
                     description="The connected broker's metrics, Prometheus text format, read now.")
    async def metrics() -> str:
        # A resource read carries no caller (the SDK gives static resources no context), so the
        # broker's metrics URL is looked up with the server's own credentials, which a server
        # beyond loopback does not use.
        if settings.require_bearer and settings.metrics_url is None:
            raise ResourceError(f"this MCP server serves HTTP: start it with --metrics-url to serve {METRICS_URI}"
                                f" (or call get_metrics with your bearer token; {_TRUST_LOOPBACK_HINT})")
        try:
            return await broker.metrics_text(None)
        except ToolError as err:
            raise ResourceError(str(err)) from None

    return server


def _now() -> float:
    return time.time()


def _when(value: str | float, now: float, name: str) -> float:
    """Seconds since the epoch of a tool's time: RFC3339, or a number of seconds ago."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        ago = float(value)
    else:
        text = str(value).strip()
        try:
            ago = float(text)
        except ValueError:
            return _rfc3339(text, name)
    if not math.isfinite(ago) or ago < 0:
        raise ToolError(f"`{name}`: seconds ago must be a number >= 0, got {value!r}")
    return now - ago


def _rfc3339(text: str, name: str) -> float:
    try:
        moment = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise ToolError(f"`{name}` {text!r}: expected RFC3339 (2026-11-25T12:00:00Z) or seconds ago") from None
    if moment.tzinfo is None:
        raise ToolError(f"`{name}` {text!r}: give a time zone (Z or +00:00)")
    return moment.timestamp()


def _step(step: str | float | None, start: float, end: float) -> str | float:
    if step is None:
        return max(1.0, math.ceil((end - start) / RANGE_POINTS))
    if isinstance(step, str):
        try:
            step = float(step)
        except ValueError:
            return step.strip()  # a duration such as 30s: Prometheus checks it
    if not math.isfinite(step) or step <= 0:
        raise ToolError(f"`step` must be > 0 seconds, got {step}")
    if (end - start) / step > RANGE_POINTS_MAX:
        raise ToolError(f"{(end - start) / step:.0f} points per series: past {RANGE_POINTS_MAX}; give a longer step")
    return step


def _series(data: dict[str, Any]) -> dict[str, Any]:
    """Prometheus' data, at most PROMETHEUS_SERIES_MAX series of it."""
    result = data.get("result")
    answer: dict[str, Any] = {"result_type": data.get("resultType"), "result": result, "truncated": False}
    if isinstance(result, list) and len(result) > PROMETHEUS_SERIES_MAX:
        answer["result"], answer["truncated"] = result[:PROMETHEUS_SERIES_MAX], True
    if data.get("warnings"):
        answer["warnings"] = data["warnings"]
    return answer


def _number(text: Any) -> float | None:
    try:
        value = float(text)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None  # NaN (no increase), which JSON cannot carry


def _run_console_queries(url: str, queries: dict[str, str], start: float, end: float,
                         step: float) -> dict[str, Any]:
    """Each named query over the range (in a thread: urllib blocks). A query Prometheus
    refuses is that query's error; an unreachable Prometheus fails them all."""
    answers: dict[str, Any] = {}
    for name, query in queries.items():
        try:
            data = prometheus_api.range_(url, query, start, end, step)
        except InvalidArgument as err:
            answers[name] = {"promql": query, "error": str(err)}
            continue
        shaped = _series(data)
        series = []
        for row in shaped["result"] or []:
            points = [value for _, value in row.get("values", [])]
            numbers = [n for n in map(_number, points) if n is not None]
            series.append({"labels": row.get("metric", {}), "last": _number(points[-1]) if points else None,
                           "min": min(numbers, default=None), "max": max(numbers, default=None),
                           "values": row.get("values", [])})
        answers[name] = {"promql": query, "series": series, "truncated": shaped["truncated"],
                         **({"warnings": shaped["warnings"]} if "warnings" in shaped else {})}
    return answers


def _lag_report(description: Any, subscription: str | None) -> dict[str, Any]:
    partitions = []
    findings: list[str] = []
    seen = False
    for partition in description.partitions:
        if partition.wal_damage is not None:
            findings.append(f"partition {partition.name} is not served: WAL damaged: {partition.wal_damage}")
        rows = []
        for sub in partition.subscriptions:
            if subscription is not None and sub.name != subscription:
                continue
            seen = True
            row = _jsonable(sub)
            row["lag_messages"] = (sub.backlog_messages if sub.backlog_messages is not None
                                   else sub.pending_messages)
            rows.append(row)
            if not sub.consumers and row["lag_messages"]:
                findings.append(f"subscription {sub.name} on {partition.name} has {row['lag_messages']} messages"
                                " waiting and no consumer")
            if sub.blocked_offset is not None:
                findings.append(f"subscription {sub.name} on {partition.name} is blocked at offset"
                                f" {sub.blocked_offset} (a message past its redeliveries)")
            if sub.redeliveries:
                findings.append(f"subscription {sub.name} on {partition.name} had {sub.redeliveries} redeliveries")
        partitions.append({"partition": partition.name, "next_offset": partition.next_offset, "subscriptions": rows})
    if subscription is not None and not seen:
        raise ToolError(f"NOT_FOUND: topic {description.name} has no subscription {subscription}")
    total = sum(row["lag_messages"] or 0 for p in partitions for row in p["subscriptions"])
    return {"topic": description.name, "lag_messages_total": total, "partitions": partitions,
            "findings": findings or ["no lag problem seen"]}


async def _health(client: AdminClient) -> dict[str, Any]:
    status = await client.cluster_status()
    brokers = await client.list_brokers()
    balance = await client.cluster_balance()
    problems: list[str] = []
    if status.leader_id is None:
        problems.append("the metadata cluster has no leader")
    problems += [f"broker {b.broker_id} is {b.status}" for b in brokers if b.status.lower() != "active"]
    topics_seen = 0
    truncated = False
    for namespace in await client.list_namespaces():
        for topic in await client.list_topics(namespace):
            if topics_seen >= HEALTH_TOPICS_MAX:
                truncated = True
                break
            topics_seen += 1
            try:
                report = _lag_report(await client.describe_topic(topic.name), None)
            except NotFound:
                continue  # deleted since it was listed
            problems += [f for f in report["findings"] if f != "no lag problem seen" and "redeliveries" not in f]
    return {"healthy": not problems, "problems": problems, "leader_node_id": status.leader_id,
            "term": status.term, "brokers": _jsonable(brokers),
            "coefficient_of_variation": balance.coefficient_of_variation,
            "topics_checked": topics_seen, "topics_truncated": truncated}


def _metric_samples(text: str, name_prefix: str, labels: dict[str, str]) -> dict[str, Any]:
    samples: list[dict[str, Any]] = []
    truncated = False
    for family in text_string_to_metric_families(text):
        if not family.name.startswith(name_prefix):
            continue
        for sample in family.samples:
            if any(sample.labels.get(key) != value for key, value in labels.items()):
                continue
            if len(samples) >= METRIC_SAMPLES_MAX:
                truncated = True
                break
            samples.append({"name": sample.name, "labels": sample.labels, "value": sample.value})
    return {"samples": samples, "truncated": truncated}


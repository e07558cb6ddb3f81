"""The console's way to the cluster: every request dials the broker's admin port (or a
client port, for the schema registry) with the logged-in user's token, over CURVE when
the cluster's public key is set, with a fresh client key pair per connection (the
admin port binds a token to the connection's key, so users never share one). The
broker's RBAC decides what each user sees and may do; the console keeps no copy of
the cluster's state beyond its charts' samples (doors/console/history.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from danube_zmq.client import promql
from danube_zmq.client.admin import AdminClient
from danube_zmq.client.json_records import jsonable
from danube_zmq.client.schemas import SchemaRegistryClient
from danube_zmq.doors.console.history import Sample, TopicHistory
from danube_zmq.transport.admin_protocol import TopicDescription
from danube_zmq.transport.errors import DanubeError, NotFound, PermissionDenied

__all__ = ["Backend", "ConsoleSettings", "jsonable", "topic_sample"]

T = TypeVar("T")

# Topics a broker page lists at most (one list_topics call per namespace).
NAMESPACES_SCANNED_MAX = 200


@dataclasses.dataclass(frozen=True, slots=True)
class ConsoleSettings:
    admin_endpoint: str
    timeout_ms: int
    # The cluster's CURVE public key (security.mode curve), or None for plain TCP.
    server_public_key: str | None = None
    # The client port for the schema registry; None: the connected broker's.
    service_url: str | None = None
    # How often the topic page's charts ask for new points.
    refresh_ms: int = 5000
    # A Prometheus scraping the brokers: the charts then show its history (the window
    # below) and latency percentiles; without it, what this console sampled.
    prometheus_url: str | None = None
    chart_minutes: int = 15


# Each chart of the topic page: its series from Prometheus, as (named query, legend
# template over the series' labels).
PROMETHEUS_CHARTS: dict[str, list[tuple[str, str]]] = {
    "backlog": [("backlog_messages", "backlog {subscription}"), ("unacked_messages", "unacked {subscription}")],
    "rates": [("publish_rate", "in {topic}"), ("dispatch_rate", "out {subscription}")],
    "latency": [("produce_ack_p99_seconds", "produce-ack p99 {topic}"),
                ("end_to_end_p99_seconds", "end-to-end p99 {subscription}")],
}
# Points per series a chart asks Prometheus for, whatever the window.
PROMETHEUS_POINTS = 240


class Backend:
    def __init__(self, settings: ConsoleSettings, history: TopicHistory | None = None) -> None:
        self.settings = settings
        self.history = history or TopicHistory()

    def _credentials(self, token: str | None) -> dict[str, Any]:
        # use_env=False: the console never dials with the token or keys it was started
        # with (DANUBE_TOKEN...), only with the user's own.
        return {"token": token, "server_public_key": self.settings.server_public_key, "use_env": False}

    async def admin(self, token: str | None, operation: Callable[[AdminClient], Awaitable[T]]) -> T:
        async with AdminClient(self.settings.admin_endpoint, timeout_ms=self.settings.timeout_ms,
                               client_name="danube-console", **self._credentials(token)) as client:
            return await operation(client)

    async def schemas(self, token: str | None, operation: Callable[[SchemaRegistryClient], Awaitable[T]]) -> T:
        url = self.settings.service_url
        if url is None:
            brokers = await self.admin(token, lambda c: c.list_brokers())
            ours = [b for b in brokers if b.admin_url == self.settings.admin_endpoint] or brokers
            if not ours:
                raise NotFound("the cluster lists no broker")
            url = ours[0].broker_url
        async with SchemaRegistryClient(url, timeout_ms=self.settings.timeout_ms, client_name="danube-console",
                                        **self._credentials(token)) as client:
            return await operation(client)

    async def check_login(self, token: str | None) -> None:
        """Raise the broker's refusal of `token` (None: of an anonymous caller). A token
        the broker authenticates but whose roles do not cover listing namespaces is
        still a login (its pages show what it may not see); an anonymous caller must
        be allowed to list them, which only a cluster without security does."""
        try:
            await self.admin(token, lambda c: c.list_namespaces())
        except PermissionDenied:
            if token is None:
                raise

    # -- what the pages show --------------------------------------------------

    async def cluster(self, token: str | None) -> dict[str, Any]:
        async def gather(c: AdminClient) -> dict[str, Any]:
            status = await c.cluster_status()
            brokers = await c.list_brokers()
            balance = await c.cluster_balance()
            return {"status": jsonable(status), "brokers": jsonable(brokers), "balance": jsonable(balance)}
        return await self.admin(token, gather)

    async def brokers(self, token: str | None) -> list[dict[str, Any]]:
        async def gather(c: AdminClient) -> list[dict[str, Any]]:
            brokers = jsonable(await c.list_brokers())
            loads = {b.broker_id: jsonable(b) for b in (await c.cluster_balance()).brokers}
            return [{**b, "load": loads.get(b["broker_id"])} for b in brokers]
        return await self.admin(token, gather)

    async def broker(self, token: str | None, broker_id: int) -> dict[str, Any]:
        async def gather(c: AdminClient) -> dict[str, Any]:
            found = [b for b in await c.list_brokers() if b.broker_id == broker_id]
            if not found:
                raise NotFound(f"no broker {broker_id}")
            loads = [b for b in (await c.cluster_balance()).brokers if b.broker_id == broker_id]
            owned: list[dict[str, Any]] = []
            for namespace in (await c.list_namespaces())[:NAMESPACES_SCANNED_MAX]:
                for topic in await c.list_topics(namespace):
                    for owner in topic.owners or []:
                        if owner.broker_id == broker_id:
                            owned.append({"topic": topic.name, "partition": owner.name})
            return {"broker": jsonable(found[0]), "load": jsonable(loads[0]) if loads else None, "owned": owned}
        return await self.admin(token, gather)

    async def namespaces(self, token: str | None) -> list[dict[str, Any]]:
        async def gather(c: AdminClient) -> list[dict[str, Any]]:
            out = []
            for namespace in await c.list_namespaces():
                out.append({"name": namespace, "topics": len(await c.list_topics(namespace))})
            return out
        return await self.admin(token, gather)

    async def namespace(self, token: str | None, namespace: str) -> dict[str, Any]:
        async def gather(c: AdminClient) -> dict[str, Any]:
            return {"name": namespace,
                    "topics": jsonable(await c.list_topics(namespace)),
                    "policies": jsonable(await c.get_namespace_policies(namespace)),
                    "limits": jsonable(await c.get_namespace_limits(namespace)),
                    "backlog_quota": jsonable(await c.get_namespace_backlog_quota(namespace)),
                    "auto_topic_creation": jsonable(await c.get_namespace_auto_topic_creation(namespace)),
                    "broker_names": await c.broker_names()}
        return await self.admin(token, gather)

    async def topics(self, token: str | None) -> dict[str, Any]:
        async def gather(c: AdminClient) -> dict[str, Any]:
            out: list[dict[str, Any]] = []
            for namespace in (await c.list_namespaces())[:NAMESPACES_SCANNED_MAX]:
                out.extend(jsonable(await c.list_topics(namespace)))
            return {"topics": out, "broker_names": await c.broker_names()}
        return await self.admin(token, gather)

    async def topic(self, token: str | None, topic: str) -> dict[str, Any]:
        async def gather(c: AdminClient) -> dict[str, Any]:
            description = await c.describe_topic(topic)
            self.history.record(topic, topic_sample(description, time.time()))
            subscriptions: dict[str, dict[str, Any]] = {}
            for partition in description.partitions:
                for sub in partition.subscriptions:
                    row = subscriptions.setdefault(sub.name, {
                        "name": sub.name, "type": jsonable(sub)["sub_type"], "consumers": 0,
                        "backlog_messages": 0, "unacked_messages": 0, "redeliveries": 0, "lag": 0,
                        "delivered": 0, "delayed": 0})
                    row["consumers"] += len(sub.consumers)
                    row["backlog_messages"] += sub.backlog_messages or sub.pending_messages
                    row["unacked_messages"] += sub.unacked_messages or 0
                    row["redeliveries"] += sub.redeliveries or 0
                    row["delayed"] += sub.delayed_messages or 0
                    row["lag"] += sub.pending_messages
                    row["delivered"] += sub.delivered_messages
            try:
                schema = jsonable(await c.get_topic_schema_config(topic))
            except NotFound:
                schema = {}  # no schema bound
            except DanubeError as err:
                schema = {"error": f"{err.code.name}: {err}"}
            return {"description": jsonable(description), "subscriptions": list(subscriptions.values()),
                    "schema": schema, "broker_names": await c.broker_names()}
        return await self.admin(token, gather)

    async def topic_series(self, token: str | None, topic: str) -> dict[str, Any]:
        """The topic page's charts: {"source", "charts": {chart: [{name, time_ms, values}]}}."""
        # The admin call first, with the caller's credentials: it is what lets this
        # caller see the topic's history at all (Prometheus knows no permissions).
        description = await self.admin(token, lambda c: c.describe_topic(topic))
        now = time.time()
        url = self.settings.prometheus_url
        if url is None:
            self.history.record(topic, topic_sample(description, now))
            return {"topic": topic, "source": "console", "charts": history_charts(self.history.series(topic))}
        charts = await asyncio.to_thread(prometheus_charts, url, topic, now, self.settings.chart_minutes * 60)
        return {"topic": topic, "source": "prometheus", "charts": charts}

    async def subscription(self, token: str | None, topic: str, name: str) -> dict[str, Any]:
        async def gather(c: AdminClient) -> dict[str, Any]:
            description = await c.describe_topic(topic)
            rows = [{"partition": p.name, **jsonable(s)} for p in description.partitions
                    for s in p.subscriptions if s.name == name]
            if not rows:
                raise NotFound(f"topic {topic} has no subscription {name!r}")
            reliable = jsonable(description)["dispatch_strategy"] == "reliable"
            failure = dispatch = None
            if reliable:
                failure = jsonable(await c.get_failure_policy(topic, name))
                dispatch = jsonable(await c.get_dispatch_config(topic, name))
            return {"topic": topic, "name": name, "reliable": reliable, "partitions": rows,
                    "failure_policy": failure, "dispatch_config": dispatch,
                    "settings": subscription_settings(failure, dispatch) if reliable else []}
        return await self.admin(token, gather)

    async def schema_subjects(self, token: str | None) -> list[dict[str, Any]]:
        return jsonable(await self.schemas(token, lambda r: r.list_subjects()))

    async def schema_subject(self, token: str | None, subject: str) -> dict[str, Any]:
        async def gather(r: SchemaRegistryClient) -> dict[str, Any]:
            versions = await r.versions(subject)
            latest = await r.get_schema(subject=subject)
            return {"subject": subject, "versions": jsonable(versions), "latest": jsonable(latest),
                    "compatibility": await r.get_compatibility(subject)}
        return await self.schemas(token, gather)

    async def security(self, token: str | None) -> dict[str, Any]:
        async def gather(c: AdminClient) -> dict[str, Any]:
            return {"roles": jsonable(await c.list_roles()), "bindings": jsonable(await c.list_bindings()),
                    "client_keys": jsonable(await c.list_client_keys()),
                    "revoked_tokens": jsonable(await c.list_revoked_tokens())}
        return await self.admin(token, gather)



def subscription_settings(failure: dict[str, Any], dispatch: dict[str, Any]) -> list[tuple[str, str]]:
    """A reliable subscription's failure policy and dispatch window as (label, value)
    rows for people, each with where it comes from: set on the subscription, or the
    broker's `reliable:` defaults (each record's own `explicit`)."""
    def source(explicit: bool, default: str) -> str:
        return "set on this subscription" if explicit else f"the broker's default ({default})"

    poison = {"block": "stop the subscription at it", "drop": "skip it",
              "dead_letter": "send it to the dead-letter topic"}
    return [
        ("Max unacked per consumer", f"{dispatch['max_unacked_messages']:,}"),
        ("Dispatch window from", source(dispatch["explicit"], "reliable.max_unacked_messages")),
        ("Ack timeout", f"{failure['ack_timeout_ms']:,} ms"),
        ("Max redeliveries", f"{failure['max_redelivery_count']:,}"),
        ("Redelivery delay", f"{failure['base_redelivery_delay_ms']:,} ms, at most"
                             f" {failure['max_redelivery_delay_ms']:,} ms ({failure['backoff']} backoff)"),
        ("After the last redelivery", poison.get(failure["poison_policy"], failure["poison_policy"])),
        ("Dead-letter topic", failure["dead_letter_topic"] or "none"),
        ("Failure policy from", source(failure["explicit"], "reliable:")),
    ]


def history_charts(series: dict[str, list[Any]]) -> dict[str, list[dict[str, Any]]]:
    def line(name: str, column: str) -> dict[str, Any]:
        return {"name": name, "time_ms": series["time_ms"], "values": series[column]}
    return {"backlog": [line("backlog", "backlog_messages"), line("unacked", "unacked_messages")],
            "rates": [line("in (msg/s)", "in_rate"), line("out (msg/s)", "out_rate")]}


def prometheus_charts(url: str, topic: str, now_s: float, window_s: float) -> dict[str, list[dict[str, Any]]]:
    """Each chart's series over the last `window_s`, by Prometheus' range queries (the
    named queries of client/promql.py). Blocking: run in a thread."""
    step = max(1.0, window_s / PROMETHEUS_POINTS)
    charts: dict[str, list[dict[str, Any]]] = {}
    for chart, queries in PROMETHEUS_CHARTS.items():
        lines = charts[chart] = []
        for query, legend in queries:
            answer = promql.range_(url, promql.CONSOLE_QUERIES[query](topic), now_s - window_s, now_s, step)
            for series in answer.get("result", []):
                labels = {"topic": topic, "subscription": "", **series.get("metric", {})}
                lines.append({"name": legend.format_map(labels).strip(),
                              "time_ms": [int(float(at) * 1000) for at, _ in series["values"]],
                              "values": [_number(value) for _, value in series["values"]]})
    return charts


def _number(text: str) -> float | None:
    value = float(text)
    return None if math.isnan(value) or math.isinf(value) else value


def topic_sample(description: TopicDescription, now_s: float) -> Sample:
    backlog = backlog_bytes = unacked = messages_in = messages_out = 0
    for partition in description.partitions:
        messages_in += partition.messages_in
        for sub in partition.subscriptions:
            backlog += sub.backlog_messages if sub.backlog_messages is not None else sub.pending_messages
            backlog_bytes += sub.backlog_bytes or 0
            unacked += sub.unacked_messages or 0
            messages_out += sub.delivered_messages
    return Sample(at_s=now_s, backlog_messages=backlog, backlog_bytes=backlog_bytes, unacked_messages=unacked,
                  messages_in=messages_in, messages_out=messages_out)


async def gather_or_error(coroutine: Awaitable[T]) -> tuple[T | None, str | None]:
    """The coroutine's result, or the broker's refusal as text for the page to show."""
    try:
        return await coroutine, None
    except DanubeError as err:
        return None, f"{err.code.name}: {err}"
    except (TimeoutError, OSError) as err:
        return None, f"UNAVAILABLE: {err}"


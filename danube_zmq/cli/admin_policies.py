"""`danube admin namespaces policies` and `danube admin topics policies`: topic
policies of a namespace or a topic (get, set, remove).

A topic's policy overrides its namespace's, which overrides the broker's `policies`
config, policy by policy. `get` shows every policy in force and where it is set,
with the backlog quota and (for a namespace) its limits on topics and partitions,
read through their own requests, so that one command shows everything that limits
a topic. Registered on the `namespaces` and `topics` groups by `cli/main.py`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import click

from danube_zmq.cli.admin import _call, _namespace, output_option
from danube_zmq.cli.options import check_topic
from danube_zmq.cli.output import emit_json, emit_line, emit_table
from danube_zmq.client.admin import AdminClient
from danube_zmq.config.broker_config import (
    AUTO_TOPIC_CREATION_DISPATCHES,
    AUTO_TOPIC_CREATION_POLICIES,
    AUTO_TOPIC_CREATION_TYPES,
    BOOLEAN_POLICIES,
    TOPIC_POLICY_NAMES,
    ZERO_IS_NEVER,
)
from danube_zmq.transport.errors import NotFound

__all__ = ["namespace_policies", "topic_policies"]

F = TypeVar("F", bound=Callable[..., Any])

_HELP = {
    "max_producers_per_topic": "Producers on one topic (each partition) at once.",
    "max_subscriptions_per_topic": "Subscriptions on one topic (each partition).",
    "max_consumers_per_topic": "Consumers on one topic (each partition), over all its subscriptions.",
    "max_consumers_per_subscription": "Consumers on one subscription.",
    "max_message_size": "Largest message payload in bytes, 1 up to the broker's own (no unlimited).",
    "max_publish_rate": "Messages per second one topic (each partition) accepts; past it sends are slowed.",
    "max_dispatch_rate": "Messages per second one subscription delivers.",
    "retention_time_ms": "Reliable topics: sealed segments older than this (ms) are deleted once every"
                         " subscription has passed them.",
    "retention_bytes_max": "Reliable topics: sealed segments past this many bytes (oldest first) are deleted"
                           " once every subscription has passed them.",
    "subscription_expiration_ms": "A subscription with no consumer attached for this long (ms) is removed"
                                  " with its cursor.",
    "message_ttl_s": "Reliable topics: a message published longer ago than this (seconds) is acknowledged for"
                     " every subscription (message TTL).",
    "deduplication": "Reliable topics: true, a message whose producer name and sequence id the topic stored"
                     " before is answered with its first offset and not stored again.",
    "compaction_threshold_bytes": "Reliable topics: compacted once the log holds this many bytes past the last"
                                  " compaction (as topics compact does).",
}


def _policy_options(command: F) -> F:
    for policy in reversed(TOPIC_POLICY_NAMES):
        if policy in BOOLEAN_POLICIES:
            command = click.option(f"--{policy.replace('_', '-')}", policy, type=click.BOOL, default=None,
                                   help=_HELP[policy] + " true or false.")(command)
            continue
        low = 1 if policy == "max_message_size" else 0
        suffix = "" if policy == "max_message_size" else " 0: kept." if policy.startswith("retention") \
            else " 0: never." if policy in ZERO_IS_NEVER else " 0: unlimited."
        command = click.option(f"--{policy.replace('_', '-')}", policy, type=click.IntRange(min=low), default=None,
                               help=_HELP[policy] + suffix)(command)
    return command


def _creation_options(command: F) -> F:
    """The namespace's auto topic creation policy (Pulsar's set-auto-topic-creation)."""
    options = [
        click.option("--allow-auto-topic-creation/--no-allow-auto-topic-creation", "allow_auto_topic_creation",
                     default=None, help="Whether subscribing to a missing topic creates it (Produce permission"
                     " needed); off: NOT_FOUND, Danube's behaviour."),
        click.option("--allow-auto-topic-creation-type", "allow_auto_topic_creation_type",
                     type=click.Choice(AUTO_TOPIC_CREATION_TYPES, case_sensitive=False), default=None,
                     help="The shape of a topic a subscriber creates."),
        click.option("--default-num-partitions", "default_num_partitions", type=click.IntRange(min=1), default=None,
                     help="Partitions of a partitioned topic a subscriber creates."),
        click.option("--auto-topic-creation-dispatch", "auto_topic_creation_dispatch",
                     type=click.Choice(AUTO_TOPIC_CREATION_DISPATCHES, case_sensitive=False), default=None,
                     help="The dispatch strategy of a topic a subscriber creates."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def _given(policies: dict[str, Any]) -> tuple[dict[str, int], dict[str, Any]]:
    """(topic policies, auto topic creation policies) given, at least one."""
    given = {name: int(value) if name in BOOLEAN_POLICIES else value
             for name, value in policies.items() if value is not None}
    if not given:
        raise click.UsageError("give at least one policy: " + ", ".join(
            f"--{name.replace('_', '-')}" for name in TOPIC_POLICY_NAMES + AUTO_TOPIC_CREATION_POLICIES))
    creation = {name: given.pop(name) for name in AUTO_TOPIC_CREATION_POLICIES if name in given}
    return given, creation


def _emit(rows: list[tuple[str, Any, str]], output: str) -> None:
    if output == "json":
        emit_json({name: {"value": value, "source": source} for name, value, source in rows})
        return
    emit_table(["POLICY", "VALUE", "SOURCE"], [list(row) for row in rows])


async def _rows(client: AdminClient, get: Callable[[], Awaitable[Any]],
                quota: Callable[[], Awaitable[Any]]) -> list[tuple[str, Any, str]]:
    info = await get()
    rows = [(name, bool(info.values[name]) if name in BOOLEAN_POLICIES else info.values[name], info.sources[name])
            for name in TOPIC_POLICY_NAMES]
    backlog = await quota()
    rows += [("backlog_quota_bytes_max", backlog.limit_bytes, backlog.source),
             ("backlog_quota_policy", backlog.policy, backlog.source)]
    return rows


@click.group("policies")
def namespace_policies() -> None:
    """Topic policies of a namespace: its topics' limits, sizes and rates.

    \b
    Examples:
      danube admin namespaces policies set default --max-message-size 1048576 --max-publish-rate 1000
      danube admin namespaces policies set default --no-allow-auto-topic-creation
      danube admin namespaces policies get default
      danube admin namespaces policies remove default
    """


@namespace_policies.command("get")
@click.argument("namespace")
@output_option
@click.pass_context
def namespace_policies_get(ctx: click.Context, namespace: str, output: str) -> None:
    """Show every policy in force for the topics of NAMESPACE and where it is set
    (namespace, or broker: the broker's config), with the backlog quota and the
    namespace's limits."""
    namespace = _namespace(namespace)

    async def read(client: AdminClient) -> list[tuple[str, Any, str]]:
        rows = await _rows(client, lambda: client.get_namespace_policies(namespace),
                           lambda: client.get_namespace_backlog_quota(namespace))
        limits = await client.get_namespace_limits(namespace)
        creation = await client.get_namespace_auto_topic_creation(namespace)
        return rows + [("topics_per_namespace_max", limits.topics_max, limits.topics_max_source),
                       ("partitions_per_topic_max", limits.partitions_max, limits.partitions_max_source)] + [
            (name, getattr(creation, name), creation.sources[name]) for name in AUTO_TOPIC_CREATION_POLICIES]

    _emit(_call(ctx, read), output)


@namespace_policies.command("set")
@click.argument("namespace")
@_policy_options
@_creation_options
@click.pass_context
def namespace_policies_set(ctx: click.Context, namespace: str, **policies: Any) -> None:
    """Set topic policies of NAMESPACE, over the broker's: only those given change.
    Live topics apply them at once (those with a policy of their own keep it). The
    auto topic creation options decide what subscribing to a missing topic does."""
    namespace = _namespace(namespace)
    given, creation = _given(policies)

    async def write(client: AdminClient) -> None:
        if given:
            await client.set_namespace_policies(namespace, **given)
        if creation:
            await client.set_namespace_auto_topic_creation(namespace, **creation)

    _call(ctx, write)
    emit_line(f"set policies of namespace {namespace}: "
              + ", ".join(f"{k} {str(v).lower() if isinstance(v, bool) else v}" for k, v in {**given, **creation}.items()))


@namespace_policies.command("remove")
@click.argument("namespace")
@click.pass_context
def namespace_policies_remove(ctx: click.Context, namespace: str) -> None:
    """Remove every topic policy and the auto topic creation policy set on NAMESPACE:
    the broker's apply."""
    namespace = _namespace(namespace)

    async def remove(client: AdminClient) -> None:
        removed = False
        for call in (client.remove_namespace_policies, client.remove_namespace_auto_topic_creation):
            try:
                await call(namespace)
                removed = True
            except NotFound:
                pass
        if not removed:
            raise NotFound(f"namespace '{namespace}' has no policies of its own")

    _call(ctx, remove)
    emit_line(f"removed the policies of namespace {namespace}")


@click.group("policies")
def topic_policies() -> None:
    """Topic policies of one topic (every partition), over its namespace's.

    \b
    Examples:
      danube admin topics policies set /default/orders --max-producers-per-topic 1
      danube admin topics policies get /default/orders
      danube admin topics policies remove /default/orders
    """


@topic_policies.command("get")
@click.argument("topic")
@output_option
@click.pass_context
def topic_policies_get(ctx: click.Context, topic: str, output: str) -> None:
    """Show every policy in force for TOPIC and where it is set (topic, namespace,
    broker), with its backlog quota."""
    topic = check_topic(topic)
    _emit(_call(ctx, lambda client: _rows(client, lambda: client.get_topic_policies(topic),
                                          lambda: client.get_topic_backlog_quota(topic))), output)


@topic_policies.command("set")
@click.argument("topic")
@_policy_options
@click.pass_context
def topic_policies_set(ctx: click.Context, topic: str, **policies: int | None) -> None:
    """Set policies of TOPIC (every partition), over its namespace's: only those given
    change. The topic applies them at once."""
    topic = check_topic(topic)
    given, _ = _given(policies)
    _call(ctx, lambda client: client.set_topic_policies(topic, **given))
    emit_line(f"set policies of topic {topic}: " + ", ".join(f"{k} {v}" for k, v in given.items()))


@topic_policies.command("remove")
@click.argument("topic")
@click.pass_context
def topic_policies_remove(ctx: click.Context, topic: str) -> None:
    """Remove every policy set on TOPIC: its namespace's (or the broker's) apply."""
    topic = check_topic(topic)
    _call(ctx, lambda client: client.remove_topic_policies(topic))
    emit_line(f"removed the policies of topic {topic}")

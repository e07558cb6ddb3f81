"""`danube admin`: namespaces, topics, subscriptions and brokers, over `AdminClient`.

Noun then verb, as in danube-admin and pulsar-admin. Each command opens one
admin connection (`--endpoint`, env DANUBE_ADMIN_ENDPOINT), makes one request
and prints the answer: a table, or with `--output json` one JSON document on
one line. Mutations print one confirmation line.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import click

from danube_zmq.actors.dispatch.tracker import BACKOFFS, POISON_POLICIES
from danube_zmq.cli.options import DEFAULT_ADMIN_ENDPOINT, check_topic, curve_options
from danube_zmq.cli.output import emit_json, emit_line, emit_table
from danube_zmq.client.admin import AdminClient, broker_label
from danube_zmq.client.json_records import enum_name as _enum_name
from danube_zmq.client.json_records import record_fields as _record
from danube_zmq.config.broker_config import BACKLOG_QUOTA_POLICIES
from danube_zmq.transport.admin_protocol import (
    BacklogQuotaInfo,
    BrokerInfo,
    DispatchConfigInfo,
    FailurePolicyInfo,
    NamespaceLimitsInfo,
    TopicDescription,
    TopicSchemaConfigInfo,
)
from danube_zmq.transport.client_protocol import DispatchStrategy, SubType
from danube_zmq.transport.topic_name import validate_namespace

__all__ = ["admin"]

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])

_DISPATCH_STRATEGIES = {"non_reliable": DispatchStrategy.NON_RELIABLE, "reliable": DispatchStrategy.RELIABLE}


# -- plumbing ----------------------------------------------------------------------


def _call(ctx: click.Context, operation: Callable[[AdminClient], Awaitable[T]]) -> T:
    """Connect, run one admin operation, close."""
    settings = ctx.find_object(_Settings)
    assert settings is not None, "the admin group stores its settings"

    async def run() -> T:
        async with AdminClient(settings.endpoint, timeout_ms=settings.timeout_ms) as client:
            return await operation(client)

    return asyncio.run(run())


@dataclasses.dataclass(frozen=True, slots=True)
class _Settings:
    endpoint: str
    timeout_ms: int


def output_option(command: F) -> F:
    return click.option(
        "-o",
        "--output",
        type=click.Choice(["table", "json"], case_sensitive=False),
        default="table",
        show_default=True,
        help="Table for people, one JSON document for programs.",
    )(command)


def _namespace(name: str) -> str:
    """The checked namespace name, before any connection; `/default` is taken as `default`."""
    if name.startswith("/") and name.count("/") == 1:
        name = name[1:]
    return validate_namespace(name)


# -- groups ------------------------------------------------------------------------


@click.group()
@click.option(
    "--endpoint",
    envvar="DANUBE_ADMIN_ENDPOINT",
    show_envvar=True,
    default=DEFAULT_ADMIN_ENDPOINT,
    show_default=True,
    metavar="URL",
    help="Broker admin endpoint.",
)
@click.option(
    "--timeout-ms",
    envvar="DANUBE_ADMIN_TIMEOUT_MS",
    show_envvar=True,
    type=click.IntRange(min=1),
    default=5000,
    show_default=True,
    help="Give up when the broker does not answer within this time.",
)
@curve_options
@click.pass_context
def admin(ctx: click.Context, endpoint: str, timeout_ms: int) -> None:
    """Manage namespaces, topics, subscriptions; list brokers.

    \b
    Examples:
      danube admin namespaces create orders
      danube admin topics create /orders/eu --partitions 3 --dispatch-strategy reliable
      danube admin topics describe /orders/eu
      danube admin --endpoint tcp://10.0.0.5:50051 brokers list --output json
    """
    ctx.obj = _Settings(endpoint=endpoint, timeout_ms=timeout_ms)


@admin.group()
def namespaces() -> None:
    """List, create and delete namespaces."""


@admin.group()
def topics() -> None:
    """List, create, delete and describe topics; manage their subscriptions."""


@admin.group()
def brokers() -> None:
    """The brokers of the cluster: list, balance, rebalance, unload (drain), activate."""


# -- namespaces --------------------------------------------------------------------


@namespaces.command("list")
@output_option
@click.pass_context
def namespaces_list(ctx: click.Context, output: str) -> None:
    """List namespaces."""
    names = _call(ctx, lambda client: client.list_namespaces())
    if output == "json":
        emit_json(names)
    else:
        emit_table(["NAMESPACE"], [[name] for name in names])


@namespaces.command("create")
@click.argument("namespace")
@click.pass_context
def namespaces_create(ctx: click.Context, namespace: str) -> None:
    """Create namespace NAMESPACE (letters, digits, '_' and '-')."""
    namespace = _namespace(namespace)
    _call(ctx, lambda client: client.create_namespace(namespace))
    emit_line(f"created namespace {namespace}")


@namespaces.command("delete")
@click.argument("namespace")
@click.pass_context
def namespaces_delete(ctx: click.Context, namespace: str) -> None:
    """Delete namespace NAMESPACE; it must have no topics."""
    namespace = _namespace(namespace)
    _call(ctx, lambda client: client.delete_namespace(namespace))
    emit_line(f"deleted namespace {namespace}")


# -- topics ------------------------------------------------------------------------


@topics.command("list")
@click.argument("namespace")
@output_option
@click.pass_context
def topics_list(ctx: click.Context, namespace: str, output: str) -> None:
    """List the topics of NAMESPACE."""
    namespace = _namespace(namespace)
    if output == "json":
        emit_json(_record(_call(ctx, lambda client: client.list_topics(namespace))))
        return
    found, names = _call(ctx, lambda client: _with_names(client, client.list_topics(namespace)))
    rows = []
    for t in found:
        dispatch = _enum_name(DispatchStrategy, t.dispatch_strategy)
        if t.owners is None:  # a broker from before per-partition owners
            rows.append([t.name, t.partitions or "-", dispatch, broker_label(t.broker_id, names), "-"])
            continue
        if t.partitions:
            rows.append([t.name, t.partitions, dispatch, "", ""])
        rows += [[o.name, "-", dispatch, *_broker_cells(o.broker_id, o.broker_url, names)] for o in t.owners]
    emit_table(["TOPIC", "PARTITIONS", "DISPATCH", "BROKER", "BROKER-URL"], rows)


async def _with_names(client: AdminClient, answer: Awaitable[T]) -> tuple[T, dict[int, str]]:
    """An answer naming brokers by id, and their names to show beside the ids."""
    return await answer, await client.broker_names()


def _broker_cells(broker_id: int | None, broker_url: str | None, names: dict[int, str]) -> list[Any]:
    """A partition's BROKER (name and id) and BROKER-URL cells: "unassigned" while it has no broker."""
    return [broker_label(broker_id, names), "-" if broker_id is None else broker_url]


@topics.command("create")
@click.argument("topic")
@click.option(
    "-p", "--partitions", type=click.IntRange(min=0), default=0, show_default=True,
    help="Number of partitions; 0 makes a non-partitioned topic.",
)
@click.option(
    "--dispatch-strategy",
    type=click.Choice(list(_DISPATCH_STRATEGIES), case_sensitive=False),
    default="non_reliable",
    show_default=True,
    help="reliable: stored and redelivered until acked; non_reliable: best effort.",
)
@click.pass_context
def topics_create(ctx: click.Context, topic: str, partitions: int, dispatch_strategy: str) -> None:
    """Create TOPIC (/namespace/topic).

    \b
    Examples:
      danube admin topics create /default/orders
      danube admin topics create /default/events --partitions 3 --dispatch-strategy reliable
    """
    topic = check_topic(topic)
    strategy = _DISPATCH_STRATEGIES[dispatch_strategy.lower()]
    _call(ctx, lambda client: client.create_topic(topic, partitions, strategy))
    shape = f" with {partitions} partitions" if partitions else ""
    emit_line(f"created topic {topic}{shape} ({strategy.name.lower()})")


@topics.command("delete")
@click.argument("topic")
@click.pass_context
def topics_delete(ctx: click.Context, topic: str) -> None:
    """Delete TOPIC (every partition of a partitioned topic), closing its clients."""
    topic = check_topic(topic)
    _call(ctx, lambda client: client.delete_topic(topic))
    emit_line(f"deleted topic {topic}")


@topics.command("unload")
@click.argument("topic")
@click.pass_context
def topics_unload(ctx: click.Context, topic: str) -> None:
    """Move TOPIC (each partition) off the broker serving it: that broker seals it, then
    the load manager gives it to another broker; clients follow. Offsets continue."""
    topic = check_topic(topic)
    _call(ctx, lambda client: client.unload_topic(topic))
    emit_line(f"unloading topic {topic}: it is sealed and assigned to another broker")


@topics.command("compact")
@click.argument("topic")
@click.option("--wait", is_flag=True, help="Return once the compaction is done (or say why it failed).")
@click.pass_context
def topics_compact(ctx: click.Context, topic: str, wait: bool) -> None:
    """Compact TOPIC (each partition of a reliable topic): keep the latest message per
    key (an empty payload deletes its key) below the committed end, in the background
    while producers keep writing. Consumers and readers with read_compacted read that
    view, then the live tail. `topics describe` shows the status and horizon."""
    topic = check_topic(topic)

    async def compact(client: AdminClient) -> TopicDescription | None:
        await client.compact_topic(topic)
        return await client.wait_for_compaction(topic) if wait else None

    described = _call(ctx, compact)
    if described is None:
        emit_line(f"compacting topic {topic}: see danube admin topics describe {topic}")
        return
    for partition in described.partitions:
        emit_line(f"{partition.name}: compacted below offset {partition.compaction_horizon}")


@topics.command("repair")
@click.argument("topic")
@click.option("--accept-loss", is_flag=True, help="Give up the unreadable records and serve the topic again.")
@click.pass_context
def topics_repair(ctx: click.Context, topic: str, accept_loss: bool) -> None:
    """Serve again TOPIC (one partition) whose WAL is damaged. Without --accept-loss,
    print which offsets would be lost and change nothing. With it, the readable records
    are kept, the damaged ones given up, and offsets continue past every offset the
    topic may have given out (never reused)."""
    topic = check_topic(topic)
    report = _call(ctx, lambda client: client.repair_topic(topic, accept_loss=accept_loss))
    emit_line(f"topic {report.topic}: {report.reason}")
    if report.lost_start is None or report.lost_end is None:
        emit_line("lost offsets: none")
    else:
        emit_line(f"lost offsets: {report.lost_start}..{report.lost_end - 1}"
                  f" ({report.lost_end - report.lost_start} offsets)")
        acknowledged_end = report.acknowledged_end
        if acknowledged_end is not None and acknowledged_end > report.lost_start:
            emit_line(f"acknowledged to producers among them: {report.lost_start}..{acknowledged_end - 1}"
                      f" (at least; later ones may have been given out without being acknowledged)")
    for path in report.quarantined:
        emit_line(f"set aside: {path}")
    if report.repaired:
        emit_line(f"repaired: topic {report.topic} is served again; its next offset is {report.next_offset}")
    else:
        emit_line(f"nothing changed (dry run); run again with --accept-loss to give up these offsets and serve the"
                  f" topic from offset {report.next_offset}")


@topics.command("reassign")
@click.argument("topic")
@click.option("--force", is_flag=True, help="Give up the offsets only the dead broker's WAL holds and place the topic"
                                            " on a live broker.")
@click.pass_context
def topics_reassign(ctx: click.Context, topic: str, force: bool) -> None:
    """Serve elsewhere TOPIC (one partition), a reliable topic in storage.mode local whose
    broker is gone with the only copy of its WAL. Prints the offsets that become
    unreadable (from the oldest cursor to the end of the dead broker's reservation)
    first; without --force nothing changes. With it, the load manager places the topic
    on a live broker, whose offsets continue past that reservation."""
    topic = check_topic(topic)
    report = _call(ctx, lambda client: client.reassign_topic(topic, force=False))
    _emit_reassignment(report)
    if not force:
        emit_line(f"nothing changed (dry run); run again with --force to give up these offsets and serve the topic"
                  f" elsewhere from offset {report.next_offset}")
        return
    done = _call(ctx, lambda client: client.reassign_topic(topic, force=True))
    if (done.from_broker, done.lost_start, done.lost_end) != (report.from_broker, report.lost_start, report.lost_end):
        _emit_reassignment(done)  # changed between the report and the reassignment
    emit_line(f"reassigned: topic {done.topic} leaves broker {done.from_broker}; the next broker continues at offset"
              f" {done.next_offset}")


def _emit_reassignment(report: Any) -> None:
    emit_line(f"topic {report.topic}: {report.reason}")
    if report.lost_start is None or report.lost_end is None:
        emit_line("unreadable offsets: none a subscription still needs")
    else:
        emit_line(f"unreadable offsets: {report.lost_start}..{report.lost_end - 1}"
                  f" ({report.lost_end - report.lost_start} offsets; the oldest cursor is subscription"
                  f" {report.subscription}'s; offsets the dead broker reserved but never gave out are among them)")


@topics.command("describe")
@click.argument("topic")
@output_option
@click.pass_context
def topics_describe(ctx: click.Context, topic: str, output: str) -> None:
    """Show TOPIC's partitions, producers, subscriptions and counters."""
    topic = check_topic(topic)
    if output == "json":
        emit_json(_record(_call(ctx, lambda client: client.describe_topic(topic))))
        return
    description, names = _call(ctx, lambda client: _with_names(client, client.describe_topic(topic)))
    emit_line(
        f"topic {description.name}  dispatch {_enum_name(DispatchStrategy, description.dispatch_strategy)}"
        f"  broker {broker_label(description.broker_id, names)}  partitions {len(description.partitions)}"
    )
    emit_table(
        ["PARTITION", "BROKER", "BROKER-URL", "NEXT-OFFSET", "MESSAGES-IN", "BYTES-IN", "DROPPED", "EVICTED",
         "PRODUCERS"],
        [
            [p.name, *_broker_cells(p.broker_id, p.broker_url, names), p.next_offset, p.messages_in, p.bytes_in,
             p.dropped_messages, p.evicted_messages, p.producers]
            for p in description.partitions
        ],
        title="Partitions",
    )
    for p in description.partitions:
        if p.wal_damage is not None:
            emit_line(f"NOT SERVED: partition {p.name}: WAL damaged: {p.wal_damage}")
        elif p.not_served is not None:
            emit_line(f"NOT SERVED: partition {p.name}: {p.not_served}")
    compacted = [p for p in description.partitions if p.compaction not in (None, "never")]
    if compacted:
        emit_table(["PARTITION", "COMPACTION", "HORIZON"],
                   [[p.name, p.compaction, p.compaction_horizon] for p in compacted], title="Compaction")
    if description.policies is not None and description.policy_sources is not None:
        sources = description.policy_sources
        emit_table(["POLICY", "VALUE", "SOURCE"],
                   [[name, value, sources.get(name, "")] for name, value in description.policies.items()],
                   title="Policies in force")
    subscriptions = [s for p in description.partitions for s in p.subscriptions]
    if not subscriptions:
        emit_line("no subscriptions")
        return
    emit_table(
        ["SUBSCRIPTION", "PARTITION", "TYPE", "CONSUMERS", "ACTIVE", "PENDING", "DELIVERED", "DROPPED"],
        [
            [
                s.name, s.topic, _enum_name(SubType, s.sub_type), s.consumers, s.active_consumer,
                s.pending_messages, s.delivered_messages, s.dropped_messages,
            ]
            for s in subscriptions
        ],
        title="Subscriptions",
    )
    reliable = [s for s in subscriptions if s.cursor is not None]
    if reliable:
        emit_table(
            ["SUBSCRIPTION", "PARTITION", "CURSOR", "BACKLOG", "BACKLOG-BYTES", "UNACKED", "REDELIVERIES", "BLOCKED-AT",
             "DELAYED"],
            [
                [s.name, s.topic, s.cursor, s.backlog_messages, s.backlog_bytes, s.unacked_messages, s.redeliveries,
                 s.blocked_offset, s.delayed_messages]
                for s in reliable
            ],
            title="Reliable delivery",
        )


@topics.command("subscriptions")
@click.argument("topic")
@output_option
@click.pass_context
def topics_subscriptions(ctx: click.Context, topic: str, output: str) -> None:
    """List the subscriptions of TOPIC."""
    topic = check_topic(topic)
    names = _call(ctx, lambda client: client.list_subscriptions(topic))
    if output == "json":
        emit_json(names)
    else:
        emit_table(["SUBSCRIPTION"], [[name] for name in names])


@topics.command("unsubscribe")
@click.argument("topic")
@click.option("-s", "--subscription", required=True, help="The subscription to delete.")
@click.pass_context
def topics_unsubscribe(ctx: click.Context, topic: str, subscription: str) -> None:
    """Delete a subscription of TOPIC (on every partition), closing its consumers."""
    topic = check_topic(topic)
    _call(ctx, lambda client: client.unsubscribe(topic, subscription))
    emit_line(f"deleted subscription {subscription} of {topic}")


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class _PublishTime(click.ParamType):
    """A publish time: milliseconds since the epoch, or an ISO 8601 date-time (UTC
    unless it names a zone), as milliseconds since the epoch."""

    name = "ISO8601|MS"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        text = str(value).strip()
        if text.isdigit():
            return int(text)
        try:
            moment = datetime.fromisoformat(text)
        except ValueError:
            self.fail(f"{text!r} is neither milliseconds since the epoch nor an ISO 8601 date-time"
                      " (2024-05-01T12:00:00Z)", param, ctx)
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=UTC)
        ms = (moment - _EPOCH) // timedelta(milliseconds=1)
        if ms < 0:
            self.fail(f"{text!r} is before 1970", param, ctx)
        return ms


@topics.command("seek")
@click.argument("topic")
@click.option("-s", "--subscription", required=True, help="The subscription to move.")
@click.option("--offset", type=click.IntRange(min=0), help="Deliver again from this offset (one partition).")
@click.option(
    "--time", "publish_time", type=_PublishTime(),
    help="Deliver from the first message published at or after this time: ms since the epoch, or ISO 8601"
    " (UTC unless a zone is given).",
)
@click.pass_context
def topics_seek(ctx: click.Context, topic: str, subscription: str, offset: int | None, publish_time: int | None) -> None:
    """Move a subscription of reliable TOPIC to an offset or a publish time.

    Everything before the new position counts as consumed, everything from it is
    delivered (again). Connected consumers stay attached and drop what they had
    received but not processed. Offsets are per partition: a partitioned topic seeks
    by --time, or name one partition topic.

    \b
    Examples:
      danube admin topics seek /default/orders -s audit --offset 0
      danube admin topics seek /default/orders -s audit --time 2024-05-01T12:00:00Z
    """
    topic = check_topic(topic)
    if (offset is None) == (publish_time is None):
        raise click.UsageError("give exactly one of --offset and --time")
    _call(ctx, lambda client: client.seek_subscription(topic, subscription, offset=offset, publish_time=publish_time))
    where = f"offset {offset}" if offset is not None else f"publish time {publish_time} ms"
    emit_line(f"moved subscription {subscription} of {topic} to {where}")


_POLICY_FIELDS = [
    ("max_redelivery_count", "MAX-REDELIVERIES"),
    ("ack_timeout_ms", "ACK-TIMEOUT-MS"),
    ("base_redelivery_delay_ms", "BASE-DELAY-MS"),
    ("max_redelivery_delay_ms", "MAX-DELAY-MS"),
    ("backoff", "BACKOFF"),
    ("poison_policy", "POISON-POLICY"),
    ("dead_letter_topic", "DEAD-LETTER-TOPIC"),
]


def _emit_policy(policy: FailurePolicyInfo, output: str) -> None:
    if output == "json":
        emit_json(_record(policy))
        return
    emit_table(
        [header for _, header in _POLICY_FIELDS] + ["SOURCE"],
        [[getattr(policy, name) for name, _ in _POLICY_FIELDS] + ["set" if policy.explicit else "broker default"]],
    )


@topics.command("set-failure-policy")
@click.argument("topic")
@click.option("-s", "--subscription", required=True, help="The subscription to configure.")
@click.option("--max-redelivery-count", type=click.IntRange(min=0),
              help="Redeliveries of one message before the poison policy applies.")
@click.option("--ack-timeout-ms", type=click.IntRange(min=1), help="Redeliver what is not acked within this time.")
@click.option("--base-redelivery-delay-ms", type=click.IntRange(min=0), help="Delay before the first redelivery.")
@click.option("--max-redelivery-delay-ms", type=click.IntRange(min=0), help="Longest redelivery delay.")
@click.option("--backoff", "--backoff-strategy", "backoff", type=click.Choice(BACKOFFS, case_sensitive=False),
              help="fixed: the base delay every time; exponential: base x 2^(n-1).")
@click.option("--poison-policy", type=click.Choice(POISON_POLICIES, case_sensitive=False),
              help="After max-redelivery-count: block the subscription, drop the message, or dead_letter it.")
@click.option("--dead-letter-topic", help="Where dead_letter republishes poisoned messages ('' clears it).")
@output_option
@click.pass_context
def topics_set_failure_policy(ctx: click.Context, topic: str, subscription: str, output: str,
                              **fields: Any) -> None:
    """Set the failure policy of a subscription of reliable TOPIC.

    Options left out keep their current values (the broker's `reliable:` defaults
    until a policy is set). The policy applies from now on, to every partition, and
    survives broker restarts.

    \b
    Examples:
      danube admin topics set-failure-policy /default/orders -s audit --max-redelivery-count 3 --poison-policy drop
      danube admin topics set-failure-policy /default/orders -s audit \\
          --poison-policy dead_letter --dead-letter-topic /default/orders-dlq
    """
    topic = check_topic(topic)
    for name in ("backoff", "poison_policy"):
        if fields[name] is not None:
            fields[name] = fields[name].lower()
    policy = _call(ctx, lambda client: client.set_failure_policy(topic, subscription, **fields))
    if output == "json":
        emit_json(_record(policy))
        return
    settings = ", ".join(f"{name}={getattr(policy, name)}" for name, _ in _POLICY_FIELDS)
    emit_line(f"set the failure policy of subscription {subscription} of {topic}: {settings}")


@topics.command("get-failure-policy")
@click.argument("topic")
@click.option("-s", "--subscription", required=True, help="The subscription to show.")
@output_option
@click.pass_context
def topics_get_failure_policy(ctx: click.Context, topic: str, subscription: str, output: str) -> None:
    """Show the failure policy of a subscription of reliable TOPIC."""
    topic = check_topic(topic)
    policy: FailurePolicyInfo = _call(ctx, lambda client: client.get_failure_policy(topic, subscription))
    _emit_policy(policy, output)


@topics.command("set-dispatch-config")
@click.argument("topic")
@click.option("-s", "--subscription", required=True, help="The subscription to configure.")
@click.option("--max-unacked-messages", type=click.IntRange(min=1), required=True,
              help="Unacknowledged deliveries each consumer may hold (1..10000).")
@click.pass_context
def topics_set_dispatch_config(ctx: click.Context, topic: str, subscription: str, max_unacked_messages: int) -> None:
    """Set the dispatch window of a subscription of reliable TOPIC.

    Each consumer holds at most --max-unacked-messages deliveries awaiting an ack
    (the broker's `reliable.max_unacked_messages` until set). It applies at once, to
    every partition, and survives broker restarts.

    \b
    Example:
      danube admin topics set-dispatch-config /default/orders -s audit --max-unacked-messages 10
    """
    topic = check_topic(topic)
    _call(ctx, lambda client: client.set_dispatch_config(topic, subscription,
                                                         max_unacked_messages=max_unacked_messages))
    emit_line(f"set the dispatch config of subscription {subscription} of {topic}:"
              f" max_unacked_messages={max_unacked_messages}")


@topics.command("get-dispatch-config")
@click.argument("topic")
@click.option("-s", "--subscription", required=True, help="The subscription to show.")
@output_option
@click.pass_context
def topics_get_dispatch_config(ctx: click.Context, topic: str, subscription: str, output: str) -> None:
    """Show the dispatch window of a subscription of reliable TOPIC."""
    topic = check_topic(topic)
    config: DispatchConfigInfo = _call(ctx, lambda client: client.get_dispatch_config(topic, subscription))
    if output == "json":
        emit_json(_record(config))
        return
    emit_table(
        ["MAX-UNACKED-MESSAGES", "SOURCE"],
        [[config.max_unacked_messages, "set" if config.explicit else "broker default"]],
    )


# -- limits per namespace -----------------------------------------------------------


@namespaces.command("set-limits")
@click.argument("namespace")
@click.option("--topics-max", type=click.IntRange(min=1), default=None,
              help="Topics NAMESPACE may hold, each partition counted as one.")
@click.option("--partitions-max", type=click.IntRange(min=1), default=None,
              help="Partitions one topic of NAMESPACE may have.")
@click.pass_context
def namespaces_set_limits(ctx: click.Context, namespace: str, topics_max: int | None,
                          partitions_max: int | None) -> None:
    """Set limits of NAMESPACE over the broker's policies (topics_per_namespace_max,
    partitions_per_topic_max). Only the limits given change; creates past them are
    refused. Existing topics are kept.

    \b
    Example:
      danube admin namespaces set-limits default --topics-max 100 --partitions-max 16
    """
    namespace = _namespace(namespace)
    if topics_max is None and partitions_max is None:
        raise click.UsageError("give --topics-max or --partitions-max (or both)")
    _call(ctx, lambda client: client.set_namespace_limits(namespace, topics_max=topics_max,
                                                          partitions_max=partitions_max))
    given = [f"{name} {value}" for name, value in (("topics-max", topics_max), ("partitions-max", partitions_max))
             if value is not None]
    emit_line(f"set the limits of namespace {namespace}: {', '.join(given)}")


@namespaces.command("get-limits")
@click.argument("namespace")
@output_option
@click.pass_context
def namespaces_get_limits(ctx: click.Context, namespace: str, output: str) -> None:
    """Show the limits in force for NAMESPACE (SOURCE broker: the broker's policies)."""
    namespace = _namespace(namespace)
    info: NamespaceLimitsInfo = _call(ctx, lambda client: client.get_namespace_limits(namespace))
    if output == "json":
        emit_json(_record(info))
        return
    emit_table(["LIMIT", "VALUE", "SOURCE"], [["topics-max", info.topics_max, info.topics_max_source],
                                              ["partitions-max", info.partitions_max, info.partitions_max_source]])


@namespaces.command("remove-limits")
@click.argument("namespace")
@click.pass_context
def namespaces_remove_limits(ctx: click.Context, namespace: str) -> None:
    """Remove the limits of NAMESPACE: the broker's policies apply."""
    namespace = _namespace(namespace)
    _call(ctx, lambda client: client.remove_namespace_limits(namespace))
    emit_line(f"removed the limits of namespace {namespace}")


# -- backlog quotas -----------------------------------------------------------------


def _quota_options(command: F) -> F:
    command = click.option("--policy", type=click.Choice(BACKLOG_QUOTA_POLICIES), default="producer_exception",
                           show_default=True,
                           help="What a send meets over the quota: refused (producer_exception), held until acks"
                                " free room (producer_request_hold), or accepted while the slowest subscriptions"
                                " skip their oldest messages (consumer_backlog_eviction).")(command)
    return click.option("--limit-bytes", type=click.IntRange(min=0), required=True,
                        help="Bytes the slowest subscription may leave unacknowledged; 0: no limit.")(command)


def _emit_quota(info: BacklogQuotaInfo, output: str) -> None:
    if output == "json":
        emit_json(_record(info))
        return
    emit_table(["LIMIT-BYTES", "POLICY", "SOURCE"], [[info.limit_bytes, info.policy, info.source]])


@namespaces.command("set-backlog-quota")
@click.argument("namespace")
@_quota_options
@click.pass_context
def namespaces_set_backlog_quota(ctx: click.Context, namespace: str, limit_bytes: int, policy: str) -> None:
    """Set the backlog quota of the reliable topics of NAMESPACE (those without a quota
    of their own). It applies to live topics at once and survives restarts.

    \b
    Example:
      danube admin namespaces set-backlog-quota default --limit-bytes 1073741824 --policy producer_request_hold
    """
    namespace = _namespace(namespace)
    _call(ctx, lambda client: client.set_namespace_backlog_quota(namespace, limit_bytes=limit_bytes, policy=policy))
    emit_line(f"set the backlog quota of namespace {namespace}: {limit_bytes} bytes, {policy}")


@namespaces.command("get-backlog-quota")
@click.argument("namespace")
@output_option
@click.pass_context
def namespaces_get_backlog_quota(ctx: click.Context, namespace: str, output: str) -> None:
    """Show the backlog quota of NAMESPACE (SOURCE broker: the broker's default)."""
    namespace = _namespace(namespace)
    _emit_quota(_call(ctx, lambda client: client.get_namespace_backlog_quota(namespace)), output)


@namespaces.command("remove-backlog-quota")
@click.argument("namespace")
@click.pass_context
def namespaces_remove_backlog_quota(ctx: click.Context, namespace: str) -> None:
    """Remove the backlog quota of NAMESPACE: the broker's default applies."""
    namespace = _namespace(namespace)
    _call(ctx, lambda client: client.remove_namespace_backlog_quota(namespace))
    emit_line(f"removed the backlog quota of namespace {namespace}")


@topics.command("set-backlog-quota")
@click.argument("topic")
@_quota_options
@click.pass_context
def topics_set_backlog_quota(ctx: click.Context, topic: str, limit_bytes: int, policy: str) -> None:
    """Set the backlog quota of reliable TOPIC (every partition), over its namespace's.
    It applies at once and survives restarts.

    \b
    Example:
      danube admin topics set-backlog-quota /default/orders --limit-bytes 0 --policy producer_exception
    """
    topic = check_topic(topic)
    _call(ctx, lambda client: client.set_topic_backlog_quota(topic, limit_bytes=limit_bytes, policy=policy))
    emit_line(f"set the backlog quota of topic {topic}: {limit_bytes} bytes, {policy}")


@topics.command("get-backlog-quota")
@click.argument("topic")
@output_option
@click.pass_context
def topics_get_backlog_quota(ctx: click.Context, topic: str, output: str) -> None:
    """Show the backlog quota in force for TOPIC and where it is set (topic, namespace, broker)."""
    topic = check_topic(topic)
    _emit_quota(_call(ctx, lambda client: client.get_topic_backlog_quota(topic)), output)


@topics.command("remove-backlog-quota")
@click.argument("topic")
@click.pass_context
def topics_remove_backlog_quota(ctx: click.Context, topic: str) -> None:
    """Remove the backlog quota of TOPIC: its namespace's (or the broker's) applies."""
    topic = check_topic(topic)
    _call(ctx, lambda client: client.remove_topic_backlog_quota(topic))
    emit_line(f"removed the backlog quota of topic {topic}")


# -- topic schemas ------------------------------------------------------------------


def _emit_schema_config(info: TopicSchemaConfigInfo, output: str) -> None:
    if output == "json":
        emit_json(_record(info))
        return
    emit_table(["TOPIC", "SUBJECT", "SCHEMA-ID", "LATEST-VERSION", "VALIDATION-POLICY", "PAYLOAD-VALIDATION"],
               [[info.topic, info.subject, info.schema_id, "-" if info.latest_version is None else info.latest_version,
                 info.validation_policy, "on" if info.payload_validation else "off"]])


@topics.command("configure-schema")
@click.argument("topic")
@click.option("--subject", required=True, help="A registered schema subject.")
@click.option("--validation-policy", type=click.Choice(["none", "warn", "enforce"]), default="none", show_default=True,
              help="warn: accept and count messages without the topic's schema; enforce: refuse them.")
@click.option("--enable-payload-validation", is_flag=True,
              help="Decode every payload against its schema version and refuse invalid ones.")
@output_option
@click.pass_context
def topics_configure_schema(ctx: click.Context, topic: str, subject: str, validation_policy: str,
                            enable_payload_validation: bool, output: str) -> None:
    """Bind TOPIC (all its partitions) to a schema subject."""
    topic = check_topic(topic)
    info = _call(ctx, lambda client: client.configure_topic_schema(
        topic, subject, validation_policy=validation_policy, payload_validation=enable_payload_validation))
    _emit_schema_config(info, output)


@topics.command("get-schema-config")
@click.argument("topic")
@output_option
@click.pass_context
def topics_get_schema_config(ctx: click.Context, topic: str, output: str) -> None:
    """Show TOPIC's schema subject and validation policy."""
    topic = check_topic(topic)
    _emit_schema_config(_call(ctx, lambda client: client.get_topic_schema_config(topic)), output)


# -- brokers -----------------------------------------------------------------------


@brokers.command("list")
@output_option
@click.pass_context
def brokers_list(ctx: click.Context, output: str) -> None:
    """List the brokers with their endpoints, role and status."""
    found: list[BrokerInfo] = _call(ctx, lambda client: client.list_brokers())
    if output == "json":
        emit_json(_record(found))
        return
    emit_table(
        ["NAME", "BROKER-ID", "CLIENT-URL", "ADMIN-URL", "METRICS-URL", "ROLE", "STATUS"],
        [[b.name or "-", b.broker_id, b.broker_url, b.admin_url, b.metrics_url, b.role, b.status] for b in found],
    )


@brokers.command("balance")
@output_option
@click.pass_context
def brokers_balance(ctx: click.Context, output: str) -> None:
    """The cluster's balance: coefficient of variation and each broker's load."""
    info = _call(ctx, lambda client: client.cluster_balance())
    if output == "json":
        emit_json(_record(info))
        return
    emit_line(f"coefficient of variation {info.coefficient_of_variation:.3f} (mean {info.mean_load:.2f},"
              f" min {info.min_load:.2f}, max {info.max_load:.2f}); strategy {info.assignment_strategy},"
              f" rebalancing {'on' if info.rebalancing else 'off'}")
    emit_table(["NAME", "BROKER-ID", "LOAD", "TOPICS", "STATUS", "OVERLOADED", "UNDERLOADED"],
               [[b.name or "-", b.broker_id, f"{b.load:.2f}", b.topic_count, b.status, b.overloaded, b.underloaded]
                for b in info.brokers])


def _emit_moves(answer: tuple[Any, dict[int, str]], output: str, verb: str) -> None:
    result, names = answer
    if output == "json":
        emit_json(_record(result))
        return
    if not result.moves:
        emit_line(f"no moves: {result.why_none or 'nothing to move'}")
        return
    emit_table(["TOPIC", "FROM", "TO", "LOAD"],
               [[m.topic, broker_label(m.from_broker, names), broker_label(m.to_broker, names),
                 f"{m.estimated_load:.2f}"] for m in result.moves])
    emit_line(f"{len(result.moves)} moves {verb}")


@brokers.command("rebalance")
@click.option("--dry-run", is_flag=True, help="Show the moves without making them.")
@click.option("--max-moves", type=click.IntRange(min=1), default=None, help="At most N moves (default: the policy's).")
@output_option
@click.pass_context
def brokers_rebalance(ctx: click.Context, dry_run: bool, max_moves: int | None, output: str) -> None:
    """Rebalance now: move topics from the most to the least loaded brokers."""
    result = _call(ctx, lambda client: _with_names(client, client.rebalance(dry_run=dry_run, max_moves=max_moves)))
    _emit_moves(result, output, "planned (dry run)" if dry_run else "started")


@brokers.command("unload")
@click.option("--broker-id", type=int, required=True, help="The broker to drain.")
@output_option
@click.pass_context
def brokers_unload(ctx: click.Context, broker_id: int, output: str) -> None:
    """Drain a broker: it takes no new topics and its topics move to the others."""
    result = _call(ctx, lambda client: _with_names(client, client.unload_broker(broker_id)))
    _emit_moves(result, output, f"started; broker {broker_label(broker_id, result[1])} is drained once they are done")


@brokers.command("activate")
@click.option("--broker-id", type=int, required=True, help="The broker to activate.")
@click.pass_context
def brokers_activate(ctx: click.Context, broker_id: int) -> None:
    """Let a drained broker take topics again."""
    _call(ctx, lambda client: client.activate_broker(broker_id))
    emit_line(f"broker {broker_id} is active")

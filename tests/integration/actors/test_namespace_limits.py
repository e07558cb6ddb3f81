"""Per-namespace limits on topics and on partitions per topic (Pulsar's
`set-max-topics-per-namespace`), against real broker processes and the CLI: a
namespace's own limit overrides the broker's `policies.topics_per_namespace_max` /
`partitions_per_topic_max`, refusals name the namespace, the count and where the limit
is set, removing the override restores the broker's, and in a cluster an override
written through one broker holds on the others."""

from __future__ import annotations

import asyncio
import json

import pytest

from danube_zmq.client.admin import AdminClient
from danube_zmq.transport.errors import InternalError, InvalidArgument, NotFound, ResourceExhausted
from tests.integration.cli.test_cli_e2e import danube


def _admin(broker, *args: str):  # type: ignore[no-untyped-def]
    return danube("admin", "--endpoint", broker.admin_url, *args)


def _ok(broker, *args: str) -> str:  # type: ignore[no-untyped-def]
    done = _admin(broker, *args)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_a_namespace_limited_to_3_topics_refuses_the_4th_until_the_limit_is_removed(broker_factory) -> None:
    """Broker default 5 topics per namespace. `namespaces set-limits default --topics-max 3`:
    three creates pass, the 4th is refused (RESOURCE_EXHAUSTED naming the namespace, the
    count 3 and the namespace's limit as the source), `get-limits -o json` shows the
    override. After `remove-limits` the broker's 5 apply again: two more pass, the 6th
    is refused naming `policies.topics_per_namespace_max`."""
    broker = broker_factory(env={"DANUBE_POLICIES__TOPICS_PER_NAMESPACE_MAX": "5"})
    out = _ok(broker, "namespaces", "set-limits", "default", "--topics-max", "3")
    assert "default" in out and "3" in out, out
    shown = json.loads(_ok(broker, "namespaces", "get-limits", "default", "-o", "json"))
    assert (shown["topics_max"], shown["topics_max_source"]) == (3, "namespace"), shown
    assert (shown["partitions_max"], shown["partitions_max_source"]) == (1000, "broker"), shown
    for n in range(3):
        _ok(broker, "topics", "create", f"/default/t{n}")
    refused = _admin(broker, "topics", "create", "/default/t3")
    assert refused.returncode != 0
    assert "'default' holds 3 topics" in refused.stderr and "limit of namespace 'default' (3)" in refused.stderr, \
        refused.stderr

    async def code() -> None:
        async with AdminClient(broker.admin_url) as admin:
            with pytest.raises(ResourceExhausted, match="namespace 'default'"):
                await admin.create_topic("/default/t3")

    asyncio.run(code())
    _ok(broker, "namespaces", "remove-limits", "default")
    shown = json.loads(_ok(broker, "namespaces", "get-limits", "default", "-o", "json"))
    assert (shown["topics_max"], shown["topics_max_source"]) == (5, "broker"), shown
    _ok(broker, "topics", "create", "/default/t3")
    _ok(broker, "topics", "create", "/default/t4")
    refused = _admin(broker, "topics", "create", "/default/t5")
    assert refused.returncode != 0 and "policies.topics_per_namespace_max (5)" in refused.stderr, refused.stderr


def test_a_namespace_partition_limit_refuses_a_wider_topic_there_only(broker_factory) -> None:
    """`set-limits default --partitions-max 4`: a 5-partition topic in `default` is
    INVALID_ARGUMENT naming the namespace's limit, 4 partitions pass, and namespace
    `other` keeps the broker's 1,000. A later `--topics-max` keeps the partitions limit
    set before (set-limits changes only the limits it names)."""
    broker = broker_factory(env={"DANUBE_BOOTSTRAP_NAMESPACES": "[default, other]"})

    async def run() -> None:
        async with AdminClient(broker.admin_url) as admin:
            await admin.set_namespace_limits("default", partitions_max=4)
            with pytest.raises(InvalidArgument, match="partitions limit of namespace 'default'"):
                await admin.create_topic("/default/wide", partitions=5)
            await admin.create_topic("/default/wide", partitions=4)
            await admin.create_topic("/other/wide", partitions=5)
            await admin.set_namespace_limits("default", topics_max=100)
            info = await admin.get_namespace_limits("default")
            assert (info.topics_max, info.topics_max_source, info.partitions_max, info.partitions_max_source) == \
                (100, "namespace", 4, "namespace")
            info = await admin.get_namespace_limits("other")
            assert (info.partitions_max, info.partitions_max_source) == (1000, "broker")

    asyncio.run(run())


def test_bad_namespace_limit_requests_get_clear_errors(broker) -> None:
    """No limit named, a limit below 1 or past the broker-config range is
    INVALID_ARGUMENT naming the field; an unknown namespace is NOT_FOUND; removing limits
    never set is NOT_FOUND; deleting a namespace takes its limits with it."""
    async def run() -> None:
        async with AdminClient(broker.admin_url) as admin:
            with pytest.raises(InvalidArgument, match="topics_max or partitions_max"):
                await admin.set_namespace_limits("default")
            with pytest.raises(InvalidArgument, match="topics_max"):
                await admin.set_namespace_limits("default", topics_max=0)
            with pytest.raises(InvalidArgument, match="partitions_max"):
                await admin.set_namespace_limits("default", partitions_max=100_001)
            with pytest.raises(NotFound, match="nowhere"):
                await admin.set_namespace_limits("nowhere", topics_max=3)
            with pytest.raises(NotFound, match="nowhere"):
                await admin.get_namespace_limits("nowhere")
            with pytest.raises(NotFound, match="no limits of its own"):
                await admin.remove_namespace_limits("default")
            await admin.create_namespace("gone")
            await admin.set_namespace_limits("gone", topics_max=1)
            await admin.delete_namespace("gone")
            await admin.create_namespace("gone")
            assert (await admin.get_namespace_limits("gone")).topics_max_source == "broker"

    asyncio.run(run())
    done = _admin(broker, "namespaces", "set-limits", "default")
    assert done.returncode != 0 and "--topics-max" in done.stderr, done.stderr


def test_an_unreadable_topic_record_is_an_error_naming_it_not_a_way_past_the_limit(broker_factory) -> None:
    """A key under /topics/default/ that holds no TopicRecord (written raw through the
    metadata admin) cannot be counted: a create in that namespace is refused with an
    error naming the key, instead of the record being skipped (which let the limit be
    passed); another namespace is not affected."""
    broker = broker_factory(env={"DANUBE_BOOTSTRAP_NAMESPACES": "[default, other]"})

    async def run() -> None:
        async with AdminClient(broker.admin_url) as admin:
            await admin.metadata_put("/topics/default/garbled", b"\xc1not msgpack")
            with pytest.raises(InternalError, match="/topics/default/garbled"):
                await admin.create_topic("/default/next")
            await admin.create_topic("/other/next")

    asyncio.run(run())


@pytest.mark.cluster
def test_in_a_cluster_a_namespace_limit_set_through_one_broker_holds_on_another(tmp_path) -> None:
    """3 brokers: `set-limits --topics-max 2` through broker 0; broker 1 shows it
    (`get-limits`, source namespace), creates through brokers 1 and 2 fill the
    namespace and the third is refused naming the namespace's limit; after
    `remove-limits` through broker 2 a create through broker 1 passes."""
    from tests.integration.actors.test_cluster import running_cluster

    with running_cluster(tmp_path) as nodes:
        _ok(nodes[0], "namespaces", "set-limits", "default", "--topics-max", "2")
        shown = json.loads(_ok(nodes[1], "namespaces", "get-limits", "default", "-o", "json"))
        assert (shown["topics_max"], shown["topics_max_source"]) == (2, "namespace"), shown
        _ok(nodes[1], "topics", "create", "/default/a")
        _ok(nodes[2], "topics", "create", "/default/b")
        _ok(nodes[1], "namespaces", "get-limits", "default")  # a barrier: broker 1 has applied /default/b
        refused = _admin(nodes[1], "topics", "create", "/default/c")
        assert refused.returncode != 0 and "limit of namespace 'default' (2)" in refused.stderr, refused.stderr
        _ok(nodes[2], "namespaces", "remove-limits", "default")
        _ok(nodes[1], "namespaces", "get-limits", "default")
        _ok(nodes[1], "topics", "create", "/default/c")

"""Backlog quotas per namespace and per topic (Pulsar's `set-backlog-quota`), against
real broker processes, the client and the CLI: a topic's quota overrides its
namespace's, which overrides the broker's `policies.backlog_quota_*`; a change applies
to live topics at once, survives a restart, and in a cluster the broker serving the
topic applies a quota set through any other broker.

The broker default here is the sample's 10 GiB: a few hundred KiB of unacked backlog
is refused only once a 64 KiB namespace or topic quota is set.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time

import pytest

from danube_zmq import DanubeClient, SubType
from danube_zmq.client.admin import AdminClient
from danube_zmq.transport.client_protocol import DispatchStrategy
from danube_zmq.transport.errors import InvalidArgument, NotFound, ResourceExhausted
from tests.integration.cli.test_cli_e2e import danube

QUOTA = 64 * 1024
PAYLOAD = b"o" * 1024
BACKLOG_SENDS = 200  # 200 KiB unacked: over QUOTA, far under the broker default


async def _refused_within(producer, deadline_s: float = 20.0) -> str:
    """Send until a send is refused RESOURCE_EXHAUSTED; its message."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        try:
            await producer.send(PAYLOAD)
        except ResourceExhausted as exc:
            return str(exc)
        await asyncio.sleep(0.05)
    raise AssertionError(f"no send refused within {deadline_s} s")


async def _accepted_within(producer, deadline_s: float = 20.0) -> None:
    deadline = time.monotonic() + deadline_s
    while True:
        try:
            await producer.send(PAYLOAD)
            return
        except ResourceExhausted:
            assert time.monotonic() < deadline, "sends still refused after the quota was raised or removed"
            await asyncio.sleep(0.1)


async def _cli(admin_url: str, *args: str) -> str:
    """The CLI in a thread: the client's heartbeats go on meanwhile."""
    done = await asyncio.to_thread(danube, "admin", "--endpoint", admin_url, *args)
    assert done.returncode == 0, done.stderr
    return done.stdout


async def test_topic_quota_overrides_namespace_quota_overrides_broker_default_on_a_live_topic(broker) -> None:
    """A live reliable topic with 200 KiB unacked: accepted under the broker default;
    refused once `namespaces set-backlog-quota` sets 64 KiB; accepted again once
    `topics set-backlog-quota` gives the topic 10 MiB; refused again when the topic's is
    removed (the namespace's applies); accepted when the namespace's is removed too.
    `get-backlog-quota` names where the quota in force comes from."""
    async with DanubeClient(broker.url, operation_retries_max=0) as client:
        producer = await client.create_producer("/default/ovr", dispatch="reliable")
        await client.subscribe("/default/ovr", "slow", sub_type=SubType.EXCLUSIVE)
        for _ in range(BACKLOG_SENDS):
            await producer.send(PAYLOAD)
        shown = json.loads(await _cli(broker.admin_url, "topics", "get-backlog-quota", "/default/ovr", "-o", "json"))
        assert shown["source"] == "broker" and shown["policy"] == "producer_exception", shown

        out = await _cli(broker.admin_url, "namespaces", "set-backlog-quota", "default", "--limit-bytes", str(QUOTA),
                   "--policy", "producer_exception")
        assert "default" in out and str(QUOTA) in out
        assert str(QUOTA) in await _refused_within(producer)
        shown = json.loads(await _cli(broker.admin_url, "topics", "get-backlog-quota", "/default/ovr", "-o", "json"))
        assert (shown["limit_bytes"], shown["source"]) == (QUOTA, "namespace"), shown

        await _cli(broker.admin_url, "topics", "set-backlog-quota", "/default/ovr", "--limit-bytes", str(10 * 1024 * 1024),
             "--policy", "producer_exception")
        await _accepted_within(producer)
        table = await _cli(broker.admin_url, "topics", "get-backlog-quota", "/default/ovr")
        assert "10485760" in table and "topic" in table, table

        await _cli(broker.admin_url, "topics", "remove-backlog-quota", "/default/ovr")
        assert str(QUOTA) in await _refused_within(producer)
        await _cli(broker.admin_url, "namespaces", "remove-backlog-quota", "default")
        await _accepted_within(producer)
        shown = json.loads(await _cli(broker.admin_url, "namespaces", "get-backlog-quota", "default", "-o", "json"))
        assert shown["source"] == "broker", shown


async def test_a_topic_backlog_quota_survives_a_broker_restart(broker_factory) -> None:
    """A topic quota set before SIGTERM is shown after the restart and still refuses
    sends over it (the topic is loaded with it from the metadata store)."""
    first = broker_factory()
    async with AdminClient(first.admin_url) as admin:
        await admin.create_topic("/default/kept", dispatch_strategy=DispatchStrategy.RELIABLE)
        await admin.set_topic_backlog_quota("/default/kept", limit_bytes=QUOTA, policy="producer_exception")
    assert first.stop(signal.SIGTERM) == 0
    second = broker_factory(url=first.url, admin_url=first.admin_url)
    async with AdminClient(second.admin_url) as admin:
        info = await admin.get_topic_backlog_quota("/default/kept")
        assert (info.limit_bytes, info.policy, info.source) == (QUOTA, "producer_exception", "topic")
    async with DanubeClient(second.url, operation_retries_max=0) as client:
        producer = await client.create_producer("/default/kept", dispatch="reliable")
        await client.subscribe("/default/kept", "slow", sub_type=SubType.EXCLUSIVE)
        assert str(QUOTA) in await _refused_within(producer)


async def test_eviction_set_on_a_topic_shows_evicted_messages_in_describe(broker) -> None:
    """consumer_backlog_eviction set on one topic (the broker default refuses nothing
    here): sends over the quota are accepted, the slow subscription's cursor is moved
    on, and `topics describe` prints the EVICTED count."""
    async with AdminClient(broker.admin_url) as admin:
        await admin.create_topic("/default/evict", dispatch_strategy=DispatchStrategy.RELIABLE)
        await admin.set_topic_backlog_quota("/default/evict", limit_bytes=QUOTA, policy="consumer_backlog_eviction")
    async with DanubeClient(broker.url, operation_retries_max=0) as client:
        producer = await client.create_producer("/default/evict", dispatch="reliable")
        await client.subscribe("/default/evict", "slow", sub_type=SubType.EXCLUSIVE)
        for _ in range(BACKLOG_SENDS):
            await producer.send(PAYLOAD)
    deadline = time.monotonic() + 20
    while True:
        table = await _cli(broker.admin_url, "topics", "describe", "/default/evict")
        lines = table.splitlines()
        at = next(i for i, line in enumerate(lines) if line.startswith("PARTITION"))
        header, row = lines[at], lines[at + 1]
        # By the header's column start: a BROKER cell ("broker-1 (id)") holds a space.
        evicted = int(row[header.index("EVICTED"):].split()[0])
        if evicted > 0:
            break
        assert time.monotonic() < deadline, table
        await asyncio.sleep(0.2)


async def test_bad_backlog_quota_requests_get_clear_errors(broker) -> None:
    """An unknown policy or a negative limit is INVALID_ARGUMENT naming the field; an
    unknown namespace or topic is NOT_FOUND; the CLI refuses an unknown policy."""
    async with AdminClient(broker.admin_url) as admin:
        with pytest.raises(InvalidArgument, match="policy"):
            await admin.set_namespace_backlog_quota("default", limit_bytes=QUOTA, policy="drop_everything")
        with pytest.raises(InvalidArgument, match="limit_bytes"):
            await admin.set_namespace_backlog_quota("default", limit_bytes=-1, policy="producer_exception")
        with pytest.raises(NotFound, match="nowhere"):
            await admin.set_namespace_backlog_quota("nowhere", limit_bytes=QUOTA, policy="producer_exception")
        with pytest.raises(NotFound, match="/default/absent"):
            await admin.set_topic_backlog_quota("/default/absent", limit_bytes=QUOTA, policy="producer_exception")
        with pytest.raises(NotFound):
            await admin.remove_namespace_backlog_quota("nowhere")
    done = danube("admin", "--endpoint", broker.admin_url, "namespaces", "set-backlog-quota", "default",
                  "--limit-bytes", "10", "--policy", "bogus")
    assert done.returncode != 0 and "bogus" in done.stderr


@pytest.mark.cluster
def test_in_a_cluster_the_owner_applies_a_quota_set_through_another_broker_and_after_a_move(tmp_path) -> None:
    """3 brokers: a namespace quota set through a broker that does not serve the topic
    is applied by the one that does (sends refused); after `topics unload` the next
    owner loads the topic with it (sends still refused), and removing it through a
    third broker lets sends through."""
    from tests.integration.actors.test_cluster import _owners, running_cluster

    async def run(nodes) -> None:  # type: ignore[no-untyped-def]
        async with AdminClient(nodes[0].admin_url) as admin:
            await admin.create_topic("/default/cq", dispatch_strategy=DispatchStrategy.RELIABLE)
        owner_url = (await _owners(nodes[0], ["/default/cq"]))["/default/cq"]
        others = [node for node in nodes if node.url != owner_url]
        async with DanubeClient(others[0].url, operation_retries_max=3) as client:
            producer = await client.create_producer("/default/cq", dispatch="reliable")
            await client.subscribe("/default/cq", "slow", sub_type=SubType.EXCLUSIVE)
            for _ in range(BACKLOG_SENDS):
                await producer.send(PAYLOAD)
            async with AdminClient(others[1].admin_url) as admin:
                await admin.set_namespace_backlog_quota("default", limit_bytes=QUOTA, policy="producer_exception")
            assert str(QUOTA) in await _refused_within(producer)
            async with AdminClient(others[1].admin_url) as admin:
                await admin.unload_topic("/default/cq")
            deadline = time.monotonic() + 30
            while (await _owners(nodes[0], ["/default/cq"]))["/default/cq"] == owner_url:
                assert time.monotonic() < deadline, "the topic did not move"
                await asyncio.sleep(0.2)
            assert str(QUOTA) in await _refused_within(producer, deadline_s=30)
            async with AdminClient(others[0].admin_url) as admin:
                info = await admin.get_topic_backlog_quota("/default/cq")
                assert (info.limit_bytes, info.source) == (QUOTA, "namespace")
                await admin.remove_namespace_backlog_quota("default")
            await _accepted_within(producer, deadline_s=30)

    with running_cluster(tmp_path) as nodes:
        asyncio.run(run(nodes))

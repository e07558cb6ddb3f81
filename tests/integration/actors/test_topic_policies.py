"""Topic policies per namespace and per topic (`danube admin namespaces|topics
policies`), against real broker processes, the client and the CLI: a topic's policy
overrides its namespace's, which overrides the broker's `policies`; a change applies to
live topics at once and a topic loaded after a restart reads them from the store.
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
from danube_zmq.transport.errors import FailedPrecondition, InvalidArgument, NotFound, ResourceExhausted
from tests.integration.actors.test_subscriptions import drain
from tests.integration.cli.test_cli_e2e import danube


async def _cli(admin_url: str, *args: str) -> str:
    """The CLI in a thread: the client's heartbeats go on meanwhile."""
    done = await asyncio.to_thread(danube, "admin", "--endpoint", admin_url, *args)
    assert done.returncode == 0, done.stderr
    return done.stdout


async def test_a_topic_max_producers_refuses_the_second_producer_until_removed(broker) -> None:
    """`topics policies set --max-producers-per-topic 1` on a live topic: a second
    producer is RESOURCE_EXHAUSTED naming the policy; after `policies remove` it is let in."""
    async with DanubeClient(broker.url, operation_retries_max=0) as client:
        await client.create_producer("/default/one", name="first")
        out = await _cli(broker.admin_url, "topics", "policies", "set", "/default/one", "--max-producers-per-topic", "1")
        assert "max_producers_per_topic 1" in out, out
        with pytest.raises(ResourceExhausted, match="max_producers_per_topic"):
            await client.create_producer("/default/one", name="second")
        await _cli(broker.admin_url, "topics", "policies", "remove", "/default/one")
        await client.create_producer("/default/one", name="second")


async def test_namespace_max_message_size_refuses_larger_messages_and_the_topic_level_overrides(broker) -> None:
    """A namespace's max_message_size of 1,024 refuses a 2,048-byte message on its
    live topic; the topic's own 4,096 lets it in (and `policies get` names each source);
    the namespace's limit still holds on its other topics."""
    async with DanubeClient(broker.url, operation_retries_max=0) as client:
        producer = await client.create_producer("/default/sized")
        other = await client.create_producer("/default/other")
        await producer.send(b"x" * 2048)
        await _cli(broker.admin_url, "namespaces", "policies", "set", "default", "--max-message-size", "1024")
        with pytest.raises(InvalidArgument, match=r"max_message_size \(1024"):
            await producer.send(b"x" * 2048)
        await producer.send(b"x" * 1024)

        await _cli(broker.admin_url, "topics", "policies", "set", "/default/sized", "--max-message-size", "4096")
        await producer.send(b"x" * 2048)
        with pytest.raises(InvalidArgument, match="max_message_size"):
            await other.send(b"x" * 2048)
        shown = json.loads(await _cli(broker.admin_url, "topics", "policies", "get", "/default/sized", "-o", "json"))
        assert shown["max_message_size"] == {"value": 4096, "source": "topic"}, shown
        assert shown["max_producers_per_topic"] == {"value": 0, "source": "broker"}, shown
        assert shown["backlog_quota_policy"]["value"] == "producer_exception", shown
        shown = json.loads(await _cli(broker.admin_url, "namespaces", "policies", "get", "default", "-o", "json"))
        assert shown["max_message_size"] == {"value": 1024, "source": "namespace"}, shown
        assert shown["topics_per_namespace_max"]["source"] == "broker", shown
        assert shown["max_publish_rate"] == {"value": 0, "source": "broker"}, shown

        await _cli(broker.admin_url, "namespaces", "policies", "remove", "default")
        await other.send(b"x" * 2048)
        table = await _cli(broker.admin_url, "namespaces", "policies", "get", "default")
        assert "max_message_size" in table and "partitions_per_topic_max" in table, table


async def test_set_changes_only_the_policies_given_and_bad_values_are_refused(broker) -> None:
    """Two sets on one namespace keep each other's policies; out-of-range values, no
    policy, a missing namespace or topic, and a partition are refused with clear errors;
    deleting a topic and its namespace deletes their policies."""
    async with AdminClient(broker.admin_url) as admin:
        await admin.set_namespace_policies("default", max_consumers_per_topic=5)
        await admin.set_namespace_policies("default", max_dispatch_rate=100)
        info = await admin.get_namespace_policies("default")
        assert info.values["max_consumers_per_topic"] == 5 and info.values["max_dispatch_rate"] == 100
        assert info.sources["max_consumers_per_topic"] == "namespace"
        assert info.sources["max_subscriptions_per_topic"] == "broker"
        with pytest.raises(InvalidArgument, match=r"max_message_size must be in 1\.\.10485760"):
            await admin.set_namespace_policies("default", max_message_size=10485761)  # over the broker's
        with pytest.raises(InvalidArgument, match=r"max_publish_rate must be in 0\.\."):
            await admin.set_namespace_policies("default", max_publish_rate=-1)
        with pytest.raises(InvalidArgument, match="at least one policy"):
            await admin.set_namespace_policies("default")
        with pytest.raises(NotFound, match="nowhere"):
            await admin.set_namespace_policies("nowhere", max_producers_per_topic=1)
        with pytest.raises(NotFound):
            await admin.get_topic_policies("/default/missing")
        await admin.create_topic("/default/parts", partitions=2)
        with pytest.raises(FailedPrecondition, match="partition"):
            await admin.set_topic_policies("/default/parts-part-0", max_producers_per_topic=1)
        await admin.remove_namespace_policies("default")
        with pytest.raises(NotFound, match="no topic policies"):
            await admin.remove_namespace_policies("default")
        # Policies go with their topic and namespace: created again, neither has any.
        await admin.create_namespace("brief")
        await admin.create_topic("/brief/t")
        await admin.set_namespace_policies("brief", max_producers_per_topic=3)
        await admin.set_topic_policies("/brief/t", max_producers_per_topic=2)
        await admin.delete_topic("/brief/t")
        await admin.delete_namespace("brief")
        await admin.create_namespace("brief")
        await admin.create_topic("/brief/t")
        info = await admin.get_topic_policies("/brief/t")
        assert info.sources["max_producers_per_topic"] == "broker", info
    done = await asyncio.to_thread(danube, "admin", "--endpoint", broker.admin_url, "topics", "policies", "set",
                                   "/default/parts")
    assert done.returncode == 2 and "--max-producers-per-topic" in done.stderr, done.stderr


async def test_a_topic_policy_survives_a_broker_restart(broker_factory) -> None:
    """A topic's max_producers_per_topic set before SIGTERM is shown after the restart
    and refuses the second producer (the topic is loaded with it from the store)."""
    first = broker_factory()
    async with AdminClient(first.admin_url) as admin:
        await admin.create_topic("/default/kept")
        await admin.set_topic_policies("/default/kept", max_producers_per_topic=1)
    assert first.stop(signal.SIGTERM) == 0
    second = broker_factory(url=first.url, admin_url=first.admin_url)
    async with AdminClient(second.admin_url) as admin:
        info = await admin.get_topic_policies("/default/kept")
        assert (info.values["max_producers_per_topic"], info.sources["max_producers_per_topic"]) == (1, "topic")
    async with DanubeClient(second.url, operation_retries_max=0) as client:
        await client.create_producer("/default/kept", name="a")
        with pytest.raises(ResourceExhausted, match="max_producers_per_topic"):
            await client.create_producer("/default/kept", name="b")


async def test_describe_shows_the_policies_in_force(broker) -> None:
    """`topics describe` prints each policy in force with its source, in the table and
    in --output json."""
    async with AdminClient(broker.admin_url) as admin:
        await admin.create_topic("/default/shown")
        await admin.set_namespace_policies("default", max_subscriptions_per_topic=7)
        await admin.set_topic_policies("/default/shown", max_publish_rate=300)
    async with DanubeClient(broker.url) as client:
        # Served before it is described (on a busy machine its first placement may take
        # longer than describe waits).
        await client.create_producer("/default/shown")
    shown = json.loads(await _cli(broker.admin_url, "topics", "describe", "/default/shown", "-o", "json"))
    assert shown["policies"]["max_publish_rate"] == 300 and shown["policy_sources"]["max_publish_rate"] == "topic"
    assert shown["policies"]["max_subscriptions_per_topic"] == 7, shown
    assert shown["policy_sources"]["max_subscriptions_per_topic"] == "namespace", shown
    assert shown["policy_sources"]["max_message_size"] == "broker", shown
    table = await _cli(broker.admin_url, "topics", "describe", "/default/shown")
    assert "Policies in force" in table and "max_publish_rate" in table and "300" in table, table


@pytest.mark.parametrize("dispatch", ["non_reliable", "reliable"])
async def test_max_publish_rate_slows_producers_and_loses_nothing(broker, dispatch: str) -> None:
    """At max_publish_rate 200, 1,000 messages sent at once take at least ~4 s to be
    acknowledged (one second's burst, then 200/s), and a subscriber gets all of them,
    in order: the topic holds batches back, it never drops or refuses them."""
    topic = f"/default/rate-{dispatch.replace('_', '-')}"
    async with AdminClient(broker.admin_url) as admin:
        await admin.create_topic(topic, dispatch_strategy=DispatchStrategy.RELIABLE if dispatch == "reliable"
                                 else DispatchStrategy.NON_RELIABLE)
        await admin.set_topic_policies(topic, max_publish_rate=200)
    async with DanubeClient(broker.url) as client:
        consumer = await client.subscribe(topic, "all", initial_position="earliest")
        producer = await client.create_producer(topic, dispatch=dispatch)
        started = asyncio.get_running_loop().time()
        receipts = [producer.send_nowait(f"{i}".encode()) for i in range(1000)]
        await asyncio.gather(*receipts)
        elapsed = asyncio.get_running_loop().time() - started
        assert elapsed >= 3.5, f"1,000 messages at 200/s were acknowledged in {elapsed:.2f} s"
        got = []
        while len(got) < 1000:
            message = await consumer.receive(timeout=10)
            got.append(int(message.payload))
            await consumer.ack(message)
        assert got == list(range(1000))


@pytest.mark.parametrize("dispatch", ["non_reliable", "reliable"])
async def test_max_dispatch_rate_paces_deliveries(broker, dispatch: str) -> None:
    """At max_dispatch_rate 100 set on the namespace, 500 messages already published
    reach a subscriber in at least ~4 s (one second's burst, then 100/s), all of them,
    in order; the limit applies per subscription, set live on the topic."""
    topic = f"/default/paced-{dispatch.replace('_', '-')}"
    async with DanubeClient(broker.url) as client:
        producer = await client.create_producer(topic, dispatch=dispatch)
        consumer = await client.subscribe(topic, "paced", initial_position="earliest")
        await _cli(broker.admin_url, "namespaces", "policies", "set", "default", "--max-dispatch-rate", "100")
        started = asyncio.get_running_loop().time()
        await asyncio.gather(*[producer.send_nowait(f"{i}".encode()) for i in range(500)])
        got = []
        while len(got) < 500:
            message = await consumer.receive(timeout=10)
            got.append(int(message.payload))
            await consumer.ack(message)
        elapsed = asyncio.get_running_loop().time() - started
        assert elapsed >= 3.5, f"500 messages at 100/s were delivered in {elapsed:.2f} s"
        assert got == list(range(500))


async def _second_producer_refused_within(client: DanubeClient, topic: str, deadline_s: float = 30.0) -> str:
    """Create extra producers until one is refused RESOURCE_EXHAUSTED; its message."""
    deadline = time.monotonic() + deadline_s
    n = 0
    while time.monotonic() < deadline:
        n += 1
        try:
            extra = await client.create_producer(topic, name=f"extra-{n}")
        except ResourceExhausted as exc:
            return str(exc)
        await extra.close()
        await asyncio.sleep(0.1)
    raise AssertionError(f"no second producer refused within {deadline_s} s")


@pytest.mark.cluster
def test_in_a_cluster_the_owner_applies_policies_set_through_another_broker_and_after_a_move(tmp_path) -> None:
    """3 brokers: a namespace's max_producers_per_topic 1 set through a broker that does
    not serve the topic is applied by the one that does (a second producer refused);
    after `topics unload` the next owner loads the topic with it; removing it through
    the third broker lets a second producer in."""
    from tests.integration.actors.test_cluster import _owners, running_cluster

    topic = "/default/cp"

    async def run(nodes) -> None:  # type: ignore[no-untyped-def]
        async with AdminClient(nodes[0].admin_url) as admin:
            await admin.create_topic(topic)
        owner_url = (await _owners(nodes[0], [topic]))[topic]
        others = [node for node in nodes if node.url != owner_url]
        async with DanubeClient(others[0].url, operation_retries_max=3) as client:
            await client.create_producer(topic, name="first")
            async with AdminClient(others[1].admin_url) as admin:
                await admin.set_namespace_policies("default", max_producers_per_topic=1)
            assert "max_producers_per_topic" in await _second_producer_refused_within(client, topic)
            async with AdminClient(others[1].admin_url) as admin:
                await admin.unload_topic(topic)
            deadline = time.monotonic() + 30
            while (await _owners(nodes[0], [topic]))[topic] == owner_url:
                assert time.monotonic() < deadline, "the topic did not move"
                await asyncio.sleep(0.2)
            assert "max_producers_per_topic" in await _second_producer_refused_within(client, topic)
            async with AdminClient(others[0].admin_url) as admin:
                info = await admin.get_topic_policies(topic)
                assert (info.values["max_producers_per_topic"], info.sources["max_producers_per_topic"]) == (
                    1, "namespace")
                await admin.remove_namespace_policies("default")
            deadline = time.monotonic() + 30
            while True:
                try:
                    await client.create_producer(topic, name="second")
                    break
                except ResourceExhausted:
                    assert time.monotonic() < deadline, "a second producer still refused after the removal"
                    await asyncio.sleep(0.2)

    with running_cluster(tmp_path) as nodes:
        asyncio.run(run(nodes))


async def test_batches_held_over_the_publish_rate_are_bounded(broker_factory) -> None:
    """With policies.publish_rate_hold_bytes_max at 1 byte nothing can be held: at
    max_publish_rate 1 the first message passes and the next, sent at once, is refused
    RESOURCE_EXHAUSTED naming the bound, instead of waiting in a queue past it."""
    limited = broker_factory(env={"DANUBE_POLICIES__PUBLISH_RATE_HOLD_BYTES_MAX": "1"})
    async with AdminClient(limited.admin_url) as admin:
        await admin.create_topic("/default/held")
        await admin.set_topic_policies("/default/held", max_publish_rate=1)
    async with DanubeClient(limited.url, operation_retries_max=0) as client:
        producer = await client.create_producer("/default/held")
        await producer.send(b"first")
        with pytest.raises(ResourceExhausted, match="publish_rate_hold_bytes_max"):
            await producer.send(b"second")


async def test_consumer_limits_set_on_a_live_topic_reach_its_subscriptions(broker) -> None:
    """A subscription spawned before the policy: `topics policies set
    --max-consumers-per-subscription 1` refuses its second consumer; a topic-level
    max_subscriptions_per_topic 1 refuses a second subscription."""
    async with DanubeClient(broker.url, operation_retries_max=0) as client:
        await client.create_producer("/default/subs")
        await client.subscribe("/default/subs", "work", sub_type=SubType.SHARED, consumer_name="c1")
        await _cli(broker.admin_url, "topics", "policies", "set", "/default/subs",
                   "--max-consumers-per-subscription", "1", "--max-subscriptions-per-topic", "1")
        with pytest.raises(ResourceExhausted, match="max_consumers_per_subscription"):
            await client.subscribe("/default/subs", "work", sub_type=SubType.SHARED, consumer_name="c2")
        with pytest.raises(ResourceExhausted, match="max_subscriptions_per_topic"):
            await client.subscribe("/default/subs", "other", sub_type=SubType.SHARED, consumer_name="d1")


async def test_retention_set_on_a_topic_deletes_its_consumed_segments_and_no_others(broker_factory, tmp_path) -> None:
    """The broker keeps every segment (no `storage.retention_*`); a topic's own
    retention_time_ms deletes its sealed segments once its subscription has passed them,
    and a topic of the same namespace without the policy keeps all of its own."""
    broker = broker_factory(env={"DANUBE_STORAGE__WAL_SEGMENT_BYTES_MAX": str(16 * 1024),
                                 "DANUBE_STORAGE__RETENTION_CHECK_INTERVAL_MS": "200"})
    wal = tmp_path / "data" / "wal" / "default"
    async with DanubeClient(broker.url) as client, AdminClient(broker.admin_url) as admin:
        files: dict[str, set] = {}
        for name in ("trimmed", "kept"):
            producer = await client.create_producer(f"/default/{name}", dispatch="reliable", batch_messages_max=50)
            consumer = await client.subscribe(f"/default/{name}", "s", sub_type=SubType.EXCLUSIVE)
            for i in range(600):
                producer.send_nowait(f"{i:04d}".encode() + b"x" * 96)
            await producer.flush()
            files[name] = set((wal / name).glob("*.wal"))
            assert len(files[name]) > 3
            await drain(consumer, 600)
            await consumer.flush_acks()
        await admin.set_topic_policies("/default/trimmed", retention_time_ms=1)
        assert (await admin.get_topic_policies("/default/trimmed")).sources["retention_time_ms"] == "topic"
        deadline = time.monotonic() + 15
        while files["trimmed"] <= set((wal / "trimmed").glob("*.wal")):
            assert time.monotonic() < deadline, "the topic's retention never deleted its consumed segments"
            await asyncio.sleep(0.1)
        await asyncio.sleep(1.0)  # several retention ticks
        assert files["kept"] <= set((wal / "kept").glob("*.wal")), "a topic without the policy lost segments"

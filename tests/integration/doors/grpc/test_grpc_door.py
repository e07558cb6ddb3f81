"""The broker's gRPC door driven by Danube's own Python client (`danube-client` from PyPI).

A real broker process with `--grpc-listen` on a free port; Danube's client produces and
consumes through the door, and our native client shares the same topics and
subscriptions with it (docs/danube-compat.md).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator

import grpc
import pytest

from danube_zmq.client import DanubeClient as NativeClient
from danube_zmq.transport.errors import Timeout
from tests.integration.conftest import BrokerProcess, free_port, start_broker

danube = pytest.importorskip("danube", reason="danube-client (the test extra) is not installed")

RECEIVE_TIMEOUT_S = 10.0


@pytest.fixture(scope="module")
def door_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[BrokerProcess, str]]:
    """One broker with the client door for a module's tests (each uses topics of its own)."""
    grpc_url = f"http://127.0.0.1:{free_port()}"
    process = start_broker(tmp_path_factory.mktemp("door"), "--grpc-listen", grpc_url)
    yield process, grpc_url
    code = process.stop()
    assert code == 0, f"broker did not stop cleanly (exit {code}):\n{process.log()}"


@pytest.fixture
async def theirs(door_broker: tuple[BrokerProcess, str]) -> AsyncIterator[danube.DanubeClient]:
    _, grpc_url = door_broker
    yield await danube.DanubeClientBuilder().service_url(grpc_url).build()


async def _subscribe(client: danube.DanubeClient, topic: str, subscription: str, name: str,
                     sub_type: danube.SubType = danube.SubType.EXCLUSIVE) -> tuple[danube.Consumer, asyncio.Queue]:
    consumer = (client.new_consumer().with_topic(topic).with_consumer_name(name)
                .with_subscription(subscription).with_subscription_type(sub_type).build())
    await consumer.subscribe()
    return consumer, await consumer.receive()


async def _take(queue: asyncio.Queue, count: int) -> list:
    out = []
    async with asyncio.timeout(RECEIVE_TIMEOUT_S):
        while len(out) < count:
            out.append(await queue.get())
    return out


@pytest.mark.parametrize("strategy", ["NON_RELIABLE", "RELIABLE"])
async def test_danube_producer_to_danube_consumer(theirs: danube.DanubeClient, strategy: str) -> None:
    """Danube's producer and consumer, both through the door, on a topic the producer
    creates with its dispatch strategy: every message arrives in order with its
    attributes and routing key, and acks are accepted."""
    topic = f"/default/door-{strategy.lower()}"
    producer = (theirs.new_producer().with_topic(topic).with_name("p1")
                .with_dispatch_strategy(getattr(danube.DispatchStrategy, strategy)).build())
    await producer.create()
    consumer, queue = await _subscribe(theirs, topic, "s1", "c1")
    await asyncio.sleep(0.3)  # the stream is open before the first message (a new subscription starts at the tail)
    for i in range(20):
        await producer.send(f"m{i}".encode(), {"i": str(i)})
    await producer.send_with_key(b"keyed", None, "k-1")
    got = await _take(queue, 21)
    assert [m.payload for m in got] == [f"m{i}".encode() for i in range(20)] + [b"keyed"]
    assert got[3].attributes["i"] == "3" and got[3].producer_name == "p1"
    assert got[-1].routing_key == "k-1"
    if strategy == "RELIABLE":
        assert [m.msg_id.topic_offset for m in got] == list(range(21))
    for message in got:
        await consumer.ack(message)
    await consumer.close()
    await producer.close()


async def test_reliable_unacked_message_comes_back_after_nack(theirs: danube.DanubeClient) -> None:
    """A nack through the door is the broker's nack: the message is delivered again."""
    topic = "/default/door-nack"
    producer = (theirs.new_producer().with_topic(topic).with_name("p1")
                .with_dispatch_strategy(danube.DispatchStrategy.RELIABLE).build())
    await producer.create()
    consumer, queue = await _subscribe(theirs, topic, "s1", "c1")
    await asyncio.sleep(0.3)
    await producer.send(b"again")
    (first,) = await _take(queue, 1)
    await consumer.nack(first, delay_ms=0)
    (second,) = await _take(queue, 1)
    assert second.payload == b"again" and second.msg_id.topic_offset == first.msg_id.topic_offset
    await consumer.ack(second)
    await consumer.close()


async def test_danube_producer_to_native_consumer_and_back(door_broker: tuple[BrokerProcess, str],
                                                           theirs: danube.DanubeClient) -> None:
    """Mixed: what Danube's producer sends through the door our native consumer reads,
    and what our native producer sends Danube's consumer reads, on one reliable topic."""
    broker, _ = door_broker
    topic = "/default/door-mixed"
    producer = (theirs.new_producer().with_topic(topic).with_name("danube-p")
                .with_dispatch_strategy(danube.DispatchStrategy.RELIABLE).build())
    await producer.create()
    async with NativeClient(broker.url) as ours:
        native_consumer = await ours.subscribe(topic, "native-sub", sub_type="exclusive")
        danube_consumer, queue = await _subscribe(theirs, topic, "danube-sub", "danube-c")
        await asyncio.sleep(0.3)
        await producer.send(b"from-danube", {"origin": "danube"})
        native_producer = await ours.create_producer(topic, name="native-p", dispatch="reliable")
        await native_producer.send(b"from-native", attributes={"origin": "native"})
        async with asyncio.timeout(RECEIVE_TIMEOUT_S):
            read = [await native_consumer.receive(), await native_consumer.receive()]
        assert [(m.payload, m.producer_name, dict(m.attributes)) for m in read] == [
            (b"from-danube", "danube-p", {"origin": "danube"}), (b"from-native", "native-p", {"origin": "native"})]
        got = await _take(queue, 2)
        assert [(m.payload, m.producer_name) for m in got] == [(b"from-danube", "danube-p"),
                                                               (b"from-native", "native-p")]
        await danube_consumer.close()


async def test_exclusive_conflict_is_permission_denied(theirs: danube.DanubeClient) -> None:
    """A second consumer name on an Exclusive subscription is refused PERMISSION_DENIED,
    as Danube's broker refuses it (its client does not retry that code)."""
    topic = "/default/door-exclusive"
    producer = theirs.new_producer().with_topic(topic).with_name("p1").build()
    await producer.create()
    first, _ = await _subscribe(theirs, topic, "only", "c1")
    second = (theirs.new_consumer().with_topic(topic).with_consumer_name("c2").with_subscription("only")
              .with_subscription_type(danube.SubType.EXCLUSIVE).build())
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await second.subscribe()
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    await first.close()


async def test_lookup_connects_here_and_unknown_topic_fails(theirs: danube.DanubeClient,
                                                            door_broker: tuple[BrokerProcess, str]) -> None:
    """A standalone broker's door answers Connect with its own gRPC URL for a topic it
    serves, Failed for a topic that does not exist, and lists a topic's partitions."""
    _, grpc_url = door_broker
    producer = theirs.new_producer().with_topic("/default/door-lookup").with_name("p1").build()
    await producer.create()
    answer = await theirs.lookup_service.lookup_topic(grpc_url, "/default/door-lookup")
    assert (answer.response_type, answer.connect_url, answer.broker_url) == (1, grpc_url, grpc_url)
    missing = await theirs.lookup_service.lookup_topic(grpc_url, "/default/no-such-topic")
    assert missing.response_type == 2
    assert await theirs.lookup_service.topic_partitions(grpc_url, "/default/door-lookup") == ["/default/door-lookup"]


async def test_producer_created_again_under_its_name_gets_its_id(theirs: danube.DanubeClient,
                                                                 door_broker: tuple[BrokerProcess, str]) -> None:
    """Danube's semantics: CreateProducer with a name already attached on the topic is a
    re-attach and answers the same producer id (one native producer behind it)."""
    topic = "/default/door-reattach"
    first = theirs.new_producer().with_topic(topic).with_name("same").build()
    await first.create()
    again = theirs.new_producer().with_topic(topic).with_name("same").build()
    await again.create()
    assert first._producers[0].producer_id == again._producers[0].producer_id != 0


async def test_key_shared_key_filters_route_by_key(theirs: danube.DanubeClient) -> None:
    """Key-Shared with key filters through the door: each consumer gets only the keys
    its glob filter matches."""
    topic = "/default/door-keys"
    producer = (theirs.new_producer().with_topic(topic).with_name("p1")
                .with_dispatch_strategy(danube.DispatchStrategy.RELIABLE).build())
    await producer.create()
    queues = {}
    for prefix in ("eu", "us"):
        consumer = (theirs.new_consumer().with_topic(topic).with_consumer_name(f"c-{prefix}")
                    .with_subscription("keys").with_subscription_type(danube.SubType.KEY_SHARED)
                    .with_key_filter(f"{prefix}-*").build())
        await consumer.subscribe()
        queues[prefix] = await consumer.receive()
    await asyncio.sleep(0.3)
    for i in range(4):
        await producer.send_with_key(f"eu{i}".encode(), None, f"eu-{i}")
        await producer.send_with_key(f"us{i}".encode(), None, f"us-{i}")
    for prefix, queue in queues.items():
        got = await _take(queue, 4)
        assert sorted(m.payload for m in got) == [f"{prefix}{i}".encode() for i in range(4)]
        assert all(m.routing_key.startswith(f"{prefix}-") for m in got)


@pytest.mark.parametrize("created_by", ["admin", "danube"])
async def test_partitioned_topic_danube_and_native_clients(door_broker: tuple[BrokerProcess, str],
                                                           theirs: danube.DanubeClient, created_by: str) -> None:
    """A partitioned topic made by our admin API: Danube's producer (`with_partitions`,
    a producer per `{topic}-part-{i}`) and ours spread messages over the partitions, and
    Danube's consumer (subscribed to every partition the door lists) and ours read them
    all. Made by Danube's producer instead, the partitions are topics of their own (it
    names no partition count): the door lists them by prefix as Danube's broker does,
    and our native client reaches them by their names."""
    from danube_zmq.client.admin import AdminClient

    broker, grpc_url = door_broker
    topic = f"/default/door-parts-{created_by}"
    partitions = [f"{topic}-part-{i}" for i in range(3)]
    if created_by == "admin":
        async with AdminClient(broker.admin_url) as admin:
            await admin.create_topic(topic, partitions=3, dispatch_strategy=1)
    producer = (theirs.new_producer().with_topic(topic).with_name("danube-p").with_partitions(3)
                .with_dispatch_strategy(danube.DispatchStrategy.RELIABLE).build())
    await producer.create()
    assert await theirs.lookup_service.topic_partitions(grpc_url, topic) == partitions
    native_topics = [topic] if created_by == "admin" else partitions
    async with NativeClient(broker.url) as ours:
        native_consumers = [await ours.subscribe(t, "native-sub", sub_type="exclusive") for t in native_topics]
        danube_consumer, queue = await _subscribe(theirs, topic, "danube-sub", "danube-c")
        await asyncio.sleep(0.3)
        for i in range(6):
            await producer.send(f"d{i}".encode())
        for i, native_topic in enumerate(native_topics):
            native_producer = await ours.create_producer(native_topic, name=f"native-p{i}", dispatch="reliable")
            for j in range(3):
                await native_producer.send(f"n{i}-{j}".encode(), key=f"k{j}")
        expected = sorted([f"d{i}".encode() for i in range(6)]
                          + [f"n{i}-{j}".encode() for i in range(len(native_topics)) for j in range(3)])
        got = await _take(queue, len(expected))
        assert sorted(m.payload for m in got) == expected
        # Danube's round robin put two of its messages on each partition.
        assert sorted(m.msg_id.topic_name for m in got if m.producer_name.startswith("danube-p")) == \
            sorted(partitions * 2)
        for message in got:
            await danube_consumer.ack(message)
        each = len(expected) // len(native_consumers)  # admin: one consumer; else 2 + 3 per partition
        async with asyncio.timeout(RECEIVE_TIMEOUT_S):
            read = [await c.receive() for c in native_consumers for _ in range(each)]
        assert sorted(m.payload for m in read) == expected
        await danube_consumer.close()
    await producer.close()


ORDER_V1 = b'{"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"]}'
ORDER_V2 = (b'{"type": "object", "properties": {"id": {"type": "integer"}, "note": {"type": "string"}},'
            b' "required": ["id"]}')


async def test_schema_registered_through_the_door_and_produced_with(door_broker: tuple[BrokerProcess, str],
                                                                    theirs: danube.DanubeClient) -> None:
    """Danube's client registers a schema through the door's SchemaRegistry (our registry:
    our native registry client reads the same ids), checks and lists versions, then
    produces with a schema reference: every message carries the schema id and version,
    for Danube's consumer and ours."""
    from danube_zmq.client.schemas import SchemaRegistryClient as NativeRegistry

    broker, _ = door_broker
    registry = theirs.schema()
    first = await (registry.register_schema("orders").with_type(danube.SchemaType.JSON_SCHEMA)
                   .with_schema_data(ORDER_V1).with_description("v1").execute())
    compatible, reasons = await registry.check_compatibility("orders", ORDER_V2, danube.SchemaType.JSON_SCHEMA)
    assert compatible, reasons
    second = await (registry.register_schema("orders").with_type(danube.SchemaType.JSON_SCHEMA)
                    .with_schema_data(ORDER_V2).execute())
    latest = await registry.get_latest_schema("orders")
    assert (latest.schema_id, latest.version, latest.subject) == (second, 2, "orders")
    assert await registry.list_versions("orders") == [1, 2]
    assert (await registry.get_schema_version(first, 1)).schema_definition_as_string() != ""
    async with NativeRegistry(broker.url) as ours:
        info = await ours.get_schema(subject="orders")
        assert (info.schema_id, info.version, info.fingerprint) == (latest.schema_id, 2, latest.fingerprint)

    topic = "/default/door-schema"
    producer = (theirs.new_producer().with_topic(topic).with_name("p1").with_schema_version("orders", 1)
                .with_dispatch_strategy(danube.DispatchStrategy.RELIABLE).build())
    await producer.create()
    async with NativeClient(broker.url) as native:
        native_consumer = await native.subscribe(topic, "native-sub", sub_type="exclusive")
        consumer, queue = await _subscribe(theirs, topic, "s1", "c1")
        await asyncio.sleep(0.3)
        await producer.send(b'{"id": 7}')
        (got,) = await _take(queue, 1)
        assert (got.payload, got.schema_id, got.schema_version) == (b'{"id": 7}', first, 1)
        async with asyncio.timeout(RECEIVE_TIMEOUT_S):
            read = await native_consumer.receive()
        assert (read.schema_id, read.schema_version, read.value()) == (first, 1, {"id": 7})
        await consumer.close()
    await producer.close()
    assert (await registry.set_compatibility_mode("orders", danube.CompatibilityMode.FULL))[0]
    assert (await registry.delete_schema_version("orders", 2))[0]
    assert await registry.list_versions("orders") == [1]
    async with NativeRegistry(broker.url) as ours:
        assert await ours.get_compatibility("orders") == "full"


async def test_schema_errors_keep_their_codes(theirs: danube.DanubeClient) -> None:
    """A definition that is not a schema is INVALID_ARGUMENT, an unknown subject
    NOT_FOUND, and a producer naming an unknown subject is refused at create
    FAILED_PRECONDITION (the broker's own refusal, passed through)."""
    registry = theirs.schema()
    with pytest.raises(grpc.aio.AioRpcError) as bad:
        await (registry.register_schema("broken").with_type(danube.SchemaType.JSON_SCHEMA)
               .with_schema_data(b"{not json").execute())
    assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.aio.AioRpcError) as missing:
        await registry.get_latest_schema("no-such-subject")
    assert missing.value.code() == grpc.StatusCode.NOT_FOUND
    producer = (theirs.new_producer().with_topic("/default/door-no-schema").with_name("p1")
                .with_schema_subject("no-such-subject").build())
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await producer.create()
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION


async def test_shared_subscription_spreads_over_danube_consumers(theirs: danube.DanubeClient) -> None:
    """Shared through the door: two Danube consumers of one subscription each get a part
    of the messages, and together every one exactly once."""
    topic = "/default/door-shared"
    producer = (theirs.new_producer().with_topic(topic).with_name("p1")
                .with_dispatch_strategy(danube.DispatchStrategy.RELIABLE).build())
    await producer.create()
    consumers = [await _subscribe(theirs, topic, "work", f"c{i}", danube.SubType.SHARED) for i in range(2)]
    await asyncio.sleep(0.3)
    for i in range(20):
        await producer.send(f"m{i}".encode())
    got: list[list[bytes]] = [[], []]
    async with asyncio.timeout(RECEIVE_TIMEOUT_S):
        while sum(map(len, got)) < 20:
            for index, (consumer, queue) in enumerate(consumers):
                while not queue.empty():
                    message = queue.get_nowait()
                    got[index].append(message.payload)
                    await consumer.ack(message)
            await asyncio.sleep(0.02)
    assert all(got), got
    assert sorted(got[0] + got[1]) == sorted(f"m{i}".encode() for i in range(20))
    for consumer, _ in consumers:
        await consumer.close()


async def test_failover_subscription_feeds_one_danube_consumer(door_broker: tuple[BrokerProcess, str],
                                                               theirs: danube.DanubeClient) -> None:
    """Failover through the door: the first consumer is the active one and gets every
    message in order; a standby (Danube's or ours) gets none while it is live."""
    broker, _ = door_broker
    topic = "/default/door-failover"
    producer = (theirs.new_producer().with_topic(topic).with_name("p1")
                .with_dispatch_strategy(danube.DispatchStrategy.RELIABLE).build())
    await producer.create()
    active, active_queue = await _subscribe(theirs, topic, "fo", "c-active", danube.SubType.FAILOVER)
    standby, standby_queue = await _subscribe(theirs, topic, "fo", "c-standby", danube.SubType.FAILOVER)
    async with NativeClient(broker.url) as ours:
        native_standby = await ours.subscribe(topic, "fo", sub_type="failover", consumer_name="native-standby")
        await asyncio.sleep(0.3)
        for i in range(10):
            await producer.send(f"m{i}".encode())
        got = await _take(active_queue, 10)
        assert [m.payload for m in got] == [f"m{i}".encode() for i in range(10)]
        for message in got:
            await active.ack(message)
        await asyncio.sleep(0.3)
        assert standby_queue.empty()
        with pytest.raises(Timeout):
            await native_standby.receive(timeout=0.2)
    await active.close()
    await standby.close()


async def test_unacked_message_is_redelivered_then_dead_lettered(door_broker: tuple[BrokerProcess, str],
                                                                 theirs: danube.DanubeClient) -> None:
    """The subscription's failure policy holds for a Danube consumer: a message it never
    acks comes back after the ack timeout, and once past max_redelivery_count it is
    moved to the dead-letter topic, where another Danube consumer reads it."""
    from danube_zmq.client.admin import AdminClient

    broker, _ = door_broker
    topic, dead_letters = "/default/door-poison", "/default/door-poison-dlq"
    producer = (theirs.new_producer().with_topic(topic).with_name("p1")
                .with_dispatch_strategy(danube.DispatchStrategy.RELIABLE).build())
    await producer.create()
    consumer, queue = await _subscribe(theirs, topic, "s1", "c1")
    async with AdminClient(broker.admin_url) as admin:
        await admin.create_topic(dead_letters, dispatch_strategy=1)
        await admin.set_failure_policy(topic, "s1", max_redelivery_count=1, ack_timeout_ms=300,
                                       base_redelivery_delay_ms=0, max_redelivery_delay_ms=0, backoff="fixed",
                                       poison_policy="dead_letter", dead_letter_topic=dead_letters)
    dlq_consumer, dlq_queue = await _subscribe(theirs, dead_letters, "dlq", "c-dlq")
    await asyncio.sleep(0.3)
    await producer.send(b"poison", {"n": "1"})
    first, again = await _take(queue, 2)  # delivered, then redelivered after the ack timeout; never acked
    assert first.payload == again.payload == b"poison"
    assert first.msg_id.topic_offset == again.msg_id.topic_offset
    (lettered,) = await _take(dlq_queue, 1)
    assert lettered.payload == b"poison"
    await dlq_consumer.ack(lettered)
    await dlq_consumer.close()
    await consumer.close()

"""Danube's own CLI integration tests (v0.15.1), replayed call for call against our doors.

`danube-admin` and `danube-cli` are Rust binaries that cannot be built here (crates.io is
unreachable), so each of their integration tests is replayed with the same RPCs the
binary makes for those command-line arguments:

- `danube-admin/tests/{namespace_lifecycle,topic_lifecycle_*}.rs`: grpcio stubs of
  `DanubeAdmin.proto` on the ADMIN door, each request with exactly the fields
  `danube-admin/src/cli/{namespaces,topics,brokers}.rs` sets (defaults included), each
  call with the binary's 5 s request timeout (`core/config.rs`);
- `danube-cli/tests/{basic_workflow,schema_workflow}.rs`: Danube's Python client
  (`danube-client`, the same RPCs as the Rust client `danube-cli` is built on) on the
  CLIENT door, with the options `danube-cli/src/{produce,consume,schema}.rs` sets. Each
  `danube-cli` run is a process of its own, so each replayed run builds a client of its own.

What a Rust test greps from the binary's output is checked on the response field it was
printed from. One broker with both doors serves the whole module; every test uses names
of its own, as Danube's tests do (`unique_ns`, `unique_topic`, `unique_subject`).
"""

from __future__ import annotations

import asyncio
import json
import random
import string
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import grpc
import pytest

from danube_zmq.transport.danube_proto import DanubeAdmin_pb2 as pb
from danube_zmq.transport.danube_proto import DanubeAdmin_pb2_grpc as pb_grpc
from tests.integration.conftest import BrokerProcess, free_port, start_broker
from tests.integration.doors.grpc import test_grpc_admin_door

danube = pytest.importorskip("danube", reason="danube-client (the test extra) is not installed")

from tests.integration.doors.grpc.test_grpc_door import _subscribe, _take  # noqa: E402  (needs danube-client)

# The admin door's stubs, waiting for the broker's lease (test_grpc_admin_door's fixture),
# here on this module's broker: it asks for `admin_door_broker`, defined below.
stubs = test_grpc_admin_door.stubs

ADMIN_TIMEOUT_S = 5.0  # danube-admin's GrpcClientConfig.request_timeout_ms default
# What danube-cli's produce and consume use when the test names no option.
PRODUCER_NAME = "test_producer"
CONSUMER_NAME = "consumer_pubsub"
INTERVAL_S = 0.5


@pytest.fixture(scope="module")
def doors_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimpleNamespace]:
    """One broker with both gRPC doors, for every replay in this module."""
    client_url, admin_url = f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}"
    process = start_broker(tmp_path_factory.mktemp("replay"), "--grpc-listen", client_url,
                           "--grpc-admin-listen", admin_url)
    yield SimpleNamespace(process=process, client_url=client_url, admin_url=admin_url)
    code = process.stop()
    assert code == 0, f"broker did not stop cleanly (exit {code}):\n{process.log()}"


@pytest.fixture(scope="module")
def admin_door_broker(doors_broker: SimpleNamespace) -> tuple[BrokerProcess, str]:
    return doors_broker.process, doors_broker.admin_url


def _token(rng: random.Random, alphabet: str) -> str:
    return "".join(rng.choice(alphabet) for _ in range(6))


def unique_ns() -> str:
    """Danube's `unique_ns`: `ns-{seconds}-{6 alphanumerics, either case}`."""
    return f"ns-{int(time.time())}-{_token(random.Random(), string.ascii_letters + string.digits)}"


def unique_topic() -> str:
    """Danube's `unique_topic`: `/default/test-{seconds}-{6 lowercase alphanumerics}`."""
    return f"/default/test-{int(time.time())}-{_token(random.Random(), string.ascii_lowercase + string.digits)}"


def unique_subject() -> str:
    """Danube's `unique_subject`: `schema-{seconds}-{6 lowercase alphanumerics}`."""
    return f"schema-{int(time.time())}-{_token(random.Random(), string.ascii_lowercase + string.digits)}"


# ---- danube-admin ----------------------------------------------------------------------

async def _create_ns(stubs: SimpleNamespace, ns: str) -> None:
    """`danube-admin namespaces create NS` (common::create_ns asserts success)."""
    reply = await stubs.namespaces.CreateNamespace(pb.NamespaceRequest(name=ns), timeout=ADMIN_TIMEOUT_S)
    assert reply.success


async def _delete_ns(stubs: SimpleNamespace, ns: str) -> None:
    """`danube-admin namespaces delete NS` (common::delete_ns ignores the outcome; here the
    namespace is empty by then, so it must succeed)."""
    reply = await stubs.namespaces.DeleteNamespace(pb.NamespaceRequest(name=ns), timeout=ADMIN_TIMEOUT_S)
    assert reply.success


async def _list_names(stubs: SimpleNamespace, ns: str) -> list[str]:
    """`danube-admin topics list --namespace NS --output json`: the JSON array's `name`s."""
    reply = await stubs.topics.ListNamespaceTopics(pb.NamespaceRequest(name=ns), timeout=ADMIN_TIMEOUT_S)
    return [t.name for t in reply.topics]


async def test_namespace_lifecycle_creates_and_deletes(stubs: SimpleNamespace) -> None:
    """Replays danube-admin/tests/namespace_lifecycle.rs `namespace_lifecycle_creates_and_deletes`:
    `namespaces create NS`, then `brokers namespaces --output json` whose stdout contains
    NS (the ListNamespaces answer names it), then `namespaces delete NS`."""
    ns = unique_ns()
    await _create_ns(stubs, ns)
    listed = await stubs.brokers.ListNamespaces(pb.Empty(), timeout=ADMIN_TIMEOUT_S)
    assert ns in listed.namespaces
    await _delete_ns(stubs, ns)
    assert ns not in (await stubs.brokers.ListNamespaces(pb.Empty(), timeout=ADMIN_TIMEOUT_S)).namespaces


async def test_topic_lifecycle_non_partitioned(stubs: SimpleNamespace) -> None:
    """Replays danube-admin/tests/topic_lifecycle_non_partitioned.rs `topic_lifecycle_non_partitioned`:
    `topics create /NS/cli-e2e --dispatch-strategy non_reliable` (CreateTopic, no
    schema_subject), `topics list --namespace NS --output json` names `/NS/cli-e2e`,
    `topics describe ... --output json` succeeds (its JSON always has a "schema_id" key),
    `topics subscriptions ... --output json` succeeds, `topics delete` and the listing no
    longer names it."""
    ns = unique_ns()
    topic = f"/{ns}/cli-e2e"
    await _create_ns(stubs, ns)

    created = await stubs.topics.CreateTopic(pb.NewTopicRequest(name=topic, dispatch_strategy=pb.NonReliable),
                                             timeout=ADMIN_TIMEOUT_S)
    assert created.success
    assert topic in await _list_names(stubs, ns)

    described = await stubs.topics.DescribeTopic(pb.DescribeTopicRequest(name=topic), timeout=ADMIN_TIMEOUT_S)
    assert (described.name, described.delivery) == (topic, "NonReliable")
    subscriptions = await stubs.topics.ListSubscriptions(pb.TopicRequest(name=topic), timeout=ADMIN_TIMEOUT_S)
    assert list(subscriptions.subscriptions) == []

    deleted = await stubs.topics.DeleteTopic(pb.TopicRequest(name=topic), timeout=ADMIN_TIMEOUT_S)
    assert deleted.success
    assert topic not in await _list_names(stubs, ns)
    await _delete_ns(stubs, ns)


async def test_topic_lifecycle_partitioned(stubs: SimpleNamespace) -> None:
    """Replays danube-admin/tests/topic_lifecycle_partitioned.rs `topic_lifecycle_partitioned`:
    `topics create /NS/cli-e2e-p --partitions 2 --dispatch-strategy reliable`
    (CreatePartitionedTopic), the listing names `-part-0` and `-part-1`, `topics
    subscriptions` on `-part-0` succeeds, `topics delete` of `-part-0` fails with
    "Cannot delete individual partition" in the error the binary prints, `topics delete`
    of the base name succeeds and the listing names neither partition."""
    ns = unique_ns()
    base = f"/{ns}/cli-e2e-p"
    part0, part1 = f"{base}-part-0", f"{base}-part-1"
    await _create_ns(stubs, ns)

    created = await stubs.topics.CreatePartitionedTopic(
        pb.PartitionedTopicRequest(base_name=base, partitions=2, dispatch_strategy=pb.Reliable),
        timeout=ADMIN_TIMEOUT_S)
    assert created.success
    names = await _list_names(stubs, ns)
    assert part0 in names and part1 in names, names

    await stubs.topics.ListSubscriptions(pb.TopicRequest(name=part0), timeout=ADMIN_TIMEOUT_S)

    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await stubs.topics.DeleteTopic(pb.TopicRequest(name=part0), timeout=ADMIN_TIMEOUT_S)
    assert "Cannot delete individual partition" in (refused.value.details() or ""), refused.value
    # Refused means untouched: the partition is still there.
    assert part0 in await _list_names(stubs, ns)

    deleted = await stubs.topics.DeleteTopic(pb.TopicRequest(name=base), timeout=ADMIN_TIMEOUT_S)
    assert deleted.success
    names = await _list_names(stubs, ns)
    assert part0 not in names and part1 not in names, names
    await _delete_ns(stubs, ns)


# ---- danube-cli ------------------------------------------------------------------------

async def _cli_client(doors_broker: SimpleNamespace) -> Any:
    """What every `danube-cli ... -s URL` run starts with: a client of its own."""
    return await danube.DanubeClientBuilder().service_url(doors_broker.client_url).build()


async def _cli_produce(doors_broker: SimpleNamespace, topic: str, message: bytes, count: int = 1, *,
                       interval_s: float = INTERVAL_S, attributes: dict[str, str] | None = None,
                       reliable: bool = False, schema_subject: str | None = None) -> int:
    """`danube-cli produce -s URL -t TOPIC -m MESSAGE [-c N] [-i MS] [-a ...] [--reliable]
    [--schema-subject S]` (produce.rs): producer `test_producer`, reliable dispatch only
    with `--reliable`, the subject's latest version; sends MESSAGE N times, `interval`
    apart, and returns its "Success: N" count (the sends that returned an id)."""
    client = await _cli_client(doors_broker)
    builder = client.new_producer().with_topic(topic).with_name(PRODUCER_NAME)
    if schema_subject is not None:
        builder = builder.with_schema_subject(schema_subject)
    if reliable:
        builder = builder.with_dispatch_strategy(danube.DispatchStrategy.RELIABLE)
    producer = builder.build()
    await producer.create()
    success = 0
    for i in range(count):
        await producer.send(message, attributes)  # a failed send raises: the test fails here, naming it
        success += 1
        if i < count - 1:
            await asyncio.sleep(interval_s)
    await producer.close()
    return success


def _printed_as(messages: list[Any]) -> list[tuple[str, bytes]]:
    """How danube-cli's consume prints each message (consume.rs `print_to_console`):
    ("plain", payload) as `Received message: ...`, or ("reliable", payload) as `Received
    reliable message: "..."` when its topic_offset is above the last one printed (0 at
    start). Danube's non-reliable messages carry topic_offset 0, so they print plain."""
    printed, last_offset = [], 0
    for message in messages:
        printed.append(("reliable" if message.msg_id.topic_offset > last_offset else "plain", message.payload))
        last_offset = message.msg_id.topic_offset
    return printed




async def _cli_consume(doors_broker: SimpleNamespace, topic: str, subscription: str,
                       sub_type: Any = None) -> tuple[Any, Any, asyncio.Queue]:
    """`danube-cli consume -s URL -t TOPIC -m SUB [--sub-type T]` (consume.rs): consumer
    `consumer_pubsub`, Shared unless `--sub-type` says otherwise."""
    client = await _cli_client(doors_broker)
    consumer, queue = await _subscribe(client, topic, subscription, CONSUMER_NAME,
                                       sub_type or danube.SubType.SHARED)
    return client, consumer, queue


async def _consumed(consumer: Any, queue: asyncio.Queue, count: int) -> list[Any]:
    """What the backgrounded consume run prints before the test kills it: each message,
    acked as consume.rs acks it. The Rust test sleeps 2 s; this waits for `count`."""
    got = await _take(queue, count)
    for message in got:
        await consumer.ack(message)
    await consumer.close()  # the Rust test kills the process
    return got


async def test_produce_and_consume_messages(doors_broker: SimpleNamespace) -> None:
    """Replays danube-cli/tests/basic_workflow.rs `produce_and_consume_messages`: `produce -m
    "Init message" -c 1` makes the topic (non-reliable), `consume -m test-subscription`
    (Shared) starts, `produce -m "Hello from integration test" -c 5 -i 100` prints
    "Success: 5", and the consumer prints "Received message: Hello from integration
    test" and "Total received:" (which it prints with every message). All five arrive,
    each printed plain: topic offset 0, as Danube's non-reliable messages carry."""
    topic = unique_topic()
    assert await _cli_produce(doors_broker, topic, b"Init message") == 1
    _, consumer, queue = await _cli_consume(doors_broker, topic, "test-subscription")
    await asyncio.sleep(0.5)
    hello = b"Hello from integration test"
    assert await _cli_produce(doors_broker, topic, hello, 5, interval_s=0.1) == 5
    got = await _consumed(consumer, queue, 5)
    assert [m.payload for m in got] == [hello] * 5
    assert _printed_as(got) == [("plain", hello)] * 5


async def test_produce_with_attributes_and_reliable(doors_broker: SimpleNamespace) -> None:
    """Replays danube-cli/tests/basic_workflow.rs `produce_with_attributes_and_reliable`:
    `produce -m "Message with metadata" -a priority:high,source:test --reliable -c 3`
    prints "Success: 3". Also checked, beyond the Rust test: the topic it made is
    reliable and a consumer from its start reads the three with their attributes."""
    topic = unique_topic()
    attributes = {"priority": "high", "source": "test"}
    message = b"Message with metadata"
    assert await _cli_produce(doors_broker, topic, message, 3, attributes=attributes, reliable=True) == 3
    async with grpc.aio.insecure_channel(doors_broker.admin_url.removeprefix("http://")) as channel:
        described = await pb_grpc.TopicAdminStub(channel).DescribeTopic(pb.DescribeTopicRequest(name=topic))
    assert described.delivery == "Reliable"


async def test_subscription_types(doors_broker: SimpleNamespace) -> None:
    """Replays danube-cli/tests/basic_workflow.rs `subscription_types`: after `produce -m
    "Init message"`, a `consume -m exclusive-sub --sub-type exclusive` run prints
    "Received message: Test message" for `produce -m "Test message" -c 3`, then (the
    exclusive run killed) a `consume -m shared-sub --sub-type shared` run under the same
    consumer name prints "Received message: Shared test message" for `produce -m "Shared
    test message" -c 3`. All arrive, each printed plain."""
    topic = unique_topic()
    assert await _cli_produce(doors_broker, topic, b"Init message") == 1
    for subscription, sub_type, message in (("exclusive-sub", danube.SubType.EXCLUSIVE, b"Test message"),
                                            ("shared-sub", danube.SubType.SHARED, b"Shared test message")):
        _, consumer, queue = await _cli_consume(doors_broker, topic, subscription, sub_type)
        await asyncio.sleep(0.5)
        assert await _cli_produce(doors_broker, topic, message, 3) == 3
        got = await _consumed(consumer, queue, 3)
        assert [m.payload for m in got] == [message] * 3
        assert _printed_as(got) == [("plain", message)] * 3


async def _cli_schema_register(doors_broker: SimpleNamespace, subject: str, definition: str) -> int:
    """`danube-cli schema register SUBJECT --schema-type json_schema --file F` (schema.rs
    handle_register): the id it prints after "Schema registered successfully"."""
    client = await _cli_client(doors_broker)
    schema_id = await (client.schema().register_schema(subject).with_type(danube.SchemaType.JSON_SCHEMA)
                       .with_schema_data(definition.encode()).execute())
    assert schema_id > 0
    return schema_id


async def _cli_schema_versions(doors_broker: SimpleNamespace, subject: str) -> list[int]:
    """`danube-cli schema versions SUBJECT`: prints `• vN` for each version."""
    return await (await _cli_client(doors_broker)).schema().list_versions(subject)


async def test_schema_register_and_produce_consume(doors_broker: SimpleNamespace) -> None:
    """Replays danube-cli/tests/schema_workflow.rs `schema_register_and_produce_consume`:
    `schema register S --schema-type json_schema --file F`, `schema get S --output json`
    (GetLatestSchema: subject S, schema_type "json_schema", schema_id > 0), `schema
    versions S` prints v1, `produce --schema-subject S` 1 then 3 messages to /default/S
    with `consume -m schema-test-sub` running; the consumer fetches each message's
    schema by its schema_id (consume.rs) and prints the JSON with "user_123" and
    "login"."""
    subject = unique_subject()
    topic = f"/default/{subject}"
    definition = json.dumps({"type": "object",
                             "properties": {"user_id": {"type": "string"}, "action": {"type": "string"},
                                            "timestamp": {"type": "integer"}},
                             "required": ["user_id", "action"]}, indent=2)
    schema_id = await _cli_schema_register(doors_broker, subject, definition)

    latest = await (await _cli_client(doors_broker)).schema().get_latest_schema(subject)
    assert (latest.subject, latest.schema_type, latest.schema_id) == (subject, "json_schema", schema_id)
    assert 1 in await _cli_schema_versions(doors_broker, subject)

    message = b'{"user_id":"user_123","action":"login","timestamp":1234567890}'
    assert await _cli_produce(doors_broker, topic, message, schema_subject=subject) == 1
    client, consumer, queue = await _cli_consume(doors_broker, topic, "schema-test-sub")
    await asyncio.sleep(0.5)
    assert await _cli_produce(doors_broker, topic, message, 3, schema_subject=subject) == 3
    got = await _consumed(consumer, queue, 3)
    for received in got:
        # consume.rs: a message with a schema_id has its schema fetched; a json_schema one
        # is parsed as JSON (a payload that is not JSON is an error, not printed).
        assert received.schema_id == schema_id
        info = await client.schema().get_schema_by_id(received.schema_id)
        assert (info.subject, info.schema_type) == (subject, "json_schema")
        printed = json.loads(received.payload)
        assert (printed["user_id"], printed["action"]) == ("user_123", "login")


async def test_schema_compatibility_check(doors_broker: SimpleNamespace) -> None:
    """Replays danube-cli/tests/schema_workflow.rs `schema_compatibility_check`: register
    v1, `schema check S --schema-type json_schema --file v2` (v2 adds an optional
    property) prints "COMPATIBLE", register v2, `schema versions S` prints v1 and v2.
    The Rust grep for "COMPATIBLE" would also match "NOT COMPATIBLE"; checked here is
    what the test means: is_compatible."""
    subject = unique_subject()
    v1 = {"type": "object", "properties": {"user_id": {"type": "string"}}, "required": ["user_id"]}
    v2 = {"type": "object", "properties": {"user_id": {"type": "string"}, "email": {"type": "string"}},
          "required": ["user_id"]}
    await _cli_schema_register(doors_broker, subject, json.dumps(v1, indent=2))
    client = await _cli_client(doors_broker)
    is_compatible, errors = await client.schema().check_compatibility(
        subject, json.dumps(v2, indent=2).encode(), danube.SchemaType.JSON_SCHEMA, None)
    assert is_compatible, errors
    await _cli_schema_register(doors_broker, subject, json.dumps(v2, indent=2))
    versions = await _cli_schema_versions(doors_broker, subject)
    assert 1 in versions and 2 in versions, versions


async def test_auto_register_schema(doors_broker: SimpleNamespace) -> None:
    """Replays danube-cli/tests/schema_workflow.rs `auto_register_schema`: `produce -t
    /default/S --schema-file F --schema-type json_schema -m MSG` registers the schema
    under the subject made from the topic (`default-S`; "Schema registered with ID"),
    then produces with that subject; `schema get default-S` prints the subject."""
    subject = unique_subject()
    topic = f"/default/{subject}"
    definition = json.dumps({"type": "object",
                             "properties": {"event": {"type": "string"}, "data": {"type": "string"}}}, indent=2)
    derived = topic.lstrip("/").replace("/", "-")
    await _cli_schema_register(doors_broker, derived, definition)
    message = b'{"event":"test","data":"auto-registered"}'
    assert await _cli_produce(doors_broker, topic, message, schema_subject=derived) == 1
    latest = await (await _cli_client(doors_broker)).schema().get_latest_schema(derived)
    assert latest.subject == derived

"""Schemas at produce time, through a real broker: topic binding by the first producer,
version selection, validation policies, payload validation, client serializers, and
consumers decoding across an evolution (reader schemas included), on both dispatch
strategies and across a restart."""

from __future__ import annotations

import asyncio
import json

import pytest

from danube_zmq import DanubeClient, SubType
from danube_zmq.client.admin import AdminClient
from danube_zmq.client.schemas import SchemaRegistryClient
from danube_zmq.transport.errors import FailedPrecondition, InvalidArgument, NotFound
from tests.integration.actors.test_subscriptions import drain

ORDER_V1 = {"type": "object", "properties": {"id": {"type": "integer"}, "sku": {"type": "string"}},
            "required": ["id", "sku"]}
ORDER_V2 = {**ORDER_V1, "properties": {**ORDER_V1["properties"], "note": {"type": "string"}}}
PAYMENT_V1 = {"type": "record", "name": "Payment", "namespace": "shop",
              "fields": [{"name": "id", "type": "long"}, {"name": "amount", "type": "double"}]}
PAYMENT_V2 = {**PAYMENT_V1, "fields": [*PAYMENT_V1["fields"],
                                       {"name": "currency", "type": "string", "default": "EUR"}]}


async def register(url: str, subject: str, kind: str, schema: object) -> int:
    async with SchemaRegistryClient(url) as registry:
        done = await registry.register(subject, kind, json.dumps(schema).encode())
        return done.version


async def test_payload_validation_rejects_an_invalid_payload_naming_the_field(broker) -> None:
    await register(broker.url, "orders", "json_schema", ORDER_V1)
    async with AdminClient(broker.admin_url) as admin:
        await admin.configure_topic_schema("/default/orders", "orders", validation_policy="enforce",
                                           payload_validation=True)
    async with DanubeClient(broker.url) as client:
        producer = await client.create_producer("/default/orders", schema_subject="orders", batching=False)
        consumer = await client.subscribe("/default/orders", "audit", sub_type=SubType.EXCLUSIVE)
        await producer.send({"id": 1, "sku": "apple"})
        # The client's serializer checks values first ...
        with pytest.raises(InvalidArgument, match="sku"):
            await producer.send({"id": 2})
        # ... and the broker checks what reaches it (bytes are sent as they are).
        with pytest.raises(InvalidArgument, match=r"\$\.id.*does not match schema 'orders' version 1|"
                                                  r"does not match schema 'orders' version 1.*\$\.id"):
            await producer.send(b'{"id": "two", "sku": "pear"}')
        with pytest.raises(InvalidArgument, match="not valid JSON"):
            await producer.send(b"{not json")
        # A producer without the topic's schema may attach, but enforce refuses its messages.
        plain = await client.create_producer("/default/orders", batching=False)
        with pytest.raises(FailedPrecondition, match="enforces schema subject 'orders'"):
            await plain.send(b'{"id": 3, "sku": "plum"}')
        await producer.send({"id": 4, "sku": "kiwi"})
        got = await drain(consumer, 2)
        assert [m.value() for m in got] == [{"id": 1, "sku": "apple"}, {"id": 4, "sku": "kiwi"}]
        assert {(m.schema_id, m.schema_version) for m in got} == {(got[0].schema_id, 1)}
        with pytest.raises(asyncio.TimeoutError):  # nothing refused was stored
            await asyncio.wait_for(consumer.receive(), 0.3)


async def test_warn_accepts_messages_without_the_schema(broker) -> None:
    await register(broker.url, "events", "json_schema", ORDER_V1)
    async with AdminClient(broker.admin_url) as admin:
        await admin.configure_topic_schema("/default/events", "events", validation_policy="warn")
    async with DanubeClient(broker.url) as client:
        plain = await client.create_producer("/default/events", batching=False)
        consumer = await client.subscribe("/default/events", "s", sub_type=SubType.EXCLUSIVE)
        await plain.send(b"not even json")  # warn: accepted (counted, logged)
        typed = await client.create_producer("/default/events", schema_subject="events", batching=False)
        await typed.send(b'{"id": "wrong"}')  # no payload validation: the broker stores what it gets
        got = await drain(consumer, 2)
        assert got[0].value() == b"not even json" and got[0].schema_id is None
        assert got[1].schema_version == 1
        with pytest.raises(InvalidArgument, match="writer's schema"):
            got[1].value()  # the consumer's decoder notices
        assert got[1].payload == b'{"id": "wrong"}'


async def test_version_selection_pin_min_latest_invalid(broker) -> None:
    await register(broker.url, "payments", "avro", PAYMENT_V1)
    await register(broker.url, "payments", "avro", PAYMENT_V2)
    async with DanubeClient(broker.url) as client:
        pinned = await client.create_producer("/default/pay", schema_subject="payments", schema_version=1)
        assert pinned.schema is not None and pinned.schema.version == 1
        at_least = await client.create_producer("/default/pay", schema_subject="payments", schema_min_version=2)
        latest = await client.create_producer("/default/pay", schema_subject="payments")
        assert (at_least.schema.version, latest.schema.version) == (2, 2)
        with pytest.raises(NotFound, match="no version 5"):
            await client.create_producer("/default/pay", schema_subject="payments", schema_version=5)
        with pytest.raises(NotFound, match="no version >= 3"):
            await client.create_producer("/default/pay", schema_subject="payments", schema_min_version=3)
        with pytest.raises(FailedPrecondition, match="not registered"):
            await client.create_producer("/default/other", schema_subject="nobody")
        with pytest.raises(InvalidArgument, match="not both"):
            await client.create_producer("/default/pay", schema_subject="payments", schema_version=1,
                                         schema_min_version=1)


async def test_second_producer_with_another_subject_fails(broker) -> None:
    await register(broker.url, "a-subject", "string", "")
    await register(broker.url, "b-subject", "string", "")
    async with DanubeClient(broker.url) as client:
        await client.create_producer("/default/bound", partitions=2, schema_subject="a-subject")
        with pytest.raises(FailedPrecondition, match="bound to schema subject 'a-subject'"):
            await client.create_producer("/default/bound", schema_subject="b-subject")
        await client.create_producer("/default/bound")  # producers without a schema still attach
    async with AdminClient(broker.admin_url) as admin:
        info = await admin.get_topic_schema_config("/default/bound")
        assert (info.subject, info.validation_policy) == ("a-subject", "warn")


@pytest.mark.parametrize("dispatch", ["non_reliable", "reliable"])
async def test_consumer_decodes_across_an_evolution(broker, dispatch: str) -> None:
    await register(broker.url, "payments", "avro", PAYMENT_V1)
    await register(broker.url, "payments", "avro", PAYMENT_V2)
    topic = f"/default/payments-{dispatch.replace('_', '-')}"
    async with DanubeClient(broker.url) as client:
        old = await client.create_producer(topic, dispatch=dispatch, schema_subject="payments", schema_version=1)
        new = await client.create_producer(topic, dispatch=dispatch, schema_subject="payments")
        plain = await client.subscribe(topic, "plain", sub_type=SubType.EXCLUSIVE)
        reader = await client.subscribe(topic, "reader", sub_type=SubType.EXCLUSIVE,
                                        reader_schema=json.dumps(PAYMENT_V2))
        await old.send({"id": 1, "amount": 9.5})
        await new.send({"id": 2, "amount": 3.0, "currency": "USD"})
        by_writer = await drain(plain, 2)
        assert [m.value() for m in by_writer] == [{"id": 1, "amount": 9.5},
                                                  {"id": 2, "amount": 3.0, "currency": "USD"}]
        assert [m.schema_version for m in by_writer] == [1, 2]
        resolved = await drain(reader, 2)
        assert [m.value() for m in resolved] == [{"id": 1, "amount": 9.5, "currency": "EUR"},
                                                 {"id": 2, "amount": 3.0, "currency": "USD"}]
        assert client.schemas.fetches == 2  # one fetch per version, shared by producers and consumers


async def test_schema_ids_survive_a_restart_of_a_reliable_topic(broker_factory) -> None:
    broker = broker_factory()
    await register(broker.url, "orders", "json_schema", ORDER_V1)
    async with DanubeClient(broker.url) as client:
        producer = await client.create_producer("/default/kept", dispatch="reliable", schema_subject="orders")
        await client.subscribe("/default/kept", "s", sub_type=SubType.EXCLUSIVE)
        await producer.send({"id": 7, "sku": "fig"})
    assert broker.stop() == 0
    broker = broker_factory(url=broker.url, admin_url=broker.admin_url)
    async with DanubeClient(broker.url) as client:
        consumer = await client.subscribe("/default/kept", "s", sub_type=SubType.EXCLUSIVE)
        [msg] = await drain(consumer, 1)
        assert msg.value() == {"id": 7, "sku": "fig"} and msg.schema_version == 1


async def test_a_binding_configured_later_reaches_attached_producers(broker) -> None:
    await register(broker.url, "orders", "json_schema", ORDER_V1)
    async with DanubeClient(broker.url) as client:
        plain = await client.create_producer("/default/late", batching=False)
        typed = await client.create_producer("/default/late", schema_subject="orders", batching=False)
        await plain.send(b"anything")
        async with AdminClient(broker.admin_url) as admin:
            await admin.configure_topic_schema("/default/late", "orders", validation_policy="enforce",
                                               payload_validation=True)
        # The watch of bindings tells the topic: no producer has to re-attach.
        deadline = asyncio.get_running_loop().time() + 5
        while True:
            try:
                await plain.send(b"anything")
            except FailedPrecondition:
                break
            assert asyncio.get_running_loop().time() < deadline, "the new policy never reached the topic"
            await asyncio.sleep(0.05)
        with pytest.raises(InvalidArgument, match="does not match schema 'orders'"):
            await typed.send(b'{"id": 1}')
        await typed.send({"id": 1, "sku": "ok"})


SHIPMENT_PROTO = 'syntax = "proto3";\npackage ops;\nmessage Shipment { string id = 1; int32 boxes = 2; }\n'


@pytest.mark.parametrize(("kind", "definition", "value", "invalid"), [
    ("protobuf", SHIPMENT_PROTO, {"id": "s-1", "boxes": 3}, b"\x12\x05"),
    ("number", "float64", 2.5, b"\x00\x01"),
    ("string", "", "grüße", b"\xff\xfe"),
    ("bytes", "", b"\x00raw", None),
])
async def test_client_serializers_for_every_type(broker, kind: str, definition: str, value: object,
                                                 invalid: bytes | None) -> None:
    """`send(value)` encodes by the subject's type, the broker validates payloads of that
    type, and `value()` gives the value back."""
    async with SchemaRegistryClient(broker.url) as registry:
        await registry.register(f"typed-{kind}", kind, definition.encode())
    topic = f"/default/typed-{kind}"
    async with AdminClient(broker.admin_url) as admin:
        await admin.configure_topic_schema(topic, f"typed-{kind}", validation_policy="enforce", payload_validation=True)
    async with DanubeClient(broker.url) as client:
        producer = await client.create_producer(topic, schema_subject=f"typed-{kind}", batching=False)
        consumer = await client.subscribe(topic, "s", sub_type=SubType.EXCLUSIVE)
        await producer.send(value)
        if invalid is not None:
            with pytest.raises(InvalidArgument, match=f"does not match schema 'typed-{kind}' version 1"):
                await producer.send(invalid)
        [msg] = await drain(consumer, 1)
        assert msg.value() == value

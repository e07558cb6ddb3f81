"""Hostile schemas through a real broker (issue 37, items 1 and 4): a pattern that
backtracks, a schema bomb and a payload nesting a recursive Avro schema deep are each
refused with a clear error, and the broker keeps answering another client meanwhile."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable

import pytest

from danube_zmq import DanubeClient
from danube_zmq.client.admin import AdminClient
from danube_zmq.client.schemas import SchemaRegistryClient
from danube_zmq.transport.errors import InvalidArgument

# One broker for the module (tests/integration/conftest.py): each test has topics of its own.
SHARED_BROKER = True

BOUND_S = 5.0  # what "keeps answering" means here; the unfixed broker stalled for minutes


async def bind(url: str, admin_url: str, topic: str, subject: str, kind: str, schema: object) -> None:
    async with SchemaRegistryClient(url) as registry:
        await registry.register(subject, kind, json.dumps(schema).encode())
    async with AdminClient(admin_url) as admin:
        await admin.configure_topic_schema(topic, subject, validation_policy="enforce", payload_validation=True)


async def refused_while_others_are_answered(url: str, attack: Awaitable[object], match: str) -> None:
    """Run `attack`, and meanwhile a second client's lookup and produce on another topic."""
    started = time.monotonic()
    task = asyncio.ensure_future(attack)
    await asyncio.sleep(0.2)
    async with DanubeClient(url) as other:
        producer = await asyncio.wait_for(other.create_producer("/default/bystander", batching=False), BOUND_S)
        await asyncio.wait_for(producer.send(b"still here"), BOUND_S)
        await asyncio.wait_for(other.lookup("/default/bystander"), BOUND_S)
    with pytest.raises(InvalidArgument, match=match):
        await asyncio.wait_for(task, BOUND_S)
    assert time.monotonic() - started < 2 * BOUND_S


async def test_a_backtracking_pattern_does_not_freeze_the_broker(broker) -> None:
    schema = {"type": "object", "properties": {"name": {"type": "string", "pattern": "^(a+)+$"}}}
    await bind(broker.url, broker.admin_url, "/default/names", "names", "json_schema", schema)
    async with DanubeClient(broker.url) as client:
        producer = await client.create_producer("/default/names", schema_subject="names", batching=False)
        await producer.send(b'{"name": "aaaa"}')
        # 30 a's: about 70 s of backtracking in Python's re (doubling per character).
        evil = json.dumps({"name": "a" * 30 + "!"}).encode()
        await refused_while_others_are_answered(
            broker.url, producer.send(evil), r"the message does not match schema 'names' version 1: payload invalid"
                                             r" at \$\.name: .* does not match \"\^\(a\+\)\+\$\"")


async def test_a_schema_bomb_is_refused_before_it_is_compiled(broker) -> None:
    # ~4 MB of patterned properties: the unfixed broker compiled it on its event loop for
    # tens of seconds, then the store refused it for its size.
    bomb = {"type": "object",
            "patternProperties": {f"^p{i}_[a-z]+$": {"type": "string", "pattern": f"^v{i}[0-9]*$"}
                                  for i in range(60_000)}}
    definition = json.dumps(bomb).encode()

    async def register() -> object:
        async with SchemaRegistryClient(broker.url) as registry:
            return await registry.register("bomb", "json_schema", definition)

    await refused_while_others_are_answered(
        broker.url, register(), rf"schema definition is {len(definition)} bytes, over the broker's limit of 262144"
                                r" \(limits.schema_definition_bytes_max\)")


async def test_a_payload_nesting_a_recursive_avro_schema_deep_is_refused(broker) -> None:
    node = {"type": "record", "name": "Node", "fields": [{"name": "next", "type": ["null", "Node"]}]}
    await bind(broker.url, broker.admin_url, "/default/lists", "lists", "avro", node)
    async with DanubeClient(broker.url) as client:
        producer = await client.create_producer("/default/lists", schema_subject="lists", batching=False)
        await producer.send(b"\x02\x02\x00")
        # 100 KB: fastavro's compiled reader overflowed the C stack and the broker died.
        await refused_while_others_are_answered(
            broker.url, producer.send(b"\x02" * 100_000 + b"\x00"), "nests deeper than the broker decodes")

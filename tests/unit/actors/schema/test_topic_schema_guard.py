"""The produce-time checks of a topic bound to a schema subject (`actors.topic_schema`),
the topic actor's handling of binding states by revision, and the client's schema
cache: the parts that need no broker process."""

from __future__ import annotations

import asyncio
import json

import pytest

from danube_zmq.actors.ids import IdSource
from danube_zmq.actors.schema.topic_schema import TopicSchemaGuard
from danube_zmq.actors.topic import make_topic
from danube_zmq.actors.topic.shell import _Producer
from danube_zmq.cli.produce import schema_value
from danube_zmq.client.client import _check_schema_choice
from danube_zmq.client.schema_cache import SchemaCache
from danube_zmq.config.broker_config import BrokerConfig
from danube_zmq.schemas.types import SchemaType
from danube_zmq.transport import client_protocol as cp
from danube_zmq.transport.errors import FailedPrecondition, InvalidArgument, NotFound
from danube_zmq.transport.internal_protocol import SchemaVersionRef, TopicSchemaState

ORDER = json.dumps({"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"]}).encode()
ORDER_V1 = SchemaVersionRef(schema_id=7, version=1, schema_type="json_schema", definition=ORDER)


def state(policy: str, payload_validation: bool = False, *, schema_id: int = 7, revision: int = 1) -> TopicSchemaState:
    return TopicSchemaState(subject="orders", schema_id=schema_id, validation_policy=policy,
                            payload_validation=payload_validation, revision=revision)


def test_none_checks_nothing_and_is_inactive() -> None:
    guard = TopicSchemaGuard("/default/t", state("none"))
    assert not guard.active
    guard.check(None, None, [b"anything"])
    guard.check(99, 1, [b"anything"])


def test_warn_counts_batches_without_the_schema() -> None:
    guard = TopicSchemaGuard("/default/t", state("warn"))
    guard.check(None, None, [b"a", b"b"])
    guard.check(99, 1, [b"c"])
    guard.check(7, 1, [b"not checked without payload validation"])
    assert guard.mismatched_batches == 2


def test_enforce_refuses_batches_without_the_schema() -> None:
    guard = TopicSchemaGuard("/default/t", state("enforce"))
    with pytest.raises(FailedPrecondition, match=r"enforces schema subject 'orders'.*writes no schema"):
        guard.check(None, None, [b"x"])
    with pytest.raises(FailedPrecondition, match="writes schema id 99"):
        guard.check(99, 1, [b"x"])
    guard.check(7, 1, [b"x"])


@pytest.mark.parametrize("policy", ["none", "warn", "enforce"])
def test_payload_validation_names_the_message_and_field_whatever_the_policy(policy: str) -> None:
    guard = TopicSchemaGuard("/default/t", state(policy, True))
    guard.learn(ORDER_V1)
    guard.check(7, 1, [b'{"id": 1}', b'{"id": 2}'])
    with pytest.raises(InvalidArgument, match=r"message 1 of the batch does not match schema 'orders' version 1: .*\$\.id"):
        guard.check(7, 1, [b'{"id": 1}', b'{"id": "x"}'])
    with pytest.raises(InvalidArgument, match=r'^the message .*"id" is a required property'):
        guard.check(7, 1, [b"{}"])
    with pytest.raises(InvalidArgument, match="version 2 is not known"):
        guard.check(7, 2, [b'{"id": 1}'])


def test_versions_of_another_subject_are_not_learned_and_updates_keep_versions() -> None:
    guard = TopicSchemaGuard("/default/t", state("warn", True))
    guard.learn(SchemaVersionRef(schema_id=8, version=1, schema_type="string", definition=b""))
    assert guard.versions == {}
    guard.learn(ORDER_V1)
    guard.update(state("enforce", True, revision=2))
    assert guard.policy == "enforce" and set(guard.versions) == {1}


def test_topic_keeps_the_newest_binding_and_checks_sends() -> None:
    topic = make_topic(name="/default/t", dispatch_strategy=0, config=BrokerConfig(), rng=IdSource(1),
                       broker_endpoint="")
    producer = _Producer(1, "p", b"id", schema=ORDER_V1)
    topic.producers[1] = producer
    topic._apply_schema_state(state("enforce", True, revision=5), 5)
    assert topic.schema_guard is not None and set(topic.schema_guard.versions) == {1}  # learned from producers
    topic._apply_schema_state(None, 0)  # an older read (no binding seen yet) does not win
    assert topic.schema_guard is not None and topic._schema_check is topic.schema_guard
    send = cp.Send(request_id=1, producer_id=1, payloads=[b'{"id": "x"}'], publish_times=[0])
    with pytest.raises(InvalidArgument, match=r"\$\.id"):
        topic.schema_of(producer, send)
    ok = cp.Send(request_id=1, producer_id=1, payloads=[b'{"id": 3}'], publish_times=[0], schema_id=7, schema_version=1)
    assert topic.schema_of(producer, ok) == (7, 1)
    with pytest.raises(InvalidArgument, match="this batch says schema id 7 version 2"):
        topic.schema_of(producer, cp.Send(request_id=1, producer_id=1, payloads=[b"{}"], publish_times=[0],
                                           schema_id=7, schema_version=2))
    topic._apply_schema_state(state("none", revision=6), 6)
    assert topic._schema_check is None  # nothing to check: the send path skips the guard
    topic._apply_schema_state(None, 7)
    assert topic.schema_guard is None


def test_client_schema_choices_are_checked_before_any_round_trip() -> None:
    _check_schema_choice("orders", 1, None)
    for args, match in [((None, 1, None), "need a schema_subject"), (("orders", 1, 2), "not both"),
                        (("orders", 0, None), "schema_version must be an int >= 1"), (("", None, None), "non-empty")]:
        with pytest.raises(InvalidArgument, match=match):
            _check_schema_choice(*args)


def test_cli_reads_message_text_by_schema_type() -> None:
    assert schema_value(SchemaType.JSON_SCHEMA, b'{"id": 1}') == {"id": 1}
    assert schema_value(SchemaType.NUMBER, b"42") == 42 and schema_value(SchemaType.NUMBER, b"2.5") == 2.5
    assert schema_value(SchemaType.STRING, "héllo".encode()) == "héllo"
    assert schema_value(SchemaType.BYTES, b"\x00raw") == b"\x00raw"
    with pytest.raises(InvalidArgument, match="not JSON"):
        schema_value(SchemaType.AVRO, b"{")
    with pytest.raises(InvalidArgument, match="not a number"):
        schema_value(SchemaType.NUMBER, b"forty")


async def test_schema_cache_fetches_once_bounds_itself_and_does_not_keep_failures() -> None:
    calls: list[tuple[int, int]] = []

    async def request(msg: cp.GetSchema) -> cp.SchemaInfo:
        assert msg.schema_id is not None and msg.version is not None
        calls.append((msg.schema_id, msg.version))
        await asyncio.sleep(0.01)
        if msg.schema_id == 404:
            raise NotFound("schema id 404 not found")
        return cp.SchemaInfo(request_id=1, subject="s", schema_id=msg.schema_id, version=msg.version,
                             schema_type="string", definition=b"", fingerprint="f", compatibility="backward",
                             deleted=False, created_ms=0, description="")

    cache = SchemaCache(request, limit=2)  # type: ignore[arg-type]
    first, second = await asyncio.gather(cache.get(1, 1), cache.get(1, 1))
    assert first is second and calls == [(1, 1)]
    assert first.encode("text") == b"text" and first.decode(b"text") == "text"
    await cache.get(1, 2)
    await cache.get(1, 3)  # over the limit: (1, 1) goes
    assert cache.cached(1, 1) is None and cache.cached(1, 3) is not None
    for _ in range(2):
        with pytest.raises(NotFound):
            await cache.get(404, 1)
    assert calls.count((404, 1)) == 2


def test_a_batch_over_the_validation_budget_is_refused_between_payloads() -> None:
    guard = TopicSchemaGuard("/default/t", state("enforce", True), budget_ms=1)
    guard.learn(ORDER_V1)
    big = b'{"id": 1, "pad": "' + b"x" * 200_000 + b'"}'
    with pytest.raises(InvalidArgument, match=r"took over 1 ms \(\d+ of 2000 messages checked;"
                                              r" limits.schema_validation_budget_ms\)"):
        guard.check(7, 1, [big] * 2000)
    guard.check(7, 1, [big])  # one payload is always checked, whatever its cost

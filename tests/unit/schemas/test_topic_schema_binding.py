"""Binding topics to schema subjects, in a real (embedded Raft) metadata store."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from danube_zmq.consensus.metadata_store import RaftMetadataStore, embedded_store
from danube_zmq.schemas.registry import SchemaRegistry
from danube_zmq.schemas.topic_binding import ValidationPolicy, bind_producer, configure, get_config, parse_policy
from danube_zmq.schemas.types import SchemaType
from danube_zmq.transport.errors import FailedPrecondition, InvalidArgument, NotFound


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[RaftMetadataStore]:
    async with embedded_store(tmp_path / "meta") as s:
        yield s


async def test_first_producer_binds_and_another_subject_is_refused(store: RaftMetadataStore) -> None:
    registry = SchemaRegistry(store)
    await registry.register("orders", SchemaType.STRING, b"")
    await registry.register("payments", SchemaType.STRING, b"")
    assert await get_config(store, "/default/t") is None
    bound = await bind_producer(store, registry, "/default/t-part-2", "orders")  # a partition binds its base topic
    assert (bound.topic, bound.subject, bound.validation_policy, bound.payload_validation) == (
        "/default/t", "orders", ValidationPolicy.WARN, False)
    assert (await bind_producer(store, registry, "/default/t", "orders")).subject == "orders"
    with pytest.raises(FailedPrecondition, match="bound to schema subject 'orders'"):
        await bind_producer(store, registry, "/default/t-part-0", "payments")
    with pytest.raises(FailedPrecondition, match="register it first"):
        await bind_producer(store, registry, "/default/u", "unknown")


async def test_racing_first_producers_bind_one_subject(store: RaftMetadataStore) -> None:
    registry = SchemaRegistry(store)
    await registry.register("a", SchemaType.BYTES, b"")
    await registry.register("b", SchemaType.BYTES, b"")
    results = await asyncio.gather(*(bind_producer(store, registry, "/default/race", s) for s in "abab"),
                                   return_exceptions=True)
    winners = {r.subject for r in results if not isinstance(r, BaseException)}
    assert len(winners) == 1
    assert all(isinstance(r, FailedPrecondition) for r in results if isinstance(r, BaseException))


async def test_admin_configures_and_changes_the_subject(store: RaftMetadataStore) -> None:
    registry = SchemaRegistry(store)
    await registry.register("orders", SchemaType.STRING, b"")
    await registry.register("orders2", SchemaType.STRING, b"")
    await bind_producer(store, registry, "/default/t", "orders")
    config = await configure(store, registry, "/default/t", "orders2", ValidationPolicy.ENFORCE, True)
    assert (config.subject, config.validation_policy, config.payload_validation) == (
        "orders2", ValidationPolicy.ENFORCE, True)
    assert await get_config(store, "/default/t-part-0") == config
    with pytest.raises(NotFound):
        await configure(store, registry, "/default/t", "missing", ValidationPolicy.NONE, False)
    with pytest.raises(InvalidArgument):
        await configure(store, registry, "no-slash", "orders", ValidationPolicy.NONE, False)
    assert parse_policy("Enforce") is ValidationPolicy.ENFORCE
    with pytest.raises(InvalidArgument, match="none, warn or enforce"):
        parse_policy("strict")

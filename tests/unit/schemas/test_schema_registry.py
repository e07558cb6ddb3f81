"""The schema registry over a real (embedded, single-voter Raft) metadata store."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from danube_zmq.consensus.metadata_store import RaftMetadataStore, embedded_store
from danube_zmq.schemas.registry import IncompatibleSchema, SchemaRegistry
from danube_zmq.schemas.types import CompatibilityMode, SchemaType, parse_compatibility_mode, parse_schema_type
from danube_zmq.transport.errors import FailedPrecondition, InvalidArgument, NotFound


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[RaftMetadataStore]:
    async with embedded_store(tmp_path / "meta") as s:
        yield s


def schema(*required: str, **props: str) -> bytes:
    return json.dumps({"type": "object", "properties": {k: {"type": v} for k, v in props.items()},
                       "required": list(required)}).encode()


async def test_versions_ids_and_fingerprints(store: RaftMetadataStore) -> None:
    registry = SchemaRegistry(store)
    first = await registry.register("orders", SchemaType.NUMBER, b"int64")
    assert (first.version, first.is_new) == (1, True)
    again = await registry.register("orders", SchemaType.NUMBER, b"  LONG ")  # same normalized definition
    assert (again.schema_id, again.version, again.is_new, again.fingerprint) == (
        first.schema_id, 1, False, first.fingerprint)
    other = await registry.register("prices", SchemaType.NUMBER, b"float64")
    assert other.schema_id > first.schema_id  # global monotonic ids, one per subject
    got = await registry.get_by_id(other.schema_id)
    assert (got.subject, got.version, got.definition) == ("prices", 1, b"float64")
    assert [s.subject for s in await registry.list_subjects()] == ["orders", "prices"]
    with pytest.raises(FailedPrecondition, match="holds number schemas"):
        await registry.register("orders", SchemaType.STRING, b"")
    with pytest.raises(NotFound):
        await registry.get_by_id(999)
    with pytest.raises(InvalidArgument, match="invalid subject"):
        await registry.register("no spaces", SchemaType.BYTES, b"")


async def test_incompatible_change_is_rejected_with_reasons(store: RaftMetadataStore) -> None:
    registry = SchemaRegistry(store)
    await registry.register("n", SchemaType.NUMBER, b"int64")
    assert await registry.check("n", SchemaType.NUMBER, b"float64")
    with pytest.raises(IncompatibleSchema) as info:
        await registry.register("n", SchemaType.NUMBER, b"float64")
    assert info.value.reasons and "int64" in info.value.reasons[0]
    assert "mode backward" in info.value.message
    await registry.set_compatibility("n", CompatibilityMode.NONE)
    assert await registry.get_compatibility("n") is CompatibilityMode.NONE
    assert (await registry.register("n", SchemaType.NUMBER, b"float64")).version == 2
    assert await registry.check("n", SchemaType.NUMBER, b"int64", CompatibilityMode.FULL)  # an override


async def test_delete_is_soft_and_version_selection(store: RaftMetadataStore) -> None:
    registry = SchemaRegistry(store, default_mode=CompatibilityMode.NONE)
    for kind in (b"int64", b"float64", b"int64 "):
        await registry.register("s", SchemaType.NUMBER, kind)
    assert [v.version for v in await registry.versions("s")] == [1, 2]  # the third was version 1 again
    await registry.register("s", SchemaType.NUMBER, b"double")  # the same as version 2
    assert (await registry.resolve("s")).version == 2
    assert (await registry.resolve("s", pinned=1)).definition == b"int64"
    assert (await registry.resolve("s", min_version=2)).version == 2
    with pytest.raises(NotFound, match=">= 3"):
        await registry.resolve("s", min_version=3)
    with pytest.raises(NotFound, match="no version 7"):
        await registry.resolve("s", pinned=7)
    with pytest.raises(InvalidArgument):
        await registry.resolve("s", pinned=1, min_version=1)
    await registry.delete_version("s", 2)
    assert (await registry.resolve("s")).version == 1  # latest live
    assert (await registry.get_version("s", 2)).deleted  # still readable by version
    with pytest.raises(NotFound, match="deleted"):
        await registry.resolve("s", pinned=2)
    with pytest.raises(NotFound, match="already deleted"):
        await registry.delete_version("s", 2)
    again = await registry.register("s", SchemaType.NUMBER, b"float64")  # a deleted fingerprint is not reused
    assert (again.version, again.is_new) == (3, True)


async def test_concurrent_registrations_never_interleave(store: RaftMetadataStore) -> None:
    registry = SchemaRegistry(store, default_mode=CompatibilityMode.NONE)
    kinds = [b"int64", b"float64"] * 5
    results = await asyncio.gather(*(registry.register("race", SchemaType.NUMBER, k) for k in kinds))
    versions = await registry.versions("race")
    assert [v.version for v in versions] == [1, 2]
    by_fingerprint = {v.fingerprint: v.version for v in versions}
    for result in results:
        assert by_fingerprint[result.fingerprint] == result.version
        assert (await registry.get_version("race", result.version)).fingerprint == result.fingerprint


def test_parse_names() -> None:
    assert parse_schema_type("JSON") is SchemaType.JSON_SCHEMA
    assert parse_schema_type("proto") is SchemaType.PROTOBUF
    assert parse_schema_type("double") is SchemaType.NUMBER
    assert parse_compatibility_mode("Full-Transitive") is CompatibilityMode.FULL_TRANSITIVE
    with pytest.raises(InvalidArgument, match="unknown schema type"):
        parse_schema_type("xml")
    with pytest.raises(InvalidArgument, match="unknown compatibility mode"):
        parse_compatibility_mode("sideways")


async def test_json_schema_modes_latest_and_transitive(store: RaftMetadataStore) -> None:
    registry = SchemaRegistry(store)
    v1 = schema("id", id="integer", note="string")
    v2 = schema("id", id="integer")  # drops note: old data still valid (open schema)
    v3 = schema("id", id="integer", note="integer")  # note back, as another type
    await registry.register("users", SchemaType.JSON_SCHEMA, v1)
    assert (await registry.register("users", SchemaType.JSON_SCHEMA, v2)).version == 2
    # BACKWARD checks the latest only: v3 reads v2's data, so it is accepted ...
    assert await registry.check("users", SchemaType.JSON_SCHEMA, v3) == []
    # ... but BACKWARD_TRANSITIVE also checks v1, whose `note` was a string.
    reasons = await registry.check("users", SchemaType.JSON_SCHEMA, v3, CompatibilityMode.BACKWARD_TRANSITIVE)
    assert reasons and all("version 1" in r and "note" in r for r in reasons)
    await registry.set_compatibility("users", CompatibilityMode.BACKWARD_TRANSITIVE)
    with pytest.raises(IncompatibleSchema) as info:
        await registry.register("users", SchemaType.JSON_SCHEMA, v3)
    assert "#/properties/note" in info.value.message
    # A new required field breaks BACKWARD (old data lacks it), not FORWARD.
    v4 = schema("id", "email", id="integer", email="string")
    assert await registry.check("users", SchemaType.JSON_SCHEMA, v4, CompatibilityMode.BACKWARD)
    assert await registry.check("users", SchemaType.JSON_SCHEMA, v4, CompatibilityMode.FORWARD) == []
    assert await registry.check("users", SchemaType.JSON_SCHEMA, v4, CompatibilityMode.FULL)
    with pytest.raises(InvalidArgument):
        await registry.register("users", SchemaType.JSON_SCHEMA, b"{not json")


async def test_protobuf_full_mode_accepts_additions_and_refuses_unreserved_removals(store: RaftMetadataStore) -> None:
    registry = SchemaRegistry(store, default_mode=CompatibilityMode.FULL)
    v1 = b'syntax = "proto3";\npackage shop;\nmessage Order { int32 qty = 1; string name = 2; }\n'
    v2 = b'syntax = "proto3";\npackage shop;\nmessage Order { int32 qty = 1; string name = 2; string note = 3; }\n'
    v3 = b'syntax = "proto3";\npackage shop;\nmessage Order { int32 qty = 1; string note = 3; }\n'
    v3r = b'syntax = "proto3";\npackage shop;\nmessage Order { int32 qty = 1; string note = 3; reserved 2; }\n'
    await registry.register("orders-pb", SchemaType.PROTOBUF, v1)
    assert (await registry.register("orders-pb", SchemaType.PROTOBUF, v2)).version == 2
    with pytest.raises(IncompatibleSchema, match="removed without being reserved"):
        await registry.register("orders-pb", SchemaType.PROTOBUF, v3)
    assert (await registry.register("orders-pb", SchemaType.PROTOBUF, v3r)).version == 3

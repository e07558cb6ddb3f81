"""Answers to the schema-registry requests of the client port (`danube schemas ...`,
`SchemaRegistryClient`), from the broker's `SchemaRegistry` (kept in the metadata
store), one function per request type, each called by the gateway's
`handle_<Type>` in a task of its own: they wait on Raft rounds."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from danube_zmq.schemas.registry import SchemaRegistry, SchemaVersion
from danube_zmq.schemas.types import parse_compatibility_mode, parse_schema_type
from danube_zmq.transport import client_protocol as cp
from danube_zmq.transport.codec import Message
from danube_zmq.transport.common import Ok
from danube_zmq.transport.errors import InvalidArgument

Answer = Callable[[SchemaRegistry, Any], Awaitable[Message]]
"""One schema request's answer (the gateway's `handle_<Type>` names which); errors are
raised as `DanubeError`s."""


async def register_schema(registry: SchemaRegistry, msg: cp.RegisterSchema) -> Message:
    done = await registry.register(msg.subject, parse_schema_type(msg.schema_type), msg.definition,
                                   description=msg.description)
    return cp.SchemaRegistered(request_id=msg.request_id, schema_id=done.schema_id, version=done.version,
                               is_new=done.is_new, fingerprint=done.fingerprint)


async def get_schema(registry: SchemaRegistry, msg: cp.GetSchema) -> Message:
    schema_id, subject, version = msg.schema_id, msg.subject, msg.version
    if (schema_id is None) == (subject is None):
        raise InvalidArgument("get a schema by schema_id or by subject (exactly one)")
    if schema_id is not None:
        found = await registry.get_by_id(schema_id, version)
    elif version is not None:
        found = await registry.get_version(subject, version)  # type: ignore[arg-type]
    else:
        found = await registry.get_latest(subject)  # type: ignore[arg-type]
    return _info(msg.request_id, found)


async def list_schema_versions(registry: SchemaRegistry, msg: cp.ListSchemaVersions) -> Message:
    versions = await registry.versions(msg.subject)
    return cp.SchemaVersions(request_id=msg.request_id, subject=msg.subject, versions=[
        cp.SchemaVersionInfo(version=v.version, fingerprint=v.fingerprint, deleted=v.deleted,
                             created_ms=v.created_ms, description=v.description) for v in versions])


async def check_schema(registry: SchemaRegistry, msg: cp.CheckSchema) -> Message:
    override = parse_compatibility_mode(msg.mode) if msg.mode else None
    reasons = await registry.check(msg.subject, parse_schema_type(msg.schema_type), msg.definition, override)
    return cp.SchemaCheck(request_id=msg.request_id, compatible=not reasons, reasons=reasons)


async def get_compatibility(registry: SchemaRegistry, msg: cp.GetCompatibility) -> Message:
    mode = await registry.get_compatibility(msg.subject)
    return cp.CompatibilityInfo(request_id=msg.request_id, subject=msg.subject, mode=mode.value)


async def set_compatibility(registry: SchemaRegistry, msg: cp.SetCompatibility) -> Message:
    parsed = parse_compatibility_mode(msg.mode)
    await registry.set_compatibility(msg.subject, parsed)
    return cp.CompatibilityInfo(request_id=msg.request_id, subject=msg.subject, mode=parsed.value)


async def delete_schema_version(registry: SchemaRegistry, msg: cp.DeleteSchemaVersion) -> Message:
    await registry.delete_version(msg.subject, msg.version)
    return Ok(request_id=msg.request_id)


async def list_subjects(registry: SchemaRegistry, msg: cp.ListSubjects) -> Message:
    subjects = await registry.list_subjects()
    return cp.SubjectList(request_id=msg.request_id, subjects=[
        cp.SubjectInfo(subject=s.subject, schema_id=s.schema_id, schema_type=s.schema_type.value,
                       latest_version=s.latest_version, compatibility=s.compatibility.value)
        for s in subjects])


def _info(rid: int, found: SchemaVersion) -> cp.SchemaInfo:
    return cp.SchemaInfo(request_id=rid, subject=found.subject, schema_id=found.schema_id, version=found.version,
                         schema_type=found.schema_type.value, definition=found.definition,
                         fingerprint=found.fingerprint, compatibility=found.compatibility.value,
                         deleted=found.deleted, created_ms=found.created_ms, description=found.description)

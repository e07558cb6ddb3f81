"""Answers to the schema-registry requests of the client port (`danube schemas ...`,
`SchemaRegistryClient`), from the broker's `SchemaRegistry` (kept in the metadata
store). The gateway runs `answer` in a task per request: they wait on Raft rounds."""

from __future__ import annotations

from danube_zmq.schemas.registry import SchemaRegistry, SchemaVersion
from danube_zmq.schemas.types import parse_compatibility_mode, parse_schema_type
from danube_zmq.transport import client_protocol as cp
from danube_zmq.transport.codec import Message
from danube_zmq.transport.common import Ok
from danube_zmq.transport.errors import InvalidArgument

__all__ = ["answer"]


async def answer(registry: SchemaRegistry, msg: Message) -> Message:
    """The reply to one schema request; errors are raised as `DanubeError`s."""
    rid: int = msg.request_id  # type: ignore[attr-defined]
    match msg:
        case cp.RegisterSchema(subject=subject, schema_type=schema_type, definition=definition,
                               description=description):
            done = await registry.register(subject, parse_schema_type(schema_type), definition, description=description)
            return cp.SchemaRegistered(request_id=rid, schema_id=done.schema_id, version=done.version,
                                       is_new=done.is_new, fingerprint=done.fingerprint)
        case cp.GetSchema(schema_id=schema_id, subject=subject, version=version):
            if (schema_id is None) == (subject is None):
                raise InvalidArgument("get a schema by schema_id or by subject (exactly one)")
            if schema_id is not None:
                found = await registry.get_by_id(schema_id, version)
            elif version is not None:
                found = await registry.get_version(subject, version)  # type: ignore[arg-type]
            else:
                found = await registry.get_latest(subject)  # type: ignore[arg-type]
            return _info(rid, found)
        case cp.ListSchemaVersions(subject=subject):
            versions = await registry.versions(subject)
            return cp.SchemaVersions(request_id=rid, subject=subject, versions=[
                cp.SchemaVersionInfo(version=v.version, fingerprint=v.fingerprint, deleted=v.deleted,
                                     created_ms=v.created_ms, description=v.description) for v in versions])
        case cp.CheckSchema(subject=subject, schema_type=schema_type, definition=definition, mode=mode):
            override = parse_compatibility_mode(mode) if mode else None
            reasons = await registry.check(subject, parse_schema_type(schema_type), definition, override)
            return cp.SchemaCheck(request_id=rid, compatible=not reasons, reasons=reasons)
        case cp.GetCompatibility(subject=subject):
            mode = await registry.get_compatibility(subject)
            return cp.CompatibilityInfo(request_id=rid, subject=subject, mode=mode.value)
        case cp.SetCompatibility(subject=subject, mode=mode):
            parsed = parse_compatibility_mode(mode)
            await registry.set_compatibility(subject, parsed)
            return cp.CompatibilityInfo(request_id=rid, subject=subject, mode=parsed.value)
        case cp.DeleteSchemaVersion(subject=subject, version=version):
            await registry.delete_version(subject, version)
            return Ok(request_id=rid)
        case cp.ListSubjects():
            subjects = await registry.list_subjects()
            return cp.SubjectList(request_id=rid, subjects=[
                cp.SubjectInfo(subject=s.subject, schema_id=s.schema_id, schema_type=s.schema_type.value,
                               latest_version=s.latest_version, compatibility=s.compatibility.value)
                for s in subjects])
    raise InvalidArgument(f"{type(msg).__name__} is not a schema request")


def _info(rid: int, found: SchemaVersion) -> cp.SchemaInfo:
    return cp.SchemaInfo(request_id=rid, subject=found.subject, schema_id=found.schema_id, version=found.version,
                         schema_type=found.schema_type.value, definition=found.definition,
                         fingerprint=found.fingerprint, compatibility=found.compatibility.value,
                         deleted=found.deleted, created_ms=found.created_ms, description=found.description)

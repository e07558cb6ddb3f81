"""The schema-registry client: one asyncio method per registry operation, over the
broker's client port (where Danube serves its SchemaRegistry too).

    async with SchemaRegistryClient("tcp://127.0.0.1:6650") as registry:
        done = await registry.register("orders", "json_schema", Path("orders.json").read_bytes())
        info = await registry.get_schema(schema_id=done.schema_id)

Errors are the broker's: INVALID_ARGUMENT for a bad definition (naming the problem),
FAILED_PRECONDITION for an incompatible one (listing the reasons), NOT_FOUND for an
unknown subject, id or version.
"""

from __future__ import annotations

from typing import Any

from danube_zmq.rpc.request_client import RequestClient
from danube_zmq.schemas.types import parse_compatibility_mode, parse_schema_type
from danube_zmq.transport import client_protocol as cp
from danube_zmq.transport.common import Ok
from danube_zmq.transport.errors import InvalidArgument

__all__ = ["SchemaRegistryClient"]


class SchemaRegistryClient(RequestClient):
    PROTOCOL = cp.CLIENT_PROTOCOL
    WHAT = "broker endpoint"

    def __init__(self, endpoint: str, *, timeout_ms: int = 5000, client_name: str = "danube-schemas",
                 **curve: Any) -> None:
        """`curve`: server_public_key, client_keys, token, token_provider, use_env, as `RequestClient`."""
        super().__init__(endpoint, timeout_ms=timeout_ms, client_name=client_name, **curve)

    async def register(self, subject: str, schema_type: str, definition: bytes, *,
                       description: str = "") -> cp.SchemaRegistered:
        kind = parse_schema_type(schema_type).value  # a typo fails here, before any round trip
        return await self._call(lambda rid: cp.RegisterSchema(request_id=rid, subject=subject, schema_type=kind,
                                                              definition=definition, description=description),
                                cp.SchemaRegistered)

    async def get_schema(self, *, schema_id: int | None = None, subject: str | None = None,
                         version: int | None = None) -> cp.SchemaInfo:
        if (schema_id is None) == (subject is None):
            raise InvalidArgument("get a schema by schema_id or by subject (exactly one)")
        return await self._call(lambda rid: cp.GetSchema(request_id=rid, schema_id=schema_id, subject=subject,
                                                         version=version), cp.SchemaInfo)

    async def versions(self, subject: str) -> list[cp.SchemaVersionInfo]:
        reply = await self._call(lambda rid: cp.ListSchemaVersions(request_id=rid, subject=subject), cp.SchemaVersions)
        return reply.versions

    async def check(self, subject: str, schema_type: str, definition: bytes, *,
                    mode: str | None = None) -> cp.SchemaCheck:
        kind = parse_schema_type(schema_type).value
        mode_name = parse_compatibility_mode(mode).value if mode else None
        return await self._call(lambda rid: cp.CheckSchema(request_id=rid, subject=subject, schema_type=kind,
                                                           definition=definition, mode=mode_name), cp.SchemaCheck)

    async def get_compatibility(self, subject: str) -> str:
        reply = await self._call(lambda rid: cp.GetCompatibility(request_id=rid, subject=subject), cp.CompatibilityInfo)
        return reply.mode

    async def set_compatibility(self, subject: str, mode: str) -> str:
        name = parse_compatibility_mode(mode).value
        reply = await self._call(lambda rid: cp.SetCompatibility(request_id=rid, subject=subject, mode=name),
                                 cp.CompatibilityInfo)
        return reply.mode

    async def delete_version(self, subject: str, version: int) -> None:
        await self._call(lambda rid: cp.DeleteSchemaVersion(request_id=rid, subject=subject, version=version), Ok)

    async def list_subjects(self) -> list[cp.SubjectInfo]:
        reply = await self._call(lambda rid: cp.ListSubjects(request_id=rid), cp.SubjectList)
        return reply.subjects

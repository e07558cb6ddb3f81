"""The gRPC door's SchemaRegistry (`SchemaRegistry.proto`, `actors/grpc_door.py`).

A gateway onto the broker's own schema registry, as the door is onto its topics: each
RPC is the native registry request (`client/schemas.py`) on this broker's client port,
so a schema a Danube client registers here is the one our native clients read, with
the same ids, versions, fingerprints and compatibility checks.

Danube's topic-binding RPCs (`ConfigureTopicSchema`, `UpdateTopicValidationPolicy`,
`GetTopicSchemaConfig`) are admin operations here (`danube admin topics ...`), not
served on the client port: they answer UNIMPLEMENTED. A producer naming a subject
binds its topic all the same (`CreateProducer` with a schema reference).
"""

from __future__ import annotations

import asyncio
from typing import Any

import grpc

from danube_zmq.actors.grpc_door import GrpcDoor, abort_with
from danube_zmq.client.schemas import SchemaRegistryClient
from danube_zmq.transport import client_protocol as cp
from danube_zmq.transport.danube_proto import SchemaRegistry_pb2 as spb
from danube_zmq.transport.danube_proto import SchemaRegistry_pb2_grpc as spb_grpc
from danube_zmq.transport.errors import DanubeError, NotFound


def _schema_response(info: cp.SchemaInfo) -> Any:
    return spb.GetSchemaResponse(
        schema_id=info.schema_id, version=info.version, subject=info.subject, schema_type=info.schema_type,
        schema_definition=info.definition, description=info.description,
        # Danube's created_at is in seconds; ours is kept in milliseconds.
        created_at=info.created_ms // 1000, fingerprint=info.fingerprint, compatibility_mode=info.compatibility)


class SchemaRegistryDoor(spb_grpc.SchemaRegistryServicer):
    """Owns one native registry client to this broker's client port; `close()` at the
    door's stop."""

    def __init__(self, door: GrpcDoor) -> None:
        self._registry = SchemaRegistryClient(door.native_url, client_name="grpc-door-schemas")
        self._connecting = asyncio.Lock()

    async def _connected(self) -> SchemaRegistryClient:
        # Connected at the first schema call: most Danube clients never make one.
        async with self._connecting:
            if self._registry.connected is None:
                try:
                    await self._registry.connect()
                except BaseException:
                    self._registry.close()  # the next call connects afresh
                    raise
        return self._registry

    def close(self) -> None:
        self._registry.close()

    async def RegisterSchema(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            done = await (await self._connected()).register(request.subject, request.schema_type, request.schema_definition,
                                                description=request.description)
        except DanubeError as exc:
            await abort_with(context, exc)
        return spb.RegisterSchemaResponse(schema_id=done.schema_id, version=done.version,
                                          is_new_version=done.is_new, fingerprint=done.fingerprint)

    async def GetSchema(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        version = request.version if request.HasField("version") else None
        try:
            info = await (await self._connected()).get_schema(schema_id=request.schema_id, version=version)
        except DanubeError as exc:
            await abort_with(context, exc)
        return _schema_response(info)

    async def GetLatestSchema(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            info = await (await self._connected()).get_schema(subject=request.subject)
        except DanubeError as exc:
            await abort_with(context, exc)
        return _schema_response(info)

    async def ListVersions(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            versions = await (await self._connected()).versions(request.subject)
            try:
                schema_id = (await (await self._connected()).get_schema(subject=request.subject)).schema_id
            except NotFound:
                schema_id = 0  # every version deleted: nothing live to name
        except DanubeError as exc:
            await abort_with(context, exc)
        # A deleted version stays readable by id and version, but is no longer one to
        # produce with: Danube's client lists versions to pick one.
        return spb.ListVersionsResponse(versions=[
            spb.SchemaVersionInfo(version=v.version, created_at=v.created_ms // 1000, description=v.description,
                                  fingerprint=v.fingerprint, schema_id=schema_id)
            for v in versions if not v.deleted])

    async def CheckCompatibility(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        mode = request.compatibility_mode if request.HasField("compatibility_mode") else None
        try:
            check = await (await self._connected()).check(request.subject, request.schema_type, request.new_schema_definition,
                                              mode=mode)
        except DanubeError as exc:
            await abort_with(context, exc)
        return spb.CheckCompatibilityResponse(is_compatible=check.compatible, errors=list(check.reasons))

    async def DeleteSchemaVersion(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            await (await self._connected()).delete_version(request.subject, request.version)
        except DanubeError as exc:
            await abort_with(context, exc)
        return spb.DeleteSchemaVersionResponse(success=True,
                                               message=f"version {request.version} of {request.subject} deleted")

    async def SetCompatibilityMode(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            mode = await (await self._connected()).set_compatibility(request.subject, request.compatibility_mode)
        except DanubeError as exc:
            await abort_with(context, exc)
        return spb.SetCompatibilityModeResponse(success=True, message=f"{request.subject}: compatibility {mode}")

    async def ListSubjects(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            subjects = await (await self._connected()).list_subjects()
        except DanubeError as exc:
            await abort_with(context, exc)
        return spb.ListSubjectsResponse(subjects=[
            spb.SubjectSummary(subject=s.subject, schema_type=s.schema_type, latest_version=s.latest_version or 0,
                               compatibility_mode=s.compatibility, schema_id=s.schema_id)
            for s in subjects])

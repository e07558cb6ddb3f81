"""The gRPC door's SchemaRegistry (`SchemaRegistry.proto`, `actors/grpc_door.py`).

A gateway onto the broker's own schema registry, as the door is onto its topics: each
RPC is the native registry request (`client/schemas.py`) on this broker's client port,
so a schema a Danube client registers here is the one our native clients read, with
the same ids, versions, fingerprints and compatibility checks.

Danube's topic-binding RPCs (`ConfigureTopicSchema`, `UpdateTopicValidationPolicy`,
`GetTopicSchemaConfig`) are admin operations here (`danube admin topics ...`), not
served on the client port: they answer UNIMPLEMENTED. A producer naming a subject
binds its topic all the same (`CreateProducer` with a schema reference).

Each caller's calls go on a registry client of their own, dialed with their token
(`actors/grpc_door_auth.py`): the broker's RBAC decides each as for a native client.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc

from danube_zmq.actors.grpc_door import GrpcDoor, abort_with, caller_of
from danube_zmq.actors.grpc_door_auth import Caller, PerCaller
from danube_zmq.client.schemas import SchemaRegistryClient
from danube_zmq.transport import client_protocol as cp
from danube_zmq.transport.danube_proto import SchemaRegistry_pb2 as spb
from danube_zmq.transport.danube_proto import SchemaRegistry_pb2_grpc as spb_grpc
from danube_zmq.transport.errors import DanubeError, NotFound, Unauthenticated

# Callers whose registry connection is kept open.
REGISTRY_CLIENTS_MAX = 64
T = TypeVar("T")


def _schema_response(info: cp.SchemaInfo) -> Any:
    return spb.GetSchemaResponse(
        schema_id=info.schema_id, version=info.version, subject=info.subject, schema_type=info.schema_type,
        schema_definition=info.definition, description=info.description,
        # Danube's created_at is in seconds; ours is kept in milliseconds.
        created_at=info.created_ms // 1000, fingerprint=info.fingerprint, compatibility_mode=info.compatibility)


class SchemaRegistryDoor(spb_grpc.SchemaRegistryServicer):
    """Owns the callers' native registry clients to this broker's client port, each
    connected at the caller's first schema call (most Danube clients never make one);
    `close()` at the door's stop."""

    def __init__(self, door: GrpcDoor) -> None:
        self._security = door.security
        async def open_registry(caller: Caller) -> SchemaRegistryClient:
            registry = SchemaRegistryClient(door.native_url, client_name="grpc-door-schemas",
                                            **door.security.credentials(caller))
            try:
                await registry.connect()
            except BaseException:
                registry.close()
                raise
            return registry

        async def close_registry(registry: SchemaRegistryClient) -> None:
            registry.close()

        self._registries: PerCaller[SchemaRegistryClient] = PerCaller(open_registry, close_registry,
                                                                      REGISTRY_CLIENTS_MAX)

    async def _call(self, context: grpc.aio.ServicerContext,
                    call: Callable[[SchemaRegistryClient], Awaitable[T]]) -> T:
        """`call` on the caller's registry client; a `DanubeError` ends the gRPC call."""
        caller = await caller_of(context, self._security)
        try:
            return await call(await self._registries.get(caller))
        except DanubeError as exc:
            if isinstance(exc, Unauthenticated):
                await self._registries.drop(caller)  # the next call dials afresh
            await abort_with(context, exc)
            raise AssertionError("abort returns only by raising") from exc

    async def close(self) -> None:
        await self._registries.close()

    async def RegisterSchema(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        done = await self._call(context, lambda r: r.register(request.subject, request.schema_type,
                                                              request.schema_definition,
                                                              description=request.description))
        return spb.RegisterSchemaResponse(schema_id=done.schema_id, version=done.version,
                                          is_new_version=done.is_new, fingerprint=done.fingerprint)

    async def GetSchema(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        version = request.version if request.HasField("version") else None
        info = await self._call(context, lambda r: r.get_schema(schema_id=request.schema_id, version=version))
        return _schema_response(info)

    async def GetLatestSchema(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return _schema_response(await self._call(context, lambda r: r.get_schema(subject=request.subject)))

    async def ListVersions(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async def versions_and_id(registry: SchemaRegistryClient) -> tuple[list[Any], int]:
            versions = await registry.versions(request.subject)
            try:
                return versions, (await registry.get_schema(subject=request.subject)).schema_id
            except NotFound:
                return versions, 0  # every version deleted: nothing live to name

        versions, schema_id = await self._call(context, versions_and_id)
        # A deleted version stays readable by id and version, but is no longer one to
        # produce with: Danube's client lists versions to pick one.
        return spb.ListVersionsResponse(versions=[
            spb.SchemaVersionInfo(version=v.version, created_at=v.created_ms // 1000, description=v.description,
                                  fingerprint=v.fingerprint, schema_id=schema_id)
            for v in versions if not v.deleted])

    async def CheckCompatibility(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        mode = request.compatibility_mode if request.HasField("compatibility_mode") else None
        check = await self._call(context, lambda r: r.check(request.subject, request.schema_type,
                                                            request.new_schema_definition, mode=mode))
        return spb.CheckCompatibilityResponse(is_compatible=check.compatible, errors=list(check.reasons))

    async def DeleteSchemaVersion(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        await self._call(context, lambda r: r.delete_version(request.subject, request.version))
        return spb.DeleteSchemaVersionResponse(success=True,
                                               message=f"version {request.version} of {request.subject} deleted")

    async def SetCompatibilityMode(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        mode = await self._call(context, lambda r: r.set_compatibility(request.subject, request.compatibility_mode))
        return spb.SetCompatibilityModeResponse(success=True, message=f"{request.subject}: compatibility {mode}")

    async def ListSubjects(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        subjects = await self._call(context, lambda r: r.list_subjects())
        return spb.ListSubjectsResponse(subjects=[
            spb.SubjectSummary(subject=s.subject, schema_type=s.schema_type, latest_version=s.latest_version or 0,
                               compatibility_mode=s.compatibility, schema_id=s.schema_id)
            for s in subjects])

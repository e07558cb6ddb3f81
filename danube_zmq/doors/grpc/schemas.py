"""Danube's SchemaRegistry (`SchemaRegistry.proto`), served on both gRPC doors: the
client door (`doors/grpc/client_door.py`) and the admin door (`doors/grpc/admin_door.py`), as
Danube's broker serves it on both its client and admin endpoints.

A gateway onto the broker's own schema registry, as the doors are onto its topics:

- the registry RPCs are the native registry requests (`client/schemas.py`) on this
  broker's client port, so a schema a Danube client or danube-admin registers here is
  the one our native clients read, with the same ids, versions, fingerprints and
  compatibility checks;
- the topic-binding RPCs are our admin operations (`client/admin.py`, what
  `danube admin topics configure-schema | get-schema-config` use) on this broker's
  admin port: `ConfigureTopicSchema` is `configure_topic_schema`;
  `UpdateTopicValidationPolicy` reads the binding and configures it again with its
  subject (FAILED_PRECONDITION when the topic has none, as Danube); `GetTopicSchemaConfig`
  is `get_topic_schema_config`, and for a topic with no schema bound answers Danube's
  empty configuration (no subject, policy none, schema id 0).
  Unlike Danube's, a binding is per topic name, kept in the metadata store: it may be
  configured before its topic exists and through any broker of the cluster, so a name
  without a topic is not NOT_FOUND here (an empty configuration, or bound).

Each caller's calls go on native clients of their own, dialed with their token
(`doors/grpc/auth.py`, `doors/grpc/admin_clients.py`): the broker's RBAC decides
each as for a native client or `danube admin` with that token.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc

from danube_zmq.client.admin import AdminClient
from danube_zmq.client.schemas import SchemaRegistryClient
from danube_zmq.doors.grpc.admin_clients import AdminClients
from danube_zmq.doors.grpc.auth import Caller, DoorSecurity, PerCaller
from danube_zmq.doors.grpc.calls import abort_with, caller_of
from danube_zmq.schemas.topic_binding import ValidationPolicy, parse_policy
from danube_zmq.transport import admin_protocol as ap
from danube_zmq.transport import client_protocol as cp
from danube_zmq.transport.danube_proto import SchemaRegistry_pb2 as spb
from danube_zmq.transport.danube_proto import SchemaRegistry_pb2_grpc as spb_grpc
from danube_zmq.transport.errors import DanubeError, FailedPrecondition, NotFound, Unauthenticated

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
    """Owns the callers' native registry clients to this broker's client port
    (`client_target`), each connected at the caller's first schema call (most Danube
    clients never make one); `close()` at the door's stop. The topic-binding calls
    borrow the door's admin clients (`admins`), which the door closes."""

    def __init__(self, *, security: DoorSecurity, client_target: str, admins: AdminClients) -> None:
        self._security = security
        self._admins = admins

        async def open_registry(caller: Caller) -> SchemaRegistryClient:
            registry = SchemaRegistryClient(client_target, client_name="grpc-door-schemas",
                                            **security.credentials(caller))
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

    async def _admin_call(self, context: grpc.aio.ServicerContext, call: Callable[[AdminClient], Awaitable[T]]) -> T:
        """`call` on an admin client of the caller's; a `DanubeError` ends the gRPC call."""
        caller = await caller_of(context, self._security)
        try:
            async with self._admins.client(caller) as admin:
                return await call(admin)
        except DanubeError as exc:
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

    # ----------------------------------------------------- topic bindings (admin)

    async def ConfigureTopicSchema(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        # Parsed here first, as Danube does before anything else: a bad policy is
        # INVALID_ARGUMENT whatever the topic and subject.
        policy = await _policy(context, request.validation_policy)
        config = await self._admin_call(context, lambda a: a.configure_topic_schema(
            request.topic_name, request.schema_subject, validation_policy=policy.value,
            payload_validation=request.enable_payload_validation))
        return spb.ConfigureTopicSchemaResponse(success=True, message=(
            f"Topic '{request.topic_name}' configured with schema '{config.subject}', validation policy"
            f" '{_danube_name(config)}', payload validation {_enabled(config.payload_validation)}"))

    async def UpdateTopicValidationPolicy(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        policy = await _policy(context, request.validation_policy)

        async def update(admin: AdminClient) -> ap.TopicSchemaConfigInfo:
            try:
                bound = await admin.get_topic_schema_config(request.topic_name)
            except NotFound:
                raise FailedPrecondition(f"topic {request.topic_name} has no schema subject configured; use"
                                         " ConfigureTopicSchema first") from None
            # Our admin API sets a binding whole: the subject read just now goes back
            # with the new policy. An admin changing the subject in between loses to
            # this write, as two ConfigureTopicSchema calls racing do.
            return await admin.configure_topic_schema(request.topic_name, bound.subject,
                                                      validation_policy=policy.value,
                                                      payload_validation=request.enable_payload_validation)

        config = await self._admin_call(context, update)
        return spb.UpdateTopicValidationPolicyResponse(success=True, message=(
            f"Validation policy updated to '{_danube_name(config)}', payload validation"
            f" {_enabled(config.payload_validation)}"))

    async def GetTopicSchemaConfig(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async def get(admin: AdminClient) -> ap.TopicSchemaConfigInfo | None:
            try:
                return await admin.get_topic_schema_config(request.topic_name)
            except NotFound:
                # Danube answers a topic without a schema with an empty configuration.
                # Whether the topic exists is not asked: our bindings are per topic name
                # and may come before the topic, and asking would need ManageTopic
                # where this call needs Lookup.
                return None

        config = await self._admin_call(context, get)
        if config is None:
            return spb.GetTopicSchemaConfigResponse(schema_subject="", validation_policy=ValidationPolicy.NONE.value,
                                                    enable_payload_validation=False, schema_id=0)
        return spb.GetTopicSchemaConfigResponse(schema_subject=config.subject, validation_policy=config.validation_policy,
                                                enable_payload_validation=config.payload_validation,
                                                schema_id=config.schema_id)


async def _policy(context: grpc.aio.ServicerContext, text: str) -> ValidationPolicy:
    """Danube's validation policy, any case (danube-admin sends "ENFORCE")."""
    try:
        return parse_policy(text)
    except DanubeError as exc:
        await abort_with(context, exc)
        raise AssertionError("abort returns only by raising") from exc


def _danube_name(config: ap.TopicSchemaConfigInfo) -> str:
    return config.validation_policy.capitalize()  # Danube's messages name it "Enforce"


def _enabled(on: bool) -> str:
    return "enabled" if on else "disabled"

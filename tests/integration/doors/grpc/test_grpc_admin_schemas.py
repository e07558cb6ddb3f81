"""Danube's SchemaRegistry on the gRPC admin door, and its topic-binding calls on both
doors (docs/danube-compat.md, "The admin door").

danube-admin calls SchemaRegistry on its admin endpoint (`schemas ...`, `topics
configure-schema | set-validation-policy | get-schema-config`). Danube's own danube-admin
test scenarios are replayed here as grpcio calls on the admin door, each request built as
danube-admin's `cli/*.rs` builds it for the command named beside it. One broker with both
doors serves the module; the RBAC test has a secured broker of its own.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import grpc
import pytest

from danube_zmq import DanubeClient
from danube_zmq.security.tokens import TokenSigner
from danube_zmq.transport.danube_proto import DanubeAdmin_pb2 as apb
from danube_zmq.transport.danube_proto import DanubeAdmin_pb2_grpc as apb_grpc
from danube_zmq.transport.danube_proto import SchemaRegistry_pb2 as spb
from danube_zmq.transport.danube_proto import SchemaRegistry_pb2_grpc as spb_grpc
from danube_zmq.transport.errors import FailedPrecondition, InvalidArgument
from tests.integration.conftest import BrokerProcess, free_port, make_curve_keys, start_broker, write_jwt_secret
from tests.tls_certs import self_signed_cert

# danube-admin's `schemas register` sends $USER (or "admin") as created_by.
CREATED_BY = "admin"

# danube-admin/tests/schema_admin_operations.rs
ADMIN_EVENT_V1 = b"""{
  "$schema": "http://json-schema.org/draft-07/schema#",
  "title": "AdminTestEvent",
  "type": "object",
  "required": ["event_id", "action"],
  "properties": {
    "event_id": {
      "type": "string"
    },
    "action": {
      "type": "string"
    }
  }
}"""
ADMIN_EVENT_V2 = b"""{
  "$schema": "http://json-schema.org/draft-07/schema#",
  "title": "AdminTestEvent",
  "type": "object",
  "required": ["event_id", "action"],
  "properties": {
    "event_id": {
      "type": "string"
    },
    "action": {
      "type": "string"
    },
    "metadata": {
      "type": "string"
    }
  }
}"""
# danube-admin/tests/schema_registry_lifecycle.rs
TEST_EVENT = b"""{
  "$schema": "http://json-schema.org/draft-07/schema#",
  "title": "TestEvent",
  "type": "object",
  "required": ["event_type", "timestamp"],
  "properties": {
    "event_type": {
      "type": "string"
    },
    "timestamp": {
      "type": "integer"
    }
  }
}"""
ORDER = json.dumps({"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"]}).encode()


@dataclass
class Doors:
    broker: BrokerProcess
    door: str  # host:port of the client door
    admin_door: str  # host:port of the admin door


@pytest.fixture(scope="module")
def doors(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Doors]:
    tmp_path = tmp_path_factory.mktemp("admin-schemas")
    door, admin_door = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    broker = start_broker(tmp_path, "--grpc-listen", f"http://{door}", "--grpc-admin-listen", f"http://{admin_door}")
    try:
        yield Doors(broker, door, admin_door)
    finally:
        assert broker.stop() == 0, broker.log()


def _stubs(channel: grpc.aio.Channel) -> SimpleNamespace:
    return SimpleNamespace(schemas=spb_grpc.SchemaRegistryStub(channel), topics=apb_grpc.TopicAdminStub(channel),
                           namespaces=apb_grpc.NamespaceAdminStub(channel), brokers=apb_grpc.BrokerAdminStub(channel))


@pytest.fixture
async def admin(doors: Doors) -> AsyncIterator[SimpleNamespace]:
    """Stubs on the admin door, once the broker has registered (its topics get placed)."""
    async with grpc.aio.insecure_channel(doors.admin_door) as channel:
        stubs = _stubs(channel)
        async with asyncio.timeout(30):  # the admin door binds last in the broker's start
            await channel.channel_ready()
            while not (await stubs.brokers.ListBrokers(apb.Empty())).brokers:
                await asyncio.sleep(0.05)
        yield stubs


@pytest.fixture
async def client_door(doors: Doors) -> AsyncIterator[SimpleNamespace]:
    async with grpc.aio.insecure_channel(doors.door) as channel:
        async with asyncio.timeout(30):
            await channel.channel_ready()
        yield _stubs(channel)


async def test_danube_admin_schema_admin_operations(admin: SimpleNamespace) -> None:
    """danube-admin's `schema_admin_operations` scenario against the admin door: the
    compatibility mode read and set, a topic bound with ENFORCE and payload validation,
    its policy changed to WARN without its subject, a second topic bound with NONE, a
    second version registered under FULL and deleted. (`schemas delete` without
    --confirm fails in danube-admin itself, before any call.)"""
    ns, subject = "ns-admin-ops", "admin-events-schema"
    topic, topic2 = f"/{ns}/admin-test-events", f"/{ns}/admin-test-events-2"
    await admin.namespaces.CreateNamespace(apb.NamespaceRequest(name=ns))  # namespaces create
    # schemas register admin-events-schema --schema-type json_schema --file ...
    v1 = await admin.schemas.RegisterSchema(spb.RegisterSchemaRequest(
        subject=subject, schema_type="json_schema", schema_definition=ADMIN_EVENT_V1, description="",
        created_by=CREATED_BY, tags=[]))
    assert (v1.version, v1.is_new_version) == (1, True)

    # schemas get-compatibility admin-events-schema --output json (prints it in capitals)
    latest = await admin.schemas.GetLatestSchema(spb.GetLatestSchemaRequest(subject=subject))
    assert latest.compatibility_mode.upper() == "BACKWARD"
    # schemas set-compatibility admin-events-schema --mode full (sent in capitals)
    assert (await admin.schemas.SetCompatibilityMode(spb.SetCompatibilityModeRequest(
        subject=subject, compatibility_mode="FULL"))).success
    latest = await admin.schemas.GetLatestSchema(spb.GetLatestSchemaRequest(subject=subject))
    assert latest.compatibility_mode.upper() == "FULL"

    # topics create /ns/admin-test-events (dispatch strategy non_reliable by default)
    assert (await admin.topics.CreateTopic(apb.NewTopicRequest(name=topic, dispatch_strategy=apb.NonReliable))).success
    # topics configure-schema ... --subject admin-events-schema --validation-policy enforce
    #   --enable-payload-validation (the policy sent in capitals)
    configured = await admin.schemas.ConfigureTopicSchema(spb.ConfigureTopicSchemaRequest(
        topic_name=topic, schema_subject=subject, validation_policy="ENFORCE", enable_payload_validation=True))
    assert configured.success and subject in configured.message
    # topics get-schema-config ... --output json
    config = await admin.schemas.GetTopicSchemaConfig(spb.GetTopicSchemaConfigRequest(topic_name=topic))
    assert (config.schema_subject, config.validation_policy.upper(), config.enable_payload_validation) == (
        subject, "ENFORCE", True)
    assert config.schema_id == v1.schema_id

    # topics set-validation-policy ... --policy warn --enable-payload-validation
    updated = await admin.schemas.UpdateTopicValidationPolicy(spb.UpdateTopicValidationPolicyRequest(
        topic_name=topic, validation_policy="WARN", enable_payload_validation=True))
    assert updated.success and "Warn" in updated.message
    config = await admin.schemas.GetTopicSchemaConfig(spb.GetTopicSchemaConfigRequest(topic_name=topic))
    assert (config.schema_subject, config.validation_policy.upper(), config.enable_payload_validation) == (
        subject, "WARN", True)

    # topics create /ns/admin-test-events-2; topics configure-schema ... --validation-policy none
    await admin.topics.CreateTopic(apb.NewTopicRequest(name=topic2, dispatch_strategy=apb.NonReliable))
    assert (await admin.schemas.ConfigureTopicSchema(spb.ConfigureTopicSchemaRequest(
        topic_name=topic2, schema_subject=subject, validation_policy="NONE", enable_payload_validation=False))).success
    config = await admin.schemas.GetTopicSchemaConfig(spb.GetTopicSchemaConfigRequest(topic_name=topic2))
    assert (config.validation_policy, config.enable_payload_validation) == ("none", False)

    # schemas register ... (v2: one more optional property, FULL compatible); schemas
    # delete admin-events-schema --version 2 --confirm
    v2 = await admin.schemas.RegisterSchema(spb.RegisterSchemaRequest(
        subject=subject, schema_type="json_schema", schema_definition=ADMIN_EVENT_V2, created_by=CREATED_BY))
    assert (v2.version, v2.is_new_version) == (2, True)
    assert (await admin.schemas.DeleteSchemaVersion(spb.DeleteSchemaVersionRequest(subject=subject, version=2))).success
    versions = await admin.schemas.ListVersions(spb.ListVersionsRequest(subject=subject))
    assert [v.version for v in versions.versions] == [1]

    # topics delete (both); namespaces delete
    for name in (topic, topic2):
        assert (await admin.topics.DeleteTopic(apb.TopicRequest(name=name))).success
    await admin.namespaces.DeleteNamespace(apb.NamespaceRequest(name=ns))


async def test_danube_admin_schema_registry_lifecycle(admin: SimpleNamespace) -> None:
    """danube-admin's `schema_registry_lifecycle` scenario against the admin door: a
    schema registered, read by subject and listed; a topic created with that subject and
    described with all five schema fields; a topic without one described with none; the
    same definition checked compatible."""
    ns, subject = "ns-lifecycle", "test-events-schema"
    topic, plain = f"/{ns}/events", f"/{ns}/logs"
    await admin.namespaces.CreateNamespace(apb.NamespaceRequest(name=ns))  # namespaces create
    # schemas register test-events-schema --schema-type json_schema --file ...
    registered = await admin.schemas.RegisterSchema(spb.RegisterSchemaRequest(
        subject=subject, schema_type="json_schema", schema_definition=TEST_EVENT, created_by=CREATED_BY))
    assert registered.version == 1
    # schemas get --subject test-events-schema --output json
    got = await admin.schemas.GetLatestSchema(spb.GetLatestSchemaRequest(subject=subject))
    assert (got.subject, got.schema_id, got.schema_type) == (subject, registered.schema_id, "json_schema")
    assert json.loads(got.schema_definition) == json.loads(TEST_EVENT)
    # schemas versions test-events-schema --output json
    versions = await admin.schemas.ListVersions(spb.ListVersionsRequest(subject=subject))
    assert [(v.version, v.schema_id) for v in versions.versions] == [(1, registered.schema_id)]

    # topics create /ns/events --schema-subject test-events-schema
    assert (await admin.topics.CreateTopic(apb.NewTopicRequest(
        name=topic, schema_subject=subject, dispatch_strategy=apb.NonReliable))).success
    # topics describe /ns/events --output json
    described = await admin.topics.DescribeTopic(apb.DescribeTopicRequest(name=topic))
    assert (described.schema_subject, described.schema_id, described.schema_version, described.schema_type,
            described.compatibility_mode) == (subject, registered.schema_id, 1, "json_schema", "BACKWARD")

    # topics create /ns/logs; topics describe /ns/logs --output json: no schema fields
    await admin.topics.CreateTopic(apb.NewTopicRequest(name=plain, dispatch_strategy=apb.NonReliable))
    described = await admin.topics.DescribeTopic(apb.DescribeTopicRequest(name=plain))
    for field in ("schema_subject", "schema_id", "schema_version", "schema_type", "compatibility_mode"):
        assert not described.HasField(field), field

    # schemas check test-events-schema --file ... --schema-type json_schema (no --mode)
    check = await admin.schemas.CheckCompatibility(spb.CheckCompatibilityRequest(
        subject=subject, new_schema_definition=TEST_EVENT, schema_type="json_schema"))
    assert check.is_compatible and not check.errors

    for name in (topic, plain):  # topics delete; namespaces delete
        assert (await admin.topics.DeleteTopic(apb.TopicRequest(name=name))).success
    await admin.namespaces.DeleteNamespace(apb.NamespaceRequest(name=ns))


async def test_a_binding_made_on_the_admin_door_is_enforced_and_read_on_both_doors(
        doors: Doors, admin: SimpleNamespace, client_door: SimpleNamespace) -> None:
    """ConfigureTopicSchema on the admin door binds the topic for native producers
    (ENFORCE with payload validation refuses an invalid payload and a message without the
    schema); both doors read the same configuration; the client door's
    UpdateTopicValidationPolicy relaxes it for the producers already attached."""
    topic, subject = "/default/door-enforced", "door-orders"
    registered = await admin.schemas.RegisterSchema(spb.RegisterSchemaRequest(
        subject=subject, schema_type="json_schema", schema_definition=ORDER))
    await admin.schemas.ConfigureTopicSchema(spb.ConfigureTopicSchemaRequest(
        topic_name=topic, schema_subject=subject, validation_policy="ENFORCE", enable_payload_validation=True))
    request = spb.GetTopicSchemaConfigRequest(topic_name=topic)
    on_admin = await admin.schemas.GetTopicSchemaConfig(request)
    assert on_admin == await client_door.schemas.GetTopicSchemaConfig(request)
    assert (on_admin.schema_subject, on_admin.validation_policy, on_admin.enable_payload_validation,
            on_admin.schema_id) == (subject, "enforce", True, registered.schema_id)

    async with DanubeClient(doors.broker.url) as native:
        typed = await native.create_producer(topic, schema_subject=subject, batching=False)
        plain = await native.create_producer(topic, batching=False)
        await typed.send(b'{"id": 1}')
        with pytest.raises(InvalidArgument, match=f"does not match schema '{subject}'"):
            await typed.send(b'{"id": "one"}')
        with pytest.raises(FailedPrecondition, match=f"enforces schema subject '{subject}'"):
            await plain.send(b"no schema")

        await client_door.schemas.UpdateTopicValidationPolicy(spb.UpdateTopicValidationPolicyRequest(
            topic_name=topic, validation_policy="none", enable_payload_validation=False))
        on_client = await client_door.schemas.GetTopicSchemaConfig(request)
        assert on_client == await admin.schemas.GetTopicSchemaConfig(request)
        assert (on_client.schema_subject, on_client.validation_policy, on_client.enable_payload_validation) == (
            subject, "none", False)
        # The watch of bindings tells the topic: the attached producer needs no re-attach.
        deadline = time.monotonic() + 5
        while True:
            try:
                await plain.send(b"no schema")
                break
            except FailedPrecondition:
                assert time.monotonic() < deadline, "the relaxed policy never reached the topic"
                await asyncio.sleep(0.05)
        await typed.send(b'{"id": "one"}')  # no payload validation any more


async def test_topic_binding_errors_keep_danubes_codes(admin: SimpleNamespace) -> None:
    """What Danube refuses, refused with its codes: a validation policy it does not know
    (INVALID_ARGUMENT, before anything else), a subject not registered (NOT_FOUND), a
    policy update on a topic with no subject (FAILED_PRECONDITION). A topic without a
    schema reads as Danube's empty configuration."""
    topic = "/default/door-unbound"
    await admin.topics.CreateTopic(apb.NewTopicRequest(name=topic, dispatch_strategy=apb.Reliable))
    await admin.schemas.RegisterSchema(spb.RegisterSchemaRequest(subject="door-known", schema_type="json_schema",
                                                                 schema_definition=ORDER))
    for call, code in (
        (admin.schemas.ConfigureTopicSchema(spb.ConfigureTopicSchemaRequest(
            topic_name=topic, schema_subject="door-known", validation_policy="strict")),
         grpc.StatusCode.INVALID_ARGUMENT),
        (admin.schemas.ConfigureTopicSchema(spb.ConfigureTopicSchemaRequest(
            topic_name=topic, schema_subject="door-known", validation_policy="")), grpc.StatusCode.INVALID_ARGUMENT),
        (admin.schemas.UpdateTopicValidationPolicy(spb.UpdateTopicValidationPolicyRequest(
            topic_name=topic, validation_policy="strict")), grpc.StatusCode.INVALID_ARGUMENT),
        (admin.schemas.ConfigureTopicSchema(spb.ConfigureTopicSchemaRequest(
            topic_name=topic, schema_subject="door-unknown", validation_policy="warn")), grpc.StatusCode.NOT_FOUND),
        (admin.schemas.UpdateTopicValidationPolicy(spb.UpdateTopicValidationPolicyRequest(
            topic_name=topic, validation_policy="enforce")), grpc.StatusCode.FAILED_PRECONDITION),
        (admin.schemas.GetTopicSchemaConfig(spb.GetTopicSchemaConfigRequest(topic_name="no-namespace")),
         grpc.StatusCode.INVALID_ARGUMENT),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await call
        assert refused.value.code() == code, refused.value.details()
    config = await admin.schemas.GetTopicSchemaConfig(spb.GetTopicSchemaConfigRequest(topic_name=topic))
    assert config == spb.GetTopicSchemaConfigResponse(schema_subject="", validation_policy="none",
                                                      enable_payload_validation=False, schema_id=0)


# --------------------------------------------------------------------------- RBAC


@dataclass
class Secured:
    admin_door: str  # host:port, TLS
    ca_file: Path
    alice: str  # a super admin's token
    carol: str  # a token whose subject may only look up (bound below)
    bob: str  # a token whose subject holds no role


def _bearer(token: str | None) -> tuple[tuple[str, str], ...] | None:
    return None if token is None else (("authorization", f"Bearer {token}"),)


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    tmp_path = tmp_path_factory.mktemp("admin-schemas-secured")
    keys = make_curve_keys(tmp_path / "keys")
    secret, secret_env = write_jwt_secret(tmp_path)
    cert, key = self_signed_cert(tmp_path)
    admin_door = f"127.0.0.1:{free_port()}"
    signer = TokenSigner("HS256", secret, issuer="danube", audience="danube", now_s=time.time)
    broker = start_broker(tmp_path, "--grpc-admin-listen", f"http://{admin_door}",
                          env={**keys.broker_env(), **secret_env, "DANUBE_SECURITY__GRPC_TLS_CERT_FILE": str(cert),
                               "DANUBE_SECURITY__GRPC_TLS_KEY_FILE": str(key)})
    try:
        yield Secured(admin_door, cert, signer.create("alice", "user", 600), signer.create("carol", "user", 600),
                      signer.create("bob", "user", 600))
    finally:
        assert broker.stop() == 0, broker.log()


async def test_rbac_decides_the_admin_doors_schema_registry(secured: Secured) -> None:
    """The caller's token decides, as for `danube admin` and a native client: a
    super admin binds a topic; a token allowed only Lookup reads the binding and the
    subjects but may neither bind nor register (PERMISSION_DENIED); a token without a
    role may not even read; no token is UNAUTHENTICATED."""
    credentials = grpc.ssl_channel_credentials(secured.ca_file.read_bytes())
    async with grpc.aio.secure_channel(secured.admin_door, credentials) as channel:
        async with asyncio.timeout(30):
            await channel.channel_ready()
        stubs = _stubs(channel)
        alice = _bearer(secured.alice)
        security = apb_grpc.SecurityAdminStub(channel)
        await security.CreateRole(apb.CreateRoleRequest(role=apb.RoleDefinition(name="schema-reader",
                                                                                permissions=["Lookup"])),
                                  metadata=alice)
        await security.CreateBinding(apb.CreateBindingRequest(binding=apb.BindingDefinition(
            principal_type="user", principal_name="carol", role_names=["schema-reader"], scope="cluster")),
            metadata=alice)
        await stubs.schemas.RegisterSchema(spb.RegisterSchemaRequest(
            subject="secured-orders", schema_type="json_schema", schema_definition=ORDER), metadata=alice)
        bind = spb.ConfigureTopicSchemaRequest(topic_name="/default/secured-orders", schema_subject="secured-orders",
                                               validation_policy="ENFORCE")
        await stubs.schemas.ConfigureTopicSchema(bind, metadata=alice)
        read = spb.GetTopicSchemaConfigRequest(topic_name="/default/secured-orders")
        assert (await stubs.schemas.GetTopicSchemaConfig(read, metadata=alice)).schema_subject == "secured-orders"

        carol = _bearer(secured.carol)
        async with asyncio.timeout(10):  # the binding reaches the broker's RBAC through its watch
            while True:
                try:
                    config = await stubs.schemas.GetTopicSchemaConfig(read, metadata=carol)
                    break
                except grpc.aio.AioRpcError as exc:
                    assert exc.code() == grpc.StatusCode.PERMISSION_DENIED, exc.details()
                    await asyncio.sleep(0.05)
        assert config.validation_policy == "enforce"
        assert "secured-orders" in {s.subject for s in (await stubs.schemas.ListSubjects(
            spb.ListSubjectsRequest(), metadata=carol)).subjects}
        for call in (lambda: stubs.schemas.ConfigureTopicSchema(bind, metadata=carol),
                     lambda: stubs.schemas.UpdateTopicValidationPolicy(spb.UpdateTopicValidationPolicyRequest(
                         topic_name="/default/secured-orders", validation_policy="none"), metadata=carol),
                     lambda: stubs.schemas.RegisterSchema(spb.RegisterSchemaRequest(
                         subject="secured-orders", schema_type="json_schema", schema_definition=ORDER),
                         metadata=carol)):
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await call()
            assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED, refused.value.details()

        for token, code in ((secured.bob, grpc.StatusCode.PERMISSION_DENIED),
                            (None, grpc.StatusCode.UNAUTHENTICATED)):
            for call in (lambda m: stubs.schemas.GetTopicSchemaConfig(read, metadata=m),
                         lambda m: stubs.schemas.ListSubjects(spb.ListSubjectsRequest(), metadata=m)):
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await call(_bearer(token))
                assert refused.value.code() == code, refused.value.details()
        # Nothing the refused calls asked for happened.
        config = await stubs.schemas.GetTopicSchemaConfig(read, metadata=alice)
        assert (config.validation_policy, config.schema_subject) == ("enforce", "secured-orders")

"""The gRPC doors of a broker in security.mode curve: TLS, and Danube's bearer tokens
carried onto the broker's own authentication and RBAC (docs/danube-compat.md, Security).

One real broker with JWTs (alice a super admin, bob a token with no role) and both doors
on TLS with a self-signed certificate. Danube's client (`danube-client` from PyPI)
produces and consumes with alice's token; refusals are checked with grpcio stubs, which
show the exact status code.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from danube_zmq.security.tokens import TokenSigner
from danube_zmq.transport.danube_proto import DanubeAdmin_pb2 as apb
from danube_zmq.transport.danube_proto import DanubeAdmin_pb2_grpc as apb_grpc
from danube_zmq.transport.danube_proto import DanubeApi_pb2 as pb
from danube_zmq.transport.danube_proto import DanubeApi_pb2_grpc as pb_grpc
from danube_zmq.transport.danube_proto import SchemaRegistry_pb2 as spb
from danube_zmq.transport.danube_proto import SchemaRegistry_pb2_grpc as spb_grpc
from tests.integration.conftest import BrokerProcess, free_port, make_curve_keys, start_broker, write_jwt_secret
from tests.tls_certs import self_signed_cert

danube = pytest.importorskip("danube", reason="danube-client (the test extra) is not installed")

RECEIVE_TIMEOUT_S = 10.0


@dataclass
class SecuredDoors:
    broker: BrokerProcess
    door: str  # host:port of the client door
    admin_door: str  # host:port of the admin door
    ca_file: Path
    alice: str  # a super admin's token
    bob: str  # a token whose subject holds no role

    def channel(self) -> grpc.aio.Channel:
        return grpc.aio.secure_channel(self.door, grpc.ssl_channel_credentials(self.ca_file.read_bytes()))

    def admin_channel(self) -> grpc.aio.Channel:
        return grpc.aio.secure_channel(self.admin_door, grpc.ssl_channel_credentials(self.ca_file.read_bytes()))


def bearer(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


@pytest.fixture(scope="module")
def doors(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecuredDoors]:
    tmp_path = tmp_path_factory.mktemp("secured-doors")
    keys = make_curve_keys(tmp_path / "keys")
    secret, secret_env = write_jwt_secret(tmp_path)
    cert, key = self_signed_cert(tmp_path)
    door, admin_door = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    signer = TokenSigner("HS256", secret, issuer="danube", audience="danube", now_s=time.time)
    alice = signer.create("alice", "user", 600)
    # A super admin's token in the broker's environment, as an operator's shell may hold
    # it: the doors must never lend it to a caller without one.
    broker = start_broker(tmp_path, "--grpc-listen", f"http://{door}",
                          env={**keys.broker_env(), **secret_env, "DANUBE_BROKER__GRPC_ADMIN_LISTEN": f"http://{admin_door}",
                               "DANUBE_SECURITY__GRPC_TLS_CERT_FILE": str(cert),
                               "DANUBE_SECURITY__GRPC_TLS_KEY_FILE": str(key), "DANUBE_TOKEN": alice})
    try:
        yield SecuredDoors(broker, door, admin_door, cert, alice, signer.create("bob", "user", 600))
    finally:
        assert broker.stop() == 0, broker.log()


async def _ready(channel: grpc.aio.Channel) -> None:
    async with asyncio.timeout(10):  # the first TLS handshake, bounded
        await channel.channel_ready()


async def round_trip(client: danube.DanubeClient, topic: str, count: int) -> None:
    """A reliable producer and an Exclusive consumer of Danube's client on `topic`: `count`
    messages sent, received in order and acked."""
    producer = (client.new_producer().with_topic(topic).with_name("p1")
                .with_dispatch_strategy(danube.DispatchStrategy.RELIABLE).build())
    await producer.create()
    consumer = (client.new_consumer().with_topic(topic).with_consumer_name("c1").with_subscription("s1")
                .with_subscription_type(danube.SubType.EXCLUSIVE).build())
    await consumer.subscribe()
    queue = await consumer.receive()
    await asyncio.sleep(0.3)  # the stream is open before the first message
    for i in range(count):
        await producer.send(f"m{i}".encode(), {})
    got = []
    async with asyncio.timeout(RECEIVE_TIMEOUT_S):
        while len(got) < count:
            got.append(await queue.get())
    assert [m.payload for m in got] == [f"m{i}".encode() for i in range(count)]
    for message in got:
        await consumer.ack(message)
    await consumer.close()
    await producer.close()


async def test_danube_client_over_tls_with_a_token_produces_and_consumes(doors: SecuredDoors) -> None:
    client = await (danube.DanubeClientBuilder().service_url(f"https://{doors.door}")
                    .with_tls(str(doors.ca_file)).with_token(doors.alice).build())
    await round_trip(client, "/default/secured-door", 5)


async def test_no_token_is_unauthenticated_and_no_role_is_denied(doors: SecuredDoors) -> None:
    """The broker decides, as for a native client: anonymous is refused under curve,
    a token without a role may not produce, consume, or look up."""
    async with doors.channel() as channel:
        producers, consumers = pb_grpc.ProducerServiceStub(channel), pb_grpc.ConsumerServiceStub(channel)
        create = pb.ProducerRequest(request_id=1, producer_name="p", topic_name="/default/secured-refused")
        subscribe = pb.ConsumerRequest(request_id=2, topic_name="/default/secured-refused", consumer_name="c",
                                       subscription="s")
        for metadata, code in ((None, grpc.StatusCode.UNAUTHENTICATED),
                               (bearer("not-a-jwt"), grpc.StatusCode.UNAUTHENTICATED),
                               ((("authorization", "Basic YWxpY2U6eA=="),), grpc.StatusCode.UNAUTHENTICATED),
                               (bearer(doors.bob), grpc.StatusCode.PERMISSION_DENIED)):
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await producers.CreateProducer(create, metadata=metadata)
            assert refused.value.code() == code, (metadata, refused.value.details())
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await consumers.Subscribe(subscribe, metadata=metadata)
            assert refused.value.code() == code, (metadata, refused.value.details())
        lookup = pb_grpc.DiscoveryStub(channel).TopicLookup(pb.TopicLookupRequest(request_id=3,
                                                                                  topic="/default/secured-refused"))
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await lookup
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        schemas = spb_grpc.SchemaRegistryStub(channel)
        await schemas.ListSubjects(spb.ListSubjectsRequest(), metadata=bearer(doors.alice))
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await schemas.ListSubjects(spb.ListSubjectsRequest())
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED


async def test_a_producer_answers_only_the_token_that_created_it(doors: SecuredDoors) -> None:
    async with doors.channel() as channel:
        producers = pb_grpc.ProducerServiceStub(channel)
        created = await producers.CreateProducer(
            pb.ProducerRequest(request_id=1, producer_name="alices", topic_name="/default/secured-owned"),
            metadata=bearer(doors.alice))
        send = pb.StreamMessage(request_id=2, msg_id=pb.MsgID(producer_id=created.producer_id), payload=b"x")
        await producers.SendMessage(send, metadata=bearer(doors.alice))
        for metadata in (bearer(doors.bob), None):
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await producers.SendMessage(send, metadata=metadata)
            assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED, refused.value.details()
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await pb_grpc.HealthCheckStub(channel).HealthCheck(
                    pb.HealthCheckRequest(request_id=3, client=pb.HealthCheckRequest.Producer, id=created.producer_id),
                    metadata=metadata)
            assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
        consumers = pb_grpc.ConsumerServiceStub(channel)
        subscribed = await consumers.Subscribe(
            pb.ConsumerRequest(request_id=5, topic_name="/default/secured-owned", consumer_name="alices-c",
                               subscription="s"), metadata=bearer(doors.alice))
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            async for _ in consumers.ReceiveMessages(pb.ReceiveRequest(request_id=6,
                                                                       consumer_id=subscribed.consumer_id),
                                                     metadata=bearer(doors.bob)):
                pass
        assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
        # Bob naming alice's producer creates his own, which the broker refuses him.
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await producers.CreateProducer(
                pb.ProducerRequest(request_id=4, producer_name="alices", topic_name="/default/secured-owned"),
                metadata=bearer(doors.bob))
        assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED


async def test_plaintext_to_the_tls_door_fails(doors: SecuredDoors) -> None:
    async with grpc.aio.insecure_channel(doors.door) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await pb_grpc.DiscoveryStub(channel).TopicLookup(pb.TopicLookupRequest(request_id=1, topic="/default/x"),
                                                             metadata=bearer(doors.alice), timeout=5)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_admin_door_takes_the_callers_token(doors: SecuredDoors) -> None:
    async with doors.admin_channel() as channel:
        await _ready(channel)
        brokers = apb_grpc.BrokerAdminStub(channel)
        assert "default" in (await brokers.ListNamespaces(apb.Empty(), metadata=bearer(doors.alice))).namespaces
        for metadata, code in ((None, grpc.StatusCode.UNAUTHENTICATED),
                               (bearer(doors.bob), grpc.StatusCode.PERMISSION_DENIED)):
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await brokers.ListNamespaces(apb.Empty(), metadata=metadata)
            assert refused.value.code() == code, refused.value.details()
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await apb_grpc.NamespaceAdminStub(channel).CreateNamespace(apb.NamespaceRequest(name="bobs"),
                                                                           metadata=metadata)
            assert refused.value.code() == code, refused.value.details()
        # Alice's clients are kept for alice: bob still gets his own refusal after her call.
        assert "default" in (await brokers.ListNamespaces(apb.Empty(), metadata=bearer(doors.alice))).namespaces
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await brokers.ListNamespaces(apb.Empty(), metadata=bearer(doors.bob))
        assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED


async def test_storage_service_is_the_brokers_to_allow(doors: SecuredDoors) -> None:
    """Danube's StorageService skips RBAC; ours lists a topic's segments only to a caller
    the broker lets look the topic up."""
    topic = "/default/secured-storage"
    async with doors.channel() as channel:
        await pb_grpc.ProducerServiceStub(channel).CreateProducer(
            pb.ProducerRequest(request_id=1, producer_name="p", topic_name=topic), metadata=bearer(doors.alice))
        storage = pb_grpc.StorageServiceStub(channel)
        listing = pb.ListSegmentDescriptorsRequest(topic=topic)
        answer = await storage.ListSegmentDescriptors(listing, metadata=bearer(doors.alice))
        assert list(answer.segments) == []  # local storage mode: nothing uploaded
        for metadata, code in ((None, grpc.StatusCode.UNAUTHENTICATED),
                               (bearer(doors.bob), grpc.StatusCode.PERMISSION_DENIED)):
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await storage.ListSegmentDescriptors(listing, metadata=metadata)
            assert refused.value.code() == code, (metadata, refused.value.details())

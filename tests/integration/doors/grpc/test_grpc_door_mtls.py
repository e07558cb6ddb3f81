"""The gRPC doors with mutual TLS (`security.grpc_tls_client_ca_file`): a client must
show a certificate the clients' CA signed before any call, and its bearer token stays
its identity (docs/security.md, "Danube's gRPC doors").

One real broker in security.mode curve with both doors on TLS: its certificate signed by
one CA (what clients trust), its clients' certificates by another (what it trusts).
Danube's client (`danube-client`, `with_mtls`) produces and consumes; refusals are
checked with grpcio stubs.
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
from tests.integration.conftest import BrokerProcess, free_port, make_curve_keys, start_broker, write_jwt_secret
from tests.tls_certs import certificate_authority

danube = pytest.importorskip("danube", reason="danube-client (the test extra) is not installed")

from tests.integration.doors.grpc.test_grpc_door_security import round_trip  # noqa: E402  (needs danube-client)


@dataclass
class MutualDoors:
    broker: BrokerProcess
    door: str  # host:port of the client door
    admin_door: str  # host:port of the admin door
    server_ca: Path  # what clients trust: it signed the doors' certificate
    client_cert: Path  # alice's client certificate, signed by the clients' CA
    client_key: Path
    alice: str  # a super admin's token
    bob: str  # a token whose subject holds no role
    # Client certificates the doors must refuse, with why.
    strangers: dict[str, tuple[Path, Path]]

    def credentials(self, cert: tuple[Path, Path] | None = None) -> grpc.ChannelCredentials:
        trust = self.server_ca.read_bytes()
        if cert is None:
            return grpc.ssl_channel_credentials(trust)
        return grpc.ssl_channel_credentials(trust, cert[1].read_bytes(), cert[0].read_bytes())

    @property
    def good(self) -> tuple[Path, Path]:
        return self.client_cert, self.client_key


def bearer(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


@pytest.fixture(scope="module")
def doors(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MutualDoors]:
    tmp_path = tmp_path_factory.mktemp("mtls-doors")
    keys = make_curve_keys(tmp_path / "keys")
    secret, secret_env = write_jwt_secret(tmp_path)
    for name in ("server-ca", "client-ca", "other-ca"):
        (tmp_path / name).mkdir()
    server_ca = certificate_authority(tmp_path / "server-ca", "server-ca")
    client_ca = certificate_authority(tmp_path / "client-ca", "client-ca")
    other_ca = certificate_authority(tmp_path / "other-ca", "other-ca")
    cert, key = server_ca.issue("door", client=False)
    client_cert, client_key = client_ca.issue("alice", client=True)
    strangers = {"signed by another CA": other_ca.issue("mallory", client=True),
                 # The CA that signed the doors' own certificate is not the clients' CA.
                 "signed by the server's CA": server_ca.issue("eve", client=True)}
    door, admin_door = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    signer = TokenSigner("HS256", secret, issuer="danube", audience="danube", now_s=time.time)
    broker = start_broker(tmp_path, "--grpc-listen", f"http://{door}",
                          env={**keys.broker_env(), **secret_env, "DANUBE_BROKER__GRPC_ADMIN_LISTEN": f"http://{admin_door}",
                               "DANUBE_SECURITY__GRPC_TLS_CERT_FILE": str(cert),
                               "DANUBE_SECURITY__GRPC_TLS_KEY_FILE": str(key),
                               "DANUBE_SECURITY__GRPC_TLS_CLIENT_CA_FILE": str(client_ca.cert_file)})
    try:
        yield MutualDoors(broker, door, admin_door, server_ca.cert_file, client_cert, client_key,
                          signer.create("alice", "user", 600), signer.create("bob", "user", 600), strangers)
    finally:
        assert broker.stop() == 0, broker.log()


async def test_danube_client_with_mtls_produces_and_consumes(doors: MutualDoors) -> None:
    client = await (danube.DanubeClientBuilder().service_url(f"https://{doors.door}")
                    .with_mtls(str(doors.server_ca), str(doors.client_cert), str(doors.client_key))
                    .with_token(doors.alice).build())
    await round_trip(client, "/default/mtls-door", 3)


async def _lookup(doors: MutualDoors, cert: tuple[Path, Path] | None, metadata: object) -> object:
    async with grpc.aio.secure_channel(doors.door, doors.credentials(cert)) as channel:
        return await pb_grpc.DiscoveryStub(channel).TopicLookup(
            pb.TopicLookupRequest(request_id=1, topic="/default/mtls-lookup"), metadata=metadata, timeout=10)


async def _namespaces(doors: MutualDoors, cert: tuple[Path, Path] | None, metadata: object) -> object:
    async with grpc.aio.secure_channel(doors.admin_door, doors.credentials(cert)) as channel:
        return await apb_grpc.BrokerAdminStub(channel).ListNamespaces(apb.Empty(), metadata=metadata, timeout=10)


@pytest.mark.parametrize("call", [_lookup, _namespaces], ids=["client door", "admin door"])
async def test_a_client_without_a_certificate_the_clients_ca_signed_is_refused(doors: MutualDoors, call: object) -> None:
    """No certificate, or one another CA signed, fails the handshake (UNAVAILABLE) even
    with a super admin's token; a good certificate admits the connection, and the token
    still decides: none is UNAUTHENTICATED, bob's is PERMISSION_DENIED."""
    assert callable(call)
    for why, cert in {"no certificate": None, **doors.strangers}.items():
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await call(doors, cert, bearer(doors.alice))
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE, (why, refused.value.details())
    await call(doors, doors.good, bearer(doors.alice))
    for metadata, code in ((None, grpc.StatusCode.UNAUTHENTICATED), (bearer(doors.bob), grpc.StatusCode.PERMISSION_DENIED)):
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await call(doors, doors.good, metadata)
        assert refused.value.code() == code, refused.value.details()


async def test_admin_door_names_itself_https(doors: MutualDoors) -> None:
    """ListBrokers' admin_addr is the broker's gRPC admin door, as Danube's admin tools
    dial it, https since it serves TLS; the broker's start line says so too."""
    async with grpc.aio.secure_channel(doors.admin_door, doors.credentials(doors.good)) as channel:
        brokers = apb_grpc.BrokerAdminStub(channel)
        async with asyncio.timeout(10):
            while not (listed := await brokers.ListBrokers(apb.Empty(), metadata=bearer(doors.alice))).brokers:
                await asyncio.sleep(0.05)  # the broker registers just after its ports answer
    (me,) = listed.brokers
    assert (me.broker_addr, me.admin_addr) == (doors.broker.url, f"https://{doors.admin_door}")
    assert f"gRPC https://{doors.door}, gRPC admin https://{doors.admin_door}" in doors.broker.log()

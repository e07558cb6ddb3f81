"""The gRPC doors' caller handling (`doors/grpc/auth.py`) without a broker."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
import pytest

from danube_zmq.doors.grpc.auth import DoorSecurity, PerCaller, bearer_token
from danube_zmq.transport.errors import ConfigError, Unauthenticated
from tests.tls_certs import certificate_authority, self_signed_cert


class Context:
    def __init__(self, *metadata: tuple[str, str]) -> None:
        self.metadata = metadata

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self.metadata


def test_bearer_token() -> None:
    assert bearer_token(Context()) is None  # type: ignore[arg-type]
    assert bearer_token(Context(("x-other", "1"), ("authorization", "Bearer abc.def"))) == "abc.def"  # type: ignore[arg-type]
    assert bearer_token(Context(("authorization", "bearer  abc "))) == "abc"  # type: ignore[arg-type]
    for bad in ("Basic YWxpY2U6eA==", "Bearer", "Bearer   ", "abc"):
        with pytest.raises(Unauthenticated, match="must be 'Bearer <jwt>'"):
            bearer_token(Context(("authorization", bad)))  # type: ignore[arg-type]


def test_credentials_never_read_the_environment() -> None:
    assert DoorSecurity().credentials("t") == {"use_env": False, "context": None}
    assert DoorSecurity(server_public_key=b"k" * 40).credentials(None) == {
        "server_public_key": b"k" * 40, "token": None, "use_env": False, "context": None}


async def test_bad_certificate_is_a_config_error(tmp_path: Path) -> None:
    cert, key = self_signed_cert(tmp_path)
    server = grpc.aio.server()
    assert DoorSecurity(tls_cert_file=str(cert), tls_key_file=str(key)).bind(server, "127.0.0.1:0", "door") > 0
    (tmp_path / "bad.pem").write_text("not a certificate")
    with pytest.raises(ConfigError, match=r"security.grpc_tls_cert_file / _key_file \(for door\): cannot load"):
        DoorSecurity(tls_cert_file=str(tmp_path / "bad.pem"), tls_key_file=str(key)).bind(server, "127.0.0.1:0", "door")
    with pytest.raises(ConfigError, match="cannot read"):
        DoorSecurity(tls_cert_file=str(tmp_path / "none.pem"), tls_key_file=str(key)).bind(server, "127.0.0.1:0", "d")
    await server.stop(None)


async def _echo_server(security: DoorSecurity) -> tuple[grpc.aio.Server, int]:
    """A server with one unary method, /test.Echo/Say, that answers its request."""

    async def say(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        return request

    server = grpc.aio.server()
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("test.Echo", {
        "Say": grpc.unary_unary_rpc_method_handler(say)})])
    port = security.bind(server, "127.0.0.1:0", "door")
    await server.start()
    return server, port


async def _say(port: int, credentials: grpc.ChannelCredentials) -> bytes:
    async with grpc.aio.secure_channel(f"127.0.0.1:{port}", credentials) as channel:
        return await channel.unary_unary("/test.Echo/Say")(b"hi", timeout=5)


async def test_client_ca_requires_a_certificate_it_signed(tmp_path: Path) -> None:
    """With a client CA the door completes a TLS handshake only with a client that shows
    a certificate that CA signed: none, or one from another CA, is refused."""
    (tmp_path / "ours").mkdir()
    (tmp_path / "theirs").mkdir()
    ours, theirs = certificate_authority(tmp_path / "ours", "ours"), certificate_authority(tmp_path / "theirs", "theirs")
    cert, key = ours.issue("door", client=False)
    server, port = await _echo_server(DoorSecurity(tls_cert_file=str(cert), tls_key_file=str(key),
                                                   tls_client_ca_file=str(ours.cert_file)))
    try:
        trust = ours.cert_file.read_bytes()
        good_cert, good_key = ours.issue("alice", client=True)
        other_cert, other_key = theirs.issue("mallory", client=True)
        for credentials in (grpc.ssl_channel_credentials(trust),
                            grpc.ssl_channel_credentials(trust, other_key.read_bytes(), other_cert.read_bytes())):
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await _say(port, credentials)
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE, refused.value.details()
        good = grpc.ssl_channel_credentials(trust, good_key.read_bytes(), good_cert.read_bytes())
        assert await _say(port, good) == b"hi"
    finally:
        await server.stop(None)


async def test_bad_client_ca_is_a_config_error(tmp_path: Path) -> None:
    cert, key = self_signed_cert(tmp_path)
    server = grpc.aio.server()
    (tmp_path / "bad-ca.pem").write_text("not a certificate")
    with pytest.raises(ConfigError, match=r"security.grpc_tls_client_ca_file \(for door\): cannot load .*bad-ca.pem"):
        DoorSecurity(tls_cert_file=str(cert), tls_key_file=str(key),
                     tls_client_ca_file=str(tmp_path / "bad-ca.pem")).bind(server, "127.0.0.1:0", "door")
    with pytest.raises(ConfigError, match=r"security.grpc_tls_client_ca_file \(for door\): cannot read .*none.pem"):
        DoorSecurity(tls_cert_file=str(cert), tls_key_file=str(key),
                     tls_client_ca_file=str(tmp_path / "none.pem")).bind(server, "127.0.0.1:0", "door")
    await server.stop(None)


async def test_per_caller_keeps_each_callers_own_and_closes_the_least_recent() -> None:
    closed: list[Any] = []

    async def open_client(caller: str | None) -> list[str | None]:
        return [caller]

    async def close_client(client: list[str | None]) -> None:
        closed.append(client[0])

    clients: PerCaller[list[str | None]] = PerCaller(open_client, close_client, 2)
    alice = await clients.get("alice")
    assert await clients.get("alice") is alice and await clients.get(None) == [None]
    await clients.get("alice")  # alice is now the most recent: None goes first
    await clients.get("bob")
    assert closed == [None]
    await clients.drop("bob")
    assert closed == [None, "bob"]
    await clients.close()
    assert closed == [None, "bob", "alice"]

"""The gRPC doors' caller handling (`actors/grpc_door_auth.py`) without a broker."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
import pytest

from danube_zmq.actors.grpc_door_auth import DoorSecurity, PerCaller, bearer_token
from danube_zmq.transport.errors import ConfigError, Unauthenticated
from tests.tls_certs import self_signed_cert


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
    assert DoorSecurity().credentials("t") == {"use_env": False}
    assert DoorSecurity(server_public_key=b"k" * 40).credentials(None) == {
        "server_public_key": b"k" * 40, "token": None, "use_env": False}


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

"""Who a gRPC door call is, and how the door acts for it (`doors/grpc/client_door.py`,
`doors/grpc/admin_door.py`).

Danube's clients send their JWT as `authorization: Bearer <jwt>` metadata on every call.
The doors never decide anything about it: each native connection a door opens for a
caller dials this broker's own ports with that caller's token and a fresh CURVE key pair
(the broker binds a token to the connection's key), never the broker's key pair, so the
broker authenticates and authorizes the caller exactly as a native client. A call
without a token dials anonymously, which a `curve` broker refuses (UNAUTHENTICATED).
There is no internal-broker header nor any other way to act as the broker.

Under `security.mode curve` a door serves TLS only (`security.grpc_tls_cert_file` /
`_key_file`, checked by the config), so that a token never crosses in clear.
With `security.grpc_tls_client_ca_file` the doors also require a client certificate
that CA signed (mutual TLS): it decides who may connect at all, not who the caller is;
the bearer token stays the identity the broker authorizes.
"""

from __future__ import annotations

import dataclasses
import ssl
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Generic, TypeVar

import grpc
import zmq
import zmq.asyncio

from danube_zmq.transport.errors import ConfigError, PermissionDenied, Unauthenticated

Caller = str | None  # the caller's token; None: anonymous
C = TypeVar("C")


def bearer_token(context: grpc.aio.ServicerContext) -> Caller:
    """The token of `authorization: Bearer <jwt>`, None without the header. Another
    scheme or an empty token is refused, not taken as anonymous: the caller meant one."""
    for key, value in context.invocation_metadata() or ():
        if key.lower() != "authorization":
            continue
        text = value.decode("utf-8", "replace") if isinstance(value, bytes) else value
        scheme, _, token = text.strip().partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise Unauthenticated("the authorization metadata must be 'Bearer <jwt>'")
        return token.strip()
    return None


def check_owner(owner: Caller, caller: Caller, what: str) -> None:
    """A producer or consumer answers only calls with the token that created it: the
    broker authorized that token, not the caller's."""
    if owner != caller:
        raise PermissionDenied(f"{what} was created with another token")


@dataclasses.dataclass(frozen=True, slots=True)
class DoorSecurity:
    """How a door serves (TLS or not) and dials its broker for a caller (CURVE or not)."""

    # The cluster's CURVE public key (Z85), None with security.mode none.
    server_public_key: bytes | None = None
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    # The CAs of the clients' certificates: set, the doors require mutual TLS.
    tls_client_ca_file: str | None = None
    # The ZeroMQ context the door's native clients open their sockets in (the door's
    # own, `with_context`): one I/O thread for them all, not one and a few descriptors
    # per client (grpc_door_limits.NATIVE_CLIENT_FDS).
    context: zmq.asyncio.Context | None = None

    def with_context(self) -> DoorSecurity:
        """The same, with a context of its own for a door to open clients in (and
        destroy when it stops)."""
        context = zmq.asyncio.Context()
        context.setsockopt(zmq.LINGER, 0)
        # A client holds a few sockets (its DEALER, a handshake monitor's pair): lift
        # libzmq's default of 1023 sockets a context, as the broker's own context does.
        context.set(zmq.MAX_SOCKETS, 65_536)
        return dataclasses.replace(self, context=context)

    @property
    def scheme(self) -> str:
        """How a door that binds with this security names itself: https when it serves TLS,
        as Danube names its TLS brokers and as danube-admin picks TLS from an address."""
        return "https" if self.tls_cert_file is not None else "http"

    def credentials(self, caller: Caller) -> dict[str, Any]:
        """The native client's keyword arguments for `caller`: their token and a fresh
        key pair (client_keys left out), none of the broker's environment."""
        shared = {"use_env": False, "context": self.context}
        if self.server_public_key is None:
            return shared  # security.mode none: the broker reads no token
        return {"server_public_key": self.server_public_key, "token": caller, **shared}

    def bind(self, server: grpc.aio.Server, address: str, key: str) -> int:
        """Bind `address` (HOST:PORT) with TLS when configured; the bound port, 0 if not."""
        if self.tls_cert_file is None or self.tls_key_file is None:
            return server.add_insecure_port(address)
        try:
            cert = Path(self.tls_cert_file).read_bytes()
            private = Path(self.tls_key_file).read_bytes()
        except OSError as exc:
            raise ConfigError(f"security.grpc_tls_cert_file / _key_file (for {key}): cannot read"
                              f" {exc.filename!r}: {exc.strerror}") from None
        try:
            # Checked here first: grpc logs why it cannot use them, and raises only "Failed to bind".
            ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(self.tls_cert_file, self.tls_key_file)
        except ssl.SSLError as exc:
            raise ConfigError(f"security.grpc_tls_cert_file / _key_file (for {key}): cannot load"
                              f" {self.tls_cert_file!r} and {self.tls_key_file!r}: {exc.reason or exc}") from None
        client_ca = self._client_ca(key)
        credentials = grpc.ssl_server_credentials([(private, cert)], root_certificates=client_ca,
                                                  require_client_auth=client_ca is not None)
        return server.add_secure_port(address, credentials)

    def _client_ca(self, key: str) -> bytes | None:
        """The client CA certificates (PEM), None without mutual TLS; checked as the
        server's pair is, for the same reason."""
        if self.tls_client_ca_file is None:
            return None
        try:
            pem = Path(self.tls_client_ca_file).read_bytes()
        except OSError as exc:
            raise ConfigError(f"security.grpc_tls_client_ca_file (for {key}): cannot read {exc.filename!r}:"
                              f" {exc.strerror}") from None
        try:
            ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_verify_locations(cadata=pem.decode("ascii"))
        except (ssl.SSLError, UnicodeDecodeError) as exc:
            reason = exc.reason if isinstance(exc, ssl.SSLError) else "not PEM text"
            raise ConfigError(f"security.grpc_tls_client_ca_file (for {key}): cannot load"
                              f" {self.tls_client_ca_file!r} as PEM CA certificates: {reason or exc}") from None
        return pem


class PerCaller(Generic[C]):
    """Connected native clients kept per caller, the least recently used closed past
    `size`: a lookup or schema call need not open a connection (and a CURVE handshake)
    each time, and no caller's connection ever serves another."""

    def __init__(self, open_client: Callable[[Caller], Awaitable[C]], close_client: Callable[[C], Awaitable[None]],
                 size: int) -> None:
        self._open = open_client
        self._close = close_client
        self._size = size
        self._clients: OrderedDict[Caller, C] = OrderedDict()

    async def get(self, caller: Caller) -> C:
        client = self._clients.get(caller)
        if client is not None:
            self._clients.move_to_end(caller)
            return client
        client = await self._open(caller)
        if caller in self._clients:  # another call connected it meanwhile
            await self._close(client)
            return self._clients[caller]
        self._clients[caller] = client
        while len(self._clients) > self._size:
            _, oldest = self._clients.popitem(last=False)
            await self._close(oldest)
        return client

    async def drop(self, caller: Caller) -> None:
        """Forget `caller`'s client (it failed): the next call connects afresh."""
        client = self._clients.pop(caller, None)
        if client is not None:
            await self._close(client)

    async def close(self) -> None:
        clients, self._clients = list(self._clients.values()), OrderedDict()
        for client in clients:
            await self._close(client)

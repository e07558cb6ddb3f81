"""The request/reply plumbing the admin and schema-registry clients share: one zmq
DEALER, a `Connect` handshake, one request at a time with a fresh `request_id`, the
reply with the same id (or `Error`, raised as its `DanubeError`), a bounded wait.

    RequestClient ── DEALER ──tcp──▶ ROUTER (the broker's admin or client port)

A late reply to a request that already timed out is recognised by its id and dropped.
Requests go one at a time (control traffic is low-rate), so there is no pending map:
the caller awaits each reply before sending the next request.

With a token (`token`, `token_provider` or DANUBE_TOKEN) the broker knows the caller by
the token its `Connect` carried on this TCP connection. libzmq reconnects a DEALER
silently (a broker restart, a dropped link), so the socket's handshakes are watched (a
socket monitor) and `Connect` is sent again before the first request after one. A
request answered UNAUTHENTICATED is sent once more after a new `Connect` when a reconnect
raced it or a provider can give a new token; with a fixed token the refusal is raised.
Without a token nothing is watched and `Connect` is sent once, as before.

A request refused as `BROKER_STARTING` (the port is bound, the actors behind it are not
up yet, nothing was done) is sent again after a pause, within the request's timeout.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from types import TracebackType
from typing import ClassVar, Self, TypeVar

import zmq
import zmq.asyncio

from danube_zmq.rpc.tokens import TokenProvider, TokenSource, token_source
from danube_zmq.security.curve import ClientCurve, ClientKeys, ServerKey, client_curve
from danube_zmq.security.handshake import HandshakeWatch, race_handshake
from danube_zmq.transport.codec import Message, Protocol
from danube_zmq.transport.common import PROTOCOL_VERSION, Connect, Connected, Error
from danube_zmq.transport.errors import (
    BROKER_STARTING,
    InternalError,
    InvalidArgument,
    Unauthenticated,
    Unavailable,
    UnsupportedVersion,
    error_from_code,
)

__all__ = ["RequestClient", "check_endpoint"]

log = logging.getLogger(__name__)

R = TypeVar("R", bound=Message)
# Builds a request from its request_id.
_Builder = Callable[[int], Message]

# Largest reply frame we accept. A topic list or description of a big cluster
# stays far below; anything larger is a broken peer, refused by libzmq itself.
_REPLY_BYTES_MAX = 64 * 1024 * 1024
# Requests go one at a time, so a handful of queued frames is plenty; the
# bound keeps a dead broker from buffering without limit.
_QUEUE_MESSAGES_MAX = 16
# Stale replies (to requests that timed out) skipped while waiting for one
# reply, before we call the peer broken.
_STALE_REPLIES_MAX = 1000
# Pauses between asks of a broker that is still starting (doubling): its actors are
# spawned within a second or so of its ports being bound.
_STARTING_PAUSE_S = 0.05
_STARTING_PAUSE_MAX_S = 0.5


def check_endpoint(endpoint: str, what: str = "broker endpoint") -> str:
    """Return `endpoint` if it looks like a ZeroMQ endpoint, else raise InvalidArgument.

    Catches the usual slip of pasting a Danube (gRPC) URL such as
    `http://127.0.0.1:50051` before libzmq answers with a bare "Invalid argument".
    """
    if endpoint.startswith(("http://", "https://")):
        rest = endpoint.split("://", 1)[1]
        raise InvalidArgument(f"invalid {what} {endpoint!r}: danube-zmq speaks ZeroMQ, use tcp://{rest}")
    if not endpoint.startswith(("tcp://", "ipc://", "inproc://")):
        raise InvalidArgument(f"invalid {what} {endpoint!r}: expected tcp://host:port (or ipc://path)")
    return endpoint


class RequestClient:
    """Subclasses set `PROTOCOL` (the tag table of the port they talk to) and `WHAT`."""

    PROTOCOL: ClassVar[Protocol]
    WHAT: ClassVar[str] = "endpoint"

    def __init__(
        self,
        endpoint: str,
        *,
        timeout_ms: int = 5000,
        client_name: str = "danube-client",
        server_public_key: ServerKey | None = None,
        client_keys: ClientKeys | None = None,
        token: str | None = None,
        token_provider: TokenProvider | None = None,
        use_env: bool = True,
        context: zmq.asyncio.Context | None = None,
    ) -> None:
        """`server_public_key` (Z85 or a `.key` file) makes the connection CURVE; `client_keys`
        (a `.key_secret` file or a (public, secret) pair; default a fresh pair) are this
        client's. `token` (a JWT) or `token_provider` (a callable, sync or async, returning
        one; asked at every `Connect` and after UNAUTHENTICATED) goes in `Connect`. Left
        None, they come from DANUBE_SERVER_KEY, DANUBE_CLIENT_KEYS and DANUBE_TOKEN unless
        `use_env` is False (a broker's own clients, configured by the broker alone).
        `context`: a ZeroMQ context of the caller's to open the socket in (a gRPC door's,
        shared by its many clients), never terminated here; default one of our own."""
        if timeout_ms <= 0:
            raise InvalidArgument(f"timeout_ms must be > 0, got {timeout_ms}")
        self.endpoint = check_endpoint(endpoint, self.WHAT)
        self.timeout_ms = timeout_ms
        self.client_name = client_name
        self.curve: ClientCurve | None = client_curve(server_public_key, client_keys,
                                                      env=os.environ if use_env else None)
        self._tokens: TokenSource | None = token_source(token, token_provider, env=os.environ if use_env else None)
        self._reconnects: _Reconnects | None = None  # watched only when Connect carries a token
        self.sessions_opened = 0
        """`Connect`s answered: 1 after `connect()`, one more per reconnect or renewal."""
        self._shared_context = context
        self._context: zmq.asyncio.Context | None = None
        self._socket: zmq.asyncio.Socket | None = None
        self._next_request_id = 1
        self.connected: Connected | None = None
        """The broker's `Connected` answer once `connect()` succeeded."""

    # -- lifecycle ---------------------------------------------------------

    async def __aenter__(self) -> Self:
        try:
            await self.connect()
        except BaseException:
            self.close()
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    async def connect(self) -> Connected:
        """Open the socket and do the `Connect` handshake."""
        assert self._socket is None, "connect() called twice"
        self._context = self._shared_context or zmq.asyncio.Context()
        sock = self._context.socket(zmq.DEALER)
        # Linger 0: a request to a dead broker must not keep the process alive at exit.
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, _QUEUE_MESSAGES_MAX)
        sock.setsockopt(zmq.RCVHWM, _QUEUE_MESSAGES_MAX)
        sock.setsockopt(zmq.MAXMSGSIZE, _REPLY_BYTES_MAX)
        if self.curve is not None:
            self.curve.apply(sock)
        self._socket = sock
        # A refused handshake (CURVE against plaintext, a wrong server key) fails Connect
        # at once with its cause, instead of a timeout.
        watch = HandshakeWatch(sock, self._context, url=self.endpoint, curve=self.curve is not None)
        try:
            sock.connect(self.endpoint)
        except zmq.ZMQError as err:
            watch.close()
            raise InvalidArgument(
                f"invalid {self.WHAT} {self.endpoint!r}: {err.strerror}"
            ) from None
        reply = await race_handshake(watch, self._open_session())
        if self._tokens is not None:
            self._reconnects = _Reconnects(sock, self._context)
        return reply

    async def _open_session(self) -> Connected:
        """One `Connect` round trip, with the token (a provider's is asked anew)."""
        token = await self._tokens.get() if self._tokens is not None else None
        reply = await self._request(
            lambda rid: Connect(
                request_id=rid,
                protocol_version=PROTOCOL_VERSION,
                client_name=self.client_name,
                auth_token=token,
            ),
            Connected,
        )
        if reply.protocol_version != PROTOCOL_VERSION:
            raise UnsupportedVersion(
                f"the broker at {self.endpoint} speaks protocol version "
                f"{reply.protocol_version}, this client {PROTOCOL_VERSION}"
            )
        self.connected = reply
        self.sessions_opened += 1
        return reply

    def close(self) -> None:
        """Close the socket and its context; idempotent."""
        if self._reconnects is not None:
            self._reconnects.close(self._socket)
            self._reconnects = None
        if self._socket is not None:
            self._socket.close(linger=0)
            self._socket = None
        if self._context is not None and self._context is not self._shared_context:
            self._context.term()
        self._context = None


    # -- plumbing ----------------------------------------------------------

    async def _call(self, build: _Builder, expected: type[R], *, timeout_ms: int | None = None) -> R:
        if self.connected is None:
            raise InternalError(f"{type(self).__name__} is not connected; use `async with {type(self).__name__}(...)`")
        reconnects = self._reconnects
        if reconnects is None:
            return await self._request(build, expected, timeout_ms=timeout_ms)
        if reconnects.seen():
            await self._open_session()  # a new TCP connection: the broker has no token for it
        try:
            return await self._request(build, expected, timeout_ms=timeout_ms)
        except Unauthenticated:
            # A reconnect that raced the request, or an expired token a provider renews:
            # a new Connect, then the request once more. Otherwise the refusal stands.
            assert self._tokens is not None
            if not (reconnects.seen() or self._tokens.renewable):
                raise
        await self._open_session()
        return await self._request(build, expected, timeout_ms=timeout_ms)

    async def _request(self, build: _Builder, expected: type[R], *, timeout_ms: int | None = None) -> R:
        """Send one request and return its reply, or raise what the broker said; the
        answer is awaited `timeout_ms` (default: the client's timeout). A broker that
        refuses it as still starting (`BROKER_STARTING`: nothing was done) is asked again
        until then, as a broker whose port is not bound yet is waited for."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (timeout_ms or self.timeout_ms) / 1000
        pause_s = _STARTING_PAUSE_S
        while True:
            try:
                return await self._exchange(build, expected, deadline)
            except Unavailable as exc:
                if exc.message != BROKER_STARTING or loop.time() + pause_s >= deadline:
                    raise
            await asyncio.sleep(pause_s)
            pause_s = min(pause_s * 2, _STARTING_PAUSE_MAX_S)

    async def _exchange(self, build: _Builder, expected: type[R], deadline: float) -> R:
        sock = self._socket
        assert sock is not None
        request_id = self._next_request_id
        self._next_request_id += 1
        request = build(request_id)
        loop = asyncio.get_running_loop()
        frame = self.PROTOCOL.encode(request)
        try:
            async with asyncio.timeout(self.timeout_ms / 1000):
                await sock.send(frame)
        except TimeoutError:
            raise self._no_answer() from None
        for _ in range(_STALE_REPLIES_MAX):
            remaining_ms = int((deadline - loop.time()) * 1000)
            if remaining_ms <= 0 or not await sock.poll(remaining_ms, zmq.POLLIN):
                raise self._no_answer()
            reply = self.PROTOCOL.decode(await sock.recv())
            if reply.request_id != request_id:  # type: ignore[attr-defined]
                # The answer to an earlier request that we gave up on.
                log.debug("dropping stale reply %s", type(reply).__name__)
                continue
            if isinstance(reply, Error):
                raise error_from_code(reply.code, reply.message)
            if not isinstance(reply, expected):
                raise InternalError(
                    f"the broker answered {type(request).__name__} with "
                    f"{type(reply).__name__}, expected {expected.__name__}"
                )
            return reply
        raise InternalError(f"the broker at {self.endpoint} sent too many stale replies")

    def _no_answer(self) -> Unavailable:
        return Unavailable(
            f"no answer from the broker at {self.endpoint} within "
            f"{self.timeout_ms / 1000:g} s; is it running?"
        )



class _Reconnects:
    """Whether a socket completed a new ZMTP handshake (libzmq reconnected it) since it
    was last asked: a socket monitor of handshakes, read without waiting."""

    def __init__(self, sock: zmq.Socket, context: zmq.asyncio.Context) -> None:
        address = f"inproc://danube-rpc-reconnects-{id(self):x}"
        sock.monitor(address, zmq.EVENT_HANDSHAKE_SUCCEEDED)
        # A plain socket on the same context: read with NOBLOCK only, never awaited.
        self._monitor: zmq.Socket | None = zmq.Context.shadow(context.underlying).socket(zmq.PAIR)
        self._monitor.setsockopt(zmq.LINGER, 0)
        self._monitor.connect(address)

    def seen(self) -> bool:
        seen = False
        while self._monitor is not None:
            try:
                self._monitor.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            seen = True
        return seen

    def close(self, sock: zmq.Socket | None) -> None:
        if sock is not None and not sock.closed:
            try:
                sock.disable_monitor()
            except zmq.ZMQError:
                pass
        if self._monitor is not None:
            self._monitor.close(linger=0)
            self._monitor = None

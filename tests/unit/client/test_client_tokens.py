"""Tokens on the client side (docs/security.md, "Clients"): the JWT a client sends in
its `Connect` on the client and admin ports, renewed through a token provider when the
broker answers UNAUTHENTICATED, raised with the broker's reason when fixed, and never
shown in a repr or a log.

The brokers here are fakes in the test's loop (`FakeBroker` of test_client_fake_broker,
and a small admin ROUTER below) that keep a token per connection and refuse requests
whose token they no longer accept, as a secured broker does once a token expires.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest
import zmq
import zmq.asyncio

from danube_zmq.client import DanubeClient
from danube_zmq.client.admin import AdminClient
from danube_zmq.client.schemas import SchemaRegistryClient
from danube_zmq.rpc.tokens import TokenSource, read_token_file, token_source
from danube_zmq.transport import client_protocol as cp
from danube_zmq.transport.admin_protocol import ADMIN_PROTOCOL, ListNamespaces, NamespaceList
from danube_zmq.transport.client_protocol import CreateProducer, GetPartitions
from danube_zmq.transport.codec import Message
from danube_zmq.transport.common import PROTOCOL_VERSION, Connect, Connected, Error, Ping
from danube_zmq.transport.errors import ErrorCode, InvalidArgument, Unauthenticated
from tests.unit.client.test_client_fake_broker import FakeBroker, eventually

EXPIRED = "token expired 3 s ago (exp 1700000000)"


@dataclass
class TokenBroker(FakeBroker):
    """A `FakeBroker` that keeps each session's token and answers UNAUTHENTICATED to a
    Connect or a request whose token is not (or no longer) in `accepted`."""

    accepted: set[str] = field(default_factory=set)
    session_tokens: dict[bytes, str | None] = field(default_factory=dict)
    refusals: int = 0

    async def _handle(self, identity: bytes, msg: Message) -> None:
        request_id = getattr(msg, "request_id", 0)
        if isinstance(msg, Connect):
            if msg.auth_token not in self.accepted:
                self.refusals += 1
                await self._reply(identity, Error(request_id=request_id, code=ErrorCode.UNAUTHENTICATED,
                                                  message="token refused: bad signature"))
                return
            self.session_tokens[identity] = msg.auth_token
        elif (identity in self.sessions and not isinstance(msg, Ping) and hasattr(msg, "request_id")
              and self.session_tokens.get(identity) not in self.accepted):
            self.refusals += 1
            await self._reply(identity, Error(request_id=request_id, code=ErrorCode.UNAUTHENTICATED, message=EXPIRED))
            return
        await super()._handle(identity, msg)


@contextlib.asynccontextmanager
async def token_broker(*accepted: str) -> AsyncIterator[TokenBroker]:
    broker = TokenBroker(accepted=set(accepted))
    await broker.start()
    try:
        yield broker
    finally:
        await broker.stop()


class Provider:
    """A token provider handing out tokens in turn; counts its calls."""

    def __init__(self, *tokens: str, asynchronous: bool = False) -> None:
        self.tokens = list(tokens)
        self.calls = 0
        self.asynchronous = asynchronous

    def _next(self) -> str:
        self.calls += 1
        return self.tokens[min(self.calls, len(self.tokens)) - 1]

    def __call__(self) -> object:
        if not self.asynchronous:
            return self._next()

        async def later() -> str:
            await asyncio.sleep(0)
            return self._next()

        return later()


# ------------------------------------------------------------------- client port


@pytest.mark.asyncio
async def test_connect_carries_the_token_on_the_client_port(monkeypatch: pytest.MonkeyPatch) -> None:
    """`DanubeClient(token=...)` sends the token in its Connect; without one, DANUBE_TOKEN
    is sent; with neither, Connect carries none."""
    monkeypatch.delenv("DANUBE_TOKEN", raising=False)
    async with token_broker("tok-a", "tok-env") as broker:
        async with DanubeClient(broker.url, token="tok-a", request_timeout_ms=2_000) as client:
            await client.create_producer("/default/t")
        monkeypatch.setenv("DANUBE_TOKEN", "tok-env")
        async with DanubeClient(broker.url, request_timeout_ms=2_000):
            pass
        assert [c.auth_token for c in broker.of(Connect)] == ["tok-a", "tok-env"]
    monkeypatch.delenv("DANUBE_TOKEN")
    async with token_broker() as broker:
        broker.accepted.add(None)  # type: ignore[arg-type]  # a broker without tokens
        async with DanubeClient(broker.url, request_timeout_ms=2_000):
            pass
        assert [c.auth_token for c in broker.of(Connect)] == [None]


@pytest.mark.asyncio
@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync-provider", "async-provider"])
async def test_a_provider_is_asked_again_after_unauthenticated_and_the_request_retried(asynchronous: bool) -> None:
    """When the session's token expires the broker answers UNAUTHENTICATED; the client
    asks its provider (sync or async) for a new token, sends Connect again with it,
    re-creates its producer under the same name, and the refused send and a later
    request succeed: the caller sees no error."""
    provider = Provider("tok-1", "tok-2", asynchronous=asynchronous)
    async with token_broker("tok-1") as broker:
        async with DanubeClient(broker.url, token_provider=provider, request_timeout_ms=2_000) as client:
            producer = await client.create_producer("/default/t", name="p1")
            await producer.send(b"before")
            assert provider.calls == 1
            broker.accepted = {"tok-2"}  # tok-1 expired
            await producer.send(b"after")
            assert await client.get_partitions("/default/t") == ["/default/t"]
            assert provider.calls == 2
            assert [c.auth_token for c in broker.of(Connect)] == ["tok-1", "tok-2"]
            assert [m.producer_name for m in broker.of(CreateProducer)] == ["p1", "p1"]
            assert [e.payload for e in broker.logs["/default/t"]] == [b"before", b"after"]
            assert broker.refusals == 1
            assert client.statistics().connections[0].token_renewals == 1


@pytest.mark.asyncio
async def test_a_fixed_token_refused_raises_unauthenticated_with_the_reason() -> None:
    """With a fixed token, UNAUTHENTICATED reaches the caller as `Unauthenticated`
    carrying the broker's reason, is not retried, and no new Connect is sent."""
    async with token_broker("tok-1") as broker:
        async with DanubeClient(broker.url, token="tok-1", request_timeout_ms=2_000) as client:
            await client.create_producer("/default/t")
            broker.accepted = set()
            with pytest.raises(Unauthenticated, match="token expired 3 s ago") as info:
                await client.get_partitions("/default/t")
            assert info.value.retriable is False
            assert len(broker.of(GetPartitions)) == 2  # create_producer's, then the refused one
            assert len(broker.of(Connect)) == 1


@pytest.mark.asyncio
async def test_a_token_refused_at_connect_fails_start_and_a_failing_provider_is_named() -> None:
    """A Connect refused for its token fails `start` with the broker's reason; a provider
    that raises fails it with `Unauthenticated` naming the provider's error."""
    async with token_broker("good") as broker:
        client = DanubeClient(broker.url, token="bad", request_timeout_ms=2_000)
        with pytest.raises(Unauthenticated, match="bad signature"):
            await client.start()
        await client.close()

        def broken() -> str:
            raise OSError("identity service down")

        client = DanubeClient(broker.url, token_provider=broken, request_timeout_ms=2_000)
        with pytest.raises(Unauthenticated, match="token_provider raised OSError: identity service down"):
            await client.start()
        await client.close()


@pytest.mark.asyncio
async def test_the_token_never_appears_in_a_repr_or_a_log(caplog: pytest.LogCaptureFixture) -> None:
    """Through a whole renewal, logged at DEBUG, neither token appears in the log, nor in
    the repr of the client, its token source, or a Connect that carries it."""
    secret_1, secret_2 = "eyJSECRET.one.sig", "eyJSECRET.two.sig"
    caplog.set_level(logging.DEBUG)
    provider = Provider(secret_1, secret_2)
    async with token_broker(secret_1) as broker:
        async with DanubeClient(broker.url, token_provider=provider, request_timeout_ms=2_000) as client:
            producer = await client.create_producer("/default/t")
            broker.accepted = {secret_2}
            await producer.send(b"x")
            shown = [repr(client), repr(client._tokens), repr(client.statistics()), *map(repr, broker.of(Connect))]
        assert provider.calls == 2
    fixed = TokenSource(token=secret_1)
    shown += [repr(fixed), repr(token_source(secret_1))]
    assert "refused the session's token" in caplog.text  # the renewal was logged, without the token
    for text in [caplog.text, *shown]:
        assert "SECRET" not in text


def test_a_token_source_refuses_what_is_not_a_token(tmp_path: object) -> None:
    """Both a token and a provider, an empty or blank token, or a file that holds no
    token are InvalidArgument, and the message never quotes the value."""
    with pytest.raises(InvalidArgument, match="not both"):
        token_source("a", lambda: "b")
    for bad in ("", "two words", "x" * 20_000):
        with pytest.raises(InvalidArgument) as info:
            TokenSource(token=bad)
        assert bad not in str(info.value) or bad == ""
    from pathlib import Path

    path = Path(str(tmp_path)) / "token"
    path.write_text("eyJhbGc.payload.sig\n")
    assert read_token_file(str(path)) == "eyJhbGc.payload.sig"
    with pytest.raises(InvalidArgument, match="cannot read the token file"):
        read_token_file(str(path) + ".missing")


# ------------------------------------------------------------------- admin port


@dataclass
class FakeAdminBroker:
    """An admin ROUTER: Connect opens a session holding its token (refused when not in
    `accepted`); ListNamespaces without a session, or with a token no longer accepted,
    is answered UNAUTHENTICATED. `restart()` forgets every session, on the same port."""

    accepted: set[str | None] = field(default_factory=set)
    port: int = 0
    received: list[Message] = field(default_factory=list)
    sessions: dict[bytes, str | None] = field(default_factory=dict)
    refusals: int = 0
    _context: zmq.asyncio.Context | None = None
    _socket: zmq.asyncio.Socket | None = None
    _task: asyncio.Task[None] | None = None

    @property
    def url(self) -> str:
        return f"tcp://127.0.0.1:{self.port}"

    async def start(self) -> None:
        self._context = zmq.asyncio.Context()
        sock = self._context.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        if self.port:
            sock.bind(self.url)
        else:
            self.port = sock.bind_to_random_port("tcp://127.0.0.1")
        self._socket = sock
        self._task = asyncio.get_running_loop().create_task(self._serve())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._socket is not None:
            self._socket.close(linger=0)
        if self._context is not None:
            self._context.destroy(linger=0)
        self._task = self._socket = self._context = None

    async def restart(self) -> None:
        await self.stop()
        self.sessions.clear()
        await asyncio.sleep(0.05)
        await self.start()

    def of(self, msg_type: type) -> list:
        return [m for m in self.received if type(m) is msg_type]

    async def _serve(self) -> None:
        assert self._socket is not None
        while True:
            identity, frame = await self._socket.recv_multipart()
            msg = ADMIN_PROTOCOL.decode(frame)
            self.received.append(msg)
            await self._socket.send_multipart([identity, ADMIN_PROTOCOL.encode(self._answer(identity, msg))])

    def _answer(self, identity: bytes, msg: Message) -> Message:
        request_id = msg.request_id  # type: ignore[attr-defined]
        if isinstance(msg, Connect):
            if msg.auth_token not in self.accepted:
                self.refusals += 1
                return Error(request_id=request_id, code=ErrorCode.UNAUTHENTICATED, message="token refused: revoked")
            self.sessions[identity] = msg.auth_token
            return Connected(request_id=request_id, protocol_version=PROTOCOL_VERSION, broker_id=1,
                             broker_url="tcp://fake:6650", frame_bytes_max=1 << 20, message_bytes_max=1 << 19,
                             heartbeat_interval_ms=1_000, session_timeout_ms=10_000)
        if identity not in self.sessions or self.sessions[identity] not in self.accepted:
            self.refusals += 1
            reason = EXPIRED if identity in self.sessions else "no token on this connection: send Connect"
            return Error(request_id=request_id, code=ErrorCode.UNAUTHENTICATED, message=reason)
        assert isinstance(msg, ListNamespaces)
        return NamespaceList(request_id=request_id, namespaces=["default"])


@contextlib.asynccontextmanager
async def admin_broker(*accepted: str | None) -> AsyncIterator[FakeAdminBroker]:
    broker = FakeAdminBroker(accepted=set(accepted))
    await broker.start()
    try:
        yield broker
    finally:
        await broker.stop()


@pytest.mark.asyncio
async def test_admin_connect_carries_the_token_and_without_one_nothing_is_watched(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """`AdminClient(token=...)` (and DANUBE_TOKEN) sends the token in its Connect; without
    a token there is one Connect and no reconnect watch, as before tokens."""
    monkeypatch.delenv("DANUBE_TOKEN", raising=False)
    async with admin_broker("tok-a", "tok-env", None) as broker:
        async with AdminClient(broker.url, token="tok-a") as admin:
            assert await admin.list_namespaces() == ["default"]
            assert admin._reconnects is not None
        monkeypatch.setenv("DANUBE_TOKEN", "tok-env")
        async with AdminClient(broker.url) as admin:
            await admin.list_namespaces()
        async with AdminClient(broker.url, use_env=False) as admin:  # a broker's own client
            await admin.list_namespaces()
            assert admin._reconnects is None
        assert [c.auth_token for c in broker.of(Connect)] == ["tok-a", "tok-env", None]


@pytest.mark.asyncio
@pytest.mark.parametrize("renewable", [False, True], ids=["fixed-token", "provider"])
async def test_admin_connect_is_sent_again_after_a_reconnect(renewable: bool) -> None:
    """The broker restarts and forgets every session; libzmq reconnects the DEALER on its
    own. The next admin request still succeeds: Connect (with the token) goes again on
    the new connection before it, with a fixed token as with a provider."""
    async with admin_broker("tok") as broker:
        options = {"token_provider": lambda: "tok"} if renewable else {"token": "tok"}
        async with AdminClient(broker.url, timeout_ms=3_000, **options) as admin:  # type: ignore[arg-type]
            await admin.list_namespaces()
            await broker.restart()
            assert await admin.list_namespaces() == ["default"]
            assert admin.sessions_opened == 2
        connects = broker.of(Connect)
        assert [c.auth_token for c in connects] == ["tok", "tok"]
        # The last request came after the second Connect, on the new connection.
        assert broker.received.index(connects[1]) < len(broker.received) - 1


@pytest.mark.asyncio
async def test_admin_renews_through_its_provider_and_a_fixed_token_raises() -> None:
    """An admin request refused UNAUTHENTICATED is sent once more after a Connect with the
    provider's new token; with a fixed token the refusal is raised with its reason and
    the request is not sent again."""
    provider = Provider("tok-1", "tok-2")
    async with admin_broker("tok-1") as broker:
        async with AdminClient(broker.url, token_provider=provider) as admin:
            await admin.list_namespaces()
            broker.accepted = {"tok-2"}
            assert await admin.list_namespaces() == ["default"]
        assert [c.auth_token for c in broker.of(Connect)] == ["tok-1", "tok-2"]
        assert len(broker.of(ListNamespaces)) == 3
    async with admin_broker("tok-1") as broker:
        async with AdminClient(broker.url, token="tok-1") as admin:
            await admin.list_namespaces()
            broker.accepted = set()
            with pytest.raises(Unauthenticated, match="token expired 3 s ago"):
                await admin.list_namespaces()
        assert len(broker.of(ListNamespaces)) == 2
        assert len(broker.of(Connect)) == 1


@pytest.mark.asyncio
async def test_the_schema_registry_client_sends_the_token() -> None:
    """`SchemaRegistryClient(token=...)` sends the token in the Connect on the client port."""
    async with token_broker("tok-s") as broker:
        async with SchemaRegistryClient(broker.url, token="tok-s") as registry:
            assert registry.connected is not None
        assert [c.auth_token for c in broker.of(Connect)] == ["tok-s"]
    assert cp.CLIENT_PROTOCOL is SchemaRegistryClient.PROTOCOL


@pytest.mark.asyncio
async def test_a_reconnect_after_a_lost_connection_asks_the_provider_again() -> None:
    """After the broker restarts (sessions gone), the client's re-handshake asks its
    provider for a token again: a reconnect may come after the old one expired."""
    provider = Provider("tok-1", "tok-2")
    async with token_broker("tok-1", "tok-2") as broker:
        async with DanubeClient(broker.url, token_provider=provider, request_timeout_ms=2_000) as client:
            producer = await client.create_producer("/default/t", name="p1")
            await broker.restart()
            await eventually(lambda: len(broker.of(Connect)) >= 2, timeout_s=10, what="re-handshake")
            await producer.send(b"x")
        assert [c.auth_token for c in broker.of(Connect)][:2] == ["tok-1", "tok-2"]

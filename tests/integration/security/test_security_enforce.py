"""The permission check against a real broker in security.mode curve, with JWT tokens.

One broker for the module (`secured`): CURVE, an HS256 secret, no clock-skew leeway
(so a token's expiry is seen at once), and `alice` a super admin whose client key is on
the allow-list; she sets roles and bindings through AdminClient or the CLI. Tokens are
minted with `TokenSigner` and given to the client API (`token=`, `token_provider=`); one
test speaks the wire itself (`Raw`, a DEALER sending frames), where the point is what a
refused `Send` batch does in the broker. Each test uses principals and topics of its
own. A decision that a change in the store must alter is polled for with a generous
deadline (the broker's watch applies it within a round). The full matrix of credentials
x requests is test_security_matrix.py.
"""

from __future__ import annotations

import asyncio
import os
import re
import secrets
import subprocess
import sys
import time
import urllib.request
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import pytest
import zmq

from danube_zmq import DanubeClient
from danube_zmq.client.admin import AdminClient
from danube_zmq.security.tokens import TokenSigner
from danube_zmq.transport import client_protocol as cp
from danube_zmq.transport.client_protocol import DispatchStrategy
from danube_zmq.transport.codec import Message
from danube_zmq.transport.common import PROTOCOL_VERSION, Connect, Connected, Error
from danube_zmq.transport.errors import DanubeError, ErrorCode, NotFound, PermissionDenied, Timeout, Unauthenticated
from tests.integration.conftest import (
    BrokerProcess,
    CurveKeys,
    allow_client_key,
    free_port,
    make_curve_keys,
    start_broker,
    write_jwt_secret,
)

DEADLINE_S = 30.0
TIMEOUT_MS = 60_000  # refusals come at once: a slow machine must not turn one into a Timeout
T = TypeVar("T")
_NAMES = iter(range(1, 1 << 30))  # producer names unique across the module's tests (one broker)


@dataclass
class Secured:
    broker: BrokerProcess
    keys: CurveKeys
    secret: bytes

    def signer(self, *, issuer: str = "danube", audience: str = "danube", secret: bytes | None = None) -> TokenSigner:
        return TokenSigner("HS256", secret or self.secret, issuer=issuer, audience=audience, now_s=time.time)

    def token(self, subject: str, ttl_s: int = 600, **claims: Any) -> str:
        return self.signer().create(subject, "user", ttl_s, **claims)

    def alice(self) -> dict[str, Any]:
        return {"server_public_key": self.keys.server_public_key, "client_keys": str(self.keys.client_secret_file)}

    def metric(self, port: str, code: str) -> float:
        url = re.search(r"metrics (http\S+)", self.broker.log())
        assert url is not None, self.broker.log()
        text = urllib.request.urlopen(url.group(1), timeout=10).read().decode()
        found = re.search(rf'danube_requests_refused_total\{{code="{code}",port="{port}"\}} (\S+)', text)
        return float(found.group(1)) if found else 0.0


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    tmp_path = tmp_path_factory.mktemp("secured")
    keys = make_curve_keys(tmp_path / "keys")
    secret, secret_env = write_jwt_secret(tmp_path)
    env = {**keys.broker_env(), **secret_env, "DANUBE_SECURITY__JWT_LEEWAY_MS": "0"}
    broker = start_broker(tmp_path, "--metrics-port", str(free_port()), env=env)
    try:
        allow_client_key([broker], keys)
        yield Secured(broker, keys, secret)
    finally:
        code = broker.stop()
        assert code == 0, f"broker did not stop cleanly (exit {code}):\n{broker.log()}"


class Raw:
    """A DEALER over CURVE (a fresh key pair: nobody without its token) speaking the
    client protocol frame by frame."""

    def __init__(self, secured: Secured) -> None:
        self.protocol = cp.CLIENT_PROTOCOL
        self.sock = zmq.Context.instance().socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.curve_serverkey = secured.keys.server_public_key.encode()
        self.sock.curve_publickey, self.sock.curve_secretkey = zmq.curve_keypair()
        self.sock.connect(secured.broker.url)
        self.next_id = 1

    def close(self) -> None:
        self.sock.close(linger=0)

    def request(self, make: Callable[[int], Message]) -> Message:
        request_id, self.next_id = self.next_id, self.next_id + 1
        self.sock.send(self.protocol.encode(make(request_id)))
        deadline = time.monotonic() + DEADLINE_S
        while time.monotonic() < deadline:
            if not self.sock.poll(200):
                continue
            for part in self.sock.recv_multipart():
                msg = self.protocol.decode(part)
                if getattr(msg, "request_id", None) == request_id:
                    return msg
        raise AssertionError(f"no answer to request {request_id} within {DEADLINE_S} s")

    def connect(self, token: str | None) -> Message:
        return self.request(lambda rid: Connect(request_id=rid, protocol_version=PROTOCOL_VERSION, client_name="raw",
                                                auth_token=token))


def refused(answer: Message, code: ErrorCode, *words: str) -> bool:
    return isinstance(answer, Error) and answer.code == code and all(w in answer.message for w in words)


def until(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not check():
        assert time.monotonic() < deadline, f"{what} not within {DEADLINE_S} s"
        time.sleep(0.05)


async def until_async(attempt: Callable[[], Awaitable[T]], what: str,
                      retry_on: tuple[type[DanubeError], ...] = (PermissionDenied,)) -> T:
    """`attempt()`'s result once it stops raising `retry_on` (a change in the store
    reaches the broker's check within a watch round)."""
    deadline = time.monotonic() + DEADLINE_S
    while True:
        try:
            return await attempt()
        except retry_on:
            assert time.monotonic() < deadline, f"{what} not within {DEADLINE_S} s"
            await asyncio.sleep(0.05)


def admin(secured: Secured, operation: Callable[[AdminClient], Any]) -> Any:
    async def run() -> Any:
        async with AdminClient(secured.broker.admin_url, use_env=False, **secured.alice()) as client:
            return await operation(client)
    return asyncio.run(run())


def create_producer(raw: Raw, topic: str, dispatch: int = DispatchStrategy.NON_RELIABLE) -> Message:
    name = f"p{next(_NAMES)}"
    return raw.request(lambda rid: cp.CreateProducer(request_id=rid, topic=topic, producer_name=name,
                                                     dispatch_strategy=dispatch))


def send(raw: Raw, producer_id: int, payload: bytes = b"x") -> Message:
    return raw.request(lambda rid: cp.Send(request_id=rid, producer_id=producer_id, payloads=[payload],
                                           publish_times=[0]))


@pytest.fixture(autouse=True)
def _no_client_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """DanubeClient reads DANUBE_SERVER_KEY, DANUBE_CLIENT_KEYS and DANUBE_TOKEN: each test
    says its own."""
    for name in ("DANUBE_SERVER_KEY", "DANUBE_CLIENT_KEYS", "DANUBE_TOKEN"):
        monkeypatch.delenv(name, raising=False)


def client(secured: Secured, **token: Any) -> DanubeClient:
    """A DanubeClient with a fresh key pair of its own (nobody without its token)."""
    return DanubeClient(secured.broker.url, request_timeout_ms=TIMEOUT_MS,
                        server_public_key=secured.keys.server_public_key, **token)


def admin_client(secured: Secured, **token: Any) -> AdminClient:
    return AdminClient(secured.broker.admin_url, timeout_ms=TIMEOUT_MS, use_env=False,
                       server_public_key=secured.keys.server_public_key, **token)


async def test_produce_is_allowed_or_denied_by_binding_at_topic_and_namespace_scope(secured: Secured) -> None:
    """A token bound to a Produce role at topic scope produces on that topic only (another
    topic: PERMISSION_DENIED naming Produce and the topic); one bound at namespace scope
    produces on any topic of it; one with no binding on none."""
    async with AdminClient(secured.broker.admin_url, use_env=False, **secured.alice()) as alice:
        await alice.create_namespace("enf1")
        await alice.create_role("producer", ["Produce"])
        await alice.create_binding("t-scope", "user", ["producer"], "topic:/enf1/a")
        await alice.create_binding("ns-scope", "user", ["producer"], "namespace:enf1")
    async with client(secured, token=secured.token("ns-scope")) as probe:
        # The watch applies the store's events in order: the last one seen, all are.
        await until_async(lambda: probe.create_producer("/enf1/b"), "the bindings")
    for subject, allowed in (("t-scope", {"/enf1/a"}), ("ns-scope", {"/enf1/a", "/enf1/b"}), ("nobody", set())):
        async with client(secured, token=secured.token(subject)) as session:
            for topic in ("/enf1/a", "/enf1/b"):
                if topic in allowed:
                    producer = await session.create_producer(topic)
                    assert (await producer.send(b"x")).topic == topic
                else:
                    with pytest.raises(PermissionDenied) as denied:
                        await session.create_producer(topic)
                    assert denied.value.message == f"user '{subject}' lacks Produce on topic {topic}"


async def test_a_consumer_bound_at_topic_scope_subscribes_receives_acks_nacks_and_seeks(secured: Secured) -> None:
    """Lookup and Consume at topic scope (Danube would deny such a consumer its acks): the
    token's consumer subscribes, receives, acks (sent, none failed), nacks (redelivered)
    and seeks (delivered again from the offset); subscribing to another topic is
    PERMISSION_DENIED naming it."""
    topic = "/default/enf-consume"
    async with AdminClient(secured.broker.admin_url, use_env=False, **secured.alice()) as alice:
        await alice.create_topic(topic, dispatch_strategy=DispatchStrategy.RELIABLE)
        await alice.create_role("consumer", ["Lookup", "Consume"])
        await alice.create_binding("reader", "user", ["consumer"], f"topic:{topic}")
    async with client(secured, token=secured.token("reader")) as reader:
        consumer = await until_async(lambda: reader.subscribe(topic, "s"), "the binding")
        async with DanubeClient(secured.broker.url, **secured.alice()) as writer:
            producer = await writer.create_producer(topic, dispatch="reliable")
            offsets = [(await producer.send(f"m{i}".encode())).offset for i in range(3)]
        got = [await consumer.receive(timeout=DEADLINE_S) for _ in range(3)]
        assert [(m.payload, m.offset) for m in got] == [(f"m{i}".encode(), offsets[i]) for i in range(3)]
        await consumer.ack(got[:2])
        await consumer.flush_acks()
        assert (consumer.statistics().acks_sent, consumer.statistics().acks_failed) == (2, 0)
        await consumer.nack(got[2], delay_ms=0)
        again = await consumer.receive(timeout=DEADLINE_S)
        assert (again.offset, again.redelivery_count) == (offsets[2], 1)
        await consumer.seek(offset=offsets[0])
        assert (await consumer.receive(timeout=DEADLINE_S)).offset == offsets[0]
        with pytest.raises(PermissionDenied, match="user 'reader' lacks Lookup on topic /default/enf-other"):
            await reader.subscribe("/default/enf-other", "s")


async def test_creating_a_topic_by_subscribing_needs_produce_as_a_producers_create(secured: Secured) -> None:
    """Subscribing to a missing topic creates it (allow_auto_topic_creation) only for a
    principal with Produce on it: Consume (and Lookup) alone meets NOT_FOUND naming the
    permission and nothing is created; Consume and Produce creates it by subscribing."""
    async with AdminClient(secured.broker.admin_url, use_env=False, **secured.alice()) as alice:
        await alice.create_namespace("enf-auto")
        await alice.create_role("sub-only", ["Lookup", "Consume"])
        await alice.create_role("sub-and-pub", ["Consume", "Produce"])
        await alice.create_binding("sub-only", "user", ["sub-only"], "namespace:enf-auto")
        await alice.create_binding("sub-and-pub", "user", ["sub-and-pub"], "namespace:enf-auto")
        async with client(secured, token=secured.token("sub-and-pub")) as both:
            await until_async(lambda: both.subscribe("/enf-auto/made", "s"), "the bindings")
        async with client(secured, token=secured.token("sub-only")) as reader:
            await until_async(lambda: reader.subscribe("/enf-auto/made", "s"), "the bindings")  # it exists
            with pytest.raises(NotFound, match=r"needs the Produce permission.*lacks Produce on topic /enf-auto/not"):
                await reader.subscribe("/enf-auto/not", "s")
        assert [t.name for t in await alice.list_topics("enf-auto")] == ["/enf-auto/made"]


async def test_listing_a_namespaces_topics_needs_lookup_on_the_namespace(secured: Secured) -> None:
    """A pattern consumer's listing (`get_topics`, GetTopicsOfNamespace): a token whose
    role holds Lookup and Consume at namespace scope lists the namespace's topics (a
    partitioned one once), though the admin ListTopics (ManageTopic) is refused it;
    Consume alone there, the same role at topic scope, no binding, or another namespace
    is PERMISSION_DENIED naming Lookup and the namespace."""
    async with AdminClient(secured.broker.admin_url, use_env=False, **secured.alice()) as alice:
        await alice.create_namespace("enf-list")
        await alice.create_topic("/enf-list/b", partitions=2)
        await alice.create_topic("/enf-list/a")
        await alice.create_role("list-consumer", ["Lookup", "Consume"])
        await alice.create_role("consume-only", ["Consume"])
        await alice.create_binding("consume-only", "user", ["consume-only"], "namespace:enf-list")
        await alice.create_binding("topic-lister", "user", ["list-consumer"], "topic:/enf-list/a")
        await alice.create_binding("lister", "user", ["list-consumer"], "namespace:enf-list")  # the last one
    async with client(secured, token=secured.token("lister")) as lister:
        # The watch applies the store's events in order: the last binding seen, all are.
        listed = await until_async(lambda: lister.get_topics("enf-list"), "the bindings")
        assert listed == ["/enf-list/a", "/enf-list/b"]
        with pytest.raises(PermissionDenied, match="user 'lister' lacks Lookup on namespace default"):
            await lister.get_topics("default")
    async with admin_client(secured, token=secured.token("lister")) as admin_session:
        with pytest.raises(PermissionDenied, match="user 'lister' lacks ManageTopic on namespace enf-list"):
            await admin_session.list_topics("enf-list")
    for subject in ("consume-only", "topic-lister", "nobody"):
        async with client(secured, token=secured.token(subject)) as session:
            with pytest.raises(PermissionDenied) as denied:
                await session.get_topics("enf-list")
            assert denied.value.message == f"user '{subject}' lacks Lookup on namespace enf-list"


async def test_an_expired_token_is_unauthenticated_at_the_next_request_until_a_new_connect(secured: Secured) -> None:
    """A super admin's fixed token valid for 3 s: its producer sends, then after `exp` the
    next send and the next create_producer raise UNAUTHENTICATED 'token expired' (a fixed
    token is not renewed); a client with a new token has the rights again."""
    topic = "/default/enf-expiry"
    async with client(secured, token=secured.token("alice", ttl_s=3)) as session:
        expires_at = time.time() + 3
        producer = await session.create_producer(topic)
        await producer.send(b"before")
        await asyncio.sleep(max(0.0, expires_at + 0.5 - time.time()))
        with pytest.raises(Unauthenticated, match="token expired: send Connect with a new token"):
            await producer.send(b"after")
        with pytest.raises(Unauthenticated, match="token expired"):
            await session.create_producer(topic)
    async with client(secured, token=secured.token("alice")) as session:
        producer = await session.create_producer(topic)
        await producer.send(b"renewed")


async def test_a_token_revoked_with_the_cli_is_unauthenticated_at_the_next_request(secured: Secured) -> None:
    """`danube security revocations add JTI` (as alice, keys from the environment): the
    session's next send is UNAUTHENTICATED 'token revoked' within a watch round, and a new
    client with that token is refused at Connect."""
    token = secured.token("alice", jti="enf-revoked")
    async with client(secured, token=token) as session:
        producer = await session.create_producer("/default/enf-revoke")
        await producer.send(b"before")
        env = {**os.environ, **secured.keys.client_env()}
        done = subprocess.run([sys.executable, "-m", "danube_zmq.cli.main", "security", "revocations", "add",
                               "enf-revoked", "--expires-at", str(int(time.time()) + 3600), "--endpoint",
                               secured.broker.admin_url], capture_output=True, text=True, env=env, timeout=120)
        assert done.returncode == 0, done.stderr
        deadline = time.monotonic() + DEADLINE_S
        with pytest.raises(Unauthenticated, match="token revoked"):
            while time.monotonic() < deadline:
                await producer.send(b"until refused")
                await asyncio.sleep(0.05)
    with pytest.raises(Unauthenticated, match="token revoked"):
        async with client(secured, token=token) as session:
            await session.lookup("/default/enf-revoke")


@pytest.mark.parametrize("port", ["client", "admin"])
async def test_bad_tokens_are_refused_at_connect_naming_why(secured: Secured, port: str) -> None:
    """Wrong issuer, wrong audience, another secret, a `broker` principal type: the
    client's Connect is UNAUTHENTICATED naming the reason, on both ports; a good token
    connects."""
    bad = {
        "issuer": secured.signer(issuer="someone-else").create("alice", "user", 600),
        "audience": secured.signer(audience="someone-else").create("alice", "user", 600),
        "signature": secured.signer(secret=secrets.token_bytes(32)).create("alice", "user", 600),
        "cannot make a broker": secured.signer().create("alice", "broker", 600),
    }

    async def connect(token: str) -> None:
        if port == "admin":
            async with admin_client(secured, token=token) as session:
                assert session.connected is not None
        else:
            async with client(secured, token=token) as session:
                await session.start()

    for reason, token in bad.items():
        with pytest.raises(Unauthenticated, match=reason):
            await connect(token)
    await connect(secured.token("alice"))


async def test_admin_requests_need_their_permission(secured: Secured) -> None:
    """On the admin port, a token without ManageTopic cannot create a topic
    (PERMISSION_DENIED naming ManageTopic); bound to a role holding it at namespace scope,
    it can, within a watch round; a metadata put needs ManageCluster, which it lacks; the
    super admin (alice's key) may put; a fresh key with no token is UNAUTHENTICATED."""
    async with AdminClient(secured.broker.admin_url, use_env=False, **secured.alice()) as alice:
        await alice.create_namespace("enf2")
        async with admin_client(secured, token=secured.token("topic-admin")) as session:
            with pytest.raises(PermissionDenied, match="user 'topic-admin' lacks ManageTopic on topic /enf2/made"):
                await session.create_topic("/enf2/made")
            await alice.create_role("topic-admin", ["ManageTopic"])
            await alice.create_binding("topic-admin", "user", ["topic-admin"], "namespace:enf2")
            await until_async(lambda: session.create_topic("/enf2/made"), "the binding")
            with pytest.raises(PermissionDenied, match="lacks ManageCluster on the cluster"):
                await session.metadata_put("/enf/x", b"1")
        assert (await alice.metadata_put("/enf/x", b"1")).value == b"1"
    async with admin_client(secured) as nobody:
        with pytest.raises(Unauthenticated, match="not on the client-key allow-list"):
            await nobody.list_namespaces()


async def test_a_token_provider_renews_an_expired_token_and_nothing_acknowledged_is_lost(secured: Secured) -> None:
    """A producer whose `token_provider` first gives a token valid for 3 s (leeway 0)
    keeps sending across its expiry: the broker refuses one request UNAUTHENTICATED, the
    client asks the provider once more, opens the session again and re-attaches, and
    every message whose send returned is consumed, in order, exactly once."""
    topic = "/default/enf-renew"
    issued: list[int] = []

    def provider() -> str:
        issued.append(3 if not issued else 600)
        return secured.token("alice", ttl_s=issued[-1])

    refused_before = secured.metric("client", "UNAUTHENTICATED")
    acknowledged: list[bytes] = []
    async with DanubeClient(secured.broker.url, request_timeout_ms=TIMEOUT_MS, token_provider=provider,
                            server_public_key=secured.keys.server_public_key) as session:
        producer = await session.create_producer(topic, dispatch="reliable")
        deadline = time.monotonic() + DEADLINE_S
        after_renewal = 0
        while after_renewal < 10:  # until ten messages went out on the renewed session
            assert time.monotonic() < deadline, f"no renewal within {DEADLINE_S} s: {issued}"
            payload = f"m{len(acknowledged)}".encode()
            await producer.send(payload)
            acknowledged.append(payload)
            after_renewal += len(issued) > 1
            await asyncio.sleep(0.05)
        renewals = sum(c.token_renewals for c in session.statistics().connections)
    assert issued == [3, 600] and renewals == 1
    assert secured.metric("client", "UNAUTHENTICATED") == refused_before + 1
    async with DanubeClient(secured.broker.url, **secured.alice()) as alice:
        consumer = await alice.subscribe(topic, "all", initial_position="earliest")
        got = [(await consumer.receive(timeout=DEADLINE_S)).payload for _ in acknowledged]
        assert got == acknowledged
        with pytest.raises(Timeout):
            await consumer.receive(timeout=1.0)


def test_a_refused_send_appends_nothing_and_is_counted_and_logged_once(secured: Secured) -> None:
    """A producer whose binding is deleted: its next batches on a reliable topic are
    PERMISSION_DENIED, nothing is appended (alice's next message takes the next offset
    after hers), each refusal is counted in danube_requests_refused_total{port=client,
    code=PERMISSION_DENIED}, and the broker logs the principal's refusals once."""
    topic = "/default/enf-refused"
    admin(secured, lambda a: a.create_topic(topic, dispatch_strategy=DispatchStrategy.RELIABLE))
    admin(secured, lambda a: a.create_role("writer", ["Produce"]))
    made = admin(secured, lambda a: a.create_binding("writer", "user", ["writer"], f"topic:{topic}"))
    raw = Raw(secured)

    async def alice_sends(payload: bytes) -> int:
        async with DanubeClient(secured.broker.url, **secured.alice()) as client:
            producer = await client.create_producer(topic, dispatch="reliable")
            return (await producer.send(payload)).offset

    try:
        assert isinstance(raw.connect(secured.token("writer")), Connected)
        answers: list[Message] = []
        until(lambda: isinstance(answers.append(create_producer(raw, topic, DispatchStrategy.RELIABLE))
                                 or answers[-1], cp.ProducerCreated), "the binding")
        created = answers[-1]
        assert isinstance(created, cp.ProducerCreated), created
        receipt = send(raw, created.producer_id)
        assert isinstance(receipt, cp.SendReceipt) and receipt.offsets == [0]
        assert asyncio.run(alice_sends(b"a")) == 1
        admin(secured, lambda a: a.delete_binding(made.binding_id))
        until(lambda: refused(send(raw, created.producer_id, b"refused"), ErrorCode.PERMISSION_DENIED,
                              "user 'writer' lacks Produce on topic /default/enf-refused"), "the binding's removal")
        before = secured.metric("client", "PERMISSION_DENIED")
        for _ in range(5):
            assert refused(send(raw, created.producer_id, b"refused"), ErrorCode.PERMISSION_DENIED)
        assert secured.metric("client", "PERMISSION_DENIED") == before + 5
        assert asyncio.run(alice_sends(b"b")) == 2
    finally:
        raw.close()
    logged = re.sub(r"\s+", " ", secured.broker.log())  # the console handler wraps long lines
    assert logged.count("client port: Send from user 'writer' refused") == 1

"""The permission check against a real broker in security.mode curve, with JWT tokens.

One broker for the module (`secured`): CURVE, an HS256 secret, no clock-skew leeway
(so a token's expiry is seen at once), and `alice` a super admin whose client key is on
the allow-list; she sets roles and bindings through AdminClient or the CLI. Tokens are
minted with `TokenSigner` and sent in `Connect.auth_token` by a raw DEALER speaking the
protocol (`Raw`), on the client or the admin port; each test uses principals and topics
of its own. A decision that a change in the store must alter is polled for with a
generous deadline (the broker's watch applies it within a round).
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
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import zmq

from danube_zmq import DanubeClient
from danube_zmq.client.admin import AdminClient
from danube_zmq.security.tokens import TokenSigner
from danube_zmq.transport import admin_protocol as ap
from danube_zmq.transport import client_protocol as cp
from danube_zmq.transport.client_protocol import DispatchStrategy
from danube_zmq.transport.codec import Message
from danube_zmq.transport.common import PROTOCOL_VERSION, Connect, Connected, Error, Ping
from danube_zmq.transport.errors import ErrorCode
from tests.integration.conftest import (
    BrokerProcess,
    CurveKeys,
    allow_client_key,
    free_port,
    make_curve_keys,
    start_broker,
)

DEADLINE_S = 30.0
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
    secret = secrets.token_bytes(32)
    secret_file = tmp_path / "jwt.secret"
    secret_file.write_bytes(secret)
    secret_file.chmod(0o600)
    env = {**keys.broker_env(), "DANUBE_SECURITY__JWT_SECRET_FILE": str(secret_file),
           "DANUBE_SECURITY__JWT_LEEWAY_MS": "0"}
    broker = start_broker(tmp_path, "--metrics-port", str(free_port()), env=env)
    try:
        allow_client_key([broker], keys)
        yield Secured(broker, keys, secret)
    finally:
        code = broker.stop()
        assert code == 0, f"broker did not stop cleanly (exit {code}):\n{broker.log()}"


class Raw:
    """A DEALER over CURVE (a fresh key pair: nobody without its token) speaking the
    client or admin protocol frame by frame."""

    def __init__(self, secured: Secured, *, admin: bool = False) -> None:
        self.protocol = ap.ADMIN_PROTOCOL if admin else cp.CLIENT_PROTOCOL
        self.sock = zmq.Context.instance().socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.curve_serverkey = secured.keys.server_public_key.encode()
        self.sock.curve_publickey, self.sock.curve_secretkey = zmq.curve_keypair()
        self.sock.connect(secured.broker.admin_url if admin else secured.broker.url)
        self.next_id = 1
        self.pushed: list[Message] = []

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
                self.pushed.append(msg)
        raise AssertionError(f"no answer to request {request_id} within {DEADLINE_S} s")

    def idle_until(self, moment: float) -> None:
        """Ping until the wall clock passes `moment` (the session would time out silent)."""
        while time.time() < moment:
            self.request(lambda rid: Ping(request_id=rid))
            time.sleep(0.2)

    def tell(self, msg: Message) -> None:
        self.sock.send(self.protocol.encode(msg))

    def connect(self, token: str | None) -> Message:
        return self.request(lambda rid: Connect(request_id=rid, protocol_version=PROTOCOL_VERSION, client_name="raw",
                                                auth_token=token))

    def delivered(self, count: int) -> list[cp.Deliver]:
        """The first `count` messages pushed to this connection's consumers."""
        deadline = time.monotonic() + DEADLINE_S
        while sum(len(d.payloads) for d in self.pushed if isinstance(d, cp.Deliver)) < count:
            assert time.monotonic() < deadline, f"{count} deliveries expected, got {self.pushed}"
            if self.sock.poll(200):
                self.pushed += [self.protocol.decode(p) for p in self.sock.recv_multipart()]
        return [d for d in self.pushed if isinstance(d, cp.Deliver)]


def refused(answer: Message, code: ErrorCode, *words: str) -> bool:
    return isinstance(answer, Error) and answer.code == code and all(w in answer.message for w in words)


def until(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not check():
        assert time.monotonic() < deadline, f"{what} not within {DEADLINE_S} s"
        time.sleep(0.05)


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


def test_produce_is_allowed_or_denied_by_binding_at_topic_and_namespace_scope(secured: Secured) -> None:
    """A token bound to a Produce role at topic scope produces on that topic only (another
    topic: PERMISSION_DENIED naming Produce and the topic); one bound at namespace scope
    produces on any topic of it; one with no binding on none."""
    admin(secured, lambda a: a.create_namespace("enf1"))
    admin(secured, lambda a: a.create_role("producer", ["Produce"]))
    admin(secured, lambda a: a.create_binding("t-scope", "user", ["producer"], "topic:/enf1/a"))
    admin(secured, lambda a: a.create_binding("ns-scope", "user", ["producer"], "namespace:enf1"))
    probe = Raw(secured)
    try:  # the watch applies the store's events in order: the last one seen, all are
        assert isinstance(probe.connect(secured.token("ns-scope")), Connected)
        until(lambda: isinstance(create_producer(probe, "/enf1/b"), cp.ProducerCreated), "the bindings")
    finally:
        probe.close()
    for subject, allowed in (("t-scope", {"/enf1/a"}), ("ns-scope", {"/enf1/a", "/enf1/b"}), ("nobody", set())):
        raw = Raw(secured)
        try:
            assert isinstance(raw.connect(secured.token(subject)), Connected)
            for topic in ("/enf1/a", "/enf1/b"):
                answer = create_producer(raw, topic)
                if topic in allowed:
                    assert isinstance(answer, cp.ProducerCreated), answer
                    assert isinstance(send(raw, answer.producer_id), cp.SendReceipt)
                else:
                    assert refused(answer, ErrorCode.PERMISSION_DENIED, f"user '{subject}' lacks Produce on topic"
                                   f" {topic}"), answer
        finally:
            raw.close()


def test_a_consumer_bound_at_topic_scope_subscribes_receives_acks_nacks_and_seeks(secured: Secured) -> None:
    """Consume at topic scope (Danube would deny such a consumer its acks): the token's
    session subscribes, gets Flow'ed deliveries, and its Ack, Nack and Seek are answered,
    not refused; a Subscribe on another topic is PERMISSION_DENIED."""
    topic = "/default/enf-consume"
    admin(secured, lambda a: a.create_topic(topic, dispatch_strategy=DispatchStrategy.RELIABLE))
    admin(secured, lambda a: a.create_role("consumer", ["Consume"]))
    admin(secured, lambda a: a.create_binding("reader", "user", ["consumer"], f"topic:{topic}"))
    raw = Raw(secured)
    try:
        assert isinstance(raw.connect(secured.token("reader")), Connected)
        answers: list[Message] = []
        until(lambda: isinstance(answers.append(raw.request(lambda rid: cp.Subscribe(
            request_id=rid, topic=topic, subscription="s", consumer_name="c", initial_position=0)))
            or answers[-1], cp.Subscribed), "the binding")
        subscribed = answers[-1]
        assert isinstance(subscribed, cp.Subscribed), subscribed
        cid = subscribed.consumer_id

        async def produce() -> None:
            async with DanubeClient(secured.broker.url, **secured.alice()) as client:
                producer = await client.create_producer(topic, dispatch="reliable")
                for i in range(3):
                    await producer.send(f"m{i}".encode())
        asyncio.run(produce())
        raw.tell(cp.Flow(consumer_id=cid, permits=10))
        got = raw.delivered(3)
        offsets = [o for d in got for o in (d.offsets or range(d.base_offset, d.base_offset + len(d.payloads)))]
        assert [p for d in got for p in d.payloads] == [b"m0", b"m1", b"m2"]
        for answer in (raw.request(lambda rid: cp.Ack(request_id=rid, consumer_id=cid, offsets=offsets[:2])),
                       raw.request(lambda rid: cp.Nack(request_id=rid, consumer_id=cid, offsets=offsets[2:])),
                       raw.request(lambda rid: cp.Seek(request_id=rid, consumer_id=cid, offset=0))):
            assert not isinstance(answer, Error), answer
        other = raw.request(lambda rid: cp.Subscribe(request_id=rid, topic="/default/enf-other", subscription="s",
                                                     consumer_name="c"))
        assert refused(other, ErrorCode.PERMISSION_DENIED, "lacks Consume on topic /default/enf-other"), other
    finally:
        raw.close()


def test_an_expired_token_is_unauthenticated_at_the_next_request_until_a_new_connect(secured: Secured) -> None:
    """A super admin's token valid for 3 s: its producer sends, then after `exp` the next
    batch is UNAUTHENTICATED 'token expired'; a Connect with a new token restores the
    rights (the producer is created again: a re-Connect starts a new session)."""
    raw = Raw(secured)
    try:
        assert isinstance(raw.connect(secured.token("alice", ttl_s=3)), Connected)
        created = create_producer(raw, "/default/enf-expiry")
        assert isinstance(created, cp.ProducerCreated), created
        expires_at = time.time() + 3
        assert isinstance(send(raw, created.producer_id), cp.SendReceipt)
        raw.idle_until(expires_at + 0.5)
        assert refused(send(raw, created.producer_id), ErrorCode.UNAUTHENTICATED, "token expired")
        assert refused(create_producer(raw, "/default/enf-expiry"), ErrorCode.UNAUTHENTICATED, "token expired")
        assert isinstance(raw.connect(secured.token("alice")), Connected)
        created = create_producer(raw, "/default/enf-expiry")
        assert isinstance(created, cp.ProducerCreated), created
        assert isinstance(send(raw, created.producer_id), cp.SendReceipt)
    finally:
        raw.close()


def test_a_token_revoked_with_the_cli_is_unauthenticated_at_the_next_request(secured: Secured) -> None:
    """`danube security revocations add JTI` (as alice, keys from the environment): the
    session's next request is UNAUTHENTICATED 'token revoked' within a watch round, and a
    Connect with that token is refused."""
    token = secured.token("alice", jti="enf-revoked")
    raw = Raw(secured)
    try:
        assert isinstance(raw.connect(token), Connected)
        created = create_producer(raw, "/default/enf-revoke")
        assert isinstance(created, cp.ProducerCreated), created
        env = {**os.environ, **secured.keys.client_env()}
        done = subprocess.run([sys.executable, "-m", "danube_zmq.cli.main", "security", "revocations", "add",
                               "enf-revoked", "--expires-at", str(int(time.time()) + 3600), "--endpoint",
                               secured.broker.admin_url], capture_output=True, text=True, env=env, timeout=120)
        assert done.returncode == 0, done.stderr
        until(lambda: refused(send(raw, created.producer_id), ErrorCode.UNAUTHENTICATED, "token revoked"),
              "the revocation")
        assert refused(raw.connect(token), ErrorCode.UNAUTHENTICATED, "token revoked")
    finally:
        raw.close()


@pytest.mark.parametrize("port", ["client", "admin"])
def test_bad_tokens_are_refused_at_connect_naming_why(secured: Secured, port: str) -> None:
    """Wrong issuer, wrong audience, another secret, a `broker` principal type: Connect is
    UNAUTHENTICATED naming the reason, on both ports; a good token is Connected."""
    bad = {
        "issuer": secured.signer(issuer="someone-else").create("alice", "user", 600),
        "audience": secured.signer(audience="someone-else").create("alice", "user", 600),
        "signature": secured.signer(secret=secrets.token_bytes(32)).create("alice", "user", 600),
        "cannot make a broker": secured.signer().create("alice", "broker", 600),
    }
    raw = Raw(secured, admin=port == "admin")
    try:
        for reason, token in bad.items():
            answer = raw.connect(token)
            assert refused(answer, ErrorCode.UNAUTHENTICATED, reason), (reason, answer)
        assert isinstance(raw.connect(secured.token("alice")), Connected)
    finally:
        raw.close()


def test_admin_requests_need_their_permission(secured: Secured) -> None:
    """On the admin port, a token without ManageTopic cannot create a topic
    (PERMISSION_DENIED naming ManageTopic); bound to a role holding it at namespace scope,
    it can, within a watch round; a metadata put needs ManageCluster, which it lacks; the
    super admin (alice's key) may put; a fresh key with no token is UNAUTHENTICATED."""
    admin(secured, lambda a: a.create_namespace("enf2"))
    raw = Raw(secured, admin=True)
    try:
        assert isinstance(raw.connect(secured.token("topic-admin")), Connected)

        def create() -> Message:
            return raw.request(lambda rid: ap.CreateTopic(request_id=rid, topic="/enf2/made"))

        assert refused(create(), ErrorCode.PERMISSION_DENIED, "lacks ManageTopic on topic /enf2/made")
        admin(secured, lambda a: a.create_role("topic-admin", ["ManageTopic"]))
        admin(secured, lambda a: a.create_binding("topic-admin", "user", ["topic-admin"], "namespace:enf2"))
        until(lambda: not isinstance(create(), Error), "the binding")
        put = raw.request(lambda rid: ap.MetadataPut(request_id=rid, key="/enf/x", value=b"1"))
        assert refused(put, ErrorCode.PERMISSION_DENIED, "lacks ManageCluster on the cluster"), put
    finally:
        raw.close()
    written = admin(secured, lambda a: a.metadata_put("/enf/x", b"1"))
    assert written is not None
    nobody = Raw(secured, admin=True)
    try:
        answer = nobody.request(lambda rid: ap.ListNamespaces(request_id=rid))
        assert refused(answer, ErrorCode.UNAUTHENTICATED, "not on the client-key allow-list"), answer
    finally:
        nobody.close()


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

"""The enforcer (security/enforcement.py): who a session is at each request, and the one
check, against a fake clock and /security/ entries as the metadata store holds them."""

from __future__ import annotations

import pytest
import zmq
from hypothesis import given, settings
from hypothesis import strategies as st

from danube_zmq.security.enforcement import BROKER, Enforcer, RefusalLog
from danube_zmq.security.rbac import Principal, PrincipalType
from danube_zmq.security.state import binding_id
from danube_zmq.security.tokens import TokenSigner, TokenVerifier
from danube_zmq.transport import admin_protocol as ap
from danube_zmq.transport import client_protocol as cp
from danube_zmq.transport import cluster_records as cr
from danube_zmq.transport.errors import NotFound, PermissionDenied, Unauthenticated, Unavailable

SECRET = b"s" * 32
ALICE = Principal("alice", PrincipalType.USER)
BROKER_KEY = zmq.curve_keypair()[0]
CLIENT_KEY = zmq.curve_keypair()[0]


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


class Session:
    """A resolver: the session's producers and consumers, by id."""

    def __init__(self, producers: dict[int, str] | None = None, consumers: dict[int, str] | None = None) -> None:
        self.producers = producers or {}
        self.consumers = consumers or {}

    def topic_of_producer(self, producer_id: int) -> str:
        if producer_id not in self.producers:
            raise NotFound(f"producer {producer_id} is not attached on this connection")
        return self.producers[producer_id]

    def topic_of_consumer(self, consumer_id: int) -> str:
        if consumer_id not in self.consumers:
            raise NotFound(f"consumer {consumer_id} is not attached on this connection")
        return self.consumers[consumer_id]

    def subject_of_schema(self, schema_id: int) -> str:
        raise NotFound(f"schema id {schema_id} not found")


def _role(name: str, *permissions: str) -> tuple[str, bytes]:
    return cr.role_key(name), cr.encode(cr.RoleRecord(name=name, permissions=list(permissions)))


def _binding(scope: str, *roles: str, principal: Principal = ALICE) -> tuple[str, bytes]:
    bid = binding_id(principal, scope)
    return cr.binding_key(bid), cr.encode(cr.BindingRecord(
        binding_id=bid, principal=principal.name, principal_type=principal.type.value, roles=list(roles), scope=scope))


def _client_key(key: bytes, principal: Principal = ALICE) -> tuple[str, bytes]:
    return cr.client_key_key(key.decode()), cr.encode(cr.ClientKeyRecord(
        public_key=key.decode(), principal=principal.name, principal_type=principal.type.value))


def _enforcer(clock: Clock, *, loaded: bool = True, super_admins: tuple[str, ...] = ()) -> Enforcer:
    verifier = TokenVerifier("HS256", SECRET, "danube", "danube", 30.0, clock)
    enforcer = Enforcer(verifier=verifier, is_broker_key=lambda key: key == BROKER_KEY, now_s=clock,
                        super_admins=super_admins)
    if loaded:
        enforcer.resync([_role("producer", "Produce"), _role("consumer", "Consume")])
    return enforcer


def _token(clock: Clock, subject: str = "alice", principal_type: str = "user", ttl_s: int = 600,
           jti: str = "j1") -> str:
    return TokenSigner("HS256", SECRET, issuer="danube", audience="danube", now_s=clock).create(
        subject, principal_type, ttl_s, jti=jti)


def _send(producer_id: int = 1) -> cp.Send:
    return cp.Send(request_id=1, producer_id=producer_id, payloads=[b"x"], publish_times=[0])


def test_a_token_is_the_session_principal_until_it_expires():
    """A token's sub and type are the principal (bound at Connect, a binding lets it
    produce); once `exp` plus the leeway has passed, the next request is UNAUTHENTICATED
    'token expired', with the binding unchanged."""
    clock = Clock()
    enforcer = _enforcer(clock)
    enforcer.apply(*_binding("topic:/ns/t", "producer"))
    auth = enforcer.connect(_token(clock, ttl_s=60), CLIENT_KEY)
    assert enforcer.principal(auth) == ALICE
    enforcer.check(auth, _send(), Session({1: "/ns/t"}))
    enforcer.check_send(auth, "/ns/t")
    clock.now += 60 + 29
    enforcer.check_send(auth, "/ns/t")  # within the leeway, as at Connect
    clock.now += 1
    for check in (lambda: enforcer.check(auth, _send(), Session({1: "/ns/t"})),
                  lambda: enforcer.check_send(auth, "/ns/t")):
        with pytest.raises(Unauthenticated, match="token expired"):
            check()


def test_a_revoked_jti_ends_the_session_rights_at_the_next_request():
    """Revoking the token's jti (a watch event) refuses the next request UNAUTHENTICATED
    naming the revocation; a new Connect with that token is refused too."""
    clock = Clock()
    enforcer = _enforcer(clock, super_admins=("alice",))
    token = _token(clock, jti="gone")
    auth = enforcer.connect(token, CLIENT_KEY)
    enforcer.check_send(auth, "/ns/t")
    enforcer.apply(cr.revoked_key("gone"), cr.encode(cr.RevokedTokenRecord(jti="gone", expires_at_ms=10**13)))
    with pytest.raises(Unauthenticated, match="token revoked"):
        enforcer.check_send(auth, "/ns/t")
    with pytest.raises(Unauthenticated, match="token revoked"):
        enforcer.connect(token, CLIENT_KEY)


def test_a_token_naming_a_broker_is_refused_at_connect():
    """principal_type broker in a well-signed token: refused, brokers are keys only."""
    clock = Clock()
    with pytest.raises(Unauthenticated, match="cannot make a broker"):
        _enforcer(clock).connect(_token(clock, principal_type="broker"), CLIENT_KEY)


@pytest.mark.parametrize(("signer", "reason"), [
    (lambda c: TokenSigner("HS256", SECRET, issuer="other", audience="danube", now_s=c), "issuer"),
    (lambda c: TokenSigner("HS256", SECRET, issuer="danube", audience="other", now_s=c), "audience"),
    (lambda c: TokenSigner("HS256", b"t" * 32, issuer="danube", audience="danube", now_s=c), "signature"),
])
def test_a_bad_token_is_refused_at_connect_naming_why(signer, reason):
    """Wrong issuer, wrong audience, another secret: Connect is UNAUTHENTICATED naming it."""
    clock = Clock()
    with pytest.raises(Unauthenticated, match=reason):
        _enforcer(clock).connect(signer(clock).create("alice", "user", 600), CLIENT_KEY)


def test_a_token_without_a_configured_key_is_refused():
    """No jwt secret or public key configured: a token cannot be checked, so it is refused."""
    clock = Clock()
    enforcer = Enforcer(verifier=None, is_broker_key=lambda key: False, now_s=clock)
    with pytest.raises(Unauthenticated, match="checks no tokens"):
        enforcer.connect(_token(clock), CLIENT_KEY)


def test_the_allow_list_decides_who_a_key_is_at_each_request():
    """Without a token the key's principal is read at each request: unknown ->
    UNAUTHENTICATED, added to the allow-list -> that principal, removed -> nobody again."""
    clock = Clock()
    enforcer = _enforcer(clock, super_admins=("alice",))
    auth = enforcer.connect(None, CLIENT_KEY)
    with pytest.raises(Unauthenticated, match="not on the client-key allow-list"):
        enforcer.check_send(auth, "/ns/t")
    key, value = _client_key(CLIENT_KEY)
    enforcer.apply(key, value)
    enforcer.check_send(auth, "/ns/t")
    enforcer.apply(key, None)
    with pytest.raises(Unauthenticated):
        enforcer.check_send(auth, "/ns/t")


def test_a_broker_key_holds_broker_rights_only():
    """The broker key is the broker principal, even before the state is read: it may
    ManageTopic (a forwarded admin request) but not Produce; a client key registered
    under the name 'broker' is a user, never a broker."""
    clock = Clock()
    enforcer = _enforcer(clock, loaded=False)
    auth = enforcer.connect(None, BROKER_KEY)
    assert enforcer.principal(auth) == BROKER
    enforcer.check(auth, ap.DescribeTopic(request_id=1, topic="/ns/t"), Session())
    with pytest.raises(PermissionDenied, match="brokers hold only"):
        enforcer.check_send(auth, "/ns/t")
    enforcer.resync([_client_key(CLIENT_KEY, Principal("broker", PrincipalType.USER))])
    client = enforcer.principal(enforcer.connect(None, CLIENT_KEY))
    assert client == Principal("broker", PrincipalType.USER) and client != BROKER


def test_until_the_state_is_read_others_are_told_to_retry():
    """Before the first listing of /security/: a token or a client key gets UNAVAILABLE
    (retriable), not a refusal the store would not give."""
    clock = Clock()
    enforcer = _enforcer(clock, loaded=False)
    for auth in (enforcer.connect(_token(clock), CLIENT_KEY), enforcer.connect(None, CLIENT_KEY)):
        with pytest.raises(Unavailable, match="security state"):
            enforcer.check_send(auth, "/ns/t")


def test_the_handshake_needs_nothing_and_the_rest_needs_a_principal():
    """Ping and HealthCheck pass without credentials; a Subscribe without any session
    credentials is UNAUTHENTICATED."""
    clock = Clock()
    enforcer = _enforcer(clock)
    enforcer.check(None, cp.HealthCheck(request_id=1, client_kind=cp.ClientKind.PRODUCER, client_id=1), Session())
    with pytest.raises(Unauthenticated):
        enforcer.check(None, cp.Subscribe(request_id=1, topic="/ns/t", subscription="s", consumer_name="c"),
                       Session())


def test_a_consumer_bound_at_topic_scope_may_flow_ack_nack_and_seek():
    """Consume at topic scope: the consumer's Flow, Ack, Nack and Seek (resolved to its
    topic through the session) are allowed; on another topic's consumer, refused naming
    Consume and the topic."""
    clock = Clock()
    enforcer = _enforcer(clock)
    enforcer.apply(*_binding("topic:/ns/t", "consumer"))
    auth = enforcer.connect(_token(clock), CLIENT_KEY)
    session = Session(consumers={1: "/ns/t-part-0", 2: "/ns/u"})
    for cid, allowed in ((1, True), (2, False)):
        for msg in (cp.Flow(consumer_id=cid, permits=10), cp.Ack(request_id=1, consumer_id=cid, offsets=[0]),
                    cp.Nack(request_id=1, consumer_id=cid, offsets=[0]),
                    cp.Seek(request_id=1, consumer_id=cid, offset=0)):
            if allowed:
                enforcer.check(auth, msg, session)
            else:
                with pytest.raises(PermissionDenied, match="lacks Consume on topic /ns/u"):
                    enforcer.check(auth, msg, session)


def test_a_binding_change_reaches_the_memoized_decision():
    """A decision remembered for a Send is dropped when the state changes: deleting the
    binding refuses the next batch, putting it back allows it."""
    clock = Clock()
    enforcer = _enforcer(clock)
    key, value = _binding("namespace:ns", "producer")
    enforcer.apply(key, value)
    auth = enforcer.connect(_token(clock), CLIENT_KEY)
    enforcer.check_send(auth, "/ns/t")
    enforcer.apply(key, None)
    with pytest.raises(PermissionDenied, match="lacks Produce on topic /ns/t"):
        enforcer.check_send(auth, "/ns/t")
    enforcer.apply(key, value)
    enforcer.check_send(auth, "/ns/t")


@settings(max_examples=200, deadline=None)
@given(bound=st.sampled_from(["cluster", "namespace:ns", "namespace:other", "topic:/ns/t", "topic:/ns/u", None]),
       role=st.sampled_from(["producer", "consumer"]), topic=st.sampled_from(["/ns/t", "/ns/t-part-3", "/ns/u"]),
       repeat=st.integers(1, 3))
def test_the_send_fast_path_agrees_with_the_table(bound, role, topic, repeat):
    """For any binding, `check_send(topic)` (undecoded batches) decides as `check(Send)`
    through the permission table does, first time and memoized."""
    clock = Clock()
    enforcer = _enforcer(clock)
    if bound is not None:
        enforcer.apply(*_binding(bound, role))
    auth = enforcer.connect(_token(clock), CLIENT_KEY)

    def outcome(check) -> str:
        try:
            check()
        except PermissionDenied as exc:
            return exc.message
        return "allowed"

    for _ in range(repeat):
        fast = outcome(lambda: enforcer.check_send(auth, topic))
        table = outcome(lambda: enforcer.check(auth, _send(), Session({1: topic})))
        assert fast == table


def test_refusals_are_logged_once_per_principal_per_interval_in_a_bounded_map():
    """The same principal is logged again only after the interval; others are logged at
    once; the map forgets the oldest past its bound."""
    log = RefusalLog(interval_s=60, entries_max=2)
    assert log.should_log("a", 0) and not log.should_log("a", 59) and log.should_log("a", 60)
    assert log.should_log("b", 61) and log.should_log("c", 62)
    assert len(log._last) == 2 and "a" not in log._last
    assert log.suppressed == 1

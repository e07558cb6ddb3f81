"""The one check per request: who a session is, and whether it may send this request.

    Connect(auth_token) + CURVE key  --Enforcer.connect-->  SessionAuth (bound to the session)
    request + SessionAuth            --Enforcer.check----->  None, or Unauthenticated / PermissionDenied

Pure (no I/O): the broker's gateways own one `Enforcer` each, feed it the `/security/`
entries of the metadata store (`resync` at the start of a watch and after a gap,
`apply` for each event after), and call it once per request before anything is stored
or forwarded. Time comes from `now_s`.

Who a session is, decided again at every request, so that a change in the store takes
effect at the next request, not the next Connect:

1. A token sent in `Connect`: its `sub` and `principal_type`; its rights end when it
   expires (`now < exp + leeway`, the same leeway as at Connect) or its `jti` is
   revoked. A token never makes a broker: one with `principal_type: broker` is refused.
2. Else the CURVE key: a key of the brokers' allow-list is the `broker` principal; a
   key on the client-key allow-list is the principal it is registered to.
3. Else nobody: every request that needs a permission is UNAUTHENTICATED.

Until the first listing of `/security/` is read, only brokers (whose rights do not
depend on it) are served; anyone else gets UNAVAILABLE, retriable, rather than a
refusal the store would not have given.

Decisions are memoized per (principal, request type, what the request names), cleared
whenever the state changes, so a producer's batch costs a few dict lookups.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from danube_zmq.security.rbac import Decision, Permission, Principal, PrincipalType, Resource
from danube_zmq.security.requirements import (
    REQUIREMENTS,
    ById,
    Cluster,
    Field,
    FirstOf,
    Requirement,
    Resolver,
    SchemaById,
    authorize,
)
from danube_zmq.security.state import SecurityState
from danube_zmq.security.tokens import Claims, TokenVerifier
from danube_zmq.transport import client_protocol as cp
from danube_zmq.transport.codec import Message
from danube_zmq.transport.errors import Unauthenticated, Unavailable

__all__ = ["BROKER", "Enforcer", "RefusalLog", "SessionAuth"]

BROKER = Principal(name="broker", type=PrincipalType.BROKER)
# Decisions remembered at once; a full memo is emptied (it refills at a dict lookup per
# miss). Bounded in entries; an entry holds a principal name (at most a token's bytes).
_MEMO_ENTRIES_MAX = 1024
_SEND_PERMISSION = REQUIREMENTS[cp.Send].permission
assert _SEND_PERMISSION is Permission.PRODUCE


@dataclass(frozen=True, slots=True)
class SessionAuth:
    """What a session authenticated with: the connection's CURVE key (Z85) and, when
    it sent one in `Connect`, the verified token's claims and principal."""

    key: bytes | None
    claims: Claims | None = None
    principal: Principal | None = None  # the token's; None: the key's, looked up per request


class Enforcer:
    def __init__(self, *, verifier: TokenVerifier | None, is_broker_key: Callable[[bytes], bool],
                 now_s: Callable[[], float], super_admins: Iterable[str] = ()) -> None:
        self.verifier = verifier
        self.is_broker_key = is_broker_key
        self.now_s = now_s
        self.super_admins = frozenset(super_admins)
        self.state = SecurityState(self.super_admins)
        self.loaded = False  # the first listing of /security/ was read
        self.version = 0  # bumped at every change of the state
        self._memo: dict[tuple[Principal, type, Any], Decision] = {}
        self._leeway_s = verifier.leeway_s if verifier is not None else 0.0

    # ------------------------------------------------------------- the state
    def resync(self, entries: Iterable[tuple[str, bytes]]) -> None:
        """Everything under `/security/` as of a revision (a watch's start or restart)."""
        self.state = SecurityState.of(entries, self.super_admins)
        self.loaded = True
        self._changed()

    def apply(self, key: str, value: bytes | None) -> None:
        """One watch event under `/security/` (value None: a delete)."""
        self.state.apply(key, value)
        self._changed()

    def _changed(self) -> None:
        self.version += 1
        self._memo.clear()

    def client_keys(self) -> dict[str, Principal]:
        """The client-key allow-list as of now (Z85 -> principal)."""
        return dict(self.state.client_keys)

    # ------------------------------------------------------------- who
    def connect(self, token: str | None, key: bytes | None) -> SessionAuth:
        """What a `Connect` binds to its session; Unauthenticated for a bad token (the
        session then has no rights)."""
        if token is None:
            return SessionAuth(key=key)
        if self.verifier is None:
            raise Unauthenticated("this broker checks no tokens (security.jwt_secret_file or jwt_public_key_file"
                                  " is not set): connect with a client key on the allow-list")
        claims = self.verifier.verify(token, revoked=self.state.is_revoked)
        if claims.principal_type == PrincipalType.BROKER:
            raise Unauthenticated("a token cannot make a broker: brokers authenticate by their CURVE key alone")
        return SessionAuth(key=key, claims=claims, principal=Principal(claims.subject,
                                                                       PrincipalType(claims.principal_type)))

    def principal(self, auth: SessionAuth | None) -> Principal:
        """Who sends a request now: Unauthenticated when nobody (no credentials, an
        expired or revoked token, a key not or no longer on the allow-list)."""
        if auth is None:
            raise Unauthenticated("connection not authenticated: send Connect")
        claims = auth.claims
        if claims is not None:
            if self.now_s() >= claims.expires_at + self._leeway_s:
                raise Unauthenticated("token expired: send Connect with a new token")
            if not self.loaded:
                raise Unavailable("the broker has not read its security state yet; retry")
            if claims.jti in self.state.revoked:
                raise Unauthenticated(f"token revoked (jti {claims.jti[:64]!r}): send Connect with a new token")
            assert auth.principal is not None
            return auth.principal
        key = auth.key
        if key is not None and self.is_broker_key(key):
            return BROKER
        if not self.loaded:
            raise Unavailable("the broker has not read its security state yet; retry")
        principal = self.state.client_keys.get(key.decode("ascii", "replace")) if key is not None else None
        if principal is None:
            raise Unauthenticated("no credentials: this connection's CURVE key is not on the client-key allow-list"
                                  " and its Connect carried no token")
        return principal

    # ------------------------------------------------------------- the check
    def check(self, auth: SessionAuth | None, msg: Message, resolver: Resolver) -> None:
        """The one check of one request: returns when allowed; raises Unauthenticated
        (no, expired or revoked credentials), PermissionDenied (no right, naming the
        permission and the resource), Unavailable (the state not read yet), or what
        resolving the resource raises (InvalidArgument, NotFound)."""
        requirement = REQUIREMENTS.get(type(msg))
        if requirement is not None and requirement.permission is None and not requirement.broker_only:
            return  # the handshake, pings and health checks: nothing needed
        principal = self.principal(auth)
        memo_key = (principal, type(msg), _target(requirement, msg, resolver))
        decision = self._memo.get(memo_key)
        if decision is None:
            decision = authorize(self.state.policy, principal, msg, resolver)
            self._remember(memo_key, decision)
        decision.check()

    def check_send(self, auth: SessionAuth | None, topic: str) -> None:
        """`check` of a producer's `Send` (Produce on its topic), for a batch routed
        undecoded: the topic is the one its producer is attached to."""
        principal = self.principal(auth)
        memo_key = (principal, cp.Send, topic)
        decision = self._memo.get(memo_key)
        if decision is None:
            decision = self.state.policy.decide(principal, _SEND_PERMISSION, Resource.topic(topic))
            self._remember(memo_key, decision)
        decision.check()

    def _remember(self, memo_key: tuple[Principal, type, Any], decision: Decision) -> None:
        if len(self._memo) >= _MEMO_ENTRIES_MAX:
            self._memo.clear()
        self._memo[memo_key] = decision


def _target(requirement: Requirement | None, msg: Any, resolver: Resolver) -> Any:
    """What the request names that its decision depends on (the memo's key): a field's
    value, the topic its producer or consumer is attached to; hashable."""
    if requirement is None:
        return None
    target = _located(requirement.resource, msg, resolver)
    if requirement.instead_when is not None:
        return target, bool(getattr(msg, requirement.instead_when[0]))
    return target


def _located(locator: Any, msg: Any, resolver: Resolver) -> Any:
    match locator:
        case Cluster():
            return None
        case Field(name=name):
            return getattr(msg, name)
        case ById(kind="producer", field=name):
            return resolver.topic_of_producer(getattr(msg, name))
        case ById(field=name):
            return resolver.topic_of_consumer(getattr(msg, name))
        case SchemaById(field=name):
            return getattr(msg, name)  # an id names one subject for good
        case FirstOf(choices=choices):
            return tuple(getattr(msg, c.field if isinstance(c, SchemaById) else c.name) for c in choices)
    raise AssertionError(f"unknown locator {locator!r}")


class RefusalLog:
    """Whether to log a refusal: at most once per principal (or key) per interval, so
    a client retrying a refused request does not flood the log. Bounded in entries:
    the oldest is forgotten first."""

    def __init__(self, *, interval_s: float = 60.0, entries_max: int = 1024) -> None:
        self.interval_s = interval_s
        self.entries_max = entries_max
        self._last: OrderedDict[str, float] = OrderedDict()
        self.suppressed = 0

    def should_log(self, who: str, now_s: float) -> bool:
        last = self._last.get(who)
        if last is not None and now_s - last < self.interval_s:
            self.suppressed += 1
            return False
        self._last[who] = now_s
        self._last.move_to_end(who)
        while len(self._last) > self.entries_max:
            self._last.popitem(last=False)
        return True

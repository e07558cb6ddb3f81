"""The permission check on a broker's two request ports (security.mode curve).

Each gateway (client and admin) owns one `Enforcer` (`security/enforcement.py`) and a
`MetadataWatch` child that keeps it current: the watch tells the gateway every entry
under `/security/` at its start and after a gap (`SecurityResync`), then each change
(`SecurityChanged`), and the gateway applies them in its own handlers, so the state is
never shared between actors. The client gateway also hands the client-key allow-list
to the ZAP credentials (`Credentials.replace_client_keys`), so a rotation needs no
restart.

A refused request is answered with its code (UNAUTHENTICATED or PERMISSION_DENIED)
and a message naming the permission and the resource, counted in
`danube_requests_refused_total{port,code}`, and logged at most once per principal
(or key) per minute.
"""

from __future__ import annotations

import logging
from collections import OrderedDict

from danube_zmq.actors.cluster.metadata_watch import MetadataWatch
from danube_zmq.actors.metrics import METRICS
from danube_zmq.clock import Clock
from danube_zmq.config.broker_config import BrokerConfig
from danube_zmq.consensus.metadata_store import RaftMetadataStore
from danube_zmq.consensus.state_machine import WatchEvent
from danube_zmq.runtime.system import ActorSystem
from danube_zmq.security.curve import Credentials
from danube_zmq.security.enforcement import Enforcer, RefusalLog, SessionAuth
from danube_zmq.security.tokens import TokenVerifier
from danube_zmq.transport import cluster_records as cr
from danube_zmq.transport.codec import Message
from danube_zmq.transport.errors import DanubeError, ErrorCode
from danube_zmq.transport.internal_protocol import SecurityChanged, SecurityResync

__all__ = ["AdminPrincipals", "Refusals", "make_enforcer", "spawn_security_watch"]

log = logging.getLogger("danube_zmq.security")

REFUSAL_CODES = frozenset((ErrorCode.UNAUTHENTICATED, ErrorCode.PERMISSION_DENIED))
_ENTRY_BYTES_OVERHEAD = 128  # an entry's dict slot, tuple and objects, roughly


def make_enforcer(config: BrokerConfig, credentials: Credentials | None, clock: Clock) -> Enforcer | None:
    """The enforcer of a gateway: None in mode none (no check, no cost)."""
    if credentials is None:
        return None
    section = config.security
    return Enforcer(verifier=TokenVerifier.from_config(section, lambda: clock.now_ms() / 1000),
                    is_broker_key=credentials.is_broker_key, now_s=lambda: clock.now_ms() / 1000,
                    super_admins=section.super_admins)


async def spawn_security_watch(system: ActorSystem, metadata: RaftMetadataStore, gateway: str, name: str) -> str:
    """A `MetadataWatch` of `/security/`, child of `gateway`, telling it the entries."""

    async def listing() -> Message:
        entries = await metadata.list_prefix(cr.SECURITY, linearizable=False)  # after the watch's barrier
        return SecurityResync(keys=[key for key, _ in entries], values=[value.value for _, value in entries])

    def changed(event: WatchEvent) -> Message:
        return SecurityChanged(key=event.key, value=None if event.value is None else event.value.value)

    return await system.spawn(lambda: MetadataWatch(metadata=metadata, prefix=cr.SECURITY, target=gateway,
                                                    start_over=listing, on_event=changed),
                              name=f"security watch ({name})", parent=gateway)


class Refusals:
    """Counts and logs (rate-limited) the refusals of one port."""

    def __init__(self, port: str, clock: Clock) -> None:
        self.port = port
        self.clock = clock
        self.log = RefusalLog()
        self.refused = 0

    def is_refusal(self, exc: DanubeError) -> bool:
        return exc.code in REFUSAL_CODES

    def count(self, exc: DanubeError, who: str, request: str) -> None:
        """A refusal (`exc` UNAUTHENTICATED or PERMISSION_DENIED) of `request` from `who`."""
        self.refused += 1
        METRICS.requests_refused.labels(self.port, exc.code.name).inc()
        if self.log.should_log(who, self.clock.monotonic_ms() / 1000):
            log.warning("%s port: %s from %s refused, %s: %s (further refusals of it are not logged for a minute)",
                        self.port, request, who, exc.code.name, exc.message)


def who(enforcer: Enforcer, auth: SessionAuth | None) -> str:
    """A principal (or key) for the refusal log: never the token."""
    if auth is not None and auth.principal is not None:
        return str(auth.principal)
    if auth is not None and auth.key is not None:
        try:
            return str(enforcer.principal(auth))
        except DanubeError:
            return f"key {auth.key.decode('ascii', 'replace')}"
    return "an unauthenticated connection"


class AdminPrincipals:
    """Admin-port CURVE keys whose Connect carried a token -> that session's auth, the
    oldest forgotten past `entries_max` entries or `bytes_max` bytes. A key without an
    entry is its own principal (`SessionAuth(key)`)."""

    def __init__(self, *, entries_max: int, bytes_max: int) -> None:
        self.entries_max = entries_max
        self.bytes_max = bytes_max
        self.bytes = 0
        self._auth: OrderedDict[bytes, tuple[SessionAuth, int]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._auth)

    def get(self, key: bytes | None) -> SessionAuth:
        found = self._auth.get(key) if key is not None else None
        return found[0] if found is not None else SessionAuth(key=key)

    def bind(self, key: bytes, auth: SessionAuth) -> None:
        self.forget(key)
        size = len(key) + _ENTRY_BYTES_OVERHEAD
        if auth.claims is not None:
            size += len(auth.claims.subject.encode()) + len(auth.claims.jti.encode())
        self._auth[key] = (auth, size)
        self.bytes += size
        while len(self._auth) > self.entries_max or (self.bytes > self.bytes_max and len(self._auth) > 1):
            _, (_, dropped) = self._auth.popitem(last=False)
            self.bytes -= dropped

    def forget(self, key: bytes) -> None:
        entry = self._auth.pop(key, None)
        if entry is not None:
            self.bytes -= entry[1]

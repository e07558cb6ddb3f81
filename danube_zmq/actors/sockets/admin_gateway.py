"""The admin gateway: the broker's admin ROUTER socket (`broker.admin_listen`).

Admin traffic is low-rate control: the gateway answers `Connect` (version check)
and `Ping` itself, checks every other frame decodes, and forwards it to the broker
actor as `AdminRequest`; answers come back through the admin outbox. It keeps no
per-connection state, so `danube admin` can send a request without a handshake.

Which actor answers a request is one table, `ROUTES` (request type -> route).
Metadata-cluster requests (`CLUSTER_REQUESTS`: cluster status and membership, metadata
get/list/put/cas/delete) are answered here, from the broker's Raft metadata store, by
this actor's `handle_<Type>` methods (reached through the runtime, `handle_in_place`,
under its failure rule), each in a task of its own (bounded: beyond `_CLUSTER_TASKS_MAX` at once the answer is
RESOURCE_EXHAUSTED), since they wait on Raft rounds; a plain metadata put on the Raft
leader is proposed at once and answered from its apply, with no task (the same bound).
Snapshot requests
(`SNAPSHOT_REQUESTS`) go to the snapshot actor, policy requests (`POLICY_REQUESTS`:
backlog quotas, topic policies, namespace limits) to the broker's policy keeper,
namespace, topic-record and broker listings (`REGISTRY_REQUESTS`) to its registry
admin, the other admin requests to the broker actor.

The port is bounded like the client port (`actors/sockets/peers.py`, `actors/sockets/outbound.py`):
an admin connection with no request in flight is idle; at most
`connections_pending_max` may be idle at once (one more cuts the oldest) and one idle
for `connect_timeout_ms` is cut (a DEALER reconnects by itself on its next request);
bytes queued for a connection that does not read its answers are budgeted as on the
client port, and one stalled for `outbound_stall_timeout_ms` is cut; what libzmq
holds of a connection's input beyond `inbound_bytes_per_connection_max` cuts it.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, NamedTuple

import zmq
import zmq.asyncio

from danube_zmq.actors.broker import security_admin
from danube_zmq.actors.broker.broker_enforcement import (
    AdminPrincipals,
    Refusals,
    make_enforcer,
    spawn_security_watch,
    who,
)
from danube_zmq.actors.cluster import cluster_admin
from danube_zmq.actors.metrics import METRICS
from danube_zmq.actors.sockets.gateway import bind_or_close
from danube_zmq.actors.sockets.inbound_watch import InboundWatch
from danube_zmq.actors.sockets.outbound import OutboundLedger
from danube_zmq.actors.sockets.peers import Address, PeerGuard, shutdown_peer, zmtp_frame_bytes
from danube_zmq.config.broker_config import BrokerConfig
from danube_zmq.consensus.metadata_store import RaftMetadataStore
from danube_zmq.consensus.peer import NotLeader
from danube_zmq.runtime.actor import ADMIN_OUTBOX, Actor, Origin, Watched
from danube_zmq.runtime.request_tasks import RequestTasks
from danube_zmq.schemas.registry import SchemaRegistry
from danube_zmq.security.curve import ZAP_ADMIN, ClusterCurve, Credentials, key_of_frame
from danube_zmq.security.enforcement import Enforcer, SessionAuth
from danube_zmq.transport import admin_protocol as ap
from danube_zmq.transport.admin_protocol import (
    ADMIN_PROTOCOL,
    ADMIN_REQUESTS,
    CLUSTER_REQUESTS,
    POLICY_REQUESTS,
    REGISTRY_REQUESTS,
    SECURITY_REQUESTS,
    SNAPSHOT_REQUESTS,
)
from danube_zmq.transport.codec import Message
from danube_zmq.transport.common import PROTOCOL_VERSION, Connect, Connected, Error, Ping, Pong
from danube_zmq.transport.errors import BROKER_STARTING, DanubeError, ErrorCode, InvalidArgument, ResourceExhausted, Unavailable
from danube_zmq.transport.internal_protocol import AdminRequest, SecurityChanged, SecurityResync, Tick

if TYPE_CHECKING:
    from danube_zmq.runtime.system import ActorSystem

log = logging.getLogger("danube_zmq.admin_gateway")

class Route(NamedTuple):
    """Which actor answers an admin request: this gateway (`endpoint` None), or the one
    at a well-known endpoint of the system (the `ActorSystem` attribute named);
    `busy` answers a full mailbox there."""

    endpoint: str | None
    busy: str = ""


_BROKER = Route("broker_endpoint", "broker busy; retry")
ROUTES: dict[type[Message], Route] = {
    **dict.fromkeys(ADMIN_REQUESTS, _BROKER),
    **dict.fromkeys(CLUSTER_REQUESTS + SECURITY_REQUESTS, Route(None)),
    **dict.fromkeys(SNAPSHOT_REQUESTS, Route("snapshot_endpoint", "snapshot requests queued to the limit; retry")),
    # The policy keeper and the registry admin are parts of the broker: a full mailbox
    # there is the broker's.
    **dict.fromkeys(POLICY_REQUESTS, Route("policy_endpoint", _BROKER.busy)),
    **dict.fromkeys(REGISTRY_REQUESTS, Route("registry_admin_endpoint", _BROKER.busy)),
}

_DRAIN_MAX = 64
_CLUSTER_TASKS_MAX = 256
_TICK_MS = 250  # pending connections and outbound budgets


class AdminGateway(Actor):
    def __init__(self, *, config: BrokerConfig, broker_id: int, broker_url: str,
                 metadata: RaftMetadataStore | None = None, schemas: SchemaRegistry | None = None,
                 inbound: InboundWatch | None = None, curve: ClusterCurve | None = None,
                 credentials: Credentials | None = None) -> None:
        self.config = config
        self.inbound = inbound
        self.curve = curve  # security.mode curve: the port is a CURVE server (ZAP domain "admin")
        # security.mode curve: who a key is, the one check per request (its state
        # watched by a child), and the keys whose Connect brought a token.
        self.credentials = credentials
        self.enforcer: Enforcer | None = None
        self.refusals: Refusals | None = None
        self.principals = AdminPrincipals(entries_max=config.limits.admin_principals_max,
                                          bytes_max=config.limits.admin_principals_bytes_max)
        self.metadata = metadata
        self.schemas = schemas
        self._cluster_tasks = RequestTasks(_CLUSTER_TASKS_MAX)
        self._direct_puts = 0  # puts the leader answers from their apply, no task (same bound)
        self._stopped = False  # an answer arriving after on_stop is dropped (the socket is closed)
        self.broker_id = broker_id
        self.broker_url = broker_url
        self.router: zmq.asyncio.Socket | None = None
        self.outbox: zmq.asyncio.Socket | None = None
        self.bound_url = ""
        limits = config.limits
        self.outbound = OutboundLedger(connection_bytes_max=limits.outbound_bytes_per_connection_max,
                                       broker_bytes_max=limits.outbound_bytes_max,
                                       stall_ms=limits.outbound_stall_timeout_ms)
        self.peers: PeerGuard | None = None
        # A connection with requests in flight is not idle: identity -> [descriptor, requests],
        # and the descriptors (with their peer address) the peer guard counts as busy.
        self._in_flight: dict[bytes, list[int]] = {}
        self._busy_fds: dict[int, Address | None] = {}
        self._fd_of: dict[bytes, int] = {}  # identities with bytes queued, to cut a stalled one

    async def on_start(self) -> None:
        ctx = self.system.context
        limits = self.config.limits
        router = ctx.socket(zmq.ROUTER)
        router.setsockopt(zmq.LINGER, 0)
        router.setsockopt(zmq.MAXMSGSIZE, limits.frame_bytes_max)
        router.setsockopt(zmq.SNDHWM, limits.outbound_frames_max)
        router.setsockopt(zmq.ROUTER_MANDATORY, 1)
        router.setsockopt(zmq.HANDSHAKE_IVL, limits.connect_timeout_ms)
        if self.curve is not None:
            self.curve.serve(router, ZAP_ADMIN)
        await bind_or_close(router, self.config.broker.admin_listen, "admin")
        self.peers = PeerGuard(ctx, router, "admin", self._busy_fds, pending_max=limits.connections_pending_max,
                               timeout_ms=limits.connect_timeout_ms, inbound=self.inbound,
                               now_ms=self.system.clock.monotonic_ms)
        self.bound_url = router.getsockopt(zmq.LAST_ENDPOINT).decode()
        outbox = ctx.socket(zmq.PULL)
        outbox.setsockopt(zmq.LINGER, 0)
        outbox.setsockopt(zmq.RCVHWM, self.config.limits.outbound_frames_max)
        outbox.bind(ADMIN_OUTBOX)
        self.router, self.outbox = router, outbox
        self._router_sync = zmq.Socket.shadow(router.underlying)
        self._outbox_sync = zmq.Socket.shadow(outbox.underlying)
        self.system.schedule_periodic(self.endpoint, _TICK_MS, Tick())
        self.enforcer = make_enforcer(self.config, self.credentials, self.system.clock)
        if self.enforcer is not None:
            self.refusals = Refusals("admin", self.system.clock)
            if self.metadata is not None:
                await spawn_security_watch(self.system, self.metadata, self.endpoint, "admin")

    async def on_stop(self) -> None:
        self._stopped = True
        await self._cluster_tasks.cancel_all()
        if self.peers is not None:
            self.peers.close()
        for sock in (self.router, self.outbox):
            if sock is not None:
                sock.close(linger=0)

    def extra_sockets(self) -> list[Watched]:
        assert self.peers is not None
        sockets = [Watched(self.router, self._drain_router), Watched(self.outbox, self._drain_outbox)]
        if self.peers.monitor_on_loop:  # else the inbound watcher reads it
            sockets.append(Watched(self.peers.monitor, self._drain_peers))
        return sockets

    async def _drain_peers(self) -> None:
        assert self.peers is not None
        self.peers.drain(self.system.clock.monotonic_ms())

    async def _drain_router(self) -> None:
        peers = self.peers
        assert peers is not None
        hand = peers.hand
        now = self.system.clock.monotonic_ms()
        for _ in range(_DRAIN_MAX):
            try:
                head = self._router_sync.recv(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            # Part by part, as the client gateway: a message of more parts than ours is
            # refused, each extra part freed as it is read (docs/protocol.md, 3.1).
            body = self._router_sync.recv(copy=False)
            identity = head.bytes
            fd = body.get(zmq.SRCFD)
            received = zmtp_frame_bytes(len(body))
            parts = 1
            more = body.more
            while more:
                part = self._router_sync.recv(copy=False)
                received += zmtp_frame_bytes(len(part))
                parts += 1
                more = part.more
            hand(fd, received)
            peers.touch(fd, now)
            self._request_started(identity, fd)
            if parts != 1:
                self._reply(identity, Error(request_id=0, code=ErrorCode.INVALID_ARGUMENT,
                                            message=f"expected one frame per message, got {parts}"))
                continue
            key = key_of_frame(body) if self.curve is not None else None
            if not await self._on_frame(identity, body.bytes, key):
                return  # this instance failed and was replaced: its sockets are closed

    def _request_started(self, identity: bytes, fd: int) -> None:
        """Every admin frame is answered once: until then its connection is busy."""
        entry = self._in_flight.get(identity)
        if entry is None or entry[0] != fd:  # new, or reconnected on another connection
            if entry is not None:
                self._busy_fds.pop(entry[0], None)
            entry = self._in_flight[identity] = [fd, 0]
        entry[1] += 1
        self._fd_of[identity] = fd
        if self.peers is not None and fd not in self._busy_fds:
            self._busy_fds[fd] = self.peers.address(fd)
            self.peers.session_started(fd)

    def _request_answered(self, identity: bytes) -> None:
        entry = self._in_flight.get(identity)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] <= 0:
            del self._in_flight[identity]
            fd = entry[0]
            self._busy_fds.pop(fd, None)  # a ROUTER has one identity per connection
            if self.peers is not None:
                self.peers.session_ended(fd, self.system.clock.monotonic_ms())

    async def _drain_outbox(self) -> None:
        for _ in range(_DRAIN_MAX):
            try:
                frames = self._outbox_sync.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            self._send_out(frames)

    async def _on_frame(self, identity: bytes, frame: bytes, key: bytes | None = None) -> bool:
        """Answer or forward one admin frame; False when handling it failed this actor.
        `key`: the CURVE key ZAP authenticated for its connection, carried with the request."""
        try:
            msg = ADMIN_PROTOCOL.decode(frame)
        except InvalidArgument as exc:
            METRICS.bad_frames.inc()
            self._reply(identity, Error(request_id=0, code=exc.code, message=exc.message))
            return True
        if type(msg) is Connect:
            if msg.protocol_version != PROTOCOL_VERSION:
                self._reply(identity, Error(request_id=msg.request_id, code=ErrorCode.UNSUPPORTED_VERSION,
                                            message=f"protocol version {msg.protocol_version} is not supported;"
                                            f" this broker speaks {PROTOCOL_VERSION}"))
                return True
            if self.enforcer is not None and not self._bind_principal(identity, msg, key):
                return True
            broker = self.config.broker
            self._reply(identity, Connected(
                request_id=msg.request_id, protocol_version=PROTOCOL_VERSION, broker_id=self.broker_id,
                broker_url=self.broker_url, frame_bytes_max=self.config.limits.frame_bytes_max,
                message_bytes_max=self.config.policies.max_message_size,
                heartbeat_interval_ms=broker.heartbeat_interval_ms, session_timeout_ms=broker.session_timeout_ms))
            return True
        if type(msg) is Ping:
            self._reply(identity, Pong(request_id=msg.request_id))
            return True
        request_id = getattr(msg, "request_id", 0)
        if self.enforcer is not None and not self._permitted(identity, msg, key):
            return True
        route = ROUTES.get(type(msg))
        if route is None:
            self._reply(identity, Error(request_id=request_id, code=ErrorCode.INVALID_ARGUMENT,
                                        message=f"{type(msg).__name__} is not an admin request"))
            return True
        request = AdminRequest(identity=identity, frame=frame, public_key=key)
        if route.endpoint is None:  # answered here, by the handlers below
            return await self.system.handle_in_place(self.endpoint, request)
        target = getattr(self.system, route.endpoint)
        if not target:  # the port is bound before the actors behind it are spawned
            self._reply(identity, Error(request_id=request_id, code=ErrorCode.UNAVAILABLE,
                                        message=BROKER_STARTING))
        elif not self.system.tell(target, request):
            self._reply(identity, Error(request_id=request_id, code=ErrorCode.RESOURCE_EXHAUSTED, message=route.busy))
        return True

    def _bind_principal(self, identity: bytes, msg: Connect, key: bytes | None) -> bool:
        """A Connect on the admin port: its token (verified) is the principal of the
        key's later requests; without one, the key is. A bad token is refused and
        changes nothing."""
        assert self.enforcer is not None
        try:
            auth = self.enforcer.connect(msg.auth_token, key)
        except DanubeError as exc:
            self._refuse(identity, SessionAuth(key=key), exc, "Connect", msg.request_id)
            return False
        if key is not None:
            if auth.claims is not None:
                self.principals.bind(key, auth)
            else:
                self.principals.forget(key)
        return True

    def _permitted(self, identity: bytes, msg: Message, key: bytes | None) -> bool:
        """The one check of an admin request, before it is answered or forwarded."""
        assert self.enforcer is not None
        auth = self.principals.get(key)
        try:
            self.enforcer.check(auth, msg, _NO_SESSION)
        except DanubeError as exc:
            self._refuse(identity, auth, exc, type(msg).__name__, getattr(msg, "request_id", 0))
            return False
        return True

    def _refuse(self, identity: bytes, auth: SessionAuth, exc: DanubeError, request: str, request_id: int) -> None:
        assert self.refusals is not None and self.enforcer is not None
        if self.refusals.is_refusal(exc):
            self.refusals.count(exc, who(self.enforcer, auth), request)
        self._reply(identity, Error(request_id=request_id, code=exc.code, message=exc.message))

    # security.mode curve: the /security/ entries, from this gateway's watch.
    def handle_SecurityResync(self, msg: SecurityResync) -> None:
        assert self.enforcer is not None
        self.enforcer.resync(zip(msg.keys, msg.values, strict=True))

    def handle_SecurityChanged(self, msg: SecurityChanged) -> None:
        assert self.enforcer is not None
        self.enforcer.apply(msg.key, msg.value)

    # Metadata-cluster requests: each answered in a task (`cluster_admin`), as they wait on Raft.
    def handle_ClusterStatus(self, msg: ap.ClusterStatus, origin: Origin) -> None:
        self._answer_cluster_in_task(msg, origin, cluster_admin.cluster_status)

    def handle_AddClusterNode(self, msg: ap.AddClusterNode, origin: Origin) -> None:
        self._answer_cluster_in_task(msg, origin, cluster_admin.add_cluster_node)

    def handle_PromoteClusterNode(self, msg: ap.PromoteClusterNode, origin: Origin) -> None:
        self._answer_cluster_in_task(msg, origin, cluster_admin.promote_cluster_node)

    def handle_RemoveClusterNode(self, msg: ap.RemoveClusterNode, origin: Origin) -> None:
        self._answer_cluster_in_task(msg, origin, cluster_admin.remove_cluster_node)

    def handle_MetadataGet(self, msg: ap.MetadataGet, origin: Origin) -> None:
        self._answer_cluster_in_task(msg, origin, cluster_admin.metadata_get)

    def handle_MetadataList(self, msg: ap.MetadataList, origin: Origin) -> None:
        self._answer_cluster_in_task(msg, origin, cluster_admin.metadata_list)

    def handle_MetadataPut(self, msg: ap.MetadataPut, origin: Origin) -> None:
        if self.metadata is not None and self._direct_puts < _CLUSTER_TASKS_MAX:
            identity = origin.identity

            def answer(reply: Message | DanubeError) -> None:
                self._direct_puts -= 1
                if not self._stopped:
                    self._reply(identity, self._error_reply(msg, reply) if isinstance(reply, DanubeError) else reply)

            if cluster_admin.start_metadata_put(self.metadata, msg, answer):
                self._direct_puts += 1
                return
        self._answer_cluster_in_task(msg, origin, cluster_admin.metadata_put)

    def handle_MetadataCompareAndSwap(self, msg: ap.MetadataCompareAndSwap, origin: Origin) -> None:
        self._answer_cluster_in_task(msg, origin, cluster_admin.metadata_compare_and_swap)

    def handle_MetadataDelete(self, msg: ap.MetadataDelete, origin: Origin) -> None:
        self._answer_cluster_in_task(msg, origin, cluster_admin.metadata_delete)

    def handle_ConfigureTopicSchema(self, msg: ap.ConfigureTopicSchema, origin: Origin) -> None:
        self._answer_cluster_in_task(msg, origin, cluster_admin.configure_topic_schema)

    def handle_GetTopicSchemaConfig(self, msg: ap.GetTopicSchemaConfig, origin: Origin) -> None:
        self._answer_cluster_in_task(msg, origin, cluster_admin.get_topic_schema_config)

    # Security requests (roles, bindings, revocations, client keys): from the store too.
    def handle_CreateRole(self, msg: ap.CreateRole, origin: Origin) -> None:
        self._answer_security(msg, origin)

    def handle_ListRoles(self, msg: ap.ListRoles, origin: Origin) -> None:
        self._answer_security(msg, origin)

    def handle_DeleteRole(self, msg: ap.DeleteRole, origin: Origin) -> None:
        self._answer_security(msg, origin)

    def handle_CreateBinding(self, msg: ap.CreateBinding, origin: Origin) -> None:
        self._answer_security(msg, origin)

    def handle_ListBindings(self, msg: ap.ListBindings, origin: Origin) -> None:
        self._answer_security(msg, origin)

    def handle_DeleteBinding(self, msg: ap.DeleteBinding, origin: Origin) -> None:
        self._answer_security(msg, origin)

    def handle_RevokeToken(self, msg: ap.RevokeToken, origin: Origin) -> None:
        now_ms, leeway_ms = self.system.clock.now_ms(), self.config.security.jwt_leeway_ms
        self._answer_cluster_in_task(msg, origin, lambda store, _, m: security_admin.revoke_token(
            store, m, now_ms=now_ms, leeway_ms=leeway_ms))

    def handle_ListRevokedTokens(self, msg: ap.ListRevokedTokens, origin: Origin) -> None:
        self._answer_security(msg, origin)

    def handle_AddClientKey(self, msg: ap.AddClientKey, origin: Origin) -> None:
        self._answer_security(msg, origin)

    def handle_ListClientKeys(self, msg: ap.ListClientKeys, origin: Origin) -> None:
        self._answer_security(msg, origin)

    def handle_RemoveClientKey(self, msg: ap.RemoveClientKey, origin: Origin) -> None:
        self._answer_security(msg, origin)

    def _answer_security(self, msg: Message, origin: Origin) -> None:
        answer = security_admin.ANSWERS[type(msg)]
        self._answer_cluster_in_task(msg, origin, lambda store, _, m: answer(store, m))

    def _answer_cluster_in_task(self, msg: Message, origin: Origin, answer: cluster_admin.Answer) -> None:
        if self.metadata is None or self.schemas is None:
            raise Unavailable("this broker runs no metadata store")
        identity = origin.identity
        if not self._cluster_tasks.answer(answer(self.metadata, self.schemas, msg), type(msg).__name__,
                                          lambda reply: self._reply(identity, reply if isinstance(reply, Message)
                                                                    else self._error_reply(msg, reply))):
            raise ResourceExhausted("too many metadata requests in flight; retry")

    @staticmethod
    def _error_reply(msg: Message, exc: DanubeError) -> Error:
        text = exc.message
        if isinstance(exc, NotLeader) and exc.redirect_url:
            text += f" (raft peer at {exc.redirect_url})"
        return Error(request_id=msg.request_id, code=exc.code, message=text)  # type: ignore[attr-defined]

    def _send_out(self, frames: list[Any]) -> None:
        head, body = frames
        identity = head if type(head) is bytes else head.bytes
        self._request_answered(identity)
        size = len(body)
        outbound = self.outbound
        now = self.system.clock.monotonic_ms()
        if not outbound.admit(identity, size):
            METRICS.frames_dropped.inc()
            METRICS.outbound_frames_refused.labels("admin").inc()
            outbound.refused(identity, now)
            return
        tracker = None
        if outbound.should_track(identity, size):
            body = zmq.Frame(body.buffer if isinstance(body, zmq.Frame) else body, copy=False, track=True)
            tracker = body.tracker
        try:
            self._router_sync.send_multipart((head, body), zmq.NOBLOCK, copy=False)
        except zmq.ZMQError:
            METRICS.frames_dropped.inc()
            return
        outbound.sent(identity, size, tracker, now)
        outbound.should_pause(identity, now)  # paused: the stall clock runs (an admin peer has no consumers)

    def handle_Tick(self, msg: Tick) -> None:
        if self.peers is None:
            return
        now = self.system.clock.monotonic_ms()
        self.peers.review(now)
        _, stalled = self.outbound.review(now)
        for identity in stalled:
            METRICS.outbound_stalled.labels("admin").inc()
            fd = self._fd_of.pop(identity, None)
            address = self.peers.address(fd) if fd is not None else None
            if fd is not None and address is not None and shutdown_peer(fd, address):
                log.warning("admin connection from %s has not read its answers for %d ms: disconnected", address,
                            self.config.limits.outbound_stall_timeout_ms)
            self.outbound.forget_pause(identity)
        for identity in [i for i in self._fd_of if i not in self._in_flight and not self.outbound.queued(i)]:
            del self._fd_of[identity]

    def _reply(self, identity: bytes, msg: Message) -> None:
        self._send_out([identity, ADMIN_PROTOCOL.encode(msg)])


class _NoSession:
    """The admin port's resolver: admin requests name their resources, never a
    producer, consumer or schema id of a session."""

    def topic_of_producer(self, producer_id: int) -> str:
        raise InvalidArgument("an admin request names no producer")

    def topic_of_consumer(self, consumer_id: int) -> str:
        raise InvalidArgument("an admin request names no consumer")

    def subject_of_schema(self, schema_id: int) -> str:
        raise InvalidArgument("an admin request names no schema id")


_NO_SESSION = _NoSession()


def reply_admin(system: ActorSystem, identity: bytes, msg: Message) -> bool:
    """Send an admin answer to an admin connection through the admin outbox."""
    if system.push_frames(ADMIN_OUTBOX, [identity, ADMIN_PROTOCOL.encode(msg)]):
        return True
    METRICS.frames_dropped.inc()
    return False

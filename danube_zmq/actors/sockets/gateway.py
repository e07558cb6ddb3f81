"""The gateway: the broker's client-facing ROUTER socket and its sessions.

        clients (DEALER)                       topic / subscription actors
              |  frames                             |  [identity, frame]
        +-----v------------------------------------v-----+
        |  ROUTER (tcp)   Gateway actor   outbox (lane)   |
        |  sessions: identity -> producers, consumers     |
        +-----+-------------------------------------------+
              |  ClientRequest(identity, frame)  (mailboxes, in process)
              v
        broker (lookups, create, subscribe) | topic (send) | subscription (flow, ack)

1. A producer's `Send` on an attached producer is routed undecoded, by the request
   and producer ids at its head (`peek_send`): its topic decodes and checks it, one
   decode per batch on the broker (a frame that does not decode there is answered
   INVALID_ARGUMENT with the id at its head). Every other client frame is decoded
   once here; a bad one is answered with `Error` and the connection stays usable.
2. Each request type has a `handle_<Type>(msg, origin)` here, from the class's one
   handler table (a `DanubeError` it raises is the answer). Connection-level requests
   (Connect, Ping, HealthCheck) and schema requests are answered here.
3. Everything else is forwarded, with the raw frame, to the actor that owns it: the
   broker actor for lookups, producer creation and subscribe; its registry admin for
   a namespace's topics; the topic actor for a producer's sends; the subscription
   actor for a consumer's flow, acks and nacks.
4. Actors answer clients by pushing `[identity, frame]` to the outbox, which this
   actor relays to the ROUTER without decoding.
5. A connection silent for `session_timeout_ms` is closed: its producers and
   consumers are detached from their actors. That notice is told (a full mailbox
   drops it), so before refusing a name held by another connection a topic or
   subscription asks here whether the holder's session still holds it
   (`HolderLives`); a name whose holder is gone is given to the asker.
6. Outbound bytes are budgeted per connection and per broker (`actors/sockets/outbound.py`):
   a connection over budget has its consumers paused and frames to it refused; one
   paused for `outbound_stall_timeout_ms` is disconnected (`actors/sockets/peers.py`).
7. Inbound bytes that libzmq holds for a connection and has not handed over (an
   unfinished multipart message) are watched by a thread of their own; a connection
   over `inbound_bytes_per_connection_max`, or the largest holders when all hold more
   than `inbound_bytes_max`, are disconnected (`actors/sockets/inbound_watch.py`).
"""

from __future__ import annotations

import asyncio
import errno
import logging
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import zmq
import zmq.asyncio

from danube_zmq.actors.broker.broker_enforcement import Refusals, make_enforcer, spawn_security_watch, who
from danube_zmq.actors.metrics import METRICS
from danube_zmq.actors.schema import schema_service
from danube_zmq.actors.schema.topic_schema import resolve_producer_schema, spawn_binding_watch
from danube_zmq.actors.sockets.inbound_watch import InboundWatch
from danube_zmq.actors.sockets.outbound import OutboundLedger
from danube_zmq.actors.sockets.peers import Address, PeerGuard, peer_address, shutdown_peer, zmtp_frame_bytes
from danube_zmq.config.broker_config import BrokerConfig
from danube_zmq.consensus.metadata_store import RaftMetadataStore
from danube_zmq.runtime.actor import CLIENT_OUTBOX, Actor, Origin, Watched
from danube_zmq.runtime.request_tasks import RequestTasks
from danube_zmq.runtime.system import ActorSystem
from danube_zmq.schemas.registry import SchemaRegistry
from danube_zmq.security.curve import ZAP_CLIENT, ClusterCurve, Credentials, key_of_frame
from danube_zmq.security.enforcement import Enforcer, SessionAuth
from danube_zmq.transport import client_protocol as cp
from danube_zmq.transport import cluster_records as cr
from danube_zmq.transport.codec import Message, peek_ints, peek_request_id
from danube_zmq.transport.common import PROTOCOL_VERSION, Connect, Connected, Error, Ping, Pong
from danube_zmq.transport.errors import (
    BROKER_STARTING,
    DanubeError,
    ErrorCode,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    Unavailable,
    UnsupportedVersion,
)
from danube_zmq.transport.internal_protocol import (
    AdminRequest,
    ClientRequest,
    ClientRequests,
    ConsumerAttached,
    ConsumerDetached,
    ConsumerPaused,
    DeliveryRefused,
    DetachConsumer,
    DetachProducer,
    HolderLiveness,
    HolderLives,
    ProducerAttached,
    ProducerDetached,
    SecurityChanged,
    SecurityResync,
    Tick,
    TopicSchemaChanged,
)

log = logging.getLogger("danube_zmq.gateway")

OUTBOX = CLIENT_OUTBOX
_DRAIN_MAX = 512
# pyzmq's flags as plain ints: its enum.Flag operators cost a Python call per frame
# (5% of the broker's main thread at 5k batches/s).
_NOBLOCK = int(zmq.NOBLOCK)
_NOBLOCK_MORE = int(zmq.NOBLOCK | zmq.SNDMORE)

# pyzmq's `Socket.send` (Python) checks its keyword arguments and, with copy=False, wraps
# a small part in a Frame only to copy it anyway (below `copy_threshold`): 0.77 µs a part
# against 0.19 for the compiled send of a copy, four parts a message delivered.
_COPY_BELOW = zmq.COPY_THRESHOLD
_send_copy = zmq.backend.Socket.send


def _send(router: zmq.Socket, part: Any, flags: int) -> None:
    if type(part) is bytes and len(part) < _COPY_BELOW:
        _send_copy(router, part, flags)
    else:
        router.send(part, flags, copy=False)  # a Frame (tracked), or big enough to send without a copy

_SCHEMA_TASKS_MAX = 256  # schema requests and producer creations in flight (each waits on metadata-store rounds)
_TICK_MS = 125
_REVIEW_EVERY_TICKS = 2  # sessions, pending connections and outbound budgets: every 250 ms
_CLIENT_REQUESTS = frozenset(cp.CLIENT_REQUESTS)
_SESSIONLESS = frozenset((Connect, *cp.SCHEMA_REQUESTS))  # no session needed (schema requests are stateless)


@dataclass(slots=True)
class Session:
    """One client connection, keyed by its DEALER identity."""

    client_name: str
    last_seen_ms: int
    producers: dict[int, str] = field(default_factory=dict)  # producer_id -> topic actor
    consumers: dict[int, str] = field(default_factory=dict)  # consumer_id -> subscription actor
    fd: int | None = None  # the TCP connection it came on (ZMQ_SRCFD), to disconnect it
    address: Address | None = None
    # security.mode curve: the Z85 CURVE key ZAP authenticated for the connection that
    # sent Connect (the frame's User-Id, never the payload); who it is:
    # `Credentials.principal_of_key`. Every later request must come with the same key.
    public_key: bytes | None = None
    # security.mode curve: what its Connect authenticated (token claims, key), and the
    # topics of its producers and consumers (the resources of their requests).
    auth: SessionAuth | None = None
    producer_topics: dict[int, str] = field(default_factory=dict)
    consumer_topics: dict[int, str] = field(default_factory=dict)

    # The permission check's `Resolver`: ids are the session's own, never another's.
    def topic_of_producer(self, producer_id: int) -> str:
        topic = self.producer_topics.get(producer_id)
        if topic is None:
            raise NotFound(f"producer {producer_id} is not attached on this connection")
        return topic

    def topic_of_consumer(self, consumer_id: int) -> str:
        topic = self.consumer_topics.get(consumer_id)
        if topic is None:
            raise NotFound(f"consumer {consumer_id} is not attached on this connection")
        return topic

    def subject_of_schema(self, schema_id: int) -> str:
        # GetSchema by id is checked in its task, once the registry named the subject.
        raise AssertionError("a schema id is resolved by the registry, not the session")


class _SubjectOf:
    """The resolver of a GetSchema by id: the subject the registry found for it."""

    def __init__(self, subject: str) -> None:
        self.subject = subject

    def topic_of_producer(self, producer_id: int) -> str:
        raise NotFound(f"producer {producer_id} is not attached on this connection")

    topic_of_consumer = topic_of_producer

    def subject_of_schema(self, schema_id: int) -> str:
        return self.subject


class Gateway(Actor):
    def __init__(self, *, config: BrokerConfig, broker_id: int, schemas: SchemaRegistry | None = None,
                 inbound: InboundWatch | None = None, curve: ClusterCurve | None = None,
                 credentials: Credentials | None = None, metadata: RaftMetadataStore | None = None) -> None:
        self.config = config
        self.inbound = inbound
        self.curve = curve  # security.mode curve: the port is a CURVE server (ZAP domain "client")
        # security.mode curve: who a key is (ZAP's credentials, fed the allow-list from
        # here), the one check per request, and the store its state is watched in.
        self.credentials = credentials
        self.metadata = metadata
        self.enforcer: Enforcer | None = None
        self.refusals: Refusals | None = None
        self.broker_id = broker_id
        self.schemas = schemas
        self._schema_tasks = RequestTasks(_SCHEMA_TASKS_MAX)
        self.sessions: dict[bytes, Session] = {}
        self.router: zmq.asyncio.Socket | None = None
        self.bound_url = ""
        self.frames_in = 0
        self.frames_out = 0
        self.frames_dropped = 0
        self.bad_frames = 0
        limits = config.limits
        self.outbound = OutboundLedger(connection_bytes_max=limits.outbound_bytes_per_connection_max,
                                       broker_bytes_max=limits.outbound_bytes_max,
                                       stall_ms=limits.outbound_stall_timeout_ms)
        self.peers: PeerGuard | None = None
        self._session_fds: dict[int, Address | None] = {}  # the TCP connections that carry a session
        self._frame: Any = None  # the client frame being handled (its ZMQ_SRCFD names the connection)
        # Batches of attached producers read this round, by topic endpoint: (identities,
        # frames, request ids), told at the end of the round (`_release_held`).
        self._held: dict[str, tuple[list[bytes], list[Any], list[int]]] = {}
        self._held_bytes: dict[str, int] = {}  # endpoint -> the bytes of its held frames
        self._read_carry = 0  # <= 0: requests read beyond earlier rounds' budgets (`_read_router`)
        self._ticks = 0

    # ------------------------------------------------------------- lifecycle
    async def on_start(self) -> None:
        limits = self.config.limits
        ctx = self.system.context
        router = ctx.socket(zmq.ROUTER)
        router.setsockopt(zmq.LINGER, 0)
        router.setsockopt(zmq.MAXMSGSIZE, limits.frame_bytes_max)
        router.setsockopt(zmq.SNDHWM, limits.outbound_frames_max)
        router.setsockopt(zmq.RCVHWM, limits.mailbox_messages_max)
        # Fail loudly (EHOSTUNREACH / EAGAIN) instead of dropping silently, so that
        # frames to gone or slow clients are counted.
        router.setsockopt(zmq.ROUTER_MANDATORY, 1)
        # A connection never displaces a live one with the same routing id: with
        # ROUTER_HANDOVER anyone who learned a session's id (no key, no token) took its
        # pipe and every later Deliver. A duplicate stays unread until the first pipe is
        # gone; ZMTP heartbeats end a half-open first pipe within the session timeout, so
        # a client reconnecting with its id is not locked out for longer than that.
        router.setsockopt(zmq.ROUTER_HANDOVER, 0)
        router.setsockopt(zmq.HEARTBEAT_IVL, self.config.broker.heartbeat_interval_ms)
        router.setsockopt(zmq.HEARTBEAT_TIMEOUT, self.config.broker.session_timeout_ms)
        # A peer that does not finish the ZMTP handshake in time is dropped by libzmq;
        # one that does but sends no Connect is dropped by the peer guard.
        router.setsockopt(zmq.HANDSHAKE_IVL, limits.connect_timeout_ms)
        if self.curve is not None:
            self.curve.serve(router, ZAP_CLIENT)
        await bind_or_close(router, self.config.broker.listen, "client")
        self.peers = PeerGuard(ctx, router, "client", self._session_fds, pending_max=limits.connections_pending_max,
                               timeout_ms=limits.connect_timeout_ms, inbound=self.inbound,
                               on_inbound_cut=self._end_session_on, now_ms=self.system.clock.monotonic_ms)
        self.bound_url = router.getsockopt(zmq.LAST_ENDPOINT).decode()
        # What actors send to clients comes as [identity, frame] on a lane of this actor's
        # task (no socket between actors of one process), at most outbound_frames_max.
        self.system.open_lane(OUTBOX, self.endpoint, limits.outbound_frames_max)
        self.router = router
        self._router_sync = zmq.Socket.shadow(router.underlying)
        self.system.schedule_periodic(self.endpoint, _TICK_MS, Tick())
        if self.schemas is not None and self.metadata is not None:
            await spawn_binding_watch(self.system, self.metadata, self.schemas, self.endpoint)
        self.enforcer = make_enforcer(self.config, self.credentials, self.system.clock)
        if self.enforcer is not None:
            self.refusals = Refusals("client", self.system.clock)
            if self.metadata is not None:
                await spawn_security_watch(self.system, self.metadata, self.endpoint, "client")

    async def on_stop(self) -> None:
        await self._schema_tasks.cancel_all()
        if self.peers is not None:
            self.peers.close()
        if not self.restarting:
            self.system.close_lane(OUTBOX)
        if self.router is not None:
            self.router.close(linger=0)

    def extra_sockets(self) -> list[Watched]:
        assert self.peers is not None
        sockets = [Watched(self.router, self._drain_router, reads_dry=True)]
        if self.peers.monitor_on_loop:  # else the inbound watcher reads it
            sockets.append(Watched(self.peers.monitor, self._drain_peers))
        return sockets

    async def _drain_peers(self) -> None:
        assert self.peers is not None
        self.peers.drain(self.system.clock.monotonic_ms())

    @property
    def advertised_url(self) -> str:
        return self.config.broker.advertised_url or self.bound_url

    # ------------------------------------------------------------- socket side
    async def _drain_router(self) -> bool:
        """True when the ROUTER was read until EAGAIN (`Watched.reads_dry`): what follows
        the last read (telling the held batches) does not touch the socket."""
        assert self.peers is not None
        try:
            return self._read_router(self.peers.hand)
        finally:
            self._release_held()

    def _read_router(self, hand: Any) -> bool:
        """Read and handle about `_DRAIN_MAX` requests a round, on average: requests, not
        messages, since a message may hold many, and the answers of a round (receipts,
        deliveries) go through the outbox lane, which `drain_lane` empties `_DRAIN_MAX`
        frames a round. A message read whole past the round's budget is taken from the
        next rounds' (`_read_carry`), so reading never outruns the lane's drain. True when it read the socket dry."""
        parts_max = self.config.limits.requests_per_message_max
        budget = _DRAIN_MAX + self._read_carry
        if budget <= 0:
            self._read_carry = budget
            return False
        requests, dry = self._read_requests(hand, parts_max, budget)
        self._read_carry = min(0, budget - requests)
        return dry

    def _read_requests(self, hand: Any, parts_max: int, budget: int) -> tuple[int, bool]:
        """The requests read: `budget` or more (the last message is read whole), or fewer
        when the socket has no more; and whether it had no more (EAGAIN)."""
        requests = 0
        while requests < budget:
            try:
                # Without a copy: a batch is up to a MiB, and a bytes copy of it costs an
                # allocation that faults its pages in (runtime/system.py, _drain_mailbox).
                head = self._router_sync.recv(_NOBLOCK, copy=False)
            except zmq.Again:
                return requests, True
            body = self._router_sync.recv(copy=False)
            identity = head.bytes
            fd = _source_fd(body)  # -1 on inproc (the in-process tests): not counted
            received = zmtp_frame_bytes(len(body))
            if not body.more:
                hand(fd, received)
                self.frames_in += 1
                requests += 1
                self._frame = body
                self._on_client_frame(identity, body.buffer)
                continue
            # Several requests in one message, a part each (docs/protocol.md): each is
            # handled as a lone one. Part by part: past requests_per_message_max each
            # extra part is freed as it is read (libzmq itself has buffered the whole
            # message: see docs/protocol.md, "What libzmq buffers").
            parts, last, count = [body], body, 1
            while last.more:
                last = self._router_sync.recv(_NOBLOCK, copy=False)  # there: a message arrives whole
                received += zmtp_frame_bytes(len(last))
                count += 1
                if count <= parts_max:
                    parts.append(last)
            hand(fd, received)
            if count > parts_max:
                self.bad_frames += 1
                self._reply(identity, Error(request_id=0, code=ErrorCode.INVALID_ARGUMENT,
                                            message=f"a message holds at most {parts_max} requests"
                                                    f" (requests_per_message_max), got {count}"))
                requests += 1  # one answer, whatever the parts: a hostile count costs no rounds
                continue
            self.frames_in += count
            requests += count
            for part in parts:
                self._frame = part
                self._on_client_frame(identity, part.buffer)
        return requests, False

    def drain_lane(self, frames: deque[list[Any]]) -> None:
        """Relay what actors sent to clients (the outbox lane) to the ROUTER: what one
        round holds for one connection goes as one ZeroMQ message, a protocol frame per
        part (docs/protocol.md), so a busy connection costs one libzmq message (one
        I/O-thread wake-up) per round rather than per frame."""
        rounds: dict[bytes, list[Any]] = {}  # identity -> [identity part, frame, frame, ...]
        now = self.system.clock.monotonic_ms()
        for _ in range(_DRAIN_MAX):
            if not frames:
                break
            head, body = frames.popleft()
            identity = head if type(head) is bytes else head.bytes
            body = self._admit(identity, body, now)
            if body is None:
                continue
            parts = rounds.get(identity)
            if parts is None:
                rounds[identity] = [head, body]
            else:
                parts.append(body)
        for identity, parts in rounds.items():
            self._send_parts(identity, parts, now)

    def _send_out(self, frames: list[Any]) -> None:
        head, body = frames
        identity = head if type(head) is bytes else head.bytes
        now = self.system.clock.monotonic_ms()
        body = self._admit(identity, body, now)
        if body is not None:
            self._send_parts(identity, [head, body], now)

    def _admit(self, identity: bytes, body: Any, now: int) -> Any:
        """`body` (a zero-copy tracked frame when the ledger wants one) counted as handed
        to libzmq, or None when the connection's or the broker's budget refuses it."""
        size = len(body)
        outbound = self.outbound
        if not outbound.admit(identity, size):
            self.frames_dropped += 1
            METRICS.frames_dropped.inc()
            METRICS.outbound_frames_refused.labels("client").inc()
            if outbound.refused(identity, now):
                self._pause(identity, True)
            self._tell_refused(identity, body)
            return None
        tracker = None
        if outbound.should_track(identity, size):
            body = zmq.Frame(body.buffer if isinstance(body, zmq.Frame) else body, copy=False, track=True)
            tracker = body.tracker
        # Counted now, before the round's send, so that the next frame of the round is
        # admitted against it. Should the send fail (the client gone or its queue full),
        # the ledger releases these bytes at its next review (untracked ones; a tracked
        # frame never sent is done once freed).
        outbound.sent(identity, size, tracker, now)
        return body

    def _send_parts(self, identity: bytes, parts: list[Any], now: int) -> None:
        """[identity part, frame, ...] as one ZeroMQ message."""
        router = self._router_sync
        frames = len(parts) - 1
        try:
            # Part by part, not send_multipart (which checks each part and ORs enum
            # flags): once the identity part is taken, a ROUTER takes the rest.
            _send(router, parts[0], _NOBLOCK_MORE)
        except zmq.ZMQError:
            # EAGAIN: the client's queue is full; EHOSTUNREACH: it is gone.
            self.frames_dropped += frames
            METRICS.frames_dropped.inc(frames)
            return
        for body in parts[1:-1]:
            _send(router, body, _NOBLOCK_MORE)
        _send(router, parts[-1], _NOBLOCK)
        self.frames_out += frames
        if self.outbound.should_pause(identity, now):
            self._pause(identity, True)

    def _tell_refused(self, identity: bytes, body: Any) -> None:
        """A refused `Deliver`: its subscription delivers the offsets again on resume
        instead of after the ack timeout (a large backlog stalled for rounds of it)."""
        frame = body.buffer if isinstance(body, zmq.Frame) else body
        if peek_ints(frame, cp.Deliver.TAG, 1) is None:
            return
        session = self.sessions.get(identity)
        deliver = cp.CLIENT_PROTOCOL.decode(frame)
        endpoint = None if session is None else session.consumers.get(deliver.consumer_id)
        if endpoint is None:
            return
        offsets = deliver.offsets if deliver.offsets is not None else \
            list(range(deliver.base_offset, deliver.base_offset + len(deliver.payloads)))
        self.system.post(endpoint, DeliveryRefused(identity=identity, consumer_id=deliver.consumer_id,
                                                   offsets=offsets))

    def _pause(self, identity: bytes, paused: bool) -> None:
        """Tell the subscriptions of the connection's consumers to stop (or resume)
        delivering to them."""
        session = self.sessions.get(identity)
        if session is None:
            return
        if paused:
            log.info("connection %s (%s) holds %d unsent bytes: its consumers are paused", identity.hex(),
                     session.client_name, self.outbound.queued(identity))
            METRICS.consumers_paused.inc(len(session.consumers))
        for consumer_id, endpoint in session.consumers.items():
            self.system.post(endpoint, ConsumerPaused(identity=identity, consumer_id=consumer_id, paused=paused))

    def _reply(self, identity: bytes, msg: Message) -> None:
        self._send_out([identity, cp.CLIENT_PROTOCOL.encode(msg)])

    # ------------------------------------------------------------- requests
    def _on_client_frame(self, identity: bytes, frame: bytes) -> None:
        ids = cp.peek_send(frame)
        if ids is not None:
            # A batch of an attached producer is routed by its ids alone: its topic
            # decodes and checks it (one decode per batch on the broker, not two).
            # Anything else is decoded here, so that its error names the fault.
            session = self.sessions.get(identity)
            endpoint = session.producers.get(ids[1]) if session is not None else None
            if endpoint is not None:
                if self.curve is not None and (self._foreign_key(identity, session, ids[0])
                                               or not self._send_permitted(identity, session, ids)):
                    return
                session.last_seen_ms = self.system.clock.monotonic_ms()
                self._hold_send(endpoint, identity, frame, ids[0])
                return
        try:
            msg = cp.CLIENT_PROTOCOL.decode(frame)
        except InvalidArgument as exc:
            self.bad_frames += 1
            METRICS.bad_frames.inc()
            self._reply(identity, Error(request_id=peek_request_id(frame), code=exc.code, message=exc.message))
            return
        name = type(msg).__name__
        entry = self._handlers.get(name) if type(msg) in _CLIENT_REQUESTS else None
        if entry is None:
            self._reply(identity, Error(request_id=getattr(msg, "request_id", 0), code=ErrorCode.INVALID_ARGUMENT,
                                        message=f"{name} is not a request a client may send"))
            return
        # security.mode curve: schema requests too need the session, whose Connect
        # says who sends them.
        if type(msg) not in _SESSIONLESS or (self.curve is not None and type(msg) is not Connect):
            session = self.sessions.get(identity)
            if session is None:
                if hasattr(msg, "request_id"):
                    self._reply(identity, Error(request_id=msg.request_id, code=ErrorCode.UNAVAILABLE,
                                                message="connection not established: send Connect first"))
                return
            if self.curve is not None and (self._foreign_key(identity, session, getattr(msg, "request_id", None))
                                           or not self._permitted(identity, session, msg)):
                return
            session.last_seen_ms = self.system.clock.monotonic_ms()
        # The runtime's failure rule, in place: a DanubeError is the answer, anything else
        # fails this actor (raised out of the socket's drain).
        try:
            entry[0](self, msg, Origin(port="client", identity=identity,
                                       envelope=ClientRequest(identity=identity, frame=frame)))
        except DanubeError as exc:
            if hasattr(msg, "request_id"):
                self._reply(identity, Error(request_id=msg.request_id, code=exc.code, message=exc.message))

    def _foreign_key(self, identity: bytes, session: Session, request_id: int | None) -> bool:
        """Whether the frame being handled came with another CURVE key than the session's
        Connect. Its connection holds the session's routing id, which it can only have
        taken once the session's own connection was gone: the session ends now (nothing
        of it may be routed to this pipe), and the connection is cut."""
        key = key_of_frame(self._frame)
        if key == session.public_key:
            return False
        self.bad_frames += 1
        log.warning("connection %s came with CURVE key %s, not its session's (%s): session closed, connection cut",
                    identity.hex(), (key or b"none").decode("ascii", "replace"), session.client_name)
        if request_id is not None:
            self._reply(identity, Error(request_id=request_id, code=ErrorCode.UNAUTHENTICATED,
                                        message="this connection's CURVE key is not the key its session connected"
                                                " with: send Connect"))
        self._close_session(identity, session)
        fd = _source_fd(self._frame)
        if fd >= 0:
            shutdown_peer(fd, None)
        return True

    def _send_permitted(self, identity: bytes, session: Session, ids: tuple[int, int]) -> bool:
        """The check of a batch routed undecoded: Produce on its producer's topic."""
        enforcer = self.enforcer
        assert enforcer is not None
        try:
            enforcer.check_send(session.auth, session.topic_of_producer(ids[1]))
        except DanubeError as exc:
            self._refuse(identity, session.auth, exc, "Send", ids[0])
            return False
        return True

    def _permitted(self, identity: bytes, session: Session, msg: Message) -> bool:
        """The one check of a decoded request, before its handler: False when refused
        (answered here, nothing forwarded)."""
        enforcer = self.enforcer
        assert enforcer is not None
        if type(msg) is cp.GetSchema and msg.subject is None and msg.schema_id is not None:
            return True  # checked in its task, once the registry named the subject (`handle_GetSchema`)
        try:
            enforcer.check(session.auth, msg, session)
        except DanubeError as exc:
            self._refuse(identity, session.auth, exc, type(msg).__name__, getattr(msg, "request_id", None))
            return False
        return True

    def _refuse(self, identity: bytes, auth: SessionAuth | None, exc: DanubeError, request: str,
                request_id: int | None) -> None:
        """Count and log a refusal (UNAUTHENTICATED, PERMISSION_DENIED) and answer it."""
        refusals, enforcer = self.refusals, self.enforcer
        assert refusals is not None and enforcer is not None
        if refusals.is_refusal(exc):
            refusals.count(exc, who(enforcer, auth), request)
        if request_id is not None:
            self._reply(identity, Error(request_id=request_id, code=exc.code, message=exc.message))

    def _session(self, origin: Origin) -> Session:
        """The request's session (`_on_client_frame` checked there is one)."""
        return self.sessions[origin.identity]

    # Connection-level requests, answered here.
    def handle_Connect(self, msg: Connect, origin: Origin) -> None:
        identity = origin.identity
        if msg.protocol_version != PROTOCOL_VERSION:
            raise UnsupportedVersion(f"protocol version {msg.protocol_version} is not supported;"
                                     f" this broker speaks {PROTOCOL_VERSION}")
        auth = None
        if self.enforcer is not None:
            # A bad token refuses the Connect and changes nothing; a good one (or none:
            # the key's principal) is bound to the new session.
            try:
                auth = self.enforcer.connect(msg.auth_token, key_of_frame(self._frame))
            except DanubeError as exc:
                self._refuse(identity, SessionAuth(key=key_of_frame(self._frame)), exc, "Connect", None)
                raise
        session = self.sessions.get(identity)
        if session is not None:
            self._close_session(identity, session)  # a reconnect starts from scratch
        elif len(self.sessions) >= self.config.limits.connections_max:
            raise ResourceExhausted(f"connection limit reached ({self.config.limits.connections_max})")
        fd = _source_fd(self._frame)
        session = self.sessions[identity] = Session(
            client_name=msg.client_name, last_seen_ms=self.system.clock.monotonic_ms(),
            fd=fd if fd >= 0 else None, address=peer_address(fd) if fd >= 0 else None,
            public_key=key_of_frame(self._frame) if self.curve is not None else None, auth=auth)
        if session.fd is not None:
            self._session_fds[session.fd] = session.address
            if self.peers is not None:
                self.peers.session_started(session.fd)
        METRICS.connections.set(len(self.sessions))
        broker = self.config.broker
        self._reply(identity, Connected(
            request_id=msg.request_id, protocol_version=PROTOCOL_VERSION, broker_id=self.broker_id,
            broker_url=self.advertised_url, frame_bytes_max=self.config.limits.frame_bytes_max,
            message_bytes_max=self.config.policies.max_message_size,
            heartbeat_interval_ms=broker.heartbeat_interval_ms, session_timeout_ms=broker.session_timeout_ms,
        ))

    def handle_Ping(self, msg: Ping, origin: Origin) -> None:
        self._reply(origin.identity, Pong(request_id=msg.request_id))

    def handle_HealthCheck(self, msg: cp.HealthCheck, origin: Origin) -> None:
        session = self._session(origin)
        owned = session.producers if msg.client_kind == cp.ClientKind.PRODUCER else session.consumers
        status = cp.HealthState.OK if msg.client_id in owned else cp.HealthState.CLOSE
        self._reply(origin.identity, cp.HealthStatus(request_id=msg.request_id, status=status))

    # Requests the broker actor answers (topics served here, producer and consumer creation).
    def handle_Lookup(self, msg: cp.Lookup, origin: Origin) -> None:
        self._forward(self.system.broker_endpoint, origin.envelope, msg.request_id)

    def handle_GetPartitions(self, msg: cp.GetPartitions, origin: Origin) -> None:
        self._forward(self.system.broker_endpoint, origin.envelope, msg.request_id)

    # The registry admin answers it from the topic records, as it answers the admin ListTopics.
    def handle_GetTopicsOfNamespace(self, msg: cp.GetTopicsOfNamespace, origin: Origin) -> None:
        endpoint = self.system.registry_admin_endpoint
        if not endpoint:  # the port is bound before the broker actor spawns it
            raise Unavailable(BROKER_STARTING)
        self._forward(endpoint, origin.envelope, msg.request_id)

    def handle_CreateProducer(self, msg: cp.CreateProducer, origin: Origin) -> None:
        cap = self.config.limits.producers_per_connection_max
        if len(self._session(origin).producers) >= cap:
            raise ResourceExhausted(f"this connection already has {cap} producers (producers_per_connection_max)")
        if self.schemas is None:
            if msg.schema_subject is not None:
                raise FailedPrecondition("this broker runs no schema registry")
            self._forward(self.system.broker_endpoint, origin.envelope, msg.request_id)
        elif not self._schema_tasks.start(self._create_producer(origin, msg, self.schemas)):
            raise ResourceExhausted("too many producers being created; retry")

    async def _create_producer(self, origin: Origin, msg: cp.CreateProducer, registry: SchemaRegistry) -> None:
        """Resolve the producer's schema and the topic's binding, then let the broker
        create the producer with them."""
        try:
            schema = await resolve_producer_schema(registry, msg)
        except DanubeError as exc:
            self._reply(origin.identity, Error(request_id=msg.request_id, code=exc.code, message=exc.message))
            return
        envelope = origin.envelope
        self._forward(self.system.broker_endpoint,
                      ClientRequest(identity=envelope.identity, frame=envelope.frame, schema=schema), msg.request_id)

    def handle_Subscribe(self, msg: cp.Subscribe, origin: Origin) -> None:
        cap = self.config.limits.consumers_per_connection_max
        if len(self._session(origin).consumers) >= cap:
            raise ResourceExhausted(f"this connection already has {cap} consumers (consumers_per_connection_max)")
        self._forward(self.system.broker_endpoint, origin.envelope, msg.request_id)

    # A producer's requests go to its topic actor.
    def handle_Send(self, msg: cp.Send, origin: Origin) -> None:
        self._to_producer(msg.producer_id, msg.request_id, origin)

    def handle_CloseProducer(self, msg: cp.CloseProducer, origin: Origin) -> None:
        self._to_producer(msg.producer_id, msg.request_id, origin)

    def _to_producer(self, producer_id: int, request_id: int, origin: Origin) -> None:
        endpoint = self._session(origin).producers.get(producer_id)
        if endpoint is None:
            raise NotFound(f"producer {producer_id} is not attached on this connection")
        self._forward(endpoint, origin.envelope, request_id)

    # A consumer's requests go to its subscription actor.
    def handle_Flow(self, msg: cp.Flow, origin: Origin) -> None:
        self._to_consumer(msg.consumer_id, None, origin)  # a stray Flow has no one to answer

    def handle_Ack(self, msg: cp.Ack, origin: Origin) -> None:
        self._to_consumer(msg.consumer_id, msg.request_id, origin)

    def handle_Nack(self, msg: cp.Nack, origin: Origin) -> None:
        self._to_consumer(msg.consumer_id, msg.request_id, origin)

    def handle_Unsubscribe(self, msg: cp.Unsubscribe, origin: Origin) -> None:
        self._to_consumer(msg.consumer_id, msg.request_id, origin)

    def handle_CloseConsumer(self, msg: cp.CloseConsumer, origin: Origin) -> None:
        self._to_consumer(msg.consumer_id, msg.request_id, origin)

    def handle_Seek(self, msg: cp.Seek, origin: Origin) -> None:
        self._to_consumer(msg.consumer_id, msg.request_id, origin)

    def handle_GetLastOffset(self, msg: cp.GetLastOffset, origin: Origin) -> None:
        self._to_consumer(msg.consumer_id, msg.request_id, origin)

    def _to_consumer(self, consumer_id: int, request_id: int | None, origin: Origin) -> None:
        endpoint = self._session(origin).consumers.get(consumer_id)
        if endpoint is None:
            raise NotFound(f"consumer {consumer_id} is not attached on this connection")
        self._forward(endpoint, origin.envelope, request_id)

    def _hold_send(self, endpoint: str, identity: bytes, frame: bytes, request_id: int) -> None:
        """Keep a batch for its topic until the end of this round of the socket
        (`_release_held`), so that the round's batches for one topic reach it as one
        mailbox message (one push, one wake-up)."""
        held = self._held.get(endpoint)
        if held is not None and self._held_bytes.get(endpoint, 0) + len(frame) > self.system.mailbox_bytes_max:
            # A group is one mailbox message: past the mailbox's byte bound it would go in
            # whole (an empty mailbox takes one message of any size), so it is told now.
            self._release_held(endpoint)
            held = None
        if held is None:
            self._held[endpoint] = ([identity], [frame], [request_id])
            self._held_bytes[endpoint] = len(frame)
        else:
            self._held_bytes[endpoint] += len(frame)
            held[0].append(identity)
            held[1].append(frame)
            held[2].append(request_id)

    def _release_held(self, endpoint: str | None = None) -> None:
        """Tell the topics the batches held for them (one, or all): before anything else
        goes to that topic, so that each connection's requests keep their order."""
        if not self._held:
            return
        if endpoint is None:
            held, self._held = self._held, {}
            self._held_bytes.clear()
        elif endpoint in self._held:
            held = {endpoint: self._held.pop(endpoint)}
            del self._held_bytes[endpoint]
        else:
            return
        # An idle topic handles them at once on this task (`ActorSystem.handle_now`): its
        # receipts and deliveries leave with this round, with no task switch either way.
        handle_now = self.system.handle_now
        for target, (identities, frames, request_ids) in held.items():
            if len(frames) == 1:
                envelope = ClientRequest(identity=identities[0], frame=frames[0])
                if not handle_now(target, envelope):
                    self._forward(target, envelope, request_ids[0])
                continue
            batches = ClientRequests(identities=identities, frames=frames)
            if not handle_now(target, batches) and not self.system.tell(target, batches):
                for identity, request_id in zip(identities, request_ids, strict=True):
                    self._reply_busy(identity, request_id)

    def _forward(self, endpoint: str, envelope: ClientRequest | AdminRequest, request_id: int | None) -> None:
        """Tell `endpoint` the client's request; a full mailbox is answered, unless the
        request has no id to answer (a `Flow`)."""
        if self._held:
            self._release_held(endpoint)
        if not self.system.tell(endpoint, envelope):
            if request_id is not None:
                self._reply_busy(envelope.identity, request_id)

    def _reply_busy(self, identity: bytes, request_id: int) -> None:
        self._reply(identity, Error(request_id=request_id, code=ErrorCode.RESOURCE_EXHAUSTED,
                                    message="broker busy: the actor serving this request has a full mailbox; retry"))

    # Schema-registry requests: stateless (no session needed), each answered in a task,
    # as they wait on Raft rounds.
    def handle_RegisterSchema(self, msg: cp.RegisterSchema, origin: Origin) -> None:
        self._answer_schema_in_task(origin, msg, schema_service.register_schema)

    def handle_GetSchema(self, msg: cp.GetSchema, origin: Origin) -> None:
        if self.enforcer is not None and msg.subject is None and msg.schema_id is not None:
            session = self._session(origin)
            self._answer_schema_in_task(origin, msg, lambda registry, m: self._get_schema_checked(
                registry, m, origin.identity, session))
            return
        self._answer_schema_in_task(origin, msg, schema_service.get_schema)

    async def _get_schema_checked(self, registry: SchemaRegistry, msg: cp.GetSchema, identity: bytes,
                                  session: Session) -> Message:
        """GetSchema by id: Lookup on the subject the id belongs to, then the answer."""
        assert self.enforcer is not None and msg.schema_id is not None
        subject = await registry.subject_of(msg.schema_id)
        try:
            self.enforcer.check(session.auth, msg, _SubjectOf(subject))
        except DanubeError as exc:
            self._refuse(identity, session.auth, exc, "GetSchema", None)
            raise
        return await schema_service.get_schema(registry, msg)

    def handle_ListSchemaVersions(self, msg: cp.ListSchemaVersions, origin: Origin) -> None:
        self._answer_schema_in_task(origin, msg, schema_service.list_schema_versions)

    def handle_CheckSchema(self, msg: cp.CheckSchema, origin: Origin) -> None:
        self._answer_schema_in_task(origin, msg, schema_service.check_schema)

    def handle_GetCompatibility(self, msg: cp.GetCompatibility, origin: Origin) -> None:
        self._answer_schema_in_task(origin, msg, schema_service.get_compatibility)

    def handle_SetCompatibility(self, msg: cp.SetCompatibility, origin: Origin) -> None:
        self._answer_schema_in_task(origin, msg, schema_service.set_compatibility)

    def handle_DeleteSchemaVersion(self, msg: cp.DeleteSchemaVersion, origin: Origin) -> None:
        self._answer_schema_in_task(origin, msg, schema_service.delete_schema_version)

    def handle_ListSubjects(self, msg: cp.ListSubjects, origin: Origin) -> None:
        self._answer_schema_in_task(origin, msg, schema_service.list_subjects)

    def _answer_schema_in_task(self, origin: Origin, msg: Any, answer: schema_service.Answer) -> None:
        if self.schemas is None:
            raise Unavailable("this broker runs no schema registry")
        if not self._schema_tasks.start(self._answer_schema(origin.identity, msg, answer, self.schemas)):
            raise ResourceExhausted("too many schema requests in flight; retry")

    async def _answer_schema(self, identity: bytes, msg: Any, answer: schema_service.Answer,
                             registry: SchemaRegistry) -> None:
        try:
            reply = await answer(registry, msg)
        except DanubeError as exc:
            reply = Error(request_id=msg.request_id, code=exc.code, message=exc.message)
        self._reply(identity, reply)

    def handle_TopicSchemaChanged(self, msg: TopicSchemaChanged) -> None:
        """From the schema bindings watch (`spawn_binding_watch`), for the topics' actors."""
        self.system.post(self.system.broker_endpoint, msg)

    # ------------------------------------------------------------- mailbox
    def handle_ProducerAttached(self, msg: ProducerAttached) -> None:
        session = self.sessions.get(msg.identity)
        if session is None:  # the connection went away while the producer was created
            self.system.tell(msg.endpoint, DetachProducer(producer_id=msg.producer_id, identity=msg.identity))
            return
        session.producers[msg.producer_id] = msg.endpoint
        if self.enforcer is not None:
            session.producer_topics[msg.producer_id] = msg.topic
        self._send_out([msg.identity, msg.reply])

    def handle_ProducerDetached(self, msg: ProducerDetached) -> None:
        session = self.sessions.get(msg.identity)
        if session is None:
            return
        session.producers.pop(msg.producer_id, None)
        session.producer_topics.pop(msg.producer_id, None)
        if msg.reply is not None:
            self._send_out([msg.identity, msg.reply])
        if msg.reason is not None:
            self._reply(msg.identity, cp.ProducerClosed(producer_id=msg.producer_id, reason=msg.reason,
                                                               reattach=msg.reattach))

    def handle_ConsumerAttached(self, msg: ConsumerAttached) -> None:
        session = self.sessions.get(msg.identity)
        if session is None:
            self.system.tell(msg.endpoint, DetachConsumer(consumer_id=msg.consumer_id, identity=msg.identity))
            return
        session.consumers[msg.consumer_id] = msg.endpoint
        if self.enforcer is not None:
            session.consumer_topics[msg.consumer_id] = msg.topic
        if self.outbound.is_paused(msg.identity):
            self.system.post(msg.endpoint, ConsumerPaused(identity=msg.identity, consumer_id=msg.consumer_id,
                                                          paused=True))
        self._send_out([msg.identity, msg.reply])

    def handle_ConsumerDetached(self, msg: ConsumerDetached) -> None:
        session = self.sessions.get(msg.identity)
        if session is None:
            return
        session.consumers.pop(msg.consumer_id, None)
        session.consumer_topics.pop(msg.consumer_id, None)
        if msg.reply is not None:
            self._send_out([msg.identity, msg.reply])
        if msg.reason is not None:
            self._reply(msg.identity, cp.ConsumerClosed(consumer_id=msg.consumer_id, reason=msg.reason,
                                                               reattach=msg.reattach))

    # security.mode curve: the /security/ entries, from this gateway's watch.
    def handle_SecurityResync(self, msg: SecurityResync) -> None:
        assert self.enforcer is not None
        self.enforcer.resync(zip(msg.keys, msg.values, strict=True))
        self._feed_credentials()

    def handle_SecurityChanged(self, msg: SecurityChanged) -> None:
        assert self.enforcer is not None
        self.enforcer.apply(msg.key, msg.value)
        if msg.key.startswith(cr.CLIENT_KEYS):
            self._feed_credentials()

    def _feed_credentials(self) -> None:
        """The allow-list to ZAP's credentials (their statistics, `principal_of_key`)."""
        if self.credentials is not None and self.enforcer is not None:
            self.credentials.replace_client_keys(self.enforcer.client_keys())

    def handle_HolderLives(self, msg: HolderLives) -> HolderLiveness:
        # The attach notice (`ProducerAttached`/`ConsumerAttached`) was told before the
        # asker's question, so a holder attached on a live session is always found here.
        session = self.sessions.get(msg.identity)
        if session is None:
            return HolderLiveness(alive=False)
        owned = session.producers if msg.client_kind == cp.ClientKind.PRODUCER else session.consumers
        return HolderLiveness(alive=owned.get(msg.client_id) == msg.endpoint)

    def handle_Tick(self, msg: Tick) -> None:
        self._ticks += 1
        if self._ticks % _REVIEW_EVERY_TICKS:
            return
        now = self.system.clock.monotonic_ms()
        timeout_ms = self.config.broker.session_timeout_ms
        expired = [identity for identity, s in self.sessions.items() if now - s.last_seen_ms > timeout_ms]
        for identity in expired:
            log.info("session %s (%s) silent for %d ms: closed", identity.hex(),
                     self.sessions[identity].client_name, timeout_ms)
            self._close_session(identity, self.sessions[identity])
        if self.peers is not None:
            self.peers.review(now)
        resume, stalled = self.outbound.review(now)
        for identity in resume:
            self._pause(identity, False)
        for identity in stalled:
            METRICS.outbound_stalled.labels("client").inc()
            self._disconnect_stalled(identity)
        statistics = self.outbound.statistics()
        METRICS.outbound_connections_paused.set(statistics.connections_paused)
        METRICS.outbound_queued_bytes.set(statistics.queued_bytes)

    def _end_session_on(self, fd: int, address: Address | None) -> None:
        """The connection on `fd` to `address` was disconnected: end the session it
        carried, if any (the descriptor may lead elsewhere by now)."""
        if fd not in self._session_fds or self._session_fds[fd] != address:
            return
        for identity, session in list(self.sessions.items()):
            if session.fd == fd and session.address == address:
                self._close_session(identity, session)

    def _disconnect_stalled(self, identity: bytes) -> None:
        """A connection paused for outbound_stall_timeout_ms: end its session (its
        consumers' unacked messages go back for redelivery) and its TCP connection, so
        that libzmq drops what it queued for it."""
        session = self.sessions.get(identity)
        timeout_ms = self.config.limits.outbound_stall_timeout_ms
        if session is None:
            return
        log.warning("connection %s (%s) has not read its socket for %d ms (%d bytes queued): disconnected",
                    identity.hex(), session.client_name, timeout_ms, self.outbound.queued(identity))
        self._close_session(identity, session)
        if session.fd is not None:
            shutdown_peer(session.fd, session.address)

    def _close_session(self, identity: bytes, session: Session) -> None:
        self._release_held()  # its batches held this round go before its detach notices
        for producer_id, endpoint in session.producers.items():
            self.system.tell(endpoint, DetachProducer(producer_id=producer_id, identity=identity))
        for consumer_id, endpoint in session.consumers.items():
            self.system.tell(endpoint, DetachConsumer(consumer_id=consumer_id, identity=identity))
        del self.sessions[identity]
        # `in` first: an address may be None (the connection gone when its Connect was
        # read), and another session on the same descriptor may have removed it.
        if session.fd in self._session_fds and self._session_fds[session.fd] == session.address:
            del self._session_fds[session.fd]
            if self.peers is not None:
                self.peers.session_ended(session.fd, self.system.clock.monotonic_ms())
        self.outbound.forget_pause(identity)
        METRICS.connections.set(len(self.sessions))


# libzmq closes a socket's listener in its reaper thread, after `close` returns: a
# gateway restarted after a failure binds its port again while the old listener may
# still hold it, so "address in use" is tried again this long before it is an error.
REBIND_WAIT_S = 3.0


async def bind_or_close(sock: zmq.asyncio.Socket, endpoint: str, what: str, *,
                        rebind_wait_s: float = REBIND_WAIT_S) -> None:
    """Bind a listening socket; on failure close it (an open socket would block the
    context's shutdown) and say which endpoint could not be used."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + rebind_wait_s
    while True:
        try:
            sock.bind(endpoint)
            return
        except zmq.ZMQError as exc:
            if exc.errno == errno.EADDRINUSE and loop.time() < deadline:
                await asyncio.sleep(0.05)
                continue
            sock.close(linger=0)
            raise Unavailable(f"cannot listen for {what} connections on {endpoint}: {exc.strerror}") from None


def reply_client(system: ActorSystem, identity: bytes, msg: Message) -> bool:
    """Send `msg` to a client connection through the gateway's outbox (any actor)."""
    if system.push_frames(OUTBOX, [identity, cp.CLIENT_PROTOCOL.encode(msg)]):
        return True
    METRICS.frames_dropped.inc()
    return False


async def holder_lives(system: ActorSystem, identity: bytes, client_kind: cp.ClientKind, client_id: int,
                       endpoint: str) -> bool:
    """Whether the connection `identity` still holds the producer or consumer `client_id`
    of `endpoint`, as the gateway knows it (any actor, before refusing a name as held)."""
    answer = await system.ask(system.gateway_endpoint, HolderLives(
        identity=identity, client_kind=client_kind, client_id=client_id, endpoint=endpoint))
    assert isinstance(answer, HolderLiveness)
    return answer.alive


def _source_fd(frame: zmq.Frame | None) -> int:
    """The descriptor a frame arrived on, -1 when there is none: inproc and ipc pipes
    have no TCP descriptor (libzmq answers EINVAL), and only TCP peers are cut by fd."""
    if frame is None:
        return -1
    try:
        return frame.get(zmq.SRCFD)
    except zmq.ZMQError:
        return -1

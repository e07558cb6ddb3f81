"""The admin gateway: the broker's admin ROUTER socket (`broker.admin_listen`).

Admin traffic is low-rate control: the gateway answers `Connect` (version check)
and `Ping` itself, checks every other frame decodes, and forwards it to the broker
actor as `AdminRequest`; answers come back through the admin outbox. It keeps no
per-connection state, so `danube admin` can send a request without a handshake.

Metadata-cluster requests (`CLUSTER_REQUESTS`: cluster status and membership, metadata
get/list/put/cas/delete) are answered here, from the broker's Raft metadata store, each
in a task of its own (bounded: beyond `_CLUSTER_TASKS_MAX` at once the answer is
RESOURCE_EXHAUSTED), since they wait on Raft rounds. Snapshot requests
(`SNAPSHOT_REQUESTS`) go to the snapshot actor.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import zmq
import zmq.asyncio

from danube_zmq.actors import cluster_admin
from danube_zmq.actors.actor import Actor
from danube_zmq.actors.config import BrokerConfig
from danube_zmq.actors.gateway import bind_or_close
from danube_zmq.actors.metrics import METRICS
from danube_zmq.actors.request_tasks import RequestTasks
from danube_zmq.consensus.metadata_store import RaftMetadataStore
from danube_zmq.consensus.peer import NotLeader
from danube_zmq.schemas.registry import SchemaRegistry
from danube_zmq.transport.admin_protocol import ADMIN_PROTOCOL, ADMIN_REQUESTS, CLUSTER_REQUESTS, SNAPSHOT_REQUESTS
from danube_zmq.transport.codec import Message
from danube_zmq.transport.common import PROTOCOL_VERSION, Connect, Connected, Error, Ping, Pong
from danube_zmq.transport.errors import DanubeError, ErrorCode, InvalidArgument
from danube_zmq.transport.internal_protocol import AdminRequest

if TYPE_CHECKING:
    from danube_zmq.actors.system import ActorSystem

ADMIN_OUTBOX = "inproc://admin-outbox"
_DRAIN_MAX = 64
_CLUSTER_TASKS_MAX = 256


class AdminGateway(Actor):
    def __init__(self, *, config: BrokerConfig, broker_id: int, broker_url: str,
                 metadata: RaftMetadataStore | None = None, schemas: SchemaRegistry | None = None) -> None:
        self.config = config
        self.metadata = metadata
        self.schemas = schemas
        self._cluster_tasks = RequestTasks(_CLUSTER_TASKS_MAX)
        self.broker_id = broker_id
        self.broker_url = broker_url
        self.router: zmq.asyncio.Socket | None = None
        self.outbox: zmq.asyncio.Socket | None = None
        self.bound_url = ""

    async def on_start(self) -> None:
        ctx = self.system.context
        router = ctx.socket(zmq.ROUTER)
        router.setsockopt(zmq.LINGER, 0)
        router.setsockopt(zmq.MAXMSGSIZE, self.config.limits.frame_bytes_max)
        router.setsockopt(zmq.SNDHWM, self.config.limits.outbound_frames_max)
        router.setsockopt(zmq.ROUTER_MANDATORY, 1)
        bind_or_close(router, self.config.broker.admin_listen, "admin")
        self.bound_url = router.getsockopt(zmq.LAST_ENDPOINT).decode()
        outbox = ctx.socket(zmq.PULL)
        outbox.setsockopt(zmq.LINGER, 0)
        outbox.setsockopt(zmq.RCVHWM, self.config.limits.outbound_frames_max)
        outbox.bind(ADMIN_OUTBOX)
        self.router, self.outbox = router, outbox
        self._router_sync = zmq.Socket.shadow(router.underlying)
        self._outbox_sync = zmq.Socket.shadow(outbox.underlying)

    async def on_stop(self) -> None:
        await self._cluster_tasks.cancel_all()
        for sock in (self.router, self.outbox):
            if sock is not None:
                sock.close(linger=0)

    def extra_sockets(self) -> list[tuple[Any, Any]]:
        return [(self.router, self._drain_router), (self.outbox, self._drain_outbox)]

    async def _drain_router(self) -> None:
        for _ in range(_DRAIN_MAX):
            try:
                frames = self._router_sync.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            if len(frames) != 2:
                self._reply(frames[0], Error(request_id=0, code=ErrorCode.INVALID_ARGUMENT,
                                             message=f"expected one frame per message, got {len(frames) - 1}"))
                continue
            self._on_frame(frames[0], frames[1])

    async def _drain_outbox(self) -> None:
        for _ in range(_DRAIN_MAX):
            try:
                frames = self._outbox_sync.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            self._send_out(frames)

    def _on_frame(self, identity: bytes, frame: bytes) -> None:
        try:
            msg = ADMIN_PROTOCOL.decode(frame)
        except InvalidArgument as exc:
            METRICS.bad_frames.inc()
            self._reply(identity, Error(request_id=0, code=exc.code, message=exc.message))
            return
        if type(msg) is Connect:
            if msg.protocol_version != PROTOCOL_VERSION:
                self._reply(identity, Error(request_id=msg.request_id, code=ErrorCode.UNSUPPORTED_VERSION,
                                            message=f"protocol version {msg.protocol_version} is not supported;"
                                            f" this broker speaks {PROTOCOL_VERSION}"))
                return
            broker = self.config.broker
            self._reply(identity, Connected(
                request_id=msg.request_id, protocol_version=PROTOCOL_VERSION, broker_id=self.broker_id,
                broker_url=self.broker_url, frame_bytes_max=self.config.limits.frame_bytes_max,
                message_bytes_max=self.config.policies.max_message_size,
                heartbeat_interval_ms=broker.heartbeat_interval_ms, session_timeout_ms=broker.session_timeout_ms))
            return
        if type(msg) is Ping:
            self._reply(identity, Pong(request_id=msg.request_id))
            return
        request_id = getattr(msg, "request_id", 0)
        if type(msg) in CLUSTER_REQUESTS:
            self._cluster_request(identity, msg)
            return
        if type(msg) in SNAPSHOT_REQUESTS:
            if not self.system.tell(self.system.snapshot_endpoint, AdminRequest(identity=identity, frame=frame)):
                self._reply(identity, Error(request_id=request_id, code=ErrorCode.RESOURCE_EXHAUSTED,
                                            message="snapshot requests queued to the limit; retry"))
            return
        if type(msg) not in ADMIN_REQUESTS:
            self._reply(identity, Error(request_id=request_id, code=ErrorCode.INVALID_ARGUMENT,
                                        message=f"{type(msg).__name__} is not an admin request"))
            return
        if not self.system.tell(self.system.broker_endpoint, AdminRequest(identity=identity, frame=frame)):
            self._reply(identity, Error(request_id=request_id, code=ErrorCode.RESOURCE_EXHAUSTED,
                                        message="broker busy; retry"))

    def _cluster_request(self, identity: bytes, msg: Message) -> None:
        request_id = msg.request_id  # type: ignore[attr-defined]
        if self.metadata is None or self.schemas is None:
            self._reply(identity, Error(request_id=request_id, code=ErrorCode.UNAVAILABLE,
                                        message="this broker runs no metadata store"))
            return
        if not self._cluster_tasks.start(self._answer_cluster(identity, msg, self.metadata, self.schemas)):
            self._reply(identity, Error(request_id=request_id, code=ErrorCode.RESOURCE_EXHAUSTED,
                                        message="too many metadata requests in flight; retry"))

    async def _answer_cluster(self, identity: bytes, msg: Message, store: RaftMetadataStore,
                              registry: SchemaRegistry) -> None:
        try:
            reply = await cluster_admin.answer(store, registry, msg)
        except DanubeError as exc:
            text = exc.message
            if isinstance(exc, NotLeader) and exc.redirect_url:
                text += f" (raft peer at {exc.redirect_url})"
            reply = Error(request_id=msg.request_id, code=exc.code, message=text)  # type: ignore[attr-defined]
        self._reply(identity, reply)

    def _send_out(self, frames: list[Any]) -> None:
        try:
            self._router_sync.send_multipart(frames, zmq.NOBLOCK, copy=False)
        except zmq.ZMQError:
            METRICS.frames_dropped.inc()

    def _reply(self, identity: bytes, msg: Message) -> None:
        self._send_out([identity, ADMIN_PROTOCOL.encode(msg)])


def reply_admin(system: ActorSystem, identity: bytes, msg: Message) -> bool:
    """Send an admin answer to an admin connection through the admin outbox."""
    if system.push_frames(ADMIN_OUTBOX, [identity, ADMIN_PROTOCOL.encode(msg)]):
        return True
    METRICS.frames_dropped.inc()
    return False

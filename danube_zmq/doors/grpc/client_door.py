"""Danube's gRPC client door: `DanubeApi.proto` served for Danube's own clients.

    danube-client (gRPC) ──▶ GrpcDoor (grpc.aio server, broker.grpc_listen)
                               │  Discovery, HealthCheck          (this module)
                               │  ProducerService, ConsumerService (services.py)
                               │  SchemaRegistry                  (schemas.py)
                               │  StorageService                  (storage.py)
                               ▼  one native DanubeClient per gRPC producer / consumer,
                            this broker's client port (broker.listen), as any client;
                            SchemaRegistry's topic-binding calls: its admin port

A gateway, not a second broker: every producer and consumer a Danube client creates
here is one of ours (`client/`) attached to this broker's own client port, so topics,
subscriptions, offsets, acks, redeliveries and limits are the broker's, shared with
native clients. The door holds no state about topics or subscriptions, only which
native attachment a Danube producer or consumer id stands for.

1. Lookup: the native lookup names the owner's client URL; this broker: Connect to this
   door; another broker that registered a gRPC door (`BrokerRegistration.grpc_url`):
   Redirect there; one without: Connect here (the native client follows the redirect).
2. Errors map onto Danube's gRPC codes (`GRPC_STATUS`): UNAVAILABLE makes Danube's
   client look up again, PERMISSION_DENIED is the Exclusive conflict (CONSUMER_BUSY).
3. Danube's API has no close for producers or consumers: an attachment that has had
   no call, no health check and no open stream for `IDLE_MS` is closed (`_reap`). A
   consumer whose stream ended (its client closed it or died) gives its place in the
   subscription up sooner, as Danube's broker marks it inactive at once
   (`DoorConsumer.tick`, doors/grpc/services.py).
4. Security (`doors/grpc/auth.py`): every native connection is the caller's own,
   dialed with their bearer token; a producer or consumer answers only calls with the
   token that created it.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable
from typing import Any

import grpc

from danube_zmq.client.client import DanubeClient
from danube_zmq.config.broker_config import BrokerConfig
from danube_zmq.consensus.metadata_store import RaftMetadataStore
from danube_zmq.doors.grpc.admin_clients import AdminClients
from danube_zmq.doors.grpc.auth import Caller, DoorSecurity, PerCaller, check_owner
from danube_zmq.doors.grpc.calls import abort_with, caller_of, native_target
from danube_zmq.doors.grpc.limits import DoorLimits
from danube_zmq.doors.grpc.schemas import SchemaRegistryDoor
from danube_zmq.doors.grpc.services import ConsumerDoor, ProducerDoor
from danube_zmq.doors.grpc.storage import StorageDoor
from danube_zmq.transport import cluster_records as cr
from danube_zmq.transport.danube_proto import DanubeApi_pb2 as pb
from danube_zmq.transport.danube_proto import DanubeApi_pb2_grpc as pb_grpc
from danube_zmq.transport.errors import DanubeError, InvalidArgument, NotFound, Unauthenticated
from danube_zmq.transport.topic_name import parse_topic

log = logging.getLogger("danube_zmq.grpc_door")

# Danube's client health-checks every 5 s; three missed checks and no call or stream
# mean the client is gone (its process died or it closed without telling: the API has
# no close).
IDLE_MS = 15_000
# Also how often attachments are asked to tidy up (`Attachment.tick`): a consumer's lost
# stream is noticed within this of its grace running out.
_REAP_EVERY_S = 0.5
# Callers whose lookup connection is kept open (`PerCaller`).
CONTROL_CLIENTS_MAX = 64

class GrpcDoor:
    """The gRPC server of one broker. `start()` binds `listen` (http://HOST:PORT);
    `stop()` ends the calls, closes every native attachment, then the server."""

    def __init__(self, *, listen: str, advertised_url: str | None, client_url: str, admin_url: str, broker_url: str,
                 attachments_max: int, metadata: RaftMetadataStore | None, rng: random.Random,
                 monotonic_ms: Callable[[], int] | None = None, security: DoorSecurity | None = None,
                 limits: DoorLimits | None = None) -> None:
        self.listen = listen
        self.security = (security or DoorSecurity()).with_context()
        self.limits = limits or DoorLimits.client_door(BrokerConfig())
        self._advertised = advertised_url
        self.native_url = native_target(client_url)
        # SchemaRegistry's topic-binding calls are admin operations: the admin port.
        self._admins = AdminClients(native_target(admin_url, "broker.grpc_listen", "broker.admin_listen"),
                                    self.security, "grpc-door-schemas", idle_ms=self.limits.admin_client_idle_ms)
        self.broker_url = broker_url  # this broker's advertised client URL (what lookups name)
        self.attachments_max = attachments_max
        self.metadata = metadata
        self.rng = rng
        self.monotonic_ms = monotonic_ms or (lambda: int(time.monotonic() * 1000))
        self.url = ""
        self.attachments: dict[int, Any] = {}
        # Payload bytes of sends awaiting the broker (grpc_door_services.SENDING_BYTES_MAX).
        self.sending_bytes = 0
        self._server: grpc.aio.Server | None = None
        self._control: PerCaller[DanubeClient] | None = None
        self._reaper: asyncio.Task[None] | None = None
        self._schemas: Any = None  # SchemaRegistryDoor, imported at start

    async def start(self) -> None:
        from danube_zmq.transport.danube_proto import SchemaRegistry_pb2_grpc as spb_grpc

        server = grpc.aio.server(options=self.limits.server_options())
        self._schemas = SchemaRegistryDoor(security=self.security, client_target=self.native_url,
                                           admins=self._admins)
        spb_grpc.add_SchemaRegistryServicer_to_server(self._schemas, server)
        pb_grpc.add_DiscoveryServicer_to_server(DiscoveryDoor(self), server)
        pb_grpc.add_HealthCheckServicer_to_server(HealthDoor(self), server)
        pb_grpc.add_ProducerServiceServicer_to_server(ProducerDoor(self), server)
        pb_grpc.add_ConsumerServiceServicer_to_server(ConsumerDoor(self), server)
        pb_grpc.add_StorageServiceServicer_to_server(StorageDoor(self), server)
        host, _, port = self.listen.removeprefix("http://").rpartition(":")
        bound = self.security.bind(server, f"{host}:{port}", "broker.grpc_listen")
        if bound == 0:
            raise InvalidArgument(f"broker.grpc_listen: cannot bind {self.listen}")
        await server.start()
        self._server = server
        # https when it serves TLS, as Danube names its TLS brokers (its clients choose
        # TLS from their own options, not from the URL).
        scheme = "https" if self.security.tls_cert_file else "http"
        self.url = self._advertised or f"{scheme}://{host}:{bound}"

        async def open_control(caller: Caller) -> DanubeClient:
            return self.native_client("grpc-door-control", caller)

        async def close_control(client: DanubeClient) -> None:
            await client.close()

        self._control = PerCaller(open_control, close_control, CONTROL_CLIENTS_MAX)
        self._reaper = asyncio.get_running_loop().create_task(self._reap(), name="grpc-door-reaper")

    async def stop(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
            await asyncio.gather(self._reaper, return_exceptions=True)
            self._reaper = None
        if self._server is not None:
            await self._server.stop(grace=1.0)
            self._server = None
        attachments, self.attachments = list(self.attachments.values()), {}
        for attachment in attachments:
            await attachment.close()
        if self._control is not None:
            await self._control.close()
            self._control = None
        if self._schemas is not None:
            await self._schemas.close()
            self._schemas = None
        self._admins.close()
        assert self.security.context is not None
        self.security.context.destroy(linger=0)

    async def control(self, caller: Caller, call: Callable[[DanubeClient], Any]) -> Any:
        """`call` on `caller`'s lookup client; one the broker refused is not kept."""
        assert self._control is not None, "the door is not started"
        client = await self._control.get(caller)
        try:
            return await call(client)
        except Unauthenticated:
            await self._control.drop(caller)
            raise

    def new_id(self) -> int:
        while True:
            candidate = self.rng.getrandbits(63)
            if candidate and candidate not in self.attachments:
                return candidate

    def native_client(self, name: str, caller: Caller) -> DanubeClient:
        return DanubeClient(self.native_url, client_name=name, **self.security.credentials(caller))

    def touch(self, attachment_id: int, caller: Caller) -> Any:
        """The attachment `attachment_id`, None if there is none; `PermissionDenied` if
        another token created it."""
        attachment = self.attachments.get(attachment_id)
        if attachment is not None:
            check_owner(attachment.owner, caller, f"{attachment_id}")
            attachment.last_seen_ms = self.monotonic_ms()
        return attachment

    async def _reap(self) -> None:
        while True:
            await asyncio.sleep(_REAP_EVERY_S)
            now = self.monotonic_ms()
            for attachment_id, attachment in list(self.attachments.items()):
                if attachment.busy() or now - attachment.last_seen_ms <= IDLE_MS:
                    await attachment.tick(now)
                    continue
                log.info("closing idle gRPC attachment %d (%r)", attachment_id, attachment)
                await self.drop(attachment_id)

    async def drop(self, attachment_id: int) -> None:
        """Forget and close an attachment (health checks then answer CLOSE for its id)."""
        attachment = self.attachments.pop(attachment_id, None)
        if attachment is None:
            return
        try:
            await attachment.close()
        except DanubeError as exc:
            log.warning("closing gRPC attachment %d: %s", attachment_id, exc)

    # ---------------------------------------------------------------- lookups

    def grpc_url_of(self, broker_url: str) -> str | None:
        """The gRPC door of the broker whose client URL is `broker_url`, if it registered one."""
        if broker_url == self.broker_url:
            return self.url
        if self.metadata is None:
            return None
        for _, value in self.metadata.local_scan(cr.REGISTER):
            registration = cr.decode(value.value, cr.BrokerRegistration)
            if registration.broker_url == broker_url:
                return registration.grpc_url
        return None

    def loose_partitions(self, topic: str) -> list[str]:
        """`{topic}-part-N` topics that exist on their own while `topic` does not, in
        partition order. Danube's producer with N partitions creates them one by one
        (it names no partition count to any broker), and Danube's `TopicPartitions`
        answers them by prefix: so does the door, for Danube's consumer to find them."""
        if self.metadata is None:
            return []
        try:
            base = parse_topic(topic)
        except InvalidArgument:
            return []
        found: dict[int, str] = {}
        for key, _ in self.metadata.local_scan(cr.topic_record_key(f"{base.full}-part-")):
            full = key.removeprefix("/topics")
            if full.count("/") != 2:
                continue  # a subscription's or producer's key under a topic
            name = parse_topic(full)
            if name.partition_index is not None and name.base == base:
                found[name.partition_index] = full
        return [found[i] for i in sorted(found)]


class DiscoveryDoor(pb_grpc.DiscoveryServicer):
    def __init__(self, door: GrpcDoor) -> None:
        self.door = door

    async def TopicLookup(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        caller = await caller_of(context, self.door.security)
        try:
            owner = await self.door.control(caller, lambda c: c.lookup(request.topic))
        except DanubeError as exc:
            if isinstance(exc, NotFound):
                # Danube answers an unknown topic with a Failed lookup, not an error.
                return pb.TopicLookupResponse(request_id=request.request_id,
                                              response_type=pb.TopicLookupResponse.Failed)
            await abort_with(context, exc)
        target = self.door.grpc_url_of(owner)
        if target is None or target == self.door.url:
            # This broker, or an owner without a door: the native client here follows
            # the redirect itself.
            return pb.TopicLookupResponse(request_id=request.request_id, response_type=pb.TopicLookupResponse.Connect,
                                          connect_url=self.door.url, broker_url=self.door.url, proxy=False)
        return pb.TopicLookupResponse(request_id=request.request_id, response_type=pb.TopicLookupResponse.Redirect,
                                      connect_url=target, broker_url=target, proxy=False)

    async def TopicPartitions(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        caller = await caller_of(context, self.door.security)
        try:
            partitions = await self.door.control(caller, lambda c: c.get_partitions(request.topic))
        except NotFound as exc:
            partitions = self.door.loose_partitions(request.topic)
            if not partitions:
                await abort_with(context, exc)
        except DanubeError as exc:
            await abort_with(context, exc)
        return pb.TopicPartitionsResponse(request_id=request.request_id, partitions=partitions)


class HealthDoor(pb_grpc.HealthCheckServicer):
    """OK while the door holds the producer or consumer; CLOSE once it does not (reaped,
    or the broker restarted): Danube's client then creates it again."""

    def __init__(self, door: GrpcDoor) -> None:
        self.door = door

    async def HealthCheck(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        caller = await caller_of(context, self.door.security)
        try:
            attachment = self.door.touch(request.id, caller)
        except DanubeError as exc:
            await abort_with(context, exc)
        status = pb.HealthCheckResponse.OK if attachment is not None else pb.HealthCheckResponse.CLOSE
        return pb.HealthCheckResponse(status=status)

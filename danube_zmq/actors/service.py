"""One standalone broker process: the actor system and its top-level actors.

    BrokerService
      +-- RaftMetadataStore  this broker's Raft peer of the metadata store (`cluster:`);
      |                      standalone: a single voter, no socket
      +-- SchemaRegistry     subjects and versions, kept in the metadata store
      +-- ActorSystem (zmq context, mailboxes, supervision)
            +-- BrokerActor    registry of namespaces and topics; parent of topics
            |     +-- TopicActor per topic/partition served here
            |           +-- SubscriptionActor per subscription
            +-- LoadManagerActor   assigns topics to brokers while this peer leads
            +-- Gateway        client ROUTER (broker.listen) + outbox
            +-- AdminGateway   admin ROUTER (broker.admin_listen) + admin outbox
      +-- GrpcDoor       broker.grpc_listen: Danube's gRPC API for Danube's clients, a
                         gateway into the client port (`doors/grpc/client_door.py`); else absent
      +-- GrpcAdminDoor  broker.grpc_admin_listen: Danube's admin gRPC API, a gateway into
                         the admin port, and its SchemaRegistry into the client port
                         (`doors/grpc/admin_door.py`); else absent
      +-- InboundWatch   a child process holding what libzmq buffers of both ports' input
                         to limits.inbound_bytes_per_connection_max and inbound_bytes_max
      +-- ZapService     security.mode curve: the context's ZAP handler, started before any
                         socket binds (`security/curve.py`, `actors/cluster/broker_curve.py`)

`start()` opens the metadata store (standalone: writes the bootstrap namespaces), then
binds everything (and the Prometheus endpoint);
`stop()` stops the actors in reverse order, then the metadata store, and closes the
context. In a cluster the store starts without waiting for a leader (the other peers
may not be up yet); standalone, its single voter leads at once. Use it as `async with BrokerService(cfg):`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import zmq
import zmq.asyncio
from prometheus_client import REGISTRY

from danube_zmq.actors.broker.broker import BrokerActor
from danube_zmq.actors.broker.broker_collector import BrokerCollector
from danube_zmq.actors.broker.snapshot_actor import SnapshotActor
from danube_zmq.actors.cluster.broker_curve import load_cluster_curve
from danube_zmq.actors.load.load_manager import LoadManagerActor
from danube_zmq.actors.metrics import TOPIC_SERIES, RaftCollector
from danube_zmq.actors.sockets.admin_gateway import AdminGateway
from danube_zmq.actors.sockets.gateway import Gateway
from danube_zmq.actors.sockets.inbound_watch import InboundWatch
from danube_zmq.actors.sockets.metrics_endpoint import MetricsServer, start_metrics_server
from danube_zmq.clock import Clock, SystemClock
from danube_zmq.config.broker_config import BrokerConfig
from danube_zmq.consensus.metadata_store import RaftMetadataStore
from danube_zmq.consensus.peer import RaftPeer
from danube_zmq.consensus.raft import RaftConfig
from danube_zmq.runtime.metrics import MailboxCollector
from danube_zmq.runtime.system import ActorSystem
from danube_zmq.schemas.limits import SchemaLimits
from danube_zmq.schemas.registry import SchemaRegistry
from danube_zmq.security.curve import ClusterCurve, Credentials, ZapService
from danube_zmq.transport import cluster_records as cr
from danube_zmq.transport.errors import InvalidArgument

log = logging.getLogger("danube_zmq.service")


class BrokerService:
    def __init__(self, config: BrokerConfig, *, clock: Clock | None = None, rng: random.Random | None = None) -> None:
        self.config = config
        self.clock = clock or SystemClock()
        self.rng = rng or random.Random()
        self.broker_id = config.broker.broker_id if config.broker.broker_id is not None else self._stored_broker_id()
        self.client_url = ""
        self.admin_url = ""
        self.metrics_url: str | None = None
        self.grpc_url: str | None = None
        self._grpc_door: Any = None  # a GrpcDoor; its module (grpcio) is imported only when on
        self.grpc_admin_url: str | None = None
        self._grpc_admin_door: Any = None  # a GrpcAdminDoor, likewise
        self._context: zmq.asyncio.Context | None = None
        self._system: ActorSystem | None = None
        self.metadata: RaftMetadataStore | None = None
        self.schemas: SchemaRegistry | None = None
        self._raft_collector: RaftCollector | None = None
        self._mailbox_collector: MailboxCollector | None = None
        self._broker_collector: BrokerCollector | None = None
        self._metrics_server: MetricsServer | None = None
        self._stopped = asyncio.Event()
        # Why the service cannot go on (a top-level actor exhausted its restarts); the
        # process running it exits non-zero (`cli/broker.py`).
        self.fatal_reason: str | None = None
        # WAL writes and fsyncs of reliable topics run here, off the event loop; a few
        # threads let topics on one disk overlap their fsyncs.
        self._executor = ThreadPoolExecutor(max_workers=4, thread_name_prefix="danube-wal")
        self._inbound: InboundWatch | None = None
        # security.mode curve: the cluster key pair every socket uses, the ZAP credentials
        # (who a key is), and the context's one ZAP handler (`security/curve.py`).
        self.curve: ClusterCurve | None = None
        self.credentials: Credentials | None = None
        self._zap: ZapService | None = None

    async def start(self) -> None:
        config = self.config
        if config.broker.grpc_listen is not None or config.broker.grpc_admin_listen is not None:
            from danube_zmq.doors.grpc.limits import check_fd_budget

            check_fd_budget(config)  # before any bind: the doors must not take the native ports' descriptors
        loaded = load_cluster_curve(config.security)  # a bad key file stops the start before any bind
        if loaded is not None:
            self.curve, self.credentials = loaded
        self._context = zmq.asyncio.Context(io_threads=config.broker.io_threads)
        # Each actor mailbox and cached sender is a socket: lift libzmq's default of 1023.
        self._context.setsockopt(zmq.LINGER, 0)
        self._context.set(zmq.MAX_SOCKETS, 65_536)
        if self.credentials is not None:  # before any socket binds: a CURVE server without it admits any key
            self._zap = ZapService(self._context, self.credentials)
            self._zap.start()
        system = ActorSystem(self._context, clock=self.clock, mailbox_messages_max=config.limits.mailbox_messages_max,
                             mailbox_bytes_max=config.limits.mailbox_bytes_max)
        system.on_fatal = self._fatal
        self._system = system
        self._mailbox_collector = MailboxCollector(system.statistics)
        REGISTRY.register(self._mailbox_collector)
        TOPIC_SERIES.topics_max = config.broker.metrics_topics_max
        TOPIC_SERIES.subscriptions_max = config.broker.metrics_subscriptions_max
        self._broker_collector = BrokerCollector(system, asyncio.get_running_loop(), credentials=self.credentials)
        REGISTRY.register(self._broker_collector)
        try:
            self.metadata = self._metadata_store(self._context)
            await self.metadata.start()
            if config.cluster.raft_listen is None:
                await self._bootstrap_namespaces()
            limits = config.limits
            self.schemas = SchemaRegistry(self.metadata, limits=SchemaLimits(
                definition_bytes_max=limits.schema_definition_bytes_max, nodes_max=limits.schema_nodes_max,
                depth_max=limits.schema_depth_max))
            self._raft_collector = RaftCollector(self.metadata.peer)
            REGISTRY.register(self._raft_collector)
            if config.broker.metrics_port:
                security = config.security
                self._metrics_server = start_metrics_server(
                    config.broker.metrics_host, config.broker.metrics_port,
                    tls_cert_file=security.metrics_tls_cert_file, tls_key_file=security.metrics_tls_key_file,
                    basic_auth_file=security.metrics_basic_auth_file,
                    connections_max=config.broker.metrics_connections_max,
                    process_collectors=config.broker.metrics_process_collectors)
                self.metrics_url = self._metrics_server.url
            # The gateways find the broker actor through `system.broker_endpoint` when a
            # request arrives, so they start first and the broker learns their URLs.
            inbound = self._inbound = self._start_inbound_watch(config)
            system.gateway_endpoint = await system.spawn(
                lambda: Gateway(config=config, broker_id=self.broker_id, schemas=self.schemas, inbound=inbound,
                                curve=self.curve, credentials=self.credentials, metadata=self.metadata),
                name="gateway")
            gateway = system.actor(system.gateway_endpoint)
            assert isinstance(gateway, Gateway)
            self.client_url = gateway.bound_url
            admin_endpoint = await system.spawn(
                lambda: AdminGateway(config=config, broker_id=self.broker_id, broker_url=self.advertised_url,
                                     metadata=self.metadata, schemas=self.schemas, inbound=inbound,
                                     curve=self.curve, credentials=self.credentials),
                name="admin-gateway")
            admin = system.actor(admin_endpoint)
            assert isinstance(admin, AdminGateway)
            self.admin_url = admin.bound_url
            if config.broker.grpc_listen is not None:
                # Bound before the broker actor starts, which registers the door's URL.
                await self._start_grpc_door()
            if config.broker.grpc_admin_listen is not None:
                # Likewise (ListBrokers names it). Its calls go to the admin port, which
                # refuses them as BROKER_STARTING until the broker actor below is up; its
                # AdminClient asks again within its timeout, as `danube admin` does.
                await self._start_grpc_admin_door()
            system.broker_endpoint = await system.spawn(self._broker_factory, name="broker")
            system.load_manager_endpoint = await system.spawn(
                lambda: LoadManagerActor(config=config, broker_id=self.broker_id, metadata=self.metadata),
                name="load-manager")
            system.snapshot_endpoint = await system.spawn(
                lambda: SnapshotActor(config=config, broker_id=self.broker_id, broker_url=self.advertised_url),
                name="snapshots")
        except BaseException:
            await self.stop()
            raise
        log.info("broker %d listening: clients %s, admin %s, metrics %s, gRPC %s, gRPC admin %s", self.broker_id,
                 self.client_url, self.admin_url, self.metrics_url or "off", self.grpc_url or "off",
                 self.grpc_admin_url or "off")

    async def _start_grpc_door(self) -> None:
        from danube_zmq.doors.grpc.client_door import GrpcDoor
        from danube_zmq.doors.grpc.limits import DoorLimits

        broker = self.config.broker
        assert broker.grpc_listen is not None
        door = GrpcDoor(listen=broker.grpc_listen, advertised_url=broker.grpc_advertised_url,
                        client_url=self.client_url, admin_url=self.admin_url, broker_url=self.advertised_url,
                        attachments_max=broker.grpc_attachments_max, metadata=self.metadata,
                        rng=random.Random(self.rng.getrandbits(64)), security=self._door_security(),
                        limits=DoorLimits.client_door(self.config))
        await door.start()
        self._grpc_door = door
        self.grpc_url = door.url

    async def _start_grpc_admin_door(self) -> None:
        from danube_zmq.doors.grpc.admin_door import GrpcAdminDoor
        from danube_zmq.doors.grpc.limits import DoorLimits

        listen = self.config.broker.grpc_admin_listen
        assert listen is not None
        door = GrpcAdminDoor(listen=listen, admin_url=self.admin_url, client_url=self.client_url,
                             security=self._door_security(), limits=DoorLimits.admin_door(self.config))
        await door.start()
        self._grpc_admin_door = door
        self.grpc_admin_url = door.url

    def _door_security(self) -> Any:
        """The gRPC doors' TLS, and the cluster's public key their callers' connections
        dial with (never its key pair: a door acts only as its caller)."""
        from danube_zmq.doors.grpc.auth import DoorSecurity

        security = self.config.security
        return DoorSecurity(server_public_key=self.curve.keys.public if self.curve is not None else None,
                            tls_cert_file=security.grpc_tls_cert_file, tls_key_file=security.grpc_tls_key_file,
                            tls_client_ca_file=security.grpc_tls_client_ca_file)

    async def _bootstrap_namespaces(self) -> None:
        """Standalone, the bootstrap namespaces are written before any port is bound, so
        no client that connects at once finds `default` missing (the broker actor writes
        them again when it joins: a no-op). A cluster cannot wait here (its peers may not
        be up): there the broker answers UNAVAILABLE about them until it has joined."""
        assert self.metadata is not None
        for namespace in self.config.bootstrap_namespaces:
            await self.metadata.compare_and_swap(cr.namespace_key(namespace), 0, b"")

    def _metadata_store(self, context: zmq.asyncio.Context) -> RaftMetadataStore:
        cluster = self.config.cluster
        heartbeat, election_min, election_max = cluster.ticks
        raft = RaftConfig(node_id=cluster.node_id, heartbeat_ticks=heartbeat, election_ticks_min=election_min,
                          election_ticks_max=election_max, log_entries_max=cluster.snapshot_entries)
        peer = RaftPeer(cluster.node_id, Path(self.config.broker.data_dir) / "metadata", cluster.raft_listen,
                        cluster.peer_addresses(), raft, cluster.tick_ms, advertised=cluster.raft_advertised,
                        bootstrap_cluster=not cluster.join, request_timeout_s=cluster.request_timeout_ms / 1000,
                        context=context, clock=self.clock, curve=self.curve)
        # Standalone (no socket): the single voter leads at once, so waiting costs nothing.
        return RaftMetadataStore(peer, owns_peer=True, wait_for_leader=cluster.raft_listen is None)

    def _broker_factory(self) -> BrokerActor:
        return BrokerActor(config=self.config, broker_id=self.broker_id, broker_url=self.advertised_url,
                           admin_url=self.admin_url,
                           metrics_url=self.metrics_url, rng=random.Random(self.rng.getrandbits(64)),
                           executor=self._executor, metadata=self.metadata, curve=self.curve,
                           grpc_url=self.grpc_url, grpc_admin_url=self.grpc_admin_url)

    def _stored_broker_id(self) -> int:
        """The id this data directory's broker had before (its topics are assigned to
        it by id), or a new random one, kept in `data_dir/broker_id`."""
        path = Path(self.config.broker.data_dir) / "broker_id"
        try:
            return int(path.read_text().strip())
        except FileNotFoundError:
            pass
        except ValueError:
            raise InvalidArgument(f"{path} holds no broker id; remove it or set broker.broker_id") from None
        broker_id = self.rng.getrandbits(63)
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_suffix(".tmp")
        with open(temporary, "w") as out:
            out.write(f"{broker_id}\n")
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, path)
        return broker_id

    @property
    def advertised_url(self) -> str:
        return self.config.broker.advertised_url or self.client_url or self.config.broker.listen

    async def stop(self) -> None:
        if self._grpc_admin_door is not None:
            await self._grpc_admin_door.stop()
            self._grpc_admin_door = None
        if self._grpc_door is not None:  # its native clients leave while the broker still answers
            await self._grpc_door.stop()
            self._grpc_door = None
        if self._system is not None:
            await self._system.shutdown()
            self._system = None
        if self._inbound is not None:
            self._inbound.stop()
            self._inbound = None
        if self._raft_collector is not None:
            REGISTRY.unregister(self._raft_collector)
            self._raft_collector = None
        if self._mailbox_collector is not None:
            REGISTRY.unregister(self._mailbox_collector)
            self._mailbox_collector = None
        if self._broker_collector is not None:
            REGISTRY.unregister(self._broker_collector)
            self._broker_collector = None
        if self.metadata is not None:
            await self.metadata.stop()
            self.metadata = None
        self._executor.shutdown(wait=True)
        if self._zap is not None:  # after every socket of the context closed
            self._zap.stop()
            self._zap = None
        if self._metrics_server is not None:
            self._metrics_server.close()
            self._metrics_server = None
        if self._context is not None:
            # destroy(): close whatever a failed start left open instead of waiting on it.
            self._context.destroy(linger=0)
            self._context = None
        self._stopped.set()

    def _start_inbound_watch(self, config: BrokerConfig) -> InboundWatch | None:
        """The inbound watcher, started; None when `limits.inbound_watcher` is off."""
        limits = config.limits
        if not limits.inbound_watcher:
            log.warning("limits.inbound_watcher is off: nothing bounds what ZeroMQ holds of a connection's input"
                        " (inbound_bytes_per_connection_max and inbound_bytes_max are not enforced); one message"
                        " of endless parts grows this broker's memory until it is killed")
            return None
        inbound = InboundWatch(connection_bytes_max=limits.inbound_bytes_per_connection_max,
                               broker_bytes_max=limits.inbound_bytes_max, on_exit=self._fatal)
        inbound.start()
        return inbound

    def _fatal(self, reason: str) -> None:
        if self.fatal_reason is None:
            self.fatal_reason = reason
        self._stopped.set()  # wakes `wait_stopped`; the owner calls stop()

    async def wait_stopped(self) -> None:
        """Until the service stopped, or failed for good (`fatal_reason` is set)."""
        await self._stopped.wait()

    def statistics(self) -> object:
        assert self._system is not None
        return self._system.statistics()

    async def __aenter__(self) -> BrokerService:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

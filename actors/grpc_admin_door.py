"""Danube's gRPC admin door: `DanubeAdmin.proto` served for Danube's own admin tools.

    danube-admin (gRPC) ──▶ GrpcAdminDoor (grpc.aio server, broker.grpc_admin_listen)
                              │  BrokerAdmin, ClusterAdmin, NamespaceAdmin (this module)
                              │  TopicAdmin, SecurityAdmin                 (grpc_admin_topics.py)
                              │  SchemaRegistry                            (grpc_door_schemas.py)
                              ▼  AdminClient, this broker's admin port (broker.admin_listen);
                                 the registry calls: this broker's client port (broker.listen)

A gateway, not a second admin API: each RPC is one or a few calls of our own admin API
(`client/admin.py`) on this broker's admin port, its records mapped onto Danube's
messages and our error codes onto Danube's gRPC status codes (`GRPC_STATUS`, shared
with the client door). What the door answers is therefore what `danube admin` would.

An RPC our admin API has no equivalent for answers UNIMPLEMENTED with what to use
instead (`unimplemented`); docs/danube-compat.md lists them.

Danube's broker serves its SchemaRegistry on the admin endpoint as well as the client
one (danube-admin's `schemas ...` and `topics configure-schema | set-validation-policy |
get-schema-config` call it there): so does this door, with the client door's servicer.

Every call runs on an admin client dialed with the caller's bearer token and a fresh
CURVE key pair (`actors/grpc_admin_clients.py`), kept for that caller's next calls only:
the admin port's RBAC decides as for `danube admin` with that token.
"""

from __future__ import annotations

import contextvars
import functools
import json
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any, NoReturn

import grpc

from danube_zmq.actors.config import BrokerConfig
from danube_zmq.actors.grpc_admin_clients import AdminClients
from danube_zmq.actors.grpc_door import abort_with, caller_of, native_target
from danube_zmq.actors.grpc_door_auth import Caller, DoorSecurity
from danube_zmq.actors.grpc_door_limits import ADMIN_CALLS_MAX, DoorLimits
from danube_zmq.client.admin import AdminClient
from danube_zmq.transport.admin_operations import by_name
from danube_zmq.transport.danube_proto import DanubeAdmin_pb2 as pb
from danube_zmq.transport.danube_proto import DanubeAdmin_pb2_grpc as pb_grpc
from danube_zmq.transport.errors import DanubeError, InvalidArgument, Unavailable

# The token of the call being served (set by `gateway`), for `GrpcAdminDoor.admin`.
_CALLER: contextvars.ContextVar[Caller] = contextvars.ContextVar("grpc_admin_caller", default=None)

Rpc = Callable[[Any, Any, grpc.aio.ServicerContext], Awaitable[Any]]


def gateway(*operations: str) -> Callable[[Rpc], Rpc]:
    """An RPC served by the admin `operations` it names (transport/admin_operations.py:
    an undeclared name fails at import); the call ends with Danube's gRPC status for
    the `DanubeError` our admin API raised. The names are the door's table
    (`served_rpcs`, docs/danube-compat.md): what each RPC does here and the
    permissions it needs follow from them."""
    for name in operations:
        by_name(name)

    def wrap(rpc: Rpc) -> Rpc:
        @functools.wraps(rpc)
        async def call(self: Any, request: Any, context: grpc.aio.ServicerContext) -> Any:
            _CALLER.set(await caller_of(context, self.door.security))
            try:
                return await rpc(self, request, context)
            except DanubeError as exc:
                await abort_with(context, exc)

        call.operations = operations  # type: ignore[attr-defined]
        return call

    return wrap


def served_rpcs(servicer: type) -> dict[str, tuple[str, ...]]:
    """RPC name -> the admin operations it performs, for each RPC `servicer` serves."""
    return {name: fn.operations for name, fn in vars(servicer).items() if hasattr(fn, "operations")}


async def unimplemented(context: grpc.aio.ServicerContext, why: str) -> NoReturn:
    await context.abort(grpc.StatusCode.UNIMPLEMENTED, why)
    raise AssertionError("abort returns only by raising")


def delivery(dispatch_strategy: int) -> str:
    """Danube's name of a dispatch strategy (our wire value: 0 non-reliable, 1 reliable)."""
    return "Reliable" if dispatch_strategy == 1 else "NonReliable"


class GrpcAdminDoor:
    """The gRPC admin server of one broker. `start()` binds `listen` (http://HOST:PORT) and
    names the door `url` as it serves (https:// with TLS); `stop()` ends the calls and
    closes the admin and registry clients."""

    def __init__(self, *, listen: str, admin_url: str, client_url: str, security: DoorSecurity | None = None,
                 limits: DoorLimits | None = None) -> None:
        self.listen = listen
        self.security = (security or DoorSecurity()).with_context()
        self.limits = limits or DoorLimits.admin_door(BrokerConfig())
        self.admins = AdminClients(native_target(admin_url, "broker.grpc_admin_listen", "broker.admin_listen"),
                                   self.security, "grpc-admin-door", idle_ms=self.limits.admin_client_idle_ms)
        # Danube's admin endpoint serves its SchemaRegistry too (danube-admin's `schemas`
        # and `topics configure-schema ...`): the registry calls go to the client port.
        self.client_target = native_target(client_url, "broker.grpc_admin_listen", "broker.listen")
        self.url = ""
        self._server: grpc.aio.Server | None = None
        self._schemas: Any = None  # SchemaRegistryDoor, imported at start

    @property
    def admin_target(self) -> str:
        return self.admins.admin_target

    async def start(self) -> None:
        from danube_zmq.actors.grpc_admin_topics import SecurityAdminDoor, TopicAdminDoor
        from danube_zmq.actors.grpc_door_schemas import SchemaRegistryDoor
        from danube_zmq.transport.danube_proto import SchemaRegistry_pb2_grpc as spb_grpc

        # Each call holds an admin client (a connection to the admin port) while it runs.
        server = grpc.aio.server(options=self.limits.server_options(), maximum_concurrent_rpcs=ADMIN_CALLS_MAX)
        pb_grpc.add_BrokerAdminServicer_to_server(BrokerAdminDoor(self), server)
        pb_grpc.add_ClusterAdminServicer_to_server(ClusterAdminDoor(self), server)
        pb_grpc.add_NamespaceAdminServicer_to_server(NamespaceAdminDoor(self), server)
        pb_grpc.add_TopicAdminServicer_to_server(TopicAdminDoor(self), server)
        pb_grpc.add_SecurityAdminServicer_to_server(SecurityAdminDoor(self), server)
        self._schemas = SchemaRegistryDoor(security=self.security, client_target=self.client_target,
                                           admins=self.admins)
        spb_grpc.add_SchemaRegistryServicer_to_server(self._schemas, server)
        host, _, port = self.listen.removeprefix("http://").rpartition(":")
        bound = self.security.bind(server, f"{host}:{port}", "broker.grpc_admin_listen")
        if bound == 0:
            raise InvalidArgument(f"broker.grpc_admin_listen: cannot bind {self.listen}")
        await server.start()
        self._server = server
        self.url = f"{self.security.scheme}://{host}:{bound}"

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(grace=1.0)
            self._server = None
        if self._schemas is not None:
            await self._schemas.close()
            self._schemas = None
        self.admins.close()
        assert self.security.context is not None
        self.security.context.destroy(linger=0)

    def admin(self) -> AbstractAsyncContextManager[AdminClient]:
        """A connected admin client of this broker's admin port for one call, the caller's
        own (their token, a key pair of its own)."""
        return self.admins.client(_CALLER.get())


class BrokerAdminDoor(pb_grpc.BrokerAdminServicer):
    def __init__(self, door: GrpcAdminDoor) -> None:
        self.door = door

    @gateway("list_brokers")
    async def ListBrokers(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async with self.door.admin() as admin:
            brokers = await admin.list_brokers()
        # Danube's tools dial `admin_addr` as the broker's gRPC admin API: the admin door a
        # broker registered; for one serving none, our admin port's zmq URL says where its
        # admin API is (no Danube tool can dial it).
        return pb.BrokerListResponse(brokers=[
            pb.BrokerInfo(broker_id=str(b.broker_id), broker_addr=b.broker_url, broker_role=b.role,
                          admin_addr=b.grpc_admin_url or b.admin_url, metrics_addr=b.metrics_url or "",
                          broker_status=b.status)
            for b in brokers])

    @gateway("list_brokers")
    async def GetLeaderBroker(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        # Danube's leader broker is its Raft leader; ours is the broker whose load manager
        # leads (ListBrokers' role "leader", or the only one standalone).
        async with self.door.admin() as admin:
            brokers = await admin.list_brokers()
        leader = next((b for b in brokers if b.role in ("leader", "standalone")), None)
        if leader is None:
            raise Unavailable("no broker leads the cluster right now; try again")
        return pb.BrokerResponse(leader=str(leader.broker_id))

    @gateway("list_namespaces")
    async def ListNamespaces(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async with self.door.admin() as admin:
            return pb.NamespaceListResponse(namespaces=await admin.list_namespaces())

    @gateway("unload_broker")
    async def UnloadBroker(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        if request.dry_run or request.namespaces_include or request.namespaces_exclude:
            await unimplemented(context, "our unload moves every topic of the broker and has no dry run or namespace"
                                         " filter; use TriggerRebalance with dry_run, or UnloadTopic per topic")
        async with self.door.admin() as admin:
            moved = await admin.unload_broker(_broker_id(request.broker_id))
        # Our unload starts the moves and returns: they are pending, not yet done.
        return pb.UnloadBrokerResponse(started=True, total=len(moved.moves), succeeded=0, failed=0,
                                       pending=len(moved.moves))

    @gateway("activate_broker")
    async def ActivateBroker(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async with self.door.admin() as admin:
            await admin.activate_broker(_broker_id(request.broker_id))
        return pb.ActivateBrokerResponse(success=True)

    @gateway("get_cluster_balance")
    async def GetClusterBalance(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async with self.door.admin() as admin:
            balance = await admin.cluster_balance()
        return pb.ClusterBalanceResponse(
            coefficient_of_variation=balance.coefficient_of_variation, mean_load=balance.mean_load,
            max_load=balance.max_load, min_load=balance.min_load, std_deviation=balance.std_deviation,
            broker_count=len(balance.brokers), assignment_strategy=balance.assignment_strategy,
            brokers=[pb.BrokerLoadInfo(broker_id=b.broker_id, load=b.load, topic_count=b.topic_count,
                                       is_overloaded=b.overloaded, is_underloaded=b.underloaded)
                     for b in balance.brokers])

    @gateway("rebalance_cluster")
    async def TriggerRebalance(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        max_moves = request.max_moves if request.HasField("max_moves") else None
        async with self.door.admin() as admin:
            done = await admin.rebalance(dry_run=request.dry_run, max_moves=max_moves)
        return pb.RebalanceResponse(
            success=True, moves_executed=0 if done.dry_run else len(done.moves), error_message=done.why_none,
            proposed_moves=[pb.ProposedMove(topic_name=m.topic, from_broker=m.from_broker, to_broker=m.to_broker,
                                            estimated_load=m.estimated_load, reason="rebalance")
                            for m in done.moves])


class ClusterAdminDoor(pb_grpc.ClusterAdminServicer):
    def __init__(self, door: GrpcAdminDoor) -> None:
        self.door = door

    @gateway("cluster_status")
    async def ClusterStatus(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async with self.door.admin() as admin:
            status = await admin.cluster_status()
        me = next((m for m in status.members if m.node_id == status.node_id), None)
        return pb.ClusterStatusResponse(
            leader_id=status.leader_id or 0, current_term=status.term, last_applied=status.applied_index,
            voters=[m.node_id for m in status.members if m.voter],
            learners=[m.node_id for m in status.members if not m.voter],
            self_node_id=status.node_id, raft_addr=(me.address or "") if me is not None else "")

    @gateway("add_cluster_node")
    async def AddNode(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        if not request.node_id:
            await unimplemented(context, "our cluster does not ask a new node for its id: give node_id (the new"
                                         " node's cluster.node_id)")
        # Danube names a Raft address host:port; ours are zmq endpoints.
        address = request.addr if "://" in request.addr else f"tcp://{request.addr}"
        async with self.door.admin() as admin:
            await admin.add_node(request.node_id, address)
        return pb.AddNodeResponse(success=True, node_id=request.node_id,
                                  message=f"node {request.node_id} added as a learner")

    @gateway("promote_cluster_node")
    async def PromoteNode(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async with self.door.admin() as admin:
            await admin.promote_node(request.node_id)
        return pb.PromoteNodeResponse(success=True, message=f"node {request.node_id} is a voter")

    @gateway("remove_cluster_node")
    async def RemoveNode(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async with self.door.admin() as admin:
            await admin.remove_node(request.node_id)
        return pb.RemoveNodeResponse(success=True, message=f"node {request.node_id} removed")


class NamespaceAdminDoor(pb_grpc.NamespaceAdminServicer):
    def __init__(self, door: GrpcAdminDoor) -> None:
        self.door = door

    @gateway("list_topics")
    async def GetNamespaceTopics(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async with self.door.admin() as admin:
            topics = await admin.list_topics(request.name)
        return pb.TopicListResponse(topics=[name for topic in topics for name in partition_names(topic)])

    @gateway("get_topic_policies")
    async def GetNamespacePolicies(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async with self.door.admin() as admin:
            policies = await admin.get_namespace_policies(request.name)
        # Danube answers its policies as a JSON object; ours are named as in `policies:`.
        return pb.PolicyResponse(policies=json.dumps(policies.values, sort_keys=True))

    @gateway("create_namespace")
    async def CreateNamespace(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async with self.door.admin() as admin:
            await admin.create_namespace(request.name)
        return pb.NamespaceResponse(success=True)

    @gateway("delete_namespace")
    async def DeleteNamespace(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async with self.door.admin() as admin:
            await admin.delete_namespace(request.name)
        return pb.NamespaceResponse(success=True)


def partition_names(topic: Any) -> list[str]:
    """Danube lists each partition as a topic of its own (`/ns/t-part-0`, ...)."""
    if not topic.partitions:
        return [topic.name]
    return [f"{topic.name}-part-{i}" for i in range(topic.partitions)]


def _broker_id(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise InvalidArgument(f"broker_id must be a broker's id (a number, as ListBrokers names it), got {text!r}") \
            from None

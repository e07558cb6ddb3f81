"""The admin door's BrokerAdmin, ClusterAdmin and NamespaceAdmin (`admin_door.py`): each
RPC one or a few calls of our admin API, mapped onto Danube's messages."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import grpc

from danube_zmq.doors.grpc.admin_rpcs import broker_id_of, gateway, partition_names, unimplemented
from danube_zmq.transport.danube_proto import DanubeAdmin_pb2 as pb
from danube_zmq.transport.danube_proto import DanubeAdmin_pb2_grpc as pb_grpc
from danube_zmq.transport.errors import Unavailable

if TYPE_CHECKING:
    from danube_zmq.doors.grpc.admin_door import GrpcAdminDoor


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
            moved = await admin.unload_broker(broker_id_of(request.broker_id))
        # Our unload starts the moves and returns: they are pending, not yet done.
        return pb.UnloadBrokerResponse(started=True, total=len(moved.moves), succeeded=0, failed=0,
                                       pending=len(moved.moves))

    @gateway("activate_broker")
    async def ActivateBroker(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async with self.door.admin() as admin:
            await admin.activate_broker(broker_id_of(request.broker_id))
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

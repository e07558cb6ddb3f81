"""The gRPC admin door's TopicAdmin and SecurityAdmin (`doors/grpc/admin_door.py`).

Each RPC is one or a few calls of our admin API on this broker's admin port. Where
Danube's messages and ours differ in shape, the mapping is here:

- a partitioned topic is listed as its partitions (`/ns/t-part-i`), as Danube does;
- `delivery` is Danube's name of the dispatch strategy ("Reliable", "NonReliable");
- a binding's scope is Danube's `scope` + `resource_name` ("namespace", "default"),
  ours one string ("namespace:default"); its id is ours (derived from principal and
  scope), the id a Danube request names is not kept.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import grpc

from danube_zmq.doors.grpc.admin_rpcs import delivery, gateway, partition_names, served_rpcs
from danube_zmq.doors.grpc.admin_services import BrokerAdminDoor, ClusterAdminDoor, NamespaceAdminDoor

if TYPE_CHECKING:
    from danube_zmq.doors.grpc.admin_door import GrpcAdminDoor
from danube_zmq.transport.admin_operations import by_name
from danube_zmq.transport.admin_protocol import BindingInfo
from danube_zmq.transport.client_protocol import DispatchStrategy
from danube_zmq.transport.danube_proto import DanubeAdmin_pb2 as pb
from danube_zmq.transport.danube_proto import DanubeAdmin_pb2_grpc as pb_grpc
from danube_zmq.transport.errors import InvalidArgument, NotFound

_BACKOFF = {"fixed": pb.Fixed, "exponential": pb.Exponential}
_POISON = {"dead_letter": pb.DeadLetter, "block": pb.Block, "drop": pb.Drop}


class TopicAdminDoor(pb_grpc.TopicAdminServicer):
    def __init__(self, door: GrpcAdminDoor) -> None:
        self.door = door

    @gateway("list_topics")
    async def ListNamespaceTopics(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async with self.door.admin() as admin:
            topics = await admin.list_topics(request.name)
        return pb.TopicInfoListResponse(topics=[info for topic in topics for info in _topic_infos(topic)])

    @gateway("list_namespaces", "list_topics")
    async def ListBrokerTopics(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        # Ours lists topics per namespace with each partition's broker: every namespace's,
        # kept where the broker is the one asked for.
        async with self.door.admin() as admin:
            infos = [info for namespace in await admin.list_namespaces()
                     for topic in await admin.list_topics(namespace) for info in _topic_infos(topic)]
        return pb.TopicInfoListResponse(topics=[info for info in infos if info.broker_id == request.broker_id])

    @gateway("create_topic", "configure_topic_schema")
    async def CreateTopic(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        await self._create(request.name, 0, request.dispatch_strategy,
                           request.schema_subject if request.HasField("schema_subject") else None)
        return pb.TopicResponse(success=True)

    @gateway("create_topic", "configure_topic_schema")
    async def CreatePartitionedTopic(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        if request.partitions < 1:
            raise InvalidArgument(f"partitions must be at least 1, got {request.partitions}")
        await self._create(request.base_name, request.partitions, request.dispatch_strategy,
                           request.schema_subject if request.HasField("schema_subject") else None)
        return pb.TopicResponse(success=True)

    async def _create(self, topic: str, partitions: int, strategy: int, subject: str | None) -> None:
        async with self.door.admin() as admin:
            await admin.create_topic(topic, partitions=partitions, dispatch_strategy=DispatchStrategy(strategy))
            if subject:
                # Danube binds the subject at creation; ours binds it in a second call.
                await admin.configure_topic_schema(topic, subject)

    @gateway("delete_topic")
    async def DeleteTopic(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async with self.door.admin() as admin:
            await admin.delete_topic(request.name)
        return pb.TopicResponse(success=True)

    @gateway("unload_topic")
    async def UnloadTopic(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async with self.door.admin() as admin:
            await admin.unload_topic(request.name)
        return pb.TopicResponse(success=True)

    @gateway("list_subscriptions")
    async def ListSubscriptions(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async with self.door.admin() as admin:
            return pb.SubscriptionListResponse(subscriptions=await admin.list_subscriptions(request.name))

    @gateway("unsubscribe")
    async def Unsubscribe(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async with self.door.admin() as admin:
            await admin.unsubscribe(request.topic, request.subscription)
        return pb.SubscriptionResponse(success=True)

    @gateway("get_failure_policy", "set_failure_policy")
    async def SetSubscriptionFailurePolicy(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        policy = request.failure_policy
        backoff = next((name for name, value in _BACKOFF.items() if value == policy.backoff_strategy), None)
        poison = next((name for name, value in _POISON.items() if value == policy.poison_policy), None)
        if backoff is None or poison is None:
            raise InvalidArgument(f"unknown backoff_strategy {policy.backoff_strategy} or poison_policy"
                                  f" {policy.poison_policy}")
        async with self.door.admin() as admin:
            # Danube's message sets every field: so does this (an absent dead-letter topic clears it).
            await admin.set_failure_policy(
                request.topic, request.subscription, max_redelivery_count=policy.max_redelivery_count,
                ack_timeout_ms=policy.ack_timeout_ms, base_redelivery_delay_ms=policy.base_redelivery_delay_ms,
                max_redelivery_delay_ms=policy.max_redelivery_delay_ms, backoff=backoff, poison_policy=poison,
                dead_letter_topic=policy.dead_letter_topic if policy.HasField("dead_letter_topic") else "")
        return pb.SubscriptionResponse(success=True)

    @gateway("get_failure_policy", "describe_topic")
    async def GetSubscriptionFailurePolicy(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async with self.door.admin() as admin:
            policy = await admin.get_failure_policy(request.topic, request.subscription)
            description = await admin.describe_topic(request.topic)
        sub_type = next((s.sub_type for p in description.partitions for s in p.subscriptions
                         if s.name == request.subscription), 0)
        return pb.GetSubscriptionFailurePolicyResponse(
            subscription_type=sub_type,
            failure_policy=pb.SubscriptionFailurePolicy(
                max_redelivery_count=policy.max_redelivery_count, ack_timeout_ms=policy.ack_timeout_ms,
                base_redelivery_delay_ms=policy.base_redelivery_delay_ms,
                max_redelivery_delay_ms=policy.max_redelivery_delay_ms,
                backoff_strategy=_BACKOFF[policy.backoff], poison_policy=_POISON[policy.poison_policy],
                dead_letter_topic=policy.dead_letter_topic))

    @gateway("describe_topic", "get_topic_schema_config")
    async def DescribeTopic(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async with self.door.admin() as admin:
            description = await admin.describe_topic(request.name)
            try:
                schema = await admin.get_topic_schema_config(request.name)
            except NotFound:
                schema = None
        subscriptions = sorted({s.name for p in description.partitions for s in p.subscriptions})
        reply = pb.DescribeTopicResponse(name=description.name, subscriptions=subscriptions,
                                         broker_id=str(description.broker_id),
                                         delivery=delivery(description.dispatch_strategy))
        if schema is not None:
            reply.schema_subject = schema.subject
            reply.schema_id = schema.schema_id
            if schema.latest_version is not None:
                reply.schema_version = schema.latest_version
            if schema.schema_type is not None:
                reply.schema_type = schema.schema_type
            if schema.compatibility is not None:
                # Danube's DescribeTopic names the mode in capitals ("BACKWARD").
                reply.compatibility_mode = schema.compatibility.upper()
        return reply

    @gateway("set_dispatch_config")
    async def SetSubscriptionDispatchConfig(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async with self.door.admin() as admin:
            await admin.set_dispatch_config(request.topic, request.subscription,
                                            max_unacked_messages=request.dispatch_config.max_unacked_messages)
        return pb.SubscriptionResponse(success=True)

    @gateway("get_dispatch_config")
    async def GetSubscriptionDispatchConfig(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async with self.door.admin() as admin:
            config = await admin.get_dispatch_config(request.topic, request.subscription)
        return pb.GetSubscriptionDispatchConfigResponse(
            dispatch_config=pb.SubscriptionDispatchConfig(max_unacked_messages=config.max_unacked_messages))


def _topic_infos(topic: Any) -> list[Any]:
    owners = {owner.name: owner.broker_id for owner in topic.owners or ()}
    return [pb.TopicInfo(name=name, delivery=delivery(topic.dispatch_strategy),
                         broker_id=_id(owners.get(name, topic.broker_id if not topic.partitions else None)))
            for name in partition_names(topic)]


def _id(broker_id: int | None) -> str:
    return "" if broker_id is None else str(broker_id)  # Danube: empty if unassigned


class SecurityAdminDoor(pb_grpc.SecurityAdminServicer):
    def __init__(self, door: GrpcAdminDoor) -> None:
        self.door = door

    @gateway("create_role")
    async def CreateRole(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async with self.door.admin() as admin:
            await admin.create_role(request.role.name, list(request.role.permissions))
        return pb.CreateRoleResponse(success=True)

    @gateway("list_roles")
    async def GetRole(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async with self.door.admin() as admin:
            roles = await admin.list_roles()
        role = next((r for r in roles if r.name == request.name), None)
        if role is None:
            raise NotFound(f"no role {request.name!r}")
        return pb.GetRoleResponse(role=pb.RoleDefinition(name=role.name, permissions=role.permissions))

    @gateway("list_roles")
    async def ListRoles(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async with self.door.admin() as admin:
            roles = await admin.list_roles()
        return pb.ListRolesResponse(roles=[pb.RoleDefinition(name=r.name, permissions=r.permissions) for r in roles])

    @gateway("delete_role")
    async def DeleteRole(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async with self.door.admin() as admin:
            await admin.delete_role(request.name)
        return pb.DeleteRoleResponse(success=True)

    @gateway("create_binding")
    async def CreateBinding(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        b = request.binding
        async with self.door.admin() as admin:
            await admin.create_binding(b.principal_name, b.principal_type, list(b.role_names),
                                       _scope(b.scope, b.resource_name))
        return pb.CreateBindingResponse(success=True)

    @gateway("list_bindings")
    async def GetBinding(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        scope = _scope(request.scope, request.resource_name)
        async with self.door.admin() as admin:
            bindings = await admin.list_bindings()
        found = next((b for b in bindings if b.binding_id == request.binding_id and b.scope == scope), None)
        if found is None:
            raise NotFound(f"no binding {request.binding_id!r} at {scope}")
        return pb.GetBindingResponse(binding=_binding(found))

    @gateway("list_bindings")
    async def ListBindings(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        scope = _scope(request.scope, request.resource_name)
        async with self.door.admin() as admin:
            bindings = await admin.list_bindings()
        return pb.ListBindingsResponse(bindings=[_binding(b) for b in bindings if b.scope == scope])

    @gateway("list_bindings")
    async def ListAllBindings(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async with self.door.admin() as admin:
            bindings = await admin.list_bindings()
        return pb.ListBindingsResponse(bindings=[_binding(b) for b in bindings])

    @gateway("delete_binding")
    async def DeleteBinding(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async with self.door.admin() as admin:
            await admin.delete_binding(request.binding_id)
        return pb.DeleteBindingResponse(success=True)


def _scope(scope: str, resource_name: str) -> str:
    """Ours of Danube's scope and resource: ("cluster", "") is "cluster", ("topic",
    "/ns/t") is "topic:/ns/t"."""
    if scope == "cluster":
        return "cluster"
    if scope in ("namespace", "topic") and resource_name:
        return f"{scope}:{resource_name}"
    raise InvalidArgument(f"scope must be cluster, or namespace or topic with a resource_name; got {scope!r}, "
                          f"{resource_name!r}")


def _binding(b: BindingInfo) -> Any:
    scope, _, resource = b.scope.partition(":")
    return pb.BindingDefinition(id=b.binding_id, principal_type=b.principal_type, principal_name=b.principal,
                                role_names=b.roles, scope=scope, resource_name=resource)


def door_table() -> list[tuple[str, str, str]]:
    """(service.RPC, the admin operations it performs, the permissions they need) for
    every RPC the admin door serves, from the operations each names: the table in
    docs/danube-compat.md (a test checks the two agree)."""
    rows = []
    for service, door in (("BrokerAdmin", BrokerAdminDoor), ("ClusterAdmin", ClusterAdminDoor),
                          ("NamespaceAdmin", NamespaceAdminDoor), ("TopicAdmin", TopicAdminDoor),
                          ("SecurityAdmin", SecurityAdminDoor)):
        for rpc, operations in served_rpcs(door).items():
            permissions = sorted({by_name(name).permission for name in operations})
            rows.append((f"{service}.{rpc}", ", ".join(f"`{name}`" for name in operations), ", ".join(permissions)))
    return rows

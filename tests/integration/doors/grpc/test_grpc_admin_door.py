"""The broker's gRPC admin door driven by grpcio stubs of Danube's `DanubeAdmin.proto`.

A real broker process with `--grpc-admin-listen` on a free port; the stubs are the ones
checked in under transport/danube_proto/ (docs/danube-compat.md, "The admin door").
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from types import SimpleNamespace

import grpc
import pytest

from danube_zmq.client import DanubeClient as NativeClient
from danube_zmq.transport.danube_proto import DanubeAdmin_pb2 as pb
from danube_zmq.transport.danube_proto import DanubeAdmin_pb2_grpc as pb_grpc
from tests.integration.conftest import BrokerProcess, free_port, start_broker


@pytest.fixture
def admin_door_broker(tmp_path: Path) -> Iterator[tuple[BrokerProcess, str]]:
    url = f"http://127.0.0.1:{free_port()}"
    process = start_broker(tmp_path, "--grpc-admin-listen", url)
    yield process, url
    code = process.stop()
    assert code == 0, f"broker did not stop cleanly (exit {code}):\n{process.log()}"


@pytest.fixture
async def stubs(admin_door_broker: tuple[BrokerProcess, str]) -> AsyncIterator[SimpleNamespace]:
    _, url = admin_door_broker
    async with grpc.aio.insecure_channel(url.removeprefix("http://")) as channel:
        # The door is bound before the broker answers on its admin port; this bounds the connect.
        brokers = pb_grpc.BrokerAdminStub(channel)
        async with asyncio.timeout(10):
            await channel.channel_ready()
            # The broker registers itself (its lease) just after its ports answer.
            while not (await brokers.ListBrokers(pb.Empty())).brokers:
                await asyncio.sleep(0.05)
        yield SimpleNamespace(brokers=brokers, cluster=pb_grpc.ClusterAdminStub(channel),
                              namespaces=pb_grpc.NamespaceAdminStub(channel), topics=pb_grpc.TopicAdminStub(channel),
                              security=pb_grpc.SecurityAdminStub(channel))


async def test_brokers_namespaces_and_cluster_status(admin_door_broker: tuple[BrokerProcess, str],
                                                     stubs: SimpleNamespace) -> None:
    process, url = admin_door_broker
    brokers = (await stubs.brokers.ListBrokers(pb.Empty())).brokers
    assert len(brokers) == 1
    (me,) = brokers
    # admin_addr: where Danube's admin tools reach the broker, its gRPC admin door.
    assert (me.broker_addr, me.admin_addr, me.broker_role) == (process.url, url, "standalone")
    assert (await stubs.brokers.GetLeaderBroker(pb.Empty())).leader == me.broker_id
    assert "default" in (await stubs.brokers.ListNamespaces(pb.Empty())).namespaces
    await stubs.namespaces.CreateNamespace(pb.NamespaceRequest(name="shop"))
    assert "shop" in (await stubs.brokers.ListNamespaces(pb.Empty())).namespaces
    policies = json.loads((await stubs.namespaces.GetNamespacePolicies(pb.NamespaceRequest(name="shop"))).policies)
    assert "max_producers_per_topic" in policies
    status = await stubs.cluster.ClusterStatus(pb.Empty())
    # Standalone: a single voter that leads.
    assert status.leader_id == status.self_node_id != 0
    assert list(status.voters) == [status.self_node_id] and not status.learners
    balance = await stubs.brokers.GetClusterBalance(pb.ClusterBalanceRequest())
    assert balance.broker_count == 1 and str(balance.brokers[0].broker_id) == me.broker_id


async def test_create_and_describe_topics(admin_door_broker: tuple[BrokerProcess, str],
                                          stubs: SimpleNamespace) -> None:
    process, _ = admin_door_broker
    await stubs.topics.CreateTopic(pb.NewTopicRequest(name="/default/orders", dispatch_strategy=pb.Reliable))
    await stubs.topics.CreatePartitionedTopic(pb.PartitionedTopicRequest(base_name="/default/events", partitions=3))
    me = (await stubs.brokers.ListBrokers(pb.Empty())).brokers[0].broker_id

    listed = (await stubs.topics.ListNamespaceTopics(pb.NamespaceRequest(name="default"))).topics
    by_name = {t.name: (t.broker_id, t.delivery) for t in listed}
    assert by_name["/default/orders"] == (me, "Reliable")
    # Danube lists a partitioned topic as its partitions.
    for i in range(3):
        assert by_name[f"/default/events-part-{i}"] == (me, "NonReliable")
    assert "/default/events" not in by_name
    names = (await stubs.namespaces.GetNamespaceTopics(pb.NamespaceRequest(name="default"))).topics
    assert set(names) == set(by_name)
    on_me = (await stubs.topics.ListBrokerTopics(pb.BrokerRequest(broker_id=me))).topics
    assert {t.name for t in on_me} == set(by_name)
    assert not (await stubs.topics.ListBrokerTopics(pb.BrokerRequest(broker_id="1"))).topics

    async with NativeClient(process.url) as ours:
        await ours.subscribe("/default/orders", "billing", sub_type="shared")
        described = await stubs.topics.DescribeTopic(pb.DescribeTopicRequest(name="/default/orders"))
        assert (described.name, described.broker_id, described.delivery) == ("/default/orders", me, "Reliable")
        assert list(described.subscriptions) == ["billing"] and not described.HasField("schema_subject")
        subscriptions = await stubs.topics.ListSubscriptions(pb.TopicRequest(name="/default/orders"))
        assert list(subscriptions.subscriptions) == ["billing"]

        policy = pb.SubscriptionFailurePolicy(max_redelivery_count=3, ack_timeout_ms=7_000,
                                              base_redelivery_delay_ms=100, max_redelivery_delay_ms=900,
                                              backoff_strategy=pb.Fixed, poison_policy=pb.Drop)
        await stubs.topics.SetSubscriptionFailurePolicy(pb.SetSubscriptionFailurePolicyRequest(
            topic="/default/orders", subscription="billing", failure_policy=policy))
        got = await stubs.topics.GetSubscriptionFailurePolicy(pb.GetSubscriptionFailurePolicyRequest(
            topic="/default/orders", subscription="billing"))
        assert got.failure_policy == policy and got.subscription_type == 1  # Shared

        await stubs.topics.SetSubscriptionDispatchConfig(pb.SetSubscriptionDispatchConfigRequest(
            topic="/default/orders", subscription="billing",
            dispatch_config=pb.SubscriptionDispatchConfig(max_unacked_messages=42)))
        window = await stubs.topics.GetSubscriptionDispatchConfig(pb.GetSubscriptionDispatchConfigRequest(
            topic="/default/orders", subscription="billing"))
        assert window.dispatch_config.max_unacked_messages == 42

    partitioned = await stubs.topics.DescribeTopic(pb.DescribeTopicRequest(name="/default/events"))
    assert (partitioned.name, partitioned.delivery) == ("/default/events", "NonReliable")
    await stubs.topics.DeleteTopic(pb.TopicRequest(name="/default/orders"))
    after = (await stubs.topics.ListNamespaceTopics(pb.NamespaceRequest(name="default"))).topics
    assert "/default/orders" not in {t.name for t in after}


async def test_error_codes_are_danubes(stubs: SimpleNamespace) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as missing:
        await stubs.topics.DescribeTopic(pb.DescribeTopicRequest(name="/default/nowhere"))
    assert missing.value.code() == grpc.StatusCode.NOT_FOUND
    with pytest.raises(grpc.aio.AioRpcError) as bad:
        await stubs.topics.CreateTopic(pb.NewTopicRequest(name="no-namespace"))
    assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    await stubs.topics.CreateTopic(pb.NewTopicRequest(name="/default/twice"))
    with pytest.raises(grpc.aio.AioRpcError) as again:
        await stubs.topics.CreateTopic(pb.NewTopicRequest(name="/default/twice"))
    assert again.value.code() == grpc.StatusCode.ALREADY_EXISTS


async def test_rpc_without_an_equivalent_says_what_to_use(stubs: SimpleNamespace) -> None:
    """Our unload has no dry run: UNIMPLEMENTED, naming what does what was asked."""
    me = (await stubs.brokers.ListBrokers(pb.Empty())).brokers[0].broker_id
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await stubs.brokers.UnloadBroker(pb.UnloadBrokerRequest(broker_id=me, dry_run=True))
    assert refused.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert "TriggerRebalance" in (refused.value.details() or "")
    # Nothing moved: the broker still takes topics.
    await stubs.topics.CreateTopic(pb.NewTopicRequest(name="/default/after-dry-run"))


async def test_roles_and_bindings(stubs: SimpleNamespace) -> None:
    await stubs.security.CreateRole(pb.CreateRoleRequest(role=pb.RoleDefinition(name="reader",
                                                                                 permissions=["Lookup", "Consume"])))
    role = (await stubs.security.GetRole(pb.GetRoleRequest(name="reader"))).role
    assert (role.name, set(role.permissions)) == ("reader", {"Lookup", "Consume"})
    await stubs.security.CreateBinding(pb.CreateBindingRequest(binding=pb.BindingDefinition(
        principal_type="user", principal_name="ann", role_names=["reader"], scope="namespace",
        resource_name="default")))
    bindings = (await stubs.security.ListBindings(pb.ListBindingsRequest(scope="namespace",
                                                                         resource_name="default"))).bindings
    assert [(b.principal_name, b.scope, b.resource_name, list(b.role_names)) for b in bindings] == [
        ("ann", "namespace", "default", ["reader"])]
    await stubs.security.DeleteBinding(pb.DeleteBindingRequest(scope="namespace", resource_name="default",
                                                               binding_id=bindings[0].id))
    assert not (await stubs.security.ListAllBindings(pb.Empty())).bindings
    with pytest.raises(grpc.aio.AioRpcError) as missing:
        await stubs.security.GetRole(pb.GetRoleRequest(name="writer"))
    assert missing.value.code() == grpc.StatusCode.NOT_FOUND

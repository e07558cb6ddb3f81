"""The gRPC admin door's mappings between Danube's admin messages and ours."""

from __future__ import annotations

from pathlib import Path

import pytest

from danube_zmq.doors.grpc.admin_door import GrpcAdminDoor
from danube_zmq.doors.grpc.admin_rpcs import partition_names
from danube_zmq.doors.grpc.admin_topics import _binding, _scope, _topic_infos
from danube_zmq.doors.grpc.auth import DoorSecurity
from danube_zmq.transport.admin_protocol import BindingInfo, PartitionOwner, TopicInfo
from danube_zmq.transport.errors import InvalidArgument
from tests.paths import ROOT
from tests.tls_certs import self_signed_cert


@pytest.mark.parametrize(("scope", "resource", "ours"), [("cluster", "", "cluster"),
                                                          ("namespace", "default", "namespace:default"),
                                                          ("topic", "/default/t", "topic:/default/t")])
def test_binding_scope_round_trip(scope: str, resource: str, ours: str) -> None:
    assert _scope(scope, resource) == ours
    back = _binding(BindingInfo(binding_id="b1", principal="ann", principal_type="user", roles=["r"], scope=ours))
    assert (back.scope, back.resource_name, back.id, back.principal_name) == (scope, resource, "b1", "ann")


@pytest.mark.parametrize(("scope", "resource"), [("namespace", ""), ("tenant", "x"), ("", "")])
def test_bad_binding_scope(scope: str, resource: str) -> None:
    with pytest.raises(InvalidArgument):
        _scope(scope, resource)


def test_partitions_are_listed_with_their_own_brokers() -> None:
    """Danube lists each partition as a topic; each names the broker serving it, empty
    while unassigned."""
    topic = TopicInfo(name="/default/p", dispatch_strategy=1, partitions=2, broker_id=7,
                      owners=[PartitionOwner(name="/default/p-part-0", broker_id=7, broker_url="tcp://a:1"),
                              PartitionOwner(name="/default/p-part-1", broker_id=None, broker_url=None)])
    assert partition_names(topic) == ["/default/p-part-0", "/default/p-part-1"]
    assert [(t.name, t.broker_id, t.delivery) for t in _topic_infos(topic)] == [
        ("/default/p-part-0", "7", "Reliable"), ("/default/p-part-1", "", "Reliable")]
    plain = TopicInfo(name="/default/t", dispatch_strategy=0, partitions=0, broker_id=3)
    assert [(t.name, t.broker_id, t.delivery) for t in _topic_infos(plain)] == [("/default/t", "3", "NonReliable")]


def test_admin_door_dials_its_own_admin_port() -> None:
    door = GrpcAdminDoor(listen="http://127.0.0.1:0", admin_url="tcp://0.0.0.0:5", client_url="tcp://*:6")
    assert (door.admin_target, door.client_target) == ("tcp://127.0.0.1:5", "tcp://127.0.0.1:6")
    with pytest.raises(InvalidArgument, match=r"broker\.grpc_admin_listen needs broker\.admin_listen"):
        GrpcAdminDoor(listen="http://127.0.0.1:0", admin_url="inproc://admin", client_url="tcp://127.0.0.1:6")
    # Its SchemaRegistry dials the client port.
    with pytest.raises(InvalidArgument, match=r"broker\.grpc_admin_listen needs broker\.listen"):
        GrpcAdminDoor(listen="http://127.0.0.1:0", admin_url="tcp://127.0.0.1:5", client_url="inproc://clients")


async def test_admin_door_url_is_https_when_it_serves_tls(tmp_path: Path) -> None:
    """Danube's admin tools choose TLS from an https:// address: the door names itself
    as it serves, http:// without a certificate, https:// with one."""
    cert, key = self_signed_cert(tmp_path)
    for security, scheme in ((DoorSecurity(), "http"),
                             (DoorSecurity(tls_cert_file=str(cert), tls_key_file=str(key)), "https")):
        door = GrpcAdminDoor(listen="http://127.0.0.1:0", admin_url="tcp://127.0.0.1:5",
                             client_url="tcp://127.0.0.1:6", security=security)
        await door.start()
        try:
            host, _, port = door.url.rpartition(":")
            assert host == f"{scheme}://127.0.0.1" and int(port) > 0, door.url
        finally:
            await door.stop()


def test_every_admin_rpc_names_declared_operations_and_the_docs_table_is_the_doors() -> None:
    """Each RPC of Danube's five admin services is served here naming the admin operations
    it performs (an undeclared name fails at import); docs/danube-compat.md's table is
    `door_table()` row for row."""
    from danube_zmq.doors.grpc.admin_topics import door_table
    from danube_zmq.transport.danube_proto import DanubeAdmin_pb2 as pb

    rows = door_table()
    served = {rpc for rpc, _, _ in rows}
    wanted = {f"{service.name}.{method.name}" for service in pb.DESCRIPTOR.services_by_name.values()
              for method in service.methods}
    assert served == wanted
    assert all(operations for _, operations, _ in rows)
    doc = (ROOT / "docs" / "danube-compat.md").read_text()
    table = doc.split("<!-- door table:")[1].split("<!-- end door table -->")[0]
    documented = [tuple(cell.strip() for cell in line.strip("|").split("|"))
                  for line in table.splitlines()[3:] if line.startswith("|")]
    assert documented == rows

"""The gRPC door's pure parts: error mapping, the address it dials, staying unloaded when off."""

from __future__ import annotations

import subprocess
import sys

import grpc
import msgpack
import pytest

from danube_zmq.actors.grpc_door import GRPC_STATUS, native_target
from danube_zmq.transport import cluster_records as cr
from danube_zmq.transport.errors import ErrorCode, InvalidArgument


def test_every_error_code_has_a_grpc_status() -> None:
    """A new ErrorCode must say which gRPC code Danube's clients see for it."""
    assert set(GRPC_STATUS) == set(ErrorCode)


def test_danube_client_reactions_are_kept() -> None:
    """The codes Danube's client acts on: UNAVAILABLE redoes the lookup, the Exclusive
    conflict (CONSUMER_BUSY here) is PERMISSION_DENIED, our TIMEOUT is retried."""
    assert GRPC_STATUS[ErrorCode.UNAVAILABLE] == grpc.StatusCode.UNAVAILABLE
    assert GRPC_STATUS[ErrorCode.CONSUMER_BUSY] == grpc.StatusCode.PERMISSION_DENIED
    assert GRPC_STATUS[ErrorCode.TIMEOUT] == grpc.StatusCode.DEADLINE_EXCEEDED


@pytest.mark.parametrize(("bound", "dialed"), [
    ("tcp://0.0.0.0:6650", "tcp://127.0.0.1:6650"), ("tcp://*:7000", "tcp://127.0.0.1:7000"),
    ("tcp://10.1.2.3:6650", "tcp://10.1.2.3:6650"), ("ipc:///tmp/b.sock", "ipc:///tmp/b.sock")])
def test_door_dials_its_own_client_port(bound: str, dialed: str) -> None:
    assert native_target(bound) == dialed


def test_door_cannot_dial_inproc() -> None:
    """Its native clients have their own ZeroMQ context, which cannot reach inproc://."""
    with pytest.raises(InvalidArgument, match="tcp:// or ipc://"):
        native_target("inproc://broker")


def test_registration_without_grpc_url_still_decodes() -> None:
    """Records written before the door existed (one field fewer) decode with grpc_url None."""
    record = cr.BrokerRegistration(broker_id=1, broker_url="tcp://a:1", admin_url="tcp://a:2", raft_node_id=1,
                                   started_ms=5, grpc_url="http://a:3")
    fields = msgpack.unpackb(cr.encode(record), raw=False)
    assert fields[-1] == "http://a:3"
    old = msgpack.packb(fields[:-1], use_bin_type=True)
    assert cr.decode(old, cr.BrokerRegistration).grpc_url is None
    assert cr.decode(cr.encode(record), cr.BrokerRegistration).grpc_url == "http://a:3"


def test_a_broker_without_the_door_loads_no_grpc_module() -> None:
    """Off by default means off: starting the broker's service module imports neither
    door (client or admin), nor the vendored stubs, nor grpcio itself."""
    code = ("import sys, danube_zmq.actors.service, danube_zmq.cli.broker; "
            "print(sorted(m for m in sys.modules if 'grpc_door' in m or 'grpc_admin' in m or 'danube_proto' in m"
            " or m.split('.')[0] == 'grpc'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize(("version_ref", "expected"), [
    ({"use_latest": True}, {"schema_subject": "orders"}),
    ({"pinned_version": 3}, {"schema_subject": "orders", "schema_version": 3}),
    ({"min_version": 2}, {"schema_subject": "orders", "schema_min_version": 2}),
    ({}, {"schema_subject": "orders"}),
])
def test_schema_reference_becomes_the_native_producers_choice(version_ref: dict, expected: dict) -> None:
    from danube_zmq.actors.grpc_door_services import _schema_choice
    from danube_zmq.transport.danube_proto import DanubeApi_pb2 as pb

    request = pb.ProducerRequest(producer_name="p", topic_name="/default/t",
                                 schema_ref=pb.SchemaReference(subject="orders", **version_ref))
    assert _schema_choice(request) == expected
    assert _schema_choice(pb.ProducerRequest(producer_name="p", topic_name="/default/t")) == {}
    with pytest.raises(InvalidArgument):
        _schema_choice(pb.ProducerRequest(schema_ref=pb.SchemaReference(subject="", use_latest=True)))

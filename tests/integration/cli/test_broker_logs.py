"""A broker's log written to a file, as `danube cluster up` and the test fixtures write
it: one record per line (plain text, or JSON with `logging.format: json`), never
wrapped at 80 columns; and no warning repeated while brokers talk to each other."""

from __future__ import annotations

import asyncio
import json
import re
import time
from pathlib import Path

import pytest
import zmq

from danube_zmq.client.admin import AdminClient
from tests.integration.conftest import BrokerProcess, start_broker
from tests.integration.consensus.test_metadata_cluster import agreed_leader, start_cluster

CUT = "connections without a session cut"
# A connection that never sends Connect is cut after this and logged as one long warning.
QUICK_CUT_ENV = {"DANUBE_LIMITS__CONNECT_TIMEOUT_MS": "300"}
LINE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z (DEBUG|INFO|WARNING|ERROR|CRITICAL) [\w.]+: ")


def _provoke_long_warning(broker: BrokerProcess, timeout_s: float = 15.0) -> list[str]:
    """Connect a DEALER to the admin port that sends nothing: the broker cuts it and logs
    a warning of about 190 characters. The log's lines once the warning is in."""
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RECONNECT_IVL, 60_000)  # cut once, not again and again
    sock.connect(broker.admin_url)
    try:
        deadline = time.monotonic() + timeout_s
        while CUT not in broker.log():
            assert time.monotonic() < deadline, f"no cut logged:\n{broker.log()}"
            time.sleep(0.1)
    finally:
        sock.close(linger=0)
    return [line for line in broker.log().splitlines() if line and not line.startswith("danube broker ")]


def test_a_log_file_gets_one_plain_record_per_line(tmp_path: Path) -> None:
    """The broker's stderr is a file: each record is one `TIME LEVEL LOGGER: MESSAGE` line,
    the long warning whole on its line (rich wrapped it over four)."""
    broker = start_broker(tmp_path, "--metrics-port", "0", env=QUICK_CUT_ENV)
    try:
        lines = _provoke_long_warning(broker)
    finally:
        assert broker.stop() == 0, broker.log()
    assert lines and all(LINE.match(line) for line in lines), lines
    [warning] = [line for line in lines if CUT in line]
    assert len(warning) > 120 and " WARNING danube_zmq." in warning and warning.endswith("pending now"), warning


def test_a_json_log_is_one_object_per_line(tmp_path: Path) -> None:
    """With logging.format json every line of the log is a JSON object with time, level,
    logger and the whole message."""
    broker = start_broker(tmp_path, env={**QUICK_CUT_ENV, "DANUBE_LOGGING__FORMAT": "json"})
    try:
        lines = _provoke_long_warning(broker)
    finally:
        assert broker.stop() == 0, broker.log()
    records = [json.loads(line) for line in lines]
    assert all({"time", "level", "logger", "message"} <= set(r) for r in records), records
    [warning] = [r for r in records if CUT in r["message"]]
    assert warning["level"] == "WARNING" and warning["message"].endswith("pending now"), warning


@pytest.mark.cluster
def test_brokers_describing_each_others_topics_log_no_repeated_cut(tmp_path: Path) -> None:
    """Broker 1 describes partitions served by broker 2 through broker 2's admin port.
    It used to keep that connection open: broker 2 cut it once idle for
    connect_timeout_ms, the DEALER reconnected at once, was cut again, and broker 2
    logged a warning every 10 s for as long as both ran. Now broker 1 closes it idle."""
    nodes = start_cluster(tmp_path, 2, env={"DANUBE_LIMITS__CONNECT_TIMEOUT_MS": "1000"})
    try:
        asyncio.run(agreed_leader(nodes))

        async def describe() -> int:
            async with AdminClient(nodes[0].admin_url) as admin:
                while len(await admin.list_brokers()) < 2:  # both registered: placement uses both
                    await asyncio.sleep(0.1)
                await admin.create_topic("/default/spread", partitions=4)
                for _ in range(50):
                    brokers = {p.broker_id for p in (await admin.describe_topic("/default/spread")).partitions}
                    if len(brokers) == 2:
                        return len(brokers)
                    await asyncio.sleep(0.2)
            return 1

        assert asyncio.run(describe()) == 2  # so broker 1 asked broker 2
        time.sleep(4.0)  # four of broker 2's connect timeouts
        for node in nodes:
            assert node.process is not None
            assert CUT not in node.process.log(), node.process.log()
    finally:
        for node in nodes:
            node.stop()


def test_a_grpc_admin_door_call_leaves_no_connection_to_cut(tmp_path: Path) -> None:
    """The gRPC admin door answers a call through an admin client of the admin port and
    keeps it for the caller's next call. It used to keep it for ever: the admin port cut
    it once idle, the DEALER reconnected at once, was cut again, a warning each time. Now
    the door closes it idle first."""
    import grpc

    from danube_zmq.transport.danube_proto import DanubeAdmin_pb2 as pb
    from danube_zmq.transport.danube_proto import DanubeAdmin_pb2_grpc as pb_grpc
    from tests.integration.conftest import free_port

    port = free_port()
    broker = start_broker(tmp_path, "--grpc-admin-listen", f"http://127.0.0.1:{port}",
                          env={"DANUBE_LIMITS__CONNECT_TIMEOUT_MS": "1000"})
    try:
        # The broker answers on its admin port a moment before its own registration is
        # committed (on a loaded machine, an empty list): asked again until it is there.
        deadline = time.monotonic() + 30
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            while not (listed := pb_grpc.BrokerAdminStub(channel).ListBrokers(pb.Empty(), timeout=30)).brokers:
                assert time.monotonic() < deadline, "the broker never listed itself"
                time.sleep(0.2)
        assert len(listed.brokers) == 1
        time.sleep(4.0)  # four of the admin port's connect timeouts
        assert CUT not in broker.log(), broker.log()
    finally:
        assert broker.stop() == 0, broker.log()

"""`danube admin` and `AdminClient` against a scripted fake broker (a zmq ROUTER in a thread).

The fake answers `Connect` like a broker and every other request from a
script the test gives it, and records what it received. This proves the wire
conversation, the output formats and the error path without a real broker.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable, Iterator

import pytest
import zmq
from click.testing import CliRunner, Result

from danube_zmq.cli.main import cli
from danube_zmq.client.admin import AdminClient
from danube_zmq.transport import admin_protocol as ap
from danube_zmq.transport.client_protocol import DispatchStrategy, SubType
from danube_zmq.transport.codec import Message
from danube_zmq.transport.common import PROTOCOL_VERSION, Connect, Connected, Error, Ok
from danube_zmq.transport.errors import AlreadyExists, ErrorCode

Script = Callable[[Message], list[Message]]


class FakeBroker:
    """A ROUTER on a random port that answers each request with `script(request)`."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.received: list[Message] = []
        self._context = zmq.Context()
        self._socket = self._context.socket(zmq.ROUTER)
        self._socket.setsockopt(zmq.LINGER, 0)
        port = self._socket.bind_to_random_port("tcp://127.0.0.1")
        self.endpoint = f"tcp://127.0.0.1:{port}"
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stopping.is_set():
            if not self._socket.poll(20):
                continue
            identity, frame = self._socket.recv_multipart()
            request = ap.ADMIN_PROTOCOL.decode(frame)
            self.received.append(request)
            if isinstance(request, Connect):
                replies: list[Message] = [
                    Connected(
                        request_id=request.request_id,
                        protocol_version=PROTOCOL_VERSION,
                        broker_id=7,
                        broker_url="tcp://127.0.0.1:6650",
                        frame_bytes_max=1 << 20,
                        message_bytes_max=1 << 20,
                        heartbeat_interval_ms=1000,
                        session_timeout_ms=5000,
                    )
                ]
            else:
                replies = self.script(request)
            for reply in replies:
                self._socket.send_multipart([identity, ap.ADMIN_PROTOCOL.encode(reply)])

    def close(self) -> None:
        self._stopping.set()
        self._thread.join(timeout=5)
        self._socket.close()
        self._context.term()


@pytest.fixture
def fake_broker() -> Iterator[Callable[[Script], FakeBroker]]:
    started: list[FakeBroker] = []

    def start(script: Script) -> FakeBroker:
        broker = FakeBroker(script)
        started.append(broker)
        return broker

    yield start
    for broker in started:
        broker.close()


def admin(broker: FakeBroker, *args: str) -> Result:
    return CliRunner().invoke(
        cli, ["admin", "--endpoint", broker.endpoint, "--timeout-ms", "2000", *args], prog_name="danube"
    )


DESCRIPTION = ap.TopicDescription(
    request_id=0,
    name="/default/orders",
    dispatch_strategy=DispatchStrategy.RELIABLE,
    broker_id=7,
    partitions=[
        ap.PartitionInfo(
            name=f"/default/orders-part-{i}",
            next_offset=10 * i,
            producers=["p1"],
            messages_in=10 * i,
            bytes_in=100 * i,
            dropped_messages=0,
            broker_id=7 + i,
            broker_url=f"tcp://10.0.0.{7 + i}:6650",
            subscriptions=[
                ap.SubscriptionInfo(
                    name="audit",
                    topic=f"/default/orders-part-{i}",
                    sub_type=SubType.KEY_SHARED,
                    consumers=["c1", "c2"],
                    active_consumer=None,
                    pending_messages=i,
                    delivered_messages=5,
                    dropped_messages=0,
                )
            ],
        )
        for i in range(2)
    ],
)


def answer(request: Message) -> list[Message]:
    """The fake's script for a healthy broker with one namespace and one topic."""
    rid = request.request_id  # type: ignore[attr-defined]
    match request:
        case ap.ListNamespaces():
            return [ap.NamespaceList(request_id=rid, namespaces=["default", "orders"])]
        case ap.CreateNamespace(namespace="default"):
            return [Error(request_id=rid, code=ErrorCode.ALREADY_EXISTS, message="namespace 'default' already exists")]
        case ap.ListTopics():
            return [
                ap.TopicList(
                    request_id=rid,
                    topics=[
                        ap.TopicInfo(name="/default/orders", dispatch_strategy=1, partitions=2, broker_id=7, owners=[
                            ap.PartitionOwner(name="/default/orders-part-0", broker_id=7,
                                              broker_url="tcp://10.0.0.7:6650"),
                            ap.PartitionOwner(name="/default/orders-part-1", broker_id=None, broker_url=None),
                        ]),
                        ap.TopicInfo(name="/default/audit", dispatch_strategy=0, partitions=0, broker_id=8, owners=[
                            ap.PartitionOwner(name="/default/audit", broker_id=8, broker_url="tcp://10.0.0.8:6650"),
                        ]),
                    ],
                )
            ]
        case ap.DescribeTopic():
            return [ap.TopicDescription(**{**_fields(DESCRIPTION), "request_id": rid})]
        case ap.ListBrokers():
            return [
                ap.BrokerList(
                    request_id=rid,
                    brokers=[
                        ap.BrokerInfo(
                            broker_id=7,
                            broker_url="tcp://127.0.0.1:6650",
                            admin_url="tcp://127.0.0.1:50051",
                            metrics_url=None,
                            role="leader",
                            status="active",
                        )
                    ],
                )
            ]
        case _:
            return [Ok(request_id=rid)]


def _fields(message: Message) -> dict[str, object]:
    return {name: getattr(message, name) for name in message._fields}


def test_namespaces_list_json_is_the_brokers_list(fake_broker: Callable[[Script], FakeBroker]) -> None:
    """`--output json` prints exactly one JSON document, the names the broker sent."""
    broker = fake_broker(answer)
    result = admin(broker, "namespaces", "list", "--output", "json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == ["default", "orders"]
    assert isinstance(broker.received[0], Connect)
    assert broker.received[0].protocol_version == PROTOCOL_VERSION


def test_server_error_is_one_line_with_the_brokers_message(fake_broker: Callable[[Script], FakeBroker]) -> None:
    """An `Error` reply becomes `error: <the broker's message>` and exit 1."""
    broker = fake_broker(answer)
    result = admin(broker, "namespaces", "create", "default")
    assert result.exit_code == 1
    assert result.stderr == "error: namespace 'default' already exists\n"
    assert result.stdout == ""


def test_topics_create_sends_partitions_and_dispatch_strategy(fake_broker: Callable[[Script], FakeBroker]) -> None:
    """The flags reach the wire as CreateTopic fields; the CLI confirms in one line."""
    broker = fake_broker(answer)
    result = admin(
        broker, "topics", "create", "/default/events", "--partitions", "3", "--dispatch-strategy", "reliable"
    )
    assert result.exit_code == 0, result.output
    assert result.stdout == "created topic /default/events with 3 partitions (reliable)\n"
    (request,) = [m for m in broker.received if isinstance(m, ap.CreateTopic)]
    assert (request.topic, request.partitions, request.dispatch_strategy) == ("/default/events", 3, 1)


def test_unsubscribe_sends_topic_and_subscription(fake_broker: Callable[[Script], FakeBroker]) -> None:
    """`topics unsubscribe TOPIC -s SUB` is one Unsubscribe request."""
    broker = fake_broker(answer)
    result = admin(broker, "topics", "unsubscribe", "/default/orders", "-s", "audit")
    assert result.exit_code == 0, result.output
    (request,) = [m for m in broker.received if isinstance(m, ap.Unsubscribe)]
    assert (request.topic, request.subscription) == ("/default/orders", "audit")


def test_topics_list_accepts_slash_namespace_and_shows_a_table(fake_broker: Callable[[Script], FakeBroker]) -> None:
    """`topics list /default` asks for namespace `default`; the table shows the topic."""
    broker = fake_broker(answer)
    result = admin(broker, "topics", "list", "/default")
    assert result.exit_code == 0, result.output
    (request,) = [m for m in broker.received if isinstance(m, ap.ListTopics)]
    assert request.namespace == "default"
    assert "/default/orders" in result.stdout and "reliable" in result.stdout


def test_topics_list_shows_each_partitions_broker_or_unassigned(fake_broker: Callable[[Script], FakeBroker]) -> None:
    """The table has a row per partition with its broker id and URL ("unassigned" for one
    without a broker); the JSON has each partition's owner, null ids when unassigned."""
    broker = fake_broker(answer)
    result = admin(broker, "topics", "list", "default")
    assert result.exit_code == 0, result.output
    rows = [line.split() for line in result.stdout.splitlines()]
    assert ["/default/orders", "2", "reliable"] in rows
    assert ["/default/orders-part-0", "-", "reliable", "7", "tcp://10.0.0.7:6650"] in rows
    assert ["/default/orders-part-1", "-", "reliable", "unassigned", "-"] in rows
    assert ["/default/audit", "-", "non_reliable", "8", "tcp://10.0.0.8:6650"] in rows
    listed = json.loads(admin(broker, "topics", "list", "default", "-o", "json").stdout)
    assert listed[0]["owners"] == [
        {"name": "/default/orders-part-0", "broker_id": 7, "broker_url": "tcp://10.0.0.7:6650"},
        {"name": "/default/orders-part-1", "broker_id": None, "broker_url": None},
    ]


def test_describe_shows_each_partitions_broker(fake_broker: Callable[[Script], FakeBroker]) -> None:
    """Describe names the broker of every partition, in the partitions table and in JSON."""
    broker = fake_broker(answer)
    result = admin(broker, "topics", "describe", "/default/orders")
    assert result.exit_code == 0, result.output
    rows = [line.split() for line in result.stdout.splitlines()]
    assert ["/default/orders-part-1", "8", "tcp://10.0.0.8:6650"] == next(
        row[:3] for row in rows if row[:1] == ["/default/orders-part-1"])
    described = json.loads(admin(broker, "topics", "describe", "/default/orders", "-o", "json").stdout)
    assert [(p["broker_id"], p["broker_url"]) for p in described["partitions"]] == [
        (7, "tcp://10.0.0.7:6650"), (8, "tcp://10.0.0.8:6650")]


def test_describe_marks_a_partition_no_broker_serves(fake_broker: Callable[[Script], FakeBroker]) -> None:
    """A partition without a broker shows "unassigned" and the broker's reason; in JSON
    its broker is null and `not_served` says why."""
    part = DESCRIPTION.partitions[1]
    unserved = ap.PartitionInfo(**{**_fields(part), "broker_id": None, "broker_url": None, "subscriptions": [],
                                   "not_served": "topic /default/orders-part-1 has no broker right now; retry"})

    def script(request: Message) -> list[Message]:
        if isinstance(request, ap.DescribeTopic):
            return [ap.TopicDescription(**{**_fields(DESCRIPTION), "request_id": request.request_id,
                                           "partitions": [DESCRIPTION.partitions[0], unserved]})]
        return answer(request)

    broker = fake_broker(script)
    result = admin(broker, "topics", "describe", "/default/orders")
    assert result.exit_code == 0, result.output
    rows = [line.split() for line in result.stdout.splitlines()]
    assert next(row[:3] for row in rows if row[:1] == ["/default/orders-part-1"]) == [
        "/default/orders-part-1", "unassigned", "-"]
    assert "NOT SERVED: partition /default/orders-part-1: topic /default/orders-part-1 has no broker right now;" \
        " retry" in result.stdout
    described = json.loads(admin(broker, "topics", "describe", "/default/orders", "-o", "json").stdout)
    assert described["partitions"][1]["broker_id"] is None
    assert described["partitions"][1]["not_served"].endswith("no broker right now; retry")


def test_describe_json_names_enums_and_drops_request_ids(fake_broker: Callable[[Script], FakeBroker]) -> None:
    """Describe as JSON: partitions with counters, subscriptions with their type by name."""
    broker = fake_broker(answer)
    result = admin(broker, "topics", "describe", "/default/orders", "-o", "json")
    assert result.exit_code == 0, result.output
    described = json.loads(result.stdout)
    assert "request_id" not in described
    assert described["dispatch_strategy"] == "reliable"
    assert [p["messages_in"] for p in described["partitions"]] == [0, 10]
    assert described["partitions"][1]["subscriptions"][0]["sub_type"] == "key_shared"


def test_describe_table_shows_partitions_and_subscriptions(fake_broker: Callable[[Script], FakeBroker]) -> None:
    """Describe as tables: one row per partition and per (partition, subscription)."""
    broker = fake_broker(answer)
    result = admin(broker, "topics", "describe", "/default/orders")
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert out.startswith("topic /default/orders  dispatch reliable  broker 7  partitions 2\n")
    assert out.count("/default/orders-part-1") == 2  # a partition row and a subscription row
    assert "key_shared" in out and "c1,c2" in out


def test_brokers_list_table(fake_broker: Callable[[Script], FakeBroker]) -> None:
    """Brokers list shows id, endpoints, role and status; a missing metrics URL shows as '-'."""
    broker = fake_broker(answer)
    result = admin(broker, "brokers", "list")
    assert result.exit_code == 0, result.output
    assert "tcp://127.0.0.1:50051" in result.stdout and "leader" in result.stdout


def test_admin_client_skips_a_stale_reply(fake_broker: Callable[[Script], FakeBroker]) -> None:
    """A reply carrying another request's id (one that timed out earlier) is dropped."""

    def stale_then_real(request: Message) -> list[Message]:
        rid = request.request_id  # type: ignore[attr-defined]
        return [
            ap.NamespaceList(request_id=rid - 1, namespaces=["stale"]),
            ap.NamespaceList(request_id=rid, namespaces=["fresh"]),
        ]

    broker = fake_broker(stale_then_real)

    async def scenario() -> list[str]:
        async with AdminClient(broker.endpoint, timeout_ms=2000) as client:
            assert client.connected is not None and client.connected.broker_id == 7
            return await client.list_namespaces()

    assert asyncio.run(scenario()) == ["fresh"]


def test_admin_client_raises_the_error_class_of_the_code(fake_broker: Callable[[Script], FakeBroker]) -> None:
    """An Error reply is raised as the DanubeError subclass of its code, with its message."""
    broker = fake_broker(answer)

    async def scenario() -> None:
        async with AdminClient(broker.endpoint, timeout_ms=2000) as client:
            await client.create_namespace("default")

    with pytest.raises(AlreadyExists, match="namespace 'default' already exists"):
        asyncio.run(scenario())

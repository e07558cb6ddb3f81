"""The gRPC doors under a connection flood (issue 37, item 2), and their message size.

The attack: many plain TCP connections to a door, nothing sent, no TLS, no token. Each
door holds at most `broker.grpc_connections_max` / `grpc_admin_connections_max` of them
(grpc closes one more at once), closes one that has not sent its HTTP/2 settings within
`grpc_handshake_timeout_ms` and one with no call within `grpc_idle_timeout_ms`: the
broker's descriptors stay bounded, its native client and admin ports keep answering,
and the door serves Danube's client again once the flood is gone.

A real broker process with both doors, its caps lowered so that a few hundred
connections are a flood.
"""

from __future__ import annotations

import asyncio
import selectors
import socket
import time
from collections.abc import Iterator

import grpc
import psutil
import pytest

from danube_zmq.client import DanubeClient as NativeClient
from danube_zmq.client.admin import AdminClient
from danube_zmq.transport.danube_proto import DanubeAdmin_pb2 as admin_pb
from danube_zmq.transport.danube_proto import DanubeAdmin_pb2_grpc as admin_pb_grpc
from tests.integration.conftest import BrokerProcess, free_port, start_broker

danube = pytest.importorskip("danube", reason="danube-client (the test extra) is not installed")

CAP, ADMIN_CAP = 50, 20
HANDSHAKE_MS, IDLE_MS = 1_500, 2_000
FLOOD, ADMIN_FLOOD = 300, 100
# Descriptors a broker may open besides the doors' connections while the test runs (the
# native clients' sessions, a WAL segment, grpc's own): far below the flood sizes.
SLACK_FDS = 40
MIB = 1024 * 1024
MESSAGE_MAX = 10 * MIB  # policies.max_message_size's default: the native limit
# An HTTP/2 client's first bytes: the connection preface and an empty SETTINGS frame.
H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"


@pytest.fixture(scope="module")
def doors(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[BrokerProcess, str, str]]:
    grpc_url, admin_url = f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}"
    env = {"DANUBE_BROKER__GRPC_CONNECTIONS_MAX": str(CAP), "DANUBE_BROKER__GRPC_ADMIN_CONNECTIONS_MAX": str(ADMIN_CAP),
           "DANUBE_BROKER__GRPC_HANDSHAKE_TIMEOUT_MS": str(HANDSHAKE_MS),
           "DANUBE_BROKER__GRPC_IDLE_TIMEOUT_MS": str(IDLE_MS)}
    process = start_broker(tmp_path_factory.mktemp("flood"), "--grpc-listen", grpc_url,
                           "--grpc-admin-listen", admin_url, env=env)
    yield process, grpc_url, admin_url
    code = process.stop()
    assert code == 0, f"broker did not stop cleanly (exit {code}):\n{process.log()}"


def _connect(url: str, count: int) -> list[socket.socket]:
    host, _, port = url.removeprefix("http://").rpartition(":")
    return [socket.create_connection((host, int(port)), timeout=5) for _ in range(count)]


def _wait_closed(socks: list[socket.socket], timeout_s: float) -> tuple[int, float]:
    """Read each socket (the server's SETTINGS and GOAWAY) until the broker closes it:
    (how many it closed, seconds until the last one)."""
    start = time.monotonic()
    selector = selectors.DefaultSelector()
    for sock in socks:
        sock.setblocking(False)
        selector.register(sock, selectors.EVENT_READ)
    closed, last = 0, 0.0
    try:
        while closed < len(socks) and time.monotonic() - start < timeout_s:
            for key, _ in selector.select(0.2):
                try:
                    data = key.fileobj.recv(65536)  # type: ignore[union-attr]
                except OSError:
                    data = b""  # reset: closed just as well
                if not data:
                    selector.unregister(key.fileobj)
                    closed, last = closed + 1, time.monotonic() - start
    finally:
        selector.close()
    return closed, last


async def _native_round_trip(broker: BrokerProcess, topic: str) -> None:
    """The native client port produces and consumes, the admin port answers."""
    async with asyncio.timeout(20), NativeClient(broker.url) as ours:
        producer = await ours.create_producer(topic, name="p")
        consumer = await ours.subscribe(topic, "s", sub_type="exclusive")
        await producer.send(b"still here")
        assert (await consumer.receive()).payload == b"still here"
    async with asyncio.timeout(20), AdminClient(broker.admin_url) as admin:
        assert "default" in await admin.list_namespaces()


async def _door_calls(grpc_url: str, admin_url: str, topic: str) -> None:
    """Danube's client produces through the client door; the admin door answers."""
    async with asyncio.timeout(30):
        theirs = await danube.DanubeClientBuilder().service_url(grpc_url).build()
        producer = theirs.new_producer().with_topic(topic).with_name("danube-p").build()
        await producer.create()
        await producer.send(b"through the door", {})
        await producer.close()
        async with grpc.aio.insecure_channel(admin_url.removeprefix("http://")) as channel:
            listed = await admin_pb_grpc.BrokerAdminStub(channel).ListNamespaces(admin_pb.Empty())
            assert "default" in listed.namespaces


async def test_flood_of_silent_connections_is_capped_and_cut(doors: tuple[BrokerProcess, str, str]) -> None:
    """300 silent connections to the client door (cap 50) and 100 to the admin door (cap
    20): the broker holds at most the caps, the other ports answer meanwhile, every
    connection is closed within the handshake timeout, and the doors serve again."""
    broker, grpc_url, admin_url = doors
    process = psutil.Process(broker.process.pid)
    await _door_calls(grpc_url, admin_url, "/default/flood-before")  # grpc's own lazy descriptors opened
    baseline = process.num_fds()
    flood = await asyncio.to_thread(_connect, grpc_url, FLOOD)
    admin_flood = await asyncio.to_thread(_connect, admin_url, ADMIN_FLOOD)
    try:
        await asyncio.sleep(0.5)
        held = process.num_fds() - baseline
        assert held <= CAP + ADMIN_CAP + SLACK_FDS, f"the broker holds {held} more descriptors under the flood"
        await _native_round_trip(broker, "/default/flood-native")
        closed, last_s = await asyncio.to_thread(_wait_closed, flood + admin_flood, HANDSHAKE_MS / 1000 + 15)
        assert closed == FLOOD + ADMIN_FLOOD, f"only {closed} of {FLOOD + ADMIN_FLOOD} connections were closed"
        assert last_s < HANDSHAKE_MS / 1000 + 10
    finally:
        for sock in flood + admin_flood:
            sock.close()
    await _door_calls(grpc_url, admin_url, "/default/flood-after")
    await asyncio.sleep(0.5)
    assert process.num_fds() - baseline <= SLACK_FDS


async def test_connection_with_no_call_is_closed_after_the_idle_timeout(
        doors: tuple[BrokerProcess, str, str]) -> None:
    """A client that finishes the HTTP/2 handshake (so the handshake timeout is past) and
    never calls is closed after `grpc_idle_timeout_ms`, on either door."""
    _, grpc_url, admin_url = doors
    socks = _connect(grpc_url, 1) + _connect(admin_url, 1)
    try:
        for sock in socks:
            sock.sendall(H2_PREFACE)
        closed, last_s = await asyncio.to_thread(_wait_closed, socks, IDLE_MS / 1000 + 15)
        assert closed == 2
        assert last_s >= HANDSHAKE_MS / 1000, "closed by the handshake timeout, not for being idle"
    finally:
        for sock in socks:
            sock.close()


async def test_message_over_grpc_default_under_the_broker_limit(doors: tuple[BrokerProcess, str, str]) -> None:
    """grpc's default 4 MiB is not the door's limit: a 6 MiB message goes through the
    door (a native consumer reads it), and one over policies.max_message_size is
    refused with the broker's reason."""
    broker, grpc_url, _ = doors
    topic = "/default/flood-big"
    payload = bytes(range(256)) * (6 * MIB // 256)
    theirs = await danube.DanubeClientBuilder().service_url(grpc_url).build()
    producer = theirs.new_producer().with_topic(topic).with_name("big-p").build()
    await producer.create()
    async with NativeClient(broker.url) as ours:
        consumer = await ours.subscribe(topic, "big", sub_type="exclusive")
        async with asyncio.timeout(30):
            await producer.send(payload, {})
            assert (await consumer.receive()).payload == payload
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            async with asyncio.timeout(30):
                await producer.send(b"x" * (MESSAGE_MAX + 1), {})
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert f"over the broker's message_bytes_max {MESSAGE_MAX}" in (refused.value.details() or "")
        await producer.close()

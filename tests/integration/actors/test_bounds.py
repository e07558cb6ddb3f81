"""Every buffer is bounded in bytes (issue 19, section 4), driven with raw ZeroMQ
sockets and plain TCP against real broker processes.

The hostile clients here are built by hand (msgpack frames as docs/protocol.md
states them, or bare TCP), since the danube client never misbehaves this way.
"""

from __future__ import annotations

import asyncio
import os
import re
import socket
import struct
import time
import urllib.request
from pathlib import Path
from typing import Any

import msgpack
import psutil
import pytest
import zmq

from danube_zmq import DanubeClient
from danube_zmq.client.admin import AdminClient
from tests.integration.conftest import free_port

pytestmark = pytest.mark.slow

CONNECT, CONNECTED, PONG, SUBSCRIBE, SUBSCRIBED, FLOW = 1, 2, 4, 25, 26, 27
PROTOCOL_VERSION, EXCLUSIVE, LATEST = 1, 0, 0
MIB = 1 << 20


def pack(*items: Any) -> bytes:
    return msgpack.packb(list(items), use_bin_type=True)


def metric(metrics_port: int, name: str, /, **labels: str) -> float:
    """The value of one series scraped from the broker's metrics endpoint (0 if absent)."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).read().decode()
    selector = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    series = f"{name}{{{selector}}}" if labels else name
    match = re.search(rf"^{re.escape(series)} ([0-9.e+]+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


def wait_for(condition: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def stuck_consumer(ctx: zmq.Context, url: str, topic: str) -> zmq.Socket:
    """A consumer that subscribes, grants 2**30 permits and then never reads: its
    socket takes one message and a few KiB of kernel buffer, no more."""
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, 5000)
    sock.setsockopt(zmq.RCVHWM, 1)
    sock.setsockopt(zmq.RCVBUF, 4096)
    sock.setsockopt(zmq.ROUTING_ID, b"\x01" + os.urandom(15))
    sock.connect(url)
    sock.send(pack(CONNECT, 1, PROTOCOL_VERSION, "stuck"))
    assert msgpack.unpackb(sock.recv(), raw=False)[0] == CONNECTED
    sock.send(pack(SUBSCRIBE, 2, topic, "stuck", "stuck", EXCLUSIVE, LATEST))
    reply = msgpack.unpackb(sock.recv(), raw=False)
    assert reply[0] == SUBSCRIBED, reply
    consumer_id = reply[2]
    sock.send(pack(FLOW, consumer_id, 1 << 30))
    return sock


def test_consumer_that_never_reads_is_bounded_then_disconnected(tmp_path: Path, broker_factory: Any) -> None:
    """A consumer granting 2**30 permits that never reads its socket, fed 1 MiB batches
    (200 MiB in all): the broker's RSS grows by less than its outbound budget plus a
    fixed allowance (before the byte budget it grew by what was published), the
    consumer is paused and, after outbound_stall_timeout_ms, disconnected (its
    subscription has no consumer left), and another client is served throughout."""
    metrics_port = free_port()
    broker = broker_factory("--metrics-port", str(metrics_port), env={
        "DANUBE_LIMITS__OUTBOUND_BYTES_PER_CONNECTION_MAX": str(16 * MIB),
        "DANUBE_LIMITS__OUTBOUND_BYTES_MAX": str(32 * MIB),
        "DANUBE_LIMITS__OUTBOUND_STALL_TIMEOUT_MS": "4000",
        # The stuck consumer sends no pings: only the stall may end its session.
        "DANUBE_BROKER__SESSION_TIMEOUT_MS": "600000",
    })
    process = psutil.Process(broker.process.pid)
    ctx = zmq.Context()
    topic = "/default/stuck"

    async def run() -> float:
        async with DanubeClient(broker.url) as client:
            producer = await client.create_producer(topic)
            await producer.send(b"warm-up")
            sock = stuck_consumer(ctx, broker.url, topic)
            rss_before = process.memory_info().rss
            payload = b"x" * (256 * 1024)
            peak = rss_before
            for _ in range(200):
                for _ in range(4):
                    producer.send_nowait(payload)
                await producer.flush()
                peak = max(peak, process.memory_info().rss)
            # Another client is served while the stuck one holds its budget.
            other = await client.create_producer("/default/other")
            await asyncio.wait_for(other.send(b"still served"), 10)
            # Still connected (it answers ZMTP, holds its session by nothing but the
            # socket) and still not reading: disconnected after the stall timeout.
            async with AdminClient(broker.admin_url) as admin:
                deadline = time.monotonic() + 30
                while True:
                    info = await admin.describe_topic(topic)
                    if not info.partitions[0].subscriptions[0].consumers:
                        break
                    assert time.monotonic() < deadline, "the stalled consumer was never disconnected"
                    await asyncio.sleep(0.2)
            sock.close(linger=0)
            return (peak - rss_before) / MIB

    try:
        growth_mib = asyncio.run(run())
    finally:
        ctx.term()
    # 32 MiB broker budget + the subscription's pending bound (16 MiB) + allocator slack.
    assert growth_mib < 120, f"broker RSS grew by {growth_mib:.0f} MiB"
    assert "has not read its socket" in broker.log()
    assert metric(metrics_port, "danube_broker_consumers_paused_total") >= 1
    assert metric(metrics_port, "danube_broker_outbound_stalled_connections_total", port="client") >= 1


def test_connections_without_connect_are_counted_and_time_out(tmp_path: Path, broker_factory: Any) -> None:
    """ZeroMQ connections that finish the handshake but never send `Connect` are
    counted against connections_pending_max (one more is cut at once) and cut after
    connect_timeout_ms, and a real client is still served while they are held;
    before, they were kept forever and uncounted until the broker ran out of fds."""
    metrics_port = free_port()
    broker = broker_factory("--metrics-port", str(metrics_port), env={
        "DANUBE_LIMITS__CONNECTIONS_PENDING_MAX": "20",
        "DANUBE_LIMITS__CONNECT_TIMEOUT_MS": "3000",
    })
    ctx = zmq.Context()
    monitors = []
    socks = []
    try:
        for _ in range(30):
            sock = ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.RECONNECT_IVL, 60_000)  # a cut connection stays cut
            monitors.append(sock.get_monitor_socket(zmq.EVENT_DISCONNECTED))
            sock.connect(broker.url)
            socks.append(sock)

        def disconnected() -> int:
            return sum(1 for m in monitors if m.poll(0))

        # At most 20 may wait for Connect: at least 10 are cut at once...
        wait_for(lambda: disconnected() >= 10, 20, "connections over connections_pending_max to be cut")

        async def served() -> None:
            async with DanubeClient(broker.url) as client:
                producer = await client.create_producer("/default/served")
                await asyncio.wait_for(producer.send(b"x"), 10)

        asyncio.run(served())
        # ...and all of them after connect_timeout_ms.
        wait_for(lambda: all(m.poll(0) for m in monitors), 30, "every idle connection to be cut")
        evicted = metric(metrics_port, "danube_broker_idle_connections_cut_total", port="client", reason="evicted")
        expired = metric(metrics_port, "danube_broker_idle_connections_cut_total", port="client", reason="expired")
        assert evicted >= 10 and evicted + expired >= 30, (evicted, expired)
    finally:
        for sock in socks + monitors:
            sock.close(linger=0)
        ctx.term()


def zmtp_dealer(url: str) -> socket.socket:
    """A plain TCP socket that has done the ZMTP 3.0 NULL handshake as a DEALER (the
    greeting and READY written by hand; the broker's own are left unread)."""
    host, port = url.removeprefix("tcp://").rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=30)
    signature = b"\xff" + b"\x00" * 8 + b"\x7f"
    sock.sendall(signature + b"\x03\x00" + b"NULL".ljust(20, b"\x00") + b"\x00" + b"\x00" * 31)
    greeting = b""
    while len(greeting) < 64:  # the broker's greeting, before READY (libzmq may refuse it earlier)
        chunk = sock.recv(64 - len(greeting))
        assert chunk, "the broker closed the connection during the ZMTP greeting"
        greeting += chunk
    ready = b"\x05READY" + b"\x0bSocket-Type" + struct.pack(">I", 6) + b"DEALER"
    sock.sendall(b"\x04" + bytes([len(ready)]) + ready)
    return sock


def zmtp_frame(body: bytes, more: bool) -> bytes:
    flags = 0x01 if more else 0x00
    if len(body) < 256:
        return bytes([flags, len(body)]) + body
    return bytes([flags | 0x02]) + struct.pack(">Q", len(body)) + body


def flood_unfinished_message(sock: socket.socket, process: psutil.Process, bytes_max: int) -> tuple[bool, float]:
    """Send 1 MiB parts with the MORE flag, never a last one, until the broker cuts the
    connection or `bytes_max` are sent: (cut, peak RSS growth in MiB). Cut means the
    broker closed the connection: a send or receive fails, or reads end."""
    part = zmtp_frame(b"m" * MIB, more=True)
    rss_before = process.memory_info().rss
    peak, sent = rss_before, 0
    try:
        while sent < bytes_max:
            sock.sendall(part)
            sent += len(part)
            peak = max(peak, process.memory_info().rss)
    except OSError:  # reset, broken pipe, or a send blocked for 30 s
        pass
    peak = max(peak, process.memory_info().rss)
    sock.settimeout(30)
    try:
        while sock.recv(1 << 16):  # the broker's greeting, READY and replies; b"" once closed
            pass
        cut = True
    except TimeoutError:
        cut = False
    except OSError:
        cut = True
    return cut, (peak - rss_before) / MIB


@pytest.mark.parametrize("port", ["client", "admin"])
def test_multipart_message_that_never_ends_is_cut(tmp_path: Path, broker_factory: Any, port: str) -> None:
    """A peer that speaks ZMTP by hand to the client or admin port, sends `Connect`
    and then 1 MiB parts with the MORE flag that never end is disconnected once libzmq
    holds more than inbound_bytes_per_connection_max of it: the broker's RSS grows by
    that budget plus what arrives between two samples, not by what was sent (1 GiB
    before: libzmq holds a multipart message whole before the broker sees a part),
    and normal clients (and admin clients) are still served."""
    metrics_port = free_port()
    broker = broker_factory("--metrics-port", str(metrics_port), env={
        "DANUBE_LIMITS__INBOUND_BYTES_PER_CONNECTION_MAX": str(32 * MIB),
        # Neither the pending deadline nor silence may end it: only the inbound budget.
        "DANUBE_LIMITS__CONNECT_TIMEOUT_MS": "600000",
        "DANUBE_BROKER__SESSION_TIMEOUT_MS": "600000",
        "COLUMNS": "400", "DANUBE_LOG_LEVEL": "info",  # log lines unwrapped
    })
    process = psutil.Process(broker.process.pid)

    async def served() -> None:
        async with DanubeClient(broker.url) as client:
            producer = await client.create_producer("/default/served")
            await asyncio.wait_for(producer.send(b"x"), 10)
        async with AdminClient(broker.admin_url) as admin:
            assert "default" in await admin.list_namespaces()

    asyncio.run(served())
    sock = zmtp_dealer(broker.url if port == "client" else broker.admin_url)
    try:
        sock.sendall(zmtp_frame(pack(CONNECT, 1, PROTOCOL_VERSION, "raw"), more=False))
        cut, growth_mib = flood_unfinished_message(sock, process, 1024 * MIB)
    finally:
        sock.close()
    assert cut, "the connection sending an endless multipart message was never cut"
    # 32 MiB budget + up to one 125 ms sample of a loopback flood + allocator slack.
    assert growth_mib < 300, f"broker RSS grew by {growth_mib:.0f} MiB"
    wait_for(lambda: "over inbound_bytes_per_connection_max" in broker.log(), 10, "the cut to be logged")
    assert metric(metrics_port, "danube_broker_inbound_overrun_connections_total", port=port) == 1
    asyncio.run(served())


def test_idle_admin_connections_are_counted_and_time_out(tmp_path: Path, broker_factory: Any) -> None:
    """Admin connections with no request in flight are counted against
    connections_pending_max (one more cuts the oldest idle one) and cut after
    connect_timeout_ms idle, while an admin client that uses its connection is still
    served; before, the admin port kept every connection forever, uncounted."""
    broker = broker_factory(env={
        "DANUBE_LIMITS__CONNECTIONS_PENDING_MAX": "20",
        "DANUBE_LIMITS__CONNECT_TIMEOUT_MS": "3000",
    })
    ctx = zmq.Context()
    monitors = []
    socks = []
    try:
        for _ in range(30):
            sock = ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.RECONNECT_IVL, 60_000)  # a cut connection stays cut
            monitors.append(sock.get_monitor_socket(zmq.EVENT_DISCONNECTED))
            sock.connect(broker.admin_url)
            socks.append(sock)

        def disconnected() -> int:
            return sum(1 for m in monitors if m.poll(0))

        wait_for(lambda: disconnected() >= 10, 20, "idle admin connections over connections_pending_max to be cut")

        async def served() -> None:
            async with AdminClient(broker.admin_url) as admin:
                assert "default" in await admin.list_namespaces()

        asyncio.run(served())
        wait_for(lambda: all(m.poll(0) for m in monitors), 30, "every idle admin connection to be cut")
    finally:
        for sock in socks + monitors:
            sock.close(linger=0)
        ctx.term()


def test_admin_connection_that_does_not_read_its_answers_is_cut(tmp_path: Path, broker_factory: Any) -> None:
    """An admin connection that keeps sending requests (Pong, each answered with an
    INVALID_ARGUMENT error) and never reads the answers is held
    to the outbound byte budget (answers past it are dropped and counted) and cut after
    outbound_stall_timeout_ms; both show in the metrics, and an admin client is still
    served. Before, the admin port queued answers up to ZMQ_SNDHWM frames of any size.
    (It keeps sending until the cut: a fixed number of requests whose kept answers all
    fit in the kernel's socket buffers leaves nothing queued in the broker, and then
    there is nothing to stall on, which a faster broker reached.)"""
    metrics_port = free_port()
    broker = broker_factory("--metrics-port", str(metrics_port), env={
        "DANUBE_LIMITS__OUTBOUND_BYTES_PER_CONNECTION_MAX": str(256 * 1024),
        "DANUBE_LIMITS__OUTBOUND_FRAMES_MAX": "1000000",
        "DANUBE_LIMITS__OUTBOUND_STALL_TIMEOUT_MS": "2000",
        "DANUBE_LIMITS__CONNECT_TIMEOUT_MS": "600000",  # only the stall may cut it
        "COLUMNS": "400",  # log lines unwrapped
    })
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVHWM, 1)
    sock.setsockopt(zmq.RCVBUF, 4096)
    sock.setsockopt(zmq.SNDHWM, 0)
    sock.setsockopt(zmq.RECONNECT_IVL, 60_000)
    try:
        sock.connect(broker.admin_url)
        request_id = 0

        def cut_after_more_requests() -> bool:
            nonlocal request_id
            for _ in range(20_000):
                request_id += 1
                sock.send(pack(PONG, request_id))
            # The DEALER itself reads nothing, so it does not notice the cut: the broker says it.
            return metric(metrics_port, "danube_broker_outbound_stalled_connections_total", port="admin") >= 1

        wait_for(cut_after_more_requests, 60, "the admin connection that does not read to be cut")
        wait_for(lambda: "has not read its answers" in broker.log(), 10, "the cut to be logged")  # after the count
        assert metric(metrics_port, "danube_broker_outbound_frames_refused_total", port="admin") > 0

        async def served() -> None:
            async with AdminClient(broker.admin_url) as admin:
                assert "default" in await admin.list_namespaces()

        asyncio.run(served())
    finally:
        sock.close(linger=0)
        ctx.term()

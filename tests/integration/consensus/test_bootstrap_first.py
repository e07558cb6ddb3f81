"""A broker answers nothing about its bootstrap namespaces before it has written them:
a client (or admin) that connects the moment the process starts never sees the
`default` namespace missing."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import zmq

from danube_zmq.transport.admin_protocol import ADMIN_PROTOCOL, CreateTopic
from danube_zmq.transport.client_protocol import CLIENT_PROTOCOL, CreateProducer
from danube_zmq.transport.codec import Message, Protocol
from danube_zmq.transport.common import PROTOCOL_VERSION, Connect, Connected, Error
from danube_zmq.transport.errors import ErrorCode
from tests.integration.conftest import free_port
from tests.integration.consensus.test_metadata_cluster import Node

STARTS = 3
START_S_MAX = 60.0
POLL_MS = 20
CONNECT_WAIT_S = 1.0  # a Connect unanswered this long is sent again
REQUEST_WAIT_S = 10.0  # a request unanswered this long goes again on a new session


class _EagerClient:
    """A raw DEALER that sends `Connect` as soon as the TCP connection is up (the
    socket's IMMEDIATE: nothing queued before), then its one request on the session of
    the latest `Connect` (each `Connect` starts a new session, dropping what the last
    one had in flight), and keeps every answer to it."""

    def __init__(self, ctx: zmq.Context, url: str, protocol: Protocol, request: Message) -> None:
        self.sock = ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.IMMEDIATE, 1)
        self.sock.setsockopt(zmq.ROUTING_ID, b"\x01" + os.urandom(15))
        self.sock.connect(url)
        self.protocol = protocol
        self.request = request
        self.connected = False
        self.reply: Message | None = None  # the first answer to the request
        self.replies: list[Message] = []  # every answer, when `again` resends after an error
        self.again = False
        self.next_connect = 0.0
        self.connect_id = 100  # request ids of Connects: 101, 102, ...
        self.sent_at = 0.0

    def _send(self, message: Message) -> bool:
        try:
            self.sock.send(self.protocol.encode(message), zmq.NOBLOCK)
        except zmq.Again:  # no connection up yet
            return False
        return True

    def step(self) -> None:
        now = time.monotonic()
        if self.connected and self.sent_at and now - self.sent_at > REQUEST_WAIT_S:
            self.connected = False
        if not self.connected and now >= self.next_connect:
            if self._send(Connect(request_id=self.connect_id + 1, protocol_version=PROTOCOL_VERSION,
                                  client_name="eager")):
                self.connect_id += 1
                self.next_connect = now + CONNECT_WAIT_S
            else:
                self.next_connect = now + POLL_MS / 1000
        while self.sock.poll(0):
            message = self.protocol.decode(self.sock.recv())
            if isinstance(message, Connected):
                if message.request_id == self.connect_id and not self.connected:
                    self.connected = self._send(self.request)
                    self.sent_at = time.monotonic()
            elif getattr(message, "request_id", None) == 2:
                self.reply = self.reply or message
                self.replies.append(message)
                self.sent_at = 0.0
                if self.again and isinstance(message, Error):
                    self.connected = False  # a new session (the last may have timed out), then again
                    self.next_connect = 0.0


def test_requests_from_the_first_moment_never_find_the_default_namespace_missing(tmp_path: Path) -> None:
    """Start a standalone broker 3 times while a raw client and a raw admin connect in
    a tight loop from the moment the process starts: the first `CreateProducer` on
    /default/... and the first admin `CreateTopic` there are never NOT_FOUND
    (standalone, the bootstrap namespaces are written before any port is bound)."""
    ctx = zmq.Context.instance()
    answers: list[str] = []
    for start in range(STARTS):
        url, admin_url = f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"
        client = _EagerClient(ctx, url, CLIENT_PROTOCOL, CreateProducer(
            request_id=2, topic=f"/default/eager-{start}", producer_name="eager"))
        admin = _EagerClient(ctx, admin_url, ADMIN_PROTOCOL, CreateTopic(request_id=2, topic=f"/default/made-{start}"))
        log_path = tmp_path / f"broker-{start}.log"
        with open(log_path, "wb") as log_file:
            process = subprocess.Popen(
                [sys.executable, "-m", "danube_zmq.cli.main", "broker", "start", "--listen", url,
                 "--admin-listen", admin_url, "--metrics-port", "0", "--data-dir", str(tmp_path / f"data-{start}")],
                stdout=log_file, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + START_S_MAX
            while client.reply is None or admin.reply is None:
                assert process.poll() is None, f"broker exited:\n{log_path.read_text()}"
                assert time.monotonic() < deadline, f"no answers within {START_S_MAX} s:\n{log_path.read_text()}"
                client.step()
                admin.step()
                time.sleep(0.001)
        finally:
            process.kill()
            process.wait(10)
            client.sock.close(linger=0)
            admin.sock.close(linger=0)
        for who, reply in (("client", client.reply), ("admin", admin.reply)):
            if isinstance(reply, Error):
                assert reply.code != ErrorCode.NOT_FOUND, f"start {start}: {who} got {reply}"
            answers.append(f"{who}: {type(reply).__name__}")
    print(answers)


@pytest.mark.cluster
def test_a_cluster_broker_answers_unavailable_not_not_found_before_it_joins(tmp_path: Path) -> None:
    """Two-node cluster: node 1 starts alone (no leader) while a raw client and admin
    ask it, one request in flight, again after each error; node 2 starts, a leader is
    elected and a broker writes `default`. No answer in between is NOT_FOUND (the
    namespace is only not written yet: UNAVAILABLE, retriable), and the requests end
    acknowledged (or redirected to node 2, when the topic went there)."""
    ctx = zmq.Context.instance()
    nodes = [Node(tmp_path, 1), Node(tmp_path, 2)]
    client = _EagerClient(ctx, nodes[0].url, CLIENT_PROTOCOL, CreateProducer(
        request_id=2, topic="/default/eager", producer_name="eager"))
    admin = _EagerClient(ctx, nodes[0].admin_url, ADMIN_PROTOCOL, CreateTopic(request_id=2, topic="/default/made"))
    client.again = admin.again = True
    try:
        nodes[0].start(nodes)
        deadline = time.monotonic() + 3.0  # answers while there is no leader
        while time.monotonic() < deadline:
            client.step()
            admin.step()
            time.sleep(0.001)
        nodes[1].start(nodes)
        deadline = time.monotonic() + START_S_MAX
        while not (_done(client) and _done(admin)):
            assert time.monotonic() < deadline, f"not answered: {client.replies[-3:]} {admin.replies[-3:]}"
            client.step()
            admin.step()
            time.sleep(0.001)
    finally:
        client.sock.close(linger=0)
        admin.sock.close(linger=0)
        for node in nodes:
            if node.process is not None:
                node.kill()
    for who, replies in (("client", client.replies), ("admin", admin.replies)):
        codes = [reply.code for reply in replies if isinstance(reply, Error)]
        assert ErrorCode.NOT_FOUND not in codes, f"{who}: {[r for r in replies if isinstance(r, Error)]}"
    print(f"client: {len(client.replies)} answers, admin: {len(admin.replies)}")


def _done(client: _EagerClient) -> bool:
    """Answered for good: done, or redirected to the broker the topic was given to."""
    if not client.replies:
        return False
    last = client.replies[-1]
    return not isinstance(last, Error) or last.redirect_url is not None

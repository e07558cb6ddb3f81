"""Exhausted restarts take the broker down loudly (issue 19, section 7), in a real process;
a request for an actor not started yet is told so.

A broker process is started with a bug planted in its snapshot actor (listing snapshots
raises a plain exception, as a bug of ours would). Each failing request is still
answered (INTERNAL) and the actor restarted, within its budget of 5 restarts a minute;
the failure beyond it stops the process with exit code 70 and a CRITICAL line naming the
actor, for its supervisor to restart, instead of leaving a broker that answers
RESOURCE_EXHAUSTED for snapshots until someone restarts it by hand.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import zmq

from danube_zmq.cli.broker import EXIT_FATAL
from danube_zmq.transport import admin_protocol as ap
from danube_zmq.transport.admin_protocol import ADMIN_PROTOCOL
from danube_zmq.transport.common import Error
from danube_zmq.transport.errors import ErrorCode
from tests.integration.conftest import free_port, wait_ready

# The planted bug, then the ordinary `danube` entry point.
_BUGGY_BROKER = """
from danube_zmq.actors.broker.snapshot_actor import SnapshotActor

def _store(self):  # what `handle_ListSnapshots` reads first (handler tables are built per class)
    raise RuntimeError("planted bug in the snapshot actor")

SnapshotActor._store = _store
from danube_zmq.cli.main import main
main()
"""


# The snapshot actor, the last one spawned, takes 3 s to start.
_SLOW_START_BROKER = """
import asyncio
from danube_zmq.actors.broker.snapshot_actor import SnapshotActor

_start = SnapshotActor.on_start

async def on_start(self):
    await asyncio.sleep(3)
    await _start(self)

SnapshotActor.on_start = on_start
from danube_zmq.cli.main import main
main()
"""


def _start_planted(code: str, tmp_path: Path) -> tuple[subprocess.Popen[bytes], zmq.Socket, Path]:
    """The broker with `code` planted, once its admin port answers, and a socket to it."""
    admin_url = f"tcp://127.0.0.1:{free_port()}"
    log_path = tmp_path / "broker.log"
    with open(log_path, "wb") as log_file:
        process = subprocess.Popen(
            [sys.executable, "-c", code, "broker", "start", "--listen", f"tcp://127.0.0.1:{free_port()}",
             "--admin-listen", admin_url, "--metrics-port", "0", "--data-dir", str(tmp_path / "data")],
            stdout=log_file, stderr=subprocess.STDOUT)
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, 30_000)
    try:
        wait_ready(admin_url, process)
    except BaseException:
        sock.close(linger=0)
        process.kill()
        process.wait(10)
        raise
    sock.connect(admin_url)
    return process, sock, log_path


def _ask(sock: zmq.Socket, request: object) -> object:
    sock.send(ADMIN_PROTOCOL.encode(request))
    return ADMIN_PROTOCOL.decode(sock.recv())


def _ask_started(sock: zmq.Socket, request: object) -> object:
    """`_ask`, again while the broker is starting (its admin port answers before)."""
    deadline = time.monotonic() + 60
    while isinstance(reply := _ask(sock, request), Error) and reply.message == "broker starting; retry":
        assert time.monotonic() < deadline, reply
        time.sleep(0.1)
    return reply


def test_a_request_before_its_actor_started_is_told_the_broker_is_starting(tmp_path: Path) -> None:
    """The admin port answers from the moment it is bound; a request for an actor not
    spawned yet is UNAVAILABLE "broker starting; retry" (it was RESOURCE_EXHAUSTED,
    "queued to the limit", which sends an operator after the wrong cause), and is
    served once the actor is up."""
    process, sock, _ = _start_planted(_SLOW_START_BROKER, tmp_path)
    try:
        early = _ask(sock, ap.ListSnapshots(request_id=1))
        assert isinstance(early, Error) and early.code == ErrorCode.UNAVAILABLE, early
        assert early.message == "broker starting; retry"
        served = _ask_started(sock, ap.ListSnapshots(request_id=2))
        assert isinstance(served, ap.SnapshotList), served
    finally:
        sock.close(linger=0)
        process.kill()
        process.wait(10)


def test_an_actor_that_exhausts_its_restarts_stops_the_broker_with_exit_70(tmp_path: Path) -> None:
    """Five failures are answered INTERNAL and the broker keeps serving; the sixth within
    the minute ends the process with EXIT_FATAL and a CRITICAL log line naming the actor."""
    process, sock, log_path = _start_planted(_BUGGY_BROKER, tmp_path)
    try:
        for rid in range(1, 7):
            reply = _ask_started(sock, ap.ListSnapshots(request_id=rid))
            assert isinstance(reply, Error) and reply.code == ErrorCode.INTERNAL, reply
            assert "planted bug" in reply.message
            if rid < 6:
                assert isinstance(_ask_started(sock, ap.ListNamespaces(request_id=100 + rid)), ap.NamespaceList)
        code = process.wait(timeout=60)
    finally:
        sock.close(linger=0)
        if process.poll() is None:
            process.kill()
            process.wait(10)
    log = log_path.read_text(errors="replace")
    assert code == EXIT_FATAL, log[-3000:]
    flat = " ".join(log.split())
    assert "CRITICAL danube_zmq.actors: actor snapshots failed 6 times" in flat and "planted bug" in flat, log[-3000:]
    assert f"exiting with {EXIT_FATAL}" in flat


"""Exhausted restarts take the broker down loudly (issue 19, section 7), in a real process.

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


def test_an_actor_that_exhausts_its_restarts_stops_the_broker_with_exit_70(tmp_path: Path) -> None:
    """Five failures are answered INTERNAL and the broker keeps serving; the sixth within
    the minute ends the process with EXIT_FATAL and a CRITICAL log line naming the actor."""
    admin_url = f"tcp://127.0.0.1:{free_port()}"
    log_path = tmp_path / "broker.log"
    with open(log_path, "wb") as log_file:
        process = subprocess.Popen(
            [sys.executable, "-c", _BUGGY_BROKER, "broker", "start", "--listen", f"tcp://127.0.0.1:{free_port()}",
             "--admin-listen", admin_url, "--metrics-port", "0", "--data-dir", str(tmp_path / "data")],
            stdout=log_file, stderr=subprocess.STDOUT)
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, 30_000)
    try:
        wait_ready(admin_url, process)
        sock.connect(admin_url)
        for rid in range(1, 7):
            sock.send(ADMIN_PROTOCOL.encode(ap.ListSnapshots(request_id=rid)))
            reply = ADMIN_PROTOCOL.decode(sock.recv())
            assert isinstance(reply, Error) and reply.code == ErrorCode.INTERNAL, reply
            assert "planted bug" in reply.message
            if rid < 6:
                sock.send(ADMIN_PROTOCOL.encode(ap.ListNamespaces(request_id=100 + rid)))
                assert isinstance(ADMIN_PROTOCOL.decode(sock.recv()), ap.NamespaceList)
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


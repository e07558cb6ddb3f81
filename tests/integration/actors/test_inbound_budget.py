"""What libzmq holds of connections' input is held to the inbound budgets by the
inbound watcher process (`actors/sockets/inbound_watch.py`), against real broker processes fed
by hand-built ZMTP peers (plain TCP sockets) and by the danube client."""

from __future__ import annotations

import asyncio
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from danube_zmq import DanubeClient
from tests.integration.actors.test_bounds import (
    CONNECT,
    MIB,
    PROTOCOL_VERSION,
    flood_unfinished_message,
    metric,
    pack,
    wait_for,
    zmtp_dealer,
    zmtp_frame,
)
from tests.integration.conftest import free_port

pytestmark = pytest.mark.slow

# Parts of 1 MiB need frames of 1 MiB and a little more: frame_bytes_max must exceed
# policies.max_message_size by 1 MiB, and the inbound budgets must exceed the frame.
SMALL_FRAMES = {
    "DANUBE_POLICIES__MAX_MESSAGE_SIZE": str(MIB),
    "DANUBE_LIMITS__FRAME_BYTES_MAX": str(3 * MIB),
    # Neither the pending deadline nor silence may end a connection: only the budgets.
    "DANUBE_LIMITS__CONNECT_TIMEOUT_MS": "600000",
    "DANUBE_BROKER__SESSION_TIMEOUT_MS": "600000",
    "COLUMNS": "400", "DANUBE_LOG_LEVEL": "info",  # log lines unwrapped
}
HELD_AT_CUT = re.compile(r"holds (\d+) bytes the broker has not been handed")


def served(url: str) -> None:
    async def run() -> None:
        async with DanubeClient(url) as client:
            producer = await client.create_producer("/default/served")
            await asyncio.wait_for(producer.send(b"x"), 10)

    asyncio.run(run())


def connected_peer(url: str) -> socket.socket:
    """A hand-built ZMTP peer of the client port that has sent `Connect`."""
    sock = zmtp_dealer(url)
    sock.sendall(zmtp_frame(pack(CONNECT, 1, PROTOCOL_VERSION, "raw"), more=False))
    return sock


def hung_up(sock: socket.socket, timeout_s: float) -> bool:
    """Whether the broker closes `sock` within `timeout_s` (what it sends is read and dropped)."""
    sock.settimeout(timeout_s)
    try:
        while sock.recv(1 << 16):
            pass
        return True
    except TimeoutError:
        return False
    except OSError:
        return True


def test_endless_multipart_message_is_cut_close_to_its_budget(tmp_path: Path, broker_factory: Any) -> None:
    """A peer sending 1 MiB parts with the MORE flag that never end, nine times over
    (a new connection after each, flooding at once), is cut holding, in the median
    cut, at most its 4 MiB budget plus 24 MiB: what arrives at loopback rates (1-3
    GB/s) in a round of the watcher (5 ms, plus how late its process is woken);
    1-15 MiB over were seen in 60 cuts, and an outlier (a round late behind the GIL)
    does not move the median. A check on the event loop's 125 ms timer lets 125-375
    MiB more arrive at those rates (median 315 MiB over was seen) and cannot meet it;
    on a slower machine the flood is slower too, which only lowers what is held."""
    budget = 4 * MIB
    metrics_port = free_port()
    # Every cut's warning is read (what it held), so none is held back as a repeat.
    broker = broker_factory("--metrics-port", str(metrics_port), env={
        **SMALL_FRAMES, "DANUBE_LIMITS__INBOUND_BYTES_PER_CONNECTION_MAX": str(budget),
        "DANUBE_LOGGING__REPEAT_INTERVAL_MS": "0"})
    process = psutil.Process(broker.process.pid)
    served(broker.url)
    floods = 9
    for _ in range(floods):
        sock = connected_peer(broker.url)
        try:
            cut, _growth = flood_unfinished_message(sock, process, 1024 * MIB)
        finally:
            sock.close()
        assert cut, "the connection sending an endless multipart message was never cut"
    wait_for(lambda: len(HELD_AT_CUT.findall(broker.log())) >= floods, 30, "every cut to be logged")
    held = sorted(int(n) for n in HELD_AT_CUT.findall(broker.log()))
    assert held[len(held) // 2] < budget + 24 * MIB, f"held at the cuts, MiB: {[round(n / MIB, 1) for n in held]}"
    assert metric(metrics_port, "danube_broker_inbound_overrun_connections_total", port="client") == floods
    served(broker.url)


def test_connections_together_over_the_broker_budget_lose_the_largest(tmp_path: Path,
                                                                      broker_factory: Any) -> None:
    """Two peers each holding an unfinished message under the per-connection budget
    (16 MiB), 12 MiB and then 10 MiB, together over inbound_bytes_max (20 MiB): the one
    holding more is cut, the other stays connected and is answered when it ends its
    message, and other clients are served. Before, nothing bounded the sum."""
    metrics_port = free_port()
    broker = broker_factory("--metrics-port", str(metrics_port), env={
        **SMALL_FRAMES, "DANUBE_LIMITS__INBOUND_BYTES_PER_CONNECTION_MAX": str(16 * MIB),
        "DANUBE_LIMITS__INBOUND_BYTES_MAX": str(20 * MIB)})
    part = zmtp_frame(b"m" * MIB, more=True)
    larger = connected_peer(broker.url)
    smaller = connected_peer(broker.url)
    try:
        larger.sendall(part * 12)
        wait_for(lambda: metric(metrics_port, "danube_broker_inbound_held_bytes") >= 12 * MIB, 30,
                 "the first peer's 12 MiB to be held")
        smaller.sendall(part * 10)
        assert hung_up(larger, 30), "the larger holder was not cut"
        smaller.sendall(zmtp_frame(b"end", more=False))
        smaller.settimeout(30)
        answer = b""
        while b"malformed frame" not in answer:  # its message is read: each part answered
            chunk = smaller.recv(1 << 16)
            assert chunk, "the smaller holder was cut too"
            answer += chunk
    finally:
        larger.close()
        smaller.close()
    assert metric(metrics_port, "danube_broker_inbound_budget_connections_total", port="client") == 1
    assert metric(metrics_port, "danube_broker_inbound_overrun_connections_total", port="client") == 0
    served(broker.url)


def test_client_sending_big_messages_at_full_speed_is_not_cut(tmp_path: Path, broker_factory: Any) -> None:
    """A danube producer sending 512 KiB messages flat out (16 batches of up to 1 MiB
    in flight, 16 MiB) to a non-reliable and a reliable topic (192 MiB each), with
    a per-connection budget of 20 MiB: none of its bytes is mistaken for an unfinished
    message (every send is acknowledged, no connection is cut), while the watcher did
    see bytes held (its peak is not zero)."""
    metrics_port = free_port()
    broker = broker_factory("--metrics-port", str(metrics_port), env={
        **SMALL_FRAMES, "DANUBE_LIMITS__INBOUND_BYTES_PER_CONNECTION_MAX": str(20 * MIB)})
    payload = b"p" * (512 * 1024)

    async def run() -> None:
        async with DanubeClient(broker.url) as client:
            for dispatch in ("non_reliable", "reliable"):
                producer = await client.create_producer(f"/default/big-{dispatch}", dispatch=dispatch)
                deadline = time.monotonic() + 120
                for _ in range(12):  # 32 sends (16 MiB, all the window) at a time, 192 MiB
                    sends = [producer.send_nowait(payload) for _ in range(32)]
                    await asyncio.wait_for(producer.flush(), max(1.0, deadline - time.monotonic()))
                    for send in sends:
                        await send  # raises the send's error, if any

    asyncio.run(run())
    assert metric(metrics_port, "danube_broker_inbound_overrun_connections_total", port="client") == 0
    assert metric(metrics_port, "danube_broker_inbound_budget_connections_total", port="client") == 0
    assert metric(metrics_port, "danube_broker_inbound_held_bytes_peak") > 0



def watcher_of(broker_pid: int) -> psutil.Process:
    """The broker's inbound watcher process (its child running inbound_proc.py)."""
    children = [child for child in psutil.Process(broker_pid).children()
                if any(part.endswith("inbound_proc.py") for part in child.cmdline())]
    assert len(children) == 1, f"the broker's children: {[c.cmdline() for c in psutil.Process(broker_pid).children()]}"
    return children[0]


def gone(process: psutil.Process) -> bool:
    try:
        return process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_the_watcher_process_dies_with_its_broker(tmp_path: Path, broker_factory: Any) -> None:
    """The inbound watcher is a child process of the broker; killed with SIGKILL (no
    cleanup runs), the broker leaves no watcher behind: the kernel ends it
    (PR_SET_PDEATHSIG), and it also exits when its socketpair to the broker ends."""
    broker = broker_factory()
    served(broker.url)
    watcher = watcher_of(broker.process.pid)
    assert not gone(watcher)
    broker.stop(signal.SIGKILL)
    wait_for(lambda: gone(watcher), 30, "the watcher to end with its broker")


def test_a_broker_whose_watcher_dies_stops_loudly_for_its_supervisor(tmp_path: Path, broker_factory: Any) -> None:
    """Without its watcher nothing bounds what libzmq holds of a connection (and its
    monitor events pile up in libzmq), so a broker whose watcher dies is a failed
    broker: it logs CRITICAL and exits 70 (EXIT_FATAL) for its supervisor to start it
    again, instead of serving on unbounded."""
    broker = broker_factory()
    served(broker.url)
    watcher_of(broker.process.pid).kill()
    try:
        code = broker.process.wait(60)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"the broker kept running without its watcher:\n{broker.log()}") from None
    assert code == 70, broker.log()
    assert "inbound watcher" in broker.log()


def watcher_dirs(broker_pid: int, directory: str | None = None) -> list[Path]:
    return sorted(Path(directory or tempfile.gettempdir()).glob(f"danube-inbound-{broker_pid}-*"))


def test_a_broker_killed_with_9_leaves_its_watcher_directory_to_the_next_start(tmp_path: Path,
                                                                               broker_factory: Any) -> None:
    """`stop` removes the watcher's directory (the monitors' ipc endpoints); a broker
    killed with -9 cannot, and the next broker's start removes it. Both brokers keep
    their temporary files in a directory of this test's (TMPDIR): any other broker's
    start (another xdist worker's) sweeps the machine's temporary directory. Short, in
    /tmp: the monitors' ipc paths must fit a unix socket address (108 bytes)."""
    private = tempfile.mkdtemp(prefix="dz-")
    try:
        first = broker_factory(env={"TMPDIR": private})
        served(first.url)
        left = watcher_dirs(first.process.pid, private)
        assert len(left) == 1, left
        first.stop(signal.SIGKILL)
        wait_for(lambda: not psutil.pid_exists(first.process.pid), 30, "the broker to be gone")
        assert left[0].is_dir()
        second = broker_factory(env={"TMPDIR": private, "DANUBE_LOG_LEVEL": "info", "COLUMNS": "400"})
        served(second.url)
        assert not left[0].exists()
        assert len(watcher_dirs(second.process.pid, private)) == 1
    finally:
        shutil.rmtree(private, ignore_errors=True)
    assert left[0].name in second.log()  # named in the INFO line that removed it


def test_a_broker_runs_without_its_watcher_when_told_and_says_what_is_lost(tmp_path: Path,
                                                                        broker_factory: Any) -> None:
    """`limits.inbound_watcher: false`: for hosts that refuse pidfd_getfd (seccomp).
    No watcher process, no directory; the broker serves, and warns that nothing bounds
    what ZeroMQ holds of a connection's input."""
    broker = broker_factory(env={"DANUBE_LIMITS__INBOUND_WATCHER": "false"})
    served(broker.url)
    assert not [child for child in psutil.Process(broker.process.pid).children()
                if any(part.endswith("inbound_proc.py") for part in child.cmdline())]
    assert watcher_dirs(broker.process.pid) == []
    assert "limits.inbound_watcher is off: nothing bounds what ZeroMQ holds of a connection's input" in broker.log()

"""The inbound watcher, broker side: holds what libzmq buffers of the broker's
connections' input (client and admin ports) to byte budgets, through a process of its
own (`actors/sockets/inbound_proc.py`, which says how).

libzmq reads a peer as fast as it can and holds a multipart message until its last
part (`actors/sockets/peers.py` says how what it holds is measured), so what a flooding peer
gains past its budget is its rate (~1 GB/s on loopback) times how late the check is.
Checked on the event loop's timer that was hundreds of MiB; in a thread of the broker
(woken by the kernel, every 5 ms) it was tens of MiB now and then, because the thread
needs the GIL: measured under load b on 2 cores shared with other work, its 5 ms sleeps
returned 12 ms late at p99 and 70 ms at worst (the GIL's holder descheduled), and a
peer gained up to ~135 MiB past a 64 MiB budget. The watcher process takes no GIL of
ours; what reaches it without the GIL too:

- the accepted connections: each listening socket's monitor (inproc) is forwarded to
  the watcher's ipc endpoint by a libzmq proxy (`zmq.proxy_steerable` runs in C
  without the GIL, in a thread of its own per listening socket); the watcher copies
  each accepted descriptor from this process (pidfd_getfd);
- what the broker was handed per descriptor (`hand`, on the loop for every frame):
  shared memory, one 8-byte slot per descriptor number;
- its counters, back (shared memory; `statistics()` and the gauges read them).

What the watcher sends back (the monitor events, and the cuts, both on the loop's turn:
it cut the connection already) comes over a socketpair the loop reads (`_read_reports`,
bounded batches). Its messages are `inbound_proc.encode`'s.

    loop thread                 proxy threads (no GIL)          watcher process
      PeerGuard: attach  --->   inproc monitor -> ipc  ----->   accepted: pidfd_getfd, epoll
      hand: handed[fd] += n  ----------- shared memory ------>  held = received - unread - handed
      _read_reports  <------------------ socketpair ---------   events; cuts (shut down already)
"""

from __future__ import annotations

import asyncio
import ctypes
import itertools
import logging
import mmap
import os
import re
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psutil
import zmq

from danube_zmq.actors.metrics import METRICS
from danube_zmq.actors.sockets import inbound_proc
from danube_zmq.actors.sockets.inbound_proc import (
    CUT,
    EVENTS,
    FAILED,
    READY,
    STAT_BROKER_CUTS,
    STAT_CONNECTION_CUTS,
    STAT_CONNECTIONS,
    STAT_HELD,
    STAT_HELD_AT_CUT_MAX,
    STAT_HELD_PEAK,
    STAT_ROUNDS,
    STAT_SLOTS,
    address_of,
    choose_cuts,
    decode,
    encode,
)
from danube_zmq.actors.sockets.peers import INBOUND_SLACK_BYTES, Address

__all__ = ["InboundStatistics", "InboundWatch", "MonitorEvent", "choose_cuts", "remove_stale_dirs"]

log = logging.getLogger("danube_zmq.inbound")

ROUND_MS = inbound_proc.ROUND_MS
# Reports taken per loop turn (the rest wait in the socketpair for the next turn).
REPORTS_PER_TURN_MAX = 64
START_TIMEOUT_S = 30.0

# (fd, address, port name, bytes held, "connection" or "broker") -> None, on the loop.
CutNotice = Callable[[int, "Address | None", str, int, str], None]
# (event, fd, peer address) of a socket monitor, as the watcher read them.
MonitorEvent = tuple[int, int, "Address | None"]


@dataclass(frozen=True, slots=True)
class InboundStatistics:
    connections: int
    held_bytes: int
    held_bytes_peak: int
    held_bytes_at_cut_max: int
    connection_cuts: int
    broker_cuts: int
    rounds: int


@dataclass(slots=True)
class _Port:
    name: str
    on_events: Callable[[list[MonitorEvent]], None] | None
    on_cut: CutNotice
    proxy: _Proxy | None = None


_PR_SET_PTRACER = 0x59616D61
_DIR_PREFIX = "danube-inbound-"
_DIR_NAME = re.compile(rf"{_DIR_PREFIX}(\d{{1,10}})-\w+")  # pids: at most 2**22


def remove_stale_dirs(directory: str) -> list[str]:
    """Remove the watcher directories in `directory` left by brokers of this user that
    are gone (killed with -9: `stop` never ran); returns their names. A directory
    names its broker's pid, so one whose broker still runs is kept."""
    removed = []
    uid = os.getuid()
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return removed
    for entry in entries:
        match = _DIR_NAME.fullmatch(entry.name)
        if match is None or not entry.is_dir(follow_symlinks=False):
            continue
        try:
            if entry.stat(follow_symlinks=False).st_uid != uid or psutil.pid_exists(int(match.group(1))):
                continue
        except OSError:
            continue
        shutil.rmtree(entry.path, ignore_errors=True)
        removed.append(entry.name)
    if removed:
        log.info("removed %d inbound watcher directories of brokers that are gone: %s", len(removed),
                 ", ".join(removed))
    return removed


def _allow_ptracer(pid: int) -> None:
    """Let the watcher copy our descriptors under Yama `ptrace_scope` 1, which allows
    ptrace access (pidfd_getfd needs it) to descendants only, and the watcher is our
    child, not our ancestor. Without Yama the call fails and nothing is needed."""
    ctypes.CDLL(None).prctl(_PR_SET_PTRACER, ctypes.c_ulong(pid), 0, 0, 0)


class _Proxy:
    """Forwards a listening socket's monitor (inproc) to the watcher's ipc endpoint in a
    libzmq proxy, which holds no GIL: accepts reach the watcher whatever this
    interpreter does. While the watcher does not read, events wait in the proxy's
    queues (100,000 each way), then in the monitor's; past those libzmq's I/O thread
    would block on the next event (it sends monitor events blocking), which is why the
    watcher reads up to `inbound_proc.EVENTS_QUEUED_MAX` events ahead of the loop."""

    def __init__(self, ctx: zmq.Context[Any], monitor_endpoint: str, ipc_endpoint: str) -> None:
        self._control_endpoint = f"inproc://inbound-proxy-{id(self):x}"
        # Plain sockets on the same libzmq context (inproc reaches the monitor): the
        # owner's may be asyncio sockets, which must not be used off the loop's thread.
        ctx = zmq.Context.shadow(ctx.underlying)
        front = ctx.socket(zmq.PAIR)
        front.setsockopt(zmq.LINGER, 0)
        front.setsockopt(zmq.RCVHWM, 100_000)
        front.connect(monitor_endpoint)
        back = ctx.socket(zmq.PAIR)
        back.setsockopt(zmq.LINGER, 0)
        back.setsockopt(zmq.SNDHWM, 100_000)
        back.bind(ipc_endpoint)
        control = ctx.socket(zmq.PAIR)
        control.setsockopt(zmq.LINGER, 0)
        control.bind(self._control_endpoint)
        self._steer = ctx.socket(zmq.PAIR)
        self._steer.setsockopt(zmq.LINGER, 0)
        self._steer.connect(self._control_endpoint)
        self._thread = threading.Thread(target=self._run, args=(front, back, control), name="danube-inbound-proxy",
                                        daemon=True)
        self._thread.start()

    @staticmethod
    def _run(front: zmq.Socket[Any], back: zmq.Socket[Any], control: zmq.Socket[Any]) -> None:
        # An accept reaches the watcher through this thread: a flood that starts at the
        # accept is unwatched until it runs, so it runs ahead of normal threads when
        # allowed (as the watcher does, `inbound_proc.raise_priority`; this thread only).
        inbound_proc.raise_priority()
        try:
            zmq.proxy_steerable(front, back, None, control)
        except zmq.ContextTerminated:
            pass
        finally:
            for sock in (front, back, control):
                sock.close(linger=0)

    def stop(self) -> None:
        self._steer.send(b"TERMINATE")
        self._thread.join(5)
        self._steer.close(linger=0)


class InboundWatch:
    """The watcher process and the broker's handles on it; `start()` on the event loop
    that owns the gateways (the watcher dies with that thread), `stop()` after they
    stopped."""

    def __init__(self, *, connection_bytes_max: int, broker_bytes_max: int, round_ms: int = ROUND_MS,
                 on_exit: Callable[[str], None] | None = None) -> None:
        self.connection_bytes_max = connection_bytes_max
        # Called (on the loop) when the watcher exits before `stop()`: nothing bounds
        # inbound bytes any more, and libzmq's monitor events pile up behind the dead
        # proxies, so the owner ends the broker (BrokerService: fatal, exit 70).
        self.on_exit = on_exit
        self.broker_bytes_max = broker_bytes_max
        self.round_ms = round_ms
        # Descriptors are below RLIMIT_NOFILE (the broker never raises it), so one slot each.
        self._slots = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        self._memory: mmap.mmap | None = None
        self._stats: memoryview | None = None
        self.handed: memoryview | None = None  # written by the loop thread only (`hand`)
        self._control: socket.socket | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._dir: str | None = None
        self._ports: dict[int, _Port] = {}
        self._idents = itertools.count(1)
        self._final: InboundStatistics | None = None

    # ------------------------------------------------------------- lifecycle
    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        size = 8 * (STAT_SLOTS + self._slots)
        memory_fd = os.memfd_create("danube-inbound", os.MFD_CLOEXEC)
        try:
            os.ftruncate(memory_fd, size)
            self._memory = mmap.mmap(memory_fd, size)
            shared = memoryview(self._memory).cast("q")
            self._stats, self.handed = shared[:STAT_SLOTS], shared[STAT_SLOTS:]
            remove_stale_dirs(tempfile.gettempdir())
            # 0700: the monitors' ipc endpoints; named for this broker, so that the next
            # start removes it should this broker be killed before its `stop`.
            self._dir = tempfile.mkdtemp(prefix=f"{_DIR_PREFIX}{os.getpid()}-")
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            with theirs:
                self._process = subprocess.Popen(
                    [sys.executable, "-I", inbound_proc.__file__, str(os.getpid()), str(ours.fileno()),
                     str(theirs.fileno()),
                     str(memory_fd), str(self._slots), str(self.connection_bytes_max + INBOUND_SLACK_BYTES),
                     str(self.broker_bytes_max), str(self.round_ms)],
                    pass_fds=(theirs.fileno(), memory_fd), stdin=subprocess.DEVNULL)
            _allow_ptracer(self._process.pid)
        finally:
            os.close(memory_fd)
        self._control = ours
        # Blocking, once, at start: the watcher must be up before the first connection.
        ours.settimeout(START_TIMEOUT_S)
        try:
            data = ours.recv(65536)
        except TimeoutError:
            data = encode(FAILED, f"the inbound watcher did not start within {START_TIMEOUT_S:g} s")
        tag, fields = decode(data) if data else (FAILED, ["the inbound watcher exited at start"])
        if tag != READY:
            self.stop()
            raise RuntimeError(f"{fields[0]}: inbound bytes cannot be bounded, the broker does not start"
                               " (limits.inbound_watcher: false starts it without the watcher, and with no bound on"
                               " what ZeroMQ holds of a connection's input: docs/operations.md)")
        priority = fields[0]
        if priority == "normal":
            log.warning("the inbound watcher runs at normal priority (no CAP_SYS_NICE, RLIMIT_RTPRIO or"
                        " RLIMIT_NICE): on busy CPUs its checks may be late, and a flooding connection gains"
                        " its rate times that lateness past inbound_bytes_per_connection_max")
        else:
            log.info("inbound watcher started (pid %d, %s)", self._process.pid if self._process else 0, priority)
        ours.setblocking(False)
        self._loop.add_reader(ours.fileno(), self._read_reports)
        stats = self._stats
        METRICS.inbound_held_bytes.set_function(lambda: stats[STAT_HELD])
        METRICS.inbound_held_bytes_peak.set_function(lambda: stats[STAT_HELD_PEAK])
        METRICS.inbound_held_bytes_at_cut_max.set_function(lambda: stats[STAT_HELD_AT_CUT_MAX])

    def stop(self) -> None:
        for ident in list(self._ports):
            self.detach(ident)
        if self._control is not None:
            if self._loop is not None and not self._loop.is_closed():
                self._loop.remove_reader(self._control.fileno())
            self._control.close()  # the watcher sees the end and exits
            self._control = None
        if self._process is not None:
            try:
                self._process.wait(5)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait(5)
            self._process = None
        if self._stats is not None:
            final = self._final = self.statistics()
            METRICS.inbound_held_bytes.set_function(lambda: final.held_bytes)
            METRICS.inbound_held_bytes_peak.set_function(lambda: final.held_bytes_peak)
            METRICS.inbound_held_bytes_at_cut_max.set_function(lambda: final.held_bytes_at_cut_max)
            assert self.handed is not None and self._memory is not None
            self._stats.release()
            self.handed.release()
            self._stats = self.handed = None
            self._memory.close()
            self._memory = None
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    @property
    def pid(self) -> int | None:
        """The watcher process's id (None before start and after stop)."""
        return None if self._process is None else self._process.pid

    # ------------------------------------------------------------- owner side
    def attach(self, ctx: zmq.Context[Any], monitor_endpoint: str, port: str,
               on_events: Callable[[list[MonitorEvent]], None], on_cut: CutNotice, *,
               listen_port: int | None = None) -> int:
        """Have the watcher read the socket monitor bound at `monitor_endpoint` (inproc,
        in `ctx`) from now on: each accepted connection is watched as soon as the watcher
        reads its event, whatever the loop does. The events are passed on to `on_events`
        on the loop; `on_cut` is called there for a connection cut. `listen_port` (the
        socket's TCP port) tells its connections from another port's that reused a
        descriptor number. Returns the handle for `detach`."""
        assert self._dir is not None, "start() first"
        ident = next(self._idents)
        ipc_endpoint = f"ipc://{self._dir}/{ident}"
        self._ports[ident] = _Port(port, on_events, on_cut, _Proxy(ctx, monitor_endpoint, ipc_endpoint))
        self._send(encode(inbound_proc.ATTACH, ident, ipc_endpoint, listen_port))
        return ident

    def detach(self, ident: int) -> None:
        """Stop watching the connections of `attach`'s monitor `ident`. Disable the
        monitor first: libzmq sends monitor events blocking, so once nothing reads
        them its I/O thread would stop at the next event."""
        entry = self._ports.pop(ident, None)
        if entry is None:
            return
        if entry.proxy is not None:
            entry.proxy.stop()
        self._send(encode(inbound_proc.DETACH, ident))

    def watch(self, fd: int, address: Address | None, port: str, on_cut: CutNotice) -> None:
        """Hold the connection on `fd` to the budgets (one no monitor reports: tests);
        `on_cut` is called on the loop if it is cut."""
        ident = next(self._idents)
        self._ports[ident] = _Port(port, None, on_cut)
        self._send(encode(inbound_proc.WATCH, fd, address, ident))

    def hand(self, fd: int, size: int) -> None:
        """The owner was handed `size` bytes (ZMTP framing included) read from `fd`
        (-1 when a frame came on no TCP connection: inproc, ipc)."""
        handed = self.handed
        if handed is not None and 0 <= fd < len(handed):
            handed[fd] += size

    def statistics(self) -> InboundStatistics:
        stats = self._stats
        if stats is None:
            return self._final or InboundStatistics(0, 0, 0, 0, 0, 0, 0)
        return InboundStatistics(connections=stats[STAT_CONNECTIONS], held_bytes=stats[STAT_HELD],
                                 held_bytes_peak=stats[STAT_HELD_PEAK],
                                 held_bytes_at_cut_max=stats[STAT_HELD_AT_CUT_MAX],
                                 connection_cuts=stats[STAT_CONNECTION_CUTS], broker_cuts=stats[STAT_BROKER_CUTS],
                                 rounds=stats[STAT_ROUNDS])

    def _send(self, message: bytes) -> None:
        if self._control is None:
            return
        # Commands are rare (an attach, a detach): a full socketpair would mean a stuck
        # watcher, so wait for room rather than drop one.
        self._control.setblocking(True)
        try:
            self._control.sendall(message)
        except OSError:  # the watcher is gone: nothing to tell
            pass
        finally:
            self._control.setblocking(False)

    # ------------------------------------------------------------- on the loop
    def _read_reports(self) -> None:
        """Take a bounded batch of the watcher's reports: monitor events for their
        owners, cuts (already done) to count, log and tell."""
        control = self._control
        assert control is not None
        for _ in range(REPORTS_PER_TURN_MAX):
            try:
                data = control.recv(65536)
            except BlockingIOError:
                return
            if not data:
                log.error("the inbound watcher exited: inbound bytes are no longer bounded")
                assert self._loop is not None
                self._loop.remove_reader(control.fileno())
                if self.on_exit is not None:
                    self.on_exit("the inbound watcher exited: inbound bytes are no longer bounded")
                return
            tag, fields = decode(data)
            if tag == EVENTS:
                ident, events = fields
                entry = self._ports.get(ident)
                if entry is not None and entry.on_events is not None:
                    entry.on_events([(event, fd, address_of(address)) for event, fd, address in events])
            elif tag == CUT:
                fd, address, ident, held, budget = fields
                entry = self._ports.get(ident)
                if entry is not None:
                    self._cut(fd, address_of(address), entry, held, budget)

    def _cut(self, fd: int, address: Address | None, entry: _Port, held: int, budget: str) -> None:
        if budget == "connection":
            METRICS.inbound_overrun_cut.labels(entry.name).inc()
            log.warning("connection from %s to the %s port holds %d bytes the broker has not been handed (an"
                        " unfinished multipart message?), over inbound_bytes_per_connection_max (%d):"
                        " disconnected", address, entry.name, held, self.connection_bytes_max)
        else:
            METRICS.inbound_budget_cut.labels(entry.name).inc()
            log.warning("connection from %s to the %s port holds %d bytes the broker has not been handed, the"
                        " most of all connections, which together hold over inbound_bytes_max (%d):"
                        " disconnected", address, entry.name, held, self.broker_bytes_max)
        entry.on_cut(fd, address, entry.name, held, budget)

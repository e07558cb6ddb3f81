"""The inbound watcher process: holds what libzmq buffers of a broker's connections'
input to byte budgets, from outside the broker's interpreter.

Run by `InboundWatch` (`actors/sockets/inbound_watch.py`) as `python -I inbound_proc.py ...`,
a child of the broker: stdlib and pyzmq only (never the danube_zmq package, whose
import costs seconds and tens of MiB). It shares no GIL and no address space with the
broker, so a broker whose threads wait for the GIL, or are descheduled while one holds
it, does not delay it: on 2 busy cores the watcher thread it replaces was 12 ms late
at p99 and 70 ms at worst under load b, at ~1 GB/s per flooding connection.

    broker (loop thread)                             this process
      gateway ROUTER --inproc monitor--> proxy ----ipc----> monitor PAIR: accepted fd N:
        (a libzmq proxy thread, never takes the GIL)          pidfd_getfd(broker, N) -> copy
      handed[N] += bytes  ---------- shared memory ------->  epoll copy IN|OUT|ET; each round:
      stats <-------------------------- shared memory ----  held = received - unread - handed
      on_events / on_cut  <--------- socketpair ----------  shutdown(copy) over a budget

What the broker was handed from each descriptor is in shared memory it alone writes
(one 8-byte slot per descriptor number, never reset; stores and loads of aligned 8-byte
words are atomic on the machines we run on). A count read here may lag what the broker
was handed by the frames it just read: held bytes are overstated by those, which can
only bring a cut earlier by a few frames (a connection within its budget by less than
what the broker reads at once could be cut), never later. The kernel counts are read
before `handed`, as before. A descriptor number reused by a new connection keeps its
count; the count when the old one closed is its base (`ended`).

Each connection's descriptor is copied into this process (pidfd_getfd, so the broker
sends nothing per accept): the copy keeps the socket open, so it is closed as soon as
the monitor says libzmq closed its own (and after a cut), else a connection libzmq
closes would stay open for the peer. The broker's ends of the socketpair closing (the
broker stopped or died) and PR_SET_PDEATHSIG both end this process.

The messages on the socketpair are this module's (`encode`, `decode`): a tag byte and
a JSON array, each in one SOCK_SEQPACKET datagram.
"""

from __future__ import annotations

import array
import ctypes
import errno
import fcntl
import heapq
import json
import mmap
import os
import select
import signal
import socket
import struct
import sys
import termios
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

# broker -> watcher
ATTACH, DETACH, WATCH = 1, 2, 3
# watcher -> broker
READY, EVENTS, CUT, FAILED = 10, 11, 12, 13

# The shared memory: STAT_SLOTS counters this process writes, then one `handed` count
# per descriptor number that the broker writes.
(STAT_HELD, STAT_HELD_PEAK, STAT_HELD_AT_CUT_MAX, STAT_CONNECTION_CUTS, STAT_BROKER_CUTS, STAT_ROUNDS,
 STAT_CONNECTIONS) = range(7)
STAT_SLOTS = 8

ROUND_MS = 5
FDS_PER_ROUND_MAX = 512
# A connection with bytes left in the kernel is measured again (libzmq reads them with
# no new event), after one round while libzmq reads on, backing off to this while it
# does not (the broker pushes back on a peer whose messages it does not take).
RECHECK_S_MAX = 1.0
_EVENTS_MAX = 1024
MONITOR_EVENTS_MAX = 256
# Monitor events read and not yet taken by the broker (its loop may be seconds behind a
# connection flood): past this the monitors are not read (their proxies' queues and the
# monitors' high-water marks hold the rest, ~200,000 more; past those libzmq would
# block its I/O thread on the next event), so every connection up to it is watched
# whether or not the loop keeps up.
EVENTS_QUEUED_MAX = 65_536
# Every arrival of data wakes the socket's waiters, this epoll among them, but epoll
# reports an event only if the descriptor is still ready when it is collected, and
# libzmq may have read it all by then: with EPOLLIN alone a connection whose bytes
# libzmq drains at once (any that is not flooding) would go unseen. EPOLLOUT makes the
# descriptor ready whenever its send buffer has room (almost always), so each arrival
# is reported; edge-triggered, once per arrival (or per freed send buffer of a full one).
_EDGES = select.EPOLLIN | select.EPOLLOUT | select.EPOLLET

# struct tcp_info (linux/tcp.h): tcpi_bytes_received follows tcpi_bytes_acked at 120.
_TCPI_BYTES_RECEIVED = 128
_TCP_INFO_SIZE = 136
_SYS_PIDFD_OPEN, _SYS_PIDFD_GETFD = 434, 438
_PR_SET_PDEATHSIG = 1


def encode(tag: int, *fields: Any) -> bytes:
    return bytes([tag]) + json.dumps(fields, separators=(",", ":")).encode()


def decode(data: bytes) -> tuple[int, list[Any]]:
    return data[0], json.loads(data[1:])


def address_of(value: Any) -> Any:
    """A peer address as getpeername gives it (JSON turns tuples into lists)."""
    return tuple(value) if isinstance(value, list) else value


def choose_cuts(held: Mapping[int, int], budget: int) -> list[int]:
    """The connections to cut so that the bytes `held` over all of them are at most
    `budget`: the largest holders first (the fewest cuts that get under it), largest
    first; none if the sum is within it."""
    total = sum(held.values())
    cuts: list[int] = []
    for fd, size in sorted(held.items(), key=lambda item: item[1], reverse=True):
        if total <= budget:
            break
        cuts.append(fd)
        total -= size
    return cuts


class _Fds:
    """Copies of another process's descriptors (pidfd_getfd: same user, no ptrace
    restriction; Linux 5.6)."""

    def __init__(self, pid: int) -> None:
        self._libc = ctypes.CDLL(None, use_errno=True)
        self._libc.syscall.restype = ctypes.c_long
        self._pidfd = self._call(_SYS_PIDFD_OPEN, pid, 0)

    def _call(self, *args: int) -> int:
        result = self._libc.syscall(*(ctypes.c_long(a) for a in args))
        if result < 0:
            code = ctypes.get_errno()
            raise OSError(code, os.strerror(code))
        return int(result)

    def probe(self, fd: int) -> None:
        """Copy the broker's `fd` once and close the copy: raises if that is refused.
        Tried for a while: under Yama `ptrace_scope` 1 the broker allows it only once it
        has named us its ptracer (PR_SET_PTRACER), just after starting us."""
        for attempt in range(50):
            try:
                os.close(self._call(_SYS_PIDFD_GETFD, self._pidfd, fd, 0))
                return
            except OSError as exc:
                if exc.errno != errno.EPERM or attempt == 49:
                    raise
                time.sleep(0.05)

    def copy(self, fd: int) -> socket.socket | None:
        """A socket object on our own copy of the broker's `fd`; None if it is closed or
        no TCP socket."""
        try:
            own = self._call(_SYS_PIDFD_GETFD, self._pidfd, fd, 0)
        except OSError as exc:
            if exc.errno == errno.EBADF:
                return None
            raise
        try:
            sock = socket.socket(fileno=own)
        except OSError:
            os.close(own)
            return None
        if sock.family not in (socket.AF_INET, socket.AF_INET6) or sock.type != socket.SOCK_STREAM:
            sock.close()
            return None
        return sock


@dataclass(slots=True)
class _Watched:
    sock: socket.socket  # our copy of the broker's descriptor
    address: Any
    monitor: int  # the attach id of its listening socket
    inode: int  # of the socket: a descriptor number is reused, a socket's inode is not
    base: int  # handed[fd] when the last connection on this descriptor number ended
    held: int = 0
    unread: int = 0  # in the kernel at the last measure: libzmq may read it with no new event
    recheck_at: float = 0.0  # when to measure again for the unread bytes (0: not scheduled)
    recheck_s: float = 0.0  # the delay that led there (doubled while libzmq reads nothing)


@dataclass(slots=True)
class _Monitor:
    socket: Any  # a zmq PAIR on the proxy's ipc endpoint
    ident: int
    queued: list[list[Any]] = field(default_factory=list)


class Watcher:
    def __init__(self, *, broker_pid: int, probe_fd: int, control: socket.socket, shared: memoryview, slots: int,
                 connection_budget: int, broker_bytes_max: int, round_ms: int) -> None:
        import zmq  # here, not at the top: the broker imports this module for `choose_cuts`

        self.zmq = zmq
        self.ctx = zmq.Context(io_threads=1)
        self.fds = _Fds(broker_pid)
        self.fds.probe(probe_fd)
        self.control = control
        self.stats = shared[:STAT_SLOTS]
        self.handed = shared[STAT_SLOTS:STAT_SLOTS + slots]
        self.ended = array.array("q", bytes(8 * slots))
        self.connection_budget = connection_budget
        self.broker_bytes_max = broker_bytes_max
        self.round_s = round_ms / 1000
        self.priority = "normal"
        self.epoll = select.epoll()
        self.epoll.register(control.fileno(), select.EPOLLIN)
        self.watched: dict[int, _Watched] = {}  # by the broker's descriptor number
        self.by_copy: dict[int, int] = {}  # our copy's number -> the broker's
        self.monitors: dict[int, _Monitor] = {}  # by ZMQ_FD
        self.monitors_due: dict[int, None] = {}
        self.listen_ports: dict[int, int | None] = {}  # by attach id: the TCP port it listens on
        self.due: dict[int, None] = {}
        self.rechecks: list[tuple[float, int]] = []
        self.outbox: list[tuple[bytes, int]] = []  # (message, monitor events in it)
        self.events_queued = 0
        self.held_total = 0
        self.unread_total = 0

    # ------------------------------------------------------------- the loop
    def run(self) -> None:
        self.send(encode(READY, self.priority))
        epoll, control_fd = self.epoll, self.control.fileno()
        while True:
            rechecks = self.rechecks
            monitors_ready = bool(self.monitors_due) and self.events_queued < EVENTS_QUEUED_MAX
            if self.due or monitors_ready:
                timeout = 0.0
            elif self.outbox:
                timeout = self.round_s
            else:
                timeout = max(0.0, rechecks[0][0] - time.monotonic()) if rechecks else -1
            for fd, events in epoll.poll(timeout, _EVENTS_MAX):
                if fd == control_fd:
                    if events & (select.EPOLLHUP | select.EPOLLERR) or not self.take_commands():
                        return
                elif fd in self.by_copy:
                    self.due[self.by_copy[fd]] = None
                elif fd in self.monitors:
                    self.monitors_due[fd] = None
            if self.monitors_due and self.events_queued < EVENTS_QUEUED_MAX:
                self.read_monitors()
            if self.outbox:
                self.flush()
            if self.due or (rechecks and rechecks[0][0] <= time.monotonic()):
                self.round()
                # Let edges gather: at most one round per ROUND_MS, whatever the rate.
                time.sleep(self.round_s)

    def send(self, message: bytes) -> None:
        self.outbox.append((message, 0))
        self.flush()

    def flush(self) -> None:
        """Send what waits for the broker, never blocking (its loop may be behind)."""
        sent = 0
        for message, events in self.outbox:
            try:
                self.control.send(message, socket.MSG_DONTWAIT)
            except BlockingIOError:
                break
            self.events_queued -= events
            sent += 1
        del self.outbox[:sent]

    def take_commands(self) -> bool:
        """Apply the broker's commands in order; False when the broker is gone."""
        while True:
            try:
                data = self.control.recv(65536, socket.MSG_DONTWAIT)
            except BlockingIOError:
                return True
            if not data:
                return False
            tag, fields = decode(data)
            if tag == WATCH:
                fd, address, ident = fields
                self.add(fd, address_of(address), ident)
            elif tag == ATTACH:
                ident, endpoint, listen_port = fields
                self.listen_ports[ident] = listen_port
                sock = self.ctx.socket(self.zmq.PAIR)
                sock.setsockopt(self.zmq.LINGER, 0)
                sock.setsockopt(self.zmq.RCVHWM, 100_000)
                sock.connect(endpoint)
                monitor_fd = sock.getsockopt(self.zmq.FD)
                self.epoll.register(monitor_fd, select.EPOLLIN)
                self.monitors[monitor_fd] = _Monitor(sock, ident)
                self.monitors_due[monitor_fd] = None
            elif tag == DETACH:
                (ident,) = fields
                for monitor_fd, monitor in list(self.monitors.items()):
                    if monitor.ident == ident:
                        self.epoll.unregister(monitor_fd)
                        del self.monitors[monitor_fd]
                        self.monitors_due.pop(monitor_fd, None)
                        monitor.socket.close(linger=0)
                for fd in [fd for fd, w in self.watched.items() if w.monitor == ident]:
                    self.drop(fd)
                    self.ended[fd] = self.handed[fd]

    # ------------------------------------------------------------- connections
    def add(self, fd: int, address: Any, ident: int) -> Any:
        """Watch the broker's `fd` from now on; its peer address (None if it is gone)."""
        if not 0 <= fd < len(self.handed):
            return None
        sock = self.fds.copy(fd)
        if sock is None:
            self.drop(fd)
            return None
        try:
            peer = sock.getpeername()
            inode = os.fstat(sock.fileno()).st_ino
        except OSError:
            peer = None
        if peer is None or (address is not None and peer != address):
            sock.close()  # closed already, or the number leads to a newer connection
            self.drop(fd)
            return None
        # The two ports' monitors are read apart: one's accept of a descriptor number
        # may come after the other port's accept of the same number reused. Such a
        # stale event finds a connection to another port, or one watched already.
        listen_port = self.listen_ports.get(ident)
        if listen_port and sock.getsockname()[1] != listen_port:
            sock.close()
            return None
        current = self.watched.get(fd)
        if current is not None and current.inode == inode:
            sock.close()
            return peer
        self.drop(fd)
        own = sock.fileno()
        self.epoll.register(own, _EDGES)
        # What the broker was handed from this number before the last connection on it
        # ended belongs to the connections it led to before (counts are never reset: a
        # reset by the broker could land after the new connection's first frames).
        self.watched[fd] = _Watched(sock, peer, ident, inode, self.ended[fd])
        self.by_copy[own] = fd
        self.due[fd] = None  # data that came before the registration
        self.stats[STAT_CONNECTIONS] = len(self.watched)
        return peer

    def drop(self, fd: int) -> None:
        watched = self.watched.pop(fd, None)
        self.due.pop(fd, None)
        if watched is None:
            return
        self.held_total -= watched.held
        self.unread_total -= watched.unread
        own = watched.sock.fileno()
        del self.by_copy[own]
        # Unregistered before the close: the broker's descriptor keeps the socket open,
        # and epoll would go on reporting it under our copy's number.
        self.epoll.unregister(own)
        watched.sock.close()
        self.stats[STAT_CONNECTIONS] = len(self.watched)

    def read_monitors(self) -> None:
        """Watch the connections the monitors report accepted, forget closed ones, and
        queue the events for the broker (at most MONITOR_EVENTS_MAX per message)."""
        zmq = self.zmq
        for monitor_fd in list(self.monitors_due):
            monitor = self.monitors[monitor_fd]
            events: list[list[Any]] = []
            for _ in range(MONITOR_EVENTS_MAX):
                try:
                    frames = monitor.socket.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    del self.monitors_due[monitor_fd]
                    break
                event, fd = struct.unpack("=hi", frames[0][:6])  # ZMTP monitor event: 16-bit event, 32-bit value
                if event == zmq.EVENT_ACCEPTED:
                    events.append([event, fd, self.add(fd, None, monitor.ident)])
                else:
                    watched = self.watched.get(fd)
                    if watched is not None and watched.monitor == monitor.ident:  # not a reuse by another port
                        self.drop(fd)
                    if 0 <= fd < len(self.ended):
                        self.ended[fd] = self.handed[fd]
                    events.append([event, fd, None])
            if events:
                self.events_queued += len(events)
                self.outbox.append((encode(EVENTS, monitor.ident, events), len(events)))
            if self.events_queued >= EVENTS_QUEUED_MAX:
                return

    # ------------------------------------------------------------- rounds
    def measure(self, fd: int, watched: _Watched) -> bool:
        """Measure what libzmq holds of `fd`'s input now, and what the kernel has not
        handed to libzmq yet; False if the connection is gone. The kernel's counts are
        read before `handed`, so that a race only overstates it by what the broker was
        just handed."""
        try:
            info = watched.sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO_SIZE)
            buf = array.array("i", [0])
            fcntl.ioctl(watched.sock.fileno(), termios.FIONREAD, buf)
        except OSError:
            self.drop(fd)
            return False
        (received,) = struct.unpack_from("=Q", info, _TCPI_BYTES_RECEIVED)
        unread = buf[0]
        held = max(0, received - unread - (self.handed[fd] - watched.base))
        self.held_total += held - watched.held
        self.unread_total += unread - watched.unread
        watched.held, watched.unread = held, unread
        return True

    def round(self) -> None:
        """Check the connections that received data, and those due a recheck; cut those
        over a budget."""
        stats = self.stats
        stats[STAT_ROUNDS] += 1
        due, watched_fds, rechecks = self.due, self.watched, self.rechecks
        now = time.monotonic()
        while rechecks and rechecks[0][0] <= now:
            at, fd = heapq.heappop(rechecks)
            watched = watched_fds.get(fd)
            if watched is not None and watched.recheck_at == at:
                watched.recheck_at = 0.0
                due[fd] = None
        budget = self.connection_budget
        for _ in range(min(len(due), FDS_PER_ROUND_MAX)):
            fd = next(iter(due))
            del due[fd]
            watched = watched_fds[fd]
            unread_before = watched.unread
            if not self.measure(fd, watched):
                continue
            if watched.held > budget:
                self.cut(fd, watched, "connection")
            elif watched.unread:
                progress = watched.unread != unread_before or watched.held + watched.unread > budget
                self.recheck(fd, watched, now, self.round_s if progress else min(
                    RECHECK_S_MAX, 2 * max(watched.recheck_s, self.round_s)))
        if self.held_total + self.unread_total > self.broker_bytes_max:
            # Values not measured this round only overstate held bytes (the broker reads
            # on) but may understate unread ones: measure every connection holding any.
            for fd, watched in list(watched_fds.items()):
                if watched.held or watched.unread:
                    self.measure(fd, watched)
            for fd in choose_cuts({fd: w.held for fd, w in watched_fds.items() if w.held}, self.broker_bytes_max):
                self.cut(fd, watched_fds[fd], "broker")
            for fd, watched in watched_fds.items():
                if watched.unread:
                    self.recheck(fd, watched, now, self.round_s)
        stats[STAT_HELD] = self.held_total
        if self.held_total > stats[STAT_HELD_PEAK]:
            stats[STAT_HELD_PEAK] = self.held_total

    def recheck(self, fd: int, watched: _Watched, now: float, delay_s: float) -> None:
        at = now + delay_s
        if watched.recheck_at and watched.recheck_at <= at:
            return
        watched.recheck_at, watched.recheck_s = at, delay_s
        heapq.heappush(self.rechecks, (at, fd))

    def cut(self, fd: int, watched: _Watched, budget: str) -> None:
        """Shut the connection down on our copy (libzmq sees the hang-up, closes its
        descriptor and frees what it held) and tell the broker."""
        held = watched.held
        try:
            watched.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            self.drop(fd)
            return
        self.drop(fd)
        stats = self.stats
        stats[STAT_CONNECTION_CUTS if budget == "connection" else STAT_BROKER_CUTS] += 1
        if held > stats[STAT_HELD_AT_CUT_MAX]:
            stats[STAT_HELD_AT_CUT_MAX] = held
        self.send(encode(CUT, fd, watched.address, watched.monitor, held, budget))


def raise_priority() -> str:
    """Run ahead of the broker's and other processes' threads when woken. Measured on
    2 cores with 5-7 runnable processes (load b): at normal priority the watcher's
    rounds were now and then ~200 ms late, and a flood gained up to 200 MiB past its
    budget. SCHED_RR (priority 1, the lowest real-time one) makes a wake-up preempt
    every normal thread; the work per wake-up is microseconds per connection and the
    kernel's real-time throttling caps it anyway. Needs CAP_SYS_NICE or
    RLIMIT_RTPRIO >= 1; else nice -10 (CAP_SYS_NICE or RLIMIT_NICE); else unchanged.
    Returns what was obtained, for the broker's log."""
    try:
        os.sched_setscheduler(0, os.SCHED_RR, os.sched_param(1))
        return "SCHED_RR 1"
    except OSError:
        pass
    try:
        os.setpriority(os.PRIO_PROCESS, 0, -10)
        return "nice -10"
    except OSError:
        return "normal"


def main(argv: list[str]) -> None:
    broker_pid, probe_fd, control_fd, memory_fd, slots, connection_budget, broker_bytes_max, round_ms = map(int, argv)
    # Die with the broker (the thread that started us: the broker's loop thread); the
    # socketpair's end is the other sign, for a start raced with the broker's death.
    ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != broker_pid:
        return
    control = socket.socket(fileno=control_fd)
    memory = mmap.mmap(memory_fd, 8 * (STAT_SLOTS + slots))
    os.close(memory_fd)
    try:
        watcher = Watcher(broker_pid=broker_pid, probe_fd=probe_fd, control=control,
                          shared=memoryview(memory).cast("q"), slots=slots, connection_budget=connection_budget,
                          broker_bytes_max=broker_bytes_max, round_ms=round_ms)
    except OSError as exc:  # pidfd_getfd refused (seccomp, ptrace rules): the broker says so
        control.send(encode(FAILED, f"the inbound watcher cannot copy the broker's descriptors: {exc}"))
        return
    watcher.priority = raise_priority()
    watcher.run()


if __name__ == "__main__":
    main(sys.argv[1:])

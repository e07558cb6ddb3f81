"""The inbound watcher: one thread per broker holding what libzmq buffers of its
connections' input (client and admin ports) to byte budgets.

libzmq reads a peer as fast as it can and holds a multipart message until its last
part (`actors/peers.py` says how what it holds is measured). Checked on a timer of the
event loop, what a flooding peer gains between two checks is its rate times the
interval plus however late the loop is, tens of ms on a busy broker: at loopback rates
that is hundreds of MiB. So the check runs here, in a thread whose only business it
is: the kernel wakes it (epoll, edge-triggered on libzmq's own descriptors: every
arrival of data is an event, see `_EDGES`; the descriptor is never read here) and it
gets the GIL within the interpreter's switch interval (5 ms), whatever the loop does.

    loop thread (gateways)                          watcher thread
      PeerGuard: attach(monitor)  -- SimpleQueue + eventfd -->  reads the socket monitors:
                                                                  accepted fd: epoll IN|OUT|ET
      _take_events(batch)  <-- call_soon_threadsafe --          (`_EDGES`); at a close: base
      read a frame: handed[fd] += bytes                         = handed[fd]. Every round, the fds
                    (array, single writer, never reset)         that received data: held =
      on_cut(fd, address)  <-- call_soon_threadsafe --          received - unread - (handed - base)

The watcher reads the gateways' socket monitors itself, so a connection is watched the
moment libzmq reports it accepted (on the loop that waited behind the loop's other work,
seconds under a flood of connections, while a peer may flood as soon as it is accepted);
the events go on to the peer guard in batches. Each round checks only the connections
that received data since the last one (at most `FDS_PER_ROUND_MAX`; the rest wait for
the next round), and those that still had bytes in the kernel (libzmq reads them with
no new event: `RECHECK_S_MAX`), so an idle broker costs nothing and a busy one a few
microseconds per active connection. A connection holding more than
`connection_bytes_max` is shut down (`shutdown_peer`, which checks the address against
descriptor reuse). The sum held over all connections is kept from the last value seen
of each; when it (with what the kernel still holds) passes `broker_bytes_max`, every
connection holding any is measured again and the largest holders are cut until the sum
is under it (`choose_cuts`).

The owner and the thread share no mutable Python structure but the `handed` array,
written only by the loop thread and read only by this one (an 8-byte item store is
atomic under the GIL). What the thread reads may lag what the owner was handed by a
few frames: the order of the reads (kernel count first, `handed` last) makes every
error an understatement, never a false cut.
"""

from __future__ import annotations

import array
import asyncio
import errno
import heapq
import logging
import os
import queue
import resource
import select
import struct
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import zmq

from danube_zmq.actors.metrics import METRICS
from danube_zmq.actors.peers import (
    INBOUND_SLACK_BYTES,
    Address,
    inbound_held,
    peer_address,
    shutdown_peer,
    unread_bytes,
)

log = logging.getLogger("danube_zmq.inbound")

# One round every ROUND_MS while data arrives: what a peer gains beyond its budget is
# its rate times this (plus the GIL switch interval), ~8 MiB at 800 MB/s.
ROUND_MS = 5
FDS_PER_ROUND_MAX = 512
# A connection with bytes left in the kernel is measured again (libzmq reads them with
# no new event), after ROUND_MS while libzmq reads on, backing off to this while it
# does not (the broker pushes back on a peer whose messages it does not take).
RECHECK_S_MAX = 1.0
_EVENTS_MAX = 1024
MONITOR_EVENTS_MAX = 256
# Monitor events passed to the loop and not taken there yet: past this the watcher
# leaves them in the monitor sockets (bounded by their RCVHWM) until the loop catches
# up, so a loop seconds behind a connection flood holds a bounded backlog, not one
# callback per batch read.
MONITOR_EVENTS_WAITING_MAX = 4096
# Every arrival of data wakes the socket's waiters, this epoll among them, but epoll
# reports an event only if the descriptor is still ready when it is collected, and
# libzmq may have read it all by then: with EPOLLIN alone a connection whose bytes
# libzmq drains at once (any that is not flooding) would go unseen. EPOLLOUT makes the
# descriptor ready whenever its send buffer has room (almost always), so each arrival
# is reported; edge-triggered, once per arrival (or per freed send buffer of a full one).
_EDGES = select.EPOLLIN | select.EPOLLOUT | select.EPOLLET

# (fd, address, port name, bytes held, "connection" or "broker") -> None, on the loop.
CutNotice = Callable[[int, "Address | None", str, int, str], None]


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


@dataclass(slots=True)
class _Watched:
    address: Address | None
    port: str
    on_cut: CutNotice
    base: int = 0  # handed[fd] when the last connection on this descriptor ended (counts never reset)
    held: int = 0
    unread: int = 0  # in the kernel at the last measure: libzmq may read it with no new event
    recheck_at: float = 0.0  # when to measure again for the unread bytes (0: not scheduled)
    recheck_s: float = 0.0  # the delay that led there (doubled while libzmq reads nothing)


# (event, fd, peer address) of a socket monitor, as the watcher read them.
MonitorEvent = tuple[int, int, "Address | None"]


@dataclass(slots=True)
class _Monitor:
    """A listening socket's monitor, read by the watcher (it alone touches the socket)."""

    socket: zmq.Socket[Any]
    port: str
    on_events: Callable[[list[MonitorEvent]], None]
    on_cut: CutNotice


@dataclass(frozen=True, slots=True)
class InboundStatistics:
    connections: int
    held_bytes: int
    held_bytes_peak: int
    held_bytes_at_cut_max: int
    connection_cuts: int
    broker_cuts: int
    rounds: int


class InboundWatch:
    """The watcher thread and its owner-side handles; `start()` on the event loop that
    owns the gateways, `stop()` after they stopped."""

    def __init__(self, *, connection_bytes_max: int, broker_bytes_max: int, round_ms: int = ROUND_MS,
                 events_waiting_max: int = MONITOR_EVENTS_WAITING_MAX) -> None:
        self.connection_bytes_max = connection_bytes_max
        self.broker_bytes_max = broker_bytes_max
        self.round_s = round_ms / 1000
        self.events_waiting_max = max(events_waiting_max, MONITOR_EVENTS_MAX)
        # Monitor events passed to the loop (written by the watcher) and taken there
        # (written by the loop): one writer each, their difference is what waits.
        self._events_sent = 0
        self._events_taken = 0
        # Bytes handed to the owner per descriptor, ZMTP framing included; descriptors
        # are below RLIMIT_NOFILE (the broker never raises it), so one slot each.
        # Written by the loop thread only (`hand`), read by the watcher.
        self.handed = array.array("q", bytes(8 * resource.getrlimit(resource.RLIMIT_NOFILE)[0]))
        self._ended = array.array("q", bytes(8 * len(self.handed)))  # the watcher's: handed[fd] at a close
        self._commands: queue.SimpleQueue[tuple[str, int, Any]] = queue.SimpleQueue()
        self._wake = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._epoll = select.epoll()
        self._epoll.register(self._wake, select.EPOLLIN)
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        # The watcher's own state (only its thread touches it after start()).
        self._watched: dict[int, _Watched] = {}
        self._monitors: dict[int, _Monitor] = {}  # by ZMQ_FD
        self._monitors_due: dict[int, None] = {}  # events may wait
        self._due: dict[int, None] = {}  # received data, not checked yet (in arrival order)
        self._rechecks: list[tuple[float, int]] = []  # (when, fd), a heap; stale entries skipped
        self._held_total = 0
        self._unread_total = 0
        # Single-writer counters (the watcher), read by `statistics()`.
        self.held_peak = 0
        self.held_at_cut_max = 0
        self.connection_cuts = 0
        self.broker_cuts = 0
        self.rounds = 0

    # ------------------------------------------------------------- owner side
    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._run, name="danube-inbound", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._thread is not None:
            self._send("stop", -1, None)
            self._thread.join(timeout=5)
            self._thread = None
        self._epoll.close()
        os.close(self._wake)

    def attach(self, monitor: zmq.Socket[Any], port: str, on_events: Callable[[list[MonitorEvent]], None],
               on_cut: CutNotice) -> None:
        """Read the socket monitor of a listening socket from now on (the caller no longer
        touches it): each accepted connection is watched as soon as the watcher reads its
        event, not when the loop gets to it (a flood of connections queues thousands of
        events, and a peer may flood as soon as it is accepted). The events are passed on
        to `on_events` on the loop; `on_cut` is called there for a connection cut."""
        self._send("attach", -1, _Monitor(monitor, port, on_events, on_cut))

    def detach(self, monitor: zmq.Socket[Any]) -> None:
        """Stop reading `monitor` and watching its connections; the caller may close it
        once this returns."""
        done = threading.Event()
        self._send("detach", -1, (monitor, done))
        if self._thread is not None and self._thread.is_alive():
            done.wait(5)

    def watch(self, fd: int, address: Address | None, port: str, on_cut: CutNotice) -> None:
        """Hold the connection on `fd` to the budgets (one no monitor reports: tests);
        `on_cut` is called on the loop if it is cut."""
        self._send("watch", fd, _Watched(address, port, on_cut))

    def hand(self, fd: int, size: int) -> None:
        """The owner was handed `size` bytes (ZMTP framing included) read from `fd`
        (-1 when a frame came on no TCP connection: inproc, ipc)."""
        if 0 <= fd < len(self.handed):
            self.handed[fd] += size

    def statistics(self) -> InboundStatistics:
        return InboundStatistics(connections=len(self._watched), held_bytes=self._held_total,
                                 held_bytes_peak=self.held_peak, held_bytes_at_cut_max=self.held_at_cut_max,
                                 connection_cuts=self.connection_cuts,
                                 broker_cuts=self.broker_cuts, rounds=self.rounds)

    def _send(self, command: str, fd: int, payload: Any) -> None:
        self._commands.put((command, fd, payload))
        os.eventfd_write(self._wake, 1)

    # ------------------------------------------------------------- watcher thread
    def _run(self) -> None:
        epoll, wake = self._epoll, self._wake
        try:
            while True:
                rechecks = self._rechecks
                monitors_ready = bool(self._monitors_due) and self._room_for_events()
                if self._due or monitors_ready:
                    timeout = 0.0
                elif self._monitors_due:  # the loop has not taken what it was passed: wait for it
                    timeout = self.round_s
                else:
                    timeout = max(0.0, rechecks[0][0] - time.monotonic()) if rechecks else -1
                for fd, _events in epoll.poll(timeout, _EVENTS_MAX):
                    if fd == wake:
                        if not self._take_commands():
                            return
                    elif fd in self._watched:
                        self._due[fd] = None
                    elif fd in self._monitors:
                        self._monitors_due[fd] = None
                if self._monitors_due and self._room_for_events():
                    self._read_monitors()
                if self._due or (rechecks and rechecks[0][0] <= time.monotonic()):
                    self._round()
                    # Let edges gather: at most one round per ROUND_MS, whatever the rate.
                    time.sleep(self.round_s)
        except Exception:  # a bug here must not pass silently: the budgets would be off
            log.exception("the inbound watcher failed: inbound bytes are no longer bounded")
            raise

    def _take_commands(self) -> bool:
        """Apply the owner's commands in order; False on stop."""
        try:
            os.eventfd_read(self._wake)
        except BlockingIOError:
            pass
        while True:
            try:
                command, fd, payload = self._commands.get_nowait()
            except queue.Empty:
                return True
            if command == "stop":
                return False
            if command == "watch":
                self._add(fd, payload)
            elif command == "attach":
                monitor_fd = payload.socket.getsockopt(zmq.FD)
                self._epoll.register(monitor_fd, select.EPOLLIN)
                self._monitors[monitor_fd] = payload
                self._monitors_due[monitor_fd] = None  # events queued before
            elif command == "detach":
                sock, done = payload
                for monitor_fd, monitor in list(self._monitors.items()):
                    if monitor.socket is sock:
                        self._epoll.unregister(monitor_fd)
                        del self._monitors[monitor_fd]
                        self._monitors_due.pop(monitor_fd, None)
                        for fd in [fd for fd, w in self._watched.items() if w.port == monitor.port]:
                            self._drop(fd)
                            self._ended[fd] = self.handed[fd]  # its socket is closed next
                done.set()

    def _add(self, fd: int, watched: _Watched) -> None:
        self._drop(fd)
        if not 0 <= fd < len(self.handed):
            log.error("descriptor %d is beyond RLIMIT_NOFILE at start: its inbound bytes are not bounded", fd)
            return
        try:
            self._epoll.register(fd, _EDGES)
        except FileExistsError:  # the registration of a closed descriptor's predecessor
            self._epoll.modify(fd, _EDGES)
        except OSError as exc:
            if exc.errno != errno.EBADF:  # closed already
                raise
            return
        # What the owner was handed from this descriptor number before the last
        # connection on it ended belongs to the connections it led to before (the counts
        # are never reset: a reset by the owner could land after the new connection's
        # first frames). Taken at the end, not now: the owner may already have read the
        # new connection's first frames. A frame of the old connection read later counts
        # against the new one, which only understates it.
        watched.base = self._ended[fd]
        self._watched[fd] = watched
        self._due[fd] = None  # data that came before the registration

    def _read_monitors(self) -> None:
        """Watch the connections the monitors report accepted at once, forget closed
        ones, and pass the events on to their owners (at most MONITOR_EVENTS_MAX per
        monitor per round, so that the loop takes them in bounded batches)."""
        for monitor_fd in list(self._monitors_due):
            monitor = self._monitors[monitor_fd]
            events: list[MonitorEvent] = []
            for _ in range(MONITOR_EVENTS_MAX):
                try:
                    frames = monitor.socket.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    del self._monitors_due[monitor_fd]
                    break
                event, fd = struct.unpack("=hi", frames[0][:6])  # ZMTP monitor event: 16-bit event, 32-bit value
                if event == zmq.EVENT_ACCEPTED:
                    address = peer_address(fd)
                    self._add(fd, _Watched(address, monitor.port, monitor.on_cut))
                    events.append((event, fd, address))
                else:
                    watched = self._watched.get(fd)
                    if watched is not None and watched.port == monitor.port:  # not a reuse by the other port
                        self._drop(fd)
                    if 0 <= fd < len(self._ended):
                        self._ended[fd] = self.handed[fd]
                    events.append((event, fd, None))
            if events:
                self._events_sent += len(events)
                self._notify(self._pass_events, monitor.on_events, events)
            if not self._room_for_events():
                return

    def _room_for_events(self) -> bool:
        return self._events_sent - self._events_taken + MONITOR_EVENTS_MAX <= self.events_waiting_max

    def _pass_events(self, on_events: Callable[[list[MonitorEvent]], None], events: list[MonitorEvent]) -> None:
        """On the loop: hand a batch of monitor events to their owner."""
        self._events_taken += len(events)
        on_events(events)

    def _notify(self, callback: Callable[..., None], *args: Any) -> None:
        assert self._loop is not None
        try:
            self._loop.call_soon_threadsafe(callback, *args)
        except RuntimeError:  # the loop is closed: the broker is stopping
            pass

    def _drop(self, fd: int) -> None:
        watched = self._watched.pop(fd, None)
        self._due.pop(fd, None)
        if watched is not None:
            self._held_total -= watched.held
            self._unread_total -= watched.unread

    def _measure(self, fd: int, watched: _Watched) -> bool:
        """Measure what libzmq holds of `fd`'s input now, and what the kernel has not
        handed to libzmq yet; False if `fd` is no longer a TCP socket. The kernel's
        counts are read before `handed`, so that a race only understates it."""
        received = inbound_held(fd, 0)
        if received is None:
            self._drop(fd)
            return False
        unread = unread_bytes(fd)
        held = max(0, received - unread - (self.handed[fd] - watched.base))
        self._held_total += held - watched.held
        self._unread_total += unread - watched.unread
        watched.held, watched.unread = held, unread
        return True

    def _round(self) -> None:
        """Check the connections that received data, and those due a recheck; cut those
        over a budget."""
        self.rounds += 1
        due, watched_fds, rechecks = self._due, self._watched, self._rechecks
        now = time.monotonic()
        while rechecks and rechecks[0][0] <= now:
            at, fd = heapq.heappop(rechecks)
            watched = watched_fds.get(fd)
            if watched is not None and watched.recheck_at == at:
                watched.recheck_at = 0.0
                due[fd] = None
        budget = self.connection_bytes_max + INBOUND_SLACK_BYTES  # the greeting and commands are never handed
        for _ in range(min(len(due), FDS_PER_ROUND_MAX)):
            fd = next(iter(due))
            del due[fd]
            watched = watched_fds[fd]
            unread_before = watched.unread
            if not self._measure(fd, watched):
                continue
            if watched.held > budget:
                self._cut(fd, watched, watched.held, "connection")
            elif watched.unread:
                # Soon while libzmq reads on or the bytes could pass the budget; later
                # and later while it reads nothing.
                progress = watched.unread != unread_before or watched.held + watched.unread > budget
                self._recheck(fd, watched, now, self.round_s if progress else min(
                    RECHECK_S_MAX, 2 * max(watched.recheck_s, self.round_s)))
        if self._held_total + self._unread_total > self.broker_bytes_max:
            # Values not measured this round only overstate held bytes (the owner reads
            # on) but may understate unread ones: measure every connection holding any.
            for fd, watched in list(watched_fds.items()):
                if watched.held or watched.unread:
                    self._measure(fd, watched)
            for fd in choose_cuts({fd: w.held for fd, w in watched_fds.items() if w.held}, self.broker_bytes_max):
                self._cut(fd, watched_fds[fd], watched_fds[fd].held, "broker")
            for fd, watched in watched_fds.items():
                if watched.unread:
                    self._recheck(fd, watched, now, self.round_s)
        total = self._held_total
        if total > self.held_peak:
            self.held_peak = total
            METRICS.inbound_held_bytes_peak.set(total)
        METRICS.inbound_held_bytes.set(total)

    def _recheck(self, fd: int, watched: _Watched, now: float, delay_s: float) -> None:
        """Measure `fd` again after `delay_s` (unless it is due sooner already)."""
        at = now + delay_s
        if watched.recheck_at and watched.recheck_at <= at:
            return
        watched.recheck_at, watched.recheck_s = at, delay_s
        heapq.heappush(self._rechecks, (at, fd))

    def _cut(self, fd: int, watched: _Watched, held: int, budget: str) -> None:
        self._drop(fd)  # cut or gone: either way no longer watched (a reused fd is watched anew)
        if not shutdown_peer(fd, watched.address):
            return
        if budget == "connection":
            self.connection_cuts += 1
            METRICS.inbound_overrun_cut.labels(watched.port).inc()
        else:
            self.broker_cuts += 1
            METRICS.inbound_budget_cut.labels(watched.port).inc()
        if held > self.held_at_cut_max:
            self.held_at_cut_max = held
            METRICS.inbound_held_bytes_at_cut_max.set(held)
        if budget == "connection":
            log.warning("connection from %s to the %s port holds %d bytes the broker has not been handed (an"
                        " unfinished multipart message?), over inbound_bytes_per_connection_max (%d):"
                        " disconnected", watched.address, watched.port, held, self.connection_bytes_max)
        else:
            log.warning("connection from %s to the %s port holds %d bytes the broker has not been handed, the"
                        " most of all connections, which together hold over inbound_bytes_max (%d):"
                        " disconnected", watched.address, watched.port, held, self.broker_bytes_max)
        self._notify(watched.on_cut, fd, watched.address, watched.port, held, budget)

"""The TCP connections behind a ZeroMQ socket, as far as the gateway can act on them.

A ROUTER socket cannot close one peer's connection. libzmq does tell which file
descriptor a message came from (ZMQ_SRCFD) and, through a socket monitor, which
descriptors it accepted and closed; shutting such a descriptor down (on a dup of it,
never closing libzmq's own) makes libzmq see the peer hang up: it closes the
connection itself and drops whatever it queued for that peer.

A descriptor number is reused once libzmq closes it, so every shutdown first checks
that the descriptor still leads to the peer address recorded when it was accepted.

Inbound, libzmq reads a peer's socket as fast as it can and holds a multipart
message until its last part has arrived (ZMQ_MAXMSGSIZE bounds one part, ZMQ_RCVHWM
counts whole messages only), so a peer sending parts that never end grows the
broker without bound. No libzmq option stops that; the kernel does count what it
received on each connection (TCP_INFO `tcpi_bytes_received`), so the guard compares
that, less what is still unread in the kernel (FIONREAD), with the bytes the owner
was actually handed from that descriptor (ZMQ_SRCFD, ZMTP framing included): the
difference is what libzmq holds for the peer. A connection holding more than
`inbound_bytes_per_connection_max` is shut down by the inbound watcher, a process of
its own woken by the kernel when data arrives (`actors/sockets/inbound_watch.py`), never per
message, never on the event loop's timer (late by tens of ms) and never needing the
broker's GIL.
"""

from __future__ import annotations

import array
import contextlib
import fcntl
import logging
import socket
import struct
import termios
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import zmq

from danube_zmq.actors.metrics import METRICS

if TYPE_CHECKING:
    from danube_zmq.actors.sockets.inbound_watch import InboundWatch

log = logging.getLogger("danube_zmq.peers")

Address = tuple[object, ...] | str

# struct tcp_info (linux/tcp.h): tcpi_bytes_received follows tcpi_bytes_acked at 120.
_TCPI_BYTES_RECEIVED = 128
_TCP_INFO_SIZE = 136
# What a peer sends besides the frames the owner is handed: the ZMTP greeting (64
# bytes), READY with its metadata, and commands (a ZMTP heartbeat PING is ~10 bytes).
INBOUND_SLACK_BYTES = 64 * 1024


def _count_nothing(_fd: int, _size: int) -> None:
    """`PeerGuard.hand` without an inbound watcher (a gateway run alone in tests)."""


def zmtp_frame_bytes(size: int) -> int:
    """Bytes a ZMTP 3 frame of `size` bytes takes on the wire (flags, short or long size)."""
    return size + (2 if size < 256 else 9)


def inbound_held(fd: int, handed: int) -> int | None:
    """Bytes received on TCP socket `fd` and read by libzmq that were not handed to the
    owner (`handed`, ZMTP framing included); None if `fd` is no TCP socket (or no longer
    open: libzmq's I/O thread closes descriptors on its own)."""
    sock = _borrowed(fd)
    if sock is None:
        return None
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO_SIZE)
    except OSError:
        return None
    finally:
        sock.detach()
    if len(info) < _TCP_INFO_SIZE:
        return None
    (received,) = struct.unpack_from("=Q", info, _TCPI_BYTES_RECEIVED)
    return received - handed


def unread_bytes(fd: int) -> int:
    """Bytes the kernel holds for `fd` that libzmq has not read yet (FIONREAD)."""
    buf = array.array("i", [0])
    try:
        fcntl.ioctl(fd, termios.FIONREAD, buf)
    except OSError:
        return 0
    return buf[0]


def _borrowed(fd: int) -> socket.socket | None:
    """A socket object on libzmq's descriptor `fd` (no dup: `.detach()` it, never close
    it); None when `fd` is closed already (EBADF): libzmq closes a peer's descriptor
    from its I/O thread whenever the peer goes, between our notice and this call."""
    try:
        return socket.socket(socket.AF_INET, socket.SOCK_STREAM, 0, fileno=fd)
    except OSError:
        return None


def peer_address(fd: int) -> Address | None:
    """The remote address of socket `fd`, or None if it is not a connected socket."""
    sock = _borrowed(fd)
    if sock is None:
        return None
    try:
        return sock.getpeername()
    except OSError:
        return None
    finally:
        sock.detach()


def shutdown_peer(fd: int, address: Address | None) -> bool:
    """Shut the connection on `fd` down if it still leads to `address`; True if done.
    Shut down, never closed: libzmq sees the hang-up and closes its descriptor itself."""
    sock = _borrowed(fd)
    if sock is None:
        return False
    try:
        if address is not None and sock.getpeername() != address:
            return False
        sock.shutdown(socket.SHUT_RDWR)
        return True
    except OSError:
        return False
    finally:
        sock.detach()


@dataclass(slots=True)
class _Connection:
    address: Address | None
    idle_since_ms: int  # accepted, or last seen with a session


class ConnectionTable:
    """The connections a listening socket accepted, and which of them are pending (no
    session): no I/O, so the guard's decisions are tested alone.

    A flood of connections is accepted at thousands a second, so everything done per
    accept is O(1): pending connections are kept in the order they became pending and
    the oldest is found at the front. `sessions` (descriptor -> peer address) is the
    owner's; the owner says when a session starts or ends on a descriptor
    (`session_started`, `session_ended`), and `expired` (every review) repairs the
    pending order from `sessions` should a notice be missed, so a connection with a
    session is never evicted or timed out: `evict_for_accept` skips one it meets.
    """

    def __init__(self, sessions: dict[int, Address | None], *, pending_max: int, timeout_ms: int) -> None:
        self.sessions = sessions
        self.pending_max = pending_max
        self.timeout_ms = timeout_ms
        self.connections: dict[int, _Connection] = {}  # in accept order
        self._pending: dict[int, None] = {}  # in the order they became pending

    @property
    def pending(self) -> int:
        return len(self._pending)

    def has_session(self, fd: int) -> bool:
        connection = self.connections.get(fd)
        return connection is not None and fd in self.sessions and self.sessions[fd] == connection.address

    def accepted(self, fd: int, address: Address | None, now_ms: int) -> tuple[int, _Connection] | None:
        """Record a new connection on `fd`; the oldest pending one to cut if
        `pending_max` were pending already (removed from the table), else None."""
        evict = None
        while len(self._pending) >= self.pending_max:
            oldest = next(iter(self._pending))
            del self._pending[oldest]
            if not self.has_session(oldest):
                evict = (oldest, self.connections.pop(oldest))
                break
        self.connections.pop(fd, None)  # a reused descriptor whose close was not seen
        self._pending.pop(fd, None)
        self.connections[fd] = _Connection(address, now_ms)
        self._pending[fd] = None
        return evict

    def closed(self, fd: int) -> None:
        self.connections.pop(fd, None)
        self._pending.pop(fd, None)

    def session_started(self, fd: int) -> None:
        self._pending.pop(fd, None)

    def session_ended(self, fd: int, now_ms: int) -> None:
        """The session on `fd` ended: the connection is pending again, its timeout from now."""
        connection = self.connections.get(fd)
        if connection is not None and not self.has_session(fd):
            connection.idle_since_ms = now_ms
            self._pending.pop(fd, None)
            self._pending[fd] = None

    def touch(self, fd: int, now_ms: int) -> None:
        connection = self.connections.get(fd)
        if connection is not None:
            connection.idle_since_ms = now_ms

    def remove(self, fd: int) -> _Connection | None:
        self._pending.pop(fd, None)
        return self.connections.pop(fd, None)

    def expired(self, now_ms: int) -> list[tuple[int, _Connection]]:
        """Connections pending for `timeout_ms` (removed from the table); the pending
        order is repaired on the way (O(connections), once per review)."""
        out: list[tuple[int, _Connection]] = []
        pending = self._pending
        for fd, connection in list(self.connections.items()):
            if self.has_session(fd):
                connection.idle_since_ms = now_ms
                pending.pop(fd, None)
            elif now_ms - connection.idle_since_ms >= self.timeout_ms:
                del self.connections[fd]
                pending.pop(fd, None)
                out.append((fd, connection))
            elif fd not in pending:  # a session ended unannounced
                pending[fd] = None
        return out


@dataclass(frozen=True, slots=True)
class PeerStatistics:
    connections: int
    pending: int
    evicted: int
    expired: int
    inbound_cut: int


class PeerGuard:
    """The TCP connections a listening ZeroMQ socket accepted, by descriptor (from its
    monitor), so that connections without a session are counted and time out.

    `sessions` (descriptor -> peer address) is kept by the owner: every connection not
    in it is pending (see `ConnectionTable`). When a connection is accepted while
    `pending_max` are pending, the oldest pending one is shut down (so a flood of idle
    connections cannot lock real clients out: they send `Connect` at once); a pending
    one idle for `timeout_ms` is shut down then. Under a flood each accept costs a
    getpeername and at most one shutdown, a bounded number per loop turn, and cuts are
    logged as one summary line per `LOG_EVERY_MS`, never one line per connection.
    """

    LOG_EVERY_MS = 10_000

    def __init__(self, ctx: zmq.Context[Any], sock: zmq.Socket[Any], name: str, sessions: dict[int, Address | None],
                 *, pending_max: int, timeout_ms: int, inbound: InboundWatch | None,
                 on_inbound_cut: Callable[[int, Address | None], None] | None = None,
                 now_ms: Callable[[], int] | None = None) -> None:
        self.name = name
        self.pending_max = pending_max
        self.timeout_ms = timeout_ms
        self.sessions = sessions
        self.evicted = 0
        self.expired = 0
        self.inbound_cut = 0
        # Accepted connections are held to the inbound budgets by the watcher process;
        # `on_inbound_cut(fd, address)` tells the owner one was cut (on the loop).
        self.inbound = inbound
        self.on_inbound_cut = on_inbound_cut
        # The owner calls `hand(fd, bytes)` for every message read, ZMTP framing
        # included (counts per descriptor number that never reset: see InboundWatch).
        self.hand: Callable[[int, int], None] = inbound.hand if inbound is not None else _count_nothing
        self.table = ConnectionTable(sessions, pending_max=pending_max, timeout_ms=timeout_ms)
        self._logged = (0, 0)  # (evicted, expired) at the last summary line
        self._log_at_ms = 0
        endpoint = f"inproc://monitor-{name}-{id(self):x}"
        sock.monitor(endpoint, zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED | zmq.EVENT_CLOSED)
        self._sock = sock
        # With an inbound watcher, the watcher process reads the monitor (it watches a
        # connection the moment it is accepted) and passes the events on (`_take_events`,
        # on the loop, with `now_ms`); without one, the owner drains it on the loop (`drain`).
        self.monitor_on_loop = inbound is None
        self._inbound_handle = 0
        if inbound is not None:
            assert now_ms is not None
            self._now_ms = now_ms
            bound = sock.getsockopt(zmq.LAST_ENDPOINT).decode()
            listen_port = int(bound.rsplit(":", 1)[1]) if bound.startswith("tcp://") else None
            self._inbound_handle = inbound.attach(ctx, endpoint, name, self._take_events, self._inbound_cut,
                                                  listen_port=listen_port)
            return
        monitor = ctx.socket(zmq.PAIR)
        monitor.setsockopt(zmq.LINGER, 0)
        # Events are dropped when this queue is full; it holds small frames only.
        monitor.setsockopt(zmq.RCVHWM, 100_000)
        monitor.connect(endpoint)
        self.monitor = monitor
        self._monitor_sync = zmq.Socket.shadow(monitor.underlying)

    def close(self) -> None:
        # The monitor first: libzmq's I/O thread sends monitor events blocking, so a
        # monitor left enabled with no reader (the watcher detached) would stop it, and
        # `disable_monitor` would then wait for it forever.
        with contextlib.suppress(zmq.ZMQError):
            self._sock.disable_monitor()
        if self.inbound is not None:
            self.inbound.detach(self._inbound_handle)
        if self.monitor_on_loop:
            self.monitor.close(linger=0)

    def drain(self, now_ms: int, events_max: int = 128) -> None:
        """Take up to `events_max` of the monitor's events (the rest wait for the next
        loop turn, so a flood of connections leaves other actors their turns): count
        accepted connections, cut the oldest pending one over `pending_max`, forget
        closed ones."""
        for _ in range(events_max):
            try:
                frames = self._monitor_sync.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            event, fd = struct.unpack("=hi", frames[0][:6])  # ZMTP monitor event: 16-bit event, 32-bit value
            self._event(event, fd, peer_address(fd) if event == zmq.EVENT_ACCEPTED else None, now_ms)
        self._summarize(now_ms)

    def _take_events(self, events: list[tuple[int, int, Address | None]]) -> None:
        """The monitor's events as the inbound watcher read them (a bounded batch)."""
        now_ms = self._now_ms()
        for event, fd, address in events:
            self._event(event, fd, address, now_ms)
        self._summarize(now_ms)

    def _event(self, event: int, fd: int, address: Address | None, now_ms: int) -> None:
        """Count an accepted connection, cutting the oldest pending one over
        `pending_max`; forget a closed one."""
        if event != zmq.EVENT_ACCEPTED:
            self.table.closed(fd)
            return
        evict = self.table.accepted(fd, address, now_ms)
        if evict is not None and shutdown_peer(evict[0], evict[1].address):
            self.evicted += 1
            METRICS.idle_connections_cut.labels(self.name, "evicted").inc()

    def review(self, now_ms: int) -> None:
        """Shut down connections that have had no session for `timeout_ms`."""
        for fd, connection in self.table.expired(now_ms):
            if shutdown_peer(fd, connection.address):
                self.expired += 1
                METRICS.idle_connections_cut.labels(self.name, "expired").inc()
        self._summarize(now_ms)

    def _summarize(self, now_ms: int) -> None:
        """One log line for the connections cut since the last one, at most every LOG_EVERY_MS."""
        if (self.evicted, self.expired) == self._logged or now_ms < self._log_at_ms:
            return
        evicted, expired = self.evicted - self._logged[0], self.expired - self._logged[1]
        self._logged = (self.evicted, self.expired)
        self._log_at_ms = now_ms + self.LOG_EVERY_MS
        log.warning("%s port: %d connections without a session cut (%d evicted over connections_pending_max %d,"
                    " %d sent no Connect within connect_timeout_ms %d); %d pending now", self.name, evicted + expired,
                    evicted, self.pending_max, expired, self.timeout_ms, self.table.pending)

    def address(self, fd: int) -> Address | None:
        """The peer address recorded when `fd` was accepted (None if not known yet)."""
        connection = self.table.connections.get(fd)
        return None if connection is None else connection.address

    def touch(self, fd: int, now_ms: int) -> None:
        """The connection on `fd` is in use: its idle deadline starts again."""
        self.table.touch(fd, now_ms)

    def session_started(self, fd: int) -> None:
        """The owner recorded a session on `fd` (in `sessions`): it is no longer pending."""
        self.table.session_started(fd)

    def session_ended(self, fd: int, now_ms: int) -> None:
        """The owner removed `fd` from `sessions`: pending again, timed out from now."""
        self.table.session_ended(fd, now_ms)

    def _inbound_cut(self, fd: int, address: Address | None, _port: str, _held: int, _budget: str) -> None:
        """The watcher cut the connection on `fd` (it logged and counted it): forget it
        unless the descriptor already leads elsewhere, and tell the owner."""
        self.inbound_cut += 1
        if self.table.connections.get(fd) is not None and self.address(fd) == address:
            self.table.remove(fd)
        if self.on_inbound_cut is not None:
            self.on_inbound_cut(fd, address)

    def statistics(self) -> PeerStatistics:
        table = self.table
        pending = sum(1 for fd in table.connections if not table.has_session(fd))
        return PeerStatistics(connections=len(table.connections), pending=pending, evicted=self.evicted,
                              expired=self.expired, inbound_cut=self.inbound_cut)

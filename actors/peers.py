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
`inbound_bytes_max` is shut down, on a timer (`sample_inbound`), never per message.
"""

from __future__ import annotations

import array
import contextlib
import fcntl
import logging
import os
import socket
import struct
import termios
from dataclasses import dataclass
from typing import Any

import zmq
from zmq.utils.monitor import parse_monitor_message

from danube_zmq.actors.metrics import METRICS

log = logging.getLogger("danube_zmq.peers")

Address = tuple[object, ...] | str

# struct tcp_info (linux/tcp.h): tcpi_bytes_received follows tcpi_bytes_acked at 120.
_TCPI_BYTES_RECEIVED = 128
_TCP_INFO_SIZE = 136
# What a peer sends besides the frames the owner is handed: the ZMTP greeting (64
# bytes), READY with its metadata, and commands (a ZMTP heartbeat PING is ~10 bytes).
INBOUND_SLACK_BYTES = 64 * 1024


def zmtp_frame_bytes(size: int) -> int:
    """Bytes a ZMTP 3 frame of `size` bytes takes on the wire (flags, short or long size)."""
    return size + (2 if size < 256 else 9)


def inbound_held(fd: int, handed: int) -> int | None:
    """Bytes received on TCP socket `fd` and read by libzmq that were not handed to the
    owner (`handed`, ZMTP framing included); None if `fd` is no TCP socket."""
    try:
        # Never closed; EBADF when libzmq closed `fd` since the sampler listed it.
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, 0, fileno=fd)
    except OSError:
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


def peer_address(fd: int) -> Address | None:
    """The remote address of socket `fd`, or None if it is not a connected socket."""
    try:
        sock = socket.socket(fileno=os.dup(fd))
    except OSError:
        return None
    try:
        return sock.getpeername()
    except OSError:
        return None
    finally:
        sock.close()


def shutdown_peer(fd: int, address: Address | None) -> bool:
    """Shut the connection on `fd` down if it still leads to `address`; True if done."""
    try:
        sock = socket.socket(fileno=os.dup(fd))
    except OSError:
        return False
    try:
        if address is not None and sock.getpeername() != address:
            return False
        sock.shutdown(socket.SHUT_RDWR)
        return True
    except OSError:
        return False
    finally:
        sock.close()


@dataclass(slots=True)
class _Connection:
    address: Address | None
    idle_since_ms: int  # accepted, or last seen with a session


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
    in it is pending. When a connection is accepted while `pending_max` are pending,
    the oldest pending one is shut down (so a flood of idle connections cannot lock
    real clients out: they send `Connect` at once); a pending one idle for
    `timeout_ms` is shut down then.
    """

    def __init__(self, ctx: zmq.Context[Any], sock: zmq.Socket[Any], name: str, sessions: dict[int, Address | None],
                 *, pending_max: int, timeout_ms: int, inbound_bytes_max: int) -> None:
        self.name = name
        self.pending_max = pending_max
        self.timeout_ms = timeout_ms
        self.inbound_bytes_max = inbound_bytes_max
        self.sessions = sessions
        self.evicted = 0
        self.expired = 0
        self.inbound_cut = 0
        # Bytes handed to the owner per descriptor (ZMTP framing included), added by the
        # owner as it reads (`handed[fd] = handed.get(fd, 0) + zmtp_frame_bytes(n)`).
        # Not reset on accept: the owner may read before the monitor's event is taken.
        self.handed: dict[int, int] = {}
        self._connections: dict[int, _Connection] = {}  # in accept order
        endpoint = f"inproc://monitor-{name}-{id(self):x}"
        sock.monitor(endpoint, zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED | zmq.EVENT_CLOSED)
        monitor = ctx.socket(zmq.PAIR)
        monitor.setsockopt(zmq.LINGER, 0)
        # Events are dropped when this queue is full; it holds small frames only.
        monitor.setsockopt(zmq.RCVHWM, 100_000)
        monitor.connect(endpoint)
        self.monitor = monitor
        self._monitor_sync = zmq.Socket.shadow(monitor.underlying)
        self._sock = sock

    def close(self) -> None:
        with contextlib.suppress(zmq.ZMQError):
            self._sock.disable_monitor()
        self.monitor.close(linger=0)

    def _has_session(self, fd: int, connection: _Connection) -> bool:
        return fd in self.sessions and self.sessions[fd] == connection.address

    def drain(self, now_ms: int, events_max: int = 512) -> None:
        """Take the monitor's events: count accepted connections, forget closed ones."""
        for _ in range(events_max):
            try:
                frames = self._monitor_sync.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            event = parse_monitor_message(frames)
            fd = event["value"]
            if event["event"] != zmq.EVENT_ACCEPTED:
                self._connections.pop(fd, None)
                self.handed.pop(fd, None)
                continue
            pending = [f for f, c in self._connections.items() if not self._has_session(f, c)]
            if len(pending) >= self.pending_max:
                oldest = pending[0]
                connection = self._connections.pop(oldest)
                if shutdown_peer(oldest, connection.address):
                    self.evicted += 1
                    METRICS.idle_connections_cut.labels(self.name, "evicted").inc()
                    log.warning("%d connections have sent no Connect (connections_pending_max): the oldest, from %s,"
                                " is disconnected", len(pending), connection.address)
            self._connections[fd] = _Connection(peer_address(fd), now_ms)

    def review(self, now_ms: int) -> None:
        """Shut down connections that have had no session for `timeout_ms`."""
        for fd, connection in list(self._connections.items()):
            if self._has_session(fd, connection):
                connection.idle_since_ms = now_ms
            elif now_ms - connection.idle_since_ms >= self.timeout_ms:
                del self._connections[fd]
                if shutdown_peer(fd, connection.address):
                    self.expired += 1
                    METRICS.idle_connections_cut.labels(self.name, "expired").inc()
                    log.warning("connection from %s sent no Connect within %d ms: disconnected", connection.address,
                                self.timeout_ms)

    def address(self, fd: int) -> Address | None:
        """The peer address recorded when `fd` was accepted (None if not known yet)."""
        connection = self._connections.get(fd)
        return None if connection is None else connection.address

    def touch(self, fd: int, now_ms: int) -> None:
        """The connection on `fd` is in use: its idle deadline starts again."""
        connection = self._connections.get(fd)
        if connection is not None:
            connection.idle_since_ms = now_ms

    def sample_inbound(self) -> list[int]:
        """Shut down connections for which libzmq holds more than `inbound_bytes_max`
        unread by the owner (see the module docstring); their descriptors. One
        getsockopt per connection; FIONREAD and getpeername only for one over budget."""
        cut: list[int] = []
        budget = self.inbound_bytes_max + INBOUND_SLACK_BYTES
        handed = self.handed
        for fd, connection in list(self._connections.items()):
            held = inbound_held(fd, handed.get(fd, 0))
            if held is None or held <= budget:
                continue
            held -= unread_bytes(fd)
            if held <= budget:
                continue
            del self._connections[fd]
            if shutdown_peer(fd, connection.address):
                self.inbound_cut += 1
                METRICS.inbound_overrun_cut.labels(self.name).inc()
                cut.append(fd)
                log.warning("connection from %s to the %s port holds %d bytes the broker has not been handed (an"
                            " unfinished multipart message?), over inbound_bytes_per_connection_max (%d):"
                            " disconnected", connection.address, self.name, held, self.inbound_bytes_max)
        return cut

    def statistics(self) -> PeerStatistics:
        pending = sum(1 for f, c in self._connections.items() if not self._has_session(f, c))
        return PeerStatistics(connections=len(self._connections), pending=pending, evicted=self.evicted,
                              expired=self.expired, inbound_cut=self.inbound_cut)

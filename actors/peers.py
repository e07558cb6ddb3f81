"""The TCP connections behind a ZeroMQ socket, as far as the gateway can act on them.

A ROUTER socket cannot close one peer's connection. libzmq does tell which file
descriptor a message came from (ZMQ_SRCFD) and, through a socket monitor, which
descriptors it accepted and closed; shutting such a descriptor down (on a dup of it,
never closing libzmq's own) makes libzmq see the peer hang up: it closes the
connection itself and drops whatever it queued for that peer.

A descriptor number is reused once libzmq closes it, so every shutdown first checks
that the descriptor still leads to the peer address recorded when it was accepted.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
from dataclasses import dataclass
from typing import Any

import zmq
from zmq.utils.monitor import parse_monitor_message

log = logging.getLogger("danube_zmq.peers")

Address = tuple[object, ...] | str


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
                 *, pending_max: int, timeout_ms: int) -> None:
        self.pending_max = pending_max
        self.timeout_ms = timeout_ms
        self.sessions = sessions
        self.evicted = 0
        self.expired = 0
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
                continue
            pending = [f for f, c in self._connections.items() if not self._has_session(f, c)]
            if len(pending) >= self.pending_max:
                oldest = pending[0]
                connection = self._connections.pop(oldest)
                if shutdown_peer(oldest, connection.address):
                    self.evicted += 1
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
                    log.warning("connection from %s sent no Connect within %d ms: disconnected", connection.address,
                                self.timeout_ms)

    def statistics(self) -> PeerStatistics:
        pending = sum(1 for f, c in self._connections.items() if not self._has_session(f, c))
        return PeerStatistics(connections=len(self._connections), pending=pending, evicted=self.evicted,
                              expired=self.expired)

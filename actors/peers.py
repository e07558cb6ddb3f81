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

import os
import socket

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

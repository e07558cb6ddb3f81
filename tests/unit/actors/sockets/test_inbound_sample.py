"""The inbound-byte sampler of a port (`actors/sockets/peers.py`) on descriptors libzmq closed
between the sampler listing them and reading their TCP counters."""

from __future__ import annotations

import socket

from danube_zmq.actors.sockets.peers import inbound_held


def test_a_descriptor_closed_before_it_is_sampled_is_skipped() -> None:
    """A connection whose descriptor libzmq has just closed reads as no TCP socket
    (None), not as an OSError: the admin gateway's Tick raised EBADF from it during the
    100,000-partition benchmark, and the restarted gateway answered nothing after."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    fd = sock.fileno()
    sock.close()
    assert inbound_held(fd, 0) is None


def test_an_open_tcp_socket_is_sampled() -> None:
    """A live TCP socket's counters are read: nothing received, nothing handed."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        assert inbound_held(sock.fileno(), 0) == 0

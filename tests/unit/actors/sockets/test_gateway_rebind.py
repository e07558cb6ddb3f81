"""A gateway restarted after a failure binds its port again (actors/sockets/gateway.py)."""

from __future__ import annotations

import asyncio
import socket

import pytest
import zmq
import zmq.asyncio

from danube_zmq.actors.sockets.gateway import bind_or_close
from danube_zmq.transport.errors import Unavailable


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


async def test_a_port_still_held_by_the_old_listener_is_bound_once_it_is_freed() -> None:
    """libzmq frees a closed socket's listener after `close` returns: a restarted
    gateway's bind meeting "address in use" tries again and takes the port once the old
    listener lets go, instead of failing its start (which left a dead admin port)."""
    ctx = zmq.asyncio.Context()
    endpoint = f"tcp://127.0.0.1:{_free_port()}"
    old = ctx.socket(zmq.ROUTER)
    old.bind(endpoint)
    new = ctx.socket(zmq.ROUTER)
    try:
        asyncio.get_running_loop().call_later(0.3, old.close, 0)
        await bind_or_close(new, endpoint, "client", rebind_wait_s=10.0)
        assert new.getsockopt(zmq.LAST_ENDPOINT).decode() == endpoint
    finally:
        new.close(linger=0)
        old.close(linger=0)
        ctx.term()


async def test_a_port_held_past_the_wait_is_a_clear_error() -> None:
    """A port another listener keeps is UNAVAILABLE naming the endpoint, after the wait."""
    ctx = zmq.asyncio.Context()
    endpoint = f"tcp://127.0.0.1:{_free_port()}"
    holder = ctx.socket(zmq.ROUTER)
    holder.bind(endpoint)
    sock = ctx.socket(zmq.ROUTER)
    try:
        with pytest.raises(Unavailable, match="cannot listen for admin connections on " + endpoint):
            await bind_or_close(sock, endpoint, "admin", rebind_wait_s=0.2)
        assert sock.closed
    finally:
        holder.close(linger=0)
        ctx.term()

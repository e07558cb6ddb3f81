"""Why a connection's ZMTP handshake failed, told at once instead of a silent timeout.

A plaintext client against a CURVE broker (or the reverse) and a CURVE client with the
wrong server key never get an answer: libzmq drops the connection and retries forever.
A client watches its socket's handshake events (a socket monitor) until the first
handshake succeeds, and fails its first `Connect` with the cause named. After that the
monitor is closed: nothing is watched on the path of messages.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Awaitable
from typing import Any, TypeVar

import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from danube_zmq.transport.errors import DanubeError, Unauthenticated

__all__ = ["HandshakeWatch", "race_handshake"]

T = TypeVar("T")

_EVENTS = (zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
           | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_AUTH)
_ids = itertools.count(1)


class HandshakeWatch:
    """Watches `sock`'s handshakes; open it before `sock.connect`. `failure()` returns the
    first failure as a `DanubeError` and never returns once a handshake succeeded."""

    def __init__(self, sock: zmq.Socket[Any], context: zmq.asyncio.Context, *, url: str, curve: bool) -> None:
        self.url = url
        self.curve = curve
        self._sock: zmq.Socket[Any] | None = sock
        address = f"inproc://danube-handshake-{id(self):x}-{next(_ids)}"
        sock.monitor(address, _EVENTS)
        self._monitor: zmq.asyncio.Socket | None = context.socket(zmq.PAIR)
        self._monitor.setsockopt(zmq.LINGER, 0)
        self._monitor.connect(address)

    async def failure(self) -> DanubeError:
        while self._monitor is not None:
            event = parse_monitor_message(await self._monitor.recv_multipart())
            kind, value = event["event"], event["value"]
            if kind == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self.close()
                break
            return self._error(kind, value)
        await asyncio.get_running_loop().create_future()  # succeeded: nothing more to say
        raise AssertionError("unreachable")

    def _error(self, kind: int, value: int) -> DanubeError:
        # Which end sees the mismatch first is a race: the side that reads the other's
        # greeting reports MECHANISM_MISMATCH, the other sees its connection dropped
        # mid-handshake (NO_DETAIL). A CURVE server that cannot open a client's HELLO (a
        # wrong server key) drops it silently too.
        mismatch = kind == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL and value == zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH
        if not self.curve and (mismatch or kind == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL):
            return Unauthenticated(f"the broker at {self.url} requires CURVE:"
                                   " give server_public_key / DANUBE_SERVER_KEY")
        if mismatch:
            return Unauthenticated(f"the broker at {self.url} does not use CURVE (security.mode none):"
                                   " connect without server_public_key / DANUBE_SERVER_KEY")
        if kind == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
            return Unauthenticated(f"the broker at {self.url} refused this client's CURVE key (ZAP status {value})")
        if kind == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL:
            return Unauthenticated(f"CURVE handshake with {self.url} failed: wrong server key?"
                                   " (or the broker does not use CURVE)")
        try:
            name = zmq.Event(value).name if kind == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL else str(value)
        except ValueError:
            name = str(value)
        return Unauthenticated(f"ZMTP handshake with {self.url} failed ({zmq.Event(kind).name}: {name})")

    def close(self) -> None:
        """Stop watching; idempotent, and safe after the socket closed."""
        if self._sock is not None:
            if not self._sock.closed:
                try:
                    self._sock.disable_monitor()
                except zmq.ZMQError:
                    pass
            self._sock = None
        if self._monitor is not None:
            self._monitor.close(linger=0)
            self._monitor = None


async def race_handshake(watch: HandshakeWatch, connect: Awaitable[T]) -> T:
    """`connect`'s result, or the handshake's failure raised as soon as libzmq reports it
    (`connect` is then cancelled). The watch is closed either way."""
    work = asyncio.ensure_future(connect)
    failed = asyncio.ensure_future(watch.failure())
    try:
        await asyncio.wait({work, failed}, return_when=asyncio.FIRST_COMPLETED)
        if not work.done():
            work.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await work
            raise failed.result()
        return work.result()
    finally:
        for task in (work, failed):
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await failed
        watch.close()

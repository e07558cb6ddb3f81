"""One client connection to one broker: a zmq DEALER speaking `CLIENT_PROTOCOL`.

A connection owns three things: request/reply matching (a request id per request, a
future per id, a deadline per future), liveness (a `Ping` every heartbeat interval;
silence for the broker's session timeout means the connection is lost) and recovery
(re-handshake with backoff on the same socket, whose fixed identity lets the broker
tell a reconnect from a newcomer). Pushes (`Deliver`, `ProducerClosed`,
`ConsumerClosed`, `SeekReset`) go to the producer or consumer registered under their id.

Producers and consumers on a connection are its *listeners*: told when it is lost
(their broker-side ids are void), restored (re-attach) or closed for good (fail).

Lifecycle: `start()` (socket + first handshake) ... `close()`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
import secrets
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Protocol

import zmq
import zmq.asyncio

from danube_zmq.client.budget import Budget
from danube_zmq.client.errors import AlreadyClosed, ConnectionLost, copy_error
from danube_zmq.client.retry import BACKOFF_MS_MAX, BACKOFF_MS_MIN, backoff_ms
from danube_zmq.clock import Clock
from danube_zmq.rpc.tokens import TokenSource
from danube_zmq.security.curve import ClientCurve
from danube_zmq.security.handshake import HandshakeWatch, race_handshake
from danube_zmq.transport.client_protocol import (
    CLIENT_PROTOCOL,
    ConsumerClosed,
    Deliver,
    ProducerClosed,
    SeekReset,
)
from danube_zmq.transport.codec import Message
from danube_zmq.transport.common import PROTOCOL_VERSION, Connect, Connected, Error, Ping, Pong
from danube_zmq.transport.errors import (
    DanubeError,
    ErrorCode,
    InternalError,
    InvalidArgument,
    Timeout,
    Unavailable,
    UnsupportedVersion,
    error_from_code,
)

log = logging.getLogger("danube_zmq.client")

# Frames the receive loop handles before yielding to the loop's other tasks.
_RECEIVE_BATCH = 256
_recv = zmq.backend.Socket.recv
# How often, per request timeout, pending `request_nowait` requests are checked for it.
_SWEEPS_PER_TIMEOUT = 8

ROUND_REQUESTS_MAX = 64
"""Requests one write round sends as one ZeroMQ message at most (every broker takes
64: docs/protocol.md, section 1); a round of more goes as several messages."""

WRITE_LINGER_US_DEFAULT = 1_000
"""How long a write round waits for more requests while an earlier one still awaits
its reply (see `Connection._try_send`)."""

# pyzmq's flags as plain ints: its enum.Flag operators cost a Python call per send.
_NOBLOCK = int(zmq.NOBLOCK)
_NOBLOCK_MORE = int(zmq.NOBLOCK | zmq.SNDMORE)
_MORE = int(zmq.SNDMORE)
_EVENTS = int(zmq.EVENTS)
_POLLIN = int(zmq.POLLIN)
_BLOCKED_RETRY_S = 0.01  # a round refused at the high-water mark is tried again this soon, should the FD's edge be missed

FRAME_BYTES_MAX_DEFAULT = 16 * 1024 * 1024
"""The broker's frame_bytes_max before `Connected` tells us its own (its default)."""
DELIVER_ROOM_BYTES = 1024 * 1024
"""The socket's inbound cap (ZMQ_MAXMSGSIZE) is the broker's frame_bytes_max and this: a
`Deliver` adds topic and producer names to the batch it carries (docs/protocol.md, 3)."""

HEARTBEAT_INTERVAL_MS_DEFAULT = 1_000
"""Only used before the first handshake; afterwards the broker's value applies."""

IDENTITY_BYTES = 16


def new_identity() -> bytes:
    """A routing id for a client socket: 128 bits from `secrets`. The broker never lets a
    second connection displace a live one with the same id, but an id still names a
    session, so it must not be guessable from a seeded `random`. Never a leading zero
    byte (libzmq's generated ids start with one)."""
    while True:
        identity = secrets.token_bytes(IDENTITY_BYTES)
        if identity[0]:
            return identity

# How the broker says "I have no session for this socket" (it restarted or dropped us).
# The protocol has no dedicated code for it, so this is matched on the message text of
# an UNAVAILABLE error; see `is_session_error`.
_SESSION_ERROR_PHRASES = ("not connected", "not established", "connect first", "no session", "unknown session")


def is_session_error(error: Error) -> bool:
    if error.code != ErrorCode.UNAVAILABLE:
        return False
    text = error.message.lower()
    return any(phrase in text for phrase in _SESSION_ERROR_PHRASES)


def exception_from_error(error: Error) -> DanubeError:
    exc = error_from_code(error.code, error.message)
    if error.redirect_url:
        exc.redirect_url = error.redirect_url  # type: ignore[attr-defined]
    return exc


@dataclass(frozen=True, slots=True)
class BrokerLimits:
    """What `Connected` told us; the client keeps to these limits."""

    broker_id: int
    broker_url: str
    frame_bytes_max: int
    message_bytes_max: int
    heartbeat_interval_ms: int
    session_timeout_ms: int


@dataclass(frozen=True, slots=True)
class ConnectionStatistics:
    url: str
    state: str
    handshakes: int
    connections_lost: int
    requests_sent: int
    requests_pending: int
    requests_timed_out: int
    frames_received: int
    frames_dropped: int
    pushes_unroutable: int
    replies_late: int
    rounds_sent: int = 0  # ZeroMQ messages sent, each one write round (or a part of one)
    token_renewals: int = 0  # sessions opened again with a provider's new token after UNAUTHENTICATED


class TurnCut(Protocol):
    """What `Connection.cut_soon` cuts: a producer's partition."""

    def cut_if_open(self, batch: object) -> None: ...


class ConnectionListener(Protocol):
    def connection_lost(self, connection: Connection, error: DanubeError) -> None: ...

    def connection_restored(self, connection: Connection) -> None: ...

    def connection_closed(self, connection: Connection, error: DanubeError) -> None: ...


class ProducerHandler(Protocol):
    def on_producer_closed(self, reason: str, reattach: bool) -> None: ...


class ConsumerHandler(Protocol):
    def on_deliver(self, msg: Deliver) -> None: ...

    def on_consumer_closed(self, reason: str, reattach: bool) -> None: ...

    def on_seek_reset(self, offset: int) -> None: ...


class Connection:
    """A DEALER connection to one broker URL. Not thread-safe: one event loop."""

    def __init__(
        self,
        url: str,
        *,
        context: zmq.asyncio.Context,
        client_name: str,
        request_timeout_ms: int,
        pending_requests_max: int,
        reconnect_attempts_max: int,
        socket_hwm_messages: int,
        clock: Clock,
        rng: random.Random,
        write_linger_us: int = WRITE_LINGER_US_DEFAULT,
        curve: ClientCurve | None = None,
        tokens: TokenSource | None = None,
    ) -> None:
        assert request_timeout_ms > 0 and pending_requests_max > 0 and reconnect_attempts_max > 0
        assert write_linger_us >= 0
        self.url = url
        self.client_name = client_name
        self._context = context
        self._request_timeout_ms = request_timeout_ms
        self._pending_requests_max = pending_requests_max
        self._reconnect_attempts_max = reconnect_attempts_max
        self._socket_hwm_messages = socket_hwm_messages
        self._clock = clock
        self._rng = rng
        self._curve = curve  # None: plaintext (the broker's security.mode none)
        self._tokens = tokens  # None: Connect carries no token
        self._token_renewals = 0

        self._socket: zmq.Socket | None = None
        self._frame_cap = 0  # the socket's ZMQ_MAXMSGSIZE
        # The socket's ZMQ_FD is watched by the event loop: its callback reads what came
        # at once (`_read`), and flushes a round waiting for room. No receive task: a
        # task's wake-up per readiness (an Event, a future, a step) cost the producer
        # about a fifth of its CPU per message at 5k msg/s.
        self._reading_fd: int | None = None
        self._read_handle: asyncio.Handle | None = None
        self._sweep_handle: asyncio.TimerHandle | None = None  # `request_nowait`'s timeouts
        self._send_waiters: list[asyncio.Future[None]] = []
        # The write round: frames written since the last flush, sent as one ZeroMQ
        # message (a part each) at the end of the loop's turn, or after the linger.
        self._write_linger_s = write_linger_us / 1e6
        self._round: list[bytes] = []
        self._round_bytes = 0
        self._flush_handle: asyncio.Handle | None = None
        self._lingering = False  # the flush waits for the linger, not the turn's end
        # Producers' batches to cut at the end of this turn (`cut_soon`), before the round
        # leaves: cut and sent in one callback, where each took a turn of its own.
        self._turn_cuts: list[tuple[TurnCut, object]] = []
        self._turn_handle: asyncio.Handle | None = None
        self._ending_turn = False
        self._write_blocked = False  # the socket refused the round (high-water mark)
        self._flushed_through = 0  # every request id up to this one has left in a round
        self._rounds_sent = 0
        self._state = "new"  # new -> ready <-> reconnecting -> closed
        self._closed_error: DanubeError | None = None
        self._limits: BrokerLimits | None = None
        self._ready = asyncio.Event()  # set when ready, and when closed (to wake waiters)
        self._slots = Budget(pending_requests_max)
        self._next_request_id = 1
        self._session_request_id = 0  # request id of the Connect that opened this session
        self._pending: dict[int, asyncio.Future[Message] | _ReplyHandler] = {}
        self._last_rx_ms = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._reconnect_task: asyncio.Task[None] | None = None
        # Ordered sets (dict keys): listeners are told in the order they attached.
        self._listeners: dict[ConnectionListener, None] = {}
        self._producers: dict[int, ProducerHandler] = {}
        self._consumers: dict[int, ConsumerHandler] = {}

        self._handshakes = 0
        self._connections_lost = 0
        self._requests_sent = 0
        self._requests_timed_out = 0
        self._frames_received = 0
        self._frames_dropped = 0
        self._pushes_unroutable = 0
        self._replies_late = 0

    # ---------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        """Open the socket and complete the first handshake (one attempt, bounded by the
        request timeout). Raises the broker's error or `Timeout`."""
        assert self._state == "new"
        # A plain socket on the same libzmq context: its FD is watched directly, without
        # zmq.asyncio's future and poller registration per receive (a fifth of a client's
        # loop at 5k msg/s).
        sock = self._open_socket(FRAME_BYTES_MAX_DEFAULT + DELIVER_ROOM_BYTES)
        # Watched until the first handshake: a refused one (CURVE against plaintext, a wrong
        # server key) fails start() at once with its cause; later ones are not watched.
        watch = HandshakeWatch(sock, self._context, url=self.url, curve=self._curve is not None)
        try:
            sock.connect(self.url)
        except zmq.ZMQError as exc:
            watch.close()
            sock.close(linger=0)
            self._state = "closed"
            raise InvalidArgument(f"cannot connect to {self.url!r}: {exc}") from None
        self._socket = sock
        self._start_reading()
        try:
            await race_handshake(watch, self._handshake())
        except BaseException as exc:
            error = exc if isinstance(exc, DanubeError) else AlreadyClosed("connection start cancelled")
            await self._shutdown(error)
            raise
        self._spawn(self._heartbeat_loop(), "heartbeat")

    def _open_socket(self, frame_cap: int) -> zmq.Socket:
        """A DEALER with a new identity whose inbound frame cap (ZMQ_MAXMSGSIZE) is
        `frame_cap`, not connected yet."""
        # A plain socket on the same libzmq context: its FD is watched directly, without
        # zmq.asyncio's future and poller registration per receive (a fifth of a client's
        # loop at 5k msg/s).
        sock = zmq.Context.shadow(self._context.underlying).socket(zmq.DEALER)
        sock.setsockopt(zmq.IDENTITY, new_identity())
        sock.setsockopt(zmq.LINGER, 0)  # closing must never hang on unsent frames
        sock.setsockopt(zmq.SNDHWM, self._socket_hwm_messages)
        sock.setsockopt(zmq.RCVHWM, self._socket_hwm_messages)
        sock.setsockopt(zmq.MAXMSGSIZE, frame_cap)
        # zmq's own TCP reconnect follows the same 100 ms -> 5 s curve as our handshakes.
        sock.setsockopt(zmq.RECONNECT_IVL, BACKOFF_MS_MIN)
        sock.setsockopt(zmq.RECONNECT_IVL_MAX, BACKOFF_MS_MAX)
        if self._curve is not None:
            self._curve.apply(sock)
        self._frame_cap = frame_cap
        return sock

    async def _replace_socket(self, frame_cap: int) -> None:
        """Close the socket and its session, and connect a new one capped at `frame_cap`.

        libzmq reads ZMQ_MAXMSGSIZE when a socket connects and its reconnects keep that
        value: setting it later changes nothing. A frame over the cap resets the TCP
        connection and the DEALER stops sending (libzmq 4.3), so a Deliver of a message
        larger than the cap took the connection down, its receipts with it, again at
        every redelivery: a send that hung in a reconnect loop (issue 38)."""
        assert self._socket is not None
        self._stop_reading()
        self._socket.close(linger=0)  # the broker ends the session on the disconnect
        self._round.clear()
        self._round_bytes = 0
        self._write_blocked = False
        self._socket = sock = self._open_socket(frame_cap)
        try:
            sock.connect(self.url)
        except zmq.ZMQError as exc:  # the URL connected a moment ago: not expected
            raise InternalError(f"cannot connect to {self.url!r} again: {exc}") from None
        self._start_reading()

    async def close(self) -> None:
        """Fail what is pending with `AlreadyClosed`, stop the tasks, close the socket."""
        await self._shutdown(AlreadyClosed(f"connection to {self.url} closed"))

    async def _shutdown(self, error: DanubeError) -> None:
        self._close_with(error)
        current = asyncio.current_task()
        tasks = [t for t in self._tasks if t is not current]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._wake_senders()
        self._stop_reading()
        if self._sweep_handle is not None:
            self._sweep_handle.cancel()
            self._sweep_handle = None
        if self._socket is not None:
            self._socket.close(linger=0)
            self._socket = None

    def _close_with(self, error: DanubeError) -> None:
        """Mark closed for good: fail pending requests, tell listeners, wake waiters."""
        if self._state == "closed":
            return
        was_ready = self._state == "ready"
        self._state = "closed"
        self._closed_error = error
        self._ready.set()
        self._fail_pending(error)
        self._producers.clear()
        self._consumers.clear()
        for listener in list(self._listeners):
            if was_ready:
                listener.connection_lost(self, error)
            listener.connection_closed(self, error)
        self._listeners.clear()
        for task in self._tasks:
            if task is not asyncio.current_task():
                task.cancel()

    @property
    def closed(self) -> bool:
        return self._state == "closed"

    @property
    def ready(self) -> bool:
        return self._state == "ready"

    @property
    def limits(self) -> BrokerLimits:
        """The broker's limits from the latest handshake (there is always one after start)."""
        assert self._limits is not None, "connection not started"
        return self._limits

    def statistics(self) -> ConnectionStatistics:
        return ConnectionStatistics(
            url=self.url,
            state=self._state,
            handshakes=self._handshakes,
            connections_lost=self._connections_lost,
            requests_sent=self._requests_sent,
            requests_pending=len(self._pending),
            requests_timed_out=self._requests_timed_out,
            frames_received=self._frames_received,
            frames_dropped=self._frames_dropped,
            pushes_unroutable=self._pushes_unroutable,
            replies_late=self._replies_late,
            rounds_sent=self._rounds_sent,
            token_renewals=self._token_renewals,
        )

    # ---------------------------------------------------------------- registration

    def add_listener(self, listener: ConnectionListener) -> None:
        self._listeners[listener] = None

    def remove_listener(self, listener: ConnectionListener) -> None:
        self._listeners.pop(listener, None)

    def register_producer(self, producer_id: int, handler: ProducerHandler) -> None:
        self._producers[producer_id] = handler

    def unregister_producer(self, producer_id: int, handler: ProducerHandler) -> None:
        if self._producers.get(producer_id) is handler:
            del self._producers[producer_id]

    def register_consumer(self, consumer_id: int, handler: ConsumerHandler) -> None:
        self._consumers[consumer_id] = handler

    def unregister_consumer(self, consumer_id: int, handler: ConsumerHandler) -> None:
        if self._consumers.get(consumer_id) is handler:
            del self._consumers[consumer_id]

    # ---------------------------------------------------------------- requests

    async def wait_ready(self) -> None:
        """Until the connection has a session (returns) or is closed for good (raises)."""
        while True:
            if self._closed_error is not None:
                raise copy_error(self._closed_error)
            if self._state == "ready":
                return
            await self._ready.wait()

    async def request(self, msg: Message | Callable[[int], Message], *, timeout_ms: int | None = None,
                      on_sent: Callable[[], None] | None = None) -> Message:
        """Send `msg` with a fresh request id and return the reply; an `Error` reply is
        raised as its exception class. `msg` may be a function building the message from
        its request id (cheaper than a copy of a frozen message). Waits for the session
        first, and for one of `pending_requests_max` slots; all of it within `timeout_ms`
        (default: the request timeout), after which `Timeout` is raised. `on_sent` runs
        once the frame is written to the connection's round, in order (a producer's next
        batch may then follow it)."""
        timeout_ms = timeout_ms or self._request_timeout_ms
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_ms / 1000
        request_id: int | None = None
        frames_at_send: int | None = None
        slot = False
        timer: asyncio.TimerHandle | None = None
        try:
            if self._state == "ready" and self._slots.try_take():
                slot = True  # the common case: no wait, so no timeout context for one
            else:
                async with asyncio.timeout_at(deadline):
                    await self.wait_ready()
                    await self._slots.take()
                    slot = True
                    await self.wait_ready()
            request_id = self._take_request_id()
            frame = self._encode_request(msg, request_id)
            future: asyncio.Future[Message] = loop.create_future()
            self._pending[request_id] = future
            frames_at_send = self._frames_received
            # One timer for the reply (an `asyncio.timeout` context costs ~6 µs a request).
            timer = loop.call_at(deadline, _expire, future)
            if not self._try_send(frame):
                async with asyncio.timeout_at(deadline):
                    await self._send_frame(frame)
            self._requests_sent += 1
            if on_sent is not None:
                on_sent()
            reply = await future
        except TimeoutError:
            self._timed_out(frames_at_send, timeout_ms)
            raise Timeout(f"no reply to {_type_name(msg)} from {self.url} within {timeout_ms} ms") from None
        finally:
            if timer is not None:
                timer.cancel()
            if request_id is not None:
                self._pending.pop(request_id, None)
            if slot:
                self._slots.give(1)
        if isinstance(reply, Error):
            raise exception_from_error(reply)
        return reply

    def request_nowait(self, build: Callable[[int], Message],
                       on_reply: Callable[[Message | None, DanubeError | None], None]) -> bool:
        """Send a request at once, without a task: only when the session is up, a slot is
        free and the socket takes the frame without waiting; otherwise send nothing and
        return False (then use `request`). `on_reply(reply, None)` or `on_reply(None,
        error)` runs exactly once, from the receive path itself: the reply (an `Error`
        reply as its exception), `Timeout` after the request timeout, or the connection's
        loss. A producer's batch goes this way, and the next batch can leave from inside
        the receipt's callback: no loop turns between them."""
        if self._state != "ready" or not self._slots.try_take():
            return False
        request_id = self._take_request_id()
        try:
            frame = self._encode_request(build, request_id)
            sent = self._try_send(frame)
        except DanubeError:
            sent = False  # `request` meets the same fault and reports it
        if not sent:
            self._slots.give(1)
            return False
        self._requests_sent += 1
        loop = asyncio.get_running_loop()
        self._pending[request_id] = _ReplyHandler(on_reply, self._frames_received,
                                                  loop.time() + self._request_timeout_ms / 1000)
        if self._sweep_handle is None:
            self._sweep_handle = loop.call_later(self._request_timeout_ms / 1000 / _SWEEPS_PER_TIMEOUT, self._sweep)
        return True

    def _sweep(self) -> None:
        """Time out the `request_nowait` requests past their deadline, oldest first (a
        timer each cost a producer's batch more than the rest of its bookkeeping); runs
        every timeout/`_SWEEPS_PER_TIMEOUT` while any is pending, so a reply is waited
        for up to that much longer than the timeout."""
        self._sweep_handle = None
        now = asyncio.get_running_loop().time()
        waiting = False
        for request_id, handler in list(self._pending.items()):
            if not isinstance(handler, _ReplyHandler):
                continue  # a `request`'s future: its own timer
            if handler.deadline > now:
                waiting = True
                break  # sent later than this one: not due either
            del self._pending[request_id]
            self._timed_out(handler.frames_at_send, self._request_timeout_ms)
            self._settle(handler, None, Timeout(f"no reply from {self.url} within {self._request_timeout_ms} ms"))
        if waiting and self._sweep_handle is None and self._state != "closed":
            self._sweep_handle = asyncio.get_running_loop().call_later(
                self._request_timeout_ms / 1000 / _SWEEPS_PER_TIMEOUT, self._sweep)

    def _timed_out(self, frames_at_send: int | None, timeout_ms: int) -> None:
        self._requests_timed_out += 1
        if frames_at_send is not None and self._frames_received == frames_at_send:
            # Not one frame (not even a Pong) since we sent: the broker is gone.
            self._lose(ConnectionLost(f"broker at {self.url} silent for {timeout_ms} ms"))

    def _settle(self, handler: _ReplyHandler, reply: Message | None, error: DanubeError | None) -> None:
        """A `request_nowait` request is over (already out of `_pending`): its slot back, its callback told."""
        self._slots.give(1)
        handler.call(reply, error)

    def _encode_request(self, msg: Message | Callable[[int], Message], request_id: int) -> bytes:
        if isinstance(msg, Message):
            msg = dataclasses.replace(msg, request_id=request_id)  # type: ignore[type-var]
        else:
            msg = msg(request_id)
        frame = CLIENT_PROTOCOL.encode(msg)
        self._check_frame(frame, msg)
        return frame

    async def send_oneway(self, msg: Message) -> None:
        """Send a message that has no reply (`Flow`); needs a session."""
        timeout_ms = self._request_timeout_ms
        try:
            async with asyncio.timeout(timeout_ms / 1000):
                await self.wait_ready()
                frame = CLIENT_PROTOCOL.encode(msg)
                self._check_frame(frame, msg)
                await self._send_frame(frame)
        except TimeoutError:
            raise Timeout(f"could not send {type(msg).__name__} to {self.url} within {timeout_ms} ms") from None

    def _check_frame(self, frame: bytes, msg: Message) -> None:
        # A frame over the broker's ZMQ_MAXMSGSIZE would make it drop the whole
        # connection, so refuse it here; producers size batches to stay well below.
        if self._limits is not None and len(frame) > self._limits.frame_bytes_max:
            raise InvalidArgument(
                f"{type(msg).__name__} of {len(frame)} bytes is over the broker's "
                f"frame_bytes_max {self._limits.frame_bytes_max} (its limits.frame_bytes_max)"
            )

    def _try_send(self, frame: bytes) -> bool:
        """Add `frame` to this write round; False when the socket refused the round (its
        high-water mark) and the round is full (in frames or bytes): then wait for it.

        A round leaves as one ZeroMQ message, a part per frame (docs/protocol.md, section
        1): at the end of the event loop's turn, or, when a request of an earlier round
        still awaits its reply, after `write_linger_us` or as soon as nothing earlier
        awaits one any more, whichever comes first (Nagle's rule per connection: a lone
        request goes at once, many small producers share one message and one broker
        wake-up). A round of `ROUND_REQUESTS_MAX` frames, or of the broker's
        `frame_bytes_max` bytes, leaves at once."""
        if self._socket is None or self._state == "closed":
            raise copy_error(self._closed_error or AlreadyClosed("connection closed"))
        out = self._round
        if self._write_blocked:
            if out and (len(out) >= ROUND_REQUESTS_MAX or self._round_bytes + len(frame) > self._round_bytes_max()):
                return False
            out.append(frame)
            self._round_bytes += len(frame)
            return True
        out.append(frame)
        self._round_bytes += len(frame)
        if len(out) >= ROUND_REQUESTS_MAX or self._round_bytes >= self._round_bytes_max():
            self._flush()
        elif self._flush_handle is None and not self._ending_turn:
            self._schedule_flush(at_once=False)
        return True

    def _schedule_flush(self, *, at_once: bool) -> None:
        """The round leaves after the linger when an earlier round still awaits its
        reply; else at the turn's end, or now (`at_once`: this is the turn's end)."""
        if self._write_linger_s and self._awaiting_earlier():
            self._lingering = True
            self._flush_handle = asyncio.get_running_loop().call_later(self._write_linger_s, self._flush)
        elif at_once:
            self._flush()
        else:
            self._lingering = False
            self._flush_handle = asyncio.get_running_loop().call_soon(self._flush)

    def cut_soon(self, cutter: TurnCut, batch: object) -> None:
        """`cutter.cut_if_open(batch)` at the end of this turn of the loop, then the
        round leaves (or lingers, as `_try_send` says): a batch started in this turn goes
        with what the turn added to it, in one callback for every producer."""
        self._turn_cuts.append((cutter, batch))
        if self._turn_handle is None:
            self._turn_handle = asyncio.get_running_loop().call_soon(self._end_turn)

    def _end_turn(self) -> None:
        self._turn_handle = None
        cuts, self._turn_cuts = self._turn_cuts, []
        self._ending_turn = True
        try:
            for cutter, batch in cuts:
                try:
                    cutter.cut_if_open(batch)
                except Exception:  # a bug of ours: the other producers' batches still go
                    log.exception("cutting a batch on %s failed", self.url)
        finally:
            self._ending_turn = False
        if self._round and self._flush_handle is None and not self._write_blocked:
            self._schedule_flush(at_once=True)

    def _awaiting_earlier(self) -> bool:
        """A request sent in an earlier round still awaits its reply (`_pending` is in
        request-id order: its oldest entry tells)."""
        pending = self._pending
        return bool(pending) and next(iter(pending)) <= self._flushed_through

    def _round_bytes_max(self) -> int:
        limits = self._limits
        return limits.frame_bytes_max if limits is not None else FRAME_BYTES_MAX_DEFAULT

    def _flush(self) -> None:
        """Put the write round on the socket: a ZeroMQ message of up to
        `ROUND_REQUESTS_MAX` frames and `frame_bytes_max` bytes at a time. At the
        high-water mark it stays, and goes when the socket's FD says there is room."""
        handle = self._flush_handle
        if handle is not None:
            handle.cancel()
            self._flush_handle = None
        self._lingering = False
        out = self._round
        sock = self._socket
        if sock is None or self._state == "closed":
            out.clear()
            self._round_bytes = 0
            return
        self._flushed_through = self._next_request_id - 1
        bytes_max = self._round_bytes_max()
        while out:
            count, size = 1, len(out[0])
            while count < len(out) and count < ROUND_REQUESTS_MAX and size + len(out[count]) <= bytes_max:
                size += len(out[count])
                count += 1
            try:
                if count == 1:
                    sock.send(out[0], _NOBLOCK, copy=False)
                else:
                    # Once a DEALER takes the first part, it takes the whole message.
                    sock.send(out[0], _NOBLOCK_MORE, copy=False)
                    for i in range(1, count - 1):
                        sock.send(out[i], _MORE, copy=False)
                    sock.send(out[count - 1], 0, copy=False)
            except zmq.Again:
                self._write_blocked = True
                self._flush_handle = asyncio.get_running_loop().call_later(_BLOCKED_RETRY_S, self._flush)
                return
            except zmq.ZMQError as exc:
                out.clear()
                self._round_bytes = 0
                self._lose(ConnectionLost(f"socket to {self.url} failed: {exc}"))
                return
            del out[:count]
            self._round_bytes -= size
            self._rounds_sent += 1
        self._round_bytes = 0
        if self._write_blocked:
            self._write_blocked = False
            self._wake_senders()
        # A send processes the socket's pending commands, which can take the FD's signal
        # for a frame that arrived meanwhile (the FD is edge-triggered): look for one.
        if sock.getsockopt(_EVENTS) & _POLLIN:
            self._read_soon()

    async def _send_frame(self, frame: bytes) -> None:
        while not self._try_send(frame):
            # The round is full and the socket at its high-water mark: wait for the
            # round to leave (`_flush` wakes us).
            waiter = asyncio.get_running_loop().create_future()
            self._send_waiters.append(waiter)
            await waiter

    def _on_socket_event(self) -> None:
        if self._write_blocked:
            self._flush()
        self._read()

    def _wake_senders(self) -> None:
        waiters, self._send_waiters = self._send_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def _take_request_id(self) -> int:
        request_id = self._next_request_id
        self._next_request_id += 1
        return request_id

    def _fail_pending(self, error: DanubeError) -> None:
        pending, self._pending = self._pending, {}
        for waiter in pending.values():
            if isinstance(waiter, _ReplyHandler):
                self._settle(waiter, None, copy_error(error))
            elif not waiter.done():
                waiter.set_exception(copy_error(error))

    # ---------------------------------------------------------------- session

    async def _handshake(self, timeout_ms: int | None = None) -> None:
        """One `Connect` round trip; on success the connection is ready. A broker whose
        frame_bytes_max is over the socket's cap gets a new socket with its cap, and a
        second `Connect`: a Deliver as large as the broker may send must get through."""
        limits = await self._connect_round_trip(timeout_ms)
        if limits.frame_bytes_max + DELIVER_ROOM_BYTES > self._frame_cap:
            await self._replace_socket(limits.frame_bytes_max + DELIVER_ROOM_BYTES)
            limits = await self._connect_round_trip(timeout_ms)
            if limits.frame_bytes_max + DELIVER_ROOM_BYTES > self._frame_cap:
                raise Unavailable(f"broker {self.url} changed its frame_bytes_max while connecting; try again")
        self._limits = limits
        self._last_rx_ms = self._clock.monotonic_ms()
        self._handshakes += 1
        self._state = "ready"
        self._ready.set()

    async def _connect_round_trip(self, timeout_ms: int | None) -> BrokerLimits:
        """`Connect` and its `Connected`: the broker's limits, checked."""
        request_id = self._take_request_id()
        future: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        timeout_ms = timeout_ms or self._request_timeout_ms
        try:
            async with asyncio.timeout(timeout_ms / 1000):
                # A provider is asked at every Connect: a reconnect may come after expiry.
                token = await self._tokens.get() if self._tokens is not None else None
                await self._send_frame(
                    CLIENT_PROTOCOL.encode(
                        Connect(request_id=request_id, protocol_version=PROTOCOL_VERSION, client_name=self.client_name,
                                auth_token=token)
                    )
                )
                reply = await future
        except TimeoutError:
            raise Timeout(f"no answer to Connect from {self.url} within {timeout_ms} ms") from None
        finally:
            self._pending.pop(request_id, None)
        if isinstance(reply, Error):
            raise exception_from_error(reply)
        if not isinstance(reply, Connected):
            raise InternalError(f"broker answered Connect with {type(reply).__name__}")
        if reply.protocol_version != PROTOCOL_VERSION:
            raise UnsupportedVersion(
                f"broker speaks protocol version {reply.protocol_version}, this client {PROTOCOL_VERSION}"
            )
        limits = BrokerLimits(
            broker_id=reply.broker_id,
            broker_url=reply.broker_url,
            frame_bytes_max=reply.frame_bytes_max,
            message_bytes_max=reply.message_bytes_max,
            heartbeat_interval_ms=reply.heartbeat_interval_ms,
            session_timeout_ms=reply.session_timeout_ms,
        )
        if min(limits.frame_bytes_max, limits.message_bytes_max, limits.heartbeat_interval_ms) <= 0 or (
            limits.session_timeout_ms <= limits.heartbeat_interval_ms
        ):
            raise InternalError(f"broker sent unusable limits: {limits}")
        self._session_request_id = request_id
        return limits

    def _lose(self, error: DanubeError) -> None:
        """The session is gone: fail what is in flight, tell listeners, start reconnecting."""
        if self._state != "ready":
            return
        log.warning("connection to %s lost: %s; reconnecting", self.url, error)
        self._connections_lost += 1
        self._state = "reconnecting"
        self._ready.clear()
        self._fail_pending(error)
        # Broker-side ids die with the session; listeners re-attach and re-register.
        self._producers.clear()
        self._consumers.clear()
        for listener in list(self._listeners):
            listener.connection_lost(self, error)
        self._reconnect_task = self._spawn(self._reconnect(), "reconnect")

    async def _reconnect(self) -> None:
        error: DanubeError = Unavailable(f"could not reconnect to {self.url}")
        # A live broker answers Connect at once; one that has not within its own session
        # timeout would have dropped us anyway, so try again (with backoff) sooner.
        assert self._limits is not None
        attempt_timeout_ms = min(self._request_timeout_ms, self._limits.session_timeout_ms)
        for attempt in range(self._reconnect_attempts_max):
            if attempt:
                await asyncio.sleep(backoff_ms(attempt - 1, self._rng) / 1000)
            try:
                await self._handshake(attempt_timeout_ms)
            except DanubeError as exc:
                if not exc.retriable:
                    self._close_with(exc)
                    return
                error = exc
                log.info("reconnect %d to %s failed: %s", attempt + 1, self.url, exc)
                continue
            log.info("reconnected to %s", self.url)
            for listener in list(self._listeners):
                listener.connection_restored(self)
            return
        self._close_with(
            Unavailable(f"gave up reconnecting to {self.url} after {self._reconnect_attempts_max} attempts: {error}")
        )

    # ---------------------------------------------------------------- tasks

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coro, name=f"danube-connection-{name}")
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            # A bug of ours: take the connection down so every user sees an error
            # instead of a silently dead receive loop.
            log.error("connection task %s crashed", task.get_name(), exc_info=exc)
            self._close_with(InternalError(f"client connection task {task.get_name()} crashed: {exc!r}"))

    def _start_reading(self) -> None:
        sock = self._socket
        assert sock is not None and self._reading_fd is None
        self._reading_fd = sock.FD
        asyncio.get_running_loop().add_reader(self._reading_fd, self._on_socket_event)
        self._read_soon()  # ZMQ_FD is edge-triggered: what came before is read now

    def _stop_reading(self) -> None:
        if self._read_handle is not None:
            self._read_handle.cancel()
            self._read_handle = None
        if self._reading_fd is not None:
            asyncio.get_running_loop().remove_reader(self._reading_fd)
            self._reading_fd = None

    def _read_soon(self) -> None:
        """Read on the loop's next turn (from a send path: reading there could hand a
        reply to the code that is sending, in the middle of its own frame)."""
        if self._read_handle is None and self._reading_fd is not None:
            self._read_handle = asyncio.get_running_loop().call_soon(self._read)

    def _read(self) -> None:
        """Handle what the socket holds, up to `_RECEIVE_BATCH` messages, then let the
        rest of the loop in. ZMQ_EVENTS is asked before each read (ZMQ_FD is
        edge-triggered; and a read that meets EAGAIN costs a ZMQError, twice the
        question), so the last question also leaves the FD armed for the next frame."""
        self._read_handle = None
        sock = self._socket
        if sock is None or self._state == "closed" or self._reading_fd is None:
            return
        try:
            for _ in range(_RECEIVE_BATCH):
                if not sock.getsockopt(_EVENTS) & _POLLIN:
                    return
                # Without a copy: a bytes copy of a large frame is an allocation that
                # faults its pages in (1 MiB: ~1 ms here). Part by part with the compiled
                # recv: `recv_multipart` asks RCVMORE through an enum per part.
                frame = _recv(sock, _NOBLOCK, False)
                frames = [frame]
                while frame.more:
                    frame = _recv(sock, 0, False)  # there: a message arrives whole
                    frames.append(frame)
                self._on_frames(frames)
                if sock is not self._socket or self._state == "closed":
                    return  # replaced or closed by what the frames said
            self._read_soon()  # a long run of frames: the rest on the next turn
        except zmq.Again:
            return
        except zmq.ZMQError as exc:
            if self._state != "closed" and sock is self._socket:
                self._close_with(InternalError(f"receive from {self.url} failed: {exc}"))
        except Exception as exc:
            # A bug of ours: take the connection down so every user sees an error
            # instead of a silently dead connection.
            log.error("reading from %s crashed", self.url, exc_info=exc)
            self._close_with(InternalError(f"client connection read crashed: {exc!r}"))

    def _on_frames(self, frames: list[zmq.Frame]) -> None:
        # The broker may send what it has for this connection in one ZeroMQ message, a
        # protocol frame per part (one send and one I/O-thread wake-up on its side for
        # them all; docs/protocol.md): each part is a frame of its own.
        self._last_rx_ms = self._clock.monotonic_ms()
        for frame in frames:
            self._frames_received += 1
            try:
                msg = CLIENT_PROTOCOL.decode(frame.buffer)
            except DanubeError as exc:
                self._frames_dropped += 1
                log.warning("dropped an undecodable frame from %s: %s", self.url, exc)
                continue
            self._dispatch(msg)
        if self._lingering and self._flush_handle is not None and not self._awaiting_earlier():
            self._flush()  # the replies the round waited on are in: no reason to linger

    def _dispatch(self, msg: Message) -> None:
        if isinstance(msg, Deliver):
            consumer = self._consumers.get(msg.consumer_id)
            if consumer is None:
                self._pushes_unroutable += 1
                return
            consumer.on_deliver(msg)
            return
        if isinstance(msg, SeekReset):
            consumer = self._consumers.get(msg.consumer_id)
            if consumer is None:
                self._pushes_unroutable += 1
                return
            consumer.on_seek_reset(msg.offset)
            return
        if isinstance(msg, ConsumerClosed):
            consumer = self._consumers.pop(msg.consumer_id, None)
            if consumer is None:
                self._pushes_unroutable += 1
                return
            consumer.on_consumer_closed(msg.reason, msg.reattach)
            return
        if isinstance(msg, ProducerClosed):
            producer = self._producers.pop(msg.producer_id, None)
            if producer is None:
                self._pushes_unroutable += 1
                return
            producer.on_producer_closed(msg.reason, msg.reattach)
            return
        if isinstance(msg, Pong):
            return
        request_id = getattr(msg, "request_id", None)
        if request_id is None:
            self._frames_dropped += 1
            log.warning("dropped unexpected %s from %s", type(msg).__name__, self.url)
            return
        if (
            isinstance(msg, Error)
            and is_session_error(msg)
            and self._state == "ready"
            # Answers to frames sent before the current Connect are about the old session.
            and request_id > self._session_request_id
        ):
            self._lose(ConnectionLost(f"broker at {self.url} has no session for us: {msg.message}"))
            return
        if (
            isinstance(msg, Error)
            and msg.code == ErrorCode.UNAUTHENTICATED
            and self._tokens is not None
            and self._tokens.renewable
            and self._state == "ready"
            and request_id > self._session_request_id
        ):
            # The session's token expired or was revoked: open the session again with a
            # new one, as after a reconnect (what was pending fails ConnectionLost, so it is
            # retried; producers and consumers re-attach). Without a provider the refusal
            # is the caller's, with the broker's reason.
            self._token_renewals += 1
            self._lose(ConnectionLost(f"broker at {self.url} refused the session's token: {msg.message};"
                                      " asking the token provider for a new one"))
            return
        waiter = self._pending.get(request_id)
        if waiter is None or waiter.done():
            self._replies_late += 1
            return
        if isinstance(waiter, _ReplyHandler):
            del self._pending[request_id]
            if isinstance(msg, Error):
                self._settle(waiter, None, exception_from_error(msg))
            else:
                self._settle(waiter, msg, None)
            return
        waiter.set_result(msg)

    async def _heartbeat_loop(self) -> None:
        while True:
            limits = self._limits
            interval_ms = limits.heartbeat_interval_ms if limits else HEARTBEAT_INTERVAL_MS_DEFAULT
            await asyncio.sleep(interval_ms / 1000)
            if self._state != "ready" or limits is None:
                continue
            silent_ms = self._clock.monotonic_ms() - self._last_rx_ms
            if silent_ms > limits.session_timeout_ms:
                self._lose(ConnectionLost(f"no frame from {self.url} for {silent_ms} ms"))
                continue
            frame = CLIENT_PROTOCOL.encode(Ping(request_id=self._take_request_id()))
            try:
                async with asyncio.timeout(interval_ms / 1000):
                    await self._send_frame(frame)
            except (TimeoutError, ConnectionLost):
                # A full send queue or a dead socket: the silence check above decides.
                continue


class _ReplyHandler:
    """A request sent with `request_nowait`: its callback, run once, and its timer."""

    __slots__ = ("deadline", "frames_at_send", "on_reply")

    def __init__(self, on_reply: Callable[[Message | None, DanubeError | None], None], frames_at_send: int,
                 deadline: float) -> None:
        self.on_reply: Callable[[Message | None, DanubeError | None], None] | None = on_reply
        self.frames_at_send = frames_at_send
        self.deadline = deadline  # the loop's time

    def done(self) -> bool:
        return self.on_reply is None

    def call(self, reply: Message | None, error: DanubeError | None) -> None:
        on_reply, self.on_reply = self.on_reply, None
        if on_reply is None:
            return
        try:
            on_reply(reply, error)
        except Exception:
            log.exception("reply callback %r raised", on_reply)


def _expire(future: asyncio.Future[Message]) -> None:
    if not future.done():
        future.set_exception(TimeoutError())


def _type_name(msg: Message | Callable[[int], Message]) -> str:
    return type(msg).__name__ if isinstance(msg, Message) else "the request"

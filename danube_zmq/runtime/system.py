"""The actor system of one broker process: spawn, stop, supervision, asks and timers.

Every actor group (an actor and its guests) has a mailbox (`mailbox.py`: queued
message objects, bounded per actor in messages and in bytes) that the group's one
task handles one message at a time. All actors of a broker run on one event loop, so a tell appends the message
to the target's mailbox and wakes its task: no socket between actors (until issue 20 a
tell crossed an `inproc://` PUSH/PULL pair and a routing callback: a libzmq send, two
receives and a loop wake-up per message, about a tenth of the broker's CPU per batch).
The message object itself is queued, not an encoded frame of it (an encode and a
decode per hop). Messages are frozen dataclasses of `transport/` types; an actor never
changes a message it got or one it told (its lists included), so nothing changeable is
shared. Frames (bytes) are still accepted (`tell_frame`: a timer's message, the
records a failed WAL flush left readable) and decoded here. A full mailbox refuses
more without holding up the others: `tell` never blocks (False when the mailbox is
full), `send` waits for room up to a deadline. Lanes (`lane.py`) carry raw frames to
an actor that owns a socket.

A child spawned with `share_mailbox=True` (a topic's subscriptions) is a guest of its
parent: an actor of its own (state, handlers, supervision, endpoint `<parent>/<n>`,
its own mailbox count) handled by its parent's task, and whose frames to and from its
host go on the group's local lane, handled before the next frame from outside. That
saves an event-loop wake-up per hop on the topic -> subscription path. The lane is bounded by what one handler emits (it is
drained before the next outside frame), and an ask inside the group is served in
place, since the one task that would answer it is the one asking.

A round's batches for an idle topic may be handled on the client gateway's task
instead (`handle_now`): the group still runs on one task at a time, in order, with the
same failure rule; it saves the two task switches a tell and its answers cost.

An ask (`ask`) wraps the message in `Request` with a correlation id; the handler's
return value resolves the asker's future as a `Reply`, so the asker's own mailbox is
not involved (an ask is a control-plane call; it blocks the asking handler until the
answer or the deadline).

One failure rule (`_run_handler`) for tells, asks, and the client and admin requests
an actor gets wrapped in `ClientRequest`/`AdminRequest` (unwrapped here into
`handle_<Type>(msg, origin)`): the handler's return value is the answer, a raised
`DanubeError` is an answer (to the asker, or an `Error` to the request's connection;
counted for a tell), a message with no handler is counted and answered with an error
where someone waits; anything else is answered INTERNAL where someone waits and is a
failure.

Supervision: a handler that fails is logged and counted, and the actor is rebuilt
from its factory (fresh state, same mailbox, children of the old instance stopped).
More than `restarts_max` restarts within `restart_window_ms` stops the actor and tells
its parent with `ChildStopped` (a topic drops a subscription, the broker a topic: each
comes back with its next use). A top-level actor (gateway, admin gateway, broker, load
manager, snapshots) has no parent to decide: its exhaustion is fatal, `on_fatal` is
called (logged CRITICAL) and the broker process exits non-zero for its supervisor to
restart it, rather than leave a dead service answering RESOURCE_EXHAUSTED forever.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import zmq
import zmq.asyncio

from danube_zmq.clock import Clock, TimerHandle
from danube_zmq.runtime.actor import CLIENT_PORT, REQUEST_PORTS, Actor, ActorStatistics, Origin, Port, Unrecognized
from danube_zmq.runtime.lane import Lanes
from danube_zmq.runtime.mailbox import Frame, Mailbox, message_bytes
from danube_zmq.runtime.metrics import RUNTIME_METRICS
from danube_zmq.runtime.request_tasks import answer_of
from danube_zmq.transport.codec import Message, peek_request_id
from danube_zmq.transport.common import Error
from danube_zmq.transport.errors import (
    DanubeError,
    ErrorCode,
    InternalError,
    ResourceExhausted,
    Timeout,
    Unavailable,
    error_from_code,
)
from danube_zmq.transport.internal_protocol import (
    INTERNAL_PROTOCOL,
    AdminRequest,
    ChildStopped,
    ClientRequest,
    ClientRequests,
    Reply,
    Request,
)

log = logging.getLogger("danube_zmq.actors")

# Frames one actor handles per wake-up before yielding to the others: fairness bound.
_DRAIN_MAX = 256
# pyzmq's constants as plain ints: its enum.Flag operators cost a Python call each.
_EVENTS = int(zmq.EVENTS)
_POLLIN = int(zmq.POLLIN)


# The running task by loop, as asyncio keeps it (3.11 and 3.12: a dict; None elsewhere).
_CURRENT_TASKS: dict[Any, asyncio.Task[Any]] | None = getattr(asyncio.tasks, "_current_tasks", None)


def _current_task_on(loop: asyncio.AbstractEventLoop | None,
                     tasks: dict[Any, asyncio.Task[Any]] | None = _CURRENT_TASKS) -> asyncio.Task[Any] | None:
    """`asyncio.current_task()` on the actors' `loop`, a fraction of its cost: on Python 3.11
    that is Python code around this dict lookup (the C one came in 3.12), and its
    `get_running_loop()` asks the kernel for the pid each call. `_try_push` asks per tell."""
    if tasks is None or loop is None:
        return asyncio.current_task()
    return tasks.get(loop)


@dataclass(slots=True)
class _Cell:
    """The system's record of one actor: its mailbox, task, lineage and counters."""

    endpoint: str
    name: str
    factory: Callable[[], Actor]
    parent: str | None
    header: bytes  # the actor's number, naming it among its host's guests
    instance: Actor
    task: asyncio.Task[None] | None = None
    # In spawn order; a dict so that a child leaving is O(1): with a list, stopping a
    # broker's 33,000 topic actors (each removing itself) took minutes after SIGTERM.
    children: dict[str, None] = field(default_factory=dict)
    restart_times_ms: deque[int] = field(default_factory=deque)
    handled: int = 0
    unrecognized: int = 0
    refused: int = 0  # messages whose handler raised a DanubeError (an answer, not a failure)
    failures: int = 0
    restarts: int = 0
    stopping: bool = False
    host: _Cell | None = None  # the cell whose task handles this guest
    guests: dict[bytes, _Cell] | None = None  # a host's guests, by header; None until its first
    queued: int = 0  # this actor's messages told and not yet handled
    queued_bytes: int = 0  # the bytes they carry (`mailbox.message_bytes`)
    # The group's mailbox (a guest's stays empty: its messages go to its host's).
    mailbox: Mailbox[_Cell] = field(default_factory=Mailbox)
    waiter: asyncio.Future[None] | None = None  # the group's task, while it waits for work
    lane: deque[list[bytes]] | None = None  # frames for the actor's socket (`open_lane`), if it has one
    timers: set[TimerHandle] = field(default_factory=set)  # the instance's timers not yet fired
    # A failure of a handler run by `handle_now` on another task (a group's cell): the
    # member and what failed, for the group's own task to restart it before anything else.
    failed: tuple[_Cell, str, Exception] | None = None

    @property
    def group(self) -> _Cell:
        """The cell that owns the socket and the task: the host, or this cell."""
        return self.host if self.host is not None else self


@dataclass(frozen=True, slots=True)
class SystemStatistics:
    actors: int
    failures: int
    restarts: int
    dead_letters: int
    mailbox_full_drops: int
    # What all mailboxes hold now (messages from outside their group).
    mailbox_messages: int = 0
    mailbox_bytes: int = 0


def _cancel_timers(cell: _Cell) -> None:
    for handle in cell.timers:
        handle.cancel()
    cell.timers.clear()


def _mailbox_only(instance: Actor) -> bool:
    """The actor polls no socket besides its mailbox (topics, subscriptions, ...)."""
    return type(instance).extra_sockets is Actor.extra_sockets


class ActorSystem:
    def __init__(
        self,
        context: zmq.asyncio.Context,
        *,
        clock: Clock,
        mailbox_messages_max: int,
        mailbox_bytes_max: int = 64 * 1024 * 1024,
        restarts_max: int = 5,
        restart_window_ms: int = 60_000,
        ask_timeout_ms: int = 10_000,
    ) -> None:
        assert mailbox_messages_max > 0 and mailbox_bytes_max > 0
        self.context = context
        # A sync view of the same libzmq context: inproc endpoints are shared, and
        # non-blocking sends need no future per message.
        self._sync_context = zmq.Context.shadow(context.underlying)
        self.clock = clock
        self.mailbox_messages_max = mailbox_messages_max
        self.mailbox_bytes_max = mailbox_bytes_max
        self.restarts_max = restarts_max
        self.restart_window_ms = restart_window_ms
        self.ask_timeout_ms = ask_timeout_ms
        # Well-known mailboxes: the gateway (actors that attach clients tell it) and
        # the broker actor (the gateways forward to it). Set by the owner at start; the
        # policy keeper's and the registry admin's by their parent, the broker actor.
        self.gateway_endpoint = ""
        self.broker_endpoint = ""
        self.snapshot_endpoint = ""
        self.load_manager_endpoint = ""
        self.policy_endpoint = ""
        self.registry_admin_endpoint = ""
        self._cells: dict[str, _Cell] = {}
        self._loop: asyncio.AbstractEventLoop | None = None  # the one the actors run on, once one runs
        self._lanes: Lanes[_Cell] = Lanes(self._sync_context, push_hwm=mailbox_messages_max, wake=self._wake)
        self._ids = itertools.count(1)
        self._correlation = itertools.count(1)
        self._asks: dict[int, asyncio.Future[Reply]] = {}
        self._posts: set[asyncio.Task[None]] = set()
        # True once `shutdown` began: the actors stop with the process, and what they
        # serve goes on when it starts again (or elsewhere).
        self.shutting_down = False
        # The group whose messages `handle_now` is handling on the caller's task: what its
        # members tell each other meanwhile goes on its local lane, as on its own task.
        self._inline: _Cell | None = None
        # The guest whose handler a host's tell is running at this moment (`_try_push`):
        # what it tells meanwhile takes the local lane, so no handler runs inside itself.
        self._direct: _Cell | None = None
        self.failures = 0
        self.restarts = 0
        self.dead_letters = 0
        self.mailbox_full_drops = 0
        # Called once a top-level actor exhausts its restarts, with why; the owner ends
        # the process (BrokerService). None: only logged.
        self.on_fatal: Callable[[str], None] | None = None

    # ----------------------------------------------------------------- lifecycle
    async def shutdown(self) -> None:
        self.shutting_down = True
        roots = [cell.endpoint for cell in self._cells.values() if cell.parent is None]
        for endpoint in reversed(roots):
            await self.stop(endpoint)
        for task in list(self._posts):
            task.cancel()
        for cell in self._cells.values():  # none left once the roots stopped; timers never outlive the system
            _cancel_timers(cell)
        self._lanes.close_sockets()
        for future in self._asks.values():
            if not future.done():
                future.set_exception(Unavailable("actor system shut down"))

    async def spawn(self, factory: Callable[[], Actor], *, name: str, parent: str | None = None,
                    share_mailbox: bool = False) -> str:
        """Start an actor; returns its endpoint (its address for `tell`). With
        `share_mailbox`, it is a guest of its parent's mailbox (see the module doc)."""
        if share_mailbox:
            return await self._spawn_guest(factory, name=name, parent=parent)
        number = next(self._ids)
        endpoint = f"actor-{number}"
        instance = self._instantiate(factory, endpoint, name)
        cell = _Cell(endpoint=endpoint, name=name, factory=factory, parent=parent, header=number.to_bytes(8, "little"),
                     instance=instance)
        self._cells[endpoint] = cell
        if parent is not None and parent in self._cells:
            self._cells[parent].children[endpoint] = None
        try:
            await instance.on_start()
        except BaseException:
            await self._discard(cell)
            raise
        cell.task = asyncio.create_task(self._run(cell), name=f"actor {name}")
        return endpoint

    async def _spawn_guest(self, factory: Callable[[], Actor], *, name: str, parent: str | None) -> str:
        host = self._cells.get(parent) if parent is not None else None
        if host is None or host.host is not None:
            raise ValueError(f"{name}: share_mailbox needs a live parent that owns its mailbox")
        number = next(self._ids)
        endpoint = f"{host.endpoint}/{number}"
        instance = self._instantiate(factory, endpoint, name)
        if not _mailbox_only(instance):
            raise ValueError(f"{name}: an actor that polls its own sockets cannot share a mailbox")
        cell = _Cell(endpoint=endpoint, name=name, factory=factory, parent=parent, header=number.to_bytes(8, "little"),
                     instance=instance, host=host)
        if host.guests is None:
            host.guests = {}
        host.guests[cell.header] = cell
        self._cells[endpoint] = cell
        host.children[endpoint] = None
        try:
            await instance.on_start()
        except BaseException:
            await self._discard(cell)
            raise
        return endpoint

    async def stop(self, endpoint: str, *, moving: bool = False, restarting: bool = False) -> None:
        """Stop an actor and, first, its children (newest first). `moving`: it goes on
        elsewhere (unloaded from this broker), so its `on_stop` tells clients to re-attach.
        `restarting`: its parent is being rebuilt after a failure, and it comes back with it."""
        cell = self._cells.get(endpoint)
        if cell is None or cell.stopping:
            return
        cell.stopping = True
        cell.instance.moving = moving
        cell.instance.restarting = cell.instance.restarting or restarting
        for child in reversed(list(cell.children)):
            await self.stop(child, moving=moving, restarting=restarting)
        if cell.task is not None and cell.task is not asyncio.current_task():
            cell.task.cancel()
            await asyncio.gather(cell.task, return_exceptions=True)
            # What the children said while stopping (final cursors, detach notices) is
            # in the mailbox: handle it before the actor's own on_stop.
            await self._drain_mailbox(cell)
        try:
            await cell.instance.on_stop()
        except Exception:
            log.exception("%s: on_stop failed", cell.name)
        self._answer_left(cell)
        await self._discard(cell)

    def _answer_left(self, cell: _Cell) -> None:
        """Answer UNAVAILABLE the client and admin requests left in a stopped actor's
        mailbox (told while it stopped, before its senders learned it): dropped with it,
        their clients would wait out their request timeout (a batch sent to a topic as it
        was unloaded: chaos B5)."""
        if cell.host is not None:
            return  # a guest's frames are in its host's mailbox, which goes on
        while (item := cell.mailbox.pop()) is not None:
            target, msg, _ = item
            if target is not cell:
                continue
            if type(msg) is bytes or type(msg) is memoryview:
                try:
                    msg = INTERNAL_PROTOCOL.decode(msg)
                except DanubeError:
                    continue
            envelopes = ([ClientRequest(identity=identity, frame=frame)
                          for identity, frame in zip(msg.identities, msg.frames, strict=True)]
                         if type(msg) is ClientRequests else [msg])
            for envelope in envelopes:
                port = REQUEST_PORTS.get(type(envelope))
                if port is None:
                    continue
                try:
                    request_id = getattr(port.protocol.decode(envelope.frame), "request_id", None)
                except DanubeError:
                    request_id = peek_request_id(envelope.frame)
                if request_id is not None:  # a Flow has nobody to answer
                    self._answer(port, envelope.identity, Error(
                        request_id=request_id, code=ErrorCode.UNAVAILABLE,
                        message=f"{cell.name} stopped (moved, closed or restarted) before this request was"
                                " handled; send it again"))

    def actor(self, endpoint: str) -> Actor:
        """The live instance behind an endpoint: for the system's owner at start-up
        (bound addresses) and for tests, never for actors (they share nothing)."""
        return self._cells[endpoint].instance

    def is_alive(self, endpoint: str) -> bool:
        cell = self._cells.get(endpoint)
        return cell is not None and not cell.stopping

    # ----------------------------------------------------------------- messaging
    def tell(self, endpoint: str, msg: Message) -> bool:
        """Post without waiting. False (and counted) when the mailbox is full or gone.
        The message object itself is queued (see the module doc): the sender must not
        change the lists it holds afterwards."""
        return self.tell_frame(endpoint, msg)

    def tell_frame(self, endpoint: str, frame: Frame) -> bool:
        cell = self._cells.get(endpoint)
        if cell is None:
            self.dead_letters += 1
            return False
        if not self._try_push(cell, frame):
            self.mailbox_full_drops += 1
            return False
        return True

    def _try_push(self, cell: _Cell, frame: Frame, size: int | None = None) -> bool:
        """Queue `frame` for `cell` if its mailbox has room; `size`: its bytes, when the
        caller measured them already (`message_bytes`, once per message)."""
        group = cell.group
        if group.guests is not None and (group is self._inline or (group.task is not None
                                         and group.task is _current_task_on(self._loop))):
            # Within the group: a guest with nothing queued ahead of it handles the message
            # now, from the teller's call (a topic's `Publish` dealt by its subscriptions in
            # the same call as the `Send`: run to completion); else the local lane, drained
            # before the next outside frame.
            if cell is not group and self._direct is None and not group.mailbox.local and self._runs_now(cell, frame):
                self._direct = cell
                try:
                    cell.handled += 1
                    self._run_now(cell, frame, None, None)  # type: ignore[arg-type]
                finally:
                    self._direct = None
                return True
            group.mailbox.push_local(cell, frame)
            return True
        if size is None:
            size = message_bytes(frame)
        if not group.mailbox.push(cell, frame, size, self.mailbox_messages_max, self.mailbox_bytes_max):
            return False
        self._wake(group)
        return True

    @staticmethod
    def _runs_now(cell: _Cell, frame: Frame) -> bool:
        """Whether a guest may handle `frame` from its teller's call: a message object
        (not a frame to decode, an ask or a client's request) with a plain handler, for a
        guest not stopping in a group with no failure waiting for its restart."""
        if type(frame) is bytes or type(frame) is memoryview or cell.stopping or cell.group.failed is not None:
            return False
        if type(frame) is Request or type(frame) is ClientRequests or REQUEST_PORTS.get(type(frame)) is not None:
            return False
        entry = cell.instance._handlers.get(type(frame).__name__)
        return entry is not None and not entry[1]

    def open_lane(self, name: str, endpoint: str, frames_max: int) -> None:
        """Frames pushed to `name` go to a queue of the actor at `endpoint` (at most
        `frames_max`), which its task hands to `Actor.drain_lane` (`lane.py`)."""
        self._lanes.open(name, self._cells[endpoint], frames_max)

    def close_lane(self, name: str) -> None:
        self._lanes.close(name)

    def push_frames(self, endpoint: str, frames: list[bytes]) -> bool:
        """Post raw frames to what is not an actor mailbox: an actor's lane (`open_lane`)
        or a socket (the admin outbox). False when it is full."""
        return self._lanes.push(endpoint, frames)

    def post(self, endpoint: str, msg: Message) -> None:
        """Deliver a message that must not be lost to a full mailbox (a completion):
        told at once when there is room, else sent by a task that waits for room."""
        cell = self._cells.get(endpoint)
        if cell is None:
            self.dead_letters += 1
            return
        if self._try_push(cell, msg):
            return
        task = asyncio.get_running_loop().create_task(self.send(endpoint, msg, timeout_ms=3_600_000))
        self._posts.add(task)
        task.add_done_callback(self._posts.discard)

    async def send(self, endpoint: str, msg: Message, *, timeout_ms: int | None = None) -> None:
        """Post, waiting for mailbox room up to the deadline (backpressure)."""
        deadline = self.clock.monotonic_ms() + (timeout_ms or self.ask_timeout_ms)
        size = message_bytes(msg)
        delay_s = 0.0005
        while True:
            cell = self._cells.get(endpoint)
            if cell is None:
                self.dead_letters += 1
                raise Unavailable(f"actor {endpoint} is gone")
            if self._try_push(cell, msg, size):
                return
            if self.clock.monotonic_ms() >= deadline:
                raise ResourceExhausted(f"mailbox of {cell.name} stayed full")
            await asyncio.sleep(delay_s)
            delay_s = min(delay_s * 2, 0.05)

    async def ask(self, endpoint: str, msg: Message, *, timeout_ms: int | None = None) -> Message:
        """Send `msg` as a request and wait for the handler's return value."""
        cell = self._cells.get(endpoint)
        if cell is not None and cell.group.guests is not None and cell.group.task is asyncio.current_task():
            return await self._ask_in_place(cell, msg)
        correlation_id = next(self._correlation)
        future: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        self._asks[correlation_id] = future
        try:
            await self.send(endpoint, Request(correlation_id=correlation_id, frame=INTERNAL_PROTOCOL.encode(msg)))
            timeout_s = (timeout_ms or self.ask_timeout_ms) / 1000
            try:
                # Not asyncio.wait_for: in 3.11 it returns an answer that came as the asker
                # was stopped, swallowing the cancel (the stop then waits for ever).
                async with asyncio.timeout(timeout_s):
                    reply = await future
            except TimeoutError:
                raise Timeout(f"no answer to {type(msg).__name__} within {timeout_s:.1f} s") from None
        finally:
            self._asks.pop(correlation_id, None)
        if reply.frame is None:
            raise error_from_code(reply.error_code or 8, reply.error_message or "ask failed")
        return INTERNAL_PROTOCOL.decode(reply.frame)

    async def _ask_in_place(self, cell: _Cell, msg: Message) -> Message:
        # The group's one task is the asker: the answer cannot come through the mailbox.
        # What the group told this member before asking is handled first (the order one
        # sender's messages arrive in holds), and the message and the answer still cross
        # as frames, so nothing is shared.
        for frame in cell.group.mailbox.take_local(cell):
            await self._handle_frame(cell, frame)
        inner = INTERNAL_PROTOCOL.decode(INTERNAL_PROTOCOL.encode(msg))
        cell.handled += 1
        answers: list[Message | DanubeError] = []
        await self._run_handler(cell, inner, None, answers.append)
        (answer,) = answers
        if not isinstance(answer, DanubeError | Message):
            answer = self._not_an_answer(cell, inner, answer)
        if isinstance(answer, DanubeError):
            raise answer
        return INTERNAL_PROTOCOL.decode(INTERNAL_PROTOCOL.encode(answer))

    def schedule_periodic(self, endpoint: str, interval_ms: int, msg: Message) -> None:
        """Deliver `msg` to the actor every `interval_ms` while it lives."""
        self._schedule(endpoint, interval_ms, msg, periodic=True)

    def schedule_once(self, endpoint: str, delay_ms: int, msg: Message) -> None:
        """Deliver `msg` to the actor once, after `delay_ms`; a full mailbox defers it by
        as long again rather than losing it (the actor may count on it arriving)."""
        self._schedule(endpoint, delay_ms, msg, periodic=False)

    def _schedule(self, endpoint: str, delay_ms: int, msg: Message, *, periodic: bool) -> None:
        # On the injected clock (`self.clock.call_later`): a test's `ManualClock` decides
        # when timers fire. A timer belongs to the actor's instance: stopping or
        # restarting it cancels the timer (a fresh instance sets its own in `on_start`).
        assert delay_ms > 0
        cell = self._cells.get(endpoint)
        if cell is None or cell.stopping:
            return  # its message could only be a dead letter
        frame = INTERNAL_PROTOCOL.encode(msg)
        timers = cell.timers

        def fire() -> None:
            timers.discard(handle_box[0])
            if not self.is_alive(endpoint):
                return
            if self.tell_frame(endpoint, frame) and not periodic:
                return
            handle_box[0] = self.clock.call_later(delay_ms, fire)
            timers.add(handle_box[0])

        handle_box = [self.clock.call_later(delay_ms, fire)]
        timers.add(handle_box[0])

    def statistics(self) -> SystemStatistics:
        return SystemStatistics(
            actors=len(self._cells),
            failures=self.failures,
            restarts=self.restarts,
            dead_letters=self.dead_letters,
            mailbox_full_drops=self.mailbox_full_drops + self._lanes.full_drops,
            # A copy in one C call: the metrics thread reads this while the loop spawns.
            mailbox_messages=sum(c.queued for c in list(self._cells.values())),
            mailbox_bytes=sum(c.queued_bytes for c in list(self._cells.values())),
        )

    def actor_statistics(self) -> list[ActorStatistics]:
        return [
            ActorStatistics(
                name=c.name, endpoint=c.endpoint, handled_messages=c.handled,
                unrecognized_messages=c.unrecognized, failures=c.failures, restarts=c.restarts,
                mailbox_messages_max=self.mailbox_messages_max, refused_messages=c.refused,
                mailbox_bytes_max=self.mailbox_bytes_max, queued_messages=c.queued, queued_bytes=c.queued_bytes,
            )
            for c in self._cells.values()
        ]

    # ----------------------------------------------------------------- internals
    def _instantiate(self, factory: Callable[[], Actor], endpoint: str, name: str) -> Actor:
        instance = factory()
        instance.system = self
        instance.endpoint = endpoint
        instance.name = name
        return instance

    async def _discard(self, cell: _Cell) -> None:
        _cancel_timers(cell)
        self._cells.pop(cell.endpoint, None)
        if cell.parent is not None and cell.parent in self._cells:
            self._cells[cell.parent].children.pop(cell.endpoint, None)
        if cell.host is not None and cell.host.guests is not None:
            cell.host.guests.pop(cell.header, None)

    async def _run(self, cell: _Cell) -> None:
        # The group's mailbox is filled by `_try_push` (which wakes the task); the ZMQ_FD of any
        # socket the actor owns is watched by the event loop directly: a wake-up costs a
        # callback and a future, where a `zmq.asyncio.Poller` round builds futures and
        # registers every socket again (on the gateway that was a fifth of the broker's
        # loop at 5k msg/s). ZMQ_FD is edge-triggered, so a round ends by reading ZMQ_EVENTS
        # of every socket not read dry in it (`Watched`) before the task waits; a wake-up
        # goes straight to a round (a drain finding nothing costs what asking would).
        loop = self._loop = asyncio.get_running_loop()
        instance: Actor | None = None
        extra: list[tuple[zmq.Socket, Callable[[], Awaitable[bool | None]], bool]] = []
        fds: list[int] = []
        idle = False  # the last round ended with nothing left: wait for a wake-up
        try:
            while True:
                if cell.instance is not instance:
                    instance = cell.instance
                    idle = False
                    for fd in fds:
                        loop.remove_reader(fd)
                    extra = [(zmq.Socket.shadow(sock.underlying), drain, reads_dry)
                             for sock, drain, reads_dry in instance.extra_sockets()]
                    fds = [sock.FD for sock, _, _ in extra]
                    for fd in fds:
                        loop.add_reader(fd, self._wake, cell)
                if idle:
                    cell.waiter = loop.create_future()
                    try:
                        await cell.waiter
                    finally:
                        cell.waiter = None
                    idle = False
                    continue
                if cell.failed is not None:
                    member, what, exc = cell.failed
                    cell.failed = None
                    if not await self._on_failure(member, what, exc) and member is cell:
                        return
                    continue
                if cell.mailbox and not await self._drain_mailbox(cell):
                    return
                if cell.lane and cell.instance is instance and not await self._drain_lane(cell, instance):
                    return
                more = False  # a socket may hold more
                for sock, drain, reads_dry in extra:
                    if cell.instance is not instance:
                        break
                    if reads_dry or sock.getsockopt(_EVENTS) & _POLLIN:
                        try:
                            dry = await drain()
                        except asyncio.CancelledError:
                            raise
                        except Exception as exc:
                            if not await self._on_failure(cell, "socket", exc):
                                return
                            continue  # restarted: the loop's head watches the new instance's sockets
                        if reads_dry and dry is True:
                            continue
                    more = more or bool(sock.getsockopt(_EVENTS) & _POLLIN)
                if cell.lane and cell.instance is instance:
                    # What the round's requests answered at once (`handle_now`) leaves with it.
                    # Sending touches the sockets after they were read: their edge-triggered
                    # FDs may have been reset by input that came meanwhile, so ask again.
                    if not await self._drain_lane(cell, instance):
                        return
                    for sock, _, _ in extra:
                        more = more or bool(sock.getsockopt(_EVENTS) & _POLLIN)
                if cell.instance is instance:
                    if more or cell.mailbox or cell.lane or cell.failed is not None:
                        await asyncio.sleep(0)  # frames left after full drains: let the other actors run
                    else:
                        idle = True
        finally:
            for fd in fds:
                loop.remove_reader(fd)

    async def _drain_lane(self, cell: _Cell, instance: Actor) -> bool:
        """Hand the actor its lane's frames (`drain_lane`); False when its failure doing so
        stopped it."""
        assert cell.lane is not None
        try:
            instance.drain_lane(cell.lane)
        except Exception as exc:
            return await self._on_failure(cell, "lane", exc)
        return True

    @staticmethod
    def _wake(cell: _Cell) -> None:
        waiter = cell.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _drain_mailbox(self, cell: _Cell) -> bool:
        """Handle up to `_DRAIN_MAX` queued frames, the group's lane first; False when
        the actor (the host, for a group) was stopped."""
        instance = cell.instance
        mailbox = cell.mailbox
        for _ in range(_DRAIN_MAX):
            if cell.failed is not None:
                return True  # a guest failed in a handler run from a tell: restarted first (`_run`)
            item = mailbox.pop()
            if item is None:
                return True
            target, frame, _ = item
            if target is not cell and (target.stopping or target.endpoint not in self._cells):
                self.dead_letters += 1  # a guest stopped since the frame was sent
                continue
            if not await self._handle_frame(target, frame) and target is cell:
                return False
            if cell.instance is not instance:
                return True
        return True

    async def _handle_frame(self, cell: _Cell, frame: Frame) -> bool:
        """Handle one queued message (decoded first when it came as a frame); False when
        a failure stopped the actor."""
        if type(frame) is bytes or type(frame) is memoryview:
            try:
                msg = INTERNAL_PROTOCOL.decode(frame)
            except DanubeError as exc:
                cell.unrecognized += 1
                log.error("%s: undecodable mailbox frame dropped: %s", cell.name, exc)
                return True
        else:
            msg = frame
        cell.handled += 1
        if type(msg) is Request:
            return await self._serve_ask(cell, msg)
        return await self._handle_message(cell, msg)

    async def _handle_message(self, cell: _Cell, msg: Message) -> bool:
        """Handle a told message: a client or admin request is unwrapped and its answer
        sent to its connection."""
        port = REQUEST_PORTS.get(type(msg))
        if port is None:
            if type(msg) is ClientRequests:  # one round's Sends for one topic: each its own request
                for identity, frame in zip(msg.identities, msg.frames, strict=True):
                    if not await self._handle_message(cell, ClientRequest(identity=identity, frame=frame)):
                        return False
                return True
            return await self._run_handler(cell, msg, None, None)
        opened = self._open(port, msg)  # type: ignore[arg-type]
        if opened is None:
            return True
        return await self._run_handler(cell, *opened)

    def _open(self, port: Port, envelope: ClientRequest | AdminRequest) -> tuple[
            Message, Origin, Callable[[Message | DanubeError | None], None]] | None:
        """A request's envelope opened: the request, its origin, and how to answer it;
        None when it does not decode (answered here)."""
        try:
            request = port.protocol.decode(envelope.frame)
        except DanubeError as exc:
            # The client gateway routes a producer's batch by the ids at its head, undecoded
            # (one decode per batch): the client's fault, answered with the id it gave.
            RUNTIME_METRICS.bad_frames.inc()
            log.debug("undecodable %s request refused: %s", port.name, exc)
            self._answer(port, envelope.identity,
                         Error(request_id=peek_request_id(envelope.frame), code=exc.code, message=exc.message))
            return None
        request_id = getattr(request, "request_id", None)

        def respond(answer: Message | DanubeError | None) -> None:
            if isinstance(answer, DanubeError):
                if request_id is None:  # a Flow: nobody to answer
                    return
                answer = Error(request_id=request_id, code=answer.code, message=answer.message,
                               redirect_url=getattr(answer, "redirect_url", None))
            if answer is not None:
                self._answer(port, envelope.identity, answer)

        return request, Origin(port=port.name, identity=envelope.identity, envelope=envelope), respond

    def handle_now(self, endpoint: str, msg: ClientRequest | ClientRequests) -> bool:
        """Handle client requests for `endpoint` at once, on the calling task (the
        gateway's, at the end of its round), when the actor's group is idle: its task
        parked, its mailbox empty. False (nothing done): tell them instead.

        Why: a batch told to an idle topic costs two task switches (the topic's task
        woken, then the gateway's for the receipt and the deliveries on its outbox), about
        a sixth of the broker's CPU per batch at 5k one-message batches a second. Only
        what a plain (not async) handler does runs here, so the caller never waits
        mid-handler; the group's task stays parked meanwhile (its waiter is held back from
        wake-ups), so the group is still handled by one task at a time, in order. What the
        group's members tell each other goes on its local lane and is handled here too,
        up to the first message whose handler is async; what is left, and a failure (the
        restart is async), go to the group's task, woken at the end."""
        cell = self._cells.get(endpoint)
        if cell is None or cell.host is not None or cell.stopping or self._inline is not None:
            return False
        waiter = cell.waiter
        if waiter is None or waiter.done() or cell.mailbox or cell.failed is not None:
            return False
        envelopes = ([msg] if type(msg) is ClientRequest
                     else [ClientRequest(identity=identity, frame=frame)
                           for identity, frame in zip(msg.identities, msg.frames, strict=True)])  # type: ignore[union-attr]
        cell.waiter = None
        self._inline = cell
        try:
            for index, envelope in enumerate(envelopes):
                if cell.failed is not None or not self._request_now(cell, envelope):
                    self._requeue(cell, envelopes[index:])
                    break
                if not self._local_now(cell):
                    self._requeue(cell, envelopes[index + 1:])
                    break
        finally:
            self._inline = None
            cell.waiter = waiter
            if cell.mailbox or cell.failed is not None:
                waiter.set_result(None)
        return True

    def _request_now(self, cell: _Cell, envelope: ClientRequest) -> bool:
        """One request run now (`handle_now`); False when its handler is async (left)."""
        instance = cell.instance
        opened = self._open(CLIENT_PORT, envelope)
        if opened is None:
            return True
        request, origin, respond = opened
        entry = instance._handlers.get(type(request).__name__)
        if entry is not None and entry[1]:
            return False
        cell.handled += 1
        self._run_now(cell, request, origin, respond)
        return True

    def _local_now(self, cell: _Cell) -> bool:
        """Handle what the group's members told each other (`handle_now`); False when a
        message needs the group's task (an async handler, an ask) or a member failed."""
        local = cell.mailbox.local
        while local:
            if cell.failed is not None:
                return False
            target, frame, _ = local[0]
            if target is not cell and (target.stopping or target.endpoint not in self._cells):
                local.popleft()
                self.dead_letters += 1
                continue
            if type(frame) is bytes or type(frame) is memoryview:
                try:
                    msg = INTERNAL_PROTOCOL.decode(frame)
                except DanubeError:
                    return False  # the group's task drops it, logged
            else:
                msg = frame
            entry = target.instance._handlers.get(type(msg).__name__)
            if type(msg) is Request or type(msg) is ClientRequests or REQUEST_PORTS.get(type(msg)) is not None \
                    or entry is None or entry[1]:
                return False
            local.popleft()
            target.handled += 1
            self._run_now(target, msg, None, None)
        return cell.failed is None

    def _requeue(self, cell: _Cell, envelopes: list[ClientRequest]) -> None:
        """Requests `handle_now` could not run, queued for the group's task, in order and
        without a bound check: they were admitted as one message already."""
        if not envelopes:
            return
        rest: Message = envelopes[0] if len(envelopes) == 1 else ClientRequests(
            identities=[e.identity for e in envelopes], frames=[e.frame for e in envelopes])
        size = message_bytes(rest)
        cell.mailbox.push(cell, rest, size, cell.queued + 1, cell.queued_bytes + size)

    def _run_now(self, cell: _Cell, msg: Message, origin: Origin | None,
                 respond: Callable[[Message | DanubeError | None], None] | None) -> None:
        """`_run_handler` for a plain handler, on another task: a failure is answered at
        once and left for the group's task (`_Cell.failed`), which restarts the actor."""
        instance = cell.instance
        try:
            fn = instance._handlers[type(msg).__name__][0]
            result = fn(instance, msg) if origin is None else fn(instance, msg, origin)
        except Exception as exc:
            if not self._answered(cell, msg, exc, respond):
                cell.group.failed = (cell, type(msg).__name__, exc)
            return
        if respond is not None:
            respond(result)

    async def handle_in_place(self, endpoint: str, msg: Message) -> bool:
        """Handle `msg` now, on the calling task (the actor's own), as if it had come
        through the mailbox: an actor replaying a request it parked, a gateway handing a
        request read from its own socket to its own handlers. False when the actor failed
        doing so (it was restarted or stopped: the caller's instance is gone)."""
        cell = self._cells.get(endpoint)
        if cell is None:
            return False
        instance = cell.instance
        return await self._handle_message(cell, msg) and cell.instance is instance

    async def _run_handler(self, cell: _Cell, msg: Message, origin: Origin | None,
                           respond: Callable[[Message | DanubeError | None], None] | None) -> bool:
        """Run the handler of `msg` under the one failure rule; `respond` (when someone
        waits) gets the answer: the handler's return value, or the `DanubeError` it
        raised, or INTERNAL for any other exception, given before the actor restarts.
        An unknown message is counted and answered with `Unrecognized`, never a restart.
        False when a failure stopped the actor."""
        instance = cell.instance
        try:
            # The handler table (`Actor._handlers`): a coroutine only for handlers that are one.
            entry = instance._handlers.get(type(msg).__name__)
            if entry is None:
                raise Unrecognized(f"{instance.name} has no handler for {type(msg).__name__}")
            fn, is_async = entry
            result = fn(instance, msg) if origin is None else fn(instance, msg, origin)
            if is_async:
                result = await result
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if self._answered(cell, msg, exc, respond):
                return True
            return await self._on_failure(cell, type(msg).__name__, exc)
        if respond is not None:
            respond(result)
        return True

    @staticmethod
    def _answered(cell: _Cell, msg: Message, exc: Exception,
                  respond: Callable[[Message | DanubeError | None], None] | None) -> bool:
        """The failure rule for what a handler raised: an unknown message or a
        `DanubeError` is an answer (True); anything else is answered INTERNAL where
        someone waits and is a failure (False: the caller restarts the actor)."""
        if isinstance(exc, Unrecognized):
            cell.unrecognized += 1
            log.warning("%s: %s", cell.name, exc)
        elif isinstance(exc, DanubeError):
            cell.refused += 1
            log.debug("%s: %s refused: %s", cell.name, type(msg).__name__, exc)
        else:
            if respond is not None:
                respond(answer_of(type(msg).__name__, exc))
            return False
        if respond is not None:
            respond(exc)
        return True

    def _answer(self, port: Port, identity: bytes, msg: Message) -> None:
        if not self.push_frames(port.outbox, [identity, port.protocol.encode(msg)]):
            RUNTIME_METRICS.frames_dropped.inc()

    async def _serve_ask(self, cell: _Cell, request: Request) -> bool:
        correlation_id = request.correlation_id
        try:
            inner = INTERNAL_PROTOCOL.decode(request.frame)
        except DanubeError as exc:
            cell.unrecognized += 1
            self._deliver_reply(Reply(correlation_id=correlation_id, frame=None, error_code=int(exc.code),
                                      error_message=exc.message))
            return True

        def respond(answer: Message | DanubeError | None) -> None:
            if not isinstance(answer, DanubeError | Message):
                answer = self._not_an_answer(cell, inner, answer)
            if isinstance(answer, DanubeError):
                reply = Reply(correlation_id=correlation_id, frame=None, error_code=int(answer.code),
                              error_message=answer.message)
            else:
                reply = Reply(correlation_id=correlation_id, frame=INTERNAL_PROTOCOL.encode(answer))
            self._deliver_reply(reply)

        return await self._run_handler(cell, inner, None, respond)

    @staticmethod
    def _not_an_answer(cell: _Cell, msg: Message, answer: object) -> InternalError:
        # The handler ran to its end (its state is whole): no restart, the asker is told.
        log.error("%s: answered an ask of %s with %r, not a message", cell.name, type(msg).__name__, answer)
        return InternalError(f"{cell.name} answered {type(msg).__name__} with {answer!r}")

    def _deliver_reply(self, reply: Reply) -> None:
        future = self._asks.get(reply.correlation_id)
        if future is not None and not future.done():
            future.set_result(reply)

    async def _on_failure(self, cell: _Cell, what: str, exc: Exception) -> bool:
        """Restart the actor within its budget; False when it was stopped instead."""
        cell.failures += 1
        self.failures += 1
        RUNTIME_METRICS.actor_failures.inc()
        log.error("%s: handler for %s raised %s: %s", cell.name, what, type(exc).__name__, exc, exc_info=exc)
        now = self.clock.monotonic_ms()
        while cell.restart_times_ms and now - cell.restart_times_ms[0] > self.restart_window_ms:
            cell.restart_times_ms.popleft()
        old = cell.instance
        old.restarting = len(cell.restart_times_ms) < self.restarts_max
        for child in reversed(list(cell.children)):
            await self.stop(child, restarting=old.restarting)
        try:
            await old.on_stop()
        except Exception:
            log.exception("%s: on_stop failed during restart", cell.name)
        _cancel_timers(cell)
        if len(cell.restart_times_ms) >= self.restarts_max:
            log.error("%s: %d restarts within %d ms; stopped", cell.name, len(cell.restart_times_ms), self.restart_window_ms)
            await self._give_up(cell, f"{type(exc).__name__}: {exc}",
                                f"failed {len(cell.restart_times_ms) + 1} times within {self.restart_window_ms} ms")
            return False
        cell.restart_times_ms.append(now)
        cell.restarts += 1
        self.restarts += 1
        cell.instance = self._instantiate(cell.factory, cell.endpoint, cell.name)
        try:
            await cell.instance.on_start()
        except Exception as start_exc:
            # An actor that cannot start again serves nobody: stopped like one whose
            # restarts ran out (a root actor's is fatal), never left half started.
            log.exception("%s: on_start failed after restart", cell.name)
            await self._give_up(cell, f"on_start after a restart: {type(start_exc).__name__}: {start_exc}",
                                "could not start again after a failure")
            return False
        return True

    async def _give_up(self, cell: _Cell, reason: str, why: str) -> None:
        """Stop `cell` for good: its parent is told (`ChildStopped`); a top-level actor
        has no parent to decide, so its end is fatal to the system (`on_fatal`)."""
        cell.stopping = True
        if cell.parent is not None:
            self.tell(cell.parent, ChildStopped(endpoint=cell.endpoint, name=cell.name, reason=reason))
        await self._discard(cell)
        if cell.parent is None:
            message = f"actor {cell.name} {why} (last: {reason})"
            log.critical("%s; the broker cannot serve without it and stops", message)
            if self.on_fatal is not None:
                self.on_fatal(message)

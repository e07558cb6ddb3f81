"""The base class of every actor inside a broker process.

An actor owns its state and changes it only in its `handle_<Message>` methods, which
its group's one task calls for each message from its bounded mailbox (`mailbox.py`:
a queue of message objects in process). Handlers may be plain or `async`; a table from
message class name to handler is built once per class, so searching `handle_Send`
finds what handles a `Send`.

Two kinds of message reach a handler:
- an internal message (`transport/internal_protocol.py`): `handle_<Type>(self, msg)`;
- a client or admin request, which arrives wrapped in `ClientRequest`/`AdminRequest`:
  the runtime decodes the frame with the client or admin protocol and calls
  `handle_<DecodedType>(self, msg, origin)`, `origin` naming the connection and port.
  No internal message may share a name with a request (checked when a class is
  created); the one name the client and admin protocols share with different classes
  (`Unsubscribe`) is told apart by `origin.port`.

The failure rule, applied in one place (`ActorSystem`) for tells, asks and requests:
the handler's return value is the answer (a returned message goes to the asker or to
the request's connection; None sends nothing), a raised `DanubeError` is an answer too,
anything else is answered INTERNAL where someone waits and restarts the actor. A
message with no handler raises `Unrecognized` here: counted, logged and answered with
an error where someone waits. Everything an actor does to the outside world goes
through the `ActorSystem` it was spawned in: telling other actors, asks, timers, frames
to clients, spawning children.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple

from danube_zmq.transport.admin_protocol import ADMIN_PROTOCOL
from danube_zmq.transport.client_protocol import CLIENT_PROTOCOL
from danube_zmq.transport.codec import Message, Protocol
from danube_zmq.transport.errors import InvalidArgument
from danube_zmq.transport.internal_protocol import INTERNAL_PROTOCOL, AdminRequest, ClientRequest

if TYPE_CHECKING:
    from danube_zmq.runtime.system import ActorSystem

# The gateways' outboxes: what an actor answers a client or an admin with goes there as
# [identity, frame] and out through the gateway's ROUTER.
CLIENT_OUTBOX = "inproc://gateway-outbox"
ADMIN_OUTBOX = "inproc://admin-outbox"


@dataclass(frozen=True, slots=True)
class Port:
    """A front door whose requests reach actors wrapped in an envelope."""

    name: str
    protocol: Protocol
    outbox: str


CLIENT_PORT = Port("client", CLIENT_PROTOCOL, CLIENT_OUTBOX)
ADMIN_PORT = Port("admin", ADMIN_PROTOCOL, ADMIN_OUTBOX)
REQUEST_PORTS: dict[type[Message], Port] = {ClientRequest: CLIENT_PORT, AdminRequest: ADMIN_PORT}


@dataclass(frozen=True, slots=True)
class Origin:
    """Where a client or admin request came from: its port ("client" or "admin"), its
    connection, and the envelope it arrived in (for extras such as the resolved schema
    of a `CreateProducer`, or to park and replay the request)."""

    port: str
    identity: bytes
    envelope: ClientRequest | AdminRequest


class Unrecognized(InvalidArgument):
    """The actor has no handler for a message: answered where someone waits, else counted."""


def clashing_names(internal: Protocol, requests: tuple[Protocol, ...]) -> frozenset[str]:
    """Names of internal messages that a client or admin request also has: a handler for
    such a name would be called both ways, with and without an origin."""
    inner = {t.__name__ for t in internal.message_types()}
    return frozenset(t.__name__ for p in requests for t in p.message_types() if t.__name__ in inner)


_CLASHING = clashing_names(INTERNAL_PROTOCOL, (CLIENT_PROTOCOL, ADMIN_PROTOCOL))
_ENVELOPES = frozenset(t.__name__ for t in REQUEST_PORTS)


class Watched(NamedTuple):
    """A socket an actor's task polls besides its mailbox, and the coroutine function
    that drains it.

    libzmq's ZMQ_FD signals only when its command queue fills, and any call on the socket
    may empty that queue, so the runtime asks ZMQ_EVENTS before a drain and after a
    round, a syscall each. A drain that `reads_dry` is called without asking first (it
    reads what is there, as the question would), and when it returns True it read until
    libzmq said EAGAIN and touched the socket no more: that answer is as fresh as
    ZMQ_EVENTS, so the round ends without asking either."""

    socket: Any
    drain: Callable[[], Awaitable[bool | None]]
    reads_dry: bool = False


@dataclass(frozen=True, slots=True)
class ActorStatistics:
    name: str
    endpoint: str
    handled_messages: int
    unrecognized_messages: int
    failures: int
    restarts: int
    mailbox_messages_max: int
    refused_messages: int = 0
    mailbox_bytes_max: int = 0
    queued_messages: int = 0  # told and not yet handled
    queued_bytes: int = 0  # the bytes those carry


class Actor:
    """Subclass and add `handle_<MessageClassName>(self, msg)` methods for internal
    messages, `handle_<RequestClassName>(self, msg, origin)` for client and admin requests."""

    _handlers: ClassVar[dict[str, tuple[Callable[..., Any], bool]]] = {}

    system: ActorSystem
    endpoint: str
    name: str
    # True while `on_stop` runs because the actor failed and is being rebuilt (its
    # clients may come back), False when it is stopped for good.
    restarting: bool = False
    # True while `on_stop` runs because the actor is stopped to be served by another
    # broker (unloaded): its clients re-attach, and are redirected there.
    moving: bool = False

    def stop_state(self) -> tuple[str, bool]:
        """Why `on_stop` runs, as its clients are told, and whether they attach again:
        moved, restarted, or stopped with its broker (the process stops: clients attach
        again when it is back, as to a restarted Pulsar broker) all say yes; closed for
        good (deleted) says no."""
        if self.moving:
            return "moved", True
        if self.restarting:
            return "restarted", True
        if self.system.shutting_down:
            return "stopped with its broker", True
        return "closed", False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        table: dict[str, tuple[Callable[..., Any], bool]] = {}
        for attr in dir(cls):
            if attr.startswith("handle_"):
                name = attr[len("handle_"):]
                if name in _ENVELOPES:
                    raise TypeError(f"{cls.__name__}.{attr}: the runtime unwraps {name}; handle the requests"
                                    " it carries (handle_<Type>(self, msg, origin))")
                if name in _CLASHING:
                    raise TypeError(f"{cls.__name__}.{attr}: {name} names both an internal message and a client or"
                                    " admin request; rename one of them")
                fn = getattr(cls, attr)
                table[name] = (fn, inspect.iscoroutinefunction(fn))
        cls._handlers = table

    def extra_sockets(self) -> list[Watched]:
        """Sockets besides the mailbox that this actor's one task polls, each with the
        coroutine function that drains it (the gateway's ROUTER, for one)."""
        return []

    def drain_lane(self, frames: Any) -> None:
        """Take frames from the deque of the lane this actor opened (`ActorSystem.open_lane`)."""
        raise NotImplementedError(f"{type(self).__name__} opened a lane and does not drain it")

    async def on_start(self) -> None:
        """Called once the mailbox exists, before the first message."""

    async def on_stop(self) -> None:
        """Called when the actor stops or before it is replaced by a restart."""


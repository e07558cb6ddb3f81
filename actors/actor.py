"""The base class of every actor inside a broker process.

An actor owns its state and changes it only in its `handle_<Message>` methods, which
its one task calls for each message from its one bounded mailbox (a slot of the
system's `inproc://` inbox socket). Handlers may be plain or `async`; a table from
message class name to handler is built once per class. A message with no handler goes to `handle_unrecognized`,
which logs and counts it. Everything an actor does to the outside world goes through
the `ActorSystem` it was spawned in: telling other actors, asks, timers, frames to
clients, spawning children.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from danube_zmq.transport.codec import Message

if TYPE_CHECKING:
    from danube_zmq.actors.system import ActorSystem

log = logging.getLogger("danube_zmq.actors")


@dataclass(frozen=True, slots=True)
class ActorStatistics:
    name: str
    endpoint: str
    handled_messages: int
    unrecognized_messages: int
    failures: int
    restarts: int
    mailbox_messages_max: int


class Actor:
    """Subclass and add `handle_<MessageClassName>(self, msg)` methods."""

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

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        table: dict[str, tuple[Callable[..., Any], bool]] = {}
        for attr in dir(cls):
            if attr.startswith("handle_") and attr != "handle_unrecognized":
                fn = getattr(cls, attr)
                table[attr[len("handle_"):]] = (fn, inspect.iscoroutinefunction(fn))
        cls._handlers = table

    def extra_sockets(self) -> list[tuple[Any, Callable[[], Any]]]:
        """Sockets besides the mailbox that this actor's one task polls, each with the
        coroutine function that drains it (the gateway's ROUTER, for one)."""
        return []

    async def on_start(self) -> None:
        """Called once the mailbox exists, before the first message."""

    async def on_stop(self) -> None:
        """Called when the actor stops or before it is replaced by a restart."""

    async def dispatch(self, msg: Message) -> Any:
        entry = self._handlers.get(type(msg).__name__)
        if entry is None:
            return await self.handle_unrecognized(msg)
        fn, is_async = entry
        if is_async:
            return await fn(self, msg)
        return fn(self, msg)

    async def handle_unrecognized(self, msg: Message) -> None:
        self.system.count_unrecognized(self.endpoint)
        log.warning("%s: no handler for %s; dropped", self.name, type(msg).__name__)

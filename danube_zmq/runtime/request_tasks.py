"""A bounded set of tasks answering requests that wait on the metadata store (Raft
rounds): the gateways start one per request so a slow round never holds up their
sockets, and refuse beyond `limit` instead of piling work up. A request answered in a
task (`answer`) meets the one failure rule (`answer_of`, which the actor system applies
to handlers too): a `DanubeError` is the answer; any other exception is a bug of ours,
logged and answered INTERNAL, with no actor to restart. An exception a task started
with `start` lets out is logged when it ends (never left to asyncio's "Task exception
was never retrieved")."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from danube_zmq.transport.codec import Message
from danube_zmq.transport.errors import DanubeError, InternalError

__all__ = ["RequestTasks", "answer_of"]

log = logging.getLogger("danube_zmq.actors")


class RequestTasks:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._tasks: set[asyncio.Task[None]] = set()

    def start(self, coro: Coroutine[Any, Any, None]) -> bool:
        """Run `coro` in a task; False (and `coro` closed unrun) when `limit` are running."""
        if len(self._tasks) >= self.limit:
            coro.close()
            return False
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return True

    def answer(self, coro: Coroutine[Any, Any, Message], what: str,
               reply: Callable[[Message | DanubeError], None]) -> bool:
        """Run `coro` in a task and `reply` what it returns, or what it raised under the
        failure rule; False (and `coro` closed unrun) when `limit` are running."""
        return self.start(_answered(coro, what, reply))

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            return
        exc = task.exception()  # retrieved, so asyncio does not report it again
        if exc is not None:
            log.error("request task %s failed: %s: %s", task.get_name(), type(exc).__name__, exc, exc_info=exc)

    async def cancel_all(self) -> None:
        for task in list(self._tasks):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


def answer_of(what: str, exc: Exception) -> DanubeError:
    """The failure rule's answer to a request (`what`) whose handling raised `exc`: a
    `DanubeError` is the answer; anything else is INTERNAL naming it."""
    if isinstance(exc, DanubeError):
        return exc
    return InternalError(f"{what} failed: {type(exc).__name__}: {exc}")


async def _answered(coro: Coroutine[Any, Any, Message], what: str,
                    reply: Callable[[Message | DanubeError], None]) -> None:
    try:
        answer: Message | DanubeError = await coro
    except Exception as exc:
        if not isinstance(exc, DanubeError):
            log.exception("request %s failed", what)
        answer = answer_of(what, exc)
    reply(answer)

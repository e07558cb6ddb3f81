"""A bounded set of tasks answering requests that wait on the metadata store (Raft
rounds): the gateways start one per request so a slow round never holds up their
sockets, and refuse beyond `limit` instead of piling work up. A task answers its
request itself; an exception it lets out is a bug of ours, logged when the task ends
(never left to asyncio's "Task exception was never retrieved")."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Coroutine
from typing import Any

__all__ = ["RequestTasks"]

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

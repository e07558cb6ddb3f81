"""A bounded set of tasks answering requests that wait on the metadata store (Raft
rounds): the gateways start one per request so a slow round never holds up their
sockets, and refuse beyond `limit` instead of piling work up."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine
from typing import Any

__all__ = ["RequestTasks"]


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
        task.add_done_callback(self._tasks.discard)
        return True

    async def cancel_all(self) -> None:
        for task in list(self._tasks):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

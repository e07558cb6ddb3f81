"""A counted limit with FIFO waiters, for the client's bounds (a producer's pending
messages, a connection's requests in flight)."""

from __future__ import annotations

import asyncio
from collections import deque


class Budget:
    """A counted limit with FIFO waiters: `try_take` never waits, `take` does."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self._waiters: deque[asyncio.Future[None]] = deque()

    def try_take(self) -> bool:
        if self.used < self.limit and not self._waiters:
            self.used += 1
            return True
        return False

    async def take(self) -> None:
        if self.try_take():
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter  # `give` counts the unit for us before waking us
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.give(1)
            elif waiter in self._waiters:
                self._waiters.remove(waiter)
            raise

    def give(self, n: int) -> None:
        self.used -= n
        assert self.used >= 0
        while self._waiters and self.used < self.limit:
            waiter = self._waiters.popleft()
            if not waiter.done():
                self.used += 1
                waiter.set_result(None)

"""Which asyncio event loop the long-running commands use.

uvloop (libuv) by default where it is installed: the broker and `danube bench` spend
much of their time in the loop itself (a ZeroMQ socket's readiness callback, a task
switch per actor hop), and uvloop makes that cheaper (docs/performance.md, "The machine
and the method": e2e p50 at 1k msg/s from 1.4 to 1.1 ms when it came in). `asyncio` is the
standard library's loop (the broker's `broker.event_loop`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def run(main: Coroutine[Any, Any, T], loop: str = "uvloop") -> T:
    """`asyncio.run(main)` on `loop`: "uvloop" when it can be imported, else "asyncio"."""
    if loop == "uvloop":
        try:
            import uvloop
        except ImportError:
            return asyncio.run(main)
        return uvloop.run(main)
    return asyncio.run(main)

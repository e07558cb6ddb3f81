"""Which asyncio event loop the long-running commands use.

uvloop (libuv) by default where it is installed: the broker and `danube bench` spend
much of their time in the loop itself (a ZeroMQ socket's readiness callback, a task
switch per actor hop), and uvloop halves that (docs/performance.md). `asyncio` is the
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

"""Which asyncio event loop the long-running commands use.

uvloop (libuv) by default where it is installed: the broker and `danube bench` spend
much of their time in the loop itself (a ZeroMQ socket's readiness callback, a task
switch per actor hop), and uvloop halves that (docs/performance.md). `asyncio` is the
standard library's loop, for comparison or where uvloop is not available.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

LOOPS = ("uvloop", "asyncio")
ENV = "DANUBE_EVENT_LOOP"


def run(main: Coroutine[Any, Any, T], loop: str | None = None) -> T:
    """`asyncio.run(main)` on the chosen loop: `loop`, else $DANUBE_EVENT_LOOP, else uvloop
    when it can be imported."""
    choice = loop or os.environ.get(ENV) or "uvloop"
    if choice not in LOOPS:
        main.close()
        raise ValueError(f"event loop must be one of {', '.join(LOOPS)}, not {choice!r}")
    if choice == "uvloop":
        try:
            import uvloop
        except ImportError:
            return asyncio.run(main)
        return uvloop.run(main)
    return asyncio.run(main)

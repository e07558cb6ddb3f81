"""What the admin door's servicers share: `gateway`, which ties an RPC to the admin
operations it performs and ends it with Danube's status, the caller of the call being
served, and the small mappings onto Danube's messages."""

from __future__ import annotations

import contextvars
import functools
from collections.abc import Awaitable, Callable
from typing import Any, NoReturn

import grpc

from danube_zmq.doors.grpc.auth import Caller
from danube_zmq.doors.grpc.calls import abort_with, caller_of
from danube_zmq.transport.admin_operations import by_name
from danube_zmq.transport.errors import DanubeError, InvalidArgument

# The token of the call being served (set by `gateway`), for `GrpcAdminDoor.admin`.
CALLER: contextvars.ContextVar[Caller] = contextvars.ContextVar("grpc_admin_caller", default=None)

Rpc = Callable[[Any, Any, grpc.aio.ServicerContext], Awaitable[Any]]


def gateway(*operations: str) -> Callable[[Rpc], Rpc]:
    """An RPC served by the admin `operations` it names (transport/admin_operations.py:
    an undeclared name fails at import); the call ends with Danube's gRPC status for
    the `DanubeError` our admin API raised. The names are the door's table
    (`served_rpcs`, docs/danube-compat.md): what each RPC does here and the
    permissions it needs follow from them."""
    for name in operations:
        by_name(name)

    def wrap(rpc: Rpc) -> Rpc:
        @functools.wraps(rpc)
        async def call(self: Any, request: Any, context: grpc.aio.ServicerContext) -> Any:
            CALLER.set(await caller_of(context, self.door.security))
            try:
                return await rpc(self, request, context)
            except DanubeError as exc:
                await abort_with(context, exc)

        call.operations = operations  # type: ignore[attr-defined]
        return call

    return wrap


def served_rpcs(servicer: type) -> dict[str, tuple[str, ...]]:
    """RPC name -> the admin operations it performs, for each RPC `servicer` serves."""
    return {name: fn.operations for name, fn in vars(servicer).items() if hasattr(fn, "operations")}


async def unimplemented(context: grpc.aio.ServicerContext, why: str) -> NoReturn:
    await context.abort(grpc.StatusCode.UNIMPLEMENTED, why)
    raise AssertionError("abort returns only by raising")


def delivery(dispatch_strategy: int) -> str:
    """Danube's name of a dispatch strategy (our wire value: 0 non-reliable, 1 reliable)."""
    return "Reliable" if dispatch_strategy == 1 else "NonReliable"


def partition_names(topic: Any) -> list[str]:
    """Danube lists each partition as a topic of its own (`/ns/t-part-0`, ...)."""
    if not topic.partitions:
        return [topic.name]
    return [f"{topic.name}-part-{i}" for i in range(topic.partitions)]


def broker_id_of(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise InvalidArgument(f"broker_id must be a broker's id (a number, as ListBrokers names it), got {text!r}") \
            from None

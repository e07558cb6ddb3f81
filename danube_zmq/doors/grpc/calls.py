"""What the gRPC doors' servicers share: Danube's status for our errors, the caller of a
call, the door's own broker port, and a native client the door holds for a caller."""

from __future__ import annotations

import grpc

from danube_zmq.client.client import DanubeClient
from danube_zmq.doors.grpc.auth import Caller, DoorSecurity, bearer_token
from danube_zmq.transport.errors import DanubeError, ErrorCode, InvalidArgument

__all__ = ["GRPC_STATUS", "Attachment", "abort_with", "caller_of", "native_target"]

GRPC_STATUS: dict[ErrorCode, grpc.StatusCode] = {
    ErrorCode.INVALID_ARGUMENT: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorCode.NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    ErrorCode.ALREADY_EXISTS: grpc.StatusCode.ALREADY_EXISTS,
    ErrorCode.PERMISSION_DENIED: grpc.StatusCode.PERMISSION_DENIED,
    ErrorCode.RESOURCE_EXHAUSTED: grpc.StatusCode.RESOURCE_EXHAUSTED,
    ErrorCode.UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
    ErrorCode.FAILED_PRECONDITION: grpc.StatusCode.FAILED_PRECONDITION,
    ErrorCode.INTERNAL: grpc.StatusCode.INTERNAL,
    ErrorCode.UNSUPPORTED_VERSION: grpc.StatusCode.FAILED_PRECONDITION,
    # Danube's client retries DEADLINE_EXCEEDED, as ours retries TIMEOUT.
    ErrorCode.TIMEOUT: grpc.StatusCode.DEADLINE_EXCEEDED,
    # The producer name is held by another live connection: Danube's client gives up
    # on ALREADY_EXISTS ("producer already exists"), as ours does on a first create.
    ErrorCode.PRODUCER_BUSY: grpc.StatusCode.ALREADY_EXISTS,
    # Danube answers the Exclusive conflict (another consumer name) PERMISSION_DENIED.
    ErrorCode.CONSUMER_BUSY: grpc.StatusCode.PERMISSION_DENIED,
    ErrorCode.UNAUTHENTICATED: grpc.StatusCode.UNAUTHENTICATED,
}


async def abort_with(context: grpc.aio.ServicerContext, error: DanubeError) -> None:
    """End the call with the gRPC status Danube's clients expect for `error` (raises)."""
    await context.abort(GRPC_STATUS.get(error.code, grpc.StatusCode.INTERNAL), f"{type(error).__name__}: {error}")


async def caller_of(context: grpc.aio.ServicerContext, security: DoorSecurity) -> Caller:
    """The call's bearer token (None: anonymous); a malformed header ends the call. With
    security off the broker reads no token, and neither does the door: every caller is
    the same anonymous one."""
    if security.server_public_key is None:
        return None
    try:
        return bearer_token(context)
    except DanubeError as exc:
        await abort_with(context, exc)
        raise AssertionError("abort returns only by raising") from exc


def native_target(client_url: str, door_key: str = "broker.grpc_listen", port_key: str = "broker.listen") -> str:
    """The URL a door dials its own broker's port on (`port_key`): a wildcard bind
    address is dialed on loopback."""
    for wildcard in ("tcp://0.0.0.0:", "tcp://*:"):
        if client_url.startswith(wildcard):
            return "tcp://127.0.0.1:" + client_url[len(wildcard):]
    if client_url.startswith("inproc://"):
        raise InvalidArgument(f"{door_key} needs {port_key} on tcp:// or ipc:// (the door dials it)")
    return client_url


class Attachment:
    """A Danube producer or consumer id and the native client holding it."""

    def __init__(self, client: DanubeClient, now_ms: int, owner: Caller = None) -> None:
        self.client = client
        self.last_seen_ms = now_ms
        self.owner = owner  # the token it was created with
        self.closed = False

    def busy(self) -> bool:
        """True while a call that outlives a request (a consumer's stream) is open: the
        attachment is not idle whatever `last_seen_ms` says."""
        return False

    async def tick(self, now_ms: int) -> None:
        """Called by the reaper every `_REAP_EVERY_S` while the attachment is kept."""

    async def close(self) -> None:
        self.closed = True
        await self.client.close()

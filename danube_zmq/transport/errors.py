"""The one error tree of danube-zmq, shared by the broker, the client and the CLI.

Every error carries a stable wire code (`ErrorCode`) so that an error raised in
the broker reaches the client as the same class, and a `retriable` flag that the
client's retry policy reads instead of matching exception types (aiokafka's habit).
"""

from __future__ import annotations

import enum


class ErrorCode(enum.IntEnum):
    """Stable error codes carried in `Error` replies. Values never change."""

    INVALID_ARGUMENT = 1
    NOT_FOUND = 2
    ALREADY_EXISTS = 3
    PERMISSION_DENIED = 4
    RESOURCE_EXHAUSTED = 5
    UNAVAILABLE = 6
    FAILED_PRECONDITION = 7
    INTERNAL = 8
    UNSUPPORTED_VERSION = 9
    TIMEOUT = 10
    PRODUCER_BUSY = 11
    CONSUMER_BUSY = 12
    UNAUTHENTICATED = 13


class DanubeError(Exception):
    """Root of every error danube-zmq raises on purpose."""

    code: ErrorCode = ErrorCode.INTERNAL
    retriable: bool = False

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class InvalidArgument(DanubeError):
    code = ErrorCode.INVALID_ARGUMENT


class NotFound(DanubeError):
    code = ErrorCode.NOT_FOUND


class AlreadyExists(DanubeError):
    code = ErrorCode.ALREADY_EXISTS


class PermissionDenied(DanubeError):
    code = ErrorCode.PERMISSION_DENIED


class ResourceExhausted(DanubeError):
    """A limit was reached; retrying later may succeed."""

    code = ErrorCode.RESOURCE_EXHAUSTED
    retriable = True


class Unavailable(DanubeError):
    """The broker cannot serve this now (not the owner, shutting down, unreachable)."""

    code = ErrorCode.UNAVAILABLE
    retriable = True


# The refusal of a request that reached a port before the actor behind it was spawned
# (a broker binds its ports first). Nothing was done, so the request may be sent again
# as it is: the request clients do so within their timeout.
BROKER_STARTING = "broker starting; retry"


class Moved(Unavailable):
    """Another broker serves the topic: go to `redirect_url` (its advertised URL)."""

    def __init__(self, message: str, redirect_url: str) -> None:
        super().__init__(message)
        self.redirect_url = redirect_url


class FailedPrecondition(DanubeError):
    code = ErrorCode.FAILED_PRECONDITION


class InternalError(DanubeError):
    code = ErrorCode.INTERNAL


class UnsupportedVersion(DanubeError):
    code = ErrorCode.UNSUPPORTED_VERSION


class Timeout(DanubeError):
    """No reply within the deadline; the outcome of the request is unknown."""

    code = ErrorCode.TIMEOUT
    retriable = True


class ProducerBusy(DanubeError):
    """Another live connection holds this producer name on the topic (Pulsar's
    ProducerBusy). Not retriable as is: the name frees only when its holder closes or its
    session times out."""

    code = ErrorCode.PRODUCER_BUSY


class ConsumerBusy(DanubeError):
    """Another live connection holds this consumer name on the subscription (Pulsar's
    ConsumerBusy)."""

    code = ErrorCode.CONSUMER_BUSY


class Unauthenticated(DanubeError):
    """No valid credentials: no token, or one expired, revoked, badly signed, or for another
    issuer or audience. Not retriable as is: the same request succeeds only after the client
    takes a new token (a client with a token provider renews it and retries)."""

    code = ErrorCode.UNAUTHENTICATED


class ConfigError(InvalidArgument):
    """Bad broker configuration; the message names the key at fault."""


_BY_CODE: dict[ErrorCode, type[DanubeError]] = {
    ErrorCode.INVALID_ARGUMENT: InvalidArgument,
    ErrorCode.NOT_FOUND: NotFound,
    ErrorCode.ALREADY_EXISTS: AlreadyExists,
    ErrorCode.PERMISSION_DENIED: PermissionDenied,
    ErrorCode.RESOURCE_EXHAUSTED: ResourceExhausted,
    ErrorCode.UNAVAILABLE: Unavailable,
    ErrorCode.FAILED_PRECONDITION: FailedPrecondition,
    ErrorCode.INTERNAL: InternalError,
    ErrorCode.UNSUPPORTED_VERSION: UnsupportedVersion,
    ErrorCode.TIMEOUT: Timeout,
    ErrorCode.UNAUTHENTICATED: Unauthenticated,
    ErrorCode.PRODUCER_BUSY: ProducerBusy,
    ErrorCode.CONSUMER_BUSY: ConsumerBusy,
}


def error_from_code(code: int, message: str) -> DanubeError:
    """Rebuild the exception for a wire error code; unknown codes become INTERNAL."""
    try:
        cls = _BY_CODE[ErrorCode(code)]
    except ValueError:
        return InternalError(f"unknown error code {code}: {message}")
    return cls(message)

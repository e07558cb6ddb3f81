"""The client's few additions to the one error tree in `transport/errors.py`.

Each is a subclass of a wire error class, so `except Unavailable` or a check of
`retriable` treats them like the broker's own errors.
"""

from __future__ import annotations

from danube_zmq.transport.errors import DanubeError, FailedPrecondition, ResourceExhausted, Unavailable


class ProducerQueueFull(ResourceExhausted):
    """`send_nowait` found `pending_messages_max` messages already waiting for receipts."""


class ConnectionLost(Unavailable):
    """The connection to the broker dropped (silence, restart) while the request was
    outstanding. The outcome is unknown; the client retries what it may retry."""


class AlreadyClosed(FailedPrecondition):
    """The client, producer or consumer was closed."""


def copy_error(error: DanubeError) -> DanubeError:
    """A fresh instance of a stored error, so raising it from many places does not
    chain tracebacks onto one shared object."""
    fresh = type(error)(error.message)
    redirect_url = getattr(error, "redirect_url", None)
    if redirect_url is not None:
        fresh.redirect_url = redirect_url  # type: ignore[attr-defined]
    return fresh

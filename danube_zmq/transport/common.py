"""Messages every boundary shares: the handshake, errors, plain success and ping.

Tags 1..15 are reserved for these in every protocol; each boundary numbers its own
messages from 16 up.
"""

from __future__ import annotations

import enum
from dataclasses import field

from danube_zmq.transport.codec import Message, wire

PROTOCOL_VERSION = 1
"""Bumped on any incompatible change to a message layout; checked at `Connect`."""


class Enum(enum.IntEnum):
    """Base for enums carried as integers on the wire."""


@wire
class Connect(Message):
    """First frame a client sends on a connection. `auth_token` and `curve_public_key`
    are reserved for the security issue; a broker without security ignores them."""

    TAG = 1
    request_id: int
    protocol_version: int
    client_name: str
    auth_token: str | None = field(default=None, repr=False)  # a bearer secret: never in a repr or log
    curve_public_key: bytes | None = None


@wire
class Connected(Message):
    """The broker's answer to `Connect`: its identity and the limits the client must keep.
    A connection that sends nothing (not even `Ping`) for `session_timeout_ms` is closed:
    its producers and consumers are detached. Clients ping every `heartbeat_interval_ms`."""

    TAG = 2
    request_id: int
    protocol_version: int
    broker_id: int
    broker_url: str
    frame_bytes_max: int
    message_bytes_max: int
    heartbeat_interval_ms: int
    session_timeout_ms: int


@wire
class Error(Message):
    """A failed request. `code` is an `ErrorCode`; `redirect_url` names the broker that
    serves the resource when `code` is UNAVAILABLE because another broker owns it."""

    TAG = 3
    request_id: int
    code: int
    message: str
    redirect_url: str | None = None


@wire
class Ok(Message):
    """A request that succeeded and has nothing to return."""

    TAG = 4
    request_id: int


@wire
class Ping(Message):
    TAG = 5
    request_id: int


@wire
class Pong(Message):
    TAG = 6
    request_id: int


COMMON_MESSAGES = (Connect, Connected, Error, Ok, Ping, Pong)

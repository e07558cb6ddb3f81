"""The gateway's table of the TCP connections that carry a session (`_session_fds`)."""

from __future__ import annotations

from danube_zmq.actors.sockets.gateway import Gateway, Session
from danube_zmq.config.broker_config import BrokerConfig


def test_two_sessions_whose_connection_was_gone_at_connect_both_close() -> None:
    """Two DEALERs whose Connect frames were read after their TCP connection had gone
    (the same descriptor, its peer address unknown: None) each get a session; ending
    both must not fail. Regression: the second close found None for the descriptor the
    first had already removed, took it for its own entry and deleted it again:
    KeyError in the gateway, an actor restart that dropped every session (found by
    tests/chaos/harness/fuzz.py, which cuts connections with oversize frames while Connects are
    queued on them)."""
    gateway = Gateway(config=BrokerConfig(), broker_id=1)
    first = Session(client_name="first", last_seen_ms=0, fd=44, address=None)
    second = Session(client_name="second", last_seen_ms=0, fd=44, address=None)
    gateway.sessions = {b"\x01first": first, b"\x01second": second}
    gateway._session_fds[44] = None

    gateway._close_session(b"\x01second", second)
    gateway._close_session(b"\x01first", first)

    assert gateway.sessions == {} and gateway._session_fds == {}

"""The peer guard's bookkeeping of connections without a session (actors/sockets/peers.py,
ConnectionTable): O(1) per accept, and the same decisions as counting every time."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from danube_zmq.actors.sockets.peers import Address, ConnectionTable

TIMEOUT_MS = 100


class NaiveTable:
    """The rule stated plainly: scan every connection on every event."""

    def __init__(self, sessions: dict[int, Address | None], pending_max: int) -> None:
        self.sessions = sessions
        self.pending_max = pending_max
        self.connections: dict[int, list[object]] = {}  # fd -> [address, pending since (seq), idle since]
        self.seq = 0

    def _pending(self) -> list[int]:
        pending = [fd for fd, c in self.connections.items() if self.sessions.get(fd, object()) != c[0]]
        return sorted(pending, key=lambda fd: self.connections[fd][1])  # type: ignore[arg-type,return-value]

    def accepted(self, fd: int, address: Address, now: int) -> int | None:
        pending = self._pending()
        evict = pending[0] if len(pending) >= self.pending_max else None
        if evict is not None:
            del self.connections[evict]
        self.seq += 1
        self.connections[fd] = [address, self.seq, now]
        return evict

    def session_ended(self, fd: int, now: int) -> None:
        if fd in self.connections:
            self.seq += 1
            self.connections[fd][1:] = [self.seq, now]

    def expired(self, now: int) -> list[int]:
        out = []
        for fd, c in list(self.connections.items()):
            if self.sessions.get(fd, object()) == c[0]:
                c[2] = now
            elif now - c[2] >= TIMEOUT_MS:  # type: ignore[operator]
                del self.connections[fd]
                out.append(fd)
        return out


events = st.lists(st.tuples(st.sampled_from(["accept", "close", "start", "end", "review"]),
                            st.integers(0, 5), st.integers(0, 60)), max_size=200)


@settings(max_examples=300, deadline=None)
@given(events, st.integers(1, 6))
def test_evictions_and_timeouts_match_counting_every_connection(script: list[tuple[str, int, int]],
                                                                 pending_max: int) -> None:
    """Whatever the order of accepts, closes, sessions started and ended and reviews,
    the table evicts the connection that has been pending longest exactly when
    `pending_max` are pending, times out the same connections, and counts the same
    pending connections as a scan of every connection would."""
    sessions: dict[int, Address | None] = {}
    table = ConnectionTable(sessions, pending_max=pending_max, timeout_ms=TIMEOUT_MS)
    naive = NaiveTable(sessions, pending_max)
    now = 0
    accepts = 0
    for kind, fd, dt in script:
        now += dt
        if kind == "accept":
            if fd in table.connections:
                continue  # libzmq reports a close before a descriptor is reused
            accepts += 1
            address = ("127.0.0.1", 40000 + accepts)
            evicted = table.accepted(fd, address, now)
            assert (evicted[0] if evicted else None) == naive.accepted(fd, address, now)
        elif kind == "close":
            table.closed(fd)
            naive.connections.pop(fd, None)
            sessions.pop(fd, None)
        elif kind == "start" and fd in table.connections and fd not in sessions:
            sessions[fd] = table.connections[fd].address
            table.session_started(fd)
        elif kind == "end" and fd in sessions:
            del sessions[fd]
            table.session_ended(fd, now)
            naive.session_ended(fd, now)
        elif kind == "review":
            assert sorted(fd for fd, _ in table.expired(now)) == sorted(naive.expired(now))
        assert set(table.connections) == set(naive.connections)
        assert table.pending == len(naive._pending())


def test_a_session_the_owner_did_not_announce_is_never_evicted() -> None:
    """A connection whose session was recorded in `sessions` without `session_started`
    is not counted as pending once the limit is reached, and is never evicted: the
    oldest connection really pending is."""
    sessions: dict[int, Address | None] = {}
    table = ConnectionTable(sessions, pending_max=2, timeout_ms=TIMEOUT_MS)
    table.accepted(3, ("127.0.0.1", 1), 0)
    table.accepted(4, ("127.0.0.1", 2), 0)
    sessions[3] = ("127.0.0.1", 1)  # unannounced
    assert table.accepted(5, ("127.0.0.1", 3), 0) is None  # 4 and 5 pending: within the limit
    evicted = table.accepted(6, ("127.0.0.1", 4), 0)
    assert evicted is not None and evicted[0] == 4
    assert set(table.connections) == {3, 5, 6} and table.pending == 2


def test_a_descriptor_libzmq_already_closed_is_no_peer_and_never_raises() -> None:
    """libzmq closes a peer's descriptor from its I/O thread whenever the peer goes, so
    the guard may look at a descriptor that is closed by then: each probe answers "no
    such peer" (None / False) instead of raising EBADF into the gateway (which crashed
    the admin gateway, and its restart could not bind its port again)."""
    import os
    import socket

    from danube_zmq.actors.sockets.peers import inbound_held, peer_address, shutdown_peer

    a, b = socket.socketpair()
    fd = os.dup(a.fileno())
    os.close(fd)  # a number that names nothing now
    a.close()
    b.close()
    assert peer_address(fd) is None
    assert shutdown_peer(fd, None) is False
    assert inbound_held(fd, 0) is None

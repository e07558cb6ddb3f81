"""Outbound byte budgets: what the gateway has handed libzmq for each connection and
not yet seen leave it.

libzmq's ROUTER queues frames per peer up to ZMQ_SNDHWM *frames*, whatever their
size, so a consumer that grants many permits and never reads its socket can pin
gigabytes. libzmq does not report how many bytes a peer's queue holds, but it does
say when it is done with a zero-copy frame (pyzmq's `MessageTracker`: the frame was
written to the kernel, or dropped with its pipe). A peer's queue is FIFO, so once a
tracked frame is done every frame sent to that peer before it is done too. The
gateway therefore tracks one frame in every `track_every_bytes` sent to a peer (and
every frame at least that large) and settles the untracked ones with it.

Untracked bytes behind the last tracked frame cannot be confirmed; they are settled
at the next tick when no tracked frame is outstanding ahead of them, so a peer's
count can be short by under `track_every_bytes` (the stated per-connection error).

Budgets: a connection over `pause_at` bytes is *paused* (its consumers get no more
deliveries; permits never override this); frames that would take it over its budget,
or the broker over its own, are refused; a connection paused for `stall_ms` is
*stalled* and the gateway disconnects it. A paused connection resumes at `resume_at`.

No sockets and no clock here: trackers are anything with a `done` attribute, and
time is passed in.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Protocol


class Tracker(Protocol):
    @property
    def done(self) -> bool: ...


@dataclass(slots=True)
class _Peer:
    # (bytes settled by this tracker, tracker): FIFO in send order.
    tracked: deque[tuple[int, Tracker]] = field(default_factory=deque)
    untracked_bytes: int = 0  # sent after the last tracked frame
    untracked_since_ms: int = 0
    queued_bytes: int = 0
    paused_since_ms: int | None = None


@dataclass(frozen=True, slots=True)
class OutboundStatistics:
    queued_bytes: int
    connections_queued: int
    connections_paused: int
    frames_refused: int
    connections_stalled: int


class OutboundLedger:
    """Bytes queued in libzmq per connection and in total, against their budgets."""

    def __init__(self, *, connection_bytes_max: int, broker_bytes_max: int, stall_ms: int,
                 track_every_bytes: int = 64 * 1024) -> None:
        assert connection_bytes_max > 0 and broker_bytes_max > 0 and track_every_bytes > 0
        self.connection_bytes_max = connection_bytes_max
        self.broker_bytes_max = broker_bytes_max
        self.pause_at = connection_bytes_max // 2
        self.resume_at = connection_bytes_max // 4
        self.stall_ms = stall_ms
        self.track_every_bytes = track_every_bytes
        self.queued_bytes = 0
        self.frames_refused = 0
        self.connections_stalled = 0
        self._peers: dict[bytes, _Peer] = {}

    def admit(self, identity: bytes, size: int) -> bool:
        """Whether a frame of `size` bytes may be queued for `identity` now. A frame is
        always admitted to an empty connection queue when the broker has room (so one
        frame up to frame_bytes_max always passes); otherwise it must fit both budgets."""
        peer = self._peers.get(identity)
        queued = 0 if peer is None else peer.queued_bytes
        if queued and queued + size > self.connection_bytes_max:
            self.frames_refused += 1
            return False
        if self.queued_bytes and self.queued_bytes + size > self.broker_bytes_max:
            self.settle_all()
            if self.queued_bytes and self.queued_bytes + size > self.broker_bytes_max:
                self.frames_refused += 1
                return False
        return True

    def should_track(self, identity: bytes, size: int) -> bool:
        peer = self._peers.get(identity)
        untracked = 0 if peer is None else peer.untracked_bytes
        return size + untracked >= self.track_every_bytes

    def sent(self, identity: bytes, size: int, tracker: Tracker | None, now_ms: int) -> None:
        """Record a frame handed to libzmq; `tracker` settles it and everything before it."""
        peer = self._peers.get(identity)
        if peer is None:
            peer = self._peers[identity] = _Peer()
        if tracker is None:
            if not peer.untracked_bytes:
                peer.untracked_since_ms = now_ms
            peer.untracked_bytes += size
        else:
            peer.tracked.append((peer.untracked_bytes + size, tracker))
            peer.untracked_bytes = 0
        peer.queued_bytes += size
        self.queued_bytes += size

    def queued(self, identity: bytes) -> int:
        peer = self._peers.get(identity)
        return 0 if peer is None else peer.queued_bytes

    def settle(self, identity: bytes, now_ms: int | None = None) -> None:
        """Release what libzmq is done with. With `now_ms`, untracked bytes with nothing
        tracked ahead of them and older than one call are released too (see the module
        docstring for the error this allows)."""
        peer = self._peers.get(identity)
        if peer is None:
            return
        released = 0
        tracked = peer.tracked
        while tracked and tracked[0][1].done:
            released += tracked.popleft()[0]
        if now_ms is not None and not tracked and peer.untracked_bytes and now_ms > peer.untracked_since_ms:
            released += peer.untracked_bytes
            peer.untracked_bytes = 0
        peer.queued_bytes -= released
        self.queued_bytes -= released
        if not peer.queued_bytes and peer.paused_since_ms is None:
            del self._peers[identity]

    def settle_all(self, now_ms: int | None = None) -> None:
        for identity in list(self._peers):
            self.settle(identity, now_ms)

    # ------------------------------------------------------------- pause and stall
    def should_pause(self, identity: bytes, now_ms: int) -> bool:
        """True once, when `identity` crosses `pause_at` (or the broker is over budget)."""
        peer = self._peers.get(identity)
        if peer is None or peer.paused_since_ms is not None:
            return False
        if peer.queued_bytes >= self.pause_at or self.queued_bytes >= self.broker_bytes_max:
            peer.paused_since_ms = now_ms
            return True
        return False

    def refused(self, identity: bytes, now_ms: int) -> bool:
        """A frame to `identity` was refused: pause it. True if it was not paused yet."""
        peer = self._peers.get(identity)
        if peer is None:
            peer = self._peers[identity] = _Peer()
        if peer.paused_since_ms is None:
            peer.paused_since_ms = now_ms
            return True
        return False

    def review(self, now_ms: int) -> tuple[list[bytes], list[bytes]]:
        """Settle everything, then (connections to resume, connections stalled past
        `stall_ms`). A stalled connection is forgotten here; libzmq drops its queue
        when the gateway disconnects it, which its trackers then confirm."""
        self.settle_all(now_ms)
        resume: list[bytes] = []
        stalled: list[bytes] = []
        for identity, peer in list(self._peers.items()):
            if peer.paused_since_ms is None:
                continue
            if peer.queued_bytes <= self.resume_at and self.queued_bytes < self.broker_bytes_max:
                peer.paused_since_ms = None
                resume.append(identity)
                if not peer.queued_bytes:
                    del self._peers[identity]
            elif now_ms - peer.paused_since_ms >= self.stall_ms:
                peer.paused_since_ms = None
                self.connections_stalled += 1
                stalled.append(identity)
        return resume, stalled

    def is_paused(self, identity: bytes) -> bool:
        peer = self._peers.get(identity)
        return peer is not None and peer.paused_since_ms is not None

    def forget_pause(self, identity: bytes) -> None:
        """The connection's session ended: nothing left to resume."""
        peer = self._peers.get(identity)
        if peer is not None:
            peer.paused_since_ms = None
            if not peer.queued_bytes:
                del self._peers[identity]

    def statistics(self) -> OutboundStatistics:
        return OutboundStatistics(
            queued_bytes=self.queued_bytes, connections_queued=len(self._peers),
            connections_paused=sum(p.paused_since_ms is not None for p in self._peers.values()),
            frames_refused=self.frames_refused, connections_stalled=self.connections_stalled)

"""Lanes: named, bounded queues of raw frames for what is not an actor's mailbox.

An actor that owns a socket may open a lane (`ActorSystem.open_lane`): frames pushed
to the lane's name go to a queue its task hands to `Actor.drain_lane`. The client
gateway's outbox is one, so that what topics and subscriptions send to clients reaches
the ROUTER without an inproc socket between (a libzmq send and receive per frame). A
name with no lane is an `inproc://` endpoint (the admin outbox): the frames go through
a PUSH socket connected to it, under the same high-water mark.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

import zmq


class Owner(Protocol):
    """The actor record a lane belongs to: its task drains `lane`."""

    lane: deque[list[bytes]] | None


O = TypeVar("O", bound=Owner)


class Lanes(Generic[O]):
    def __init__(self, sync_context: zmq.Context, *, push_hwm: int, wake: Callable[[O], None]) -> None:
        self._sync_context = sync_context
        self._push_hwm = push_hwm
        self._wake = wake
        self._lanes: dict[str, tuple[O, int]] = {}
        self._push: dict[str, zmq.Socket] = {}
        self.full_drops = 0  # frames refused: a full lane or socket

    def open(self, name: str, owner: O, frames_max: int) -> None:
        if owner.lane is None:
            owner.lane = deque()
        self._lanes[name] = (owner, frames_max)

    def close(self, name: str) -> None:
        self._lanes.pop(name, None)

    def push(self, name: str, frames: list[bytes]) -> bool:
        """Post `frames` to the lane `name`, or to the socket at that endpoint; False
        (and counted) when it is full."""
        lane = self._lanes.get(name)
        if lane is not None:
            owner, frames_max = lane
            queue = owner.lane
            assert queue is not None
            if len(queue) >= frames_max:
                self.full_drops += 1
                return False
            queue.append(frames)
            self._wake(owner)
            return True
        try:
            self._push_socket(name).send_multipart(frames, zmq.DONTWAIT, copy=False)
        except zmq.Again:
            self.full_drops += 1
            return False
        return True

    def close_sockets(self) -> None:
        for sock in self._push.values():
            sock.close(linger=0)
        self._push.clear()

    def _push_socket(self, endpoint: str) -> zmq.Socket:
        sock = self._push.get(endpoint)
        if sock is None:
            sock = self._sync_context.socket(zmq.PUSH)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.SNDHWM, self._push_hwm)
            sock.connect(endpoint)
            self._push[endpoint] = sock
        return sock

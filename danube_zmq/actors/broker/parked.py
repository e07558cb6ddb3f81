"""Client requests waiting for their topic's assignment, a helper of the broker actor.

A request for a topic with no broker yet (just created, or moving) is parked here,
bounded in number (`_PARKED_MAX`) and time (`cluster.request_timeout_ms`), until the
broker handles a change of the topic's assignment: then it is handled again in place
(`replay`), keeping its first deadline if it parks again. One that outlives its
deadline, or every one when the broker loses its lease, is answered UNAVAILABLE
(`refuse`), checked on the broker's `ParkedExpired` timer message.
"""

from __future__ import annotations

from collections.abc import Iterator

from danube_zmq.actors.sockets.gateway import reply_client
from danube_zmq.clock import Clock
from danube_zmq.runtime.system import ActorSystem
from danube_zmq.transport import client_protocol as cp
from danube_zmq.transport.common import Error
from danube_zmq.transport.errors import ResourceExhausted, Unavailable
from danube_zmq.transport.internal_protocol import ClientRequest

__all__ = ["ParkedRequests"]

_PARKED_MAX = 10_000


class ParkedRequests:
    def __init__(self, *, system: ActorSystem, endpoint: str, clock: Clock, request_timeout_ms: int) -> None:
        self.system = system
        self.endpoint = endpoint  # the broker's, which handles a replayed request
        self.clock = clock
        self.request_timeout_ms = request_timeout_ms
        self.requests: dict[str, list[tuple[ClientRequest, int]]] = {}  # topic -> (request, deadline)
        self.count = 0
        self._replay_deadline: int | None = None  # the deadline of the request being replayed

    def __contains__(self, topic: str) -> bool:
        return topic in self.requests

    def __bool__(self) -> bool:
        return bool(self.requests)

    def topics(self) -> Iterator[str]:
        """The topics with requests waiting (a copy: replays change them)."""
        return iter(list(self.requests))

    def park(self, topic: str, req: ClientRequest) -> None:
        if self.count >= _PARKED_MAX:
            raise ResourceExhausted(f"{_PARKED_MAX} requests already wait for topics to be assigned; retry")
        deadline = self._replay_deadline
        if deadline is None:
            deadline = self.clock.monotonic_ms() + self.request_timeout_ms
        self.requests.setdefault(topic, []).append((req, deadline))
        self.count += 1

    async def replay(self, topic: str) -> None:
        """Handle the topic's waiting requests again, in place, in the order they came."""
        waiting = self.requests.pop(topic, None)
        if not waiting:
            return
        self.count -= len(waiting)
        for req, deadline in waiting:
            self._replay_deadline = deadline
            try:
                if not await self.system.handle_in_place(self.endpoint, req):
                    return  # this instance failed and was replaced: its parked requests went with it
            finally:
                self._replay_deadline = None

    def refuse(self, now: float, *, lease_held: bool) -> None:
        """Answer UNAVAILABLE to every parked request whose deadline is at or before `now`."""
        if not self.requests:
            return
        for topic in list(self.requests):
            keep = []
            for req, deadline in self.requests[topic]:
                if deadline > now:
                    keep.append((req, deadline))
                    continue
                request = cp.CLIENT_PROTOCOL.decode(req.frame)
                reason = "this broker does not hold its lease" if not lease_held \
                    else "it has no broker yet"
                reply_client(self.system, req.identity, Error(
                    request_id=request.request_id, code=Unavailable.code,  # type: ignore[attr-defined]
                    message=f"topic {topic} is not served: {reason}; retry"))
            self.count -= len(self.requests[topic]) - len(keep)
            if keep:
                self.requests[topic] = keep
            else:
                del self.requests[topic]

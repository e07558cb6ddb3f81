"""A remote admin: the actor that talks to one other broker's admin port.

A child of the broker actor, one per admin URL, spawned when a request first needs that
broker (`RemoteAdminFor`: describing partitions served there, forwarding a repair or an
unload, the cluster leader's requests). An admin client carries one request at a time,
so the requests to one broker take turns: the actor's mailbox is the queue, each
`RemoteAdminCall` is handled by awaiting its round trip, and the connection is kept
for the next while calls keep coming: one idle for `idle_ms` is closed (a
`RemoteAdminIdle` timer). The peer's admin port cuts a connection idle for its
`limits.connect_timeout_ms`, and a kept DEALER would reconnect at once, be cut again,
and so on while the broker runs, each cut a warning in the peer's log. A connection
the peer stopped answering is dropped and made again at the next call. The admin
request tasks that ask it wait on their ask, never on a lock.
"""

from __future__ import annotations

import dataclasses
import logging

from danube_zmq.actors.cluster.peer_link import PeerLink
from danube_zmq.runtime.actor import Actor
from danube_zmq.security.curve import ClusterCurve
from danube_zmq.transport import admin_protocol as ap
from danube_zmq.transport.codec import Message
from danube_zmq.transport.errors import DanubeError, Unavailable
from danube_zmq.transport.internal_protocol import RemoteAdminAnswer, RemoteAdminCall, RemoteAdminIdle

__all__ = ["RemoteAdmin"]

log = logging.getLogger("danube_zmq.broker")


class RemoteAdmin(Actor):
    def __init__(self, *, admin_url: str, timeout_ms: int, client_name: str, idle_ms: int,
                 curve: ClusterCurve | None = None) -> None:
        self.admin_url = admin_url
        self.idle_ms = idle_ms
        self.calls = 0
        self.curve = curve  # security.mode curve: the peer's admin port is dialed with the cluster pair
        self.timeout_ms = timeout_ms
        self.client_name = client_name
        self.client: PeerLink | None = None  # while connected

    async def handle_RemoteAdminCall(self, msg: RemoteAdminCall) -> Message:
        request = ap.ADMIN_PROTOCOL.decode(msg.frame)
        client = self.client
        try:
            if client is None:
                client = self.client = PeerLink(self.admin_url, timeout_ms=self.timeout_ms,
                                                client_name=self.client_name, curve=self.curve)
                await client.connect()
            answer = await client.call(lambda rid: dataclasses.replace(request, request_id=rid),
                                       timeout_ms=msg.timeout_ms)
        except DanubeError as exc:
            if isinstance(exc, Unavailable) or client.connected is None:
                self._close()  # a fresh connection next time
            raise
        finally:
            self.calls += 1
            self.system.schedule_once(self.endpoint, self.idle_ms, RemoteAdminIdle(calls=self.calls))
        return RemoteAdminAnswer(frame=ap.ADMIN_PROTOCOL.encode(answer))

    def handle_RemoteAdminIdle(self, msg: RemoteAdminIdle) -> None:
        if msg.calls == self.calls:
            self._close()

    async def on_stop(self) -> None:
        self._close()

    def _close(self) -> None:
        if self.client is not None:
            self.client.close()
            self.client = None

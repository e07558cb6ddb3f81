"""A broker's request/reply link to another broker's admin port.

The broker is a client of its peers when it forwards an admin request (`RemoteAdmin`)
or hands a topic over (`HandOver`): one DEALER with the cluster's CURVE pair (mode
curve) and never the process's environment, one request at a time. It is the same
session as `danube admin`'s (`rpc.RequestClient`), without the client library's
per-operation methods: the broker sends admin requests it already built.
"""

from __future__ import annotations

from collections.abc import Callable

from danube_zmq.actors.cluster.broker_curve import admin_client_curve
from danube_zmq.rpc.request_client import RequestClient
from danube_zmq.security.curve import ClusterCurve
from danube_zmq.transport.admin_protocol import ADMIN_PROTOCOL
from danube_zmq.transport.codec import Message

__all__ = ["PeerLink"]


class PeerLink(RequestClient):
    PROTOCOL = ADMIN_PROTOCOL
    WHAT = "peer admin endpoint"

    def __init__(self, admin_url: str, *, timeout_ms: int, client_name: str, curve: ClusterCurve | None) -> None:
        super().__init__(admin_url, timeout_ms=timeout_ms, client_name=client_name, **admin_client_curve(curve))

    async def call(self, build: Callable[[int], Message], *, timeout_ms: int) -> Message:
        """The peer's answer to the request `build(request_id)`, or its refusal raised."""
        return await self._call(build, Message, timeout_ms=timeout_ms)

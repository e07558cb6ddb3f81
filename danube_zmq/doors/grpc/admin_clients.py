"""The gRPC doors' admin connections: connected `AdminClient`s of this broker's admin
port, each dialed for one caller (`doors/grpc/auth.py`), kept for that caller's
next calls only, and closed once idle for `idle_ms` (the admin port would cut it, the
DEALER reconnect at once, and so on, each cut a warning in the log).

Used by the admin door for every call (`doors/grpc/admin_door.py`) and by the
SchemaRegistry on either door for its topic-binding calls (`doors/grpc/schemas.py`):
the admin port's RBAC decides each as for `danube admin` with the caller's token.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from danube_zmq.client.admin import AdminClient
from danube_zmq.doors.grpc.auth import Caller, DoorSecurity
from danube_zmq.transport.errors import DanubeError, Unauthenticated, Unavailable

# Connected admin clients kept per caller for the next calls. Calls run at once, each on
# a client of its own (an AdminClient has one request in flight): a slow UnloadTopic must
# not hold up ListBrokers.
IDLE_CLIENTS_MAX = 4
# Callers whose idle admin clients are kept; past it the least recent caller's are closed.
IDLE_CALLERS_MAX = 64


class AdminClients:
    """Admin clients of `admin_target` (a dialable zmq URL), per caller. `client(caller)`
    lends one for a call; `close()` closes the idle ones and every one lent afterwards."""

    def __init__(self, admin_target: str, security: DoorSecurity, client_name: str, idle_ms: int = 5000) -> None:
        self.admin_target = admin_target
        self._idle_s = idle_ms / 1000
        self._idle_since: dict[int, float] = {}  # id(an idle client) -> the loop time it was put back
        self._expiry: asyncio.TimerHandle | None = None
        self._security = security
        self._client_name = client_name
        self._closed = False
        # caller -> their connected idle clients, the least recent caller first
        self._idle: dict[Caller, list[AdminClient]] = {}

    @asynccontextmanager
    async def client(self, caller: Caller) -> AsyncIterator[AdminClient]:
        """A connected admin client for one call, `caller`'s own (their token, a key
        pair of its own)."""
        idle = self._idle.get(caller)
        if idle:
            client = idle.pop()
        else:
            client = AdminClient(self.admin_target, client_name=self._client_name,
                                 **self._security.credentials(caller))
            try:
                await client.connect()
            except BaseException:
                client.close()
                raise
        keep = False
        try:
            yield client
            keep = True
        except DanubeError as exc:
            # A timed-out request may still be answered later: that client's next call
            # would skip the stale reply, but a fresh client is simpler to reason about.
            # A refused token: the caller's next call dials afresh (it may bring another).
            keep = not isinstance(exc, Unavailable | Unauthenticated)
            raise
        finally:
            self._put_back(caller, client, keep)

    def close(self) -> None:
        self._closed = True
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None
        idle, self._idle = self._idle, {}
        for clients in idle.values():
            for client in clients:
                client.close()

    def _put_back(self, caller: Caller, client: AdminClient, keep: bool) -> None:
        pool = self._idle.pop(caller, [])  # re-inserted last: the most recent caller
        if keep and not self._closed and len(pool) < IDLE_CLIENTS_MAX:
            pool.append(client)
            loop = asyncio.get_running_loop()
            self._idle_since[id(client)] = loop.time()
            if self._expiry is None:
                self._expiry = loop.call_later(self._idle_s, self._close_idle)
        else:
            client.close()
        if pool:
            self._idle[caller] = pool
        while len(self._idle) > IDLE_CALLERS_MAX:
            for stale in self._idle.pop(next(iter(self._idle))):
                stale.close()

    def _close_idle(self) -> None:
        """Close the clients idle for `idle_s`; look again while some are left."""
        loop = asyncio.get_running_loop()
        self._expiry = None
        now = loop.time()
        for caller in list(self._idle):
            fresh = []
            for client in self._idle[caller]:
                if now - self._idle_since.get(id(client), now) >= self._idle_s:
                    client.close()
                else:
                    fresh.append(client)
            if fresh:
                self._idle[caller] = fresh
            else:
                del self._idle[caller]
        live = {id(c) for pool in self._idle.values() for c in pool}
        self._idle_since = {k: v for k, v in self._idle_since.items() if k in live}
        if self._idle_since and not self._closed:  # when the oldest one left turns idle_s
            self._expiry = loop.call_later(min(self._idle_since.values()) + self._idle_s - now, self._close_idle)

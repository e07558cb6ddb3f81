"""Danube's gRPC admin door: `DanubeAdmin.proto` served for Danube's own admin tools.

    danube-admin (gRPC) ──▶ GrpcAdminDoor (grpc.aio server, broker.grpc_admin_listen)
                              │  BrokerAdmin, ClusterAdmin, NamespaceAdmin (admin_services.py)
                              │  TopicAdmin, SecurityAdmin                 (admin_services.py, admin_topics.py)
                              │  SchemaRegistry                            (schemas.py)
                              ▼  AdminClient, this broker's admin port (broker.admin_listen);
                                 the registry calls: this broker's client port (broker.listen)

A gateway, not a second admin API: each RPC is one or a few calls of our own admin API
(`client/admin.py`) on this broker's admin port, its records mapped onto Danube's
messages and our error codes onto Danube's gRPC status codes (`GRPC_STATUS`, shared
with the client door). What the door answers is therefore what `danube admin` would.

An RPC our admin API has no equivalent for answers UNIMPLEMENTED with what to use
instead (`unimplemented`); docs/danube-compat.md lists them.

Danube's broker serves its SchemaRegistry on the admin endpoint as well as the client
one (danube-admin's `schemas ...` and `topics configure-schema | set-validation-policy |
get-schema-config` call it there): so does this door, with the client door's servicer.

Every call runs on an admin client dialed with the caller's bearer token and a fresh
CURVE key pair (`doors/grpc/admin_clients.py`), kept for that caller's next calls only:
the admin port's RBAC decides as for `danube admin` with that token.
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from typing import Any

import grpc

from danube_zmq.client.admin import AdminClient
from danube_zmq.config.broker_config import BrokerConfig
from danube_zmq.doors.grpc.admin_clients import AdminClients
from danube_zmq.doors.grpc.admin_rpcs import CALLER
from danube_zmq.doors.grpc.admin_services import BrokerAdminDoor, ClusterAdminDoor, NamespaceAdminDoor
from danube_zmq.doors.grpc.admin_topics import SecurityAdminDoor, TopicAdminDoor
from danube_zmq.doors.grpc.auth import DoorSecurity
from danube_zmq.doors.grpc.calls import native_target
from danube_zmq.doors.grpc.limits import ADMIN_CALLS_MAX, DoorLimits
from danube_zmq.doors.grpc.schemas import SchemaRegistryDoor
from danube_zmq.transport.danube_proto import DanubeAdmin_pb2_grpc as pb_grpc
from danube_zmq.transport.errors import InvalidArgument


class GrpcAdminDoor:
    """The gRPC admin server of one broker. `start()` binds `listen` (http://HOST:PORT) and
    names the door `url` as it serves (https:// with TLS); `stop()` ends the calls and
    closes the admin and registry clients."""

    def __init__(self, *, listen: str, admin_url: str, client_url: str, security: DoorSecurity | None = None,
                 limits: DoorLimits | None = None) -> None:
        self.listen = listen
        self.security = (security or DoorSecurity()).with_context()
        self.limits = limits or DoorLimits.admin_door(BrokerConfig())
        self.admins = AdminClients(native_target(admin_url, "broker.grpc_admin_listen", "broker.admin_listen"),
                                   self.security, "grpc-admin-door", idle_ms=self.limits.admin_client_idle_ms)
        # Danube's admin endpoint serves its SchemaRegistry too (danube-admin's `schemas`
        # and `topics configure-schema ...`): the registry calls go to the client port.
        self.client_target = native_target(client_url, "broker.grpc_admin_listen", "broker.listen")
        self.url = ""
        self._server: grpc.aio.Server | None = None
        self._schemas: Any = None  # SchemaRegistryDoor, imported at start

    @property
    def admin_target(self) -> str:
        return self.admins.admin_target

    async def start(self) -> None:
        from danube_zmq.transport.danube_proto import SchemaRegistry_pb2_grpc as spb_grpc

        # Each call holds an admin client (a connection to the admin port) while it runs.
        server = grpc.aio.server(options=self.limits.server_options(), maximum_concurrent_rpcs=ADMIN_CALLS_MAX)
        pb_grpc.add_BrokerAdminServicer_to_server(BrokerAdminDoor(self), server)
        pb_grpc.add_ClusterAdminServicer_to_server(ClusterAdminDoor(self), server)
        pb_grpc.add_NamespaceAdminServicer_to_server(NamespaceAdminDoor(self), server)
        pb_grpc.add_TopicAdminServicer_to_server(TopicAdminDoor(self), server)
        pb_grpc.add_SecurityAdminServicer_to_server(SecurityAdminDoor(self), server)
        self._schemas = SchemaRegistryDoor(security=self.security, client_target=self.client_target,
                                           admins=self.admins)
        spb_grpc.add_SchemaRegistryServicer_to_server(self._schemas, server)
        host, _, port = self.listen.removeprefix("http://").rpartition(":")
        bound = self.security.bind(server, f"{host}:{port}", "broker.grpc_admin_listen")
        if bound == 0:
            raise InvalidArgument(f"broker.grpc_admin_listen: cannot bind {self.listen}")
        await server.start()
        self._server = server
        self.url = f"{self.security.scheme}://{host}:{bound}"

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(grace=1.0)
            self._server = None
        if self._schemas is not None:
            await self._schemas.close()
            self._schemas = None
        self.admins.close()
        assert self.security.context is not None
        self.security.context.destroy(linger=0)

    def admin(self) -> AbstractAsyncContextManager[AdminClient]:
        """A connected admin client of this broker's admin port for one call, the caller's
        own (their token, a key pair of its own)."""
        return self.admins.client(CALLER.get())

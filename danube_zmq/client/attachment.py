"""A broker-side producer or consumer on one (partition) topic that the client keeps
attached: created once, re-created after the connection was lost and restored or the
broker closed it, following redirects to the broker that owns the topic.

Subclasses say how to attach (`_attach_on`: `CreateProducer` or `Subscribe`) and how to
forget the broker's id (`_forget_id`); `_on_failed` is told when re-attaching met an error
that is not retriable. Retriable failures are retried while the object is open.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from danube_zmq.client.connection import Connection
from danube_zmq.client.errors import AlreadyClosed, copy_error
from danube_zmq.client.retry import backoff_ms
from danube_zmq.transport.errors import (
    ConsumerBusy,
    DanubeError,
    FailedPrecondition,
    ProducerBusy,
    Timeout,
    Unavailable,
)

if TYPE_CHECKING:
    from danube_zmq.client.client import DanubeClient

log = logging.getLogger("danube_zmq.client")

REDIRECTS_MAX = 3


class Attachment:
    kind = "attachment"

    def __init__(self, client: DanubeClient, topic: str, name: str) -> None:
        self._client = client
        self.topic = topic
        self.name = name
        self.connection: Connection = None  # type: ignore[assignment]  # set by start()
        self.failed: DanubeError | None = None
        self.epoch = 0  # bumped on every successful attach
        self.reattaches = 0
        self._attached = asyncio.Event()  # set when attached, and when failed (to wake waiters)
        self._started = False
        self._closing = False
        self._reattach_task: asyncio.Task[None] | None = None

    # ---------------------------------------------------------------- subclass hooks

    async def _attach_on(self, connection: Connection) -> None:
        """Create the broker-side object on `connection` and register its id there."""
        raise NotImplementedError

    def _forget_id(self) -> None:
        """Unregister and drop the broker-side id (it is void)."""
        raise NotImplementedError

    def _on_failed(self, error: DanubeError) -> None:
        """Re-attaching gave up (or the connection closed for good)."""

    # ---------------------------------------------------------------- attach

    @property
    def attached(self) -> bool:
        return self._attached.is_set() and self.failed is None

    async def start(self) -> None:
        """Attach for the first time, with the client's retry policy."""
        self.connection = await self._client._service_connection()
        self.connection.add_listener(self)
        await self._client._retry(self._attach_once)
        self._started = True

    async def _attach_once(self) -> None:
        for hop in range(REDIRECTS_MAX + 1):
            connection = self.connection
            try:
                await self._attach_on(connection)
            except Unavailable as exc:
                url = getattr(exc, "redirect_url", None)
                if url and url != connection.url and hop < REDIRECTS_MAX:
                    log.info("%s %s on %s: redirected to %s", self.kind, self.name, self.topic, url)
                    self._move_to(await self._client._connection(url))
                    continue
                raise
            self.epoch += 1
            self._attached.set()
            return
        raise Unavailable(f"too many redirects attaching {self.kind} {self.name} to {self.topic}")

    def _move_to(self, connection: Connection) -> None:
        self.connection.remove_listener(self)
        self.connection = connection
        connection.add_listener(self)

    def _detach(self) -> None:
        self._attached.clear()
        self._forget_id()

    def _schedule_reattach(self) -> None:
        if self._closing or self.failed is not None or not self._started:
            return
        if self._reattach_task is not None and not self._reattach_task.done():
            return
        self._reattach_task = asyncio.get_running_loop().create_task(
            self._reattach(), name=f"danube-{self.kind}-reattach-{self.name}"
        )

    async def _reattach(self) -> None:
        # While the object is open it is re-created for as long as the failures are
        # retriable, as Pulsar's clients do: an owner paused or cut off for longer than
        # `operation_retries_max` tries must not end a producer or a consumer (scenario
        # B4). The backoff is capped (retry.BACKOFF_MS_MAX), so this costs at most one
        # lookup and one request a second; sends meanwhile wait in the bounded pending
        # queue and fail by their own retries.
        self.reattaches += 1
        attempt = 0
        while True:
            try:
                connection = self.connection
                if not connection.ready and connection.url != self._client.service_url:
                    # The broker we were redirected to is gone: look the topic up again
                    # through the service URL, which redirects to its new broker.
                    log.info("%s %s on %s: %s is unreachable; looking up again", self.kind, self.name, self.topic,
                             connection.url)
                    self._move_to(await self._client._service_connection())
                await self.connection.wait_ready()
                await self._attach_once()
                return
            except DanubeError as exc:
                # BUSY when re-attaching: the name's holder is likely our own earlier session
                # on another connection (a redirect, a connection given up), which the broker
                # drops within its session timeout; a first attach reports BUSY at once.
                busy = isinstance(exc, ProducerBusy | ConsumerBusy)
                if not (exc.retriable or busy):
                    self._fail(exc)
                    return
                level = logging.WARNING if attempt == self._client.operation_retries_max else logging.INFO
                log.log(level, "re-attaching %s %s to %s failed %d times (%s); still retrying", self.kind,
                        self.name, self.topic, attempt + 1, exc)
            await asyncio.sleep(backoff_ms(attempt, self._client._rng) / 1000)
            attempt += 1

    def _fail(self, error: DanubeError) -> None:
        if self.failed is not None or self._closing:
            return
        log.warning("%s %s on %s failed: %s", self.kind, self.name, self.topic, error)
        self.failed = error
        self._attached.set()
        self._on_failed(error)

    async def wait_attached(self) -> Connection:
        """The connection once attached (at most the request timeout), or the failure."""
        if self._attached.is_set() and self.failed is None and not self._closing:
            return self.connection  # the common case, without a timeout context (~6 µs)
        timeout_ms = self._client.request_timeout_ms
        try:
            async with asyncio.timeout(timeout_ms / 1000):
                while True:
                    if self.failed is not None:
                        raise copy_error(self.failed)
                    if self._closing:
                        raise AlreadyClosed(f"{self.kind} {self.name} is closed")
                    if self._attached.is_set():
                        return self.connection
                    await self._attached.wait()
        except TimeoutError:
            raise Timeout(f"{self.kind} {self.name} on {self.topic} not attached within {timeout_ms} ms") from None

    async def _stop_attachment(self) -> Connection | None:
        """Stop re-attaching and leave the connection; returns it if still attached."""
        self._closing = True
        if self._reattach_task is not None:
            self._reattach_task.cancel()
            await asyncio.gather(self._reattach_task, return_exceptions=True)
        connection = self.connection
        if connection is None:
            return None
        connection.remove_listener(self)
        return connection if self._attached.is_set() and self.failed is None and connection.ready else None

    # ---------------------------------------------------------------- ConnectionListener

    def connection_lost(self, connection: Connection, error: DanubeError) -> None:
        if connection is self.connection:
            self._detach()
            if connection.url != self._client.service_url:
                self._schedule_reattach()  # through the service URL (the topic may have moved)

    def connection_restored(self, connection: Connection) -> None:
        if connection is self.connection:
            self._schedule_reattach()

    def connection_closed(self, connection: Connection, error: DanubeError) -> None:
        if connection is self.connection:
            self._fail(error)

    def _broker_closed(self, reason: str, reattach: bool) -> None:
        """The broker closed our object (pushed): re-create it when the broker says it
        may come back (an actor restart); otherwise it is finished (deleted, taken over)."""
        self._detach()
        if reattach:
            log.info("broker closed %s %s on %s: %s; re-attaching", self.kind, self.name, self.topic, reason)
            self._schedule_reattach()
        else:
            self._fail(FailedPrecondition(f"{self.kind} {self.name} on {self.topic} was closed by the broker: {reason}"))

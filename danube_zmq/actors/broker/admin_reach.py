"""Where an admin request runs, and reaching it there: a helper of the broker actor.

- Requests about one topic (describe, subscriptions, seek, failure policies, dispatch
  windows) run where its partitions are: partitions served here by asking their actors,
  the others through the admin port of the broker serving them (`on_owner`); several
  partitions spread over brokers are gathered into one answer. They run in a task of
  their own when a remote broker is involved (`about_topic`, `in_task`), so the broker
  actor is never held by a network round trip.
- Requests for the cluster's leader (balance, rebalance, drain, activate) go to the
  load manager of the broker whose Raft peer leads (`on_leader`).
- A request for another broker goes through the broker's `RemoteAdmin` child for that
  broker's admin port (`remote`), one per port.
- A partition between brokers is waited for in the request's task: the broker calls
  `wake` whenever it has handled a change of a topic's assignment.

What the requests do is `topic_admin.py` and `subscription_admin.py`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from danube_zmq.actors.broker.topic_registry import Registry, TopicEntry
from danube_zmq.actors.cluster.remote_admin import RemoteAdmin
from danube_zmq.actors.sockets.admin_gateway import reply_admin
from danube_zmq.config.broker_config import BrokerConfig
from danube_zmq.consensus.metadata_store import RaftMetadataStore
from danube_zmq.runtime.actor import Origin
from danube_zmq.runtime.request_tasks import RequestTasks
from danube_zmq.runtime.system import ActorSystem
from danube_zmq.security.curve import ClusterCurve
from danube_zmq.storage.paths import check_name
from danube_zmq.transport import admin_protocol as ap
from danube_zmq.transport import cluster_records as cr
from danube_zmq.transport import internal_protocol as ip
from danube_zmq.transport.codec import Message
from danube_zmq.transport.common import Error
from danube_zmq.transport.errors import DanubeError, ResourceExhausted, Unavailable, error_from_code
from danube_zmq.transport.topic_name import parse_topic

__all__ = ["OWNER_WAIT_MS", "AdminReach"]

log = logging.getLogger("danube_zmq.broker")

# How long a request about a topic between brokers waits for its next one (a move takes
# about a tenth of a second), within the admin client's default 5 s timeout.
OWNER_WAIT_MS = 3_000


class AdminReach:
    def __init__(self, *, system: ActorSystem, broker_endpoint: str, metadata: RaftMetadataStore,
                 config: BrokerConfig, registry: Registry, broker_id: int, topics: dict[str, TopicEntry],
                 curve: ClusterCurve | None, tasks: RequestTasks) -> None:
        self.system = system
        self.broker_endpoint = broker_endpoint
        self.metadata = metadata
        self.config = config
        self.registry = registry
        self.broker_id = broker_id
        self.topics = topics  # the broker's own: the topics served here (read only)
        self.curve = curve
        self.tasks = tasks  # the broker's, which cancels them when it stops
        self.remote_admins: dict[str, str] = {}  # admin URL of another broker -> its RemoteAdmin child
        # Admin request tasks waiting for a topic's next assignment (`_owner_changed`):
        # resolved by `wake` when the broker has handled a change of it.
        self.owner_waits: dict[str, list[asyncio.Future[None]]] = {}

    def wake(self, topic: str) -> None:
        for future in self.owner_waits.pop(topic, []):
            if not future.done():
                future.set_result(None)

    async def about_topic(self, msg: Any, origin: Origin, answer: Callable[[Any], Awaitable[Message]]) -> Message | None:
        """Answered here when every partition of the topic is served here, else in a task
        (partitions served elsewhere are asked through their broker's admin port)."""
        subscription = getattr(msg, "subscription", None)
        if subscription is not None:
            check_name("subscription name", subscription)
        names = (await self.registry.existing(parse_topic(msg.topic))).served_names()
        if all(name in self.topics for name in names):
            return await answer(msg)
        self.in_task(msg, origin, answer)
        return None

    def in_task(self, msg: Any, origin: Origin, answer: Callable[[Any], Awaitable[Message]]) -> None:
        identity = origin.identity
        if not self.tasks.answer(answer(msg), type(msg).__name__, lambda reply: reply_admin(
                self.system, identity, reply if isinstance(reply, Message) else _error(msg, reply))):
            raise ResourceExhausted("too many admin requests waiting on other brokers; retry")

    async def on_leader(self, msg: Any) -> Message:
        """Ask the load manager of the broker that leads the cluster."""
        if self.metadata.is_leader:
            reply = await self.system.ask(self.system.load_manager_endpoint,
                                          ip.LoadManagerRequest(frame=ap.ADMIN_PROTOCOL.encode(msg)))
            assert isinstance(reply, ip.LoadManagerReply)
            answer = ap.ADMIN_PROTOCOL.decode(reply.frame)
            if isinstance(answer, Error):
                raise error_from_code(answer.code, answer.message)
            return answer
        await self.metadata.get(cr.LEADER)  # linearizable: the current leader's record
        leader = self.metadata.local_get(cr.LEADER)
        registration = None if leader is None else self.registry.registration(cr.decode(leader.value, cr.LeaderRecord).broker_id)
        if registration is None or registration.broker_id == self.broker_id:
            raise Unavailable("the cluster's leader is not known yet; retry")
        answer = await self.remote(registration.admin_url, lambda rid: dataclasses.replace(msg, request_id=rid))
        return dataclasses.replace(answer, request_id=msg.request_id)  # the caller's id, not ours to the leader

    async def forward(self, owner: Any, msg: Any) -> Message:
        """`msg` answered by the admin port of broker `owner`, under the caller's id."""
        answer = await self.remote(owner.admin_url, lambda rid: dataclasses.replace(msg, request_id=rid))
        return dataclasses.replace(answer, request_id=msg.request_id)

    async def remote(self, admin_url: str, build: Callable[[int], Any], *, timeout_ms: int | None = None) -> Any:
        """One admin request to another broker's admin port, carried by the broker's
        `RemoteAdmin` child for that port (its mailbox is the queue of the requests to
        that broker). Called from admin request tasks, never from a handler: the
        broker answers `RemoteAdminFor` in its own task (`remote_admin_for`)."""
        at = await self.system.ask(self.broker_endpoint, ip.RemoteAdminFor(admin_url=admin_url))
        assert isinstance(at, ip.RemoteAdminAt)
        call_ms = timeout_ms or self.config.cluster.request_timeout_ms
        # The ask also waits for the calls ahead of it on that broker's connection.
        answer = await self.system.ask(
            at.endpoint, ip.RemoteAdminCall(frame=ap.ADMIN_PROTOCOL.encode(build(1)), timeout_ms=timeout_ms),
            timeout_ms=call_ms + 2 * self.config.cluster.request_timeout_ms)
        assert isinstance(answer, ip.RemoteAdminAnswer)
        return ap.ADMIN_PROTOCOL.decode(answer.frame)

    async def remote_admin_for(self, msg: ip.RemoteAdminFor) -> Message:
        """The broker's answer to `RemoteAdminFor`: its `RemoteAdmin` child for that port,
        spawned (in the broker's task: children are the parent's) when it has none."""
        endpoint = self.remote_admins.get(msg.admin_url)
        if endpoint is None or not self.system.is_alive(endpoint):
            url, timeout_ms, name = msg.admin_url, self.config.cluster.request_timeout_ms, f"broker-{self.broker_id}"
            curve = self.curve
            # Closed well before the peer's admin port cuts it idle (the cluster shares limits).
            idle_ms = self.config.limits.connect_timeout_ms // 2
            endpoint = await self.system.spawn(
                lambda: RemoteAdmin(admin_url=url, timeout_ms=timeout_ms, client_name=name, idle_ms=idle_ms,
                                    curve=curve),
                name=f"remote admin {url}", parent=self.broker_endpoint)
            self.remote_admins[url] = endpoint
        return ip.RemoteAdminAt(endpoint=endpoint)

    async def on_owner(self, msg: Any, partition: str, local: Callable[[TopicEntry], Awaitable[Any]], *,
                        wait_ms: int = OWNER_WAIT_MS) -> Any:
        """Run `local` on the partition's actor when it is served here, else send `msg`
        (naming that partition) to the admin port of the broker serving it. A partition
        between brokers (moving, just created) is waited for, up to `wait_ms`,
        each look after the broker handled a change of its assignment (`_owner_changed`);
        one whose broker stopped renewing its lease is answered UNAVAILABLE at once,
        saying when it is reassigned."""
        deadline_ms = self.system.clock.monotonic_ms() + wait_ms
        while True:
            entry = self.topics.get(partition)
            if entry is not None:
                return await local(entry)
            owner = self.registry.elsewhere(partition)
            if owner is not None:
                return await self.remote(owner.admin_url,
                                          lambda rid: dataclasses.replace(msg, request_id=rid, topic=partition))
            assignment = self.registry.assignment(partition)
            if assignment is not None and assignment.broker_id != self.broker_id:
                lease = self.metadata.local_get(cr.register_key(assignment.broker_id))
                ends = "" if lease is None or lease.expires_at_ms is None else \
                    f" in {max(0, lease.expires_at_ms - self.metadata.cluster_now_ms()) / 1000:.1f} s"
                raise Unavailable(f"topic {partition}: its broker {assignment.broker_id} stopped renewing its lease;"
                                  f" another broker takes it over when the lease ends{ends}; retry then")
            left_ms = deadline_ms - self.system.clock.monotonic_ms()
            if left_ms <= 0:
                raise Unavailable(f"topic {partition} has no broker right now; retry")
            await self._owner_changed(partition, left_ms)

    async def _owner_changed(self, topic: str, timeout_ms: int) -> None:
        """Wait, in an admin request's task, until the broker has handled a change of
        `topic`'s assignment (`wake` resolves the future) or `timeout_ms` passes. The
        future is the task's; the broker's handlers only resolve what `owner_waits` holds."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        waiting = self.owner_waits.setdefault(topic, [])
        waiting.append(future)
        try:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout_ms / 1000):
                    await future
        finally:
            if future in waiting:
                waiting.remove(future)
            if not waiting and self.owner_waits.get(topic) is waiting:
                del self.owner_waits[topic]


def _error(msg: Any, exc: DanubeError) -> Error:
    return Error(request_id=msg.request_id, code=exc.code, message=exc.message,
                 redirect_url=getattr(exc, "redirect_url", None))

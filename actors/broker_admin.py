"""The broker's admin requests (`danube admin ...`), a part of `BrokerActor`.

- Namespaces and topics: read and written in the metadata store, on any broker.
- Requests about one topic (describe, subscriptions, seek, failure policies, dispatch
  windows) run where its partitions are: partitions served here by asking their actors,
  the others through the admin port of the broker serving them; several partitions
  spread over brokers are gathered into one answer. They run in a task of their own
  when a remote broker is involved, so the broker actor is never held by a network
  round trip.
- Requests for the cluster's leader (balance, rebalance, drain, activate) go to the
  load manager of the broker whose Raft peer leads.
- A repair of a damaged topic (`topics repair`) runs on the broker the topic is
  assigned to, where its WAL is: another broker forwards it there, in a task.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from danube_zmq.actors.admin_gateway import reply_admin
from danube_zmq.actors.broker_listing import Registered, broker_rows
from danube_zmq.actors.config import TOPIC_POLICY_NAMES
from danube_zmq.actors.remote_admin import RemoteAdmin
from danube_zmq.actors.topic_registry import Resolved, TopicEntry
from danube_zmq.runtime.actor import Origin
from danube_zmq.storage.catalog import topic_key
from danube_zmq.storage.paths import check_name
from danube_zmq.storage.wal.errors import WalDamaged
from danube_zmq.storage.wal.log import WalLog
from danube_zmq.transport import admin_protocol as ap
from danube_zmq.transport import client_protocol as cp
from danube_zmq.transport import cluster_records as cr
from danube_zmq.transport import internal_protocol as ip
from danube_zmq.transport.codec import Message
from danube_zmq.transport.common import Error, Ok
from danube_zmq.transport.errors import (
    AlreadyExists,
    DanubeError,
    FailedPrecondition,
    InternalError,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    Unavailable,
    error_from_code,
)
from danube_zmq.transport.internal_protocol import (
    DeleteSubscription,
    DescribePartition,
    PartitionStats,
    PersistCursor,
)
from danube_zmq.transport.topic_name import TopicName, parse_topic, validate_namespace

log = logging.getLogger("danube_zmq.broker")


def _damage_text(topic: str, damage: WalDamaged) -> str:
    return (f"topic {topic} is not served: its WAL is damaged ({damage}); offsets from {damage.valid_end} on"
            f" cannot be read. An operator can serve it again, giving them up:"
            f" danube admin topics repair {topic} --accept-loss")

# How long a request about a topic between brokers waits for its next one (a move takes
# about a tenth of a second), within the admin client's default 5 s timeout.
_OWNER_WAIT_MS = 3_000


class BrokerAdmin:
    """Mixed into `BrokerActor`; uses its registry, metadata store and topics."""

    # Requests for the cluster's leader (its load manager): in a task, the actor never
    # waits on a peer.
    def handle_GetClusterBalance(self, msg: ap.GetClusterBalance, origin: Origin) -> None:
        self._answer_in_task(msg, origin, self._on_leader)

    def handle_RebalanceCluster(self, msg: ap.RebalanceCluster, origin: Origin) -> None:
        self._answer_in_task(msg, origin, self._on_leader)

    def handle_UnloadBroker(self, msg: ap.UnloadBroker, origin: Origin) -> None:
        self._answer_in_task(msg, origin, self._on_leader)

    def handle_ActivateBroker(self, msg: ap.ActivateBroker, origin: Origin) -> None:
        self._answer_in_task(msg, origin, self._on_leader)

    def handle_UnloadTopic(self, msg: ap.UnloadTopic, origin: Origin) -> None:
        self._answer_in_task(msg, origin, self._unload_topic)  # a move in local mode waits on its hand-over

    async def handle_RepairTopic(self, msg: ap.RepairTopic, origin: Origin) -> Message | None:
        owner = self._repair_owner(msg)
        if owner is None:
            return await self._repair_topic(msg)
        # Repaired where its WAL is, in a task: the actor never waits on a peer.
        self._answer_in_task(msg, origin, functools.partial(self._forward_admin, owner))
        return None

    # Requests about one topic, run where its partitions are served.
    async def handle_DescribeTopic(self, msg: ap.DescribeTopic, origin: Origin) -> Message | None:
        return await self._about_topic(msg, origin, functools.partial(self._describe_topic, partial=True))

    async def handle_ListSubscriptions(self, msg: ap.ListSubscriptions, origin: Origin) -> Message | None:
        return await self._about_topic(msg, origin, self._list_subscriptions)

    async def handle_Unsubscribe(self, msg: ap.Unsubscribe, origin: Origin) -> Message | None:
        return await self._about_topic(msg, origin, self._unsubscribe)

    async def handle_SeekSubscription(self, msg: ap.SeekSubscription, origin: Origin) -> Message | None:
        return await self._about_topic(msg, origin, self._seek_subscription)

    async def handle_SetFailurePolicy(self, msg: ap.SetFailurePolicy, origin: Origin) -> Message | None:
        return await self._about_topic(msg, origin, self._set_failure_policy)

    async def handle_GetFailurePolicy(self, msg: ap.GetFailurePolicy, origin: Origin) -> Message | None:
        return await self._about_topic(msg, origin, self._get_failure_policy)

    async def handle_SetDispatchConfig(self, msg: ap.SetDispatchConfig, origin: Origin) -> Message | None:
        return await self._about_topic(msg, origin, self._set_dispatch_config)

    async def handle_GetDispatchConfig(self, msg: ap.GetDispatchConfig, origin: Origin) -> Message | None:
        return await self._about_topic(msg, origin, self._get_dispatch_config)

    async def _about_topic(self, msg: Any, origin: Origin, answer: Callable[[Any], Awaitable[Message]]) -> Message | None:
        """Answered here when every partition of the topic is served here, else in a task
        (partitions served elsewhere are asked through their broker's admin port)."""
        subscription = getattr(msg, "subscription", None)
        if subscription is not None:
            check_name("subscription name", subscription)
        names = (await self._existing(parse_topic(msg.topic))).served_names()
        if all(name in self.topics for name in names):
            return await answer(msg)
        self._answer_in_task(msg, origin, answer)
        return None

    def _answer_in_task(self, msg: Any, origin: Origin, answer: Callable[[Any], Awaitable[Message]]) -> None:
        if not self._remote_admin.start(self._answer_admin(origin.identity, msg, answer)):
            raise ResourceExhausted("too many admin requests waiting on other brokers; retry")

    async def _answer_admin(self, identity: bytes, msg: Any, answer: Callable[[Any], Awaitable[Message]]) -> None:
        """A request answered in a task: out of the actor, so a bug is answered INTERNAL
        and logged, with no actor to restart."""
        try:
            reply = await answer(msg)
        except DanubeError as exc:
            reply = _error(msg, exc)
        except Exception as exc:
            log.exception("admin request %s failed", type(msg).__name__)
            reply = _error(msg, InternalError(f"{type(msg).__name__} failed: {type(exc).__name__}: {exc}"))
        reply_admin(self.system, identity, reply)

    async def _on_leader(self, msg: Any) -> Message:
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
        registration = None if leader is None else self._registration(cr.decode(leader.value, cr.LeaderRecord).broker_id)
        if registration is None or registration.broker_id == self.broker_id:
            raise Unavailable("the cluster's leader is not known yet; retry")
        answer = await self._remote(registration.admin_url, lambda rid: dataclasses.replace(msg, request_id=rid))
        return dataclasses.replace(answer, request_id=msg.request_id)  # the caller's id, not ours to the leader

    def _repair_owner(self, msg: ap.RepairTopic) -> Any:
        """The other live broker a repair must run on (the topic is assigned there); None:
        here (damaged here, or no such broker: answered here)."""
        try:
            topic = parse_topic(msg.topic).full
        except DanubeError:
            return None
        return None if topic in self.damaged else self._elsewhere(topic)

    async def _forward_admin(self, owner: Any, msg: Any) -> Message:
        """`msg` answered by the admin port of broker `owner`, under the caller's id."""
        answer = await self._remote(owner.admin_url, lambda rid: dataclasses.replace(msg, request_id=rid))
        return dataclasses.replace(answer, request_id=msg.request_id)

    async def _remote(self, admin_url: str, build: Callable[[int], Any], *, timeout_ms: int | None = None) -> Any:
        """One admin request to another broker's admin port, carried by the broker's
        `RemoteAdmin` child for that port (its mailbox is the queue of the requests to
        that broker). Called from admin request tasks, never from a handler: the
        broker answers `RemoteAdminFor` in its own task."""
        at = await self.system.ask(self.endpoint, ip.RemoteAdminFor(admin_url=admin_url))
        assert isinstance(at, ip.RemoteAdminAt)
        call_ms = timeout_ms or self.config.cluster.request_timeout_ms
        # The ask also waits for the calls ahead of it on that broker's connection.
        answer = await self.system.ask(
            at.endpoint, ip.RemoteAdminCall(frame=ap.ADMIN_PROTOCOL.encode(build(1)), timeout_ms=timeout_ms),
            timeout_ms=call_ms + 2 * self.config.cluster.request_timeout_ms)
        assert isinstance(answer, ip.RemoteAdminAnswer)
        return ap.ADMIN_PROTOCOL.decode(answer.frame)

    async def handle_RemoteAdminFor(self, msg: ip.RemoteAdminFor) -> Message:
        endpoint = self.remote_admins.get(msg.admin_url)
        if endpoint is None or not self.system.is_alive(endpoint):
            url, timeout_ms, name = msg.admin_url, self.config.cluster.request_timeout_ms, f"broker-{self.broker_id}"
            curve = self.curve
            # Closed well before the peer's admin port cuts it idle (the cluster shares limits).
            idle_ms = self.config.limits.connect_timeout_ms // 2
            endpoint = await self.system.spawn(
                lambda: RemoteAdmin(admin_url=url, timeout_ms=timeout_ms, client_name=name, idle_ms=idle_ms,
                                    curve=curve),
                name=f"remote admin {url}", parent=self.endpoint)
            self.remote_admins[url] = endpoint
        return ip.RemoteAdminAt(endpoint=endpoint)

    async def _on_owner(self, msg: Any, partition: str, local: Callable[[TopicEntry], Awaitable[Any]], *,
                        wait_ms: int = _OWNER_WAIT_MS) -> Any:
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
            owner = self._elsewhere(partition)
            if owner is not None:
                return await self._remote(owner.admin_url,
                                          lambda rid: dataclasses.replace(msg, request_id=rid, topic=partition))
            assignment = self._assignment(partition)
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
        `topic`'s assignment (`_wake` resolves the future) or `timeout_ms` passes. The
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

    async def handle_ListNamespaces(self, msg: ap.ListNamespaces, origin: Origin) -> Message:
        names = [key[len(cr.NAMESPACES):] for key, _ in await self.metadata.list_prefix(cr.NAMESPACES)]
        return ap.NamespaceList(request_id=msg.request_id, namespaces=sorted(names))

    async def handle_CreateNamespace(self, msg: ap.CreateNamespace, origin: Origin) -> Message:
        namespace = validate_namespace(msg.namespace)
        created = await self.metadata.compare_and_swap(cr.namespace_key(namespace), 0, b"")
        if not created.succeeded:
            raise AlreadyExists(f"namespace '{namespace}' already exists")
        return Ok(request_id=msg.request_id)

    async def handle_DeleteNamespace(self, msg: ap.DeleteNamespace, origin: Origin) -> Message:
        namespace = validate_namespace(msg.namespace)
        key = cr.namespace_key(namespace)
        current = await self.metadata.get(key)
        if current is None:
            raise NotFound(f"namespace '{namespace}' does not exist")
        held = await self._topic_records(namespace)
        if held:
            raise FailedPrecondition(f"namespace '{namespace}' still has {len(held)} topics; delete them first")
        if not await self.metadata.transaction({key: current.version}, {},
                                               [key, cr.namespace_backlog_quota_key(namespace),
                                                cr.namespace_limits_key(namespace),
                                                cr.auto_topic_creation_key(namespace),
                                                cr.namespace_topic_policies_key(namespace)]):
            raise FailedPrecondition(f"namespace '{namespace}' changed meanwhile; retry")
        return Ok(request_id=msg.request_id)

    async def _topic_records(self, namespace: str) -> list[tuple[str, cr.TopicRecord]]:
        prefix = f"{cr.TOPICS}{namespace}/"
        return [(cr.topic_of(key, cr.TOPICS), cr.decode(value.value, cr.TopicRecord))
                for key, value in await self.metadata.list_prefix(prefix) if key.count("/") == 3]

    async def handle_ListTopics(self, msg: ap.ListTopics, origin: Origin) -> Message:
        namespace = validate_namespace(msg.namespace)
        if not await self._namespace_exists(namespace):
            raise NotFound(f"namespace '{namespace}' does not exist")
        topics = []
        for full, record in await self._topic_records(namespace):
            name = parse_topic(full)
            names = [name.partition_name(i) for i in range(record.partitions)] if record.partitions else [full]
            owners = [self._owner_of(n) for n in names]
            topics.append(ap.TopicInfo(name=full, dispatch_strategy=record.dispatch_strategy,
                                       partitions=record.partitions, broker_id=owners[0].broker_id or 0,
                                       owners=owners))
        return ap.TopicList(request_id=msg.request_id, topics=topics)

    def _owner_of(self, topic: str) -> ap.PartitionOwner:
        """The broker `topic` (one partition) is assigned to, in this broker's applied
        state. An assignment naming a broker with no registration (its lease ended, the
        topic is about to be reassigned) keeps the id, without a URL to reach it."""
        assignment = self._assignment(topic)
        if assignment is None:
            return ap.PartitionOwner(name=topic, broker_id=None, broker_url=None)
        if assignment.broker_id == self.broker_id:
            return ap.PartitionOwner(name=topic, broker_id=self.broker_id, broker_url=self.broker_url)
        registration = self._registration(assignment.broker_id)
        return ap.PartitionOwner(name=topic, broker_id=assignment.broker_id,
                                 broker_url=None if registration is None else registration.broker_url)

    async def handle_CreateTopic(self, msg: ap.CreateTopic, origin: Origin) -> Message:
        await self._write_topic(parse_topic(msg.topic), msg.partitions, msg.dispatch_strategy)
        return Ok(request_id=msg.request_id)

    async def handle_DeleteTopic(self, msg: ap.DeleteTopic, origin: Origin) -> Message:
        resolved = await self._existing(parse_topic(msg.topic))
        if resolved.name.full != resolved.base.full:
            # Danube's wording: danube-admin users (and Danube's own CLI test) look for it.
            raise FailedPrecondition(f"Cannot delete individual partition '{resolved.name.full}'. Delete the base"
                                     f" topic instead: {resolved.base.full}")
        key = cr.topic_record_key(resolved.base.full)
        current = await self.metadata.get(key)
        if current is None:
            raise NotFound(f"topic {resolved.base.full} does not exist")
        names = resolved.served_names()
        store = self.metadata
        stale = [cr.assignment_key(n) for n in names] + [cr.unassigned_key(n) for n in names]
        stale += [cr.topic_state_key(n) for n in names] + [cr.damaged_key(n) for n in names]
        stale.append(cr.topic_backlog_quota_key(resolved.base.full))
        stale.append(cr.topic_policies_key(resolved.base.full))
        stale += [k for n in names for k, _ in store.local_scan(f"{topic_key(n)}/")]  # cursors
        # The record goes first, with as many keys as one batch holds: from then on the
        # topic does not exist for anyone. The rest follows in batches, each only while
        # the name has not been created again.
        per_batch = self._keys_per_batch()  # type: ignore[attr-defined]
        first, rest = stale[:per_batch - 1], stale[per_batch - 1:]
        if not await self.metadata.transaction({key: current.version}, {}, [key, *first]):
            raise FailedPrecondition(f"topic {resolved.base.full} changed meanwhile; retry")
        for start in range(0, len(rest), per_batch):
            if not await self.metadata.transaction({key: 0}, {}, rest[start:start + per_batch]):
                log.warning("topic %s was created again while its old keys were deleted; %d keys left",
                            resolved.base.full, len(rest) - start)
                break
        for name in names:  # the partitions served here now; other brokers follow the deletion
            if name in self.topics:
                await self._unload(name, deleted=True)
                await self._delete_local(name)
            await self._delete_durable(name)
        return Ok(request_id=msg.request_id)

    async def _unload_topic(self, msg: ap.UnloadTopic) -> Message:
        resolved = await self._existing(parse_topic(msg.topic))
        for name in resolved.served_names():  # a damaged topic would wait forever for its seal
            damage = self.damaged.get(name)
            if damage is not None:
                raise FailedPrecondition(f"not unloaded: {_damage_text(name, damage)}")
            value = await self.metadata.get(cr.damaged_key(name))  # linearizable: recorded on another broker
            if value is not None:
                record = cr.decode(value.value, cr.WalDamageRecord)
                raise FailedPrecondition(
                    f"not unloaded: topic {name} is not served by broker {record.broker_id}: its WAL is damaged"
                    f" ({record.reason}); offsets from {record.valid_end} on cannot be read. An operator can serve"
                    f" it again, giving them up: danube admin topics repair {name} --accept-loss")
        moved = 0
        for name in resolved.served_names():
            if self._moves_by_handover(name):
                await self._unload_by_handover(name, msg)
                moved += 1
                continue
            key = cr.assignment_key(name)
            current = await self.metadata.get(key)
            if current is None:
                continue  # between brokers already
            assignment = cr.decode(current.value, cr.Assignment)
            marker = cr.Unassigned(reason=cr.UnassignedReason.UNLOAD, from_broker=assignment.broker_id,
                                   epoch=assignment.epoch, since_ms=self.system.clock.now_ms(), sealed=False)
            if await self.metadata.transaction({key: current.version, cr.unassigned_key(name): 0},
                                               {cr.unassigned_key(name): cr.encode(marker)}, [key]):
                moved += 1
        if not moved:
            raise FailedPrecondition(f"topic {resolved.name.full} is not served by any broker right now; retry")
        return Ok(request_id=msg.request_id)

    async def _repair_topic(self, msg: ap.RepairTopic) -> Message:
        """Give up the unreadable records of a topic whose WAL is damaged (on the broker it
        is assigned to) and serve it again; a dry run without `accept_loss`."""
        resolved = await self._existing(parse_topic(msg.topic))
        topic = resolved.name.full
        if resolved.partitioned_base:
            raise FailedPrecondition(f"topic {topic} has partitions: repair the damaged one (topics describe names it)")
        damage = self.damaged.get(topic)
        if damage is None:
            if self._elsewhere(topic) is not None:  # assigned there since the request was routed
                raise Unavailable(f"topic {topic} moved to another broker meanwhile; retry")
            if topic in self.topics:
                raise FailedPrecondition(f"topic {topic} is served: its WAL is not damaged, nothing to repair")
            raise Unavailable(f"topic {topic} has no broker right now; retry")
        resume = self._resume_offset(resolved.name, damage)
        if not msg.accept_loss:
            return ap.TopicRepaired(
                request_id=msg.request_id, topic=topic, repaired=False, reason=str(damage),
                lost_start=damage.valid_end if resume > damage.valid_end else None,
                lost_end=resume if resume > damage.valid_end else None, acknowledged_end=damage.acknowledged_offset,
                next_offset=resume, quarantined=[str(damage.quarantined)] if damage.quarantined else [])
        report = await asyncio.to_thread(WalLog.repair, self._wal_dir(resolved.name), resume_offset=resume,
                                         clock=self.system.clock)
        self._forget_damage(topic)
        await self._load(topic)
        if topic not in self.topics:
            still = self.damaged.get(topic)
            raise Unavailable(f"topic {topic}: repaired, but not served: {still if still is not None else 'retry'}")
        lost = report.lost
        quarantined = [str(damage.quarantined)] if damage.quarantined else []
        return ap.TopicRepaired(
            request_id=msg.request_id, topic=topic, repaired=True, reason=str(damage),
            lost_start=lost[0] if lost else None, lost_end=lost[1] if lost else None,
            acknowledged_end=damage.acknowledged_offset, next_offset=report.next_offset,
            quarantined=quarantined + [str(path) for path in report.quarantined if str(path) not in quarantined])

    def _resume_offset(self, name: Any, damage: WalDamaged) -> int:
        """Past every offset the topic may have given out: what its WAL is known to have
        held, where it was recorded stopped, its reservation, and its durable segments."""
        floors = [damage.claimed_end, damage.valid_end]
        value = self.metadata.local_get(cr.topic_state_key(name.full))
        if value is not None:
            state = cr.decode(value.value, cr.TopicState)
            floors += [state.next_offset, state.reserved_until]
        if self.segment_catalog is not None:
            segments = self.segment_catalog.list(name.full)
            if segments:
                floors.append(segments[-1].end_offset + 1)
        return max(floors)

    async def _describe_topic(self, msg: ap.DescribeTopic, *, partial: bool = False) -> Message:
        """`partial`: a partitioned topic's partitions that no broker serves right now are
        described as such (`not_served`), the others as usual; the waits for their
        brokers share one `_OWNER_WAIT_MS`, within the admin client's timeout."""
        resolved = await self._existing(parse_topic(msg.topic))
        partial = partial and resolved.partitioned_base
        deadline_ms = self.system.clock.monotonic_ms() + _OWNER_WAIT_MS
        partitions = []
        owner = 0
        for partition in resolved.served_names():
            damage = self.damaged.get(partition)
            if damage is not None:  # assigned here, not served: say why instead of waiting for it
                partitions.append(ap.PartitionInfo(
                    name=partition, next_offset=damage.valid_end, producers=[], messages_in=0, bytes_in=0,
                    dropped_messages=0, subscriptions=[], wal_damage=_damage_text(partition, damage),
                    broker_id=self.broker_id, broker_url=self.broker_url))
                owner = owner or self.broker_id
                continue

            async def local(entry: TopicEntry) -> list[ap.PartitionInfo]:
                stats = await self.system.ask(entry.endpoint, DescribePartition())
                assert isinstance(stats, PartitionStats)
                return [dataclasses.replace(stats.info, broker_id=self.broker_id, broker_url=self.broker_url)]

            try:
                answer = await self._on_owner(msg, partition, local,
                                              wait_ms=max(0, deadline_ms - self.system.clock.monotonic_ms()))
            except Unavailable as exc:
                if not partial:
                    raise
                partitions.append(self._not_served(partition, exc.message))
                continue
            for info in answer.partitions if isinstance(answer, ap.TopicDescription) else answer:
                if info.broker_id is None:  # answered by a broker from before the field: its assignment says
                    owner_of = self._owner_of(partition)
                    info = dataclasses.replace(info, broker_id=owner_of.broker_id, broker_url=owner_of.broker_url)
                partitions.append(info)
            if not owner:
                assignment = self._assignment(partition)
                owner = assignment.broker_id if assignment is not None else 0
        policies, sources = self.topic_policies_of(resolved.name)
        return ap.TopicDescription(request_id=msg.request_id, name=resolved.name.full,
                                   dispatch_strategy=resolved.record.dispatch_strategy, broker_id=owner,
                                   partitions=partitions,
                                   policies={name: getattr(policies, name) for name in TOPIC_POLICY_NAMES},
                                   policy_sources=sources)

    def _not_served(self, partition: str, why: str) -> ap.PartitionInfo:
        """A partition no broker serves right now: where its offsets stopped (a reliable
        topic's seal; else 0), no counters, the broker it is assigned to if any, and why."""
        value = self.metadata.local_get(cr.topic_state_key(partition))
        next_offset = 0 if value is None else cr.decode(value.value, cr.TopicState).next_offset
        owner = self._owner_of(partition)
        return ap.PartitionInfo(name=partition, next_offset=next_offset, producers=[], messages_in=0, bytes_in=0,
                                dropped_messages=0, subscriptions=[], broker_id=owner.broker_id,
                                broker_url=owner.broker_url, not_served=why)

    async def _list_subscriptions(self, msg: ap.ListSubscriptions) -> Message:
        described = await self._describe_topic(ap.DescribeTopic(request_id=msg.request_id, topic=msg.topic))
        assert isinstance(described, ap.TopicDescription)
        names = sorted({s.name for p in described.partitions for s in p.subscriptions})
        return ap.SubscriptionList(request_id=msg.request_id, subscriptions=names)

    async def _unsubscribe(self, msg: ap.Unsubscribe) -> Message:
        resolved = await self._existing(parse_topic(msg.topic))
        found = False
        for partition in resolved.served_names():
            async def local(entry: TopicEntry) -> None:
                await self.system.ask(entry.endpoint, DeleteSubscription(subscription=msg.subscription))

            try:
                await self._on_owner(msg, partition, local)
                found = True
            except NotFound:
                continue
        if not found:
            raise NotFound(f"subscription '{msg.subscription}' does not exist on topic {resolved.name.full}")
        return Ok(request_id=msg.request_id)

    async def handle_ListBrokers(self, msg: ap.ListBrokers, origin: Origin) -> Message:
        await self.metadata.get(cr.LEADER)  # a linearizable barrier: registrations as of now
        store = self.metadata
        leader = store.local_get(cr.LEADER)
        leader_id = cr.decode(leader.value, cr.LeaderRecord).broker_id if leader is not None else None
        registered = []
        for key, value in store.local_scan(cr.REGISTER):
            registration = cr.decode(value.value, cr.BrokerRegistration)
            mode = store.local_get(cr.state_key(registration.broker_id))
            registered.append(Registered(
                registration=registration, renewing=not store.stopped_renewing(key),
                mode=str(cr.decode(mode.value, cr.BrokerStateRecord).mode if mode is not None else cr.BrokerMode.ACTIVE)))
        seen = [cr.decode(value.value, cr.BrokerRegistration)
                for key, value in store.local_scan(cr.BROKERS) if key.endswith("/seen")]
        members = {member.node_id for member in store.members()}
        return ap.BrokerList(request_id=msg.request_id, brokers=broker_rows(
            registered, seen, members, leader_id, standalone=self.config.cluster.raft_listen is None))

    # ------------------------------------------------------------- admin: reliable subscriptions
    async def _seek_subscription(self, msg: ap.SeekSubscription) -> Message:
        resolved = await self._reliable(msg.topic)
        if resolved.partitioned_base and msg.offset is not None:
            raise InvalidArgument(f"topic {resolved.name.full} has {resolved.record.partitions} partitions and offsets"
                                  f" are per partition: seek by publish time, or name one partition topic"
                                  f" ({resolved.name.partition_name(0)} ...)")
        for partition in resolved.served_names():
            async def local(entry: TopicEntry) -> None:
                await self.system.ask(entry.endpoint, ip.SeekCursor(
                    subscription=msg.subscription, offset=msg.offset, publish_time=msg.publish_time))

            await self._on_owner(msg, partition, local)
        return Ok(request_id=msg.request_id)

    async def _set_failure_policy(self, msg: ap.SetFailurePolicy) -> Message:
        if msg.dead_letter_topic is not None:
            parse_topic(msg.dead_letter_topic)  # a bad name is refused before any lookup
        resolved = await self._reliable(msg.topic)
        if msg.dead_letter_topic:
            await self._dead_letter_topic(parse_topic(msg.dead_letter_topic))
        policy = ip.FailurePolicyState(
            max_redelivery_count=msg.max_redelivery_count, ack_timeout_ms=msg.ack_timeout_ms,
            base_redelivery_delay_ms=msg.base_redelivery_delay_ms, max_redelivery_delay_ms=msg.max_redelivery_delay_ms,
            backoff=msg.backoff, poison_policy=msg.poison_policy, dead_letter_topic=msg.dead_letter_topic)
        for partition in resolved.served_names():
            async def local(entry: TopicEntry) -> None:
                record = await self.system.ask(entry.endpoint, ip.SetSubscriptionPolicy(
                    subscription=msg.subscription, policy=policy))
                assert isinstance(record, PersistCursor)
                await self.system.send(self.flusher_endpoint, record)  # ahead of the flush below

            await self._on_owner(msg, partition, local)
        await self._flush_cursors()  # stored before the answer: the policy survives a crash right after
        return Ok(request_id=msg.request_id)

    async def _dead_letter_topic(self, name: TopicName) -> None:
        """Create a subscription's dead-letter topic now, reliable as the first dead
        letter would, so that its consumers can subscribe before that letter (and an
        unusable name, a missing namespace, is refused here, not found out at the first
        letter)."""
        if await self._resolve(name) is None:
            try:
                await self._write_topic(name, 0, cp.DispatchStrategy.RELIABLE)
            except AlreadyExists:
                pass

    async def _get_failure_policy(self, msg: ap.GetFailurePolicy) -> Message:
        resolved = await self._reliable(msg.topic)

        async def local(entry: TopicEntry) -> Message:
            answer = await self.system.ask(entry.endpoint, ip.GetSubscriptionPolicy(subscription=msg.subscription))
            assert isinstance(answer, ip.SubscriptionPolicy)
            policy = answer.policy
            return ap.FailurePolicyInfo(
                request_id=msg.request_id, max_redelivery_count=policy.max_redelivery_count,
                ack_timeout_ms=policy.ack_timeout_ms, base_redelivery_delay_ms=policy.base_redelivery_delay_ms,
                max_redelivery_delay_ms=policy.max_redelivery_delay_ms, backoff=policy.backoff,
                poison_policy=policy.poison_policy, dead_letter_topic=policy.dead_letter_topic,
                explicit=answer.explicit)

        answer = await self._on_owner(msg, resolved.served_names()[0], local)
        return dataclasses.replace(answer, request_id=msg.request_id)

    async def _set_dispatch_config(self, msg: ap.SetDispatchConfig) -> Message:
        resolved = await self._reliable(msg.topic)
        for partition in resolved.served_names():
            async def local(entry: TopicEntry) -> None:
                record = await self.system.ask(entry.endpoint, ip.SetSubscriptionDispatchConfig(
                    subscription=msg.subscription, max_unacked_messages=msg.max_unacked_messages))
                assert isinstance(record, PersistCursor)
                await self.system.send(self.flusher_endpoint, record)  # ahead of the flush below

            await self._on_owner(msg, partition, local)
        await self._flush_cursors()  # stored before the answer, as the failure policy
        return Ok(request_id=msg.request_id)

    async def _get_dispatch_config(self, msg: ap.GetDispatchConfig) -> Message:
        resolved = await self._reliable(msg.topic)

        async def local(entry: TopicEntry) -> Message:
            answer = await self.system.ask(entry.endpoint, ip.GetSubscriptionDispatchConfig(
                subscription=msg.subscription))
            assert isinstance(answer, ip.SubscriptionDispatchConfig)
            return ap.DispatchConfigInfo(request_id=msg.request_id, max_unacked_messages=answer.max_unacked_messages,
                                         explicit=answer.explicit)

        answer = await self._on_owner(msg, resolved.served_names()[0], local)
        return dataclasses.replace(answer, request_id=msg.request_id)

    async def _reliable(self, topic: str) -> Resolved:
        resolved = await self._existing(parse_topic(topic))
        if resolved.record.dispatch_strategy != cp.DispatchStrategy.RELIABLE:
            raise FailedPrecondition(f"topic {resolved.name.full} is not reliable: seek, failure policies and dispatch"
                                     " windows apply to subscriptions of reliable topics only")
        return resolved


def _error(msg: Any, exc: DanubeError) -> Error:
    return Error(request_id=msg.request_id, code=exc.code, message=exc.message,
                 redirect_url=getattr(exc, "redirect_url", None))

"""The broker's admin requests about topics that act on the topics served here: delete,
unload, repair, describe. A helper of the broker actor (which hands it each request);
where each runs is `admin_reach.py`.

- Delete: the topic's record and every key of it go from the metadata store (in
  batches), then its partitions served here are unloaded and their files and durable
  segments deleted; other brokers follow the deletion of the assignments.
- Unload: each partition gets an unassigned marker (the load manager gives it to
  another broker once it is sealed), or, reliable in storage.mode local, is handed over
  (`hand_over.py`): by a `HandOver` child of the broker serving it, the request's task
  waiting for its end. A damaged topic is refused: it would wait forever for its seal.
- Reassign (forced): a local-mode topic whose broker is gone, given up to another
  broker past every offset the dead one reserved.
- A repair of a damaged topic (`topics repair`) runs on the broker the topic is
  assigned to, where its WAL is: another broker forwards it there, in a task.
- Compact asks each partition's topic actor, where it is served, to start a
  compaction (`wal/compacting.py`); its status is in the description.
- Describe gathers each partition's statistics where it is served; a partitioned
  topic's partitions no broker serves right now are described as such.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import TYPE_CHECKING, Any

from danube_zmq.actors.broker import admin_reach
from danube_zmq.actors.broker.admin_reach import AdminReach
from danube_zmq.actors.broker.topic_registry import TopicEntry
from danube_zmq.actors.broker.wal_damage import damage_text
from danube_zmq.actors.move.hand_over import move_target, moves_by_handover
from danube_zmq.actors.policy import policies
from danube_zmq.config.broker_config import TOPIC_POLICY_NAMES
from danube_zmq.storage.catalog import topic_key
from danube_zmq.storage.wal.errors import WalDamaged
from danube_zmq.storage.wal.log import WalLog
from danube_zmq.transport import admin_protocol as ap
from danube_zmq.transport import client_protocol as cp
from danube_zmq.transport import cluster_records as cr
from danube_zmq.transport.codec import Message
from danube_zmq.transport.common import Ok
from danube_zmq.transport.errors import DanubeError, FailedPrecondition, NotFound, Unavailable
from danube_zmq.transport.internal_protocol import CompactTopicNow, DescribePartition, PartitionStats, StopForHandOver
from danube_zmq.transport.topic_name import parse_topic

if TYPE_CHECKING:
    from danube_zmq.actors.broker.broker import BrokerActor

__all__ = ["TopicAdmin"]

log = logging.getLogger("danube_zmq.broker")


class TopicAdmin:
    """Acts on the broker's topics through `broker`, its owner (the topics served here,
    their damage, loading and unloading them)."""

    def __init__(self, broker: BrokerActor, reach: AdminReach) -> None:
        self.broker = broker
        self.reach = reach
        self.system = broker.system
        self.metadata = broker.metadata
        self.config = broker.config
        self.registry = broker.registry

    async def delete_topic(self, msg: ap.DeleteTopic) -> Message:
        resolved = await self.registry.existing(parse_topic(msg.topic))
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
        per_batch = self.broker.catalog.keys_per_batch()
        first, rest = stale[:per_batch - 1], stale[per_batch - 1:]
        if not await self.metadata.transaction({key: current.version}, {}, [key, *first]):
            raise FailedPrecondition(f"topic {resolved.base.full} changed meanwhile; retry")
        for start in range(0, len(rest), per_batch):
            if not await self.metadata.transaction({key: 0}, {}, rest[start:start + per_batch]):
                log.warning("topic %s was created again while its old keys were deleted; %d keys left",
                            resolved.base.full, len(rest) - start)
                break
        for name in names:  # the partitions served here now; other brokers follow the deletion
            if name in self.broker.topics:
                await self.broker.unload(name, deleted=True)
                await self.broker.delete_local(name)
            await self.broker.files.delete_durable(name)
        return Ok(request_id=msg.request_id)

    async def unload_topic(self, msg: ap.UnloadTopic) -> Message:
        resolved = await self.registry.existing(parse_topic(msg.topic))
        for name in resolved.served_names():  # a damaged topic would wait forever for its seal
            damage = self.broker.damaged.get(name)
            if damage is not None:
                raise FailedPrecondition(f"not unloaded: {damage_text(name, damage)}")
            value = await self.metadata.get(cr.damaged_key(name))  # linearizable: recorded on another broker
            if value is not None:
                record = cr.decode(value.value, cr.WalDamageRecord)
                raise FailedPrecondition(
                    f"not unloaded: topic {name} is not served by broker {record.broker_id}: its WAL is damaged"
                    f" ({record.reason}); offsets from {record.valid_end} on cannot be read. An operator can serve"
                    f" it again, giving them up: danube admin topics repair {name} --accept-loss")
        moved = 0
        for name in resolved.served_names():
            if moves_by_handover(self.config, self.registry, name):
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

    async def compact_topic(self, msg: ap.CompactTopic) -> Message:
        resolved = await self.registry.existing(parse_topic(msg.topic))
        if resolved.record.dispatch_strategy != cp.DispatchStrategy.RELIABLE:
            raise FailedPrecondition(f"topic {resolved.name.full} is not reliable: only stored messages are compacted")
        for partition in resolved.served_names():
            async def local(entry: TopicEntry) -> None:
                await self.system.ask(entry.endpoint, CompactTopicNow())

            await self.reach.on_owner(msg, partition, local)
        return Ok(request_id=msg.request_id)

    def repair_owner(self, msg: ap.RepairTopic) -> Any:
        """The other live broker a repair must run on (the topic is assigned there); None:
        here (damaged here, or no such broker: answered here)."""
        try:
            topic = parse_topic(msg.topic).full
        except DanubeError:
            return None
        return None if topic in self.broker.damaged else self.registry.elsewhere(topic)

    async def repair_topic(self, msg: ap.RepairTopic) -> Message:
        """Give up the unreadable records of a topic whose WAL is damaged (on the broker it
        is assigned to) and serve it again; a dry run without `accept_loss`."""
        resolved = await self.registry.existing(parse_topic(msg.topic))
        topic = resolved.name.full
        if resolved.partitioned_base:
            raise FailedPrecondition(f"topic {topic} has partitions: repair the damaged one (topics describe names it)")
        damage = self.broker.damaged.get(topic)
        if damage is None:
            if self.registry.elsewhere(topic) is not None:  # assigned there since the request was routed
                raise Unavailable(f"topic {topic} moved to another broker meanwhile; retry")
            if topic in self.broker.topics:
                raise FailedPrecondition(f"topic {topic} is served: its WAL is not damaged, nothing to repair")
            raise Unavailable(f"topic {topic} has no broker right now; retry")
        resume = self._resume_offset(resolved.name, damage)
        if not msg.accept_loss:
            return ap.TopicRepaired(
                request_id=msg.request_id, topic=topic, repaired=False, reason=str(damage),
                lost_start=damage.valid_end if resume > damage.valid_end else None,
                lost_end=resume if resume > damage.valid_end else None, acknowledged_end=damage.acknowledged_offset,
                next_offset=resume, quarantined=[str(damage.quarantined)] if damage.quarantined else [])
        report = await asyncio.to_thread(WalLog.repair, self.broker.files.wal_dir(resolved.name), resume_offset=resume,
                                         clock=self.system.clock)
        self.broker.damaged.forget(topic)
        await self.broker.load(topic)
        if topic not in self.broker.topics:
            still = self.broker.damaged.get(topic)
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
        if self.broker.files.segment_catalog is not None:
            segments = self.broker.files.segment_catalog.list(name.full)
            if segments:
                floors.append(segments[-1].end_offset + 1)
        return max(floors)

    async def describe_topic(self, msg: ap.DescribeTopic, *, partial: bool = False) -> Message:
        """`partial`: a partitioned topic's partitions that no broker serves right now are
        described as such (`not_served`), the others as usual; the waits for their
        brokers share one `admin_reach.OWNER_WAIT_MS`, within the admin client's timeout."""
        resolved = await self.registry.existing(parse_topic(msg.topic))
        partial = partial and resolved.partitioned_base
        deadline_ms = self.system.clock.monotonic_ms() + admin_reach.OWNER_WAIT_MS
        partitions = []
        owner = 0
        for partition in resolved.served_names():
            damage = self.broker.damaged.get(partition)
            if damage is not None:  # assigned here, not served: say why instead of waiting for it
                partitions.append(ap.PartitionInfo(
                    name=partition, next_offset=damage.valid_end, producers=[], messages_in=0, bytes_in=0,
                    dropped_messages=0, subscriptions=[], wal_damage=damage_text(partition, damage),
                    broker_id=self.broker.broker_id, broker_url=self.broker.broker_url))
                owner = owner or self.broker.broker_id
                continue

            async def local(entry: TopicEntry) -> list[ap.PartitionInfo]:
                stats = await self.system.ask(entry.endpoint, DescribePartition())
                assert isinstance(stats, PartitionStats)
                return [dataclasses.replace(stats.info, broker_id=self.broker.broker_id, broker_url=self.broker.broker_url)]

            try:
                answer = await self.reach.on_owner(msg, partition, local,
                                              wait_ms=max(0, deadline_ms - self.system.clock.monotonic_ms()))
            except Unavailable as exc:
                if not partial:
                    raise
                partitions.append(self._not_served(partition, exc.message))
                continue
            for info in answer.partitions if isinstance(answer, ap.TopicDescription) else answer:
                if info.broker_id is None:  # answered by a broker from before the field: its assignment says
                    owner_of = self.registry.owner_of(partition, self.broker.broker_url)
                    info = dataclasses.replace(info, broker_id=owner_of.broker_id, broker_url=owner_of.broker_url)
                partitions.append(info)
            if not owner:
                assignment = self.registry.assignment(partition)
                owner = assignment.broker_id if assignment is not None else 0
        in_force, sources = policies.topic_policies(self.broker.read, self.config, resolved.name)
        return ap.TopicDescription(request_id=msg.request_id, name=resolved.name.full,
                                   dispatch_strategy=resolved.record.dispatch_strategy, broker_id=owner,
                                   partitions=partitions,
                                   policies={name: getattr(in_force, name) for name in TOPIC_POLICY_NAMES},
                                   policy_sources=sources)

    def _not_served(self, partition: str, why: str) -> ap.PartitionInfo:
        """A partition no broker serves right now: where its offsets stopped (a reliable
        topic's seal; else 0), no counters, the broker it is assigned to if any, and why."""
        value = self.metadata.local_get(cr.topic_state_key(partition))
        next_offset = 0 if value is None else cr.decode(value.value, cr.TopicState).next_offset
        owner = self.registry.owner_of(partition, self.broker.broker_url)
        return ap.PartitionInfo(name=partition, next_offset=next_offset, producers=[], messages_in=0, bytes_in=0,
                                dropped_messages=0, subscriptions=[], broker_id=owner.broker_id,
                                broker_url=owner.broker_url, not_served=why)

    async def _unload_by_handover(self, topic: str, msg: ap.UnloadTopic) -> None:
        """Move `topic` here, or ask the broker serving it to (it answers once moved)."""
        if topic in self.broker.topics:
            await self._hand_over(topic)
            return
        owner = self.registry.elsewhere(topic)
        if owner is None:
            raise Unavailable(f"topic {topic} is not served by a live broker right now; retry")
        timeout_ms = self.config.cluster.move_timeout_ms + 2 * self.config.cluster.request_timeout_ms
        await self.reach.remote(owner.admin_url, lambda rid: dataclasses.replace(msg, request_id=rid, topic=topic),
                           timeout_ms=timeout_ms)

    async def _hand_over(self, topic: str) -> None:
        """Carry out an unload asked here (in the admin request's task): the topic stops,
        a `HandOver` child moves it, and the task waits for its end."""
        target = move_target(self.metadata, self.broker.broker_id, topic)
        await self.system.ask(self.broker.endpoint, StopForHandOver(topic=topic))
        done: asyncio.Future[DanubeError | None] = asyncio.get_running_loop().create_future()
        await self.broker.spawn_hand_over(topic, target, None, None, done)
        error = await done
        if error is not None:
            raise error

    async def reassign_topic(self, msg: ap.ReassignTopic) -> Message:
        """What forcing a dead broker's local-mode topic elsewhere gives up (from the
        oldest cursor to the end of that broker's reservation); with `force`, a sealed
        failover marker hands it to the load manager, which places it on a live broker
        that continues past every offset the dead one reserved."""
        resolved = await self.registry.existing(parse_topic(msg.topic))
        topic = resolved.name.full
        if resolved.partitioned_base:
            raise FailedPrecondition(f"topic {topic} has partitions: reassign each partition ({topic}-part-0 ...)")
        if not moves_by_handover(self.config, self.registry, topic):
            raise FailedPrecondition(f"topic {topic} needs no forced reassignment: only a reliable topic in"
                                     f" storage.mode local waits for its broker; the others fail over by themselves")
        key, marker_key = cr.assignment_key(topic), cr.unassigned_key(topic)
        current = await self.metadata.get(key)  # linearizable
        marker_value = await self.metadata.get(marker_key)
        if current is not None:
            assignment = cr.decode(current.value, cr.Assignment)
            holder, epoch = assignment.broker_id, assignment.epoch
            expected, deletes = {key: current.version, marker_key: 0}, [key]
        else:
            marker = None if marker_value is None else cr.decode(marker_value.value, cr.Unassigned)
            if marker is None or marker.sealed or marker.from_broker is None:
                raise FailedPrecondition(f"topic {topic} is held by no broker (the load manager is placing it):"
                                         f" nothing to reassign")
            assert marker_value is not None
            holder, epoch = marker.from_broker, marker.epoch
            expected, deletes = {marker_key: marker_value.version}, []
        if await self.metadata.get(cr.register_key(holder)) is not None:
            raise FailedPrecondition(f"topic {topic} is held by broker {holder}, which is alive: move it with"
                                     f" `danube admin topics unload {topic}` (its WAL is handed over, nothing lost)")
        state_value = await self.metadata.get(cr.topic_state_key(topic))
        state = None if state_value is None else cr.decode(state_value.value, cr.TopicState)
        next_offset = 0 if state is None else max(state.next_offset, state.reserved_until)
        subscriptions = await self.broker.subscriptions_of(resolved.name)
        oldest = min(subscriptions, key=lambda s: s.retained_cursor(), default=None)
        kept_from = None if oldest is None else oldest.retained_cursor() + 1
        lost_start = None if kept_from is None or kept_from >= next_offset else kept_from
        reason = (f"broker {holder} is gone and its disk alone holds the topic's WAL; offsets up to its reservation"
                  f" ({next_offset}) may have been given out")
        if msg.force:
            now_ms = self.system.clock.now_ms()
            failover = cr.Unassigned(reason=cr.UnassignedReason.FAILOVER, from_broker=holder, epoch=epoch,
                                     since_ms=now_ms, sealed=True)
            if not await self.metadata.transaction(expected, {marker_key: cr.encode(failover)}, deletes):
                raise FailedPrecondition(f"topic {topic} changed hands meanwhile: run the reassignment again")
            log.error("topic %s forced off dead broker %d: offsets %s are given up; the next broker starts at %d",
                      topic, holder, "none" if lost_start is None else f"{lost_start}..{next_offset - 1}", next_offset)
        return ap.TopicReassignment(
            request_id=msg.request_id, topic=topic, reassigned=msg.force, from_broker=holder, reason=reason,
            lost_start=lost_start, lost_end=None if lost_start is None else next_offset,
            subscription=None if lost_start is None or oldest is None else oldest.name, next_offset=next_offset)

"""The load manager: on the broker whose Raft peer leads, it gives every unassigned
topic (and partition) a broker and reassigns the topics of brokers whose lease ran out.

Every broker runs one; only the leader's acts. It is level-triggered: after each change
the metadata store applies (or every `_PERIOD_S`), the leader reads the cluster from
its applied state and carries out `actors/load/assign.plan`. Each write is a
transaction guarded by the versions it read, so a decision made on a state that moved
on is refused and made again on the next round, never applied twice.

    /cluster/unassigned/{t}  --plan-->  /cluster/assignments/{t} = Assignment(broker, epoch + 1)
    /cluster/assignments/{t} of a broker gone for grace  -->  /cluster/unassigned/{t} (failover)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from danube_zmq.actors.actor import Actor
from danube_zmq.actors.config import BrokerConfig
from danube_zmq.actors.load.assign import ClusterView, Plan, Waiting, plan
from danube_zmq.actors.load.placement import Strategy
from danube_zmq.actors.load.reports import BrokerState
from danube_zmq.actors.topic_name import parse_topic
from danube_zmq.consensus.metadata_store import RaftMetadataStore
from danube_zmq.transport import cluster_records as cr
from danube_zmq.transport.errors import DanubeError

log = logging.getLogger("danube_zmq.load_manager")

_PERIOD_S = 0.5
_WRITES_AT_ONCE = 256  # proposals in flight per round (the peer batches adjacent ones)


class LoadManagerActor(Actor):
    def __init__(self, *, config: BrokerConfig, broker_id: int, metadata: RaftMetadataStore) -> None:
        self.config = config
        self.broker_id = broker_id
        self.metadata = metadata
        self.strategy = Strategy(config.load_manager.assignment_strategy)
        self.grace_ms = config.cluster.lease_ttl_ms // 3
        self.cursor = 0
        self.absent_since_ms: dict[int, int] = {}
        self.leading = False
        self.rounds = 0
        self._task: asyncio.Task[None] | None = None

    async def on_start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="load-manager")

    async def on_stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        peer = self.metadata.peer
        while peer.running:
            await peer.wait_changed(_PERIOD_S)
            if not peer.is_leader:
                if self.leading:
                    log.info("broker %d: no longer the leader; load manager idle", self.broker_id)
                self.leading = False
                self.absent_since_ms.clear()
                continue
            try:
                if not self.leading:
                    # A linearizable read first: the new leader's applied state is then at
                    # least what the previous leader committed.
                    await self.metadata.get(cr.LEADER)
                    await self.metadata.put(cr.LEADER, cr.encode(cr.LeaderRecord(broker_id=self.broker_id,
                                                                                 term=peer.current_term)))
                    self.leading = True
                    log.info("broker %d leads the cluster: load manager active", self.broker_id)
                await self._round()
            except DanubeError as exc:
                log.info("load manager round failed (%s); retrying", exc)
                await asyncio.sleep(_PERIOD_S)

    async def _round(self) -> None:
        view, versions = self._view()
        decided = plan(view, self.strategy, {}, {}, now_ms=self.system.clock.now_ms(), grace_ms=self.grace_ms,
                       cursor=self.cursor)
        self.cursor = decided.cursor
        self.absent_since_ms = decided.absent_since_ms
        self.rounds += 1
        await self._carry_out(decided, versions)

    def _view(self) -> tuple[ClusterView, dict[str, int]]:
        """The cluster as this peer has applied it, and the version of every key read."""
        state = self.metadata.peer.state
        versions: dict[str, int] = {}
        modes: dict[int, str] = {}
        for key, value in state.list_prefix(cr.BROKERS):
            broker = cr.broker_of(key, cr.BROKERS)
            if broker is not None and key.endswith("/state"):
                modes[broker] = _decoded(key, value.value, cr.BrokerStateRecord, cr.BrokerStateRecord(mode="active")).mode
        brokers = {}
        for key, _value in state.list_prefix(cr.REGISTER):
            broker = cr.broker_of(key, cr.REGISTER)
            if broker is not None:
                brokers[broker] = BrokerState(modes.get(broker, cr.BrokerMode.ACTIVE))
        assignments = {}
        for key, value in state.list_prefix(cr.ASSIGNMENTS):
            record = _decoded(key, value.value, cr.Assignment, None)
            if record is not None:
                topic = cr.topic_of(key, cr.ASSIGNMENTS)
                assignments[topic] = (record.broker_id, record.epoch)
                versions[key] = value.version
        waiting = {}
        for key, value in state.list_prefix(cr.UNASSIGNED):
            marker = _decoded(key, value.value, cr.Unassigned, cr.Unassigned(reason=cr.UnassignedReason.NEW))
            topic = cr.topic_of(key, cr.UNASSIGNED)
            waiting[topic] = Waiting(from_broker=marker.from_broker, to_broker=marker.to_broker, epoch=marker.epoch)
            versions[key] = value.version
        exists = set()
        for key, value in state.list_prefix(cr.TOPICS):
            if key.count("/") != 3:
                continue
            record = _decoded(key, value.value, cr.TopicRecord, None)
            if record is None:
                continue
            name = parse_topic(cr.topic_of(key, cr.TOPICS))
            if record.partitions:
                exists.update(name.partition_name(i) for i in range(record.partitions))
            else:
                exists.add(name.full)
        return ClusterView(brokers=brokers, assignments=assignments, waiting=waiting, exists=exists,
                           absent_since_ms=self.absent_since_ms), versions

    async def _carry_out(self, decided: Plan, versions: dict[str, int]) -> None:
        now_ms = self.system.clock.now_ms()
        writes: list[Any] = []
        for orphan in decided.orphans:
            key = cr.assignment_key(orphan.topic)
            log.warning("broker %d is gone: %s is unassigned (failover)", orphan.from_broker, orphan.topic)
            writes.append(self.metadata.transaction(
                {key: versions[key], cr.unassigned_key(orphan.topic): 0},
                {cr.unassigned_key(orphan.topic): cr.encode(cr.Unassigned(
                    reason=cr.UnassignedReason.FAILOVER, from_broker=orphan.from_broker, epoch=orphan.epoch,
                    since_ms=now_ms))},
                [key]))
        for topic in decided.drop:
            key = cr.unassigned_key(topic)
            writes.append(self.metadata.transaction({key: versions[key]}, {}, [key]))
        for choice in decided.assign:
            marker = cr.unassigned_key(choice.topic)
            key = cr.assignment_key(choice.topic)
            writes.append(self.metadata.transaction(
                {marker: versions[marker], key: 0},
                {key: cr.encode(cr.Assignment(broker_id=choice.broker_id, epoch=choice.epoch, assigned_ms=now_ms))},
                [marker]))
        for start in range(0, len(writes), _WRITES_AT_ONCE):
            results = await asyncio.gather(*writes[start:start + _WRITES_AT_ONCE], return_exceptions=True)
            for result in results:
                if isinstance(result, BaseException) and not isinstance(result, DanubeError):
                    raise result
        if decided.assign:
            log.info("assigned %d topics (%s)", len(decided.assign),
                     ", ".join(f"{a.topic} -> {a.broker_id}" for a in decided.assign[:5])
                     + (" ..." if len(decided.assign) > 5 else ""))


def _decoded(key: str, data: bytes, kind: type[Any], default: Any) -> Any:
    try:
        return cr.decode(data, kind)
    except DanubeError as exc:
        log.error("metadata key %s holds no %s (%s); ignored", key, kind.__name__, exc)
        return default

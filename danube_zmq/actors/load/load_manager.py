"""The load manager: on the broker whose Raft peer leads, it gives every unassigned
topic (and partition) a broker, reassigns the topics of brokers whose lease ran out,
rebalances, and drains brokers on request.

Every broker runs one; only the leader's acts. It is level-triggered, and each round
is a message: a timer (`LoadTick`, every half second) follows the Raft peer's role and
runs a round when time decides one; while leading, a metadata watch child tells it
`LoadRoundDue` after a change that needs a round (lease renewals and load reports do
not). A round reads the cluster from the applied state (registrations, broker states,
assignments, markers, topics and the brokers' load reports) and carries out
`actors/load/assign.plan`. Each write is a transaction guarded by the versions it read,
so a decision made on a state that moved on is refused and made again on the next
round, never applied twice. Admin requests (balance, rebalance, drain) wait in the
mailbox behind a round, so they see its writes.

    /cluster/unassigned/{t}  --plan-->  /cluster/assignments/{t} = Assignment(broker, epoch + 1)
    /cluster/assignments/{t} of a broker gone for grace  -->  /cluster/unassigned/{t} (failover)
    rebalance / drain: /cluster/assignments/{t}  -->  /cluster/unassigned/{t} (not sealed,
        to_broker); the broker it leaves seals it, then the plan assigns it

Rebalancing (`load_manager.rebalancing`) runs `load/rebalance.plan` every check
interval. Moves are remembered (`MoveRecord`, `/cluster/rebalancing/`) for an hour, so the
hourly cap and the cooldowns hold across leader changes.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
from collections.abc import Callable
from typing import Any

from danube_zmq.actors.cluster.metadata_watch import MetadataWatch
from danube_zmq.actors.load.assign import ClusterView, Plan, Waiting, plan
from danube_zmq.actors.load.load_report import as_load_report
from danube_zmq.actors.load.placement import Strategy
from danube_zmq.actors.load.rebalance import (
    HOUR_MS,
    Aggressiveness,
    Move,
    RebalancePolicy,
    drain,
    measure,
)
from danube_zmq.actors.load.rebalance import plan as rebalance_plan
from danube_zmq.actors.load.reports import BrokerState, LoadReport, TopicLoad, broker_loads, topic_loads
from danube_zmq.actors.metrics import METRICS
from danube_zmq.config.broker_config import BrokerConfig
from danube_zmq.consensus.metadata_store import RaftMetadataStore
from danube_zmq.consensus.state_machine import WatchEvent
from danube_zmq.runtime.actor import Actor
from danube_zmq.transport import admin_protocol as ap
from danube_zmq.transport import cluster_records as cr
from danube_zmq.transport.client_protocol import DispatchStrategy
from danube_zmq.transport.codec import Message
from danube_zmq.transport.common import Error, Ok
from danube_zmq.transport.errors import DanubeError, FailedPrecondition, NotFound, Unavailable
from danube_zmq.transport.internal_protocol import LoadManagerReply, LoadManagerRequest, LoadRoundDue, LoadTick
from danube_zmq.transport.topic_name import parse_topic

log = logging.getLogger("danube_zmq.load_manager")

_PERIOD_MS = 500
# A round with no change that needs one (a new or moving topic, a broker joining or
# leaving, a state or assignment change) runs this often, for what time decides: suspect
# brokers, leases run out, the rebalancing interval.
_IDLE_ROUND_S = 1.0
# Changes that need a round at once; lease renewals and load reports do not.
_TRIGGERS = (cr.ASSIGNMENTS, cr.UNASSIGNED, cr.BROKERS, cr.MOVES)
_WRITES_AT_ONCE = 256  # proposals in flight per round (the peer batches adjacent ones)
# Keys a round reads between two yields to the event loop: with 100,000 partitions one
# round reads every assignment, marker and topic, and the loop must keep answering
# Ping and renewing leases meanwhile (at 12,000 partitions a round in one go lost the
# broker its lease). The decisions themselves run in a worker thread (see `_round`).
_KEYS_PER_SLICE = 2_000


class _Memo:
    """The records under one prefix, each decoded once per write (by `mod_revision`): a
    round reads every key, but with 1,000 topics decoding them all every half second cost
    an idle broker a tenth of a core."""

    def __init__(self, prefix: str, convert: Callable[[str, bytes], Any]) -> None:
        self.prefix = prefix
        self.convert = convert
        self.items: dict[str, tuple[int, Any]] = {}
        self.last: list[tuple[str, Any, Any]] = []
        self.read_at = -1  # the state's revision when `last` was read

    async def read(self, store: RaftMetadataStore) -> list[tuple[str, Any, Any]]:
        """(key, versioned value, converted record) for every key under the prefix; the
        last answer again when nothing under it changed since (no listing at all).
        Yields to the event loop every `_KEYS_PER_SLICE` keys: the listing is a copy,
        so what it holds stays the state at one revision."""
        revision = store.local_revision()
        if self.read_at >= 0:
            try:
                unchanged = not store.local_events_since(self.prefix, self.read_at)
            except DanubeError:  # compacted history: read it all
                unchanged = False
            if unchanged:
                self.read_at = revision
                return self.last
        fresh: dict[str, tuple[int, Any]] = {}
        out = []
        for n, (key, value) in enumerate(store.local_scan(self.prefix)):
            await _pace(n)
            hit = self.items.get(key)
            if hit is None or hit[0] != value.mod_revision:
                hit = (value.mod_revision, self.convert(key, value.value))
            fresh[key] = hit
            out.append((key, value, hit[1]))
        self.items, self.last, self.read_at = fresh, out, revision
        return out


@dataclasses.dataclass(slots=True)
class _Cluster:
    """One round's reading of the store."""

    view: ClusterView
    versions: dict[str, int]
    reports: dict[int, LoadReport]
    created_ms: dict[str, int]
    moves_ms: list[int]
    last_moved_ms: dict[str, int]
    backlog: dict[str, int]  # per partition, from the published Spark backlog report
    suspect: set[int]  # registered brokers that missed a lease renewal

    def loads(self) -> dict[str, TopicLoad]:
        return topic_loads(self.reports, self.backlog)

    def placeable(self) -> ClusterView:
        """The view placement and rebalancing decide on: a suspect broker takes nothing new."""
        states = {b: BrokerState.DRAINING if b in self.suspect and s is BrokerState.ACTIVE else s
                  for b, s in self.view.brokers.items()}
        return dataclasses.replace(self.view, brokers=states)


class _Triggers:
    """The leading load manager's watch filter (it lives in the watch's task): a
    `LoadRoundDue` for a change that needs a round, and none for the changes a round
    told since the last has read (it reads the store as of when it begins, at least the
    revision applied when it was told). Lease renewals and load reports need none."""

    def __init__(self, store: RaftMetadataStore) -> None:
        self.store = store
        self.covered = 0

    def __call__(self, event: WatchEvent) -> LoadRoundDue | None:
        if event.revision <= self.covered or not _needs_round(event):
            return None
        self.covered = self.store.local_revision()
        return LoadRoundDue(revision=event.revision)

    async def start_over(self) -> LoadRoundDue:
        """After a gap (the history compacted past the watch): anything may have changed."""
        self.covered = self.store.local_revision()
        return LoadRoundDue(revision=self.covered)


def _needs_round(event: WatchEvent) -> bool:
    return (event.key.startswith(_TRIGGERS) or _topic_record(event.key)
            or (event.key.startswith(cr.REGISTER) and (event.value is None or event.prev_version == 0)))


class LoadManagerActor(Actor):
    def __init__(self, *, config: BrokerConfig, broker_id: int, metadata: RaftMetadataStore) -> None:
        self.config = config
        self.broker_id = broker_id
        self.metadata = metadata
        lm = config.load_manager
        self.strategy = Strategy(lm.assignment_strategy)
        overrides = {k: v for k, v in (("check_interval_s", lm.rebalancing_check_interval_s),
                                       ("max_moves_per_hour", lm.rebalancing_max_moves_per_hour),
                                       ("cooldown_s", lm.rebalancing_cooldown_s)) if v is not None}
        self.policy = RebalancePolicy.of(Aggressiveness(lm.rebalancing_level), min_topic_age_s=lm.rebalancing_min_topic_age_s,
                                         blacklist=tuple(lm.rebalancing_blacklist), **overrides)
        self.grace_ms = config.cluster.lease_ttl_ms // 3
        self.cursor = 0
        self.absent_since_ms: dict[int, int] = {}
        self.leading = False
        self.next_rebalance_ms = 0
        self._watch: str | None = None  # the metadata watch's endpoint while leading
        self._retry = False
        self._states = _Memo(cr.BROKERS, lambda key, data: _decoded(
            key, data, cr.BrokerStateRecord, cr.BrokerStateRecord(mode="active")).mode
            if key.endswith("/state") else None)
        self._assignments = _Memo(cr.ASSIGNMENTS, lambda key, data: _decoded(key, data, cr.Assignment, None))
        self._waiting = _Memo(cr.UNASSIGNED, lambda key, data: _decoded(
            key, data, cr.Unassigned, cr.Unassigned(reason=cr.UnassignedReason.NEW)))
        self._topics = _Memo(cr.TOPICS, _topic_partitions)
        self._reports = _Memo(cr.LOAD, lambda key, data: _report(key, data))
        self._moves = _Memo(cr.MOVES, lambda key, data: _decoded(key, data, cr.MoveRecord, None))
        self._last_round_revision = 0
        self._last_round_at = 0.0

    async def on_start(self) -> None:
        self.system.schedule_periodic(self.endpoint, _PERIOD_MS, LoadTick())
        self.system.post(self.endpoint, LoadTick())

    async def handle_LoadTick(self, msg: LoadTick) -> None:
        """Follow the Raft peer's role; a round when time decides one (the idle period is
        over: suspect brokers, leases run out, the rebalancing interval) or the last failed."""
        store = self.metadata
        if not store.running:
            return
        if not store.is_leader:
            if self.leading:
                log.info("broker %d: no longer the leader; load manager idle", self.broker_id)
                await self._stop_watch()
            self.leading = False
            self.absent_since_ms.clear()
            return
        if not self.leading:
            try:
                await self._lead()
            except DanubeError as exc:
                log.info("load manager could not take the lead (%s); retrying", exc)
                return
        elif not self._retry and asyncio.get_running_loop().time() - self._last_round_at < _IDLE_ROUND_S:
            return
        await self._run_round()

    async def handle_LoadRoundDue(self, msg: LoadRoundDue) -> None:
        # A round that began after the change has read it: a burst of changes costs one.
        if self.leading and self.metadata.is_leader and msg.revision > self._last_round_revision:
            await self._run_round()

    async def _lead(self) -> None:
        store = self.metadata
        # A linearizable read first: the new leader's applied state is then at least
        # what the previous leader committed.
        await store.get(cr.LEADER)
        await store.put(cr.LEADER, cr.encode(cr.LeaderRecord(broker_id=self.broker_id, term=store.current_term)))
        self.leading = True
        self.next_rebalance_ms = self._elapsed() + self.policy.check_interval_s * 1000
        await self._stop_watch()
        since = store.local_revision()
        triggers = _Triggers(store)
        self._watch = await self.system.spawn(lambda: MetadataWatch(
            metadata=store, prefix="", target=self.endpoint, since=since, on_event=triggers,
            start_over=triggers.start_over), name="load-manager-watch", parent=self.endpoint)
        log.info("broker %d leads the cluster: load manager active", self.broker_id)

    async def _stop_watch(self) -> None:
        if self._watch is not None:
            await self.system.stop(self._watch)
            self._watch = None

    async def _run_round(self) -> None:
        store = self.metadata
        self._last_round_revision = store.local_revision()
        self._last_round_at = asyncio.get_running_loop().time()
        try:
            await self._round()
            self._retry = False
        except DanubeError as exc:
            log.info("load manager round failed (%s); retrying", exc)
            self._retry = True  # at the next tick

    def _now(self) -> int:
        """Wall time, for what is written to the store (stamps other nodes read)."""
        return self.system.clock.now_ms()

    def _elapsed(self) -> int:
        """Monotonic time, for what only this leader measures (absence grace, the
        rebalancing interval): a wall-clock step must not shorten or lengthen them."""
        return self.system.clock.monotonic_ms()

    async def _round(self) -> None:
        cluster = await self._read()
        # The pure plan is O(N) over every topic: in a worker thread (its inputs are this
        # round's copies, touched by nothing else) the event loop gets the GIL back
        # every switch interval instead of waiting for the whole plan.
        decided = await asyncio.to_thread(plan, cluster.placeable(), self.strategy, cluster.reports, cluster.loads(),
                                          now_ms=self._elapsed(), grace_ms=self.grace_ms, cursor=self.cursor)
        self.cursor = decided.cursor
        self.absent_since_ms = decided.absent_since_ms
        await self._carry_out(decided, cluster.versions)
        await self._finish_drains(cluster)
        if self.config.load_manager.rebalancing and self._elapsed() >= self.next_rebalance_ms:
            self.next_rebalance_ms = self._elapsed() + self.policy.check_interval_s * 1000
            await self._rebalance(cluster, max_moves=None, dry_run=False)

    # ------------------------------------------------------------- reading the store
    async def _read(self) -> _Cluster:
        """The cluster as this peer has applied it, and the version of every key read.
        Prefixes are read one after the other, yielding in between, so each may be at a
        later revision than the one before: assignments, then markers, then topics
        (a topic's record is written before or with its markers), and every write made
        from this reading is guarded by the versions read."""
        store = self.metadata
        versions: dict[str, int] = {}
        modes: dict[int, str] = {}
        for key, value, mode in await self._states.read(store):
            broker = cr.broker_of(key, cr.BROKERS)
            if broker is not None and mode is not None:
                modes[broker] = mode
                versions[key] = value.version
        brokers = {}
        suspect: set[int] = set()
        for key, _value in store.local_scan(cr.REGISTER):
            broker = cr.broker_of(key, cr.REGISTER)
            if broker is None:
                continue
            brokers[broker] = BrokerState(modes.get(broker, cr.BrokerMode.ACTIVE))
            # A broker that missed its last renewal may be dead: it keeps its topics until
            # its lease ends, but new ones go elsewhere.
            if store.stopped_renewing(key):
                suspect.add(broker)
        assignments = {}
        for n, (key, value, record) in enumerate(await self._assignments.read(store)):
            await _pace(n)
            if record is not None:
                assignments[cr.topic_of(key, cr.ASSIGNMENTS)] = (record.broker_id, record.epoch)
                versions[key] = value.version
        waiting = {}
        for n, (key, value, marker) in enumerate(await self._waiting.read(store)):
            await _pace(n)
            waiting[cr.topic_of(key, cr.UNASSIGNED)] = Waiting(
                from_broker=marker.from_broker, to_broker=marker.to_broker, epoch=marker.epoch, sealed=marker.sealed)
            versions[key] = value.version
        exists: set[str] = set()
        created: dict[str, int] = {}
        pinned: set[str] = set()
        local = self.config.storage.mode == "local"
        for n, (_key, _value, partitions) in enumerate(await self._topics.read(store)):
            await _pace(n)
            if partitions is not None:
                names, created_ms, reliable = partitions
                exists.update(names)
                created.update(dict.fromkeys(names, created_ms))
                if reliable and local:
                    pinned.update(names)
        reports = {}
        for _key, _value, report in await self._reports.read(store):
            if report is not None and report.broker_id in brokers:
                reports[report.broker_id] = report
        moves_ms: list[int] = []
        last_moved: dict[str, int] = {}
        for _key, _value, move in await self._moves.read(store):
            if move is not None:
                moves_ms.append(move.at_ms)
                last_moved[move.topic] = max(move.at_ms, last_moved.get(move.topic, 0))
        # Few (an operator repairs them): listed whole each round.
        damaged = {cr.topic_of(key, cr.DAMAGED) for key, _ in store.local_scan(cr.DAMAGED)}
        view = ClusterView(brokers=brokers, assignments=assignments, waiting=waiting, exists=exists,
                           absent_since_ms=self.absent_since_ms, pinned=pinned, damaged=damaged)
        return _Cluster(view=view, versions=versions, reports=reports, created_ms=created, moves_ms=moves_ms,
                        last_moved_ms=last_moved, backlog=self._published_backlog(), suspect=suspect)

    def _published_backlog(self) -> dict[str, int]:
        value = self.metadata.local_get(cr.BACKLOG_REPORT)
        record = None if value is None else _decoded(cr.BACKLOG_REPORT, value.value, cr.BacklogReportRecord, None)
        backlog: dict[str, int] = {}
        store = self.metadata
        for topic in record.topics if record is not None else []:
            stored = store.local_get(cr.topic_record_key(topic.topic))
            partitions = _decoded(topic.topic, stored.value, cr.TopicRecord, None) if stored is not None else None
            if partitions is not None and partitions.partitions:  # Spark sums the partitions: spread it again
                name = parse_topic(topic.topic)
                for i in range(partitions.partitions):
                    backlog[name.partition_name(i)] = topic.backlog_messages // partitions.partitions
            else:
                backlog[topic.topic] = topic.backlog_messages
        return backlog

    # ------------------------------------------------------------- assignments
    async def _carry_out(self, decided: Plan, versions: dict[str, int]) -> None:
        now_ms = self._now()
        failovers: list[Any] = []
        drops: list[Any] = []
        assigns: list[Any] = []
        gone: dict[int, list[str]] = {}
        for orphan in decided.orphans:
            gone.setdefault(orphan.from_broker, []).append(orphan.topic)
        for broker, topics in gone.items():  # one line a broker: a log line a topic held the loop for seconds
            log.warning("broker %d is gone: %d topics unassigned (failover): %s%s", broker, len(topics),
                        ", ".join(topics[:5]), " ..." if len(topics) > 5 else "")
        for orphan in decided.orphans:
            key = cr.assignment_key(orphan.topic)
            failovers.append(self.metadata.transaction(
                {key: versions[key], cr.unassigned_key(orphan.topic): 0},
                {cr.unassigned_key(orphan.topic): cr.encode(cr.Unassigned(
                    reason=cr.UnassignedReason.FAILOVER, from_broker=orphan.from_broker, epoch=orphan.epoch,
                    since_ms=now_ms))},
                [key]))
        for topic in decided.drop:
            key = cr.unassigned_key(topic)
            drops.append(self.metadata.transaction({key: versions[key]}, {}, [key]))
        for choice in decided.assign:
            marker = cr.unassigned_key(choice.topic)
            key = cr.assignment_key(choice.topic)
            expect = {marker: versions.get(marker, 0), key: 0}
            if marker not in versions:  # no marker: only while its topic record is the one read
                record = self._record_version(choice.topic)
                if record is None:
                    continue
                expect[record[0]] = record[1]
            assigns.append(self.metadata.transaction(
                expect,
                {key: cr.encode(cr.Assignment(broker_id=choice.broker_id, epoch=choice.epoch, assigned_ms=now_ms))},
                [marker] if marker in versions else []))
        METRICS.load_decisions.labels("failover").inc(await _gather(failovers))
        await _gather(drops)
        METRICS.load_decisions.labels("assign").inc(await _gather(assigns))
        if decided.assign:
            log.info("assigned %d topics (%s)", len(decided.assign),
                     ", ".join(f"{a.topic} -> {a.broker_id}" for a in decided.assign[:5])
                     + (" ..." if len(decided.assign) > 5 else ""))

    def _record_version(self, topic: str) -> tuple[str, int] | None:
        """The key and version of the record `topic` (a topic or a partition) belongs to."""
        name = parse_topic(topic)
        for full in (name.full, name.base.full):
            value = self.metadata.local_get(cr.topic_record_key(full))
            if value is not None:
                return cr.topic_record_key(full), value.version
        return None

    async def _start_moves(self, moves: list[Move], versions: dict[str, int], reason: str) -> list[Move]:
        """Replace each moving topic's assignment by an unsealed marker naming its
        target; the broker it leaves seals it, then `plan` assigns it there."""
        now_ms = self._now()
        started = []
        for n, move in enumerate(moves):
            key = cr.assignment_key(move.topic)
            current = self.metadata.local_get(key)
            if current is None or current.version != versions.get(key):
                continue
            epoch = cr.decode(current.value, cr.Assignment).epoch
            marker = cr.Unassigned(reason=reason, from_broker=move.from_broker, to_broker=move.to_broker, epoch=epoch,
                                   since_ms=now_ms, sealed=False)
            if await self.metadata.transaction({key: current.version, cr.unassigned_key(move.topic): 0},
                                               {cr.unassigned_key(move.topic): cr.encode(marker)}, [key]):
                started.append(move)
                METRICS.load_decisions.labels("move").inc()
                await self.metadata.put_with_ttl(f"{cr.MOVES}{now_ms:020d}-{n}", cr.encode(cr.MoveRecord(
                    at_ms=now_ms, topic=move.topic, from_broker=move.from_broker, to_broker=move.to_broker)), HOUR_MS)
                log.info("moving %s from broker %d to %d (%s)", move.topic, move.from_broker, move.to_broker,
                         move.reason)
        return started

    async def _rebalance(self, cluster: _Cluster, *, max_moves: int | None, dry_run: bool) -> ap.Rebalanced:
        assigned = {t: b for t, (b, _) in cluster.view.assignments.items()}
        decided = await asyncio.to_thread(functools.partial(
            rebalance_plan, now_ms=self._now(), policy=self.policy, states=cluster.placeable().brokers,
            assignments=assigned, loads=cluster.loads(), created_ms=cluster.created_ms,
            last_moved_ms=cluster.last_moved_ms, recent_moves_ms=cluster.moves_ms, max_moves=max_moves,
            damaged=cluster.view.damaged))
        moves = list(decided.moves)
        if not dry_run and moves:
            moves = await self._start_moves(moves, cluster.versions, cr.UnassignedReason.REBALANCE)
        return ap.Rebalanced(request_id=0, moves=[_move_info(m) for m in moves], why_none=decided.why_none,
                             coefficient_of_variation=decided.balance.cv, dry_run=dry_run)

    async def _finish_drains(self, cluster: _Cluster) -> None:
        """A draining broker that serves nothing and has nothing leaving it is drained."""
        for broker, state in cluster.view.brokers.items():
            if state is not BrokerState.DRAINING:
                continue
            holding = any(b == broker for b, _ in cluster.view.assignments.values())
            leaving = any(m.from_broker == broker and not m.sealed for m in cluster.view.waiting.values())
            if not holding and not leaving:
                key = cr.state_key(broker)
                await self.metadata.transaction({key: cluster.versions.get(key, 0)}, {key: cr.encode(
                    cr.BrokerStateRecord(mode=cr.BrokerMode.DRAINED, reason="unloaded"))})
                log.info("broker %d is drained", broker)

    # ------------------------------------------------------------- admin requests
    async def handle_LoadManagerRequest(self, msg: LoadManagerRequest) -> Message:
        request = ap.ADMIN_PROTOCOL.decode(msg.frame)
        try:
            if not self.leading:
                raise Unavailable(f"broker {self.broker_id} does not lead the cluster; retry")
            answer = await self._admin(request)
        except DanubeError as exc:
            answer = Error(request_id=request.request_id, code=exc.code, message=exc.message)  # type: ignore[attr-defined]
        return LoadManagerReply(frame=ap.ADMIN_PROTOCOL.encode(answer))

    async def _admin(self, request: Any) -> Message:
        await self.metadata.get(cr.LEADER)  # a barrier: the applied state is current
        cluster = await self._read()
        if isinstance(request, ap.GetClusterBalance):
            return self._balance(cluster, request.request_id)
        if isinstance(request, ap.RebalanceCluster):
            answer = await self._rebalance(cluster, max_moves=request.max_moves, dry_run=request.dry_run)
            return dataclasses.replace(answer, request_id=request.request_id)
        if isinstance(request, ap.UnloadBroker):
            return await self._drain(cluster, request)
        if isinstance(request, ap.ActivateBroker):
            await self._set_mode(cluster, request.broker_id, cr.BrokerMode.ACTIVE, "activated")
            return Ok(request_id=request.request_id)
        raise FailedPrecondition(f"{type(request).__name__} is not a load manager request")

    def _balance(self, cluster: _Cluster, request_id: int) -> ap.ClusterBalance:
        assigned = {t: b for t, (b, _) in cluster.view.assignments.items()}
        active = [b for b, s in cluster.view.brokers.items() if s is BrokerState.ACTIVE]
        loads = broker_loads(active, assigned, cluster.loads())
        balance = measure(loads, self.config.load_manager.overload_threshold)
        brokers = [ap.BrokerLoadInfo(broker_id=b, load=loads.get(b, 0.0),
                                     topic_count=sum(1 for owner in assigned.values() if owner == b),
                                     overloaded=b in balance.overloaded, underloaded=b in balance.underloaded,
                                     status=cluster.view.brokers[b].value, name=self._name_of(b))
                   for b in sorted(cluster.view.brokers)]
        values = list(loads.values()) or [0.0]
        return ap.ClusterBalance(request_id=request_id, coefficient_of_variation=balance.cv, mean_load=balance.mean,
                                 max_load=max(values), min_load=min(values), std_deviation=balance.std,
                                 brokers=brokers, assignment_strategy=self.strategy.value,
                                 rebalancing=self.config.load_manager.rebalancing)

    def _name_of(self, broker: int) -> str | None:
        value = self.metadata.local_get(cr.register_key(broker))
        return cr.broker_name(cr.decode(value.value, cr.BrokerRegistration).raft_node_id) if value is not None else None

    async def _drain(self, cluster: _Cluster, request: ap.UnloadBroker) -> ap.Rebalanced:
        broker = request.broker_id
        if broker not in cluster.view.brokers:
            raise NotFound(f"broker {broker} is not registered")
        await self._set_mode(cluster, broker, cr.BrokerMode.DRAINING, "unload requested")
        others = {b: s for b, s in cluster.placeable().brokers.items() if b != broker}
        if not any(s is BrokerState.ACTIVE for s in others.values()):
            raise FailedPrecondition(f"no other active broker can take the topics of broker {broker}")
        assigned = {t: b for t, (b, _) in cluster.view.assignments.items()}
        moves = drain(broker, strategy=self.strategy, states=others | {broker: BrokerState.DRAINING},
                      reports=cluster.reports, assignments=assigned, loads=cluster.loads(),
                      damaged=cluster.view.damaged)
        started = await self._start_moves(moves, cluster.versions, cr.UnassignedReason.UNLOAD)
        kept = sorted(t for t, b in assigned.items() if b == broker and t in cluster.view.damaged)
        why = (f"{len(kept)} damaged topics stay on broker {broker} until repaired ({', '.join(kept[:5])}"
               f"{' ...' if len(kept) > 5 else ''}): danube admin topics describe names the repair") if kept else ""
        if kept:
            log.error("drain of broker %d: %s", broker, why)
        return ap.Rebalanced(request_id=request.request_id, moves=[_move_info(m) for m in started], why_none=why,
                             coefficient_of_variation=0.0, dry_run=False)

    async def _set_mode(self, cluster: _Cluster, broker: int, mode: str, reason: str) -> None:
        if broker not in cluster.view.brokers:
            raise NotFound(f"broker {broker} is not registered")
        key = cr.state_key(broker)
        await self.metadata.put(key, cr.encode(cr.BrokerStateRecord(mode=mode, reason=reason)))


async def _pace(n: int) -> None:
    """Yield to the event loop once every `_KEYS_PER_SLICE` items."""
    if n and n % _KEYS_PER_SLICE == 0:
        await asyncio.sleep(0)


def _move_info(move: Move) -> ap.MoveInfo:
    return ap.MoveInfo(topic=move.topic, from_broker=move.from_broker, to_broker=move.to_broker,
                       estimated_load=move.estimated_load)


async def _gather(writes: list[Any]) -> int:
    """Run the transactions `writes`; how many were applied (their guards held)."""
    applied = 0
    for start in range(0, len(writes), _WRITES_AT_ONCE):
        results = await asyncio.gather(*writes[start:start + _WRITES_AT_ONCE], return_exceptions=True)
        for result in results:
            if isinstance(result, DanubeError):
                log.info("a load manager write failed (%s); the next round decides again", result)
            elif isinstance(result, BaseException):
                raise result
            elif result:
                applied += 1
    return applied


def _topic_record(key: str) -> bool:
    """A topic's record (/topics/{ns}/{topic}), not its subscriptions or producers."""
    return key.startswith(cr.TOPICS) and key.count("/") == 3


def _topic_partitions(key: str, data: bytes) -> tuple[list[str], int, bool] | None:
    """A topic record's served names (each partition, or the topic), creation time and
    whether it is reliable; None for the other keys under /topics/ (subscriptions,
    producers)."""
    if not _topic_record(key):
        return None
    record = _decoded(key, data, cr.TopicRecord, None)
    if record is None:
        return None
    name = parse_topic(cr.topic_of(key, cr.TOPICS))
    names = [name.partition_name(i) for i in range(record.partitions)] if record.partitions else [name.full]
    return names, record.created_ms, record.dispatch_strategy == DispatchStrategy.RELIABLE


def _report(key: str, data: bytes) -> LoadReport | None:
    record = _decoded(key, data, cr.LoadReportRecord, None)
    return None if record is None else as_load_report(record)


def _decoded(key: str, data: bytes, kind: type[Any], default: Any) -> Any:
    try:
        return cr.decode(data, kind)
    except DanubeError as exc:
        log.error("metadata key %s holds no %s (%s); ignored", key, kind.__name__, exc)
        return default

"""The broker actor: the topics this broker serves, and where every other topic is.

The cluster's registry lives in the Raft metadata store (`transport/cluster_records.py`
has the keys): namespaces, topic records, and which broker serves each topic or
partition. A standalone broker is the same code with one voter.

1. Creating a topic (a producer's auto-create, `GetPartitions(create)`, the admin API)
   writes its record and an unassigned marker per partition in one transaction. The
   leader's load manager (`load_manager.py`) gives each a broker.
2. This broker follows `/cluster/assignments/`: a topic assigned here is loaded (its
   actor spawned); one assigned elsewhere, or deleted, is unloaded (a deleted topic's
   WAL, cursors and durable segments go too).
3. A client request for a topic served here goes to its actor; for a topic served by
   another broker it is answered UNAVAILABLE with that broker's URL (`Moved`), which
   the client follows; a request for a topic with no broker yet (just created, or
   moving) waits here, bounded in number and time, until the assignment arrives.
4. The broker holds a registration lease (`/cluster/register/{id}`, TTL
   `cluster.lease_ttl_ms`, renewed every third of it) through its child actor
   `LeaseKeeper` (`lease_keeper.py`; the decisions are `lease.py`, pure). When renewing
   keeps failing it is told `LeaseChanged(held=False)` and unloads every topic before
   the lease can run out, so it never serves a topic the load manager has given to
   another broker (fencing); when it renews again it loads what is assigned to it then.
5. Admin requests about a topic run on the brokers that serve its partitions
   (`admin_reach.py` says where, `topic_admin.py` and `subscription_admin.py` what);
   balance and rebalancing go to the leader. Policies are the `PolicyKeeper` child's
   (`policy_keeper.py`), namespaces and topic records the `RegistryAdmin` child's;
   the admin gateway sends those requests there directly.

6. Cursors of reliable subscriptions and the catalog of durable segments are in the
   metadata store too, so the next owner of a topic has them. A broker that stops
   serving a reliable topic it still has (unload, rebalance) seals it first: the active
   WAL segment is sealed and (durable modes) uploaded, cursors are written, and
   `TopicState` records where its offsets stopped; only then is the unassigned marker
   marked sealed and the load manager gives the topic to another broker, which starts
   its offsets there (dropping a stale local WAL of its own from an earlier turn).
   A non-reliable topic is asked where its offsets stopped (`SealTopic`) and the next
   broker continues them too.
7. Offsets of reliable topics are reserved in `TopicState` before they are
   acknowledged (`ReserveOffsets` from the topic, forwarded to the `OffsetReservations`
   child, `offset_reservations.py`, which coalesces them into one transaction): a
   broker taking over a dead broker's topic starts past its reservation, never reusing
   an offset the dead broker may have acknowledged, unless it was the reserving broker
   itself (restarted on its disk: its WAL says exactly where it stopped).
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import functools
import logging
import math
import random
import shutil
from concurrent.futures import Executor
from pathlib import Path

from danube_zmq.actors.broker.admin_reach import AdminReach
from danube_zmq.actors.broker.cursor_flusher import CursorFlusher
from danube_zmq.actors.broker.dead_letters import DeadLetters
from danube_zmq.actors.broker.offset_reservations import OffsetReservations, end_reservations, write_topic_state
from danube_zmq.actors.broker.parked import ParkedRequests
from danube_zmq.actors.broker.subscription_admin import SubscriptionAdmin
from danube_zmq.actors.broker.topic_admin import TopicAdmin
from danube_zmq.actors.broker.topic_catalog import TopicCatalog
from danube_zmq.actors.broker.topic_files import TopicFiles, durable_segment
from danube_zmq.actors.broker.topic_registry import (
    Registry,
    Resolved,
    TopicEntry,
    assigned_to,
    assignment_changed,
    owner_of_assignment,
    snapshot_topics,
)
from danube_zmq.actors.broker.wal_damage import DamagedTopics, damage_text
from danube_zmq.actors.cluster.lease_keeper import spawn_lease_keeper
from danube_zmq.actors.cluster.metadata_watch import MetadataWatch
from danube_zmq.actors.cluster.ownership import Ownership, marks_sealed, on_assignment
from danube_zmq.actors.ids import IdSource
from danube_zmq.actors.load.load_reporter import LoadReporter
from danube_zmq.actors.metrics import METRICS
from danube_zmq.actors.move.hand_over import HandOver, held_by_dead_broker, held_by_dead_broker_text, marked_move
from danube_zmq.actors.move.hand_over_incoming import IncomingMoves
from danube_zmq.actors.policy import policies
from danube_zmq.actors.policy.policy_keeper import PolicyKeeper
from danube_zmq.actors.schema.registry_admin import RegistryAdmin
from danube_zmq.actors.topic import make_topic
from danube_zmq.config.broker_config import BrokerConfig
from danube_zmq.consensus.metadata_store import RaftMetadataStore
from danube_zmq.runtime.actor import Actor, Origin
from danube_zmq.runtime.request_tasks import RequestTasks
from danube_zmq.security.curve import ClusterCurve
from danube_zmq.storage.catalog import SegmentDescriptor
from danube_zmq.storage.wal.errors import WalDamaged
from danube_zmq.transport import admin_protocol as ap
from danube_zmq.transport import client_protocol as cp
from danube_zmq.transport import cluster_records as cr
from danube_zmq.transport import internal_protocol as ip
from danube_zmq.transport.codec import Message
from danube_zmq.transport.errors import DanubeError, FailedPrecondition, Moved, NotFound, ResourceExhausted, Unavailable
from danube_zmq.transport.internal_protocol import (
    AssignmentChanged,
    AssignmentsResync,
    BrokerJoined,
    ChildStopped,
    ClearProducers,
    ClientRequest,
    DeadLetter,
    DescribePartition,
    FlushCursors,
    ForgetSegments,
    ForgetTopicRecords,
    HandOverEnded,
    HandOverStopped,
    JoinAttempted,
    JoinCluster,
    LeaseChanged,
    ListSnapshotTopics,
    OpenSubscriptions,
    ParkedExpired,
    PartitionStats,
    PersistedSubscriptions,
    ProducerRegistry,
    ReserveOffsets,
    ReserveOffsetsFor,
    ResyncNext,
    SealTopic,
    SegmentDurable,
    SegmentSealed,
    ServedTopics,
    ServedTopicsList,
    StopForHandOver,
    SubscriptionsOf,
    SubscriptionState,
    TopicReleased,
    TopicSchemaChanged,
    TopicSealed,
    TopicServed,
    TopicStopped,
)
from danube_zmq.transport.topic_name import TopicName, parse_topic

log = logging.getLogger("danube_zmq.broker")

# How often the deadlines of client requests waiting for a topic's assignment are checked.
_PARKED_CHECK_MS = 200
_ADMIN_TASKS_MAX = 64
# A failed attempt to join the cluster is tried again after this long.
_JOIN_RETRY_MS = 200
# Topics a resync loads or unloads in one message; then the broker's queued requests.
_RESYNC_SLICE = 256


class BrokerActor(Actor):
    def __init__(self, *, config: BrokerConfig, broker_id: int, broker_url: str, admin_url: str,
                 metrics_url: str | None, rng: random.Random, executor: Executor,
                 metadata: RaftMetadataStore, curve: ClusterCurve | None = None,
                 grpc_url: str | None = None, grpc_admin_url: str | None = None) -> None:
        self.config = config
        self.grpc_url = grpc_url  # the gRPC door's URL (broker.grpc_listen), registered for redirects
        # The gRPC admin door's URL (broker.grpc_admin_listen), registered for ListBrokers.
        self.grpc_admin_url = grpc_admin_url
        self.curve = curve  # security.mode curve: how this broker dials the others (hand-overs, remote admin)
        self.executor = executor
        self.metadata = metadata
        self.data_dir = Path(config.broker.data_dir)
        self.flusher_endpoint = ""  # the CursorFlusher child: unwritten cursors, producer and damage records
        self.reservations_endpoint: str | None = None  # the OffsetReservations child
        self.stopped_offsets: dict[str, int] = {}  # reliable topics stopped at shutdown -> their log's end
        self.files: TopicFiles  # the reliable topics' WAL directories here and their durable segments
        self.broker_id = broker_id
        self.broker_url = broker_url
        self.admin_url = admin_url
        self.metrics_url = metrics_url
        self.rng = rng
        self.topics: dict[str, TopicEntry] = {}
        self.registry = Registry(metadata, broker_id, config.bootstrap_namespaces)
        self.catalog: TopicCatalog  # writes topic records
        self.policy_endpoint = ""  # the PolicyKeeper child: policies set in the store, told to the topics
        self.registry_admin_endpoint = ""  # the RegistryAdmin child: namespaces, topic records, brokers
        self.damaged: DamagedTopics  # reliable topics assigned here and not served: their WAL is damaged
        self.lease_held = False
        self.lease_until_ms = 0  # monotonic; stop serving at this time unless renewed
        self.parked: ParkedRequests  # client requests waiting for their topic's assignment
        self.dead_letters: DeadLetters  # dead letters for topics about to be loaded here
        self._join_tasks = RequestTasks(1)  # the attempt to join the cluster under way
        self._admin_tasks = RequestTasks(_ADMIN_TASKS_MAX)  # admin requests answered out of this actor (`reach`)
        self._joining = False
        self._resync_left: collections.deque[str] = collections.deque()  # topics the resync still follows
        self._resync_generation = 0
        self.moving_topics: set[str] = set()  # stopped here while their WAL is handed over (local mode)
        # Admin requests (built at start, with the system): where each runs, and what
        # those about topics, subscriptions and WAL hand-overs to here do.
        self.reach: AdminReach
        self.topic_admin: TopicAdmin
        self.subscription_admin: SubscriptionAdmin
        self.incoming: IncomingMoves

    # ------------------------------------------------------------- lifecycle
    async def on_start(self) -> None:
        # Built here, where the system (and its clock) is known.
        self.files = TopicFiles(config=self.config, metadata=self.metadata, broker_id=self.broker_id,
                                data_dir=self.data_dir, clock=self.system.clock)
        self.catalog = TopicCatalog(metadata=self.metadata, registry=self.registry, config=self.config,
                                    clock=self.system.clock)
        self.dead_letters = DeadLetters(system=self.system, registry=self.registry, catalog=self.catalog,
                                        topics=self.topics)
        self.parked = ParkedRequests(system=self.system, endpoint=self.endpoint, clock=self.system.clock,
                                     request_timeout_ms=self.config.cluster.request_timeout_ms)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        # Moves handed here that never finished (they are begun again from the start).
        await asyncio.to_thread(shutil.rmtree, self.data_dir / "handover", True)
        await self.files.start(self._on_uploaded)
        metadata, broker_id = self.metadata, self.broker_id
        interval_ms = self.config.storage.cursor_flush_interval_ms
        # Spawned before any topic: children stop newest first (`ActorSystem.stop`), so the
        # flusher stops after every topic and writes the final cursors they told it.
        self.flusher_endpoint = await self.system.spawn(
            lambda: CursorFlusher(metadata=metadata, broker_id=broker_id, interval_ms=interval_ms),
            name=f"cursor flusher {broker_id}", parent=self.endpoint)
        self.damaged = DamagedTopics(system=self.system, metadata=metadata, broker_id=broker_id, clock=self.system.clock,
                                     flusher_endpoint=self.flusher_endpoint, flush_interval_ms=interval_ms)
        self.reservations_endpoint = await self.system.spawn(
            lambda: OffsetReservations(metadata=metadata, broker_id=broker_id),
            name=f"offset reservations {broker_id}", parent=self.endpoint)
        config = self.config
        self.policy_endpoint = self.system.policy_endpoint = await self.system.spawn(
            lambda: PolicyKeeper(metadata=metadata, config=config, broker_id=broker_id),
            name=f"policy keeper {broker_id}", parent=self.endpoint)
        self.reach = AdminReach(system=self.system, broker_endpoint=self.endpoint, metadata=metadata, config=config,
                                registry=self.registry, broker_id=broker_id, topics=self.topics, curve=self.curve,
                                tasks=self._admin_tasks)
        self.topic_admin = TopicAdmin(self, self.reach)
        self.subscription_admin = SubscriptionAdmin(
            system=self.system, registry=self.registry, catalog=self.catalog, reach=self.reach,
            topic_admin=self.topic_admin, flusher_endpoint=self.flusher_endpoint, flush_cursors=self._flush_cursors)
        self.incoming = IncomingMoves(registry=self.registry, config=config, broker_id=broker_id, data_dir=self.data_dir,
                                      clock=self.system.clock, topics=self.topics, moving=self.moving_topics,
                                      wal_dir=self.files.wal_dir)
        broker_url = self.broker_url  # spawned last: the broker answered these requests once started
        self.registry_admin_endpoint = self.system.registry_admin_endpoint = await self.system.spawn(
            lambda: RegistryAdmin(metadata=metadata, config=config, broker_id=broker_id, broker_url=broker_url),
            name=f"registry admin {broker_id}", parent=self.endpoint)
        self.system.schedule_periodic(self.endpoint, _PARKED_CHECK_MS, ParkedExpired())
        self.system.post(self.endpoint, JoinCluster())

    async def on_stop(self) -> None:
        await self._join_tasks.cancel_all()
        await self._admin_tasks.cancel_all()  # the RemoteAdmin children closed their clients (stopped first)
        await self.files.stop()
        try:
            await end_reservations(self.metadata, self.broker_id, self.stopped_offsets, self.system.clock.now_ms())
        except (DanubeError, TimeoutError) as exc:
            log.warning("offset reservations not ended at shutdown (%s): a next broker starts past them", exc)
        self.stopped_offsets.clear()
        # The cursors were written by the flusher, stopped (after the topics) before this runs.

    # ------------------------------------------------------------- joining the cluster
    def handle_JoinCluster(self, msg: JoinCluster) -> None:
        """Wait for a leader, seed the namespaces, import a pre-cluster catalog, then
        hold the lease and follow the assignments. An attempt waits on the store in a
        task of its own (while no leader exists each read waits out its timeout: the
        broker answers its other messages meanwhile), which tells `JoinAttempted`; one
        that failed is tried again by a timer message."""
        if self.registry.joined or self._joining or not self.system.is_alive(self.endpoint):
            return
        self._joining = self._join_tasks.start(self._join_attempt())

    async def _join_attempt(self) -> None:
        try:
            await self.metadata.get(cr.LEADER)  # linearizable: a leader exists and we caught up
            await self._bootstrap()
        except DanubeError as exc:
            self.system.post(self.endpoint, JoinAttempted(error=exc.message))
            return
        except Exception as exc:  # a bug: the broker's handler fails with it (restarted by the failure rule)
            self.system.post(self.endpoint, JoinAttempted(error=f"{type(exc).__name__}: {exc}", failed=True))
            raise
        self.system.post(self.endpoint, JoinAttempted())

    async def handle_JoinAttempted(self, msg: JoinAttempted) -> None:
        self._joining = False
        if msg.failed:
            raise RuntimeError(f"joining the cluster failed: {msg.error}")
        if self.registry.joined:
            return
        if msg.error is not None:
            log.info("broker %d waiting for the metadata store (%s)", self.broker_id, msg.error)
            self.system.schedule_once(self.endpoint, _JOIN_RETRY_MS, JoinCluster())
            return
        self.registry.joined = True
        await spawn_lease_keeper(self.system, metadata=self.metadata, broker_endpoint=self.endpoint,
                                 broker_id=self.broker_id, registration=cr.encode(self._own_registration()),
                                 ttl_ms=self.config.cluster.lease_ttl_ms)
        metadata, broker, broker_id = self.metadata, self.endpoint, self.broker_id
        interval_ms = self.config.load_manager.report_interval_ms
        await self.system.spawn(lambda: LoadReporter(metadata=metadata, broker_endpoint=broker, broker_id=broker_id,
                                                     interval_ms=interval_ms),
                                name=f"load reporter {broker_id}", parent=broker)
        self.system.post(self.policy_endpoint, BrokerJoined())
        self.system.post(self.registry_admin_endpoint, BrokerJoined())

        async def assigned() -> Message:
            revision = metadata.local_revision()  # the listing's (the scan starts before any yield)
            return AssignmentsResync(topics=await assigned_to(metadata, broker_id), revision=revision)

        await self.system.spawn(lambda: MetadataWatch(
            metadata=metadata, prefix=cr.ASSIGNMENTS, target=broker, start_over=assigned,
            on_event=assignment_changed), name=f"assignments watch {broker_id}", parent=broker)

    async def _bootstrap(self) -> None:
        for namespace in self.config.bootstrap_namespaces:
            await self.metadata.compare_and_swap(cr.namespace_key(namespace), 0, b"")
        await self.metadata.compare_and_swap(cr.state_key(self.broker_id), 0,
                                             cr.encode(cr.BrokerStateRecord(mode=cr.BrokerMode.ACTIVE)))
        # Outlives the lease: `brokers list` shows this broker as down once it is gone.
        await self.metadata.put(cr.seen_key(self.broker_id), cr.encode(self._own_registration()))
        await self.catalog.import_local_catalog(self.data_dir)

    def _own_registration(self) -> cr.BrokerRegistration:
        return cr.BrokerRegistration(
            broker_id=self.broker_id, broker_url=self.broker_url, admin_url=self.admin_url,
            raft_node_id=self.config.cluster.node_id, started_ms=self.system.clock.now_ms(),
            metrics_url=self.metrics_url, grpc_url=self.grpc_url, grpc_admin_url=self.grpc_admin_url)

    def _lease_valid(self) -> bool:
        """Serving: the lease is held and has not run out. The time is checked here too,
        not only by the keeper: a `LeaseChanged(held=False)` may still wait in the mailbox."""
        return self.lease_held and self.system.clock.monotonic_ms() < self.lease_until_ms

    def handle_ServedTopics(self, msg: ServedTopics) -> Message:
        """The load reporter's question: which topic actors to describe."""
        return ServedTopicsList(endpoints=[entry.endpoint for entry in self.topics.values()],
                                serving=self._lease_valid())

    # ------------------------------------------------------------- loading and unloading
    async def handle_LeaseChanged(self, msg: LeaseChanged) -> None:
        if msg.held:
            self.lease_until_ms = max(self.lease_until_ms, msg.until_ms)
            if self.lease_held:
                return
            self.lease_held = True
            log.info("broker %d holds its lease: serving", self.broker_id)
            await self._resync(await assigned_to(self.metadata, self.broker_id))
            for topic in self.parked.topics():
                await self._wake(topic)
            return
        self.lease_held = False
        self.parked.refuse(math.inf, lease_held=False)  # they would wait out their time for nothing (see `_serve`)
        if self.topics:
            log.error("broker %d lost its lease: unloading %d topics (another broker may take them)",
                      self.broker_id, len(self.topics))
        # Every topic stops first: sealing waits on the metadata store, which may be
        # out of reach (the likely reason the lease was lost).
        stopped = [await self._stop_topic(topic) for topic in list(self.topics)]
        # Once the store is out of reach, every other seal would wait out its own
        # timeout too (hours with tens of thousands of topics): the rest are left to
        # what already reached the store, as a failed seal is. One log line, not one a topic.
        unsealed: list[str] = []
        store_gone = False
        for entry, next_offset in filter(None, stopped):
            if store_gone:
                unsealed.append(entry.name.full)
                continue
            try:
                await self._seal(entry, next_offset)
            except DanubeError as exc:
                log.error("topic %s not sealed (%s)", entry.name.full, exc)
                store_gone = isinstance(exc, Unavailable)
        if unsealed:
            log.error("%d more topics not sealed, the metadata store being out of reach (%s ...): their next"
                      " brokers start from what reached the store", len(unsealed), ", ".join(unsealed[:3]))

    async def handle_AssignmentChanged(self, msg: AssignmentChanged) -> None:
        record_exists = msg.broker_id is not None or self.registry.resolve_local(parse_topic(msg.topic)) is not None
        decision = on_assignment(me=self.broker_id, owner=msg.broker_id, served=msg.topic in self.topics,
                                 record_exists=record_exists)
        if decision is Ownership.LOAD:
            await self.load(msg.topic)
        else:
            self.damaged.forget(msg.topic)
            if decision is not Ownership.NOTHING:
                await self.unload(msg.topic, deleted=decision is Ownership.DELETE)
            if decision is Ownership.DELETE:
                await self.delete_local(msg.topic)
        await self._wake(msg.topic)

    async def handle_AssignmentsResync(self, msg: AssignmentsResync) -> None:
        await self._resync(msg.topics)

    async def _resync(self, topics: list[str]) -> None:
        """Serve what is assigned here and nothing else: a series of `ResyncNext` slices
        (a restart with 33,000 topics held every client request of the broker until
        all were loaded). Each topic follows the applied state when its slice comes, not
        the listing: assignment changes handled in between are then never undone."""
        wanted = set(topics)
        self._resync_generation += 1
        self._resync_left = collections.deque([t for t in self.topics if t not in wanted] + sorted(wanted))
        await self.handle_ResyncNext(ResyncNext(generation=self._resync_generation))

    async def handle_ResyncNext(self, msg: ResyncNext) -> None:
        if msg.generation != self._resync_generation:
            return  # a newer resync covers everything
        left = self._resync_left
        for _ in range(min(_RESYNC_SLICE, len(left))):
            topic = left.popleft()
            value = self.metadata.local_get(cr.assignment_key(topic))
            # A deletion is not decided here: it comes as its own assignment change.
            decision = on_assignment(me=self.broker_id, owner=None if value is None else owner_of_assignment(topic, value.value),
                                     served=topic in self.topics, record_exists=True)
            if decision is Ownership.LOAD:
                await self.load(topic)
                await self._wake(topic)
            elif decision is Ownership.UNLOAD:
                await self.unload(topic)
                await self._wake(topic)
        if left:
            # By a timer, not a message from this task: the broker's own messages to
            # itself go ahead of the mailbox, and the requests in it would wait again.
            self.system.schedule_once(self.endpoint, 1, msg)

    async def load(self, topic: str) -> None:
        if topic in self.topics or topic in self.moving_topics or not self.lease_held:
            return
        name = parse_topic(topic)
        resolved = self.registry.resolve_local(name)
        if resolved is None or resolved.partitioned_base:
            return  # deleted since; its assignment goes with it
        if resolved.record.dispatch_strategy == cp.DispatchStrategy.RELIABLE:
            try:
                start_offset = await self.files.start_offset(name)
            except WalDamaged as damage:
                if not await self.files.recover_from_durable(name, damage):
                    await self.damaged.mark(topic, damage)
                    return
                start_offset = await self.files.start_offset(name)
            self.damaged.forget(topic)
            await self.damaged.clear_record(topic)
        else:
            state = self.metadata.local_get(cr.topic_state_key(topic))
            start_offset = cr.decode(state.value, cr.TopicState).next_offset if state is not None else None
        # Producers recorded by the topic's previous broker attach again here.
        self.system.post(self.flusher_endpoint, ClearProducers(topic=topic))
        revision = self.metadata.local_revision()  # at or before the policies the topic is spawned with
        entry = self.topics[topic] = await self._spawn_topic(name, resolved.record.dispatch_strategy, start_offset)
        self.system.post(self.policy_endpoint, TopicServed(topic=topic, dispatch_strategy=entry.dispatch_strategy,
                                                           endpoint=entry.endpoint, revision=revision))
        METRICS.topics.set(len(self.topics))
        # Spawning may never suspend: a burst of assignments (a big topic created, a
        # restart with every topic to load) would hold the loop for all of them, and
        # the lease renewals, Raft and the admin Ping with it.
        await asyncio.sleep(0)
        log.info("topic %s loaded on broker %d", topic, self.broker_id)
        await self.dead_letters.loaded(entry)

    async def unload(self, topic: str, *, deleted: bool = False) -> None:
        stopped = await self._stop_topic(topic, deleted=deleted)
        if stopped is None or deleted:
            return
        if await self._start_marked_hand_over(topic):
            return
        try:
            await self._seal(*stopped)
        except DanubeError as exc:
            log.error("topic %s not sealed (%s): its next broker starts from what reached the store", topic, exc)

    async def _stop_topic(self, topic: str, *, deleted: bool = False) -> tuple[TopicEntry, int | None] | None:
        """Stop serving `topic`: its actor stops. The entry, and where a non-reliable
        topic's offsets stopped (None: unknown, or reliable: its log says)."""
        entry = self.topics.pop(topic, None)
        if entry is None:
            return None
        if self.reservations_endpoint is not None:
            self.system.post(self.reservations_endpoint, TopicReleased(topic=topic))
        self.system.post(self.policy_endpoint, TopicReleased(topic=topic, endpoint=entry.endpoint))
        next_offset = None
        if entry.dispatch_strategy != cp.DispatchStrategy.RELIABLE and not deleted:
            try:  # from here on it refuses sends: no offset is given out after this one
                sealed = await self.system.ask(entry.endpoint, SealTopic())
                next_offset = sealed.next_offset if isinstance(sealed, TopicSealed) else None
            except DanubeError as exc:
                log.warning("topic %s: where its offsets stopped is unknown (%s); the next broker starts at 0",
                            topic, exc)
        # On the way out the actor tells its clients: to re-attach (and be redirected)
        # unless the topic is gone.
        await self.system.stop(entry.endpoint, moving=not deleted)
        METRICS.topics.set(len(self.topics))
        log.info("topic %s unloaded from broker %d", topic, self.broker_id)
        if deleted:
            self.system.post(self.flusher_endpoint, ForgetTopicRecords(topic=topic))
        return entry, next_offset

    async def _seal(self, entry: TopicEntry, next_offset: int | None) -> None:
        """Leave a topic this broker stopped serving to the next: cursors written,
        (durable modes) its segments uploaded, where its offsets stopped recorded (the
        reservation ends there: the next broker continues without a gap), then the
        unassigned marker that waits for this marked sealed."""
        topic = entry.name.full
        await self._flush_cursors()
        if entry.dispatch_strategy == cp.DispatchStrategy.RELIABLE:
            next_offset = await self.files.seal(entry.name)
        if next_offset is not None:
            await write_topic_state(self.metadata, self.broker_id, entry, next_offset, self.system.clock.now_ms())
        key = cr.unassigned_key(topic)
        current = await self.metadata.get(key)
        if current is None:
            return
        marker = cr.decode(current.value, cr.Unassigned)
        if marks_sealed(me=self.broker_id, marker=marker):
            await self.metadata.compare_and_swap(key, current.version,
                                                 cr.encode(dataclasses.replace(marker, sealed=True)))
            log.info("topic %s sealed on broker %d for its next broker", topic, self.broker_id)

    async def delete_local(self, topic: str) -> None:
        """A deleted topic's files here: WAL and durable cache. (Its metadata went with
        the deletion; its durable segments are deleted by the broker that deleted it.)"""
        self.system.post(self.flusher_endpoint, ForgetTopicRecords(topic=topic))
        await self.files.delete_files(parse_topic(topic))

    # ------------------------------------------------------------- admin requests
    # Answered by `topic_admin.py` and `subscription_admin.py`, where `admin_reach.py`
    # says: in a task when another broker is involved, so this actor never waits on a
    # peer. Requests for the cluster's leader go to its load manager.
    def handle_GetClusterBalance(self, msg: ap.GetClusterBalance, origin: Origin) -> None:
        self.reach.in_task(msg, origin, self.reach.on_leader)

    def handle_RebalanceCluster(self, msg: ap.RebalanceCluster, origin: Origin) -> None:
        self.reach.in_task(msg, origin, self.reach.on_leader)

    def handle_UnloadBroker(self, msg: ap.UnloadBroker, origin: Origin) -> None:
        self.reach.in_task(msg, origin, self.reach.on_leader)

    def handle_ActivateBroker(self, msg: ap.ActivateBroker, origin: Origin) -> None:
        self.reach.in_task(msg, origin, self.reach.on_leader)

    def handle_UnloadTopic(self, msg: ap.UnloadTopic, origin: Origin) -> None:
        self.reach.in_task(msg, origin, self.topic_admin.unload_topic)  # a move in local mode waits on its hand-over

    async def handle_RepairTopic(self, msg: ap.RepairTopic, origin: Origin) -> Message | None:
        owner = self.topic_admin.repair_owner(msg)
        if owner is None:
            return await self.topic_admin.repair_topic(msg)
        # Repaired where its WAL is, in a task: the actor never waits on a peer.
        self.reach.in_task(msg, origin, functools.partial(self.reach.forward, owner))
        return None

    async def handle_DeleteTopic(self, msg: ap.DeleteTopic, origin: Origin) -> Message:
        return await self.topic_admin.delete_topic(msg)

    async def handle_CompactTopic(self, msg: ap.CompactTopic, origin: Origin) -> Message | None:
        return await self.reach.about_topic(msg, origin, self.topic_admin.compact_topic)

    async def handle_ReassignTopic(self, msg: ap.ReassignTopic, origin: Origin) -> Message:
        return await self.topic_admin.reassign_topic(msg)

    # Requests about one topic, run where its partitions are served.
    async def handle_DescribeTopic(self, msg: ap.DescribeTopic, origin: Origin) -> Message | None:
        return await self.reach.about_topic(msg, origin, functools.partial(self.topic_admin.describe_topic,
                                                                            partial=True))

    async def handle_ListSubscriptions(self, msg: ap.ListSubscriptions, origin: Origin) -> Message | None:
        return await self.reach.about_topic(msg, origin, self.subscription_admin.list_subscriptions)

    async def handle_Unsubscribe(self, msg: ap.Unsubscribe, origin: Origin) -> Message | None:
        return await self.reach.about_topic(msg, origin, self.subscription_admin.unsubscribe)

    async def handle_SeekSubscription(self, msg: ap.SeekSubscription, origin: Origin) -> Message | None:
        return await self.reach.about_topic(msg, origin, self.subscription_admin.seek)

    async def handle_SetFailurePolicy(self, msg: ap.SetFailurePolicy, origin: Origin) -> Message | None:
        return await self.reach.about_topic(msg, origin, self.subscription_admin.set_failure_policy)

    async def handle_GetFailurePolicy(self, msg: ap.GetFailurePolicy, origin: Origin) -> Message | None:
        return await self.reach.about_topic(msg, origin, self.subscription_admin.get_failure_policy)

    async def handle_SetDispatchConfig(self, msg: ap.SetDispatchConfig, origin: Origin) -> Message | None:
        return await self.reach.about_topic(msg, origin, self.subscription_admin.set_dispatch_config)

    async def handle_GetDispatchConfig(self, msg: ap.GetDispatchConfig, origin: Origin) -> Message | None:
        return await self.reach.about_topic(msg, origin, self.subscription_admin.get_dispatch_config)

    async def handle_RemoteAdminFor(self, msg: ip.RemoteAdminFor) -> Message:
        return await self.reach.remote_admin_for(msg)

    # ------------------------------------------------------------- WAL hand-overs (storage.mode local, `hand_over.py`)
    async def _start_marked_hand_over(self, topic: str) -> bool:
        """A rebalance or drain of a topic just stopped here that moves by hand-over:
        carried out by a `HandOver` child; True if started."""
        move = marked_move(self.config, self.registry, self.broker_id, topic)
        if move is None:
            return False
        self.moving_topics.add(topic)
        marker, target, refusal = move
        await self.spawn_hand_over(topic, target, refusal, marker, None)
        return True

    async def spawn_hand_over(self, topic: str, target: cr.BrokerRegistration | None, refusal: str | None,
                               marker: cr.Unassigned | None, done: asyncio.Future[DanubeError | None] | None) -> None:
        config, metadata, broker_id, broker = self.config, self.metadata, self.broker_id, self.endpoint
        flusher, wal_dir, handover_id = self.flusher_endpoint, self.files.wal_dir(parse_topic(topic)), self.rng.getrandbits(63)
        curve = self.curve
        await self.system.spawn(lambda: HandOver(
            topic=topic, target=target, refusal=refusal, marker=marker, handover_id=handover_id, broker_id=broker_id,
            broker_endpoint=broker, flusher_endpoint=flusher, metadata=metadata, config=config, wal_dir=wal_dir,
            done=done, curve=curve), name=f"hand-over {topic}", parent=broker)

    async def handle_StopForHandOver(self, msg: StopForHandOver) -> Message:
        if msg.topic in self.moving_topics:
            raise FailedPrecondition(f"topic {msg.topic} is being moved already")
        if msg.topic not in self.topics or not self.lease_held:
            raise FailedPrecondition(f"topic {msg.topic} is not served by broker {self.broker_id}; retry")
        self.moving_topics.add(msg.topic)
        await self._stop_topic(msg.topic)
        return HandOverStopped(topic=msg.topic)

    async def handle_HandOverEnded(self, msg: HandOverEnded) -> None:
        if msg.hand_over is not None:
            await self.system.stop(msg.hand_over)
        self.moving_topics.discard(msg.topic)
        if msg.error is None:
            await asyncio.to_thread(shutil.rmtree, self.files.wal_dir(parse_topic(msg.topic)), True)
        elif (assignment := self.registry.assignment(msg.topic)) is not None and assignment.broker_id == self.broker_id:
            await self.load(msg.topic)  # else its assignment, when it comes back here, loads it
        await self._wake(msg.topic)

    # The receiving side (`hand_over_incoming.py`).
    async def handle_BeginHandOver(self, msg: ap.BeginHandOver, origin: Origin) -> Message:
        return await self.incoming.begin(msg)

    async def handle_HandOverChunk(self, msg: ap.HandOverChunk, origin: Origin) -> Message:
        return await self.incoming.chunk(msg)

    async def handle_CommitHandOver(self, msg: ap.CommitHandOver, origin: Origin) -> Message:
        return await self.incoming.commit(msg)

    async def handle_AbortHandOver(self, msg: ap.AbortHandOver, origin: Origin) -> Message:
        return await self.incoming.abort(msg)

    # ------------------------------------------------------------- requests waiting for an assignment
    async def _wake(self, topic: str) -> None:
        """The broker handled a change of `topic`'s assignment: what waits for it goes on."""
        self.reach.wake(topic)
        await self.parked.replay(topic)

    async def handle_ParkedExpired(self, msg: ParkedExpired) -> None:
        # A request parked because its topic's owner missed a renewal (`Registry.elsewhere`)
        # waits for that owner to renew; no event says so, so each check looks.
        for topic in [t for t in self.parked.topics() if self.registry.elsewhere(t) is not None]:
            await self._wake(topic)
        self.parked.refuse(self.system.clock.monotonic_ms(), lease_held=self.lease_held)

    # ------------------------------------------------------------- reading the registry
    def read(self, key: str) -> bytes | None:
        """A key of the local replica (the policies in force are read through it)."""
        value = self.metadata.local_get(key)
        return None if value is None else value.value

    # ------------------------------------------------------------- reliable storage
    def _on_uploaded(self, desc: SegmentDescriptor) -> None:
        entry = self.topics.get(desc.topic)
        if entry is not None:
            self.system.post(entry.endpoint, SegmentDurable(segment=durable_segment(desc)))

    def handle_SegmentSealed(self, msg: SegmentSealed) -> None:
        self.files.submit_sealed(msg, self._on_uploaded)

    def handle_TopicStopped(self, msg: TopicStopped) -> None:
        if msg.topic in self.topics:  # a shutdown (an unloaded topic was sealed by `_seal`)
            self.stopped_offsets[msg.topic] = msg.next_offset

    def handle_ReserveOffsets(self, msg: ReserveOffsets) -> None:
        """Written by the `OffsetReservations` child; only for a topic served here."""
        entry = self.topics.get(msg.topic)
        if entry is None or self.reservations_endpoint is None:
            return  # unloaded meanwhile: its seal ended the reservation
        self.system.post(self.reservations_endpoint, ReserveOffsetsFor(
            topic=msg.topic, until=msg.until, endpoint=entry.endpoint,
            lease_until_ms=self.lease_until_ms if self.lease_held else 0))

    async def handle_ForgetSegments(self, msg: ForgetSegments) -> None:
        if self.files.segment_catalog is not None:
            for base_offset in msg.base_offsets:
                await self.files.segment_catalog.remove(msg.topic, base_offset)

    def handle_ProducerRegistry(self, msg: ProducerRegistry) -> None:
        if msg.topic not in self.topics:
            return  # unloaded: the topic's next broker clears its records
        self.system.post(self.flusher_endpoint, msg)

    async def _flush_cursors(self) -> None:
        """Have the cursor flusher write every cursor and producer record told it so far
        (what the topics told it before this ask is ahead of it in its mailbox)."""
        await self.system.ask(self.flusher_endpoint, FlushCursors(),
                              timeout_ms=2 * self.config.cluster.request_timeout_ms)

    async def subscriptions_of(self, name: TopicName) -> list[SubscriptionState]:
        """The topic's persisted subscriptions, newest cursors (not written yet) included."""
        answer = await self.system.ask(self.flusher_endpoint, SubscriptionsOf(topic=name.full))
        assert isinstance(answer, PersistedSubscriptions)
        return answer.states

    async def handle_DeadLetter(self, msg: DeadLetter) -> None:
        await self.dead_letters.route(msg)

    def handle_ListSnapshotTopics(self, msg: ListSnapshotTopics) -> Message:
        """The reliable topics (partitions) served here, by name or base-topic glob."""
        return snapshot_topics(self.topics, msg.pattern)

    def handle_TopicSchemaChanged(self, msg: TopicSchemaChanged) -> None:
        """A binding changed in the metadata store: tell the topic's actors served here."""
        base = parse_topic(msg.topic).base.full
        for name, entry in self.topics.items():
            if name == msg.topic or entry.name.base.full == base:
                self.system.post(entry.endpoint, msg)  # not lost to a full mailbox; revisions keep the order

    # ------------------------------------------------------------- client side
    def _serve(self, topic: str, req: ClientRequest) -> TopicEntry | None:
        """The entry when `topic` is served here; raises `Moved` when another broker
        serves it; None when the request was parked until it has a broker."""
        entry = self.topics.get(topic)
        if entry is not None and self._lease_valid():
            return entry
        damage = self.damaged.get(topic)
        if damage is not None:
            raise Unavailable(damage_text(topic, damage))
        holder = held_by_dead_broker(self.config, self.registry, self.broker_id, topic)
        if holder is not None:
            raise Unavailable(held_by_dead_broker_text(topic, holder))
        owner = self.registry.elsewhere(topic)
        if owner is not None:
            raise Moved(f"topic {topic} is served by broker {owner.broker_id}", owner.broker_url)
        if self.lease_until_ms and not self._lease_valid():
            # Held once and lost: the store is likely out of reach and another broker may
            # take the topic; a parked request would wait out request_timeout_ms again at
            # every retry, while the client's own retry may find that broker.
            raise Unavailable(f"topic {topic} is not served: broker {self.broker_id} lost its lease; retry")
        self.parked.park(topic, req)
        return None

    async def handle_Lookup(self, msg: cp.Lookup, origin: Origin) -> Message | None:
        req = origin.envelope
        resolved = await self.registry.existing(parse_topic(msg.topic))
        if resolved.partitioned_base:
            return cp.LookupResult(request_id=msg.request_id, kind=cp.LookupKind.CONNECT, broker_url=self.broker_url)
        try:
            if self._serve(resolved.name.full, req) is None:
                return None
        except Moved as moved:
            return cp.LookupResult(request_id=msg.request_id, kind=cp.LookupKind.REDIRECT,
                                   broker_url=moved.redirect_url)
        return cp.LookupResult(request_id=msg.request_id, kind=cp.LookupKind.CONNECT, broker_url=self.broker_url)

    async def handle_GetPartitions(self, msg: cp.GetPartitions, origin: Origin) -> Message:
        name = parse_topic(msg.topic)
        resolved = await self.registry.resolve(name)
        if resolved is None:
            if not msg.create:
                raise NotFound(f"topic {name.full} does not exist")
            if not self.config.auto_create_topics:
                raise NotFound(f"topic {name.full} does not exist and auto_create_topics is off")
            if msg.for_subscription:
                resolved = await self.catalog.create_for_subscriber(name)
            else:
                resolved = await self.catalog.create_or_existing(name, msg.partitions, msg.dispatch_strategy)
        elif msg.create and not msg.for_subscription:
            resolved = await self.catalog.shaped(resolved, msg.partitions, msg.dispatch_strategy)
        return cp.Partitions(request_id=msg.request_id, topic=name.full, partitions=resolved.served_names())

    async def _serve_as_recorded(self, topic: str, resolved: Resolved) -> None:
        """Restart the topic's actor here if its dispatch strategy is not the record's
        (its first producer changed it): its clients are told to attach again."""
        entry = self.topics.get(topic)
        if entry is None or entry.dispatch_strategy == resolved.record.dispatch_strategy:
            return
        stats = await self.system.ask(entry.endpoint, DescribePartition())
        assert isinstance(stats, PartitionStats)
        subscriptions = stats.info.subscriptions
        await self._stop_topic(topic)
        if entry.dispatch_strategy == cp.DispatchStrategy.RELIABLE:
            await self.delete_local(topic)
        await self.load(topic)
        restarted = self.topics.get(topic)
        if restarted is not None and subscriptions:
            # Before its consumers attach again (this actor handles their Subscribe next).
            await self.system.ask(restarted.endpoint, OpenSubscriptions(
                names=[s.name for s in subscriptions], sub_types=[s.sub_type for s in subscriptions]))

    async def handle_CreateProducer(self, msg: cp.CreateProducer, origin: Origin) -> Message | None:
        name = parse_topic(msg.topic)
        resolved = await self.registry.resolve(name)
        if resolved is None:
            if not self.config.auto_create_topics:
                raise NotFound(f"topic {name.full} does not exist and auto_create_topics is off")
            resolved = await self.catalog.create_or_existing(name, 0, msg.dispatch_strategy)
        if resolved.partitioned_base:
            raise FailedPrecondition(f"topic {name.full} has {resolved.record.partitions} partitions:"
                                     f" attach producers to its partitions {name.partition_name(0)} ...")
        resolved = await self.catalog.shaped(resolved, 0, msg.dispatch_strategy)
        await self._serve_as_recorded(name.full, resolved)
        return self._forward(name.full, origin.envelope)

    async def handle_Subscribe(self, msg: cp.Subscribe, origin: Origin) -> Message | None:
        resolved = await self.registry.existing(parse_topic(msg.topic))
        if resolved.partitioned_base:
            raise FailedPrecondition(f"topic {resolved.name.full} has {resolved.record.partitions} partitions:"
                                     f" subscribe to each of its partitions")
        return self._forward(resolved.name.full, origin.envelope)

    def _forward(self, topic: str, req: ClientRequest) -> Message | None:
        entry = self._serve(topic, req)
        if entry is not None and not self.system.tell(entry.endpoint, req):
            raise ResourceExhausted(f"topic {topic} is busy (full mailbox); retry")
        return None

    async def _spawn_topic(self, name: TopicName, dispatch_strategy: int, start_offset: int | None) -> TopicEntry:
        config, rng, executor, broker, flusher = self.config, self.rng, self.executor, self.endpoint, self.flusher_endpoint
        read = self.read
        seed = rng.getrandbits(64)
        if dispatch_strategy == cp.DispatchStrategy.RELIABLE:
            wal_dir = self.files.wal_dir(name)
            cache_dir = self.files.cache_dir(name)
            segments = self.files.segment_catalog

            def factory() -> Actor:
                # Evaluated at each (re)start: a topic restarted after a failure gets the
                # subscriptions, cursors and durable segments as they are now, not as they
                # were when it was first spawned. The parent builds its child's arguments.
                return make_topic(
                    name=name.full, dispatch_strategy=dispatch_strategy, config=config, rng=IdSource(seed),
                    wal_dir=wal_dir, executor=executor, cursor_endpoint=flusher, broker_endpoint=broker,
                    durable=[durable_segment(d) for d in segments.list(name.full)] if segments else [],
                    cache_dir=cache_dir, start_offset=start_offset,
                    backlog_quota=policies.backlog_quota(read, config, name)[:2],
                    policies=policies.topic_policies(read, config, name)[0])
        else:
            factory = lambda: make_topic(  # noqa: E731
                name=name.full, dispatch_strategy=dispatch_strategy, config=config, rng=IdSource(seed),
                broker_endpoint=broker, start_offset=start_offset, policies=policies.topic_policies(read, config, name)[0])
        endpoint = await self.system.spawn(factory, name=f"topic {name.full}", parent=self.endpoint)
        return TopicEntry(name=name, dispatch_strategy=dispatch_strategy, endpoint=endpoint)

    def handle_ChildStopped(self, msg: ChildStopped) -> None:
        for full, entry in list(self.topics.items()):
            if entry.endpoint == msg.endpoint:
                log.error("topic %s stopped after repeated failures (%s); it is no longer served", full, msg.reason)
                del self.topics[full]
                self.system.post(self.policy_endpoint, TopicReleased(topic=full, endpoint=entry.endpoint))

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
5. Admin requests (`broker_admin.py`, mixed in): about a topic they run on the
   brokers that serve its partitions; balance and rebalancing go to the leader.

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
import contextlib
import dataclasses
import fnmatch
import logging
import math
import random
import shutil
from concurrent.futures import Executor
from pathlib import Path
from typing import Any

import msgpack

from danube_zmq.actors.broker_admin import BrokerAdmin, _damage_text
from danube_zmq.actors.broker_backlog_quotas import BrokerBacklogQuotas
from danube_zmq.actors.broker_handover import BrokerHandOver
from danube_zmq.actors.broker_namespace_limits import BrokerNamespaceLimits, NamespaceLimits
from danube_zmq.actors.broker_topic_policies import BrokerTopicPolicies
from danube_zmq.actors.config import BrokerConfig
from danube_zmq.actors.cursor_flusher import CursorFlusher
from danube_zmq.actors.gateway import reply_client
from danube_zmq.actors.ids import IdSource
from danube_zmq.actors.lease_keeper import LeaseKeeper
from danube_zmq.actors.load_reporter import LoadReporter
from danube_zmq.actors.metadata_catalog import MetadataCatalog
from danube_zmq.actors.metadata_watch import MetadataWatch
from danube_zmq.actors.metrics import METRICS
from danube_zmq.actors.offset_reservations import OffsetReservations
from danube_zmq.actors.ownership import (
    Ownership,
    damaged_wal_is_stale,
    marks_sealed,
    on_assignment,
    reliable_start,
    seal_state,
)
from danube_zmq.actors.pending_tells import PendingTells
from danube_zmq.actors.topic import make_topic
from danube_zmq.actors.topic.wal.writer import publish_cursor_tail
from danube_zmq.actors.topic_registry import Resolved, TopicEntry
from danube_zmq.consensus.metadata_store import RaftMetadataStore
from danube_zmq.consensus.state_machine import WatchEvent
from danube_zmq.runtime.actor import Actor, Origin
from danube_zmq.runtime.request_tasks import RequestTasks
from danube_zmq.security.curve import ClusterCurve
from danube_zmq.storage.catalog import LevelDbCatalog, SegmentCatalog, SegmentDescriptor
from danube_zmq.storage.durable import DurableStore, SealedSegment, Uploader, UploaderConfig, cursors_key
from danube_zmq.storage.paths import resolve_inside
from danube_zmq.storage.wal.errors import WalDamaged
from danube_zmq.storage.wal.log import WalLog
from danube_zmq.storage.wal.segment import parse_segment_file_name
from danube_zmq.transport import client_protocol as cp
from danube_zmq.transport import cluster_records as cr
from danube_zmq.transport.codec import Message
from danube_zmq.transport.common import Error
from danube_zmq.transport.errors import (
    AlreadyExists,
    DanubeError,
    FailedPrecondition,
    InternalError,
    InvalidArgument,
    Moved,
    NotFound,
    ResourceExhausted,
    Unavailable,
)
from danube_zmq.transport.internal_protocol import (
    AppendInternal,
    AssignmentChanged,
    AssignmentsResync,
    BacklogQuotasChanged,
    BacklogQuotasPending,
    ChildStopped,
    ClearProducers,
    ClientRequest,
    DeadLetter,
    DescribePartition,
    DurableSegment,
    FlushCursors,
    ForgetDamage,
    ForgetSegments,
    ForgetTopicRecords,
    JoinAttempted,
    JoinCluster,
    LeaseChanged,
    ListSnapshotTopics,
    OpenSubscriptions,
    ParkedExpired,
    PartitionStats,
    PersistedSubscriptions,
    ProducerRegistry,
    RecordDamage,
    ReserveOffsets,
    ReserveOffsetsFor,
    ResyncNext,
    SealTopic,
    SegmentDurable,
    SegmentSealed,
    ServedTopics,
    ServedTopicsList,
    SnapshotTopicRef,
    SnapshotTopics,
    SubscriptionsOf,
    SubscriptionState,
    TopicPoliciesChanged,
    TopicPoliciesPending,
    TopicReleased,
    TopicSchemaChanged,
    TopicSealed,
    TopicStopped,
)
from danube_zmq.transport.topic_name import TopicName, parse_topic

log = logging.getLogger("danube_zmq.broker")

# How long a clean stop waits for the uploads of just-sealed segments.
_UPLOADS_AT_STOP_S = 30.0
# Client requests waiting for a topic's assignment, at most, and how often their
# deadlines are checked.
_PARKED_MAX = 10_000
_PARKED_CHECK_MS = 200
# A failed attempt to join the cluster is tried again after this long.
_JOIN_RETRY_MS = 200
_REMOTE_ADMIN_TASKS_MAX = 64
_DEAD_LETTER_BATCHES_MAX = 1_000
# How long offset reservations are retried before the topic is told they failed.
_RESERVE_RETRY_S = 3.0
# Keys one topic create or delete writes per metadata transaction (the state machine's
# batch_keys_max is 4,096): a big topic is written in several. Every replica applies a
# batch in one step of its event loop, so batches stay small: 1,000 keys held each
# broker's loop for about 50 ms (more than a follower's Raft heartbeat on a busy host).
_TOPIC_KEYS_PER_BATCH = 256
# Assignments decoded between two yields to the event loop.
_KEYS_PER_SLICE = 2_000
# Topics a resync loads or unloads in one message; then the broker's queued requests.
_RESYNC_SLICE = 256


class BrokerActor(BrokerAdmin, BrokerHandOver, BrokerBacklogQuotas, BrokerNamespaceLimits, BrokerTopicPolicies,
                  Actor):
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
        self.durable_store: DurableStore | None = None
        self.segment_catalog: SegmentCatalog | None = None
        self.uploader: Uploader | None = None
        self.broker_id = broker_id
        self.broker_url = broker_url
        self.admin_url = admin_url
        self.metrics_url = metrics_url
        self.rng = rng
        self.topics: dict[str, TopicEntry] = {}
        # Topics whose mailbox was full when told the topic policies or the backlog quota
        # in force: told again (`BrokerTopicPolicies`, `BrokerBacklogQuotas`) until one
        # tell gets through or the topic goes.
        self.policies_pending = PendingTells("topic policies", TopicPoliciesPending())
        self.quotas_pending = PendingTells("backlog quota", BacklogQuotasPending())
        # Reliable topics assigned here and not served: their WAL is damaged (until an
        # operator repairs them, or they move or are deleted).
        self.damaged: dict[str, WalDamaged] = {}
        self.lease_held = False
        self.lease_until_ms = 0  # monotonic; stop serving at this time unless renewed
        self.parked: dict[str, list[tuple[ClientRequest, int]]] = {}
        self.parked_count = 0
        self.dead_letters: dict[str, list[DeadLetter]] = {}
        self.dead_letters_count = 0
        self._replay_deadline: int | None = None
        self.joined = False
        self._remote_admin = RequestTasks(_REMOTE_ADMIN_TASKS_MAX)
        self._join_tasks = RequestTasks(1)  # the attempt to join the cluster under way
        self._joining = False
        self.remote_admins: dict[str, str] = {}  # admin URL of another broker -> its RemoteAdmin child
        # Admin request tasks waiting for a topic's next assignment (`_owner_changed`):
        # resolved by `_wake` when the broker has handled a change of it.
        self.owner_waits: dict[str, list[asyncio.Future[None]]] = {}
        self._resync_left: collections.deque[str] = collections.deque()  # topics the resync still follows
        self._resync_generation = 0
        self.moving_topics: set[str] = set()  # stopped here while their WAL is handed over (local mode)
        self.incoming_moves: dict[str, Any] = {}  # topic -> the WAL being handed here (`Incoming`)

    # ------------------------------------------------------------- lifecycle
    async def on_start(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        # Moves handed here that never finished (they are begun again from the start).
        await asyncio.to_thread(shutil.rmtree, self.data_dir / "handover", True)
        await self._start_uploader()
        metadata, broker_id = self.metadata, self.broker_id
        interval_ms = self.config.storage.cursor_flush_interval_ms
        # Spawned before any topic: children stop newest first (`ActorSystem.stop`), so the
        # flusher stops after every topic and writes the final cursors they told it.
        self.flusher_endpoint = await self.system.spawn(
            lambda: CursorFlusher(metadata=metadata, broker_id=broker_id, interval_ms=interval_ms),
            name=f"cursor flusher {broker_id}", parent=self.endpoint)
        self.reservations_endpoint = await self.system.spawn(
            lambda: OffsetReservations(metadata=metadata, broker_id=broker_id),
            name=f"offset reservations {broker_id}", parent=self.endpoint)
        self.system.schedule_periodic(self.endpoint, _PARKED_CHECK_MS, ParkedExpired())
        self.system.post(self.endpoint, JoinCluster())

    async def _start_uploader(self) -> None:
        """Durable modes: sealed segments of reliable topics are copied to the durable store."""
        storage = self.config.storage
        if storage.mode == "local":
            return
        assert storage.durable_url
        self.durable_store = DurableStore(storage.durable_url)
        self.segment_catalog = SegmentCatalog(MetadataCatalog(self.metadata))
        self.uploader = Uploader(self.durable_store, self.segment_catalog, UploaderConfig(uploads_max=storage.uploads_max),
                                 clock=self.system.clock, on_uploaded=self._on_uploaded)
        await self.uploader.start()

    async def on_stop(self) -> None:
        await self._join_tasks.cancel_all()
        await self._remote_admin.cancel_all()  # the RemoteAdmin children closed their clients (stopped first)
        if self.uploader is not None:
            try:  # the segments topics sealed while stopping (told before this runs)
                async with asyncio.timeout(_UPLOADS_AT_STOP_S):
                    await self.uploader.wait_idle()
            except (TimeoutError, DanubeError) as exc:
                log.warning("uploads still pending at shutdown (%s); they resume at the next start", exc)
            await self.uploader.stop()
            self.uploader = None
        try:
            await self._end_reservations()
        except (DanubeError, TimeoutError) as exc:
            log.warning("offset reservations not ended at shutdown (%s): a next broker starts past them", exc)
        # The cursors were written by the flusher, stopped (after the topics) before this runs.

    # ------------------------------------------------------------- joining the cluster
    def handle_JoinCluster(self, msg: JoinCluster) -> None:
        """Wait for a leader, seed the namespaces, import a pre-cluster catalog, then
        hold the lease and follow the assignments. An attempt waits on the store in a
        task of its own (while no leader exists each read waits out its timeout: the
        broker answers its other messages meanwhile), which tells `JoinAttempted`; one
        that failed is tried again by a timer message."""
        if self.joined or self._joining or not self.system.is_alive(self.endpoint):
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
        if self.joined:
            return
        if msg.error is not None:
            log.info("broker %d waiting for the metadata store (%s)", self.broker_id, msg.error)
            self.system.schedule_once(self.endpoint, _JOIN_RETRY_MS, JoinCluster())
            return
        self.joined = True
        await self._spawn_lease_keeper()
        metadata, broker, broker_id = self.metadata, self.endpoint, self.broker_id
        interval_ms = self.config.load_manager.report_interval_ms
        await self.system.spawn(lambda: LoadReporter(metadata=metadata, broker_endpoint=broker, broker_id=broker_id,
                                                     interval_ms=interval_ms),
                                name=f"load reporter {broker_id}", parent=broker)
        await self.system.spawn(lambda: MetadataWatch(
            metadata=metadata, prefix=cr.BACKLOG_QUOTAS, target=broker, start_over=_quotas_changed,
            on_event=_quotas_event), name=f"backlog quotas watch {broker_id}", parent=broker)
        await self.system.spawn(lambda: MetadataWatch(
            metadata=metadata, prefix=cr.TOPIC_POLICIES, target=broker, start_over=_policies_changed,
            on_event=_policies_event), name=f"topic policies watch {broker_id}", parent=broker)

        async def assigned() -> Message:
            revision = metadata.local_revision()  # the listing's (the scan starts before any yield)
            return AssignmentsResync(topics=await assigned_to(metadata, broker_id), revision=revision)

        await self.system.spawn(lambda: MetadataWatch(
            metadata=metadata, prefix=cr.ASSIGNMENTS, target=broker, start_over=assigned,
            on_event=_assignment_changed), name=f"assignments watch {broker_id}", parent=broker)

    async def _bootstrap(self) -> None:
        for namespace in self.config.bootstrap_namespaces:
            await self.metadata.compare_and_swap(cr.namespace_key(namespace), 0, b"")
        await self.metadata.compare_and_swap(cr.state_key(self.broker_id), 0,
                                             cr.encode(cr.BrokerStateRecord(mode=cr.BrokerMode.ACTIVE)))
        # Outlives the lease: `brokers list` shows this broker as down once it is gone.
        await self.metadata.put(cr.seen_key(self.broker_id), cr.encode(self._own_registration()))
        await self._import_local_registry()

    async def _import_local_registry(self) -> None:
        """A data directory from before the registry moved to the metadata store has a
        local catalog: its namespaces, topics, cursors and segment descriptors are
        written to the store once, then the catalog is set aside (`catalog.imported`)."""
        path = self.data_dir / "catalog"
        if not path.exists():
            return
        catalog = LevelDbCatalog(path)
        try:
            for key, _ in catalog.scan(cr.NAMESPACES):
                await self.metadata.compare_and_swap(key, 0, b"")
            for key, value in catalog.scan(cr.TOPICS):
                if key.count("/") != 3:
                    await self.metadata.compare_and_swap(key, 0, value)  # a subscription's cursor
                    continue
                record = msgpack.unpackb(value)
                name = parse_topic(cr.topic_of(key, cr.TOPICS))
                with contextlib.suppress(AlreadyExists):
                    await self._write_topic(name, record["partitions"], record["dispatch_strategy"])
                    log.info("topic %s moved from the local catalog to the metadata store", name.full)
            for key, value in catalog.scan("/storage/topics/"):
                await self.metadata.compare_and_swap(key, 0, value)  # segment descriptors
        finally:
            catalog.close()
        path.rename(self.data_dir / "catalog.imported")

    async def _spawn_lease_keeper(self) -> None:
        """The registration lease is held by a child actor (`lease_keeper.py`), which
        tells this one `LeaseChanged`."""
        cluster = self.config.cluster
        registration = cr.encode(self._own_registration())
        metadata, broker, broker_id = self.metadata, self.endpoint, self.broker_id
        await self.system.spawn(lambda: LeaseKeeper(
            metadata=metadata, broker_endpoint=broker, broker_id=broker_id, key=cr.register_key(broker_id),
            registration=registration, ttl_ms=cluster.lease_ttl_ms), name=f"lease keeper {broker_id}", parent=broker)

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
            for topic in list(self.parked):
                await self._wake(topic)
            return
        self.lease_held = False
        self._refuse_parked(math.inf)  # they would wait out their time for nothing (see `_serve`)
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
        record_exists = msg.broker_id is not None or self._resolve_local(parse_topic(msg.topic)) is not None
        decision = on_assignment(me=self.broker_id, owner=msg.broker_id, served=msg.topic in self.topics,
                                 record_exists=record_exists)
        if decision is Ownership.LOAD:
            await self._load(msg.topic)
        else:
            self._forget_damage(msg.topic)
            if decision is not Ownership.NOTHING:
                await self._unload(msg.topic, deleted=decision is Ownership.DELETE)
            if decision is Ownership.DELETE:
                await self._delete_local(msg.topic)
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
            decision = on_assignment(me=self.broker_id, owner=None if value is None else _owner(topic, value.value),
                                     served=topic in self.topics, record_exists=True)
            if decision is Ownership.LOAD:
                await self._load(topic)
                await self._wake(topic)
            elif decision is Ownership.UNLOAD:
                await self._unload(topic)
                await self._wake(topic)
        if left:
            # By a timer, not a message from this task: the broker's own messages to
            # itself go ahead of the mailbox, and the requests in it would wait again.
            self.system.schedule_once(self.endpoint, 1, msg)

    async def _load(self, topic: str) -> None:
        if topic in self.topics or topic in self.moving_topics or not self.lease_held:
            return
        name = parse_topic(topic)
        resolved = self._resolve_local(name)
        if resolved is None or resolved.partitioned_base:
            return  # deleted since; its assignment goes with it
        if resolved.record.dispatch_strategy == cp.DispatchStrategy.RELIABLE:
            try:
                start_offset = await self._start_offset(name)
            except WalDamaged as damage:
                if not await self._recover_from_durable(name, damage):
                    await self._mark_damaged(topic, damage)
                    return
                start_offset = await self._start_offset(name)
            self._forget_damage(topic)
            await self._clear_damage_record(topic)
        else:
            state = self.metadata.local_get(cr.topic_state_key(topic))
            start_offset = cr.decode(state.value, cr.TopicState).next_offset if state is not None else None
        # Producers recorded by the topic's previous broker attach again here.
        self.system.post(self.flusher_endpoint, ClearProducers(topic=topic))
        entry = self.topics[topic] = await self._spawn_topic(name, resolved.record.dispatch_strategy, start_offset)
        METRICS.topics.set(len(self.topics))
        # Spawning may never suspend: a burst of assignments (a big topic created, a
        # restart with every topic to load) would hold the loop for all of them, and
        # the lease renewals, Raft and the admin Ping with it.
        await asyncio.sleep(0)
        log.info("topic %s loaded on broker %d", topic, self.broker_id)
        waiting = self.dead_letters.pop(topic, [])
        self.dead_letters_count -= len(waiting)
        await self._append_dead_letters(entry, waiting)

    async def _unload(self, topic: str, *, deleted: bool = False) -> None:
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
            next_offset, sealed = await asyncio.to_thread(self._seal_wal, entry.name)
            if self.uploader is not None and self.segment_catalog is not None:
                # Every sealed segment reaches the durable store before the next broker
                # opens the topic from it (the topic's own reports of them may still be
                # in this actor's mailbox).
                for segment in sealed:
                    if self.segment_catalog.get(topic, segment.base_offset) is None:
                        with contextlib.suppress(DanubeError):  # queued already
                            self.uploader.submit(segment)
                try:
                    async with asyncio.timeout(_UPLOADS_AT_STOP_S):
                        await self.uploader.wait_idle()
                except TimeoutError:
                    raise Unavailable(f"uploads did not finish within {_UPLOADS_AT_STOP_S:g} s") from None
        if next_offset is not None:
            await self._write_topic_state(entry, next_offset)
        key = cr.unassigned_key(topic)
        current = await self.metadata.get(key)
        if current is None:
            return
        marker = cr.decode(current.value, cr.Unassigned)
        if marks_sealed(me=self.broker_id, marker=marker):
            await self.metadata.compare_and_swap(key, current.version,
                                                 cr.encode(dataclasses.replace(marker, sealed=True)))
            log.info("topic %s sealed on broker %d for its next broker", topic, self.broker_id)

    async def _write_topic_state(self, entry: TopicEntry, next_offset: int) -> None:
        """Record where the topic's offsets stopped, unless another broker reserved its
        offsets since (it took the topic over from this one: its record stands)."""
        key = cr.topic_state_key(entry.name.full)
        current = self.metadata.local_get(key)
        recorded = cr.decode(current.value, cr.TopicState) if current is not None else None
        state = seal_state(me=self.broker_id, reliable=entry.dispatch_strategy == cp.DispatchStrategy.RELIABLE,
                           current=recorded, next_offset=next_offset, now_ms=self.system.clock.now_ms())
        if state is None:
            assert recorded is not None
            log.warning("topic %s: broker %d reserved its offsets since; not sealed here", entry.name.full,
                        recorded.broker_id)
            return
        result = await self.metadata.compare_and_swap(key, current.version if current is not None else 0,
                                                      cr.encode(state))
        if not result.succeeded:
            log.warning("topic %s: its offsets record changed meanwhile; not sealed here", entry.name.full)

    def _seal_wal(self, name: TopicName) -> tuple[int | None, list[SealedSegment]]:
        """Seal the active segment of a topic no longer served here (durable modes);
        its next offset and its sealed segments. Runs in a thread."""
        directory = self._wal_dir(name)
        if not directory.exists():
            return None, []
        storage = self.config.storage
        wal = WalLog.open(directory, segment_bytes_max=storage.wal_segment_bytes_max,
                          segment_age_ms_max=storage.wal_segment_age_ms_max, clock=self.system.clock)
        try:
            if storage.mode == "local":
                return wal.next_offset, []
            if wal.seal_active() is None and storage.cursors_in_segments and self.durable_store is not None:
                # Checkpoints only (a stop with a flush in flight does not seal): the next
                # broker reads them from the store as they are.
                publish_cursor_tail(wal, self.durable_store, name.full)
            return wal.next_offset, [
                SealedSegment(topic=name.full, base_offset=info.base_offset, end_offset=info.next_offset - 1,
                              record_count=info.next_offset - info.base_offset, local_path=Path(info.path))
                for info in wal.segments() if info.sealed and info.next_offset > info.base_offset]
        finally:
            wal.close()

    def _wal_end(self, name: TopicName) -> int | None:
        """The next offset of the topic's local WAL (None: it has none). Runs in a thread."""
        directory = self._wal_dir(name)
        if not directory.exists():
            return None
        storage = self.config.storage
        wal = WalLog.open(directory, segment_bytes_max=storage.wal_segment_bytes_max,
                          segment_age_ms_max=storage.wal_segment_age_ms_max, clock=self.system.clock)
        try:
            return wal.next_offset
        finally:
            wal.close()

    async def _start_offset(self, name: TopicName) -> int | None:
        """Where a reliable topic loaded here must start (`ownership.reliable_start`
        decides from the store's record, the local WAL's end and the durable segments').
        A local WAL of an earlier turn here that ends below is stale: it is dropped."""
        value = self.metadata.local_get(cr.topic_state_key(name.full))
        state = cr.decode(value.value, cr.TopicState) if value is not None else None
        try:
            local_end = await asyncio.to_thread(self._wal_end, name)
        except WalDamaged as damage:
            if not damaged_wal_is_stale(me=self.broker_id, state=state, claimed_end=damage.claimed_end):
                raise
            log.warning("topic %s: a stale local WAL from an earlier turn is damaged (%s): dropping it",
                        name.full, damage)
            await asyncio.to_thread(shutil.rmtree, self._wal_dir(name))
            local_end = None
        durable_end = None
        if self.segment_catalog is not None:
            segments = self.segment_catalog.list(name.full)
            if segments:
                durable_end = segments[-1].end_offset + 1
        storage = self.config.storage
        start = reliable_start(me=self.broker_id, state=state, local_end=local_end, durable_end=durable_end,
                               wal_exact=storage.wal_sync == "always",
                               cursors_in_segments=storage.mode != "local" and storage.cursors_in_segments)
        if start.damage is not None:
            assert state is not None and local_end is not None
            wal_dir = self._wal_dir(name)
            log.error("topic %s: WAL %s: %s; the topic is not served", name.full, wal_dir, start.damage)
            raise WalDamaged(wal_dir, 0, start.damage, valid_end=local_end, claimed_end=start.claimed_end,
                             acknowledged_offset=state.next_offset, quarantined=None)
        if start.drop_local_wal:
            log.warning("topic %s: the local WAL ends at %s, the topic at %d (served elsewhere since): dropping it",
                        name.full, local_end, start.start_offset)
            await asyncio.to_thread(shutil.rmtree, self._wal_dir(name))
        if start.continue_after_gap:
            log.warning("topic %s: the local WAL ends at %s, below offsets this broker may have given out"
                        " (wal_sync interval): it continues at %d, the offsets between given up",
                        name.full, local_end, start.start_offset)
            await asyncio.to_thread(WalLog.repair, self._wal_dir(name), resume_offset=start.start_offset,
                                    clock=self.system.clock)
        return start.start_offset

    async def _mark_damaged(self, topic: str, damage: WalDamaged) -> None:
        log.error("%s", _damage_text(topic, damage))
        # Recorded in the store so no broker moves the topic elsewhere, where it would be
        # served from an empty log (actors/load/assign.py), and any broker refuses its unload.
        # Recorded before this broker shows the damage (`topics describe`, UNAVAILABLE): an
        # operator who sees it and then drains this broker must find the record there.
        record = cr.WalDamageRecord(broker_id=self.broker_id, reason=str(damage), valid_end=damage.valid_end,
                                    since_ms=self.system.clock.now_ms())
        try:
            await self.metadata.put(cr.damaged_key(topic), cr.encode(record))
        except DanubeError as exc:
            # Not left to the topic's next load: an assigned damaged topic is not loaded
            # again, and until the record is there a drain or rebalance would move it.
            log.error("topic %s: its damage not recorded in the metadata store (%s); the cursor flusher writes it"
                      " again every %d ms", topic, exc, self.config.storage.cursor_flush_interval_ms)
            self.system.post(self.flusher_endpoint, RecordDamage(topic=topic, record=cr.encode(record)))
        if topic not in self.damaged:
            METRICS.wal_damage.inc()
        self.damaged[topic] = damage
        METRICS.wal_damaged_topics.set(len(self.damaged))

    async def _clear_damage_record(self, topic: str) -> None:
        """A topic served again (repaired, or recovered): its damage record goes."""
        if self.metadata.local_get(cr.damaged_key(topic)) is None:
            return
        try:
            await self.metadata.delete(cr.damaged_key(topic))
        except DanubeError as exc:  # it only holds the topic here: cleared at a next load
            log.error("topic %s: its damage record not cleared (%s)", topic, exc)

    def _forget_damage(self, topic: str) -> None:
        if self.damaged.pop(topic, None) is not None:
            self.system.post(self.flusher_endpoint, ForgetDamage(topic=topic))  # a record not written yet
            METRICS.wal_damaged_topics.set(len(self.damaged))

    async def _recover_from_durable(self, name: TopicName, damage: WalDamaged) -> bool:
        """Durable modes: when the durable segments hold every offset the damaged local
        WAL held, set the WAL aside (whole, under `quarantine/`) and let the topic start
        again from the durable store, past its reservation. False: they do not."""
        if self.segment_catalog is None:
            return False
        wal_dir = self._wal_dir(name)
        # From the WAL's first offset: an upload that failed leaves a hole the last durable
        # segment's end would hide.
        bases = [parse_segment_file_name(path.name) for path in wal_dir.glob("*.wal")]
        wal_start = min((base for base in bases if base is not None), default=damage.valid_end)
        if not self.segment_catalog.covers_range(name.full, wal_start, damage.claimed_end):
            return False
        aside = self.data_dir / "quarantine" / name.namespace / f"{name.topic}.{self.system.clock.now_ms()}"
        aside.parent.mkdir(parents=True, exist_ok=True)
        await asyncio.to_thread(wal_dir.rename, aside)
        METRICS.wal_damage.inc()
        log.error("topic %s: its WAL is damaged (%s) but the durable store holds every offset it held (%d..%d):"
                  " the WAL is set aside in %s and the topic recovers from the durable segments", name.full, damage,
                  wal_start, damage.claimed_end - 1, aside)
        return True

    async def _delete_local(self, topic: str) -> None:
        """A deleted topic's files here: WAL and durable cache. (Its metadata went with
        the deletion; its durable segments are deleted by the broker that deleted it.)"""
        self.system.post(self.flusher_endpoint, ForgetTopicRecords(topic=topic))
        name = parse_topic(topic)
        await asyncio.to_thread(shutil.rmtree, self._wal_dir(name), True)
        await asyncio.to_thread(shutil.rmtree, resolve_inside(self.data_dir, "durable-cache", name.namespace,
                                                              name.topic), True)

    # ------------------------------------------------------------- requests waiting for an assignment
    def _park(self, topic: str, req: ClientRequest) -> None:
        if self.parked_count >= _PARKED_MAX:
            raise ResourceExhausted(f"{_PARKED_MAX} requests already wait for topics to be assigned; retry")
        deadline = self._replay_deadline
        if deadline is None:
            deadline = self.system.clock.monotonic_ms() + self.config.cluster.request_timeout_ms
        self.parked.setdefault(topic, []).append((req, deadline))
        self.parked_count += 1

    async def _wake(self, topic: str) -> None:
        for future in self.owner_waits.pop(topic, []):
            if not future.done():
                future.set_result(None)
        waiting = self.parked.pop(topic, None)
        if not waiting:
            return
        self.parked_count -= len(waiting)
        for req, deadline in waiting:
            self._replay_deadline = deadline
            try:
                if not await self.system.handle_in_place(self.endpoint, req):
                    return  # this instance failed and was replaced: its parked requests went with it
            finally:
                self._replay_deadline = None

    async def handle_ParkedExpired(self, msg: ParkedExpired) -> None:
        # A request parked because its topic's owner missed a renewal (`_elsewhere`)
        # waits for that owner to renew; no event says so, so each check looks.
        for topic in [t for t in self.parked if self._elsewhere(t) is not None]:
            await self._wake(topic)
        self._refuse_parked(self.system.clock.monotonic_ms())

    def _refuse_parked(self, now: float) -> None:
        """Answer UNAVAILABLE to every parked request whose deadline is at or before `now`."""
        if not self.parked:
            return
        for topic in list(self.parked):
            keep = []
            for req, deadline in self.parked[topic]:
                if deadline > now:
                    keep.append((req, deadline))
                    continue
                request = cp.CLIENT_PROTOCOL.decode(req.frame)
                reason = "this broker does not hold its lease" if not self.lease_held \
                    else "it has no broker yet"
                reply_client(self.system, req.identity, Error(
                    request_id=request.request_id, code=Unavailable.code,  # type: ignore[attr-defined]
                    message=f"topic {topic} is not served: {reason}; retry"))
            self.parked_count -= len(self.parked[topic]) - len(keep)
            if keep:
                self.parked[topic] = keep
            else:
                del self.parked[topic]

    # ------------------------------------------------------------- reading the registry
    def _record(self, full: str) -> cr.TopicRecord | None:
        value = self.metadata.local_get(cr.topic_record_key(full))
        return None if value is None else cr.decode(value.value, cr.TopicRecord)

    def _resolve_local(self, name: TopicName) -> Resolved | None:
        record = self._record(name.full)
        if record is not None:
            return Resolved(name=name, base=name, record=record)
        if name.partition_index is not None:
            base = self._record(name.base.full)
            if base is not None and name.partition_index < base.partitions:
                return Resolved(name=name, base=name.base, record=base)
        return None

    async def _resolve(self, name: TopicName) -> Resolved | None:
        """From the local state; a name it does not know is read again linearizably (it
        may have been created on another broker a moment ago)."""
        resolved = self._resolve_local(name)
        if resolved is None:
            await self.metadata.get(cr.topic_record_key(name.full))
            resolved = self._resolve_local(name)
        return resolved

    async def _existing(self, name: TopicName) -> Resolved:
        resolved = await self._resolve(name)
        if resolved is None:
            raise NotFound(f"topic {name.full} does not exist")
        return resolved

    async def _namespace_exists(self, namespace: str) -> bool:
        key = cr.namespace_key(namespace)
        if self.metadata.local_get(key) is not None:
            return True
        if await self.metadata.get(key) is not None:
            return True
        if not self.joined and namespace in self.config.bootstrap_namespaces:
            # Not written yet (this broker has not joined; in a cluster no broker may
            # have): "does not exist" would be false a moment later, so retriable.
            raise Unavailable(f"broker {self.broker_id} has not written its bootstrap namespaces yet; retry")
        return False

    def _assignment(self, topic: str) -> cr.Assignment | None:
        value = self.metadata.local_get(cr.assignment_key(topic))
        return None if value is None else cr.decode(value.value, cr.Assignment)

    def _registration(self, broker_id: int) -> cr.BrokerRegistration | None:
        value = self.metadata.local_get(cr.register_key(broker_id))
        return None if value is None else cr.decode(value.value, cr.BrokerRegistration)

    def _elsewhere(self, topic: str) -> cr.BrokerRegistration | None:
        """The registration of the other live broker serving `topic`, if there is one. A
        broker that missed its last lease renewal does not count: it may be dead, and a
        client sent there would wait out a connection timeout; the request waits here
        instead until the topic is reassigned or the broker renews."""
        assignment = self._assignment(topic)
        if assignment is None or assignment.broker_id == self.broker_id:
            return None
        key = cr.register_key(assignment.broker_id)
        value = self.metadata.local_get(key)
        if value is None or self.metadata.stopped_renewing(key):
            return None
        return cr.decode(value.value, cr.BrokerRegistration)

    # ------------------------------------------------------------- reliable storage
    def _on_uploaded(self, desc: SegmentDescriptor) -> None:
        entry = self.topics.get(desc.topic)
        if entry is not None:
            self.system.post(entry.endpoint, SegmentDurable(segment=_durable_segment(desc)))

    def handle_SegmentSealed(self, msg: SegmentSealed) -> None:
        if self.uploader is None or self.segment_catalog is None:
            return
        known = self.segment_catalog.get(msg.topic, msg.base_offset)
        if known is not None and known.end_offset >= msg.end_offset:
            self._on_uploaded(known)
            return
        try:
            self.uploader.submit(SealedSegment(topic=msg.topic, base_offset=msg.base_offset, end_offset=msg.end_offset,
                                               record_count=msg.record_count, local_path=Path(msg.path)))
        except DanubeError as exc:
            log.warning("segment %s@%d not queued for upload (%s); the topic reports it again", msg.topic,
                        msg.base_offset, exc)

    def handle_TopicStopped(self, msg: TopicStopped) -> None:
        if msg.topic in self.topics:  # a shutdown (an unloaded topic was sealed by `_seal`)
            self.stopped_offsets[msg.topic] = msg.next_offset

    async def _end_reservations(self) -> None:
        """At a clean shutdown: each reliable topic's reservation ends where its log ends,
        so that whichever broker serves it next continues without a gap (even if this
        disk is then lost: the durable store has everything, the uploads are done)."""
        expect: dict[str, int] = {}
        puts: dict[str, bytes] = {}
        now_ms = self.system.clock.now_ms()
        for topic, next_offset in self.stopped_offsets.items():
            key = cr.topic_state_key(topic)
            current = self.metadata.local_get(key)
            if current is None or cr.decode(current.value, cr.TopicState).broker_id != self.broker_id:
                continue
            expect[key] = current.version
            puts[key] = cr.encode(cr.TopicState(next_offset=next_offset, broker_id=self.broker_id, sealed_ms=now_ms,
                                                reserved_until=next_offset))
        self.stopped_offsets.clear()
        if not puts:
            return
        async with asyncio.timeout(_RESERVE_RETRY_S):
            ended = await self.metadata.transaction(expect, puts)
        if not ended:
            log.warning("offset reservations changed meanwhile; not ended at shutdown")

    def handle_ReserveOffsets(self, msg: ReserveOffsets) -> None:
        """Written by the `OffsetReservations` child; only for a topic served here."""
        entry = self.topics.get(msg.topic)
        if entry is None or self.reservations_endpoint is None:
            return  # unloaded meanwhile: its seal ended the reservation
        self.system.post(self.reservations_endpoint, ReserveOffsetsFor(
            topic=msg.topic, until=msg.until, endpoint=entry.endpoint,
            lease_until_ms=self.lease_until_ms if self.lease_held else 0))

    async def handle_ForgetSegments(self, msg: ForgetSegments) -> None:
        if self.segment_catalog is not None:
            for base_offset in msg.base_offsets:
                await self.segment_catalog.remove(msg.topic, base_offset)

    def handle_ProducerRegistry(self, msg: ProducerRegistry) -> None:
        if msg.topic not in self.topics:
            return  # unloaded: the topic's next broker clears its records
        self.system.post(self.flusher_endpoint, msg)

    async def _flush_cursors(self) -> None:
        """Have the cursor flusher write every cursor and producer record told it so far
        (what the topics told it before this ask is ahead of it in its mailbox)."""
        await self.system.ask(self.flusher_endpoint, FlushCursors(),
                              timeout_ms=2 * self.config.cluster.request_timeout_ms)

    async def _subscriptions_of(self, name: TopicName) -> list[SubscriptionState]:
        """The topic's persisted subscriptions, newest cursors (not written yet) included."""
        answer = await self.system.ask(self.flusher_endpoint, SubscriptionsOf(topic=name.full))
        assert isinstance(answer, PersistedSubscriptions)
        return answer.states

    async def handle_DeadLetter(self, msg: DeadLetter) -> None:
        try:
            name = parse_topic(msg.topic)
            resolved = await self._resolve(name)
            if resolved is None:
                await self._create_or_existing(name, 0, cp.DispatchStrategy.RELIABLE)
                resolved = await self._existing(name)
            topic = resolved.served_names()[0]
            if topic not in self.topics:
                owner = self._elsewhere(topic)
                if owner is not None:
                    raise Unavailable(f"dead-letter topic {topic} is served by broker {owner.broker_id}")
                if self.dead_letters_count >= _DEAD_LETTER_BATCHES_MAX:
                    raise ResourceExhausted(f"{_DEAD_LETTER_BATCHES_MAX} dead-letter batches already wait for their"
                                            " topics to be loaded")
                # Just created: it is appended once its assignment loads it here.
                self.dead_letters.setdefault(topic, []).append(msg)
                self.dead_letters_count += 1
                return
        except DanubeError as exc:
            log.error("dead letters for %s lost: %s", msg.topic, exc)
            return
        await self._append_dead_letters(self.topics[topic], [msg])

    async def _append_dead_letters(self, entry: TopicEntry, batches: list[DeadLetter]) -> None:
        for msg in batches:
            await self.system.send(entry.endpoint, AppendInternal(
                producer_name="dead-letter", payloads=msg.payloads, publish_times=msg.publish_times, keys=msg.keys,
                attributes=msg.attributes))

    def handle_ListSnapshotTopics(self, msg: ListSnapshotTopics) -> Message:
        """The reliable topics (partitions) served here, by name or base-topic glob."""
        refs = []
        for name, entry in sorted(self.topics.items()):
            if entry.dispatch_strategy != cp.DispatchStrategy.RELIABLE:
                continue
            base = entry.name.base.full
            if msg.pattern is not None and not (fnmatch.fnmatchcase(name, msg.pattern)
                                                or fnmatch.fnmatchcase(base, msg.pattern)):
                continue
            refs.append(SnapshotTopicRef(topic=name, endpoint=entry.endpoint, base_topic=base,
                                         partition=entry.name.partition_index))
        return SnapshotTopics(topics=refs)

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
            raise Unavailable(_damage_text(topic, damage))
        holder = self._held_by_dead_broker(topic)
        if holder is not None:
            raise Unavailable(self._held_by_dead_broker_text(topic, holder))
        owner = self._elsewhere(topic)
        if owner is not None:
            raise Moved(f"topic {topic} is served by broker {owner.broker_id}", owner.broker_url)
        if self.lease_until_ms and not self._lease_valid():
            # Held once and lost: the store is likely out of reach and another broker may
            # take the topic; a parked request would wait out request_timeout_ms again at
            # every retry, while the client's own retry may find that broker.
            raise Unavailable(f"topic {topic} is not served: broker {self.broker_id} lost its lease; retry")
        self._park(topic, req)
        return None

    async def handle_Lookup(self, msg: cp.Lookup, origin: Origin) -> Message | None:
        req = origin.envelope
        resolved = await self._existing(parse_topic(msg.topic))
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
        resolved = await self._resolve(name)
        if resolved is None:
            if not msg.create:
                raise NotFound(f"topic {name.full} does not exist")
            if not self.config.auto_create_topics:
                raise NotFound(f"topic {name.full} does not exist and auto_create_topics is off")
            if msg.for_subscription:
                resolved = await self._create_for_subscriber(name)
            else:
                resolved = await self._create_or_existing(name, msg.partitions, msg.dispatch_strategy)
        elif msg.create and not msg.for_subscription:
            resolved = await self._shaped(resolved, msg.partitions, msg.dispatch_strategy)
        return cp.Partitions(request_id=msg.request_id, topic=name.full, partitions=resolved.served_names())

    async def _create_for_subscriber(self, name: TopicName) -> Resolved:
        """A subscriber's missing topic, created as its namespace's auto topic creation
        policy says (Pulsar's allowAutoTopicCreation); whatever shape it has when another
        client created it meanwhile."""
        if not await self._namespace_exists(name.namespace):
            raise NotFound(f"namespace '{name.namespace}' does not exist")
        policy = self.auto_topic_creation_of(name.namespace)
        if not policy.allow_auto_topic_creation:
            raise NotFound(f"topic {name.full} does not exist and {policy.refusal(name.namespace)}")
        partitioned = policy.allow_auto_topic_creation_type == "partitioned" and name.partition_index is None
        partitions = policy.default_num_partitions if partitioned else 0
        dispatch = cp.DispatchStrategy[policy.auto_topic_creation_dispatch.upper()]
        adoptable = True
        if name.full == self.config.reliable.dead_letter_topic:
            # The broker's own dead-letter topic, subscribed before its first letter: made
            # as that letter would make it (a subscription's is made when its policy is set).
            partitions, dispatch, adoptable = 0, cp.DispatchStrategy.RELIABLE, False
        try:
            await self._write_topic(name, partitions, dispatch, adoptable=adoptable)
        except AlreadyExists:
            pass
        return await self._existing(name)

    async def _shaped(self, resolved: Resolved, partitions: int, dispatch_strategy: int) -> Resolved:
        """`resolved` as a producer with this shape may attach to it: a topic a subscriber
        made takes the first producer's dispatch strategy (the policy's was a guess, and a
        producer that meets the other one would be refused); FAILED_PRECONDITION when the
        shape is another."""
        if dispatch_strategy not in (cp.DispatchStrategy.NON_RELIABLE, cp.DispatchStrategy.RELIABLE):
            raise InvalidArgument(f"unknown dispatch strategy {dispatch_strategy}")
        if resolved.record.adoptable:
            key = cr.topic_record_key(resolved.base.full)
            current = await self.metadata.get(key)  # linearizable: another producer may have come first
            record = None if current is None else cr.decode(current.value, cr.TopicRecord)
            if record is not None and record.adoptable:
                adopted = dataclasses.replace(record, dispatch_strategy=dispatch_strategy, adoptable=False)
                if await self.metadata.transaction({key: current.version}, {key: cr.encode(adopted)}):
                    log.info("topic %s takes its first producer's dispatch strategy (%s)", resolved.base.full,
                             cp.DispatchStrategy(dispatch_strategy).name.lower())
            resolved = await self._existing(resolved.name)
        _check_shape(resolved, partitions, dispatch_strategy)
        return resolved

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
            await self._delete_local(topic)
        await self._load(topic)
        restarted = self.topics.get(topic)
        if restarted is not None and subscriptions:
            # Before its consumers attach again (this actor handles their Subscribe next).
            await self.system.ask(restarted.endpoint, OpenSubscriptions(
                names=[s.name for s in subscriptions], sub_types=[s.sub_type for s in subscriptions]))

    async def handle_CreateProducer(self, msg: cp.CreateProducer, origin: Origin) -> Message | None:
        name = parse_topic(msg.topic)
        resolved = await self._resolve(name)
        if resolved is None:
            if not self.config.auto_create_topics:
                raise NotFound(f"topic {name.full} does not exist and auto_create_topics is off")
            resolved = await self._create_or_existing(name, 0, msg.dispatch_strategy)
        if resolved.partitioned_base:
            raise FailedPrecondition(f"topic {name.full} has {resolved.record.partitions} partitions:"
                                     f" attach producers to its partitions {name.partition_name(0)} ...")
        resolved = await self._shaped(resolved, 0, msg.dispatch_strategy)
        await self._serve_as_recorded(name.full, resolved)
        return self._forward(name.full, origin.envelope)

    async def handle_Subscribe(self, msg: cp.Subscribe, origin: Origin) -> Message | None:
        resolved = await self._existing(parse_topic(msg.topic))
        if resolved.partitioned_base:
            raise FailedPrecondition(f"topic {resolved.name.full} has {resolved.record.partitions} partitions:"
                                     f" subscribe to each of its partitions")
        return self._forward(resolved.name.full, origin.envelope)

    def _forward(self, topic: str, req: ClientRequest) -> Message | None:
        entry = self._serve(topic, req)
        if entry is not None and not self.system.tell(entry.endpoint, req):
            raise ResourceExhausted(f"topic {topic} is busy (full mailbox); retry")
        return None

    async def _create_or_existing(self, name: TopicName, partitions: int, dispatch_strategy: int) -> Resolved:
        """Create the topic; when another broker created it first, the one it created."""
        try:
            await self._write_topic(name, partitions, dispatch_strategy)
        except AlreadyExists:
            pass
        return await self._shaped(await self._existing(name), partitions, dispatch_strategy)

    async def _write_topic(self, name: TopicName, partitions: int, dispatch_strategy: int, *,
                           adoptable: bool = False) -> None:
        """The topic's record and an unassigned marker per partition. A topic with more
        partitions than one metadata batch holds is written in several: the record with
        the first markers, then the rest guarded by the record's version and by each
        partition having no assignment yet (a partition left without a marker, by a
        crash in between, is placed by the load manager all the same)."""
        if not await self._namespace_exists(name.namespace):
            raise NotFound(f"namespace '{name.namespace}' does not exist")
        limits = self.namespace_limits_of(name.namespace)
        if partitions < 0 or partitions > limits.partitions_max:
            raise InvalidArgument(f"partitions must be 0..{limits.partitions_max}"
                                  f" ({limits.partitions_text(name.namespace)}), got {partitions}")
        if dispatch_strategy not in (cp.DispatchStrategy.NON_RELIABLE, cp.DispatchStrategy.RELIABLE):
            raise InvalidArgument(f"unknown dispatch strategy {dispatch_strategy}")
        if name.partition_index is not None and await self._resolve(name.base) is not None:
            raise AlreadyExists(f"{name.full} is a partition of {name.base.full}; it exists only with it")
        names = [name.partition_name(i) for i in range(partitions)] if partitions else [name.full]
        for other in names:
            if other != name.full and self._record(other) is not None:
                raise AlreadyExists(f"topic {other} already exists")
        self._check_namespace_room(name.namespace, len(names), limits)
        now = self.system.clock.now_ms()
        record = cr.encode(cr.TopicRecord(dispatch_strategy=dispatch_strategy, partitions=partitions, created_ms=now,
                                           adoptable=adoptable))
        marker = cr.encode(cr.Unassigned(reason=cr.UnassignedReason.NEW, since_ms=now))
        key = cr.topic_record_key(name.full)
        per_batch = self._keys_per_batch()
        first, rest = names[:per_batch - 1], names[per_batch - 1:]
        if not await self.metadata.transaction({key: 0}, {key: record} | {cr.unassigned_key(n): marker for n in first}):
            raise AlreadyExists(f"topic {name.full} already exists")
        for start in range(0, len(rest), per_batch):
            chunk = rest[start:start + per_batch]
            written = self.metadata.local_get(key)
            if written is None or not await self.metadata.transaction(
                    {key: written.version} | {cr.assignment_key(n): 0 for n in chunk},
                    {cr.unassigned_key(n): marker for n in chunk}):
                log.info("topic %s changed while its partitions were marked; the load manager places the rest",
                         name.full)
                break
        log.info("topic %s created (%d partitions, %s)", name.full, partitions,
                 cp.DispatchStrategy(dispatch_strategy).name.lower())

    def _keys_per_batch(self) -> int:
        """Keys one metadata transaction may touch, with room to spare."""
        return max(2, min(_TOPIC_KEYS_PER_BATCH, self.metadata.batch_keys_max))

    def _check_namespace_room(self, namespace: str, adding: int, limits: NamespaceLimits) -> None:
        """RESOURCE_EXHAUSTED when `adding` more topics (partitions count one each) would
        pass the namespace's topics limit. The scan is bounded by the limit itself."""
        held = 0
        for key, value in self.metadata.local_scan(f"{cr.TOPICS}{namespace}/"):
            if key.count("/") == 3:  # a topic record, not a subscription's or producer's key
                try:
                    held += max(1, cr.decode(value.value, cr.TopicRecord).partitions)
                except DanubeError as exc:  # skipped, it would let the namespace pass its limit
                    raise InternalError(f"metadata record {key} cannot be read ({exc}): the topics of namespace"
                                        f" '{namespace}' cannot be counted, so none is created there until it is"
                                        f" fixed (danube admin metadata get/delete {key})") from None
        if held + adding > limits.topics_max:
            raise ResourceExhausted(f"namespace '{namespace}' holds {held} topics (partitions count one each);"
                                    f" {adding} more would pass {limits.topics_text(namespace)}")

    def _wal_dir(self, name: TopicName) -> Path:
        # Deleted recursively with the topic: checked to stay inside the data dir.
        return resolve_inside(self.data_dir, "wal", name.namespace, name.topic)

    async def _spawn_topic(self, name: TopicName, dispatch_strategy: int, start_offset: int | None) -> TopicEntry:
        config, rng, executor, broker, flusher = self.config, self.rng, self.executor, self.endpoint, self.flusher_endpoint
        seed = rng.getrandbits(64)
        if dispatch_strategy == cp.DispatchStrategy.RELIABLE:
            wal_dir = self._wal_dir(name)
            cache_dir = resolve_inside(self.data_dir, "durable-cache", name.namespace, name.topic)
            segments = self.segment_catalog

            def factory() -> Actor:
                # Evaluated at each (re)start: a topic restarted after a failure gets the
                # subscriptions, cursors and durable segments as they are now, not as they
                # were when it was first spawned. The parent builds its child's arguments.
                return make_topic(
                    name=name.full, dispatch_strategy=dispatch_strategy, config=config, rng=IdSource(seed),
                    wal_dir=wal_dir, executor=executor, cursor_endpoint=flusher, broker_endpoint=broker,
                    durable=[_durable_segment(d) for d in segments.list(name.full)] if segments else [],
                    cache_dir=cache_dir, start_offset=start_offset, backlog_quota=self.backlog_quota_of(name)[:2],
                    policies=self.topic_policies_of(name)[0])
        else:
            factory = lambda: make_topic(  # noqa: E731
                name=name.full, dispatch_strategy=dispatch_strategy, config=config, rng=IdSource(seed),
                broker_endpoint=broker, start_offset=start_offset, policies=self.topic_policies_of(name)[0])
        endpoint = await self.system.spawn(factory, name=f"topic {name.full}", parent=self.endpoint)
        return TopicEntry(name=name, dispatch_strategy=dispatch_strategy, endpoint=endpoint)

    async def _delete_durable(self, topic: str) -> None:
        """A deleted topic's durable segments go too: objects first, then descriptors."""
        if self.segment_catalog is None:
            return
        for desc in self.segment_catalog.list(topic):
            if self.durable_store is not None:
                await asyncio.to_thread(self.durable_store.delete, desc.object_key)
            await self.segment_catalog.remove(topic, desc.base_offset)
        if self.durable_store is not None:  # checkpoints-only segments: no descriptor, listed
            store = self.durable_store
            for base in await asyncio.to_thread(store.cursor_bases, topic):
                await asyncio.to_thread(store.delete, cursors_key(topic, base))

    def handle_ChildStopped(self, msg: ChildStopped) -> None:
        for full, entry in list(self.topics.items()):
            if entry.endpoint == msg.endpoint:
                log.error("topic %s stopped after repeated failures (%s); it is no longer served", full, msg.reason)
                del self.topics[full]

async def assigned_to(metadata: RaftMetadataStore, broker_id: int) -> list[str]:
    """The topics assigned to `broker_id`, as of the applied state when called (the
    listing is a copy); with 100,000 assignments to decode it yields to the event loop
    as it goes."""
    mine = []
    for n, (key, value) in enumerate(metadata.local_scan(cr.ASSIGNMENTS)):
        if n % _KEYS_PER_SLICE == 0:
            await asyncio.sleep(0)
        if _owner(key, value.value) == broker_id:
            mine.append(cr.topic_of(key, cr.ASSIGNMENTS))
    return mine


def _assignment_changed(event: WatchEvent) -> Message:
    owner = None if event.value is None else _owner(event.key, event.value.value)
    return AssignmentChanged(topic=cr.topic_of(event.key, cr.ASSIGNMENTS), broker_id=owner, revision=event.revision)


async def _quotas_changed() -> Message:
    return BacklogQuotasChanged()


def _quotas_event(event: WatchEvent) -> Message:
    return BacklogQuotasChanged()


async def _policies_changed() -> Message:
    return TopicPoliciesChanged()


def _policies_event(event: WatchEvent) -> Message:
    return TopicPoliciesChanged()


def _owner(key: str, value: bytes) -> int | None:
    try:
        return cr.decode(value, cr.Assignment).broker_id
    except DanubeError as exc:
        log.error("metadata key %s holds no assignment (%s); ignored", key, exc)
        return None


def _durable_segment(desc: SegmentDescriptor) -> DurableSegment:
    return DurableSegment(base_offset=desc.base_offset, end_offset=desc.end_offset, object_key=desc.object_key,
                          size_bytes=desc.size_bytes, crc32c=desc.crc32c, created_ms=desc.created_ms)


def _check_shape(resolved: Resolved, partitions: int, dispatch_strategy: int) -> None:
    record = resolved.record
    if record.dispatch_strategy != dispatch_strategy:
        have = cp.DispatchStrategy(record.dispatch_strategy).name.lower()
        want = cp.DispatchStrategy(dispatch_strategy).name.lower() if dispatch_strategy in (0, 1) \
            else str(dispatch_strategy)
        raise FailedPrecondition(f"topic {resolved.name.full} is {have}; a {want} producer cannot attach")
    if partitions and (not resolved.partitioned_base or record.partitions != partitions):
        have_partitions = record.partitions if resolved.partitioned_base else 0
        raise FailedPrecondition(f"topic {resolved.name.full} has {have_partitions} partitions,"
                                 f" the producer asked for {partitions}")

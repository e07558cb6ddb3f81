"""The cursor flusher (`actors/broker/cursor_flusher.py`) in a real actor system over a real
single-voter metadata store, with real reliable topic actors: a topic started again
before a flush resumes from the unwritten cursor, a stop writes what the topics told
on their way out, and what the store refused is written at the next timer."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import zmq.asyncio

from danube_zmq.actors.broker.cursor_flusher import CursorFlusher, subscription_key
from danube_zmq.actors.ids import IdSource
from danube_zmq.actors.topic import make_topic
from danube_zmq.clock import SystemClock
from danube_zmq.config.broker_config import BrokerConfig, StorageSection
from danube_zmq.consensus.metadata_store import RaftMetadataStore, embedded_store
from danube_zmq.runtime.actor import Actor
from danube_zmq.runtime.system import ActorSystem
from danube_zmq.transport import client_protocol as cp
from danube_zmq.transport import cluster_records as cr
from danube_zmq.transport.errors import Unavailable
from danube_zmq.transport.internal_protocol import (
    DescribePartition,
    FlushCursors,
    OffsetsReserved,
    PartitionStats,
    PersistCursor,
    ReserveOffsets,
)
from tests.waiting import until

TOPIC = "/default/flushed"
SUB_TYPE = int(cp.SubType.SHARED)
NEVER_MS = 60_000  # the longest flush interval: no timer flush during a test


class StandInBroker(Actor):
    """The broker actor's part towards its topics: offsets reserved at once."""

    def __init__(self) -> None:
        self.topics: list[str] = []

    def handle_ReserveOffsets(self, msg: ReserveOffsets) -> None:
        for topic in self.topics:
            self.system.tell(topic, OffsetsReserved(until=msg.until))


class FinalWords(Actor):
    """Stands where a topic is: tells its subscription's last cursor on its way out,
    as a reliable subscription's stop does."""

    def __init__(self, flusher: str, subscription: str, cursor: int) -> None:
        self.flusher = flusher
        self.subscription = subscription
        self.cursor = cursor

    async def on_stop(self) -> None:
        self.system.tell(self.flusher, _cursor(self.cursor, self.subscription))


class FlakyStore(RaftMetadataStore):
    """The real store, refusing transactions while `refusing` is set."""

    refusing = False
    transactions = 0

    async def transaction(self, expect, puts, deletes=None):  # type: ignore[no-untyped-def]
        FlakyStore.transactions += 1
        if FlakyStore.refusing:
            raise Unavailable("no majority (planted)")
        return await super().transaction(expect, puts, deletes)


def _cursor(cursor: int, subscription: str = "s") -> PersistCursor:
    return PersistCursor(topic=TOPIC, subscription=subscription, sub_type=SUB_TYPE, cursor=cursor, acked_above=[])


def _stored_cursor(store: RaftMetadataStore, subscription: str = "s") -> int | None:
    value = store.local_get(subscription_key(TOPIC, subscription))
    return None if value is None else cr.decode_cursor(value.value).cursor



def _run(tmp_path: Path, body, *, interval_ms: int = NEVER_MS) -> None:  # type: ignore[no-untyped-def]
    async def run() -> None:
        async with embedded_store(tmp_path / "raft") as plain:
            store = FlakyStore(plain.peer)
            FlakyStore.refusing, FlakyStore.transactions = False, 0
            ctx = zmq.asyncio.Context()
            system = ActorSystem(ctx, clock=SystemClock(), mailbox_messages_max=1_000)
            executor = ThreadPoolExecutor(1)
            try:
                await body(system, store, executor)
            finally:
                await system.shutdown()
                executor.shutdown()
                ctx.term()

    asyncio.run(run())


async def _spawn_topic(system: ActorSystem, broker: str, flusher: str, executor: ThreadPoolExecutor,
                       wal_dir: Path, config: BrokerConfig | None = None) -> str:
    config = config or BrokerConfig()
    topic = await system.spawn(
        lambda: make_topic(name=TOPIC, dispatch_strategy=cp.DispatchStrategy.RELIABLE, config=config,
                           rng=IdSource(1), broker_endpoint=broker, cursor_endpoint=flusher, wal_dir=wal_dir,
                           executor=executor),
        name=f"topic {TOPIC}", parent=broker)
    stand_in = system.actor(broker)
    assert isinstance(stand_in, StandInBroker)
    stand_in.topics.append(topic)
    return topic


async def _subscription_cursor(system: ActorSystem, topic: str) -> int | None:
    stats = await system.ask(topic, DescribePartition())
    assert isinstance(stats, PartitionStats)
    (subscription,) = stats.info.subscriptions
    assert subscription.name == "s"
    return subscription.cursor


def test_a_topic_started_again_before_a_flush_resumes_from_the_unwritten_cursor(tmp_path: Path) -> None:
    """The store holds a stale cursor (5) and the flusher a newer one it has not written
    (41: its timer is a minute away). A reliable topic spawned now (loaded again after an
    unload, as after a restart of its actor) resumes its subscription at 41, not at the
    store's 5; stopped and started again after a newer unwritten cursor (77), at 77.
    In shared_fs mode, where cursors still go through the flusher (in local mode they are
    checkpoints in the topic's WAL: tests/unit/storage/wal/test_wal_checkpoints.py)."""

    async def body(system: ActorSystem, store: FlakyStore, executor: ThreadPoolExecutor) -> None:
        await store.put(subscription_key(TOPIC, "s"), cr.encode(cr.CursorRecord(
            sub_type=SUB_TYPE, cursor=5, acked_above=[])))
        broker = await system.spawn(StandInBroker, name="broker")
        flusher = await system.spawn(lambda: CursorFlusher(metadata=store, broker_id=1, interval_ms=NEVER_MS),
                                     name="cursor flusher", parent=broker)
        system.tell(flusher, _cursor(41))
        config = BrokerConfig(storage=StorageSection(mode="shared_fs", durable_url=str(tmp_path / "durable")))
        topic = await _spawn_topic(system, broker, flusher, executor, tmp_path / "wal", config)
        assert await _subscription_cursor(system, topic) == 41
        assert _stored_cursor(store) == 5, "nothing was flushed: the cursor came from the flusher"

        await system.stop(topic)  # its subscription tells 41 again on its way out
        system.tell(flusher, _cursor(77))
        topic = await _spawn_topic(system, broker, flusher, executor, tmp_path / "wal", config)
        assert await _subscription_cursor(system, topic) == 77
        assert _stored_cursor(store) == 5 and FlakyStore.transactions == 0

    _run(tmp_path, body)


def test_a_stop_writes_the_cursors_the_topics_told_on_their_way_out(tmp_path: Path) -> None:
    """The flusher is spawned first among the broker's children; three topics spawned
    after it tell their final cursors only in their `on_stop`. Stopping the broker stops
    its children newest first, so the flusher is still there to take those cursors and
    writes them as it stops, with no timer flush in between."""

    async def body(system: ActorSystem, store: FlakyStore, executor: ThreadPoolExecutor) -> None:
        broker = await system.spawn(StandInBroker, name="broker")
        flusher = await system.spawn(lambda: CursorFlusher(metadata=store, broker_id=1, interval_ms=NEVER_MS),
                                     name="cursor flusher", parent=broker)
        for n in range(3):
            await system.spawn(lambda n=n: FinalWords(flusher, f"s{n}", 97 + n), name=f"topic {n}", parent=broker)
        await system.stop(broker)
        assert [_stored_cursor(store, f"s{n}") for n in range(3)] == [97, 98, 99]
        assert FlakyStore.transactions == 1 and not system.is_alive(flusher)

    _run(tmp_path, body)


def test_what_the_store_refused_is_written_at_the_next_timer(tmp_path: Path) -> None:
    """With the store refusing, an explicit flush fails with the store's error and the
    timer's flushes fail too, keeping the cursor (and a newer one told meanwhile wins);
    once the store takes writes again the next timer writes the newest cursor."""

    async def body(system: ActorSystem, store: FlakyStore, executor: ThreadPoolExecutor) -> None:
        flusher = await system.spawn(lambda: CursorFlusher(metadata=store, broker_id=1, interval_ms=20),
                                     name="cursor flusher")
        FlakyStore.refusing = True
        system.tell(flusher, _cursor(10))
        try:
            await system.ask(flusher, FlushCursors())
            raise AssertionError("a refused flush was answered Done")
        except Unavailable:
            pass
        system.tell(flusher, _cursor(12))
        await until(lambda: FlakyStore.transactions >= 3, "the timer tried again")
        assert _stored_cursor(store) is None
        FlakyStore.refusing = False
        await until(lambda: _stored_cursor(store) == 12, "the newest cursor written at a next timer")

    _run(tmp_path, body)


def test_a_flush_of_more_cursors_than_a_batch_holds_writes_them_all(tmp_path: Path) -> None:
    """A broker whose subscriptions moved more cursors in one interval than the store
    takes in one transaction (`batch_keys_max`, 4,096: 5,965 at 100 brokers and 1M
    subscriptions in benchmarks/scale_sim.py) writes them in several: every cursor is
    stored, none refused as a whole."""
    count = 4_096 + 904

    async def body(system: ActorSystem, store: FlakyStore, executor: ThreadPoolExecutor) -> None:
        flusher = await system.spawn(lambda: CursorFlusher(metadata=store, broker_id=1, interval_ms=NEVER_MS),
                                     name="cursor flusher")
        for n in range(count):  # sent, not told: the mailbox holds 1,000
            await system.send(flusher, _cursor(1_000 + n, f"s{n}"), timeout_ms=60_000)
        await system.ask(flusher, FlushCursors(), timeout_ms=60_000)
        assert [_stored_cursor(store, f"s{n}") for n in range(count)] == [1_000 + n for n in range(count)]
        assert FlakyStore.transactions == 2

    _run(tmp_path, body)

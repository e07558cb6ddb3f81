"""A seek in storage.mode local (cursors are checkpoints in the topic's WAL): a real
reliable topic actor and its subscription over a real WAL, with the broker and the
cursor flusher stood in. What the WAL files hold at the moment a seek is answered is
what a broker killed (-9) then would resume from."""

from __future__ import annotations

import asyncio
import shutil
import threading
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import zmq.asyncio

from danube_zmq.actors.ids import IdSource
from danube_zmq.actors.topic import make_topic
from danube_zmq.actors.topic.shell import TopicActor
from danube_zmq.clock import SystemClock
from danube_zmq.config.broker_config import BrokerConfig
from danube_zmq.runtime.actor import Actor
from danube_zmq.runtime.system import ActorSystem
from danube_zmq.storage.wal import WalLog
from danube_zmq.transport import client_protocol as cp
from danube_zmq.transport import cluster_records as cr
from danube_zmq.transport.internal_protocol import (
    AppendInternal,
    ForgetSubscription,
    OffsetsReserved,
    PersistCursor,
    PersistedSubscriptions,
    ReserveOffsets,
    SeekCursor,
    SubscriptionsOf,
    SubscriptionState,
)
from tests.waiting import until

TOPIC = "/default/sought"
SUB_TYPE = int(cp.SubType.SHARED)


class StandInBroker(Actor):
    """The broker's part towards its topic: offsets reserved at once."""

    def __init__(self) -> None:
        self.topic = ""

    def handle_ReserveOffsets(self, msg: ReserveOffsets) -> None:
        self.system.tell(self.topic, OffsetsReserved(until=msg.until))


class StandInFlusher(Actor):
    """The cursor flusher: the store lists subscription `s` at its start (cursor -1)."""

    def handle_SubscriptionsOf(self, msg: SubscriptionsOf) -> PersistedSubscriptions:
        return PersistedSubscriptions(states=[SubscriptionState(name="s", sub_type=SUB_TYPE, cursor=-1,
                                                                acked_above=[])])

    def handle_PersistCursor(self, msg: PersistCursor) -> None:
        pass

    def handle_ForgetSubscription(self, msg: ForgetSubscription) -> None:
        pass


def _run(tmp_path: Path, body: Callable[[ActorSystem, str, Path, ThreadPoolExecutor], Awaitable[None]]) -> None:
    async def run() -> None:
        ctx = zmq.asyncio.Context()
        system = ActorSystem(ctx, clock=SystemClock(), mailbox_messages_max=1_000)
        executor = ThreadPoolExecutor(1)  # the topic's flushes run one after another on it
        try:
            broker = await system.spawn(StandInBroker, name="broker")
            flusher = await system.spawn(StandInFlusher, name="cursor flusher", parent=broker)
            wal_dir = tmp_path / "wal"
            topic = await system.spawn(
                lambda: make_topic(name=TOPIC, dispatch_strategy=cp.DispatchStrategy.RELIABLE, config=BrokerConfig(),
                                   rng=IdSource(1), broker_endpoint=broker, cursor_endpoint=flusher,
                                   wal_dir=wal_dir, executor=executor),
                name=f"topic {TOPIC}", parent=broker)
            stand_in = system.actor(broker)
            assert isinstance(stand_in, StandInBroker)
            stand_in.topic = topic
            await body(system, topic, wal_dir, executor)
        finally:
            await system.shutdown()
            executor.shutdown()
            ctx.term()

    asyncio.run(run())


def _wal_cursor(directory: Path) -> int:
    """Subscription `s`'s cursor in the WAL files in `directory` (recovered as at a start)."""
    wal = WalLog.open(directory, segment_bytes_max=1 << 20, segment_age_ms_max=3_600_000, clock=SystemClock())
    try:
        return cr.decode_cursor(wal.checkpoints()["s"]).cursor
    finally:
        wal.close()


def _committed(system: ActorSystem, topic: str) -> int:
    actor = system.actor(topic)
    assert isinstance(actor, TopicActor)
    return int(getattr(actor.storage, "committed_offset", 0))


def _checkpointed(system: ActorSystem, topic: str) -> int | None:
    actor = system.actor(topic)
    assert isinstance(actor, TopicActor)
    wal = getattr(actor.storage, "wal", None)
    state = wal.checkpoints().get("s") if wal is not None else None
    return None if state is None else cr.decode_cursor(state).cursor


def test_a_seek_is_in_the_wal_files_when_it_is_answered(tmp_path: Path) -> None:
    """Five messages, subscription `s` sought forward to the end (cursor 4, checkpointed).
    With the WAL's worker busy (a flush would wait behind it), an admin seeks `s` back to
    offset 0: when the seek is answered, a copy of the WAL directory (what a broker killed
    at that moment leaves) already resumes `s` at cursor -1. A seek answered before its
    checkpoint is written is undone by a kill -9 inside the flush window: the restarted
    topic resumes from the older, higher checkpoint and the messages sought back to are
    never delivered again."""

    async def body(system: ActorSystem, topic: str, wal_dir: Path, executor: ThreadPoolExecutor) -> None:
        system.tell(topic, AppendInternal(producer_name="p", payloads=[b"m"] * 5, publish_times=[1] * 5,
                                          keys=[None] * 5, attributes=[None] * 5))

        await until(lambda: _committed(system, topic) == 5, "the five messages committed")
        await system.ask(topic, SeekCursor(subscription="s", offset=5, publish_time=None))
        await until(lambda: _checkpointed(system, topic) == 4, "s checkpointed at 4 in the WAL")

        gate = threading.Event()
        executor.submit(gate.wait)  # the WAL's worker is busy until the gate opens
        image = tmp_path / "at-answer"
        seek = asyncio.ensure_future(system.ask(topic, SeekCursor(subscription="s", offset=0, publish_time=None)))
        seek.add_done_callback(lambda _: shutil.copytree(wal_dir, image))
        await asyncio.wait([seek], timeout=1.0)  # answered now only if it did not wait for its write
        gate.set()
        await seek
        assert _wal_cursor(image) == -1, "the seek was answered before its checkpoint was in the WAL"

    _run(tmp_path, body)


def test_a_seek_during_a_checkpoint_only_flush_leaves_that_flush_in_flight_until_its_done(tmp_path: Path) -> None:
    """A flush that carries only subscription `s`'s checkpoint is writing (the worker is
    held) when an admin seeks `s` and a batch is appended. The seek takes its checkpoint
    out of that flush and writes its own; the flush is still in flight until its
    FlushDone, so the batch waits for it rather than starting a flush of its own, whose
    number the late FlushDone would not match (the topic failed an assertion and was
    restarted, its queued sends answered UNAVAILABLE). The same actor commits the batch."""

    async def body(system: ActorSystem, topic: str, wal_dir: Path, executor: ThreadPoolExecutor) -> None:
        append = AppendInternal(producer_name="p", payloads=[b"m"] * 5, publish_times=[1] * 5,
                                keys=[None] * 5, attributes=[None] * 5)
        system.tell(topic, append)
        await until(lambda: _committed(system, topic) == 5, "the five messages committed")
        await system.ask(topic, SeekCursor(subscription="s", offset=5, publish_time=None))
        await until(lambda: _checkpointed(system, topic) == 4, "s checkpointed at 4 in the WAL")
        actor = system.actor(topic)

        gate = threading.Event()
        executor.submit(gate.wait)  # the checkpoint-only flush below waits behind it
        system.tell(topic, PersistCursor(topic=TOPIC, subscription="s", sub_type=SUB_TYPE, cursor=2,
                                         acked_above=[], seeks=1_000))
        seek = asyncio.ensure_future(system.ask(topic, SeekCursor(subscription="s", offset=0, publish_time=None)))
        await asyncio.sleep(0.2)  # the seek waits on the flush in flight
        system.tell(topic, append)
        gate.set()
        await seek
        await until(lambda: _committed(system, topic) == 10, "the batch appended during the seek committed")
        assert system.actor(topic) is actor, "the topic actor was restarted"

    _run(tmp_path, body)

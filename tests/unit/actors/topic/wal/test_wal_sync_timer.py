"""A reliable topic in `wal_sync: interval` mode fsyncs its WAL on a timer message of
its own (`WalSyncDue`), not on a `FlushDone` with a made-up flush id.

The real gateway and a reliable topic run in one actor system (a stand-in broker
reserves offsets), with a client on an inproc DEALER socket; the timer's interval is an
hour, so only the message the test tells the topic fsyncs. One told while a flush is
writing is owed, not skipped: it runs as soon as that flush is done.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import zmq
import zmq.asyncio

from danube_zmq.actors.topic import TopicActor, WalStorage
from danube_zmq.config.broker_config import StorageSection
from danube_zmq.runtime.system import ActorSystem
from danube_zmq.storage.wal import files as wal_files
from danube_zmq.transport import client_protocol as cp
from danube_zmq.transport.internal_protocol import (
    WalSyncDue,
)
from tests.unit.reliable_topic import ask as _ask
from tests.unit.reliable_topic import reliable_topic

StrPath = str | os.PathLike[str]

TOPIC = "/default/interval"
_listeners = itertools.count(1)


@contextlib.asynccontextmanager
async def _interval_topic(tmp_path: Path) -> AsyncIterator[tuple[ActorSystem, str, zmq.asyncio.Socket, int]]:
    """A reliable topic in interval mode (an hour: only `WalSyncDue`s the test tells it
    fsync), its system, its endpoint, and a client socket with a producer attached."""
    storage = StorageSection(wal_sync="interval", wal_sync_interval_ms=3_600_000)
    async with reliable_topic(tmp_path, TOPIC, storage) as (system, topic, _, sock):
        created = await _ask(sock, cp.CreateProducer(request_id=2, topic=TOPIC, producer_name="p"))
        assert isinstance(created, cp.ProducerCreated), created
        yield system, topic, sock, created.producer_id


def _storage(system: ActorSystem, topic: str) -> WalStorage:
    actor = system.actor(topic)
    assert isinstance(actor, TopicActor) and isinstance(actor.storage, WalStorage)
    return actor.storage


async def test_the_periodic_fsync_is_a_message_of_its_own(tmp_path: Path) -> None:
    """A batch acknowledged in interval mode is written, not yet fsynced; telling the
    topic `WalSyncDue` fsyncs the WAL once (its `syncs` count moves), handled by its own
    handler (nothing unrecognized, no restart)."""
    async with _interval_topic(tmp_path) as (system, topic, sock, producer_id):
        receipt = await _ask(sock, cp.Send(request_id=3, producer_id=producer_id, payloads=[b"a"],
                                           publish_times=[0]))
        assert isinstance(receipt, cp.SendReceipt), receipt
        wal = _storage(system, topic).wal
        assert wal is not None
        syncs = wal.statistics().syncs
        before = system.actor_statistics()
        assert system.tell(topic, WalSyncDue())
        async with asyncio.timeout(30):
            while wal.statistics().syncs == syncs:
                await asyncio.sleep(0.01)
        (stats,) = [s for s in system.actor_statistics() if s.endpoint == topic]
        (old,) = [s for s in before if s.endpoint == topic]
        assert stats.unrecognized_messages == old.unrecognized_messages and stats.restarts == old.restarts == 0
        assert wal.statistics().syncs == syncs + 1


class _GatedFiles(wal_files.FileLayer):
    """The real file system, recording each segment write and fsync in order; while
    `gate` is clear, a segment write waits for it (a flush held mid-write)."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.gate.set()
        self.events: list[str] = []
        self._segments: set[int] = set()

    def open(self, path: StrPath, flags: int, mode: int = 0o777, *, dir_fd: int | None = None) -> int:
        fd = os.open(path, flags, mode, dir_fd=dir_fd)
        if str(path).endswith(".wal") and flags & os.O_WRONLY:
            self._segments.add(fd)
        return fd

    def pwrite(self, fd: int, data: bytes | bytearray | memoryview, position: int) -> int:
        if fd in self._segments:
            assert self.gate.wait(30), "the gate was never opened"
            self.events.append("write")
        return os.pwrite(fd, data, position)

    def fsync(self, fd: int) -> None:
        os.fsync(fd)
        if fd in self._segments:
            self.events.append("fsync")

    def close(self, fd: int) -> None:
        self._segments.discard(fd)
        os.close(fd)


async def test_a_sync_due_during_a_flush_runs_when_that_flush_is_done(tmp_path: Path) -> None:
    """Interval mode under load: a `WalSyncDue` that comes while a flush is writing is
    not skipped (at full rate a flush nearly always runs, so skipping let the WAL go
    unsynced for seconds past `wal_sync_interval_ms`): the segment is fsynced as soon as
    that flush is done, before the next flush writes. A flush is held mid-write by a
    gated file layer; one more send queues behind it; the only `WalSyncDue` comes then."""
    layer = _GatedFiles()
    previous = wal_files.install(layer)
    try:
        async with _interval_topic(tmp_path) as (system, topic, sock, producer_id):
            first = await _ask(sock, cp.Send(request_id=3, producer_id=producer_id, payloads=[b"a"],
                                             publish_times=[0], sequence=0))
            assert isinstance(first, cp.SendReceipt), first
            storage = _storage(system, topic)
            wal = storage.wal
            assert wal is not None
            syncs = wal.statistics().syncs
            layer.gate.clear()
            await sock.send(cp.CLIENT_PROTOCOL.encode(cp.Send(request_id=4, producer_id=producer_id,
                                                              payloads=[b"b"], publish_times=[0], sequence=1)))
            async with asyncio.timeout(30):
                while not storage.commit.flushing:  # the flush of b is held in its write
                    await asyncio.sleep(0.005)
            assert system.tell(topic, WalSyncDue())
            # Queued behind the held flush; the topic's mailbox has the WalSyncDue first.
            third = asyncio.get_running_loop().create_task(_ask(sock, cp.Send(
                request_id=5, producer_id=producer_id, payloads=[b"c"], publish_times=[0], sequence=2)))
            async with asyncio.timeout(30):
                while not storage.commit.queued:
                    await asyncio.sleep(0.005)
            mark = len(layer.events)
            layer.gate.set()
            assert isinstance(await third, cp.SendReceipt)
            async with asyncio.timeout(30):
                while wal.statistics().syncs == syncs:
                    await asyncio.sleep(0.01)
            # b's write (held), then its fsync, then c's write: the due sync ran between flushes.
            assert layer.events[mark:mark + 3] == ["write", "fsync", "write"], layer.events[mark:]
            assert wal.statistics().syncs == syncs + 1
    finally:
        wal_files.install(previous)

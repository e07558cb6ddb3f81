"""A reliable topic keeps a producer's batches in send order across re-attaches: the
producer says in `CreateProducer.next_sequence` which batch it sends next, and the
topic refuses a later batch until that one comes (a batch at or below it is a retry
and is accepted).

The real gateway and a reliable topic run in one actor system, with a client on an
inproc DEALER socket (as in test_wal_sync_timer.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import threading
from pathlib import Path

import zmq
import zmq.asyncio

from danube_zmq.actors.topic import TopicActor, WalStorage
from danube_zmq.config.broker_config import StorageSection
from danube_zmq.runtime.system import ActorSystem
from danube_zmq.storage.wal import files as wal_files
from danube_zmq.transport import client_protocol as cp
from danube_zmq.transport.common import Error
from danube_zmq.transport.errors import ErrorCode
from danube_zmq.transport.internal_protocol import ClientRequest
from tests.unit.reliable_topic import answer_to, reliable_topic
from tests.unit.reliable_topic import ask as _ask

TOPIC = "/default/order"
IDENTITY = b"order-client"

_requests = iter(range(100, 10_000))


def _reliable_topic(tmp_path: Path, storage: StorageSection | None = None,
                    ) -> contextlib.AbstractAsyncContextManager[tuple[ActorSystem, str, WalStorage, zmq.asyncio.Socket]]:
    """A reliable topic behind the real gateway (the system, its endpoint, its storage)
    and a connected client socket whose identity is `IDENTITY`."""
    return reliable_topic(tmp_path, TOPIC, storage, IDENTITY)


async def _send(sock: zmq.asyncio.Socket, producer_id: int, sequence: int) -> cp.SendReceipt | Error:
    answer = await _ask(sock, cp.Send(request_id=next(_requests), producer_id=producer_id,
                                      payloads=[f"batch {sequence}".encode()], publish_times=[0], sequence=sequence))
    assert isinstance(answer, cp.SendReceipt | Error), answer
    return answer


async def _attach(sock: zmq.asyncio.Socket, name: str, next_sequence: int | None) -> int:
    created = await _ask(sock, cp.CreateProducer(request_id=next(_requests), topic=TOPIC,
                                                 producer_name=name, dispatch_strategy=cp.DispatchStrategy.RELIABLE,
                                                 next_sequence=next_sequence))
    assert isinstance(created, cp.ProducerCreated), created
    return created.producer_id


async def test_a_producer_attached_with_next_sequence_has_later_batches_refused_until_that_one(
        tmp_path: Path) -> None:
    """A producer that attaches saying it sends batch 5 next (it moved here with 5 and 6
    unacknowledged) gets 6 refused (UNAVAILABLE) if 6 comes first; 5 is accepted, then 6."""
    async with _reliable_topic(tmp_path) as (_, _, _, sock):
        producer_id = await _attach(sock, "moved", 5)
        refused = await _send(sock, producer_id, 6)
        assert isinstance(refused, Error) and refused.code == ErrorCode.UNAVAILABLE, refused
        assert "batch 6" in refused.message and "batch 5" in refused.message
        assert isinstance(await _send(sock, producer_id, 5), cp.SendReceipt)
        assert isinstance(await _send(sock, producer_id, 6), cp.SendReceipt)


async def test_re_attaching_with_next_sequence_sets_the_batch_expected(tmp_path: Path) -> None:
    """The same producer re-attaching on its connection says which batch it sends next:
    the topic expects that one (not any batch, as for a client that does not say)."""
    async with _reliable_topic(tmp_path) as (_, _, _, sock):
        producer_id = await _attach(sock, "p", None)
        assert isinstance(await _send(sock, producer_id, 0), cp.SendReceipt)
        assert await _attach(sock, "p", 1) == producer_id
        refused = await _send(sock, producer_id, 2)
        assert isinstance(refused, Error) and refused.code == ErrorCode.UNAVAILABLE, refused
        assert isinstance(await _send(sock, producer_id, 1), cp.SendReceipt)
        assert await _attach(sock, "p", None) == producer_id  # an older client: any batch
        assert isinstance(await _send(sock, producer_id, 7), cp.SendReceipt)


async def test_a_batch_refused_before_it_is_accepted_is_not_overtaken_by_the_next(tmp_path: Path) -> None:
    """A producer attached without `next_sequence` (an older client: any batch first)
    has batch 1 refused for lack of disk space (RESOURCE_EXHAUSTED, before the topic
    takes it); space is freed before batch 2, pipelined behind it, arrives: 2 is refused
    (UNAVAILABLE) until 1 comes again, so 1 is stored first."""
    storage_section = StorageSection(disk_free_bytes_min=1, disk_check_interval_ms=3_600_000)
    async with _reliable_topic(tmp_path, storage_section) as (_, _, storage, sock):
        producer_id = await _attach(sock, "p", None)
        storage.quota.disk_free_bytes = 0  # the filesystem as the last check found it
        storage.quota.disk_check_due_ms = 1 << 62  # and no check before the test says
        refused = await _send(sock, producer_id, 1)
        assert isinstance(refused, Error) and refused.code == ErrorCode.RESOURCE_EXHAUSTED, refused
        storage.quota.disk_free_bytes = 1 << 40
        overtaking = await _send(sock, producer_id, 2)
        assert isinstance(overtaking, Error) and overtaking.code == ErrorCode.UNAVAILABLE, overtaking
        first, second = await _send(sock, producer_id, 1), await _send(sock, producer_id, 2)
        assert isinstance(first, cp.SendReceipt) and isinstance(second, cp.SendReceipt)
        assert first.offsets[0] < second.offsets[0]


class _GatedClose(wal_files.FileLayer):
    """The real file system; while `gate` is clear, closing a WAL segment waits for it
    (a topic held in its stop, closing its WAL); `closing` is set when one waits."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.gate.set()
        self.closing = threading.Event()
        self._segments: set[int] = set()

    def open(self, path: str | os.PathLike[str], flags: int, mode: int = 0o777, *,
             dir_fd: int | None = None) -> int:
        fd = os.open(path, flags, mode, dir_fd=dir_fd)
        if str(path).endswith(".wal"):
            self._segments.add(fd)
        return fd

    def close(self, fd: int) -> None:
        if fd in self._segments:
            self._segments.discard(fd)
            if not self.gate.is_set():
                self.closing.set()
                assert self.gate.wait(30), "the gate was never opened"
        os.close(fd)


async def test_a_batch_left_in_a_stopping_topics_mailbox_is_answered(tmp_path: Path) -> None:
    """A batch the gateway routed to the topic just before it learned that the topic
    stops (unloaded: its producer not yet detached there) waits in the topic's mailbox
    while the topic closes its WAL. It is answered UNAVAILABLE (send it again, on the next
    owner), not dropped with the mailbox: that left the client waiting out its request
    timeout (chaos B5: 5 s without an acknowledgement after a move)."""
    layer = _GatedClose()
    previous = wal_files.install(layer)
    try:
        async with _reliable_topic(tmp_path) as (system, topic, _, sock):
            producer_id = await _attach(sock, "p", 0)
            assert isinstance(await _send(sock, producer_id, 0), cp.SendReceipt)
            layer.gate.clear()
            stopping = asyncio.create_task(system.stop(topic, moving=True))
            assert await asyncio.to_thread(layer.closing.wait, 30), "the topic never closed its WAL"
            late = cp.Send(request_id=next(_requests), producer_id=producer_id, payloads=[b"late"],
                           publish_times=[0], sequence=1)
            assert system.tell(topic, ClientRequest(identity=IDENTITY, frame=cp.CLIENT_PROTOCOL.encode(late)))
            layer.gate.set()
            await stopping
            answer = await answer_to(sock, late.request_id)
            assert isinstance(answer, Error) and answer.code == ErrorCode.UNAVAILABLE, answer
    finally:
        layer.gate.set()
        wal_files.install(previous)


async def test_a_receipt_held_for_the_durable_store_is_answered_when_the_topic_moves(tmp_path: Path) -> None:
    """With `seal_every_flush` a batch's receipt waits until its segment is in the durable
    store. The topic is unloaded before that (here the upload never comes): the batch is
    answered UNAVAILABLE (send it again: it may be stored twice, never lost), not left
    unanswered until the client's request timeout (chaos B5: a 5 s stall at every move,
    and the batch sent again behind later ones)."""
    storage_section = StorageSection(mode="shared_fs", durable_url=str(tmp_path / "durable"), seal_every_flush=True)
    async with _reliable_topic(tmp_path, storage_section) as (system, topic, storage, sock):
        producer_id = await _attach(sock, "p", 0)
        waiting = cp.Send(request_id=next(_requests), producer_id=producer_id, payloads=[b"held"],
                          publish_times=[0], sequence=0)
        await sock.send(cp.CLIENT_PROTOCOL.encode(waiting))
        async with asyncio.timeout(30):
            while not storage.segments.receipts_held:
                await asyncio.sleep(0.005)
        await system.stop(topic, moving=True)
        answer = await answer_to(sock, waiting.request_id)
        assert isinstance(answer, Error) and answer.code == ErrorCode.UNAVAILABLE, answer


async def test_batches_held_over_the_publish_rate_are_answered_when_the_topic_moves(tmp_path: Path) -> None:
    """At max_publish_rate 1 message/s the second and third batches are held (never
    refused); the topic is moved before the bucket refills: both are answered UNAVAILABLE
    at once (send them again), not left to the client's request timeout with its later
    batches queued behind them."""
    async with _reliable_topic(tmp_path) as (system, topic, _, sock):
        actor = system.actor(topic)
        assert isinstance(actor, TopicActor)
        policies = dataclasses.replace(actor.policies, max_publish_rate=1)
        assert system.tell(topic, policies)
        producer_id = await _attach(sock, "p", 0)
        assert isinstance(await _send(sock, producer_id, 0), cp.SendReceipt)  # the bucket's one token
        held = [cp.Send(request_id=next(_requests), producer_id=producer_id, payloads=[b"held %d" % sequence],
                        publish_times=[0], sequence=sequence) for sequence in (1, 2)]
        for send in held:
            await sock.send(cp.CLIENT_PROTOCOL.encode(send))
        async with asyncio.timeout(30):
            while len(actor._held_sends) < 2:
                await asyncio.sleep(0.005)
        await system.stop(topic, moving=True)
        for send in held:
            answer = await answer_to(sock, send.request_id)
            assert isinstance(answer, Error) and answer.code == ErrorCode.UNAVAILABLE, answer
            assert "max_publish_rate" in answer.message

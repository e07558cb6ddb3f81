"""Producer deduplication on a reliable topic (`actors/topic/wal/dedup.py`), as a
client sees it over the real gateway: messages sent again are answered with their
first offsets and stored once; the table comes back from the WAL after a restart;
the policy turns it on and off; producers gone past the inactivity timeout are
forgotten (on an injected clock)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import zmq.asyncio

from danube_zmq.actors.metrics import METRICS
from danube_zmq.actors.topic import TopicActor, WalStorage
from danube_zmq.actors.topic.dedup import DedupTable
from danube_zmq.clock import ManualClock
from danube_zmq.config.broker_config import BrokerConfig, PoliciesSection
from danube_zmq.storage.wal.checkpoints import DEDUP_CHECKPOINT
from danube_zmq.transport import client_protocol as cp
from danube_zmq.transport.common import Error, Ok
from danube_zmq.transport.errors import ErrorCode
from tests.unit.reliable_topic import ask, reliable_topic
from tests.waiting import until

TOPIC = "/default/dedup"
ON = BrokerConfig(policies=PoliciesSection(deduplication=True))


async def _producer(sock: zmq.asyncio.Socket, name: str = "p", request_id: int = 2) -> cp.ProducerCreated:
    created = await ask(sock, cp.CreateProducer(request_id=request_id, topic=TOPIC, producer_name=name,
                                                dispatch_strategy=cp.DispatchStrategy.RELIABLE))
    assert isinstance(created, cp.ProducerCreated), created
    return created


async def _send(sock: zmq.asyncio.Socket, producer: cp.ProducerCreated, request_id: int,
                ids: list[int]) -> list[int]:
    receipt = await ask(sock, cp.Send(request_id=request_id, producer_id=producer.producer_id,
                                      payloads=[f"m{i}".encode() for i in ids], publish_times=[1] * len(ids),
                                      sequence_ids=ids))
    assert isinstance(receipt, cp.SendReceipt), receipt
    return receipt.offsets


def _checkpointed(storage: WalStorage) -> dict[str, tuple[int, int]] | None:
    state = None if storage.wal is None else storage.wal.topic_checkpoint(DEDUP_CHECKPOINT)
    return None if state is None else DedupTable.decode(state)[1]


def _stored(storage: WalStorage) -> list[bytes]:
    assert storage.wal is not None
    return storage.wal.read(0, max_bytes=1 << 20, upto_offset=storage.committed_offset).payloads


async def test_messages_sent_again_are_answered_with_their_offsets_and_stored_once(tmp_path: Path) -> None:
    async with reliable_topic(tmp_path, TOPIC, config=ON) as (_, _, storage, sock):
        producer = await _producer(sock)
        assert producer.last_sequence_id == -1
        duplicates = METRICS.duplicates.labels(topic=TOPIC)
        before = duplicates.value
        assert await _send(sock, producer, 3, [0, 1, 2]) == [0, 1, 2]
        assert await _send(sock, producer, 4, [1, 2, 3, 4]) == [1, 2, 3, 4]  # 3 and 4 are new
        assert await _send(sock, producer, 5, [0, 2]) == [0, 2]  # all sent before: no write
        assert await _send(sock, producer, 6, [10]) == [5]  # ids may skip
        assert _stored(storage) == [b"m0", b"m1", b"m2", b"m3", b"m4", b"m10"]
        assert duplicates.value - before == 4
        refused = await ask(sock, cp.Send(request_id=7, producer_id=producer.producer_id, payloads=[b"x", b"y"],
                                          publish_times=[1, 1], sequence_ids=[12, 11]))
        assert isinstance(refused, Error) and refused.code == ErrorCode.INVALID_ARGUMENT
        assert "increase" in refused.message
        other = await _producer(sock, "q", 8)  # its own numbers
        assert await _send(sock, other, 9, [0, 1]) == [6, 7]


async def test_the_table_comes_back_from_the_wal_after_a_restart(tmp_path: Path) -> None:
    config = BrokerConfig(policies=PoliciesSection(deduplication=True, deduplication_window=1000))
    async with reliable_topic(tmp_path, TOPIC, config=config) as (_, _, _, sock):
        producer = await _producer(sock)
        for request_id, first in enumerate(range(0, 3000, 500), start=3):
            await _send(sock, producer, request_id, list(range(first, first + 500)))
    async with reliable_topic(tmp_path, TOPIC, config=config) as (_, _, storage, sock):
        producer = await _producer(sock)
        assert producer.last_sequence_id == 2999
        # The last `deduplication_window` (1000) are answered with their offsets.
        assert await _send(sock, producer, 3, [2899, 2999, 3000]) == [2899, 2999, 3000]
        assert await _send(sock, producer, 4, [5]) == [-1]  # older than the window: -1, not stored
        assert len(_stored(storage)) == 3001


async def test_records_carry_their_ids_with_the_policy_off_and_the_table_knows_them_when_it_turns_on(
        tmp_path: Path) -> None:
    async with reliable_topic(tmp_path, TOPIC) as (system, endpoint, storage, sock):
        producer = await _producer(sock)
        assert producer.last_sequence_id is None  # off: the topic does not deduplicate
        assert await _send(sock, producer, 3, [0, 1]) == [0, 1]
        assert await _send(sock, producer, 4, [0, 1]) == [2, 3]  # off: stored again
        topic = system.actor(endpoint)
        assert isinstance(topic, TopicActor)
        topic.handle_ApplyTopicPolicies(dataclasses.replace(topic.policies, deduplication=1))
        assert await _send(sock, producer, 5, [1, 2]) == [1, 4]  # 1: its first copy; 2: new
        assert len(_stored(storage)) == 5
        topic.handle_ApplyTopicPolicies(dataclasses.replace(topic.policies, deduplication=0))
        assert await _send(sock, producer, 6, [2]) == [5]
        assert storage.dedup.table is None
        await until(lambda: storage.wal is not None and storage.wal.topic_checkpoint(DEDUP_CHECKPOINT) is None
                    and DEDUP_CHECKPOINT in storage.wal._checkpoints, "the deletion marker written")


async def test_a_producer_gone_past_the_inactivity_timeout_is_forgotten_and_the_table_is_written(
        tmp_path: Path) -> None:
    clock = ManualClock()
    config = BrokerConfig(policies=PoliciesSection(deduplication=True, deduplication_producer_inactivity_s=60))
    async with reliable_topic(tmp_path, TOPIC, clock=clock, config=config) as (system, endpoint, storage, sock):
        producer = await _producer(sock)
        await _send(sock, producer, 3, [0, 1])
        topic = system.actor(endpoint)
        assert isinstance(topic, TopicActor)
        # An idle topic writes its table at the next tick: the next start reads from there.
        await storage.tick()
        await until(lambda: _checkpointed(storage) == {"p": (1, clock.now_ms())}, "the table written")
        assert isinstance(await ask(sock, cp.CloseProducer(request_id=4, producer_id=producer.producer_id)), Ok)
        clock.advance(59_000)
        await storage.tick()
        assert storage.dedup.table is not None and storage.dedup.table.last_sequence_id("p") == 1
        clock.advance(1_000)
        await storage.tick()
        assert storage.last_sequence_id("p") == -1


async def test_a_name_past_the_bound_forgets_the_least_recently_active_and_says_so(tmp_path: Path, caplog) -> None:
    config = BrokerConfig(policies=PoliciesSection(deduplication=True, deduplication_producers_max=1))
    async with reliable_topic(tmp_path, TOPIC, config=config) as (_, _, storage, sock):
        first = await _producer(sock, "p", 2)
        await _send(sock, first, 3, [0])
        second = await _producer(sock, "q", 4)
        await _send(sock, second, 5, [0])
        assert storage.last_sequence_id("p") == -1 and storage.last_sequence_id("q") == 0
        assert "deduplication table full" in caplog.text

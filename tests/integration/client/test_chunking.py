"""Chunked messages against a real broker, as a Pulsar user tries them: a 50 MiB payload
through a broker whose message size is 10 MiB, a producer killed with -9 mid-message
(the consumer drops the partial message once it expires, and its chunks are
acknowledged), the consumer's bounds, and a Shared subscription where every chunk of
one message goes to one consumer."""

from __future__ import annotations

import asyncio
import hashlib
import os
import signal
import subprocess
import sys
import time

import pytest

from danube_zmq import Consumer, DanubeClient, SubType
from danube_zmq.client.chunks import chunk_attributes
from danube_zmq.transport.errors import InvalidArgument, Timeout
from tests.integration.storage.test_reliable import describe_subscription

MIB = 1024 * 1024


async def _drain(consumer: Consumer, got: list[bytes]) -> None:
    """Receive and acknowledge until nothing comes for 3 s."""
    while True:
        try:
            msg = await consumer.receive(timeout=3)
        except Timeout:
            return
        got.append(msg.payload)
        await consumer.ack(msg)


async def test_a_50_mib_payload_arrives_whole_with_one_message_id(broker_factory) -> None:
    """Chunks of the broker's 10 MiB message size (5 of them); the consumer gets one
    message: the whole payload, the first chunk's offset, the producer's attributes and
    key; acknowledging it acknowledges every chunk (backlog 0). Without `chunking` the
    same payload is refused."""
    broker = broker_factory()
    topic = "/default/chunked-big"
    payload = os.urandom(50 * MIB)
    async with DanubeClient(broker.url) as client:
        consumer = await client.subscribe(topic, "whole", sub_type=SubType.EXCLUSIVE)
        plain = await client.create_producer(topic, dispatch="reliable")
        with pytest.raises(InvalidArgument, match="message_bytes_max"):
            await plain.send(payload)
        producer = await client.create_producer(topic, dispatch="reliable", chunking=True)
        message_id = await producer.send(payload, key="k", attributes={"kind": "video"})
        await producer.send(b"small after")
        got = await consumer.receive(timeout=60)
        assert hashlib.sha256(got.payload).digest() == hashlib.sha256(payload).digest()
        assert (got.offset, got.key, dict(got.attributes)) == (message_id.offset, "k", {"kind": "video"})
        assert got.chunk_offsets is not None and len(got.chunk_offsets) == 5
        assert (await consumer.receive(timeout=10)).payload == b"small after"
        await consumer.ack(got)
        await consumer.flush_acks()
        deadline = time.monotonic() + 10
        while (await describe_subscription(broker, topic, "whole")).backlog_messages != 1:
            assert time.monotonic() < deadline, "the chunks were not all acknowledged"
            await asyncio.sleep(0.1)


_PRODUCER = """
import asyncio, os, sys
from danube_zmq import DanubeClient

async def main(url, topic):
    async with DanubeClient(url) as client:
        producer = await client.create_producer(topic, dispatch="reliable", chunking=True, chunk_bytes_max=65536,
                                                inflight_batches_max=1)
        await producer.send(b"before")
        print("sent", flush=True)
        await producer.send(os.urandom(64 * 1024 * 1024))

asyncio.run(main(sys.argv[1], sys.argv[2]))
"""


async def test_a_producer_killed_mid_message_leaves_a_partial_the_consumer_drops_after_the_expiry(
        broker_factory) -> None:
    """A producer process sends a 64 MiB payload in 64 KiB chunks and is killed with -9
    part way. The consumer hands out the message before it and, once
    `expire_incomplete_chunked_message_ms` (1 s) passed without a chunk, drops the
    partial one and acknowledges its chunks: the subscription's backlog goes to 0 and
    the next message arrives."""
    broker = broker_factory()
    topic = "/default/chunked-killed"
    async with DanubeClient(broker.url) as client:
        consumer = await client.subscribe(topic, "reader", sub_type=SubType.EXCLUSIVE,
                                          expire_incomplete_chunked_message_ms=1000)
        process = subprocess.Popen([sys.executable, "-c", _PRODUCER, broker.url, topic], stdout=subprocess.PIPE,
                                   text=True)
        assert process.stdout is not None and process.stdout.readline().strip() == "sent"
        before = await consumer.receive(timeout=10)
        assert before.payload == b"before"
        await consumer.ack(before)
        deadline = time.monotonic() + 30
        while (await describe_subscription(broker, topic, "reader")).backlog_messages < 20:
            assert time.monotonic() < deadline, "no chunks stored"
            await asyncio.sleep(0.05)
        process.send_signal(signal.SIGKILL)
        process.wait(10)
        # Each receive takes the chunks in; once none came for 1 s the partial message
        # is dropped and its chunks acknowledged (found at the next receive).
        deadline = time.monotonic() + 30
        while (await describe_subscription(broker, topic, "reader")).backlog_messages != 0:
            assert time.monotonic() < deadline, "the partial message's chunks were not acknowledged"
            with pytest.raises(Timeout):
                await consumer.receive(timeout=0.5)
            await consumer.flush_acks()
        producer = await client.create_producer(topic, dispatch="reliable")
        await producer.send(b"after")
        assert (await consumer.receive(timeout=10)).payload == b"after"
        assert consumer._chunks.dropped == 1


async def test_past_its_bound_the_oldest_incomplete_message_is_dropped(broker_factory) -> None:
    """Chunks of three messages in the order a0 b0 c0 b1 c1 b2 c2 (as producers sending
    at once may interleave them) to a consumer that lets 2 wait: c0 drops a, the oldest
    (its chunks acknowledged), and b and c arrive whole."""
    broker = broker_factory()
    topic = "/default/chunked-bound"
    async with DanubeClient(broker.url) as client:
        consumer = await client.subscribe(topic, "tight", sub_type=SubType.EXCLUSIVE, max_pending_chunked_messages=2)
        producer = await client.create_producer(topic, dispatch="reliable")
        parts = {name: [bytes([i]) * 1000] * 3 for i, name in enumerate("abc")}
        for name, index in (("a", 0), ("b", 0), ("c", 0), ("b", 1), ("c", 1), ("b", 2), ("c", 2)):
            await producer.send(parts[name][index], attributes=chunk_attributes(None, name, index, 3, 3000))
        got = [await consumer.receive(timeout=10) for _ in range(2)]
        assert [m.payload for m in got] == [bytes([1]) * 3000, bytes([2]) * 3000]
        assert consumer._chunks.dropped == 1
        await consumer.ack(got)
        await consumer.flush_acks()
        deadline = time.monotonic() + 10
        while (await describe_subscription(broker, topic, "tight")).backlog_messages != 0:
            assert time.monotonic() < deadline, "a's chunk was not acknowledged"
            await asyncio.sleep(0.1)


async def test_in_a_shared_subscription_every_chunk_of_a_message_goes_to_one_consumer(broker_factory) -> None:
    """Two consumers on a Shared subscription, 20 chunked messages of 5 chunks: each
    consumer gets whole messages only, none is lost or dropped, together all 20."""
    broker = broker_factory()
    topic = "/default/chunked-shared"
    async with DanubeClient(broker.url) as client:
        first = await client.subscribe(topic, "pool", sub_type=SubType.SHARED, receiver_queue_size=3)
        second = await client.subscribe(topic, "pool", sub_type=SubType.SHARED, receiver_queue_size=3)
        producer = await client.create_producer(topic, dispatch="reliable", chunking=True, chunk_bytes_max=1000)
        payloads = [bytes([i]) * 4500 for i in range(20)]
        for data in payloads:
            producer.send_nowait(data)
        await producer.flush()
        got: list[bytes] = []
        await asyncio.gather(_drain(first, got), _drain(second, got))
        assert sorted(got) == sorted(payloads)
        assert first._chunks.dropped == second._chunks.dropped == 0


@pytest.mark.parametrize("dedup", [False, True])
async def test_the_broker_killed_mid_stream_still_delivers_each_chunked_message_whole(broker_factory,
                                                                                      dedup: bool) -> None:
    """Ten 1 MiB messages in 64 KiB chunks while the broker is killed with -9 once; the
    producer's client sends again what was in flight. The consumer gets every message
    whole. With deduplication each exactly once; without, a chunk stored twice is
    kept once and a message is never handed out in pieces."""
    env = {"DANUBE_POLICIES__DEDUPLICATION": "true"} if dedup else {}
    broker = broker_factory(env=env)
    topic = "/default/chunked-killed-broker"
    payloads = [bytes([i]) * MIB for i in range(10)]
    async with DanubeClient(broker.url, operation_retries_max=50) as client:
        consumer = await client.subscribe(topic, "whole", sub_type=SubType.EXCLUSIVE,
                                          expire_incomplete_chunked_message_ms=5000)
        producer = await client.create_producer(topic, name="chunker", dispatch="reliable", chunking=True,
                                                chunk_bytes_max=64 * 1024)
        sends = []
        for i, data in enumerate(payloads):
            sends.append(producer.send_nowait(data))
            if i == 4:
                while not sends[2].done():
                    await asyncio.sleep(0.001)
                broker.stop(signal.SIGKILL)
                broker = broker_factory(env=env, url=broker.url, admin_url=broker.admin_url)
        ids = [await s for s in sends]
        assert len({m.offset for m in ids}) == 10
        got: list[bytes] = []
        await _drain(consumer, got)
        # A consumer may get a message again (an ack the kill lost): never in pieces.
        assert set(got) == set(payloads)
        if dedup:  # stored once each, in order: read back from the earliest
            reader = await client.create_reader(topic, start="earliest")
            assert [(await reader.read_next(timeout=10)).payload for _ in payloads] == payloads
            assert not await reader.has_message_available()


def test_danube_produce_chunking_sends_a_file_larger_than_the_message_size(broker_factory, tmp_path) -> None:
    """`danube produce --reliable --chunking -f FILE` with a 12 MiB file (the broker
    takes 10 MiB a message): one message id, and a consumer gets the file's bytes."""
    broker = broker_factory()
    topic = "/default/chunked-cli"
    data = os.urandom(12 * MIB)
    path = tmp_path / "big.bin"
    path.write_bytes(data)

    async def consume() -> bytes:
        async with DanubeClient(broker.url) as client:
            consumer = await client.subscribe(topic, "cli", sub_type=SubType.EXCLUSIVE,
                                              initial_position="earliest")
            return (await consumer.receive(timeout=30)).payload

    refused = subprocess.run([sys.executable, "-m", "danube_zmq.cli.main", "produce", "-s", broker.url, "-t", topic,
                              "--reliable", "-f", str(path)], capture_output=True, text=True, timeout=60)
    assert refused.returncode != 0 and "message_bytes_max" in refused.stderr, refused.stderr
    done = subprocess.run([sys.executable, "-m", "danube_zmq.cli.main", "produce", "-s", broker.url, "-t", topic,
                           "--reliable", "--chunking", "-f", str(path), "--json"], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.strip().splitlines()) == 1
    assert hashlib.sha256(asyncio.run(consume())).digest() == hashlib.sha256(data).digest()


async def test_batch_receive_and_readers_hand_out_chunked_messages_whole(broker_factory) -> None:
    """Five 4,500-byte messages in 1,000-byte chunks, a plain one between them:
    `batch_receive` and a reader from the earliest give them whole, in order."""
    broker = broker_factory()
    topic = "/default/chunked-batches"
    payloads = [bytes([i]) * 4500 for i in range(5)]
    async with DanubeClient(broker.url) as client:
        consumer = await client.subscribe(topic, "batches", sub_type=SubType.EXCLUSIVE)
        producer = await client.create_producer(topic, dispatch="reliable", chunking=True, chunk_bytes_max=1000)
        for data in payloads[:2]:
            await producer.send(data)
        await producer.send(b"plain")
        for data in payloads[2:]:
            await producer.send(data)
        expected = [*payloads[:2], b"plain", *payloads[2:]]
        got: list[bytes] = []
        while len(got) < len(expected):
            got += [m.payload for m in await consumer.batch_receive(timeout=10)]
        assert got == expected
        reader = await client.create_reader(topic, start="earliest")
        assert [(await reader.read_next(timeout=10)).payload for _ in expected] == expected
        assert not await reader.has_message_available()

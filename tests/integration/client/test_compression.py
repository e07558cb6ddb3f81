"""Compression against a real broker, as a Pulsar user tries it: a producer created with
`compression=` writes compressed payloads, consumers and readers get them back whole
and without the reserved attribute, on reliable and non-reliable topics, chunked,
compacted and validated against a schema; what the broker stores is the compressed
bytes; a bound stops a payload that would grow too large, and nothing is lost."""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys

import pytest

from danube_zmq import DanubeClient
from danube_zmq.client.admin import AdminClient
from danube_zmq.client.schemas import SchemaRegistryClient
from danube_zmq.transport.compression import CODECS, COMPRESSION
from danube_zmq.transport.errors import InvalidArgument, Timeout

SHARED_BROKER = True


def _record(i: int) -> bytes:
    """About 1 KiB of JSON, as an application's events are."""
    return json.dumps({"id": i, "user": f"user-{i % 97}", "email": f"user{i % 97}@example.com", "active": i % 2 == 0,
                       "items": [{"sku": f"sku-{j}", "qty": j, "price": 9.99 + j} for j in range(8)],
                       "note": "the quick brown fox jumps over the lazy dog " * 4}).encode()


async def _receive(source, count: int) -> list:
    out = []
    for _ in range(count):
        message = await (source.read_next(timeout=20) if hasattr(source, "read_next") else
                         source.receive(timeout=20))
        out.append(message)
        if not hasattr(source, "read_next"):
            await source.ack(message)
    return out


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("dispatch", ["reliable", "non_reliable"])
async def test_consumers_get_back_what_was_compressed(broker, codec: str, dispatch: str) -> None:
    """100 JSON records and an empty payload, with user attributes: a consumer gets each
    payload as sent and the attributes without `__compression`; the topic took the
    compressed bytes (`bytes_in`, keys and attributes included, under 3/4 of the raw
    payloads: lz4 and snappy take about half, zstd and zlib a third)."""
    topic = f"/default/compressed-{codec}-{dispatch}"
    async with DanubeClient(broker.url) as client, AdminClient(broker.admin_url) as admin:
        consumer = await client.subscribe(topic, "s", sub_type="exclusive")
        producer = await client.create_producer(topic, dispatch=dispatch, compression=codec)
        sent = [_record(i) for i in range(100)] + [b""]
        for i, payload in enumerate(sent):
            producer.send_nowait(payload, key=f"k{i}", attributes={"source": "test"})
        await producer.flush()
        got = await _receive(consumer, len(sent))
        assert [m.payload for m in got] == sent
        assert all(dict(m.attributes) == {"source": "test"} for m in got)
        (partition,) = (await admin.describe_topic(topic)).partitions
        assert partition.bytes_in < 0.75 * sum(map(len, sent)), (partition.bytes_in, sum(map(len, sent)))


async def test_a_reader_and_a_compacted_view_decompress(broker) -> None:
    """A reader gets payloads decompressed; an empty payload from a compressing producer
    is still a tombstone that compaction honours."""
    topic = "/default/compressed-view"
    async with DanubeClient(broker.url) as client, AdminClient(broker.admin_url) as admin:
        producer = await client.create_producer(topic, dispatch="reliable", compression="zstd")
        for version in range(3):
            for k in range(5):
                await producer.send(f"k{k}-v{version}".encode() * 50, key=f"k{k}")
        await producer.send(b"", key="k2")
        reader = await client.create_reader(topic, start="earliest")
        assert [m.payload for m in await _receive(reader, 16)][-1] == b""
        await admin.compact_topic(topic)
        await admin.wait_for_compaction(topic, timeout_s=60)
        view = await client.create_reader(topic, start="earliest", read_compacted=True)
        got = await _receive(view, 4)
        assert [(m.key, m.payload) for m in got] == [(f"k{k}", f"k{k}-v2".encode() * 50) for k in (0, 1, 3, 4)]
        with pytest.raises(Timeout):
            await view.read_next(timeout=1)


async def test_a_large_payload_is_compressed_then_chunked(broker) -> None:
    """Compression comes before chunking: 2.5 MB of JSON, compressed with lz4, goes as
    64 KiB chunks; the consumer puts them together, then decompresses."""
    topic = "/default/compressed-chunks"
    payload = b"".join(_record(i) for i in range(4000))
    async with DanubeClient(broker.url) as client:
        consumer = await client.subscribe(topic, "s", sub_type="exclusive")
        producer = await client.create_producer(topic, dispatch="reliable", compression="lz4", chunking=True,
                                                chunk_bytes_max=64 * 1024)
        await producer.send(payload)
        (got,) = await _receive(consumer, 1)
        assert got.payload == payload and COMPRESSION not in got.attributes


async def test_the_broker_validates_a_compressed_payload_against_its_schema(broker) -> None:
    """With payload validation on, the broker decompresses to check: a valid compressed
    payload is stored, an invalid one refused naming the field."""
    schema = {"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"]}
    async with SchemaRegistryClient(broker.url) as registry:
        await registry.register("compressed-orders", "json_schema", json.dumps(schema).encode())
    topic = "/default/compressed-orders"
    async with AdminClient(broker.admin_url) as admin:
        await admin.configure_topic_schema(topic, "compressed-orders", validation_policy="enforce",
                                           payload_validation=True)
    async with DanubeClient(broker.url) as client:
        consumer = await client.subscribe(topic, "s", sub_type="exclusive")
        producer = await client.create_producer(topic, schema_subject="compressed-orders", compression="snappy",
                                                batching=False)
        await producer.send({"id": 1})
        with pytest.raises(InvalidArgument, match=r"\$\.id|id"):
            await producer.send(b'{"id": "one"}')
        (got,) = await _receive(consumer, 1)
        assert got.value() == {"id": 1}


async def test_bad_input_is_refused_and_a_payload_past_the_bound_comes_as_it_was(broker, caplog) -> None:
    """An unknown codec and the reserved attribute are refused before anything is sent;
    a consumer whose bound a payload would pass gets it as it came, the attribute naming
    the codec, and an error in its log: nothing is lost."""
    topic = "/default/compressed-bound"
    async with DanubeClient(broker.url) as client:
        with pytest.raises(InvalidArgument, match="unknown compression 'brotli'"):
            await client.create_producer(topic, compression="brotli")
        producer = await client.create_producer(topic, dispatch="reliable", compression="zlib")
        with pytest.raises(InvalidArgument, match="attribute __compression is the producer's"):
            await producer.send(b"x", attributes={COMPRESSION: "zstd"})
        consumer = await client.subscribe(topic, "s", sub_type="exclusive", initial_position="earliest",
                                          decompressed_bytes_max=1000)
        big = b"a" * 10_000
        await producer.send(big)
        with caplog.at_level(logging.ERROR, logger="danube_zmq.client"):
            (got,) = await _receive(consumer, 1)
        assert got.attributes[COMPRESSION] == "zlib" and len(got.payload) < len(big)
        assert "zlib payload decompresses to more than 1000 bytes" in caplog.text


async def test_the_cli_produces_compressed_and_consumes_plain(broker) -> None:
    topic = "/default/compressed-cli"
    cli = [sys.executable, "-m", "danube_zmq.cli.main"]
    done = await asyncio.to_thread(subprocess.run, [*cli, "produce", "-s", broker.url, "-t", topic, "--reliable",
                                                    "--compression", "zstd", "-m", "hello compressed", "-c", "3"],
                                   capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    read = await asyncio.to_thread(subprocess.run, [*cli, "consume", "-s", broker.url, "-t", topic, "--reader",
                                                    "--start", "earliest", "--timeout", "2", "--json"],
                                   capture_output=True, text=True, timeout=60)
    assert read.returncode == 0, read.stderr
    lines = [json.loads(line) for line in read.stdout.splitlines()]
    assert [m["payload"] for m in lines] == ["hello compressed"] * 3
    assert all(COMPRESSION not in (m.get("attributes") or {}) for m in lines)
    bad = await asyncio.to_thread(subprocess.run, [*cli, "produce", "-s", broker.url, "-t", topic,
                                                   "--compression", "brotli", "-m", "x"],
                                  capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--compression" in bad.stderr

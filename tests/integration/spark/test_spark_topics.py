"""Topics as a Spark source and sink on local[2], against a real broker: every column,
offsets and times, micro-batches within max_offsets_per_trigger, a replayed micro-batch
adding nothing, lost data failing or skipped, and the sink's refusals."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")

from pyspark.errors import StreamingQueryException

from danube_zmq import DanubeClient
from danube_zmq.client.admin import AdminClient
from danube_zmq.spark import spark_session
from tests.integration.conftest import BrokerProcess, start_broker

pytestmark = [pytest.mark.spark, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    process = start_broker(tmp_path_factory.mktemp("spark-broker"), env={"DANUBE_POLICIES__DEDUPLICATION": "true"})
    yield process
    assert process.stop() == 0, process.log()


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    session = spark_session("local[2]", app_name="danube-spark-tests")
    yield session
    session.stop()


def read(spark: Any, url: str, topic: str, **options: str) -> Any:
    reader = spark.read.format("danube").option("service_url", url).option("topics", topic)
    if "starting_timestamp_ms" not in options:
        options.setdefault("starting_offsets", "earliest")
    for name, value in options.items():
        reader = reader.option(name, value)
    return reader.load()


async def produce(url: str, topic: str, payloads: list[bytes], *, partitions: int = 0, keys: int = 10,
                  attributes: dict[str, str] | None = None) -> None:
    async with DanubeClient(url) as client:
        producer = await client.create_producer(topic, name=f"p-{topic.rsplit('/', 1)[1]}", dispatch="reliable",
                                                partitions=partitions or None)
        for i, payload in enumerate(payloads):
            producer.send_nowait(payload, key=f"k{i % keys}" if keys else None, attributes=attributes)
        await producer.flush()
        await producer.close()


def test_a_batch_read_gives_each_message_once_with_every_column(spark: Any, broker: BrokerProcess) -> None:
    topic = "/default/columns"
    before = int(time.time() * 1000)
    asyncio.run(produce(broker.url, topic, [f"m{i}".encode() for i in range(300)], partitions=3,
                        attributes={"source": "test"}))
    rows = read(spark, broker.url, topic).collect()
    assert sorted(r.value for r in rows) == sorted(f"m{i}".encode() for i in range(300))
    by_partition: dict[int, list[int]] = {}
    for row in rows:
        by_partition.setdefault(row.partition, []).append(row.offset)
        assert row.topic == topic and row.key in {f"k{i}" for i in range(10)} and row.attributes == {"source": "test"}
        assert row.producer_name == f"p-columns-{row.partition}"
        assert before - 1000 <= row.publish_time.timestamp() * 1000 <= time.time() * 1000 + 1000
    assert sorted(by_partition) == [0, 1, 2]
    for offsets in by_partition.values():  # each partition's offsets from 0, none missing
        assert sorted(offsets) == list(range(len(offsets)))
    # One key, one partition: as the client routes.
    assert all(len({r.partition for r in rows if r.key == f"k{i}"}) == 1 for i in range(10))


def test_batch_reads_between_offsets_and_from_a_publish_time(spark: Any, broker: BrokerProcess) -> None:
    topic = "/default/ranges"
    asyncio.run(produce(broker.url, topic, [f"a{i}".encode() for i in range(50)], keys=0))
    time.sleep(0.05)
    middle = int(time.time() * 1000)
    time.sleep(0.05)
    asyncio.run(produce(broker.url, topic, [f"b{i}".encode() for i in range(50)], keys=0))
    between = read(spark, broker.url, topic, starting_offsets=json.dumps({topic: 10}),
                   ending_offsets=json.dumps({topic: 20})).collect()
    assert [r.offset for r in sorted(between, key=lambda r: r.offset)] == list(range(10, 20))
    later = read(spark, broker.url, topic, starting_offsets="latest").count()
    assert later == 0
    since = sorted(read(spark, broker.url, topic, starting_timestamp_ms=str(middle)).collect(), key=lambda r: r.offset)
    assert [r.value for r in since] == [f"b{i}".encode() for i in range(50)] and since[0].offset == 50
    with pytest.raises(Exception, match=r"names /default/nope, which are not partitions of the source.s topics \(/default/ranges"):
        read(spark, broker.url, topic, starting_offsets=json.dumps({"/default/nope": 1})).count()


def stream_copy(spark: Any, url: str, source: str, sink: str, checkpoint: Path, **options: str) -> Any:
    reader = spark.readStream.format("danube").option("service_url", url).option("topics", source) \
        .option("starting_offsets", "earliest")
    for name, value in options.items():
        reader = reader.option(name, value)
    query = (reader.load().selectExpr("value", "key").writeStream.format("danube").option("service_url", url)
             .option("topic", sink).option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
    try:
        query.awaitTermination(300)
    except StreamingQueryException:
        pass  # the caller looks at query.exception()
    return query


def test_a_stream_reads_micro_batches_within_the_limit_and_writes_each_message_once(
        spark: Any, broker: BrokerProcess, tmp_path: Path) -> None:
    source, sink = "/default/stream-in", "/default/stream-out"
    sent = [f"s{i}".encode() for i in range(1000)]
    asyncio.run(produce(broker.url, source, sent, partitions=2))
    query = stream_copy(spark, broker.url, source, sink, tmp_path / "ckpt", max_offsets_per_trigger="300")
    assert query.exception() is None, query.exception()
    sizes = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    assert sizes == [300, 300, 300, 100], sizes
    out = read(spark, broker.url, sink).collect()
    assert sorted(r.value for r in out) == sorted(sent)
    # Nothing new: a second run of the query reads nothing and writes nothing.
    stream_copy(spark, broker.url, source, sink, tmp_path / "ckpt", max_offsets_per_trigger="300")
    assert read(spark, broker.url, sink).count() == 1000


def test_a_replayed_micro_batch_adds_nothing_to_the_sink(spark: Any, broker: BrokerProcess, tmp_path: Path) -> None:
    """The query's last commit is removed, as when its driver dies after the sink wrote
    a micro-batch and before Spark recorded it: the restarted query runs that micro-batch
    again, with the same offsets, and the sink skips every row it holds already."""
    source, sink = "/default/replay-in", "/default/replay-out"
    sent = [f"r{i}".encode() for i in range(600)]
    asyncio.run(produce(broker.url, source, sent, partitions=2))
    checkpoint = tmp_path / "ckpt"
    stream_copy(spark, broker.url, source, sink, checkpoint, max_offsets_per_trigger="200")
    commits = sorted((checkpoint / "commits").glob("[0-9]*"), key=lambda p: int(p.name))
    assert [c.name for c in commits] == ["0", "1", "2"]
    commits[-1].unlink()
    (checkpoint / "commits" / f".{commits[-1].name}.crc").unlink()
    query = stream_copy(spark, broker.url, source, sink, checkpoint, max_offsets_per_trigger="200")
    replayed = [p for p in query.recentProgress if p["numInputRows"]]
    assert [p["batchId"] for p in replayed] == [2] and replayed[0]["numInputRows"] == 200
    out = read(spark, broker.url, sink).collect()
    assert sorted(r.value for r in out) == sorted(sent)


def test_the_sink_refuses_a_topic_that_does_not_deduplicate_unless_told_at_least_once(
        spark: Any, broker: BrokerProcess) -> None:
    sink = "/default/no-dedup"

    async def setup() -> None:
        async with AdminClient(broker.admin_url) as admin:
            await admin.create_topic(sink, dispatch_strategy="reliable")
            await admin.set_topic_policies(sink, deduplication=0)
    asyncio.run(setup())
    frame = spark.createDataFrame([(b"x",), (b"y",)], "value BINARY")
    with pytest.raises(Exception, match="does not deduplicate, so the danube sink cannot write it exactly once"):
        frame.write.format("danube").option("service_url", broker.url).option("topic", sink).mode("append").save()
    frame.write.format("danube").option("service_url", broker.url).option("topic", sink) \
        .option("exactly_once", "false").mode("append").save()
    assert sorted(r.value for r in read(spark, broker.url, sink).collect()) == [b"x", b"y"]


def test_the_sink_names_what_is_wrong_with_a_frame(spark: Any, broker: BrokerProcess) -> None:
    frame = spark.createDataFrame([(b"x", "k")], "value BINARY, kee STRING")
    with pytest.raises(Exception, match="'kee' is not one of them"):
        frame.write.format("danube").option("service_url", broker.url).option("topic", "/default/x") \
            .mode("append").save()
    with pytest.raises(Exception, match="'attributes' column is map<string,int>, expected map<string,string>"):
        spark.createDataFrame([(b"x", {"n": 1})], "value BINARY, attributes MAP<STRING,INT>").write \
            .format("danube").option("service_url", broker.url).option("topic", "/default/x").mode("append").save()
    with pytest.raises(Exception, match="needs a 'value' column"):
        spark.createDataFrame([("k",)], "key STRING").write.format("danube") \
            .option("service_url", broker.url).option("topic", "/default/x").mode("append").save()


def test_a_batch_write_routes_by_key_partition_and_topic_columns(spark: Any, broker: BrokerProcess) -> None:
    async def setup() -> None:
        async with AdminClient(broker.admin_url) as admin:
            await admin.create_topic("/default/routed", partitions=3, dispatch_strategy="reliable")
            await admin.create_topic("/default/routed-other", dispatch_strategy="reliable")
    asyncio.run(setup())
    rows = [(f"v{i}".encode(), f"k{i % 4}", None if i % 5 else "/default/routed-other",
             {"i": str(i)}, 2 if i % 7 == 0 and i % 5 else None) for i in range(100)]
    frame = spark.createDataFrame(rows, "value BINARY, key STRING, topic STRING, attributes MAP<STRING,STRING>,"
                                        " partition INT")
    frame.write.format("danube").option("service_url", broker.url).option("topic", "/default/routed") \
        .option("compression", "zstd").mode("append").save()
    routed = read(spark, broker.url, "/default/routed").collect()
    other = read(spark, broker.url, "/default/routed-other").collect()
    assert sorted(int(r.attributes["i"]) for r in other) == [i for i in range(100) if i % 5 == 0]
    assert len(routed) == 80
    for row in routed:
        i = int(row.attributes["i"])
        assert row.value == f"v{i}".encode() and row.key == f"k{i % 4}"
        if i % 7 == 0:
            assert row.partition == 2
    by_key = {k: {r.partition for r in routed if r.key == k and int(r.attributes["i"]) % 7} for k in ("k0", "k1")}
    assert all(len(parts) == 1 for parts in by_key.values()), by_key


def test_lost_data_fails_the_query_with_its_range_or_is_skipped(spark: Any, tmp_path: Path) -> None:
    """Retention removes messages a query has not read (4 KiB segments, retention at
    once; no subscription holds them back, and the source holds none): with
    fail_on_data_loss the restarted query fails naming the range, without it goes on
    from the log's start."""
    env = {"DANUBE_POLICIES__DEDUPLICATION": "true", "DANUBE_STORAGE__WAL_SEGMENT_BYTES_MAX": "4096",
           "DANUBE_STORAGE__RETENTION_TIME_MS": "0", "DANUBE_STORAGE__RETENTION_CHECK_INTERVAL_MS": "200"}
    broker = start_broker(tmp_path, env=env)
    try:
        source, sink = "/default/lossy", "/default/lossy-out"
        asyncio.run(produce(broker.url, source, [b"early"] * 5, keys=0))
        checkpoint = tmp_path / "ckpt"
        stream_copy(spark, broker.url, source, sink, checkpoint)
        assert read(spark, broker.url, sink).count() == 5
        asyncio.run(produce(broker.url, source, [f"late{i}".encode().ljust(200, b".") for i in range(200)], keys=0))
        first = asyncio.run(log_start_above(broker.url, source, 5))
        asyncio.run(produce(broker.url, source, [f"after{i}".encode() for i in range(10)], keys=0))
        failed = stream_copy(spark, broker.url, source, sink, checkpoint)
        assert failed.exception() is not None
        assert f"{source}: offsets 5..{first - 1} were removed by retention" in str(failed.exception())
        assert "fail_on_data_loss=false skips them" in str(failed.exception())
        skipped = stream_copy(spark, broker.url, source, sink, checkpoint, fail_on_data_loss="false")
        assert skipped.exception() is None, skipped.exception()
        out = read(spark, broker.url, sink).collect()
        assert len(out) == 5 + 215 - first and sum(r.value.startswith(b"after") for r in out) == 10
    finally:
        assert broker.stop() == 0, broker.log()


async def log_start_above(url: str, topic: str, offset: int) -> int:
    """Where the topic's log starts, once retention removed `offset`: an earliest reader
    starts there (its cursor is one before)."""
    deadline = time.monotonic() + 30
    async with DanubeClient(url) as client:
        while True:
            async with await client.create_reader(topic, start="earliest") as reader:
                (bounds,) = (await reader.last_offsets()).values()
            if bounds.cursor + 1 > offset:
                return bounds.cursor + 1
            assert time.monotonic() < deadline, f"retention did not remove offset {offset} of {topic}"
            await asyncio.sleep(0.3)


ORDER_JSON = {"type": "object", "properties": {
    "id": {"type": "integer"}, "item": {"type": "string"},
    "lines": {"type": "array", "items": {"type": "object", "properties": {"sku": {"type": "string"},
                                                                          "qty": {"type": "integer"}}}}}}
ORDER_AVRO_V1 = {"type": "record", "name": "Order", "fields": [{"name": "id", "type": "long"},
                                                               {"name": "item", "type": "string"}]}
ORDER_AVRO_V2 = {**ORDER_AVRO_V1, "fields": [*ORDER_AVRO_V1["fields"],
                                             {"name": "price", "type": ["null", "double"], "default": None}]}


def test_values_decoded_by_the_topics_schema_into_struct_columns(spark: Any, broker: BrokerProcess) -> None:
    """value_format=schema: JSON Schema into nested structs; Avro read with its newest
    version, messages written with the first one resolved against it."""
    from danube_zmq.client.schemas import SchemaRegistryClient

    async def setup() -> None:
        async with SchemaRegistryClient(broker.url) as registry:
            await registry.register("orders-json", "json_schema", json.dumps(ORDER_JSON).encode())
            await registry.register("orders-avro", "avro", json.dumps(ORDER_AVRO_V1).encode())
        async with DanubeClient(broker.url) as client:
            producer = await client.create_producer("/default/orders-json", dispatch="reliable",
                                                    schema_subject="orders-json")
            for i in range(3):
                await producer.send({"id": i, "item": f"book{i}", "lines": [{"sku": "a", "qty": i}]})
            old = await client.create_producer("/default/orders-avro", dispatch="reliable",
                                               schema_subject="orders-avro")
            await old.send({"id": 1, "item": "pen"})
            await old.close()
        async with SchemaRegistryClient(broker.url) as registry:
            await registry.register("orders-avro", "avro", json.dumps(ORDER_AVRO_V2).encode())
        async with DanubeClient(broker.url) as client:
            new = await client.create_producer("/default/orders-avro", dispatch="reliable",
                                               schema_subject="orders-avro")
            await new.send({"id": 2, "item": "ink", "price": 3.5})
    asyncio.run(setup())
    frame = read(spark, broker.url, "/default/orders-json", value_format="schema", schema_subject="orders-json")
    assert frame.schema["value"].dataType.simpleString() == \
        "struct<id:bigint,item:string,lines:array<struct<qty:bigint,sku:string>>>"  # the registry sorts keys
    rows = frame.selectExpr("value.id", "value.item", "value.lines[0].qty AS qty").orderBy("id").collect()
    assert [(r.id, r.item, r.qty) for r in rows] == [(0, "book0", 0), (1, "book1", 1), (2, "book2", 2)]
    avro = read(spark, broker.url, "/default/orders-avro", value_format="schema", schema_subject="orders-avro")
    assert [tuple(r) for r in avro.select("value.*").orderBy("id").collect()] == [(1, "pen", None), (2, "ink", 3.5)]
    with pytest.raises(Exception, match="needs option\\('schema_subject'"):
        read(spark, broker.url, "/default/orders-avro", value_format="schema").count()


def test_a_task_waits_for_its_producer_name_held_by_an_earlier_attempt(spark: Any, broker: BrokerProcess) -> None:
    """A task retried after its executor died finds the name held until the broker
    times out the dead session: it waits for the name instead of failing."""
    from danube_zmq.client.sync import SyncClient

    holder = SyncClient(broker.url)
    holder.create_producer("/default/held", name="held-0", dispatch="reliable")
    release = threading.Timer(3.0, holder.close)
    release.start()
    started = time.monotonic()
    spark.createDataFrame([(b"x",)], "value BINARY").coalesce(1).write.format("danube") \
        .option("service_url", broker.url).option("topic", "/default/held").option("producer_name", "held") \
        .mode("append").save()
    assert time.monotonic() - started >= 2.5
    release.join()
    assert [r.value for r in read(spark, broker.url, "/default/held").collect()] == [b"x"]


def test_a_topics_pattern_reads_the_matching_topics_and_picks_up_new_ones(
        spark: Any, broker: BrokerProcess, tmp_path: Path) -> None:
    async def setup() -> None:
        async with AdminClient(broker.admin_url) as admin:
            await admin.create_namespace("patt")
    asyncio.run(setup())
    asyncio.run(produce(broker.url, "/patt/orders-eu", [b"eu"] * 30, partitions=2))
    asyncio.run(produce(broker.url, "/patt/orders-us", [b"us"] * 20))
    asyncio.run(produce(broker.url, "/patt/returns", [b"returns"] * 10))
    checkpoint, sink = tmp_path / "ckpt", "/default/pattern-out"

    def run() -> Any:
        query = (spark.readStream.format("danube").option("service_url", broker.url)
                 .option("topics_pattern", "/patt/orders-.*").option("starting_offsets", "earliest").load()
                 .selectExpr("value", "topic AS key").writeStream.format("danube").option("service_url", broker.url)
                 .option("topic", sink).option("checkpointLocation", str(checkpoint)).trigger(availableNow=True)
                 .start())
        query.awaitTermination(300)
        return Counter((r.key, r.value) for r in read(spark, broker.url, sink).collect())

    assert run() == {("/patt/orders-eu", b"eu"): 30, ("/patt/orders-us", b"us"): 20}
    asyncio.run(produce(broker.url, "/patt/orders-asia", [b"asia"] * 15, partitions=3))
    asyncio.run(produce(broker.url, "/patt/orders-us", [b"us"] * 5))
    assert run() == {("/patt/orders-eu", b"eu"): 30, ("/patt/orders-us", b"us"): 25,
                     ("/patt/orders-asia", b"asia"): 15}


def test_read_compacted_reads_the_latest_value_per_key_then_the_tail(spark: Any, broker: BrokerProcess) -> None:
    """Below the compaction horizon the compacted view (an empty value deletes its key),
    then every message after it; the lost-data check takes the view's gaps for what
    they are."""
    topic = "/default/compacted"

    async def setup() -> None:
        async with DanubeClient(broker.url) as client:
            producer = await client.create_producer(topic, dispatch="reliable")
            for version in range(4):
                for key in range(5):
                    await producer.send(f"k{key}v{version}".encode(), key=f"k{key}")
            await producer.send(b"", key="k4")  # a tombstone
            async with AdminClient(broker.admin_url) as admin:
                await admin.compact_topic(topic)
                await admin.wait_for_compaction(topic)
            await producer.send(b"k0v9", key="k0")  # after the horizon
    asyncio.run(setup())
    compacted = read(spark, broker.url, topic, read_compacted="true").collect()
    assert sorted(r.value for r in compacted) == [b"k0v3", b"k0v9", b"k1v3", b"k2v3", b"k3v3"]
    assert read(spark, broker.url, topic).count() == 22

"""Topics in a Spark pipeline: a topic to Parquet files, and a topic to windowed counts
to a topic, both exactly once (docs/spark.md).

    ./run spark-pipeline            # the demo: its own broker, 2,000 click events, both pipelines
    .venv/bin/python examples/spark_pipeline.py counts --service-url tcp://127.0.0.1:6650 \\
        --source /default/clicks --sink /default/click-counts --checkpoint ./ckpt-counts
    .venv/bin/python examples/spark_pipeline.py parquet --service-url tcp://127.0.0.1:6650 \\
        --source /default/clicks --out ./clicks-parquet --checkpoint ./ckpt-parquet

Events are JSON: {"user": "u3", "page": "/home", "ts": <ms since the epoch>}. The counts
are per user and 10-second window of event time, written when the watermark (event
time minus 5 s) passes the window's end: {"window_start": ..., "user": ..., "clicks": N}.
A pipeline runs until stopped with a trigger every second, or with --once until it has
read what its topic held at its start (Trigger.AvailableNow). Restarted with the same
--checkpoint, it goes on where it stopped: nothing is read twice or written twice.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from danube_zmq import DanubeClient
from danube_zmq.client.admin import AdminClient
from danube_zmq.spark import spark_session
from danube_zmq.transport.errors import DanubeError

EVENT = "user STRING, page STRING, ts BIGINT"


def clicks(spark: SparkSession, url: str, topic: str) -> DataFrame:
    """The topic's events as a stream of typed columns, with a watermark on event time."""
    raw = (spark.readStream.format("danube").option("service_url", url).option("topics", topic)
           .option("starting_offsets", "earliest").option("max_offsets_per_trigger", "50000").load())
    events = raw.select(F.from_json(F.col("value").cast("string"), EVENT).alias("e"), "offset").select("e.*", "offset")
    return events.withColumn("time", F.timestamp_millis("ts")).withWatermark("time", "5 seconds")


def counts_query(spark: SparkSession, url: str, source: str, sink: str, checkpoint: str, once: bool) -> Any:
    counted = clicks(spark, url, source).groupBy(F.window("time", "10 seconds"), "user").count()
    out = counted.select(
        F.col("user").alias("key"),
        F.to_json(F.struct(F.date_format("window.start", "yyyy-MM-dd'T'HH:mm:ss'Z'").alias("window_start"),
                           "user", F.col("count").alias("clicks"))).alias("value"))
    # After the aggregation's shuffle Spark gives no row order: the sink sorts each
    # task's rows so that a replayed micro-batch writes them in the same order.
    writer = (out.writeStream.format("danube").outputMode("append").option("service_url", url)
              .option("topic", sink).option("row_order", "sorted").option("checkpointLocation", checkpoint))
    return _trigger(writer, once).start()


def parquet_query(spark: SparkSession, url: str, source: str, out: str, checkpoint: str, once: bool) -> Any:
    writer = (clicks(spark, url, source).drop("time").writeStream.format("parquet").option("path", out)
              .option("checkpointLocation", checkpoint))
    return _trigger(writer, once).start()


def _trigger(writer: Any, once: bool) -> Any:
    return writer.trigger(availableNow=True) if once else writer.trigger(processingTime="1 second")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("pipeline", nargs="?", choices=("demo", "counts", "parquet"), default="demo")
    parser.add_argument("--service-url", help="the broker (the demo starts its own)")
    parser.add_argument("--source", default="/default/clicks")
    parser.add_argument("--sink", default="/default/click-counts")
    parser.add_argument("--out", help="parquet: the output directory")
    parser.add_argument("--checkpoint", help="the query's checkpoint directory")
    parser.add_argument("--once", action="store_true", help="read what is there now, then stop")
    parser.add_argument("--master", default="local[2]")
    args = parser.parse_args()
    if args.pipeline == "demo":
        return demo(args.master)
    if not args.service_url or not args.checkpoint or (args.pipeline == "parquet" and not args.out):
        parser.error("counts and parquet need --service-url and --checkpoint (parquet: --out too)")
    spark = spark_session(args.master, app_name=f"danube-{args.pipeline}")
    if args.pipeline == "counts":
        query = counts_query(spark, args.service_url, args.source, args.sink, args.checkpoint, args.once)
    else:
        query = parquet_query(spark, args.service_url, args.source, args.out, args.checkpoint, args.once)
    query.awaitTermination()
    spark.stop()


# ---------------------------------------------------------------- the demo


def demo(master: str) -> None:
    with tempfile.TemporaryDirectory(prefix="danube-spark-demo-") as work:
        url, admin_url = (f"tcp://127.0.0.1:{_free_port()}" for _ in range(2))
        broker = subprocess.Popen(
            [sys.executable, "-m", "danube_zmq.cli.main", "broker", "start", "--listen", url, "--admin-listen",
             admin_url, "--metrics-port", "0", "--data-dir", f"{work}/data"],
            env={**os.environ, "DANUBE_POLICIES__DEDUPLICATION": "true"})
        try:
            asyncio.run(_publish(url, admin_url))
            spark = spark_session(master, app_name="danube-demo")
            parquet_query(spark, url, "/default/clicks", f"{work}/clicks", f"{work}/ckpt-p", once=True).awaitTermination()
            stored = spark.read.parquet(f"{work}/clicks")
            print(f"parquet: {stored.count()} events in {work}/clicks, offsets"
                  f" {stored.agg(F.min('offset'), F.max('offset')).first()}")
            counts_query(spark, url, "/default/clicks", "/default/click-counts", f"{work}/ckpt-c", once=True) \
                .awaitTermination()
            rows = (spark.read.format("danube").option("service_url", url).option("topics", "/default/click-counts")
                    .option("starting_offsets", "earliest").load())
            counted = [json.loads(r.value) for r in rows.collect()]
            print(f"counts: {len(counted)} windows, {sum(c['clicks'] for c in counted)} clicks, e.g. {counted[:2]}")
            spark.stop()
        finally:
            broker.terminate()
            broker.wait(30)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def _publish(url: str, admin_url: str) -> None:
    deadline = time.monotonic() + 30
    while True:
        try:
            async with AdminClient(admin_url, timeout_ms=500) as admin:
                await admin.list_namespaces()
                break
        except DanubeError:
            if time.monotonic() > deadline:
                raise SystemExit("error: the demo's broker did not answer within 30 s") from None
            await asyncio.sleep(0.2)
    start = 1_767_225_600_000  # 2026-01-01T00:00:00Z
    async with DanubeClient(url) as client:
        producer = await client.create_producer("/default/clicks", dispatch="reliable", partitions=2)
        for i in range(2000):
            event = {"user": f"u{i % 5}", "page": f"/p{i % 3}", "ts": start + i * 50}
            producer.send_nowait(json.dumps(event).encode(), key=event["user"])
        # An event an hour later moves the watermark past every window above: all are written.
        await producer.send(json.dumps({"user": "u0", "page": "/", "ts": start + 3_600_000}).encode(), key="u0")
        await producer.flush()
        sink = await client.create_producer("/default/click-counts", dispatch="reliable")
        await sink.close()


if __name__ == "__main__":
    main()

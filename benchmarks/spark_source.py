"""Topics into Spark: rows/s into a DataFrame (batch and micro-batch) against reading the
same records from Parquet files; the end-to-end latency of a 1 s processing-time
trigger; whether the readers keep up with a producer at a target rate.

    .venv/bin/python benchmarks/spark_source.py --messages 1000000 --rounds 3

One broker and one Spark (`local[2]`) on this machine. `--messages` records of 100
bytes go to a reliable topic of 2 partitions; then, `--rounds` times each, side by side:

- `batch`: `spark.read.format("danube")` from earliest, every value's length summed
  (so every row is read); `parquet`: the same rows, written once to Parquet by Spark,
  read back and summed the same way.
- `micro-batch`: `spark.readStream.format("danube")` with Trigger.AvailableNow and
  `max_offsets_per_trigger` 250,000, into the `noop` sink.

Then `latency`: a producer sends 1,000 msg/s for `--latency-s` with its send time in
each payload; a query with a 1 s processing-time trigger copies them to another topic
(the exactly-once sink); a consumer there takes now minus the send time. And `keep-up`:
a producer at `--rate` msg/s for `--keep-up-s` while a query with a 1 s trigger reads
into `noop`; the offsets the query processed against those produced, each second.
Prints one JSON line per measurement; medians with min and max over rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import struct
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from e2e import standalone_broker  # benchmarks/ is on sys.path when a script here runs

from danube_zmq import DanubeClient
from danube_zmq.client.errors import ProducerQueueFull
from danube_zmq.spark import spark_session
from danube_zmq.transport.errors import Timeout

TOPIC = "/default/spark-bench"


async def fill(url: str, topic: str, count: int) -> float:
    async with DanubeClient(url) as client:
        producer = await client.create_producer(topic, dispatch="reliable", partitions=2, pending_messages_max=50_000)
        start = time.monotonic()
        payload = b"x" * 100
        for _ in range(count):
            while True:
                try:
                    producer.send_nowait(payload)
                    break
                except ProducerQueueFull:
                    await asyncio.sleep(0.001)
        await producer.flush()
        return count / (time.monotonic() - start)


def timed(action: Any) -> float:
    start = time.monotonic()
    action()
    return time.monotonic() - start


def summary(name: str, rates: list[float], **extra: Any) -> None:
    print(json.dumps({"measure": name, "median": round(statistics.median(rates)), "min": round(min(rates)),
                      "max": round(max(rates)), "runs": [round(r) for r in rates], **extra}), flush=True)


def bulk(spark: Any, url: str, count: int, rounds: int, work: Path) -> None:
    from pyspark.sql import functions as F

    def source() -> Any:
        return (spark.read.format("danube").option("service_url", url).option("topics", TOPIC)
                .option("starting_offsets", "earliest").load())

    def summed(frame: Any) -> None:
        total = frame.agg(F.sum(F.length("value"))).first()[0]
        assert total == count * 100, total

    source().write.parquet(str(work / "parquet"))
    batch, parquet, micro = [], [], []
    for round_ in range(rounds):
        batch.append(count / timed(lambda: summed(source())))
        parquet.append(count / timed(lambda: summed(spark.read.parquet(str(work / "parquet")))))
        checkpoint = work / f"ckpt-{round_}"
        query = (spark.readStream.format("danube").option("service_url", url).option("topics", TOPIC)
                 .option("starting_offsets", "earliest").option("max_offsets_per_trigger", "250000").load()
                 .writeStream.format("noop").option("checkpointLocation", str(checkpoint))
                 .trigger(availableNow=True))
        micro.append(count / timed(lambda q=query: q.start().awaitTermination()))
    summary("batch rows/s", batch, messages=count)
    summary("parquet rows/s", parquet, messages=count)
    summary("micro-batch rows/s", micro, messages=count, max_offsets_per_trigger=250_000)


def latency(spark: Any, url: str, seconds: float, work: Path) -> None:
    source, sink = "/default/spark-latency-in", "/default/spark-latency-out"
    asyncio.run(fill(url, source, 0))
    query = (spark.readStream.format("danube").option("service_url", url).option("topics", source)
             .option("starting_offsets", "latest").load().select("value")
             .writeStream.format("danube").option("service_url", url).option("topic", sink)
             .option("exactly_once", "false").option("checkpointLocation", str(work / "ckpt-latency"))
             .trigger(processingTime="1 second").start())
    samples: list[float] = []

    async def measure() -> None:
        async with DanubeClient(url) as client:
            await (await client.create_producer(sink, dispatch="reliable")).close()
            consumer = await client.subscribe(sink, "latency", initial_position="latest")
            producer = await client.create_producer(source, dispatch="reliable", partitions=2)
            await asyncio.sleep(3)  # the query's first micro-batch started

            sent = [0]

            async def send() -> None:
                end = time.monotonic() + seconds
                while time.monotonic() < end:
                    producer.send_nowait(struct.pack(">d", time.time()))
                    sent[0] += 1
                    await asyncio.sleep(0.001)

            sender = asyncio.create_task(send())
            deadline = time.monotonic() + seconds + 30
            while time.monotonic() < deadline and not (sender.done() and len(samples) >= sent[0]):
                try:
                    batch = await consumer.batch_receive(timeout=1)
                except Timeout:
                    continue  # none this second
                now = time.time()
                samples.extend((now - struct.unpack(">d", m.payload)[0]) * 1000 for m in batch)
                await consumer.ack(batch)
            await sender
            assert len(samples) == sent[0], (len(samples), sent[0])
    asyncio.run(measure())
    query.stop()
    samples.sort()
    print(json.dumps({"measure": "latency ms, 1 s trigger, topic to topic", "messages": len(samples),
                      "p50": round(samples[len(samples) // 2]), "p99": round(samples[int(len(samples) * 0.99)]),
                      "max": round(samples[-1])}), flush=True)


def keep_up(spark: Any, url: str, rate: int, seconds: float, work: Path) -> None:
    topic = "/default/spark-keep-up"
    asyncio.run(fill(url, topic, 0))
    query = (spark.readStream.format("danube").option("service_url", url).option("topics", topic)
             .option("starting_offsets", "earliest").load().writeStream.format("noop")
             .option("checkpointLocation", str(work / "ckpt-keep-up")).trigger(processingTime="1 second").start())
    produced = [0]

    async def produce() -> None:
        async with DanubeClient(url) as client:
            producer = await client.create_producer(topic, dispatch="reliable", partitions=2,
                                                    pending_messages_max=100_000)
            start = time.monotonic()
            while (elapsed := time.monotonic() - start) < seconds:
                due = int(elapsed * rate)
                while produced[0] < due:
                    try:
                        producer.send_nowait(b"x" * 100)
                        produced[0] += 1
                    except ProducerQueueFull:
                        break  # the producer falls behind: on at the next tick
                await asyncio.sleep(0.005)
            await producer.flush()

    thread = threading.Thread(target=lambda: asyncio.run(produce()))
    thread.start()
    thread.join()
    sent = produced[0]
    deadline = time.monotonic() + 120
    while sum(p["numInputRows"] for p in query.recentProgress) < sent and time.monotonic() < deadline:
        time.sleep(0.5)
    progress = [p for p in query.recentProgress if p["numInputRows"]]
    caught_up_s = time.monotonic() - (deadline - 120)
    query.stop()
    rates = [p["numInputRows"] / max(p["durationMs"]["triggerExecution"] / 1000, 0.001) for p in progress]
    print(json.dumps({"measure": "keep-up", "target_msg_s": rate, "produced_msg_s": round(sent / seconds),
                      "read": sum(p["numInputRows"] for p in progress), "sent": sent,
                      "caught_up_after_producer_s": round(caught_up_s, 1),
                      "read_rows_s_median_per_batch": round(statistics.median(rates)) if rates else 0}), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--latency-s", type=float, default=20)
    parser.add_argument("--rate", type=int, default=100_000)
    parser.add_argument("--keep-up-s", type=float, default=30)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="danube-spark-bench-"))
    try:
        with standalone_broker("danube-spark-bench-") as (url, _admin_url, _broker, _data):
            fill_rate = asyncio.run(fill(url, TOPIC, args.messages))
            print(json.dumps({"measure": "fill msg/s", "value": round(fill_rate)}), flush=True)
            spark = spark_session("local[2]", app_name="danube-spark-bench")
            try:
                bulk(spark, url, args.messages, args.rounds, work)
                latency(spark, url, args.latency_s, work)
                keep_up(spark, url, args.rate, args.keep_up_s, work)
            finally:
                spark.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

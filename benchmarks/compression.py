"""Compression per codec on JSON-like payloads: bytes on the wire and on disk, and
msg/s producing and consuming.

    .venv/bin/python benchmarks/compression.py --messages 100000

One broker; for each codec (none, lz4, zstd, snappy, zlib) a reliable topic of its own:
one producer sends `--messages` JSON records of about 1 KiB (ids, names, e-mails, a
list of 8 items, a sentence; each record different) as fast as it goes (to the last
receipt), then one Exclusive consumer reads them all back (decompressed, acknowledged).
`wire_mb` is what the topic took in (`bytes_in`: payloads as sent, keys and
attributes), `disk_mb` the topic's WAL files. Prints one JSON line per codec.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path

from e2e import standalone_broker  # benchmarks/ is on sys.path when a script here runs

from danube_zmq import DanubeClient
from danube_zmq.client.admin import AdminClient
from danube_zmq.transport.compression import CODECS
from danube_zmq.transport.errors import DanubeError


def record(i: int) -> bytes:
    return json.dumps({"id": i, "user": f"user-{i % 997}", "email": f"user{i % 997}@example.com",
                       "active": i % 2 == 0, "created": 1_764_000_000_000 + i * 17,
                       "items": [{"sku": f"sku-{(i * 7 + j) % 5000}", "qty": (i + j) % 9 + 1,
                                  "price": round(1.5 + (i * j) % 300 / 7, 2)} for j in range(8)],
                       "note": f"order {i} shipped to warehouse {i % 31} in region {i % 7}"}).encode()


async def _run_codec(url: str, admin_url: str, data_dir: Path, codec: str | None, payloads: list[bytes]) -> dict:
    topic = f"/default/compression-{codec or 'none'}"
    async with DanubeClient(url) as client:
        consumer = await client.subscribe(topic, "bench", sub_type="exclusive", receiver_queue_size=5000)
        producer = await client.create_producer(topic, dispatch="reliable", compression=codec,
                                                pending_messages_max=50_000)
        start = time.monotonic()
        for payload in payloads:
            while True:
                try:
                    producer.send_nowait(payload)
                    break
                except DanubeError:  # the pending queue is full
                    await asyncio.sleep(0.001)
        await producer.flush()
        produce_s = time.monotonic() - start
        start = time.monotonic()
        received = 0
        while received < len(payloads):
            batch = await consumer.batch_receive(timeout=30)
            received += len(batch)
            await consumer.ack(batch)
        consume_s = time.monotonic() - start
    async with AdminClient(admin_url) as admin:
        (partition,) = (await admin.describe_topic(topic)).partitions
    disk = sum(p.stat().st_size for p in data_dir.rglob("*.wal") if f"compression-{codec or 'none'}" in str(p))
    raw = sum(map(len, payloads))
    return {"codec": codec or "none", "messages": len(payloads), "raw_mb": round(raw / 2**20, 1),
            "wire_mb": round(partition.bytes_in / 2**20, 1), "disk_mb": round(disk / 2**20, 1),
            "ratio": round(raw / partition.bytes_in, 2), "produce_msg_s": round(len(payloads) / produce_s),
            "consume_msg_s": round(len(payloads) / consume_s)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=100_000)
    args = parser.parse_args()
    payloads = [record(i) for i in range(args.messages)]
    with standalone_broker("danube-bench-compression-") as (url, admin_url, _, data_dir):
        for codec in (None, *CODECS):
            print(json.dumps(asyncio.run(_run_codec(url, admin_url, data_dir, codec, payloads))), flush=True)


if __name__ == "__main__":
    main()

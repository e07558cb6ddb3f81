"""WAL snapshots: take one, read its manifest and its Parquet files without a broker.

1. Publishes 500 messages to a reliable topic with 2 partitions and has a subscription
   acknowledge the first 100 of each partition.
2. Asks the broker for a snapshot of that topic (`AdminClient.create_snapshot`, like
   `danube admin snapshots create --topic ...`).
3. Opens the snapshot location the broker reports (a path here; s3://, gs://, az://
   work the same) and reads the manifest and the records with pyarrow, the way Spark's
   `danube_snapshots` data source does, and computes each partition's backlog from them.

Run against a broker (`.venv/bin/danube broker start`):

    python examples/snapshots.py [tcp://127.0.0.1:6650]

The broker URL comes from argv[1], else $DANUBE_SERVICE_URL, else tcp://127.0.0.1:6650;
the admin URL from $DANUBE_ADMIN_ENDPOINT, else tcp://127.0.0.1:50051.
"""

from __future__ import annotations

import asyncio
import os
import sys
import uuid

import pyarrow.parquet as pq

from danube_zmq import DanubeClient, SubType
from danube_zmq.client.admin import AdminClient
from danube_zmq.snapshots.store import SnapshotStore

SERVICE_URL = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("DANUBE_SERVICE_URL", "tcp://127.0.0.1:6650")
ADMIN_URL = os.environ.get("DANUBE_ADMIN_ENDPOINT", "tcp://127.0.0.1:50051")
TOPIC = f"/default/example-snapshots-{uuid.uuid4().hex[:8]}"


class ExampleFailed(Exception):
    """What the example expected did not happen."""


def check(condition: bool, message: str) -> None:
    if not condition:
        raise ExampleFailed(message)


def read_rows(store: SnapshotStore, path: str) -> list[dict[str, object]]:
    """A records file as rows. Closed here, and read without Arrow's I/O threads: a
    Python file object left to Arrow's threads can abort the interpreter at exit
    (apache/arrow#34314, seen here as exit -6)."""
    with store.open_read(path) as file:
        return pq.read_table(file, use_threads=False, pre_buffer=False).to_pylist()


async def main() -> None:
    async with DanubeClient(SERVICE_URL, request_timeout_ms=3000) as client:
        producer = await client.create_producer(TOPIC, dispatch="reliable", partitions=2)
        consumer = await client.subscribe(TOPIC, "audit", sub_type=SubType.EXCLUSIVE, initial_position="earliest")
        for i in range(500):
            producer.send_nowait(f"event-{i}".encode(), key=f"user-{i % 10}")
        await producer.flush()
        acked = 0
        while acked < 200:
            msg = await consumer.receive(timeout=5)
            if msg.offset < 100:
                await consumer.ack(msg)
                acked += 1
        await consumer.flush_acks()
        await consumer.close()
    await asyncio.sleep(0.3)  # the cursors reach the broker

    async with AdminClient(ADMIN_URL) as admin:
        created = await admin.create_snapshot(TOPIC)
    print(f"snapshot {created.snapshot.snapshot_id}: {created.snapshot.records} records in"
          f" {created.snapshot.files} files at {created.url}")

    store = SnapshotStore(created.url)
    manifest = store.manifest(created.snapshot.snapshot_id)
    for topic in manifest.topics:
        rows = [row for f in topic.files for row in read_rows(store, f.path)]
        audit = next(s for s in topic.subscriptions if s.name == "audit")
        backlog = sum(1 for r in rows if r["offset"] > audit.cursor and r["offset"] not in audit.acked_above)
        print(f"{topic.topic}: offsets {topic.log_start_offset}..{topic.end_offset - 1}, audit cursor"
              f" {audit.cursor}, backlog {backlog} (broker says {audit.backlog_messages})")
        check(len(rows) == topic.end_offset - topic.log_start_offset, "the files do not hold every record")
        check(audit.cursor == 99 and backlog == audit.backlog_messages, "backlog does not match the broker's")


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except ExampleFailed as failure:
        sys.exit(f"example failed: {failure}")

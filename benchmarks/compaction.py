"""Topic compaction: how fast a topic is compacted, what producers see meanwhile, and
how fast the compacted view is read.

    .venv/bin/python benchmarks/compaction.py --messages 1000000 --keys 10000

One broker. `--messages` reliable messages of `--size` bytes over `--keys` keys (round
robin, so each key has messages/keys versions) are sent as fast as one producer goes.
Then, in one run:

- `produce_msg_s` / `produce_ack_p99_ms`: a producer sending one message at a time for
  `--seconds` s while nothing else runs (the baseline) ...
- `produce_during_msg_s` / `produce_during_ack_p99_ms`: ... and the same while the topic
  is compacted (`compact_topic`, then polled until done);
- `compact_s` / `compact_msg_s`: from the request to `done`, and messages compacted per
  second; `ledger_mb` against `wal_mb`;
- `read_compacted_msg_s`: a `read_compacted` reader reading the whole view, and
  `read_plain_msg_s` a plain reader reading the same number of messages from the log.

Prints one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from pathlib import Path

from e2e import standalone_broker  # benchmarks/ is on sys.path when a script here runs

from danube_zmq import DanubeClient
from danube_zmq.client.admin import AdminClient
from danube_zmq.transport.errors import DanubeError


async def _fill(url: str, topic: str, messages: int, keys: int, size: int) -> float:
    payload = b"x" * size
    async with DanubeClient(url) as client:
        producer = await client.create_producer(topic, dispatch="reliable", pending_messages_max=50_000)
        start = time.monotonic()
        for i in range(messages):
            while True:
                try:
                    producer.send_nowait(payload, key=f"key-{i % keys}")
                    break
                except DanubeError:  # the pending queue is full
                    await asyncio.sleep(0.001)
        await producer.flush()
        return messages / (time.monotonic() - start)


async def _produce_while(url: str, topic: str, size: int, busy: asyncio.Future[object] | None,
                         seconds: float) -> dict:
    """Send one message at a time: for `seconds`, or until `busy` is done."""
    payload = b"y" * size
    acks: list[float] = []
    async with DanubeClient(url) as client:
        producer = await client.create_producer(topic, dispatch="reliable")
        end = time.monotonic() + seconds
        while time.monotonic() < end if busy is None else not busy.done():
            sent = time.monotonic()
            await producer.send(payload, key=f"live-{len(acks) % 100}")
            acks.append(time.monotonic() - sent)
    elapsed = sum(acks)
    acks.sort()
    return {"msg_s": round(len(acks) / elapsed) if elapsed else 0,
            "ack_p99_ms": round(acks[int(len(acks) * 0.99)] * 1000, 2) if acks else None}


async def _compact(admin_url: str, topic: str) -> float:
    async with AdminClient(admin_url) as admin:
        start = time.monotonic()
        await admin.compact_topic(topic)
        await admin.wait_for_compaction(topic, timeout_s=3600)
        return time.monotonic() - start


async def _read(url: str, topic: str, compacted: bool, count: int) -> float:
    async with DanubeClient(url) as client:
        reader = await client.create_reader(topic, start="earliest", read_compacted=compacted,
                                            receiver_queue_size=5000)
        start = time.monotonic()
        for _ in range(count):
            await reader.read_next(timeout=60)
        return count / (time.monotonic() - start)


async def _run(url: str, admin_url: str, data_dir: Path, args: argparse.Namespace) -> dict:
    topic = f"/default/compaction-bench-{os.getpid()}"
    fill_rate = await _fill(url, topic, args.messages, args.keys, args.size)
    quiet = await _produce_while(url, topic, args.size, None, args.seconds)
    compaction = asyncio.ensure_future(_compact(admin_url, topic))
    during = await _produce_while(url, topic, args.size, compaction, 0)
    compact_s = await compaction
    ledger_bytes = sum(p.stat().st_size for p in data_dir.rglob("*.compacted"))
    wal_bytes = sum(p.stat().st_size for p in data_dir.rglob("*.wal"))
    view = args.keys + 100  # the live keys written meanwhile
    read_compacted = await _read(url, topic, True, view)
    read_plain = await _read(url, topic, False, view)
    return {"messages": args.messages, "keys": args.keys, "size": args.size, "fill_msg_s": round(fill_rate),
            "produce_msg_s": quiet["msg_s"], "produce_ack_p99_ms": quiet["ack_p99_ms"],
            "produce_during_msg_s": during["msg_s"], "produce_during_ack_p99_ms": during["ack_p99_ms"],
            "compact_s": round(compact_s, 2), "compact_msg_s": round(args.messages / compact_s),
            "ledger_mb": round(ledger_bytes / 2**20, 2), "wal_mb": round(wal_bytes / 2**20, 1),
            "read_compacted_msg_s": round(read_compacted), "read_plain_msg_s": round(read_plain)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--seconds", type=float, default=5.0)
    args = parser.parse_args()
    with standalone_broker("danube-bench-compaction-") as (url, admin_url, _, data_dir):
        result = asyncio.run(_run(url, admin_url, data_dir, args))
    print(json.dumps(result))


if __name__ == "__main__":
    main()

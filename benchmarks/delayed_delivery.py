"""Delayed delivery: how late a delayed message comes, and what holding many costs.

    .venv/bin/python benchmarks/delayed_delivery.py precision --messages 20000
    .venv/bin/python benchmarks/delayed_delivery.py held --messages 2000000

precision: one broker, a Shared subscription with one consumer; `--messages` reliable
messages of 100 bytes, each `deliver_at_ms` spread evenly over `--spread-s` seconds
starting 2 s after the send begins. The consumer notes when each arrives (this
machine's clock, as the broker's). Prints the lateness (arrival - deliver_at) at p50,
p99 and max, and how many came early (must be 0).

held: `--messages` reliable messages due an hour later, sent as fast as the producer
goes; once the subscription holds them all (`topics describe`), prints the broker's RSS
before and after, the bytes of its runs on disk, and the send rate. `--plain` sends
the same messages without a time to a subscription with no consumer (the backlog a
Shared subscription would read through), for comparison.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from pathlib import Path

import psutil
from e2e import standalone_broker  # benchmarks/ is on sys.path when a script here runs

from danube_zmq import DanubeClient, SubType
from danube_zmq.client.admin import AdminClient
from danube_zmq.transport.client_protocol import DELIVER_AT
from danube_zmq.transport.errors import DanubeError, Timeout


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


async def _send(url: str, topic: str, times: list[int | None]) -> float:
    """Send one message per entry of `times` (a deliver_at_ms, or None); returns msg/s."""
    filler = b"x" * 100
    async with DanubeClient(url) as client:
        producer = await client.create_producer(topic, dispatch="reliable", pending_messages_max=50_000)
        start = time.monotonic()
        for at in times:
            while True:
                try:
                    producer.send_nowait(filler, deliver_at_ms=at)
                    break
                except DanubeError:  # the pending queue is full
                    await asyncio.sleep(0.001)
        await producer.flush()
        return len(times) / (time.monotonic() - start)


async def _precision(url: str, topic: str, count: int, spread_s: float) -> dict:
    async with DanubeClient(url) as client:
        consumer = await client.subscribe(topic, "jobs", sub_type=SubType.SHARED, receiver_queue_size=1000)
        base = _now_ms() + 2000
        times = [base + int(i * spread_s * 1000 / count) for i in range(count)]
        send_rate = await _send(url, topic, times)
        late: list[int] = []
        while len(late) < count:
            try:
                message = await consumer.receive(timeout=spread_s + 30)
            except Timeout:
                break
            late.append(_now_ms() - int(message.attributes[DELIVER_AT]))
            await consumer.ack(message)
    late.sort()
    return {"mode": "precision", "messages": count, "received": len(late), "send_msg_s": round(send_rate),
            "early": sum(1 for v in late if v < 0),
            "late_ms": {"p50": late[len(late) // 2], "p99": late[int(len(late) * 0.99)], "max": late[-1]}
            if late else None}


async def _held(url: str, admin_url: str, topic: str, count: int, plain: bool, broker: psutil.Process,
                spill: Path) -> dict:
    async with DanubeClient(url) as client:
        await client.subscribe(topic, "jobs", sub_type=SubType.SHARED)
        rss_before = broker.memory_info().rss
        due = _now_ms() + 3_600_000
        send_rate = await _send(url, topic, [None if plain else due] * count)
        deadline = time.monotonic() + 600
        held = 0
        while time.monotonic() < deadline:
            async with AdminClient(admin_url) as admin:
                (partition,) = (await admin.describe_topic(topic)).partitions
            info = partition.subscriptions[0]
            held = info.backlog_messages if plain else info.delayed_messages
            if held >= count:
                break
            await asyncio.sleep(0.5)
        rss_after = broker.memory_info().rss
    spill_bytes = sum(f.stat().st_size for f in spill.rglob("*.run")) if spill.exists() else 0
    return {"mode": "held", "plain": plain, "messages": count, "held": held, "send_msg_s": round(send_rate),
            "rss_mb_before": round(rss_before / 2**20, 1), "rss_mb_after": round(rss_after / 2**20, 1),
            "spill_mb": round(spill_bytes / 2**20, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=["precision", "held"])
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--spread-s", type=float, default=10.0)
    parser.add_argument("--plain", action="store_true", help="held: messages without a time, for comparison")
    args = parser.parse_args()
    topic = f"/default/delayed-bench-{os.getpid()}"
    with standalone_broker("danube-bench-delayed-") as (url, admin_url, broker, data_dir):
        if args.mode == "precision":
            result = asyncio.run(_precision(url, topic, args.messages, args.spread_s))
        else:
            spill = data_dir / "durable-cache" / "default" / topic.rsplit("/", 1)[1] / "delayed"
            result = asyncio.run(_held(url, admin_url, topic, args.messages, args.plain,
                                       psutil.Process(broker.pid), spill))
    print(json.dumps(result))


if __name__ == "__main__":
    main()

"""How long a `local`-mode move of a reliable topic takes with N MiB of unacked backlog
(issue 19 section 2), on loopback under `danube cluster up --brokers 3` (default config:
storage.mode local, 1 MiB chunks): the backlog is produced with a subscription holding
it, then `topics unload` is timed until it answers (the WAL handed over and ownership
switched), then the consumer reads the whole backlog from the new owner.

    .venv/bin/python benchmarks/local_move.py [--mib 1 16 64] [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import tempfile
import time
from pathlib import Path

from cluster import danube

from danube_zmq import DanubeClient
from danube_zmq.client.admin import AdminClient

_PAYLOAD = 64 * 1024


async def one_move(urls: list[str], admin_url: str, mib: int) -> dict[str, float]:
    topic = f"/default/backlog-{mib}"
    count = mib * 1024 * 1024 // _PAYLOAD
    async with DanubeClient(urls[0]) as client:
        producer = await client.create_producer(topic, dispatch="reliable")
        await producer.send(b"first")
        await (await client.subscribe(topic, "held", initial_position="earliest")).close()
        for start in range(0, count, 32):
            await asyncio.gather(*(producer.send(b"x" * _PAYLOAD) for _ in range(min(32, count - start))))
        await producer.close()
        before = await client.lookup(topic)
    async with AdminClient(admin_url, timeout_ms=300_000) as admin:
        started = time.monotonic()
        await admin.unload_topic(topic)
        moved_s = time.monotonic() - started
    async with DanubeClient(urls[1]) as client:
        deadline = time.monotonic() + 10
        while await client.lookup(topic) == before:  # this broker applies the switch a moment later
            assert time.monotonic() < deadline, "the topic did not move"
            await asyncio.sleep(0.05)
        consumer = await client.subscribe(topic, "held", initial_position="earliest")
        started = time.monotonic()
        offsets = []
        for _ in range(count + 1):
            message = await consumer.receive(timeout=60)
            offsets.append(message.offset)
            await consumer.ack(message)
        read_s = time.monotonic() - started
    assert offsets == list(range(count + 1)), "backlog not whole after the move"
    return {"mib": mib, "move_s": round(moved_s, 3), "mib_per_s": round(mib / moved_s, 1),
            "backlog_read_s": round(read_s, 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mib", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--json", type=Path)
    parser.add_argument("--base-port", type=int, default=44500)
    parser.add_argument("--data-dir", type=Path, help="keep the cluster (and its logs) here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() if args.data_dir is None else contextlib.nullcontext(str(args.data_dir)) as tmp:
        root = Path(tmp)
        base = args.base_port
        out = danube("cluster", "up", "--brokers", "3", "--data-dir", str(root / "cluster"), "--client-port", str(base),
                     "--admin-port", str(base + 100), "--raft-port", str(base + 200), "--supervisor-port",
                     str(base + 300), "--metrics-port", "0", "--output", "json")
        layout = json.loads(out)
        try:
            urls = [b["url"] for b in layout["brokers"]]
            admin_url = layout["brokers"][0]["admin_url"]
            results = [asyncio.run(one_move(urls, admin_url, mib)) for mib in args.mib]
        finally:
            danube("cluster", "down", "--data-dir", str(root / "cluster"))
    print(json.dumps(results, indent=2))
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()

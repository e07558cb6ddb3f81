"""Acknowledged means durable: kill -9 the broker while a producer streams reliable
messages, restart it, and check that a consumer from the earliest offset receives every
acknowledged message at least once, in order, with no gaps.

The default run checks 2 seeds; the slow suite checks 10 (`tox -e slow` every one; CI's
`tox -e full` 2 a day in rotation, all 10 over 5 consecutive days: tests/rotation.py).
Each run prints the number of duplicates (messages stored although their acknowledgement
was lost in the crash, then sent again by the client). With the `deduplication` policy
on there are none: the client's resends are answered with their first offsets."""

from __future__ import annotations

import asyncio
import functools
import json
import random
import signal
import struct
from pathlib import Path

import pytest

from danube_zmq import DanubeClient, SubType
from danube_zmq.transport.errors import DanubeError, Timeout
from tests.integration.storage.test_durable_topics import broker_env
from tests.rotation import rotating

MESSAGES = 100_000


async def crash_run(broker_factory, seed: int, kills: int, env: dict[str, str] | None = None) -> dict[str, int]:
    rng = random.Random(seed)
    broker = broker_factory(env=env)
    acked: set[int] = set()
    failed: set[int] = set()
    killed_at: list[int] = []

    def on_done(seq: int):
        def record(error: BaseException | None, message_id: object) -> None:
            (failed if error is not None else acked).add(seq)
        return record

    async with DanubeClient(broker.url, request_timeout_ms=3000) as client:
        producer = await client.create_producer("/default/crash", dispatch="reliable", name="streamer")

        async def stream() -> None:
            for seq in range(MESSAGES):
                while True:
                    try:
                        producer.send_nowait(struct.pack(">Q", seq), callback=on_done(seq))
                        break
                    except DanubeError:  # the pending queue is full: wait for room
                        await asyncio.sleep(0.005)
            try:
                await producer.flush()
            except DanubeError:
                pass

        async def kill_and_restart() -> None:
            nonlocal broker
            loop = asyncio.get_running_loop()
            # Each kill lands at a seeded point of the stream, measured in acknowledged
            # messages, so it always interrupts sends in flight.
            for threshold in sorted(rng.sample(range(MESSAGES // 10, MESSAGES * 9 // 10), kills)):
                while len(acked) < threshold:
                    await asyncio.sleep(0.001)
                broker.stop(signal.SIGKILL)
                killed_at.append(len(acked))
                restart = functools.partial(broker_factory, env=env, url=broker.url, admin_url=broker.admin_url)
                broker = await loop.run_in_executor(None, restart)

        await asyncio.gather(stream(), kill_and_restart())
        for _ in range(200):  # every send settles: acknowledged or failed
            if len(acked) + len(failed) == MESSAGES:
                break
            await asyncio.sleep(0.05)

        consumer = await client.subscribe("/default/crash", f"check-{seed}", sub_type=SubType.EXCLUSIVE,
                                          initial_position="earliest", receiver_queue_size=5000)
        received: list[int] = []
        while True:
            try:
                msg = await consumer.receive(timeout=3)
            except Timeout:
                break
            received.append(struct.unpack(">Q", msg.payload)[0])
            await consumer.ack(msg)

    seen = set(received)
    lost = acked - seen
    assert not lost, f"seed {seed}: {len(lost)} acknowledged messages lost, e.g. {sorted(lost)[:10]}"
    firsts = list(dict.fromkeys(received))
    assert firsts == sorted(firsts), f"seed {seed}: messages out of order"
    assert len(killed_at) == kills and all(k < MESSAGES for k in killed_at), killed_at
    report = {"seed": seed, "killed_at_acked": killed_at, "acked": len(acked), "failed": len(failed),
              "stored": len(received), "duplicates": len(received) - len(seen)}
    print(f"crash run {json.dumps(report)}")
    return report


@pytest.mark.parametrize("seed", [1, 2])
async def test_acked_messages_survive_kill_9(broker_factory, seed: int) -> None:
    """Two seeded runs with one kill -9 each: no acknowledged message is lost."""
    report = await crash_run(broker_factory, seed, kills=1)
    assert report["acked"] > 0


async def test_with_deduplication_each_message_is_stored_exactly_once_across_kill_9(broker_factory,
                                                                                     tmp_path: Path) -> None:
    """Three kill -9 in one seeded run, the topic deduplicating: nothing acknowledged is
    lost and nothing is stored twice. In `shared_fs` with `seal_every_flush` a receipt
    waits for its segment's upload, so every kill finds batches written and not yet
    acknowledged, which the client sends again (without deduplication this run stores
    them twice; the runs above do so when a kill happens to land there: 1,000 to 3,000
    a run in CI)."""
    env = {**broker_env("shared_fs", str(tmp_path / "shared"), {}), "DANUBE_STORAGE__SEAL_EVERY_FLUSH": "true",
           "DANUBE_POLICIES__DEDUPLICATION": "true"}
    report = await crash_run(broker_factory, 3, kills=3, env=env)
    assert report["acked"] > 0
    assert report["duplicates"] == 0, report


@pytest.mark.slow
@pytest.mark.parametrize("seed", rotating(range(100, 110), runs=5))
async def test_acked_messages_survive_repeated_kill_9(broker_factory, seed: int) -> None:
    """Ten seeded runs with three kill -9 each: no acknowledged message is lost."""
    report = await crash_run(broker_factory, seed, kills=3)
    assert report["acked"] > 0

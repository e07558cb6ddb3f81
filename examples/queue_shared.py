"""A work queue with a Shared subscription.

Three consumers attach to the same Shared subscription "workers"; the broker deals
the 30 published jobs out among them (round robin, as permits allow), so each job is
processed by exactly one worker and every worker gets a share.

    python examples/queue_shared.py [tcp://127.0.0.1:6650]

The broker URL comes from argv[1], else $DANUBE_SERVICE_URL, else tcp://127.0.0.1:6650.
"""

from __future__ import annotations

import asyncio
import os
import sys

from danube_zmq import Consumer, DanubeClient, DanubeError, SubType, Timeout

SERVICE_URL = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("DANUBE_SERVICE_URL", "tcp://127.0.0.1:6650")
TOPIC = "/default/example-queue-shared"
JOBS = 30


class ExampleFailed(Exception):
    """What the example expected did not happen."""


def check(condition: bool, message: str) -> None:
    if not condition:
        raise ExampleFailed(message)


async def work(consumer: Consumer, done: list[bytes]) -> None:
    """Take jobs until none arrives for a second."""
    while True:
        try:
            job = await consumer.receive(timeout=1.0)
        except Timeout:
            return
        done.append(job.payload)
        await consumer.ack(job)


async def main() -> None:
    async with DanubeClient(SERVICE_URL, request_timeout_ms=3000) as client:
        producer = await client.create_producer(TOPIC)
        workers = [
            await client.subscribe(TOPIC, "workers", sub_type=SubType.SHARED, consumer_name=f"worker-{i}")
            for i in range(3)
        ]
        for i in range(JOBS):
            await producer.send(f"job-{i}")
        print(f"queued {JOBS} jobs on {TOPIC}")

        done: list[list[bytes]] = [[] for _ in workers]
        await asyncio.gather(*(work(w, d) for w, d in zip(workers, done, strict=True)))
        for worker, jobs in zip(workers, done, strict=True):
            print(f"{worker.consumer_name} did {len(jobs)} jobs: {b' '.join(jobs).decode()}")

        everything = [job for jobs in done for job in jobs]
        check(len(everything) == JOBS, f"{len(everything)} jobs done, expected {JOBS}")
        check(len(set(everything)) == JOBS, "some job was delivered twice")
        check(all(done), "some worker got no job")
    print("OK")


if __name__ == "__main__":
    try:
        asyncio.run(asyncio.wait_for(main(), 30))
    except ExampleFailed as exc:
        raise SystemExit(f"FAILED: {exc}") from None
    except (DanubeError, TimeoutError) as exc:
        raise SystemExit(f"FAILED: {type(exc).__name__}: {exc}") from None

"""Batching and asynchronous sends: `send_nowait` with callbacks, then `flush`.

`send_nowait` queues a message and returns at once (a `PendingSend`, awaitable for
the `MessageId`); the producer packs queued messages into batches (a batch leaves at
once when nothing is in flight, else when the pipe drains, at `batch_messages_max`
messages or after `batch_delay_ms` milliseconds) and keeps several batches in flight. A callback per message reports
its `MessageId` or error. When `pending_messages_max` messages are pending,
`send_nowait` raises `ProducerQueueFull`: this example then waits with `flush` and
goes on (backpressure). A consumer reads along, a batch at a time with
`batch_receive` and one `ack` per batch; the script prints the throughput.

    python examples/batching_async_send.py [tcp://127.0.0.1:6650]

The broker URL comes from argv[1], else $DANUBE_SERVICE_URL, else tcp://127.0.0.1:6650.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time

from danube_zmq import Consumer, DanubeClient, DanubeError, MessageId, ProducerQueueFull, SubType, Timeout

SERVICE_URL = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("DANUBE_SERVICE_URL", "tcp://127.0.0.1:6650")
TOPIC = "/default/example-batching"
MESSAGES = 20_000


class ExampleFailed(Exception):
    """What the example expected did not happen."""


def check(condition: bool, message: str) -> None:
    if not condition:
        raise ExampleFailed(message)


async def count_received(consumer: Consumer) -> int:
    received = 0
    while True:
        try:
            messages = await consumer.batch_receive(timeout=1.0)
        except Timeout:
            return received
        await consumer.ack(messages)
        received += len(messages)


async def main() -> None:
    async with DanubeClient(SERVICE_URL, request_timeout_ms=3000) as client:
        producer = await client.create_producer(
            TOPIC, batch_messages_max=500, batch_delay_ms=5, pending_messages_max=5_000
        )
        consumer = await client.subscribe(TOPIC, "reader", sub_type=SubType.EXCLUSIVE, receiver_queue_size=5_000)
        reader = asyncio.create_task(count_received(consumer))

        acked: list[MessageId] = []
        errors: list[DanubeError] = []

        def on_sent(error: DanubeError | None, message_id: MessageId | None) -> None:
            if error is not None:
                errors.append(error)
            else:
                assert message_id is not None
                acked.append(message_id)

        payload = b"x" * 100
        queue_full = 0
        started = time.perf_counter()
        for i in range(MESSAGES):
            while True:
                try:
                    producer.send_nowait(payload, attributes={"seq": str(i)}, callback=on_sent)
                    break
                except ProducerQueueFull:
                    queue_full += 1
                    await producer.flush(timeout=10)  # backpressure: wait for the receipts
        await producer.flush(timeout=10)
        elapsed = time.perf_counter() - started

        stats = producer.statistics()
        print(f"sent {MESSAGES} messages of {len(payload)} bytes in {elapsed:.2f} s: {MESSAGES / elapsed:,.0f} msg/s")
        print(f"batches: {stats.batches_sent} ({stats.messages_sent / max(1, stats.batches_sent):.0f} messages each); "
              f"waited for room {queue_full} times")
        check(not errors, f"{len(errors)} sends failed, the first: {errors[:1]}")
        check(len(acked) == MESSAGES, f"{len(acked)} receipts for {MESSAGES} messages")
        offsets = sorted(m.offset for m in acked)
        check(len(set(offsets)) == MESSAGES, "two messages got the same offset")
        print(f"every callback reported a MessageId, offsets {offsets[0]}..{offsets[-1]}")

        received = await reader
        print(f"the consumer received {received} of {MESSAGES} (non-reliable topic: a slow consumer may miss some)")
        check(received > 0, "the consumer received nothing")
    print("OK")


if __name__ == "__main__":
    try:
        asyncio.run(asyncio.wait_for(main(), 30))
    except ExampleFailed as exc:
        raise SystemExit(f"FAILED: {exc}") from None
    except (DanubeError, TimeoutError) as exc:
        raise SystemExit(f"FAILED: {type(exc).__name__}: {exc}") from None

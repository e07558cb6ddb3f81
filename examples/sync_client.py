"""The blocking `SyncClient` facade, for scripts and threads without asyncio.

`SyncClient` runs the asyncio client on a background thread; its producers and
consumers have the same methods as the asyncio ones, but block. This example sends
with `send` (waits for the receipt) and `send_nowait` (returns a
`concurrent.futures.Future`), receives with a timeout, acks, and shows that
`receive` raises `Timeout` when nothing comes.

    python examples/sync_client.py [tcp://127.0.0.1:6650]

The broker URL comes from argv[1], else $DANUBE_SERVICE_URL, else tcp://127.0.0.1:6650.
"""

from __future__ import annotations

import os
import sys

from danube_zmq import DanubeError, SubType, SyncClient, Timeout

SERVICE_URL = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("DANUBE_SERVICE_URL", "tcp://127.0.0.1:6650")
TOPIC = "/default/example-sync"


class ExampleFailed(Exception):
    """What the example expected did not happen."""


def check(condition: bool, message: str) -> None:
    if not condition:
        raise ExampleFailed(message)


def main() -> None:
    with SyncClient(SERVICE_URL, request_timeout_ms=3000) as client:
        producer = client.create_producer(TOPIC)
        consumer = client.subscribe(TOPIC, "sync-reader", sub_type=SubType.EXCLUSIVE)

        for i in range(3):
            message_id = producer.send(f"blocking-{i}")
            print(f"send() returned {message_id}")
        futures = [producer.send_nowait(f"queued-{i}") for i in range(3)]
        producer.flush()
        for future in futures:
            print(f"send_nowait() future resolved to {future.result(timeout=5)}")

        expected = [f"blocking-{i}".encode() for i in range(3)] + [f"queued-{i}".encode() for i in range(3)]
        received = []
        for _ in expected:
            message = consumer.receive(timeout=5)
            consumer.ack(message)
            received.append(message.payload)
        print(f"received {b' '.join(received).decode()}")
        check(received == expected, f"received {received}, expected {expected}")

        try:
            message = consumer.receive(timeout=0.3)
        except Timeout as exc:
            print(f"nothing more to read: {exc}")
        else:
            check(False, f"unexpected extra message {message.payload!r}")
    print("OK")


if __name__ == "__main__":
    try:
        main()
    except ExampleFailed as exc:
        raise SystemExit(f"FAILED: {exc}") from None
    except DanubeError as exc:
        raise SystemExit(f"FAILED: {type(exc).__name__}: {exc}") from None

"""The Quick start's main job (`./run demo`): start a standalone broker on the embedded
default (tcp://127.0.0.1:6650, admin tcp://127.0.0.1:50051), publish and consume a few
messages through it with the Python client, describe the topic with the admin client,
then shut the broker down cleanly with SIGTERM.

    .venv/bin/python examples/quickstart.py [--listen URL] [--admin-listen URL]
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import subprocess
import sys
import tempfile
import time

from danube_zmq import DanubeClient, SubType
from danube_zmq.client.admin import AdminClient
from danube_zmq.transport.errors import DanubeError

TOPIC = "/default/quickstart"


async def wait_ready(admin_url: str, broker: subprocess.Popen[bytes], timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        if broker.poll() is not None:
            raise SystemExit(f"error: the broker exited with code {broker.returncode} (is the port in use?)")
        try:
            async with AdminClient(admin_url, timeout_ms=500) as admin:
                await admin.list_namespaces()
                return
        except DanubeError:
            if time.monotonic() > deadline:
                raise SystemExit("error: the broker did not answer within 20 s") from None
            await asyncio.sleep(0.2)


async def round_trip(url: str, admin_url: str) -> None:
    async with DanubeClient(url) as client:
        producer = await client.create_producer(TOPIC, name="quickstart-producer")
        consumer = await client.subscribe(TOPIC, "quickstart-sub", sub_type=SubType.EXCLUSIVE,
                                          initial_position="earliest")
        for i in range(5):
            message_id = await producer.send(f"hello danube #{i}".encode(), key="demo",
                                             attributes={"n": str(i)})
            print(f"sent     offset={message_id.offset} payload='hello danube #{i}'")
        for _ in range(5):
            msg = await consumer.receive(timeout=5)
            await consumer.ack(msg)
            print(f"received offset={msg.message_id.offset} payload='{msg.payload.decode()}'"
                  f" key={msg.key} attributes={dict(msg.attributes)}")
        await consumer.close()
        await producer.close()
    async with AdminClient(admin_url) as admin:
        info = await admin.describe_topic(TOPIC)
        partition = info.partitions[0]
        print(f"topic {info.name}: next offset {partition.next_offset}, {partition.messages_in} messages in,"
              f" subscriptions {[s.name for s in partition.subscriptions]}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--listen", default="tcp://127.0.0.1:6650")
    parser.add_argument("--admin-listen", default="tcp://127.0.0.1:50051")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="danube-quickstart-") as data_dir:
        broker = subprocess.Popen([
            sys.executable, "-m", "danube_zmq.cli.main", "broker", "start", "--listen", args.listen,
            "--admin-listen", args.admin_listen, "--metrics-port", "0", "--data-dir", data_dir])
        try:
            asyncio.run(wait_ready(args.admin_listen, broker))
            print(f"broker started (pid {broker.pid}) on {args.listen}")
            asyncio.run(round_trip(args.listen, args.admin_listen))
        finally:
            if broker.poll() is None:
                broker.send_signal(signal.SIGTERM)
                try:
                    broker.wait(15)
                except subprocess.TimeoutExpired:
                    broker.kill()
                    broker.wait()
    print(f"broker stopped (exit code {broker.returncode})")
    return 0 if broker.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())

"""What schema validation costs at produce time: one broker process, one producer.

    .venv/bin/python benchmarks/schema_validation.py --count 200000 --rounds 3

For each case the producer sends the same pre-encoded ~120-byte order records
(client batching on, non-reliable topic) and the figure is receipts per second:

- `plain`: a topic with no schema bound, producer without a schema (the baseline);
- `json_enforce_payload`: JSON Schema subject, policy enforce + payload validation:
  the topic actor decodes and validates every payload against its exact version;
- `avro_enforce_payload`: the same with an Avro subject;
- `*_client_encode`: the same topics, the producer encoding Python values itself
  (`producer.send(dict)`: serialize + client-side check), i.e. the whole typed path.

Cases alternate over `--rounds` rounds (so drift hits all alike); the best round of
each is reported, with its ratio to `plain`. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any

from e2e import _ready, free_port  # benchmarks/ is on sys.path when a script here runs

from danube_zmq import DanubeClient
from danube_zmq.client.admin import AdminClient
from danube_zmq.client.errors import ProducerQueueFull
from danube_zmq.client.schemas import SchemaRegistryClient
from danube_zmq.schemas.avro_format import AVRO
from danube_zmq.schemas.json_format import JSON_SCHEMA

ORDER_JSON = {
    "type": "object",
    "properties": {"id": {"type": "integer"}, "sku": {"type": "string"}, "quantity": {"type": "integer", "minimum": 1},
                   "price": {"type": "number"}, "customer": {"type": "string"}, "express": {"type": "boolean"}},
    "required": ["id", "sku", "quantity", "price"],
    "additionalProperties": False,
}
ORDER_AVRO = {"type": "record", "name": "Order", "namespace": "bench", "fields": [
    {"name": "id", "type": "long"}, {"name": "sku", "type": "string"}, {"name": "quantity", "type": "int"},
    {"name": "price", "type": "double"}, {"name": "customer", "type": "string"}, {"name": "express", "type": "boolean"},
]}


def order(i: int) -> dict[str, Any]:
    return {"id": i, "sku": f"SKU-{i % 9973:05d}", "quantity": 1 + i % 7, "price": 9.99 + i % 100,
            "customer": f"customer-{i % 50_000:06d}@example.com", "express": i % 3 == 0}


async def setup(url: str, admin_url: str) -> None:
    async with SchemaRegistryClient(url) as registry:
        await registry.register("bench-json", "json_schema", json.dumps(ORDER_JSON).encode())
        await registry.register("bench-avro", "avro", json.dumps(ORDER_AVRO).encode())
    async with AdminClient(admin_url) as admin:
        for kind in ("json", "avro"):
            await admin.configure_topic_schema(f"/default/bench-{kind}", f"bench-{kind}", validation_policy="enforce",
                                               payload_validation=True)


async def produce(url: str, topic: str, subject: str | None, values: list[Any]) -> float:
    async with DanubeClient(url) as client:
        producer = await client.create_producer(topic, schema_subject=subject)
        for value in values[:2000]:  # warm up: connections, compiled schemas on both sides
            await _send(producer, value)
        await producer.flush()
        start = time.perf_counter()
        futures = [await _send(producer, value) for value in values]
        await producer.flush()
        elapsed = time.perf_counter() - start
        for future in futures:
            future.result()  # a refused batch would raise here: the figure counts stored messages only
        await producer.close()
    return len(values) / elapsed


async def _send(producer: Any, value: Any) -> Any:
    while True:
        try:
            return producer.send_nowait(value)
        except ProducerQueueFull:
            await producer.flush()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    values = [order(i) for i in range(args.count)]
    json_def, avro_def = json.dumps(ORDER_JSON).encode(), json.dumps(ORDER_AVRO).encode()
    json_payloads = [JSON_SCHEMA.encode(json_def, v) for v in values]
    avro_payloads = [AVRO.encode(avro_def, v) for v in values]
    cases = {
        "plain": ("/default/bench-plain", None, json_payloads),
        "json_enforce_payload": ("/default/bench-json", "bench-json", json_payloads),
        "avro_enforce_payload": ("/default/bench-avro", "bench-avro", avro_payloads),
        "json_client_encode": ("/default/bench-json", "bench-json", values),
        "avro_client_encode": ("/default/bench-avro", "bench-avro", values),
    }
    url, admin_url = f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"
    data_dir = tempfile.mkdtemp(prefix="danube-bench-")
    broker = subprocess.Popen([sys.executable, "-m", "danube_zmq.cli.main", "broker", "start", "--listen", url,
                               "--admin-listen", admin_url, "--metrics-port", "0", "--data-dir", data_dir],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    best: dict[str, float] = {}
    try:
        asyncio.run(_ready(admin_url))
        asyncio.run(setup(url, admin_url))
        for _ in range(args.rounds):
            for name, (topic, subject, payloads) in cases.items():
                rate = asyncio.run(produce(url, topic, subject, payloads))
                best[name] = max(best.get(name, 0.0), rate)
    finally:
        broker.send_signal(signal.SIGTERM)
        broker.wait(15)
        shutil.rmtree(data_dir, ignore_errors=True)
    plain = best["plain"]
    print(json.dumps({
        "count": args.count, "rounds": args.rounds,
        "payload_bytes": {"json": round(sum(map(len, json_payloads)) / len(values)),
                          "avro": round(sum(map(len, avro_payloads)) / len(values))},
        "msg_s": {name: round(rate) for name, rate in best.items()},
        "ratio_to_plain": {name: round(rate / plain, 3) for name, rate in best.items() if name != "plain"},
    }))


if __name__ == "__main__":
    main()

"""Schemas end to end: register, evolve, bind a topic, validate, encode and decode.

1. Registers an Avro subject "example-payments" (version 1), then evolves it: version 2
   adds a field with a default, which the subject's BACKWARD mode allows; a version
   that drops a field without a default is refused with the reasons.
2. Binds the topic to the subject with policy enforce and payload validation.
3. A producer pinned to version 1 and one on the latest version send Python dicts;
   the client encodes them (Avro binary) and the broker checks every payload.
4. A payload that is not a valid Payment is refused with INVALID_ARGUMENT naming the
   field; a producer without the schema is refused by the enforce policy.
5. A consumer with version 2 as its reader schema decodes both versions: messages of
   version 1 get the new field's default.

Run against a broker (`.venv/bin/danube broker start`):

    python examples/schemas.py [tcp://127.0.0.1:6650]

The broker URL comes from argv[1], else $DANUBE_SERVICE_URL, else tcp://127.0.0.1:6650;
the admin URL from $DANUBE_ADMIN_ENDPOINT, else tcp://127.0.0.1:50051.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import uuid

from danube_zmq import DanubeClient, FailedPrecondition, InvalidArgument, SubType
from danube_zmq.client.admin import AdminClient
from danube_zmq.client.schemas import SchemaRegistryClient

SERVICE_URL = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("DANUBE_SERVICE_URL", "tcp://127.0.0.1:6650")
ADMIN_URL = os.environ.get("DANUBE_ADMIN_ENDPOINT", "tcp://127.0.0.1:50051")
RUN = uuid.uuid4().hex[:8]  # unique, so reruns never collide
SUBJECT = f"example-payments-{RUN}"
TOPIC = f"/default/example-payments-{RUN}"

PAYMENT_V1 = {"type": "record", "name": "Payment", "namespace": "shop",
              "fields": [{"name": "id", "type": "long"}, {"name": "amount", "type": "double"}]}
PAYMENT_V2 = {**PAYMENT_V1, "fields": [*PAYMENT_V1["fields"], {"name": "currency", "type": "string", "default": "EUR"}]}
PAYMENT_BAD = {**PAYMENT_V1, "fields": [{"name": "id", "type": "long"}, {"name": "payer", "type": "string"}]}


class ExampleFailed(Exception):
    """What the example expected did not happen."""


def check(condition: bool, message: str) -> None:
    if not condition:
        raise ExampleFailed(message)


async def main() -> None:
    async with SchemaRegistryClient(SERVICE_URL) as registry:
        v1 = await registry.register(SUBJECT, "avro", json.dumps(PAYMENT_V1).encode())
        v2 = await registry.register(SUBJECT, "avro", json.dumps(PAYMENT_V2).encode())
        print(f"{SUBJECT}: version {v1.version}, then {v2.version} (schema id {v2.schema_id})")
        verdict = await registry.check(SUBJECT, "avro", json.dumps(PAYMENT_BAD).encode())
        check(not verdict.compatible, "an incompatible evolution was accepted")
        print("refused evolution:", "; ".join(verdict.reasons))

    async with AdminClient(ADMIN_URL) as admin:
        await admin.configure_topic_schema(TOPIC, SUBJECT, validation_policy="enforce", payload_validation=True)
    print(f"{TOPIC} bound to {SUBJECT}: enforce, payload validation on")

    async with DanubeClient(SERVICE_URL, request_timeout_ms=3000) as client:
        old = await client.create_producer(TOPIC, schema_subject=SUBJECT, schema_version=1)
        new = await client.create_producer(TOPIC, schema_subject=SUBJECT)
        consumer = await client.subscribe(TOPIC, "ledger", sub_type=SubType.EXCLUSIVE,
                                          reader_schema=json.dumps(PAYMENT_V2))
        await old.send({"id": 1, "amount": 12.5})
        await new.send({"id": 2, "amount": 7.0, "currency": "USD"})
        try:
            await new.send(b"\x04")  # pre-encoded bytes go as they are: the broker checks them
            raise ExampleFailed("a truncated payload was accepted")
        except InvalidArgument as exc:
            print("refused payload:", exc.message)
        plain = await client.create_producer(TOPIC)
        try:
            await plain.send(b"no schema")
            raise ExampleFailed("a message without the schema was accepted under enforce")
        except FailedPrecondition as exc:
            print("refused producer:", exc.message)
        for expected in ({"id": 1, "amount": 12.5, "currency": "EUR"}, {"id": 2, "amount": 7.0, "currency": "USD"}):
            msg = await consumer.receive(timeout=5)
            value = msg.value()
            print(f"offset {msg.offset}: written with version {msg.schema_version}, read as {value}")
            check(value == expected, f"decoded {value}, expected {expected}")
            await consumer.ack(msg)


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except ExampleFailed as failure:
        sys.exit(f"example failed: {failure}")

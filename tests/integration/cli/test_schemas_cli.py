"""`danube schemas` against a real broker: the registry through the client port, kept
in the broker's metadata store (so it survives a restart)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.integration.conftest import BrokerProcess, start_broker


def danube(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "danube_zmq.cli.main", *args], capture_output=True, text=True,
                          timeout=60)


def schemas(broker: BrokerProcess, *args: str) -> subprocess.CompletedProcess[str]:
    return danube("schemas", args[0], *args[1:], "-s", broker.url)


ORDER_V1 = {"type": "object", "properties": {"id": {"type": "integer"}, "sku": {"type": "string"}}, "required": ["id"]}
ORDER_V2 = {**ORDER_V1, "properties": {**ORDER_V1["properties"], "note": {"type": "string"}}}
ORDER_BAD = {**ORDER_V1, "required": ["id", "customer"],
             "properties": {**ORDER_V1["properties"], "customer": {"type": "string"}}}


def test_register_check_evolve_and_survive_a_restart(tmp_path: Path) -> None:
    broker = start_broker(tmp_path)
    try:
        v1 = tmp_path / "v1.json"
        v1.write_text(json.dumps(ORDER_V1, indent=2))
        out = schemas(broker, "register", "orders", "--schema-type", "json_schema", "-f", str(v1), "-o", "json")
        assert out.returncode == 0, out.stderr
        first = json.loads(out.stdout)
        assert (first["version"], first["is_new"]) == (1, True)
        # The same schema, spelled differently: the existing version comes back.
        out = schemas(broker, "register", "orders", "-t", "json", "--schema", json.dumps(ORDER_V1))
        assert out.returncode == 0 and "already registered as version 1" in out.stdout, out.stderr

        out = schemas(broker, "check", "orders", "-t", "json_schema", "--schema", json.dumps(ORDER_BAD))
        assert out.returncode == 1 and "customer" in out.stderr and "not compatible" in out.stderr
        out = schemas(broker, "register", "orders", "-t", "json_schema", "--schema", json.dumps(ORDER_BAD))
        assert out.returncode == 1 and "not compatible with subject 'orders'" in out.stderr
        out = schemas(broker, "check", "orders", "-t", "json_schema", "--schema", json.dumps(ORDER_BAD), "--mode", "forward")
        assert out.returncode == 0 and "compatible" in out.stdout

        out = schemas(broker, "register", "orders", "-t", "json_schema", "--schema", json.dumps(ORDER_V2),
                      "--description", "adds note")
        assert out.returncode == 0 and "version 2" in out.stdout, out.stderr
        out = schemas(broker, "versions", "orders", "-o", "json")
        assert [(v["version"], v["description"]) for v in json.loads(out.stdout)] == [(1, ""), (2, "adds note")]

        avro = '{"type": "record", "name": "Payment", "fields": [{"name": "amount", "type": "long"}]}'
        out = schemas(broker, "register", "payments", "-t", "avro", "--schema", avro, "-o", "json")
        payment_id = json.loads(out.stdout)["schema_id"]
        proto = tmp_path / "ship.proto"
        proto.write_text('syntax = "proto3";\npackage ops;\nmessage Shipment { string id = 1; int32 boxes = 2; }\n')
        out = schemas(broker, "register", "shipments", "-t", "protobuf", "-f", str(proto))
        assert out.returncode == 0, out.stderr
        out = schemas(broker, "register", "broken", "-t", "protobuf", "--schema", 'syntax = "proto3"; message {')
        assert out.returncode == 1 and "does not compile" in out.stderr

        admin = ("admin", "--endpoint", broker.admin_url, "topics")
        out = danube(*admin, "get-schema-config", "/default/orders")
        assert out.returncode == 1 and "no schema is bound" in out.stderr
        out = danube(*admin, "configure-schema", "/default/orders", "--subject", "orders", "--validation-policy",
                     "enforce", "--enable-payload-validation", "-o", "json")
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout) == {"topic": "/default/orders", "subject": "orders", "validation_policy": "enforce",
                                          "payload_validation": True, "schema_id": first["schema_id"],
                                          "latest_version": 2, "schema_type": "json_schema",
                                          "compatibility": "backward"}
        out = danube(*admin, "configure-schema", "/default/orders", "--subject", "missing")
        assert out.returncode == 1 and "not found" in out.stderr

        out = schemas(broker, "set-compatibility", "orders", "--mode", "full_transitive")
        assert out.returncode == 0 and "full_transitive" in out.stdout
        out = schemas(broker, "delete", "orders", "--version", "2")
        assert out.returncode == 0, out.stderr
    finally:
        assert broker.stop() == 0, broker.log()

    broker = start_broker(tmp_path)  # same data dir: the registry is in the metadata store
    try:
        out = schemas(broker, "get", "--subject", "orders", "-o", "json")
        got = json.loads(out.stdout)
        assert (got["version"], got["compatibility"]) == (1, "full_transitive")  # version 2 deleted
        out = schemas(broker, "get", "--subject", "orders", "--version", "2", "-o", "json")
        assert json.loads(out.stdout)["deleted"] is True
        out = schemas(broker, "get", "--id", str(payment_id), "-o", "json")
        assert json.loads(out.stdout)["subject"] == "payments"
        out = schemas(broker, "list-subjects", "-o", "json")
        assert [(s["subject"], s["schema_type"]) for s in json.loads(out.stdout)] == [
            ("orders", "json_schema"), ("payments", "avro"), ("shipments", "protobuf")]
        out = danube("admin", "--endpoint", broker.admin_url, "topics", "get-schema-config", "/default/orders-part-1")
        assert out.returncode == 0 and "enforce" in out.stdout, out.stderr  # partitions share the base's binding
        out = schemas(broker, "get", "--subject", "nope")
        assert out.returncode == 1 and "not found" in out.stderr
        out = schemas(broker, "register", "x", "-t", "xml", "--schema", "<a/>")
        assert out.returncode == 2 and "xml" in out.stderr
    finally:
        assert broker.stop() == 0, broker.log()


def test_produce_and_consume_by_schema(broker: BrokerProcess, tmp_path: Path) -> None:
    """`danube produce` encodes -m text by the subject's schema (registering a
    --schema-file on the way); `danube consume` decodes and prints by the writer's version."""
    out = schemas(broker, "register", "orders", "-t", "json_schema", "--schema", json.dumps(ORDER_V1))
    assert out.returncode == 0, out.stderr
    produce = ("produce", "-s", broker.url, "-t", "/default/orders", "--schema-subject", "orders")
    out = danube(*produce, "-m", '{"id": 1, "sku": "apple"}')
    assert out.returncode == 0, out.stderr
    out = danube(*produce, "-m", '{"id": "one"}')
    assert out.returncode == 1 and "$.id" in out.stderr and "integer" in out.stderr
    out = danube(*produce, "-m", "not json")
    assert out.returncode == 1 and "not JSON" in out.stderr
    out = danube(*produce, "--schema-version", "9", "-m", "{}")
    assert out.returncode == 1 and "no version 9" in out.stderr
    out = danube("produce", "-s", broker.url, "-t", "/default/orders", "--schema-version", "1", "-m", "{}")
    assert out.returncode == 2 and "need --schema-subject" in out.stderr

    avsc = tmp_path / "payment.avsc"
    avsc.write_text(json.dumps({"type": "record", "name": "Payment",
                                "fields": [{"name": "amount", "type": "double"}, {"name": "memo", "type": "string"}]}))
    out = danube("produce", "-s", broker.url, "-t", "/default/payments", "--schema-file", str(avsc),
                 "--schema-type", "avro", "-m", '{"amount": 9.5, "memo": "hi"}', "-c", "2")
    assert out.returncode == 0, out.stderr
    assert "schema 'payments' registered as version 1" in out.stderr
    out = danube("produce", "-s", broker.url, "-t", "/default/payments", "--schema-subject", "orders", "-m", "{}")
    assert out.returncode == 1 and "bound to schema subject 'payments'" in out.stderr

    consume = ("consume", "-s", broker.url, "-m", "s", "--initial-position", "earliest", "--timeout", "3")
    out = danube(*consume, "-t", "/default/payments", "-c", "2", "--json")
    assert out.returncode == 0, out.stderr
    records = [json.loads(line) for line in out.stdout.splitlines()]
    assert [(r["schema_subject"], r["schema_version"], r["value"]) for r in records] == \
        [("payments", 1, {"amount": 9.5, "memo": "hi"})] * 2
    out = danube("produce", "-s", broker.url, "-t", "/default/orders", "--schema-subject", "orders",
                 "-m", '{"id": 2, "sku": "pear"}')
    assert out.returncode == 0, out.stderr
    out = danube(*consume, "-t", "/default/orders", "-c", "2")  # earliest: the topic's tail holds both
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("schema=orders v1\n{") == 2 and '"sku": "apple"' in out.stdout \
        and '"sku": "pear"' in out.stdout

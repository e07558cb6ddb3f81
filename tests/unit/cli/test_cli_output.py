"""How `danube consume` shows a message: the --json record and the one human line."""

from __future__ import annotations

import base64
import json
from types import SimpleNamespace

from danube_zmq.cli.consume import message_line, message_record
from danube_zmq.cli.options import partition_of


def fake_message(payload: bytes, *, topic: str = "/default/orders-part-2", **fields: object) -> SimpleNamespace:
    values: dict[str, object] = {
        "key": None,
        "attributes": {},
        "publish_time": 1_700_000_000_000,
        "redelivery_count": 0,
        **fields,
    }
    return SimpleNamespace(
        payload=payload,
        topic=topic,
        message_id=SimpleNamespace(topic=topic, offset=41, producer_id=9),
        **values,
    )


def test_json_record_has_every_field_and_text_payload() -> None:
    """A UTF-8 payload is `payload`; the partition comes from the `-part-N` suffix."""
    record = message_record(fake_message("héllo".encode(), key="k1", attributes={"a": "1"}, redelivery_count=2))
    assert record == {
        "topic": "/default/orders-part-2",
        "partition": 2,
        "offset": 41,
        "producer_id": 9,
        "key": "k1",
        "attributes": {"a": "1"},
        "publish_time": 1_700_000_000_000,
        "redelivery_count": 2,
        "payload": "héllo",
    }
    json.dumps(record)  # serialisable as is


def test_json_record_uses_base64_for_binary_payloads() -> None:
    """Bytes that are not UTF-8 come out as `payload_b64`, and no `payload` key."""
    raw = b"\xff\x00\xfe"
    record = message_record(fake_message(raw, topic="/default/plain"))
    assert record["payload_b64"] == base64.b64encode(raw).decode()
    assert "payload" not in record
    assert record["partition"] is None


def test_human_line_is_one_line_even_for_multiline_payloads() -> None:
    """Line breaks in a payload are escaped, so each message stays on one line."""
    line = message_line(fake_message(b"first\nsecond", key="user-1", attributes={"region": "eu"}, redelivery_count=1))
    assert "\n" not in line
    assert line == "/default/orders-part-2 offset=41 key=user-1 attributes={region:eu} redelivery=1 | first\\nsecond"


def test_human_line_describes_binary_payloads() -> None:
    """Binary payloads are not dumped to the terminal; the line says how to see them."""
    assert message_line(fake_message(b"\xff\xfe")).endswith("| <2 bytes of binary; --json shows it as base64>")


def test_partition_of_reads_only_a_valid_suffix() -> None:
    """`-part-N` (N without leading zeros) is a partition; anything else is not."""
    assert partition_of("/ns/t-part-0") == 0
    assert partition_of("/ns/t-part-12") == 12
    assert partition_of("/ns/t-part-01") is None
    assert partition_of("/ns/t") is None
    assert partition_of("not a topic") is None

"""Bounds on a schema definition, checked before a format compiles it."""

from __future__ import annotations

import json

import pytest

from danube_zmq.schemas.limits import SchemaLimits, check_definition
from danube_zmq.schemas.types import SchemaType
from danube_zmq.transport.errors import InvalidArgument

LIMITS = SchemaLimits(definition_bytes_max=4096, nodes_max=100, depth_max=8)


def test_size_is_checked_before_parsing() -> None:
    with pytest.raises(InvalidArgument, match=r"4097 bytes, over the broker's limit of 4096"
                                              r" \(limits.schema_definition_bytes_max\)"):
        check_definition(SchemaType.PROTOBUF, b"x" * 4097, LIMITS)  # not even JSON: never parsed


@pytest.mark.parametrize("schema_type", [SchemaType.JSON_SCHEMA, SchemaType.AVRO])
def test_node_count_and_depth(schema_type: SchemaType) -> None:
    many = {"patternProperties": {f"^p{i}$": {} for i in range(60)}}
    with pytest.raises(InvalidArgument, match=r"more than 100 JSON values \(limits.schema_nodes_max\)"):
        check_definition(schema_type, json.dumps(many).encode(), LIMITS)
    deep: object = "int"
    for i in range(3):
        deep = {"type": "record", "name": f"R{i}", "fields": [{"name": "f", "type": deep}]}
    with pytest.raises(InvalidArgument, match=r"deeper than 8 levels \(limits.schema_depth_max\)"):
        check_definition(schema_type, json.dumps(deep).encode(), LIMITS)
    with pytest.raises(InvalidArgument, match=r"limits\.schema_depth_max"):  # past the parser's own recursion
        check_definition(schema_type, b"[" * 100_000 + b"]" * 100_000, SchemaLimits())
    check_definition(schema_type, json.dumps({"type": "record", "name": "R", "fields": []}).encode(), LIMITS)

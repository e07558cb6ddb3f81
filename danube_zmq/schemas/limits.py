"""Bounds on a schema definition, checked before any format compiles it.

A definition is untrusted input: a 10 MB JSON Schema with 200,000 patterned properties,
or an Avro schema of 20,000 records nested in one another, once took a broker minutes
and hundreds of megabytes to compile. So the registry checks, in this order and before
the format sees the definition:

1. its length in bytes (`schema_definition_bytes_max`), before anything parses it;
2. for the JSON-based formats (JSON Schema, Avro), once parsed: how many JSON values it
   holds (`schema_nodes_max`) and how deeply it nests (`schema_depth_max`), walked
   without recursion.

Each refusal is an `InvalidArgument` naming the limit and its setting.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from danube_zmq.schemas.types import SchemaType
from danube_zmq.transport.errors import InvalidArgument

__all__ = ["SchemaLimits", "check_definition"]

_JSON_BASED = frozenset({SchemaType.JSON_SCHEMA, SchemaType.AVRO})


@dataclass(frozen=True, slots=True)
class SchemaLimits:
    """The `limits.schema_*` settings (`config/broker_config.py` documents each)."""

    definition_bytes_max: int = 256 * 1024
    nodes_max: int = 20_000
    depth_max: int = 64


def check_definition(schema_type: SchemaType, definition: bytes, limits: SchemaLimits) -> None:
    """Raise `InvalidArgument` if `definition` is over a bound; see the module docstring."""
    if not isinstance(definition, bytes | bytearray | memoryview):
        return  # the format refuses it with its own message
    size = len(definition)
    if size > limits.definition_bytes_max:
        raise InvalidArgument(f"schema definition is {size} bytes, over the broker's limit of"
                              f" {limits.definition_bytes_max} (limits.schema_definition_bytes_max)")
    if schema_type not in _JSON_BASED:
        return
    try:
        document = json.loads(bytes(definition))
    except RecursionError:
        raise _too_deep(limits) from None
    except ValueError:
        return  # not JSON (or not UTF-8): the format says why
    _check_shape(document, limits)


def _check_shape(document: Any, limits: SchemaLimits) -> None:
    nodes = 0
    pending: list[tuple[Any, int]] = [(document, 1)]
    while pending:
        node, depth = pending.pop()
        nodes += 1
        if nodes > limits.nodes_max:
            raise InvalidArgument(f"schema definition holds more than {limits.nodes_max} JSON values"
                                  " (limits.schema_nodes_max)")
        if depth > limits.depth_max:
            raise _too_deep(limits)
        if isinstance(node, dict):
            nodes += len(node)  # the keys: a patternProperties key is a regex to compile
            pending.extend((value, depth + 1) for value in node.values())
        elif isinstance(node, list):
            pending.extend((item, depth + 1) for item in node)


def _too_deep(limits: SchemaLimits) -> InvalidArgument:
    return InvalidArgument(f"schema definition nests deeper than {limits.depth_max} levels (limits.schema_depth_max)")

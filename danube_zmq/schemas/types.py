"""What every schema format of the registry provides, and the registry's enums.

A format turns a schema definition (the bytes a user registers) into:

- `normalize(definition) -> bytes`: the canonical form. The registry's fingerprint is
  the SHA-256 of it, so two definitions that differ only in spacing, key order or
  other insignificant detail register as the same version.
- `reader_errors(reader, writer) -> list[str]`: why data written with schema `writer`
  cannot be read with schema `reader` (empty: it can). Compatibility modes are built on
  it: BACKWARD checks `reader_errors(reader=new, writer=old)` (consumers on the new
  schema read old data), FORWARD `reader_errors(reader=old, writer=new)`, FULL both.
- `validate(definition, payload)`: raise `InvalidArgument` naming the field at fault if
  `payload` is not a valid encoding under `definition`.
- `encode(definition, value) -> bytes` and `decode(definition, payload, reader=None)`:
  the client's serializers (Avro resolves the writer's schema against the reader's).
- optionally `evolution_errors(old, new) -> list[str]`: rules about the change itself,
  whatever the direction (Protobuf: a removed field must be reserved), checked in every
  mode but NONE.

Every function takes normalized or raw definitions alike, raises `InvalidArgument` (with
a message a user can act on) for a bad definition, and caches what it compiles (bounded)
because `validate` runs on the produce path.
"""

from __future__ import annotations

import enum
from typing import Any, Protocol

from danube_zmq.transport.errors import InvalidArgument

__all__ = ["CompatibilityMode", "SchemaFormat", "SchemaType", "parse_compatibility_mode", "parse_schema_type"]


class SchemaType(enum.StrEnum):
    BYTES = "bytes"
    STRING = "string"
    NUMBER = "number"
    JSON_SCHEMA = "json_schema"
    AVRO = "avro"
    PROTOBUF = "protobuf"


_TYPE_ALIASES = {"json": "json_schema", "proto": "protobuf", "int64": "number", "int": "number", "long": "number",
                 "float": "number", "double": "number"}


def parse_schema_type(text: str) -> SchemaType:
    name = text.strip().lower().replace("-", "_")
    try:
        return SchemaType(_TYPE_ALIASES.get(name, name))
    except ValueError:
        raise InvalidArgument(
            f"unknown schema type {text!r}; expected one of {', '.join(t.value for t in SchemaType)}"
        ) from None


class CompatibilityMode(enum.StrEnum):
    NONE = "none"
    BACKWARD = "backward"
    FORWARD = "forward"
    FULL = "full"
    BACKWARD_TRANSITIVE = "backward_transitive"
    FORWARD_TRANSITIVE = "forward_transitive"
    FULL_TRANSITIVE = "full_transitive"


def parse_compatibility_mode(text: str) -> CompatibilityMode:
    try:
        return CompatibilityMode(text.strip().lower().replace("-", "_"))
    except ValueError:
        raise InvalidArgument(
            f"unknown compatibility mode {text!r}; expected one of {', '.join(m.value for m in CompatibilityMode)}"
        ) from None


class SchemaFormat(Protocol):
    """One schema type's rules; see the module docstring."""

    type: SchemaType

    def normalize(self, definition: bytes) -> bytes: ...

    def reader_errors(self, reader: bytes, writer: bytes) -> list[str]: ...

    def validate(self, definition: bytes, payload: bytes) -> None: ...

    def encode(self, definition: bytes, value: Any) -> bytes: ...

    def decode(self, definition: bytes, payload: bytes, reader: bytes | None = None) -> Any: ...

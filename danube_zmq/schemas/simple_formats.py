"""The three schema types without a schema language: Bytes, String and Number.

- Bytes: any payload. The definition is ignored (normalized to empty).
- String: the payload is UTF-8 text. The definition is ignored.
- Number: the payload is one 8-byte big-endian value; the definition says which:
  `int64` (aliases `long`, `int`) or `float64` (aliases `double`, `float`). Changing
  between them is incompatible in both directions (the same bytes mean another number).

Compatibility within one of these types is otherwise always given.
"""

from __future__ import annotations

import struct
from typing import Any

from danube_zmq.schemas.types import SchemaType
from danube_zmq.transport.errors import InvalidArgument

__all__ = ["BYTES", "NUMBER", "STRING", "BytesFormat", "NumberFormat", "StringFormat"]

_NUMBER_KINDS = {"int64": "int64", "long": "int64", "int": "int64", "float64": "float64", "double": "float64",
                 "float": "float64"}
_PACK = {"int64": struct.Struct(">q"), "float64": struct.Struct(">d")}


class BytesFormat:
    type = SchemaType.BYTES

    def normalize(self, definition: bytes) -> bytes:
        return b""

    def reader_errors(self, reader: bytes, writer: bytes) -> list[str]:
        return []

    def validate(self, definition: bytes, payload: bytes) -> None:
        return None

    def encode(self, definition: bytes, value: Any) -> bytes:
        if not isinstance(value, bytes | bytearray | memoryview):
            raise InvalidArgument(f"a bytes schema encodes bytes, got {type(value).__name__}")
        return bytes(value)

    def decode(self, definition: bytes, payload: bytes, reader: bytes | None = None) -> Any:
        return payload


class StringFormat:
    type = SchemaType.STRING

    def normalize(self, definition: bytes) -> bytes:
        return b""

    def reader_errors(self, reader: bytes, writer: bytes) -> list[str]:
        return []

    def validate(self, definition: bytes, payload: bytes) -> None:
        try:
            payload.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidArgument(f"payload is not UTF-8 text: byte {exc.start}: {exc.reason}") from None

    def encode(self, definition: bytes, value: Any) -> bytes:
        if not isinstance(value, str):
            raise InvalidArgument(f"a string schema encodes str, got {type(value).__name__}")
        return value.encode("utf-8")

    def decode(self, definition: bytes, payload: bytes, reader: bytes | None = None) -> Any:
        self.validate(definition, payload)
        return payload.decode("utf-8")


class NumberFormat:
    type = SchemaType.NUMBER

    def _kind(self, definition: bytes) -> str:
        text = definition.decode("utf-8", "replace").strip().lower() or "int64"
        try:
            return _NUMBER_KINDS[text]
        except KeyError:
            raise InvalidArgument(f"a number schema is int64 or float64, got {text!r}") from None

    def normalize(self, definition: bytes) -> bytes:
        return self._kind(definition).encode()

    def reader_errors(self, reader: bytes, writer: bytes) -> list[str]:
        r, w = self._kind(reader), self._kind(writer)
        return [] if r == w else [f"number kind changed from {w} to {r}: the same 8 bytes mean another number"]

    def validate(self, definition: bytes, payload: bytes) -> None:
        self._kind(definition)
        if len(payload) != 8:
            raise InvalidArgument(f"a number payload is 8 bytes (big-endian), got {len(payload)}")

    def encode(self, definition: bytes, value: Any) -> bytes:
        kind = self._kind(definition)
        if kind == "int64":
            if type(value) is not int:
                raise InvalidArgument(f"an int64 schema encodes int, got {type(value).__name__}")
            if not -(1 << 63) <= value < 1 << 63:
                raise InvalidArgument(f"{value} does not fit in int64")
        elif type(value) not in (int, float):
            raise InvalidArgument(f"a float64 schema encodes float, got {type(value).__name__}")
        return _PACK[kind].pack(value)

    def decode(self, definition: bytes, payload: bytes, reader: bytes | None = None) -> Any:
        self.validate(definition, payload)
        return _PACK[self._kind(definition)].unpack(payload)[0]


BYTES = BytesFormat()
STRING = StringFormat()
NUMBER = NumberFormat()

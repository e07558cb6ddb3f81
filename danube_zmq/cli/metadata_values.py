"""A metadata store value made readable for `danube admin metadata get|list`.

The store holds bytes: the cluster's records (msgpack arrays, `transport/
cluster_records.py`), other msgpack (cursors in their older map form), text an
operator put, and anything else. Each value is read as the first of:

1. `text`: printable UTF-8. First, because a one-character text such as "7" is also
   a whole msgpack value (the integer 55), while no msgpack array or map is valid
   UTF-8 (their first byte is never a UTF-8 start byte).
2. `record`: a cluster record, as a JSON object of its fields named by its type.
3. `msgpack`: any other whole msgpack value, as JSON (bin inside as text, or base64).
4. `text`: UTF-8 with control characters.
5. `base64`: the rest, as "base64:..." (what `metadata put` takes back).
"""

from __future__ import annotations

import base64
import dataclasses
import json
from typing import Any

import msgpack

from danube_zmq.transport.cluster_records import CLUSTER_RECORDS
from danube_zmq.transport.errors import DanubeError

__all__ = ["Readable", "raw_text", "readable"]

_BASE64 = "base64:"


@dataclasses.dataclass(frozen=True, slots=True)
class Readable:
    format: str  # text, record, msgpack, base64
    value: Any  # JSON data

    def shown(self) -> str:
        """One table cell: text and base64 as they are, the rest as compact JSON."""
        if self.format in ("text", "base64"):
            return str(self.value)
        return json.dumps(self.value, ensure_ascii=False, separators=(",", ":"))


def raw_text(value: bytes) -> str:
    """The stored bytes as `--raw` prints them: UTF-8 text, else base64 with its marker."""
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        return _BASE64 + base64.b64encode(value).decode()


def readable(value: bytes) -> Readable:
    text = _utf8(value)
    if text is not None and all(c.isprintable() or c in "\t\n\r" for c in text):
        return Readable("text", text)
    try:
        items = msgpack.unpackb(value, raw=False, strict_map_key=False)
        as_json = _json(items)
    except (ValueError, TypeError, RecursionError, msgpack.UnpackException, _NotJson):
        if text is not None:
            return Readable("text", text)
        return Readable("base64", _BASE64 + base64.b64encode(value).decode())
    record = _record(value) if type(items) is list and items and type(items[0]) is int else None
    return Readable("msgpack", as_json) if record is None else Readable("record", record)


def _utf8(value: bytes) -> str | None:
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _record(value: bytes) -> dict[str, Any] | None:
    """The value as the cluster record its tag names, when every field checks."""
    try:
        record = CLUSTER_RECORDS.decode(value)
    except DanubeError:
        return None
    return {"record": type(record).__name__, **_json(_fields(record))}


def _fields(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _fields(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, list):
        return [_fields(item) for item in value]
    return value


class _NotJson(Exception):
    """A msgpack value JSON has no form for (an extension type)."""


def _json(item: Any) -> Any:
    if item is None or isinstance(item, (bool, int, float, str)):
        return item
    if isinstance(item, bytes):
        return raw_text(item)
    if isinstance(item, list):
        return [_json(i) for i in item]
    if isinstance(item, dict):
        return {k if isinstance(k, str) else json.dumps(_json(k)): _json(v) for k, v in item.items()}
    raise _NotJson(type(item).__name__)

"""Wire records as JSON data: `record_fields` is the CLI's `--output json` form (records
by field, enums by name, no request ids); `jsonable` goes on to bytes as text (base64
when not UTF-8) and any enum by name, for the programs the admin plane serves (the MCP
server, the web console)."""

from __future__ import annotations

import base64
import dataclasses
import enum
from typing import Any

from danube_zmq.transport.client_protocol import DispatchStrategy, SubType

__all__ = ["enum_name", "jsonable", "record_fields"]


def enum_name(enum_type: type[enum.IntEnum], value: int) -> str:
    try:
        return enum_type(value).name.lower()
    except ValueError:
        return str(value)


def record_fields(value: Any) -> Any:
    """A wire record as plain JSON data: enums by name, no request ids."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out: dict[str, Any] = {}
        for field in dataclasses.fields(value):
            if field.name == "request_id":
                continue
            item = getattr(value, field.name)
            if field.name == "dispatch_strategy":
                item = enum_name(DispatchStrategy, item)
            elif field.name == "sub_type":
                item = enum_name(SubType, item)
            out[field.name] = record_fields(item)
        return out
    if isinstance(value, list):
        return [record_fields(item) for item in value]
    return value


def jsonable(value: Any) -> Any:
    """A wire record (or list of them) as JSON data."""
    value = record_fields(value)
    if isinstance(value, dict):
        return {key: jsonable(item) for key, item in value.items()}
    if isinstance(value, list):
        return [jsonable(item) for item in value]
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return {"base64": base64.b64encode(value).decode("ascii")}
    if isinstance(value, enum.Enum):
        return value.name.lower()
    return value

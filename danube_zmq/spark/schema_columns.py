"""Spark column types for registry schemas, and decoders of payloads into values of them.

`spark_type(schema_type, definition)` is the `pyspark.sql.types.DataType` of the values a
schema describes; `value_decoder(schema_type, definition)` returns a function turning one
payload into a Python value PySpark accepts for that type (structs as tuples in field
order, arrays as lists, maps as dicts). Payloads are parsed by the registry's own format
(`format_for(t).decode`); this module only reshapes what it returns, with a converter tree
built once per schema. Every struct field, array element and map value is nullable: an
absent optional field is None, and a topic's later schema versions may drop a field.

Mapping (anything a Spark type cannot express becomes a StringType column holding the
JSON text of that part of the value, "JSON text" below; a JSON null stays a Spark null):

- string -> StringType; bytes -> BinaryType; number -> LongType (int64) or DoubleType (float64).
- JSON Schema: object with `properties` -> StructType, in declared order (undeclared keys
  are dropped); object with only an `additionalProperties` schema -> MapType(StringType, it);
  object with neither -> JSON text; string (any `format`, `date-time` included) and
  `enum`/`const` of strings -> StringType; integer -> LongType; number -> DoubleType;
  boolean -> BooleanType; null -> NullType; array -> ArrayType of `items` (no `items`:
  JSON-text elements; tuple forms: JSON text); a `type` list with "null" is that type;
  ["integer", "number"] -> DoubleType; other type lists -> JSON text; no `type` is inferred
  from `properties`/`items`/`enum`/`const`, else `anyOf`/`oneOf` of one non-null branch or
  an `allOf` of one branch is that branch, else JSON text. `$ref` follows local JSON
  pointers (`#/$defs/..`, `#/definitions/..`, `#`); any other `$ref` -> JSON text.
- Avro: record -> StructType; int -> IntegerType; long -> LongType; float -> FloatType;
  double -> DoubleType; boolean; string; bytes and fixed -> BinaryType; null -> NullType;
  enum -> StringType; array -> ArrayType; map -> MapType(StringType, ...); a union of null
  and one type -> that type; other unions -> JSON text. Logical types (as fastavro reads
  them): timestamp-millis/micros -> TimestampType; local-timestamp-millis/micros ->
  TimestampNTZType; date -> DateType; decimal -> DecimalType(precision, scale) (precision
  above Spark's 38 -> StringType of the decimal); uuid -> StringType; time-millis ->
  IntegerType and time-micros -> LongType (since midnight, as spark-avro reads them).
- Protobuf (the schema's message type): message -> StructType of its fields; int32, sint32,
  sfixed32 -> IntegerType; int64, sint64, sfixed64, uint32, fixed32 -> LongType; uint64,
  fixed64 -> DecimalType(20, 0); float -> FloatType; double -> DoubleType; bool; string;
  bytes -> BinaryType; enum -> StringType (the value's name; an unknown number as its
  digits); repeated -> ArrayType; map -> MapType(key type, value type). Well-known types:
  Timestamp -> TimestampType, Duration -> DayTimeIntervalType, wrappers -> their scalar,
  FieldMask -> StringType, Struct/Value/ListValue/Any -> JSON text. A field without
  presence (proto3 implicit) that the payload omits is its default (0, "", first enum
  name, empty list/map); one with presence (optional, oneof member, message) is None.

A recursive type (a JSON `$ref`, Avro named type or Protobuf message reachable from
itself) cannot be a Spark type: `InvalidArgument` names it, as it does a definition the
format refuses. Values Spark still refuses at run time: JSON integers beyond int64.
"""

from __future__ import annotations

import base64
import datetime
import decimal
import functools
import json
import urllib.parse
import uuid
from collections.abc import Callable
from typing import Any

import fastavro
from google.protobuf import duration_pb2, timestamp_pb2
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    DataType,
    DateType,
    DayTimeIntervalType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    NullType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from danube_zmq.schemas.formats import format_for
from danube_zmq.schemas.protobuf_format import is_map, message_descriptor
from danube_zmq.schemas.types import SchemaType, parse_schema_type
from danube_zmq.transport.errors import InvalidArgument

__all__ = ["spark_type", "value_decoder"]

# Turns one non-None value, as the format decoded it, into its Spark value; None: already is.
Convert = Callable[[Any], Any] | None
Column = tuple[DataType, Convert]
_RECURSIVE = "a Spark column cannot hold a recursive type"


def spark_type(schema_type: SchemaType, definition: bytes) -> DataType:
    """The Spark type of the values `definition` describes; see the module docstring."""
    return _column(schema_type, definition)[0]


def value_decoder(schema_type: SchemaType, definition: bytes, *,
                  writer: bytes | None = None) -> Callable[[bytes], Any]:
    """A function decoding one payload into a value of `spark_type(schema_type, definition)`.

    `writer`: the definition the payload was written with, when it is another version of
    the schema (Avro resolves it against `definition`). A payload the format refuses
    raises `InvalidArgument`.
    """
    schema_type = parse_schema_type(str(schema_type))
    convert = _column(schema_type, definition)[1]
    fmt = format_for(schema_type)
    if writer is None or writer == definition:
        decode = functools.partial(fmt.decode, definition)
    else:
        decode = functools.partial(fmt.decode, writer, reader=definition)
    if convert is None:
        return decode

    def decode_value(payload: bytes) -> Any:
        value = decode(payload)
        return None if value is None else convert(value)

    return decode_value


def _column(schema_type: SchemaType, definition: bytes) -> Column:
    schema_type = parse_schema_type(str(schema_type))  # a plain "avro" works too
    if schema_type is SchemaType.STRING:
        return StringType(), None
    if schema_type is SchemaType.BYTES:
        return BinaryType(), None
    if schema_type is SchemaType.NUMBER:
        kind = format_for(schema_type).normalize(definition)  # b"int64" or b"float64"
        return (LongType() if kind == b"int64" else DoubleType()), None
    if schema_type is SchemaType.JSON_SCHEMA:
        return _json_top(definition)
    if schema_type is SchemaType.AVRO:
        return _avro_top(definition)
    return _protobuf_top(definition)


# --------------------------------------------------------------------------- shared shapes


def _struct(fields: list[tuple[str, DataType, Convert, Any]]) -> Column:
    """(name, type, convert, value when absent) per field -> a struct read from a dict."""
    data_type = StructType([StructField(name, t, True) for name, t, _, _ in fields])
    plan = [(name, convert, absent) for name, _, convert, absent in fields]

    def convert_struct(obj: dict[str, Any]) -> tuple[Any, ...]:
        out = []
        for name, convert, absent in plan:
            value = obj.get(name, absent)
            out.append(value if value is None or convert is None else convert(value))
        return tuple(out)

    return data_type, convert_struct


def _array(element: Column) -> Column:
    element_type, convert = element
    if convert is None:
        return ArrayType(element_type, True), None  # every format decodes arrays as lists

    def convert_array(items: list[Any]) -> list[Any]:
        return [x if x is None else convert(x) for x in items]

    return ArrayType(element_type, True), convert_array


def _map(key: Column, value: Column) -> Column:
    (key_type, convert_key), (value_type, convert_value) = key, value
    data_type = MapType(key_type, value_type, True)
    if convert_key is None and convert_value is None:
        return data_type, None
    keys: Callable[[Any], Any] = convert_key or _same
    values: Callable[[Any], Any] = convert_value or _same

    def convert_map(entries: dict[Any, Any]) -> dict[Any, Any]:
        return {keys(k): (v if v is None else values(v)) for k, v in entries.items()}

    return data_type, convert_map


def _same(value: Any) -> Any:
    return value


def _json_default(value: Any) -> Any:
    """What `json.dumps` cannot write itself, as Avro and Protobuf decode it."""
    if isinstance(value, bytes | bytearray):
        return base64.b64encode(value).decode("ascii")  # as Protobuf's JSON writes bytes
    if isinstance(value, decimal.Decimal | uuid.UUID):
        return str(value)  # a string: a JSON number would lose a decimal's digits
    if isinstance(value, datetime.date | datetime.time):
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def _json_text(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=_json_default)


_TEXT: Column = (StringType(), _json_text)
_NULL: Column = (NullType(), None)


# --------------------------------------------------------------------------- JSON Schema

_JSON_SCALARS: dict[str, Column] = {
    # jsonschema accepts 2.0 as an integer and 2 as a number; Spark wants int and float.
    "string": (StringType(), None), "integer": (LongType(), int), "number": (DoubleType(), float),
    "boolean": (BooleanType(), None), "null": _NULL,
}


def _json_top(definition: bytes) -> Column:
    format_for(SchemaType.JSON_SCHEMA).normalize(definition)  # refuses what the registry refuses
    # The raw text, not the normalized one: normalizing sorts keys, and properties keep their order.
    return _json_column(json.loads(definition), json.loads(definition), "#", ("#",))


def _json_column(node: Any, root: Any, path: str, refs: tuple[str, ...]) -> Column:
    if node is False:
        return _NULL  # no value is valid: the column is always null
    if not isinstance(node, dict) or not node:
        return _TEXT  # true or {}: any JSON value
    if isinstance(node.get("$ref"), str):
        return _json_ref(node["$ref"], root, path, refs)
    kinds = _json_kinds(node)
    if kinds is None:
        return _json_combinator(node, root, path, refs)
    kinds.discard("null")  # every column is nullable anyway
    if kinds == {"integer", "number"}:
        kinds = {"number"}
    if len(kinds) != 1:
        return _NULL if not kinds else _TEXT
    kind = kinds.pop()
    if kind == "object":
        return _json_object(node, root, path, refs)
    if kind == "array":
        items = node.get("items", True)
        if "prefixItems" in node or isinstance(items, list):
            return _TEXT  # a tuple: items of different types
        return _array(_json_column(items, root, f"{path}/items", refs))
    return _JSON_SCALARS.get(kind, _TEXT)


def _json_kinds(node: dict[str, Any]) -> set[str] | None:
    """The JSON types a schema allows, from `type` or inferred; None: it does not say."""
    declared = node.get("type")
    if isinstance(declared, str):
        return {declared}
    if isinstance(declared, list) and all(isinstance(t, str) for t in declared):
        return set(declared)
    if "properties" in node or "additionalProperties" in node:
        return {"object"}
    if "items" in node or "prefixItems" in node:
        return {"array"}
    if "const" in node:
        return {_json_kind(node["const"])}
    if isinstance(node.get("enum"), list):
        return {_json_kind(v) for v in node["enum"]}
    return None


def _json_kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "integer" if isinstance(value, int) else "number"
    return {str: "string", list: "array", dict: "object"}[type(value)]


def _json_combinator(node: dict[str, Any], root: Any, path: str, refs: tuple[str, ...]) -> Column:
    # `anyOf: [X, {"type": "null"}]` is how generators (pydantic) write an optional X, and
    # `allOf: [{"$ref": ...}]` a reference with a description; anything else is a real union.
    for keyword in ("anyOf", "oneOf", "allOf"):
        branches = node.get(keyword)
        if not isinstance(branches, list) or not branches:
            continue
        if keyword == "allOf":
            return _json_column(branches[0], root, f"{path}/allOf/0", refs) if len(branches) == 1 else _TEXT
        real = [(i, b) for i, b in enumerate(branches) if not (isinstance(b, dict) and b.get("type") in ("null", ["null"]))]
        if len(real) == 1:
            return _json_column(real[0][1], root, f"{path}/{keyword}/{real[0][0]}", refs)
        return _TEXT
    return _TEXT


def _json_ref(ref: str, root: Any, path: str, refs: tuple[str, ...]) -> Column:
    if ref != "#" and not ref.startswith("#/"):
        return _TEXT  # an anchor or an $id-relative URI: not followed, see the module docstring
    if ref in refs:
        raise InvalidArgument(f"JSON schema is recursive at {path}: $ref {ref!r} is reached from itself"
                              f" ({' -> '.join(refs)} -> {ref}); {_RECURSIVE}")
    target: Any = root
    for raw in ref[2:].split("/") if ref != "#" else []:
        part = urllib.parse.unquote(raw).replace("~1", "/").replace("~0", "~")
        if isinstance(target, dict) and part in target:
            target = target[part]
        elif isinstance(target, list) and part.isdigit() and int(part) < len(target):
            target = target[int(part)]
        else:
            raise InvalidArgument(f"JSON schema $ref {ref!r} at {path} points to nothing in the schema")
    return _json_column(target, root, ref, (*refs, ref))


def _json_object(node: dict[str, Any], root: Any, path: str, refs: tuple[str, ...]) -> Column:
    properties = node.get("properties")
    extra = node.get("additionalProperties")
    if isinstance(properties, dict) and properties:
        return _struct([(name, *_json_column(sub, root, f"{path}/properties/{name}", refs), None)
                        for name, sub in properties.items()])
    if extra is False:
        return _struct([])  # only {} is valid
    if isinstance(extra, dict) and extra:
        return _map((StringType(), None), _json_column(extra, root, f"{path}/additionalProperties", refs))
    return _TEXT  # free-form: any keys, any values


# --------------------------------------------------------------------------- Avro

_AVRO_PRIMITIVES: dict[str, Column] = {
    "null": _NULL, "boolean": (BooleanType(), None), "int": (IntegerType(), None), "long": (LongType(), None),
    "float": (FloatType(), None), "double": (DoubleType(), None), "bytes": (BinaryType(), None),
    "string": (StringType(), None),
}


def _millis_of_day(t: datetime.time) -> int:
    return ((t.hour * 60 + t.minute) * 60 + t.second) * 1000 + t.microsecond // 1000


def _micros_of_day(t: datetime.time) -> int:
    return ((t.hour * 60 + t.minute) * 60 + t.second) * 1_000_000 + t.microsecond


# Keyed like fastavro's LOGICAL_READERS ("<type>-<logicalType>"): a logical type fastavro
# does not apply (e.g. on the wrong base type) leaves the base type, here as there.
_AVRO_LOGICAL: dict[str, Column] = {
    "long-timestamp-millis": (TimestampType(), None), "long-timestamp-micros": (TimestampType(), None),
    "long-local-timestamp-millis": (TimestampNTZType(), None),
    "long-local-timestamp-micros": (TimestampNTZType(), None),
    "int-date": (DateType(), None), "string-uuid": (StringType(), str),
    "int-time-millis": (IntegerType(), _millis_of_day), "long-time-micros": (LongType(), _micros_of_day),
}
_SPARK_DECIMAL_DIGITS = 38


def _avro_top(definition: bytes) -> Column:
    normalized = format_for(SchemaType.AVRO).normalize(definition)  # refuses what the registry refuses
    named: dict[str, Any] = {}  # fastavro fills it: full name -> named type, to follow references
    schema = fastavro.parse_schema(json.loads(normalized), named)
    return _avro_column(schema, named, ())


def _avro_column(schema: Any, named: dict[str, Any], records: tuple[str, ...]) -> Column:
    if isinstance(schema, list):
        real = [branch for branch in schema if branch != "null"]
        if len(real) == 1:
            return _avro_column(real[0], named, records)
        return _NULL if not real else _TEXT
    if isinstance(schema, str):
        return _AVRO_PRIMITIVES.get(schema) or _avro_column(named[schema], named, records)
    kind = schema["type"]
    if isinstance(kind, dict | list):
        return _avro_column(kind, named, records)
    if kind in ("record", "error"):
        if schema["name"] in records:
            raise InvalidArgument(f"Avro schema is recursive: {schema['name']} contains itself"
                                  f" ({' -> '.join((*records, schema['name']))}); {_RECURSIVE}")
        inner = (*records, schema["name"])
        return _struct([(f["name"], *_avro_column(f["type"], named, inner), None) for f in schema["fields"]])
    if kind == "enum":
        return StringType(), None
    if kind == "array":
        return _array(_avro_column(schema["items"], named, records))
    if kind == "map":
        return _map((StringType(), None), _avro_column(schema["values"], named, records))
    logical = f"{kind}-{schema.get('logicalType')}"
    if logical in ("bytes-decimal", "fixed-decimal"):
        precision, scale = schema.get("precision"), schema.get("scale", 0)
        if not isinstance(precision, int):  # the registry takes it, but fastavro cannot read one
            raise InvalidArgument(f"Avro decimal {_avro_where(records)}has no precision: its values cannot be read")
        if precision > _SPARK_DECIMAL_DIGITS:
            return StringType(), str
        return DecimalType(precision, scale), None
    if logical in _AVRO_LOGICAL:
        return _AVRO_LOGICAL[logical]
    return (BinaryType(), None) if kind == "fixed" else _AVRO_PRIMITIVES[kind]


def _avro_where(records: tuple[str, ...]) -> str:
    return f"in {records[-1]} " if records else ""


# --------------------------------------------------------------------------- Protobuf

_F = FieldDescriptor


def _proto_bool(value: Any) -> bool:
    return value if type(value) is bool else value == "true"  # a map key arrives as "true"/"false"


# Protobuf's JSON mapping (what decode returns) writes 64-bit integers and map keys as
# strings, bytes as base64 and NaN/Infinity as strings: each converter takes both forms.
_PROTO_SCALARS: dict[int, Column] = {
    **dict.fromkeys((_F.TYPE_INT32, _F.TYPE_SINT32, _F.TYPE_SFIXED32), (IntegerType(), int)),
    **dict.fromkeys((_F.TYPE_INT64, _F.TYPE_SINT64, _F.TYPE_SFIXED64, _F.TYPE_UINT32, _F.TYPE_FIXED32), (LongType(), int)),
    **dict.fromkeys((_F.TYPE_UINT64, _F.TYPE_FIXED64), (DecimalType(20, 0), decimal.Decimal)),  # beyond a long
    _F.TYPE_FLOAT: (FloatType(), float), _F.TYPE_DOUBLE: (DoubleType(), float),
    _F.TYPE_BOOL: (BooleanType(), _proto_bool), _F.TYPE_STRING: (StringType(), None),
    _F.TYPE_BYTES: (BinaryType(), base64.b64decode),
}


def _proto_timestamp(text: str) -> datetime.datetime:
    stamp = timestamp_pb2.Timestamp()
    stamp.FromJsonString(text)  # protobuf's own RFC 3339 reader, the inverse of its writer
    return stamp.ToDatetime(tzinfo=datetime.UTC)


def _proto_duration(text: str) -> datetime.timedelta:
    duration = duration_pb2.Duration()
    duration.FromJsonString(text)
    return duration.ToTimedelta()


# The JSON mapping writes these messages in their own form, not as their fields.
_PROTO_WELL_KNOWN: dict[str, Column] = {
    "google.protobuf.Timestamp": (TimestampType(), _proto_timestamp),
    "google.protobuf.Duration": (DayTimeIntervalType(), _proto_duration),
    "google.protobuf.FieldMask": (StringType(), None),
    **dict.fromkeys(("google.protobuf.Struct", "google.protobuf.Value", "google.protobuf.ListValue",
                     "google.protobuf.Any"), _TEXT),
}
_PROTO_WRAPPERS = frozenset(f"google.protobuf.{name}Value" for name in
                            ("Double", "Float", "Int64", "UInt64", "Int32", "UInt32", "Bool", "String", "Bytes"))


def _protobuf_top(definition: bytes) -> Column:
    return _proto_message(message_descriptor(definition), ())


def _proto_message(descriptor: Descriptor, messages: tuple[str, ...]) -> Column:
    name = descriptor.full_name
    if name in _PROTO_WELL_KNOWN:
        return _PROTO_WELL_KNOWN[name]
    if name in _PROTO_WRAPPERS:
        return _proto_value(descriptor.fields_by_name["value"], messages)
    if name in messages:
        raise InvalidArgument(f"protobuf message {name} is recursive: it contains itself"
                              f" ({' -> '.join((*messages, name))}); {_RECURSIVE}")
    inner = (*messages, name)
    return _struct([(f.name, *_proto_field(f, inner), _proto_absent(f)) for f in descriptor.fields])


def _proto_field(field: FieldDescriptor, messages: tuple[str, ...]) -> Column:
    if is_map(field):
        entry = field.message_type
        return _map(_proto_value(entry.fields_by_name["key"], messages),
                    _proto_value(entry.fields_by_name["value"], messages))
    column = _proto_value(field, messages)
    return _array(column) if field.is_repeated else column


def _proto_value(field: FieldDescriptor, messages: tuple[str, ...]) -> Column:
    if field.type in (_F.TYPE_MESSAGE, _F.TYPE_GROUP):
        return _proto_message(field.message_type, messages)
    if field.type == _F.TYPE_ENUM:
        names = {value.number: value.name for value in field.enum_type.values}
        # The JSON mapping writes a known value's name and an unknown (open enum) value's number.
        return StringType(), lambda v: v if type(v) is str else names.get(v, str(v))
    return _PROTO_SCALARS[field.type]


def _proto_absent(field: FieldDescriptor) -> Any:
    """The value of a field the JSON mapping left out: it omits empty lists and maps, and
    fields without presence that hold their default."""
    if field.is_repeated:
        return {} if is_map(field) else []
    return None if field.has_presence else field.default_value

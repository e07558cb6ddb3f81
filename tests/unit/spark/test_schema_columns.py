"""Spark column types for registry schemas, and payloads decoded into values Spark accepts.

Every decoded value goes through `spark_accepts`: PySpark's own type verifier (what
createDataFrame checks) and the conversion a Python data source's rows go through on
their way to Spark (LocalDataToArrowConversion, then an Arrow batch of the column's Arrow
type), so a value Spark would refuse fails here without a JVM.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import struct
from decimal import Decimal
from typing import Any

import pytest

pytest.importorskip("pyspark", reason="pyspark (the report extra) is not installed")

import pyarrow as pa
from hypothesis import given
from hypothesis import strategies as st
from pyspark.sql.conversion import LocalDataToArrowConversion
from pyspark.sql.pandas.types import to_arrow_schema
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
    _make_type_verifier,
)

from danube_zmq.schemas.formats import format_for
from danube_zmq.schemas.types import SchemaType
from danube_zmq.spark import schema_columns
from danube_zmq.spark.schema_columns import spark_type, value_decoder
from danube_zmq.transport.errors import InvalidArgument

UTC = dt.UTC
# Apache avro (beside fastavro in the registry) warns of logical types it does not apply.
pytestmark = pytest.mark.filterwarnings("ignore::avro.errors.IgnoredLogicalType")
INT64 = st.integers(-(2**63), 2**63 - 1)


def struct_of(*fields: tuple[str, DataType]) -> StructType:
    return StructType([StructField(name, t, True) for name, t in fields])


def array_of(t: DataType) -> ArrayType:
    return ArrayType(t, True)


def map_of(k: DataType, v: DataType) -> MapType:
    return MapType(k, v, True)


def spark_accepts(data_type: DataType, *values: Any) -> None:
    verify = _make_type_verifier(data_type)
    for value in values:
        verify(value)
    schema = to_arrow_schema(StructType([StructField("value", data_type, True)]), timezone="UTC")
    convert = LocalDataToArrowConversion._create_converter(data_type)
    pa.RecordBatch.from_arrays([[convert(v) for v in values]], schema=schema)


def round_trip(schema_type: SchemaType, definition: bytes, *values: Any) -> list[Any]:
    """Encode each value with the registry's format, decode it for Spark, check Spark takes it."""
    fmt = format_for(schema_type)
    decode = value_decoder(schema_type, definition)
    decoded = [decode(fmt.encode(definition, v)) for v in values]
    spark_accepts(spark_type(schema_type, definition), *decoded)
    return decoded


def d(schema: Any) -> bytes:
    return json.dumps(schema).encode()


@pytest.mark.parametrize(("data_type", "value"), [
    (DoubleType(), 1),  # an int where Spark wants a float
    (IntegerType(), True),
    (LongType(), 2**63),
    (BinaryType(), "x"),
    (struct_of(("a", LongType())), ("x",)),
    (array_of(DoubleType()), [1.0, 2]),
    (map_of(StringType(), LongType()), {"k": 1.5}),
    (TimestampType(), dt.date(2024, 1, 1)),
])
def test_the_check_refuses_what_spark_refuses(data_type: DataType, value: Any) -> None:
    with pytest.raises((TypeError, ValueError)):
        spark_accepts(data_type, value)


# --------------------------------------------------------------------------- string, bytes, number


@pytest.mark.parametrize(("schema_type", "definition", "expected"), [
    (SchemaType.STRING, b"", StringType()),
    (SchemaType.BYTES, b"anything", BinaryType()),
    (SchemaType.NUMBER, b"int64", LongType()),
    (SchemaType.NUMBER, b"long", LongType()),
    (SchemaType.NUMBER, b"", LongType()),  # the registry's default kind
    (SchemaType.NUMBER, b"float64", DoubleType()),
    (SchemaType.NUMBER, b"double", DoubleType()),
])
def test_simple_types(schema_type: SchemaType, definition: bytes, expected: DataType) -> None:
    assert spark_type(schema_type, definition) == expected


@given(st.text())
def test_string_round_trip(text: str) -> None:
    assert round_trip(SchemaType.STRING, b"", text) == [text]


@given(st.binary())
def test_bytes_round_trip(data: bytes) -> None:
    assert round_trip(SchemaType.BYTES, b"", data) == [data]


@given(INT64)
def test_int64_round_trip(n: int) -> None:
    assert round_trip(SchemaType.NUMBER, b"int64", n) == [n]


@given(st.floats(allow_nan=False))
def test_float64_round_trip(x: float) -> None:
    assert round_trip(SchemaType.NUMBER, b"float64", x) == [x]


def test_a_schema_type_may_be_named_by_text() -> None:
    assert spark_type("json", d({"type": "integer"})) == LongType()  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="unknown schema type 'xml'"):
        spark_type("xml", b"")  # type: ignore[arg-type]


def test_a_bad_number_definition_is_refused() -> None:
    with pytest.raises(InvalidArgument, match="int64 or float64"):
        spark_type(SchemaType.NUMBER, b"int32")


# --------------------------------------------------------------------------- JSON Schema

ORDER_JSON = d({
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "properties": {  # not in alphabetical order: the columns keep this one
        "order_id": {"type": "string"},
        "placed_at": {"type": "string", "format": "date-time"},
        "status": {"enum": ["new", "paid", "shipped"]},
        "quantity": {"type": "integer", "minimum": 1},
        "total": {"type": "number"},
        "gift": {"type": "boolean"},
        "note": {"type": ["string", "null"]},
        "customer": {"$ref": "#/$defs/customer"},
        "lines": {"type": "array", "items": {"$ref": "#/$defs/line"}},
        "attributes": {"type": "object", "additionalProperties": {"type": "string"}},
        "coupon": {"anyOf": [{"$ref": "#/$defs/coupon"}, {"type": "null"}]},
        "discount": {"oneOf": [{"type": "number"}, {"type": "string", "pattern": "^[0-9]+%$"}]},
        "metadata": {"type": "object"},
        "score": {"type": ["integer", "number"]},
    },
    "required": ["order_id", "customer", "lines"],
    "$defs": {
        "customer": {"type": "object", "required": ["id"], "properties": {
            "id": {"type": "integer"}, "name": {"type": "string"}, "address": {"$ref": "#/$defs/address"}}},
        "address": {"type": "object", "properties": {"street": {"type": "string"}, "zip": {"type": "string"}}},
        "line": {"type": "object", "properties": {
            "sku": {"type": "string"}, "qty": {"type": "integer"}, "price": {"type": "number"}}},
        "coupon": {"type": "object", "properties": {"code": {"type": "string"}}},
    },
})
ORDER_JSON_TYPE = struct_of(
    ("order_id", StringType()), ("placed_at", StringType()), ("status", StringType()), ("quantity", LongType()),
    ("total", DoubleType()), ("gift", BooleanType()), ("note", StringType()),
    ("customer", struct_of(("id", LongType()), ("name", StringType()),
                           ("address", struct_of(("street", StringType()), ("zip", StringType()))))),
    ("lines", array_of(struct_of(("sku", StringType()), ("qty", LongType()), ("price", DoubleType())))),
    ("attributes", map_of(StringType(), StringType())),
    ("coupon", struct_of(("code", StringType()))),
    ("discount", StringType()), ("metadata", StringType()), ("score", DoubleType()),
)


def test_json_schema_type() -> None:
    assert spark_type(SchemaType.JSON_SCHEMA, ORDER_JSON) == ORDER_JSON_TYPE


def test_json_schema_round_trip() -> None:
    full = {
        "order_id": "o-1", "placed_at": "2024-05-01T12:00:00Z", "status": "paid", "quantity": 3, "total": 20,
        "gift": False, "note": None, "customer": {"id": 7, "name": "Ada", "address": {"street": "Main", "zip": "0815"}},
        "lines": [{"sku": "a", "qty": 1, "price": 2.5}, {"sku": "b", "qty": 2, "price": 10}],
        "attributes": {"channel": "web"}, "coupon": {"code": "X"}, "discount": "10%",
        "metadata": {"b": [1, 2], "a": None}, "score": 4,
    }
    minimal = {"order_id": "o-2", "customer": {"id": 1}, "lines": [], "discount": 5, "coupon": None}
    assert round_trip(SchemaType.JSON_SCHEMA, ORDER_JSON, full, minimal) == [
        ("o-1", "2024-05-01T12:00:00Z", "paid", 3, 20.0, False, None, (7, "Ada", ("Main", "0815")),
         [("a", 1, 2.5), ("b", 2, 10.0)], {"channel": "web"}, ("X",), '"10%"', '{"b":[1,2],"a":null}', 4.0),
        ("o-2", None, None, None, None, None, None, (1, None, None), [], None, None, "5", None, None),
    ]


@pytest.mark.parametrize(("schema", "expected", "value", "decoded"), [
    ({"type": "array", "items": {"type": "integer"}}, array_of(LongType()), [1, 2], [1, 2]),
    ({"type": "string", "format": "date-time"}, StringType(), "2024-01-01T00:00:00Z", "2024-01-01T00:00:00Z"),
    ({"type": "number"}, DoubleType(), 3, 3.0),
    ({"type": "boolean"}, BooleanType(), True, True),
    ({"type": "null"}, NullType(), None, None),
    ({"enum": ["a", "b"]}, StringType(), "b", "b"),
    ({"const": 3}, LongType(), 3, 3),
    ({"enum": [1, 2.5, None]}, DoubleType(), 1, 1.0),
    ({"type": "object", "additionalProperties": {"type": "array", "items": {"type": "number"}}},
     map_of(StringType(), array_of(DoubleType())), {"x": [1, 2.5], "y": []}, {"x": [1.0, 2.5], "y": []}),
    ({"type": "object", "additionalProperties": False}, StructType([]), {}, ()),
    ({"properties": {"a": {"type": "integer"}}}, struct_of(("a", LongType())), {"a": 1}, (1,)),
    ({}, StringType(), {"a": [1, "é"]}, '{"a":[1,"é"]}'),
    ({"type": ["string", "integer"]}, StringType(), 5, "5"),
    ({"type": "array"}, array_of(StringType()), [1, "a", None, {}], ["1", '"a"', None, "{}"]),
    ({"$schema": "http://json-schema.org/draft-07/schema#", "type": "array",
      "items": [{"type": "string"}, {"type": "integer"}]}, StringType(), ["a", 1], '["a",1]'),
    ({"type": "array", "prefixItems": [{"type": "string"}]}, StringType(), ["a"], '["a"]'),
    ({"$schema": "http://json-schema.org/draft-07/schema#", "$ref": "#/definitions/p",
      "definitions": {"p": {"type": "object", "properties": {"x": {"type": "integer"}}}}},
     struct_of(("x", LongType())), {"x": 2}, (2,)),
    ({"allOf": [{"$ref": "#/$defs/flag"}], "$defs": {"flag": {"type": "boolean"}}}, BooleanType(), False, False),
    ({"allOf": [{"type": "object"}, {"required": ["a"]}]}, StringType(), {"a": 1}, '{"a":1}'),
    ({"anyOf": [{"type": "integer"}, {"type": "string"}]}, StringType(), "x", '"x"'),
    ({"type": "object", "properties": {"a/b": {"type": "integer"}}, "$defs": {"x~y": {"type": "string"}}},
     struct_of(("a/b", LongType())), {"a/b": 1}, (1,)),
    ({"$ref": "#/$defs/x~0y", "$defs": {"x~y": {"type": "string"}}}, StringType(), "s", "s"),
])
def test_json_schema_shapes(schema: Any, expected: DataType, value: Any, decoded: Any) -> None:
    definition = d(schema)
    assert spark_type(SchemaType.JSON_SCHEMA, definition) == expected
    assert round_trip(SchemaType.JSON_SCHEMA, definition, value) == [decoded]


PERSON_JSON = d({"type": "object", "required": ["id"], "properties": {
    "id": {"type": "integer"}, "name": {"type": "string"}, "score": {"type": "number"},
    "tags": {"type": "array", "items": {"type": "string"}},
    "flags": {"type": "object", "additionalProperties": {"type": "boolean"}}}})


@given(st.fixed_dictionaries({"id": INT64}, optional={
    "name": st.text(), "score": st.floats(allow_nan=False, allow_infinity=False) | st.integers(-(2**53), 2**53),
    "tags": st.lists(st.text()), "flags": st.dictionaries(st.text(), st.booleans())}))
def test_json_schema_round_trip_any_value(value: dict[str, Any]) -> None:
    score = value.get("score")
    expected = (value["id"], value.get("name"), None if score is None else float(score), value.get("tags"),
                value.get("flags"))
    [decoded] = round_trip(SchemaType.JSON_SCHEMA, PERSON_JSON, value)
    assert decoded == expected
    assert decoded[2] is None or type(decoded[2]) is float


@pytest.mark.parametrize(("schema", "message"), [
    ({"$ref": "#/$defs/node", "$defs": {"node": {"type": "object", "properties": {
        "value": {"type": "integer"}, "next": {"$ref": "#/$defs/node"}}}}},
     r"recursive at #/\$defs/node/properties/next: \$ref '#/\$defs/node' is reached from itself"),
    ({"type": "object", "properties": {"children": {"type": "array", "items": {"$ref": "#"}}}},
     r"recursive at #/properties/children/items: \$ref '#'"),
    ({"$ref": "#/$defs/a", "$defs": {"a": {"type": "array", "items": {"$ref": "#/$defs/b"}},
                                     "b": {"anyOf": [{"$ref": "#/$defs/a"}, {"type": "null"}]}}},
     r"recursive .*#/\$defs/a -> #/\$defs/b -> #/\$defs/a"),
])
def test_a_recursive_json_schema_is_refused(schema: Any, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message + ".*a Spark column cannot hold a recursive type"):
        spark_type(SchemaType.JSON_SCHEMA, d(schema))
    with pytest.raises(InvalidArgument, match="recursive"):
        value_decoder(SchemaType.JSON_SCHEMA, d(schema))


@pytest.mark.parametrize(("definition", "message"), [
    (b"{not json", "not valid JSON"),
    (d({"type": 5}), "invalid JSON schema"),
    (d([1]), "must be a JSON object or boolean"),
])
def test_a_bad_json_schema_is_refused(definition: bytes, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        spark_type(SchemaType.JSON_SCHEMA, definition)


# --------------------------------------------------------------------------- Avro


def decimal_of(precision: int, scale: int, base: str = "bytes", **extra: Any) -> dict[str, Any]:
    return {"type": base, "logicalType": "decimal", "precision": precision, "scale": scale, **extra}


ORDER_AVRO = d({"type": "record", "name": "Order", "namespace": "shop", "fields": [
    {"name": "id", "type": "long"},
    {"name": "qty", "type": "int"},
    {"name": "weight", "type": "float"},
    {"name": "total", "type": "double"},
    {"name": "paid", "type": "boolean"},
    {"name": "note", "type": ["null", "string"], "default": None},
    {"name": "status", "type": {"type": "enum", "name": "Status", "symbols": ["NEW", "PAID"]}},
    {"name": "ship_to", "type": {"type": "record", "name": "Address", "fields": [
        {"name": "street", "type": "string"}, {"name": "zip", "type": "string"}]}},
    {"name": "bill_to", "type": ["null", "Address"], "default": None},  # the named type again, by name
    {"name": "lines", "type": {"type": "array", "items": {"type": "record", "name": "Line", "fields": [
        {"name": "sku", "type": "string"}, {"name": "price", "type": decimal_of(9, 2)}]}}},
    {"name": "counters", "type": {"type": "map", "values": "long"}},
    {"name": "checksum", "type": {"type": "fixed", "name": "Md5", "size": 4}},
    {"name": "blob", "type": "bytes"},
    {"name": "placed_at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    {"name": "seen_at", "type": {"type": "long", "logicalType": "timestamp-micros"}},
    {"name": "local_at", "type": {"type": "long", "logicalType": "local-timestamp-millis"}},
    {"name": "ship_on", "type": {"type": "int", "logicalType": "date"}},
    {"name": "cutoff", "type": {"type": "int", "logicalType": "time-millis"}},
    {"name": "cutoff_us", "type": {"type": "long", "logicalType": "time-micros"}},
    {"name": "tracking", "type": {"type": "string", "logicalType": "uuid"}},
    {"name": "fee", "type": decimal_of(12, 4, "fixed", name="Fee", size=8)},
    {"name": "ref", "type": ["null", "long", "string"], "default": None},
    {"name": "nothing", "type": "null"},
    {"name": "odd", "type": {"type": "string", "logicalType": "timestamp-millis"}},  # not applied: a string
]})
ADDRESS_TYPE = struct_of(("street", StringType()), ("zip", StringType()))
ORDER_AVRO_TYPE = struct_of(
    ("id", LongType()), ("qty", IntegerType()), ("weight", FloatType()), ("total", DoubleType()),
    ("paid", BooleanType()), ("note", StringType()), ("status", StringType()), ("ship_to", ADDRESS_TYPE),
    ("bill_to", ADDRESS_TYPE), ("lines", array_of(struct_of(("sku", StringType()), ("price", DecimalType(9, 2))))),
    ("counters", map_of(StringType(), LongType())), ("checksum", BinaryType()), ("blob", BinaryType()),
    ("placed_at", TimestampType()), ("seen_at", TimestampType()), ("local_at", TimestampNTZType()),
    ("ship_on", DateType()), ("cutoff", IntegerType()), ("cutoff_us", LongType()), ("tracking", StringType()),
    ("fee", DecimalType(12, 4)), ("ref", StringType()), ("nothing", NullType()), ("odd", StringType()),
)


def test_avro_type() -> None:
    assert spark_type(SchemaType.AVRO, ORDER_AVRO) == ORDER_AVRO_TYPE


def test_avro_round_trip() -> None:
    placed = dt.datetime(2024, 5, 1, 12, 0, 0, 123000, tzinfo=UTC)
    seen = dt.datetime(2024, 5, 1, 12, 0, 0, 123456, tzinfo=UTC)
    local = dt.datetime(2024, 5, 1, 14, 0, 0, 5000)
    value = {
        "id": 2**40, "qty": -3, "weight": 1.5, "total": 20.25, "paid": True, "note": "ring twice", "status": "PAID",
        "ship_to": {"street": "Main", "zip": "0815"}, "bill_to": {"street": "Side", "zip": "1"},
        "lines": [{"sku": "a", "price": Decimal("2.50")}, {"sku": "b", "price": Decimal("-1234567.89")}],
        "counters": {"views": 3}, "checksum": b"\x00\x01\x02\xff", "blob": b"", "placed_at": placed, "seen_at": seen,
        "local_at": local, "ship_on": dt.date(2024, 5, 3), "cutoff": dt.time(9, 30, 15, 250000),
        "cutoff_us": dt.time(23, 59, 59, 999999), "tracking": "8b3f6a4e-4d6f-4c33-9a67-0d2f7f1c9f10",
        "fee": Decimal("12.3456"), "ref": 5, "nothing": None, "odd": "not a time",
    }
    sparse = {**value, "note": None, "bill_to": None, "lines": [], "counters": {}, "ref": "r-9"}
    decoded, decoded_sparse = round_trip(SchemaType.AVRO, ORDER_AVRO, value, sparse)
    assert decoded == (
        2**40, -3, 1.5, 20.25, True, "ring twice", "PAID", ("Main", "0815"), ("Side", "1"),
        [("a", Decimal("2.50")), ("b", Decimal("-1234567.89"))], {"views": 3}, b"\x00\x01\x02\xff", b"",
        placed, seen, local, dt.date(2024, 5, 3), 34215250, 86399999999, "8b3f6a4e-4d6f-4c33-9a67-0d2f7f1c9f10",
        Decimal("12.3456"), "5", None, "not a time",
    )
    assert decoded_sparse[5] is None and decoded_sparse[8] is None and decoded_sparse[21] == '"r-9"'
    assert decoded_sparse[9:11] == ([], {})


@pytest.mark.parametrize(("schema", "expected", "value", "decoded"), [
    ("string", StringType(), "x", "x"),
    ({"type": "array", "items": "int"}, array_of(IntegerType()), [1, 2], [1, 2]),
    ({"type": "map", "values": ["null", "double"]}, map_of(StringType(), DoubleType()), {"a": None, "b": 1.5},
     {"a": None, "b": 1.5}),
    (["null", "int"], IntegerType(), None, None),
    (["int", "bytes"], StringType(), b"\xff", '"/w=="'),  # JSON text; bytes in base64
    (decimal_of(40, 2), StringType(), Decimal("12345678901234567890123456789012345678.12"),
     "12345678901234567890123456789012345678.12"),  # beyond Spark's 38 digits: the decimal's text
    ({"type": "record", "name": "Tick", "fields": [{"name": "at", "type": [
        "null", "string", {"type": "long", "logicalType": "timestamp-millis"}, decimal_of(4, 1)]}]},
     struct_of(("at", StringType())), {"at": dt.datetime(2024, 1, 1, tzinfo=UTC)}, ('"2024-01-01T00:00:00+00:00"',)),
    ({"type": "error", "name": "Oops", "fields": [{"name": "why", "type": "string"}]},
     struct_of(("why", StringType())), {"why": "x"}, ("x",)),
])
def test_avro_shapes(schema: Any, expected: DataType, value: Any, decoded: Any) -> None:
    definition = d(schema)
    assert spark_type(SchemaType.AVRO, definition) == expected
    assert round_trip(SchemaType.AVRO, definition, value) == [decoded]


def test_avro_union_fallback_keeps_decimals_exact() -> None:
    definition = d(["string", decimal_of(6, 3)])
    assert round_trip(SchemaType.AVRO, definition, Decimal("1.250")) == ['"1.250"']


EVENT_AVRO = d({"type": "record", "name": "Event", "fields": [
    {"name": "id", "type": "long"}, {"name": "score", "type": "float"}, {"name": "name", "type": ["null", "string"]},
    {"name": "payload", "type": "bytes"}, {"name": "labels", "type": {"type": "array", "items": "string"}},
    {"name": "sizes", "type": {"type": "map", "values": "int"}}]})


@given(INT64, st.floats(width=32), st.none() | st.text(), st.binary(), st.lists(st.text()),
       st.dictionaries(st.text(), st.integers(-(2**31), 2**31 - 1)))
def test_avro_round_trip_any_value(n: int, score: float, name: str | None, payload: bytes, labels: list[str],
                                   sizes: dict[str, int]) -> None:
    value = {"id": n, "score": score, "name": name, "payload": payload, "labels": labels, "sizes": sizes}
    [decoded] = round_trip(SchemaType.AVRO, EVENT_AVRO, value)
    if score != score:  # NaN
        assert decoded[1] != decoded[1]
        decoded = (*decoded[:1], score, *decoded[2:])
    assert decoded == (n, score, name, payload, labels, sizes)
    assert struct.pack("<f", decoded[1]) == struct.pack("<f", score)


def test_avro_reads_an_older_writer_version() -> None:
    v1 = d({"type": "record", "name": "User", "fields": [{"name": "id", "type": "long"}]})
    v2 = d({"type": "record", "name": "User", "fields": [
        {"name": "id", "type": "long"}, {"name": "email", "type": ["null", "string"], "default": None}]})
    decode = value_decoder(SchemaType.AVRO, v2, writer=v1)
    assert decode(format_for(SchemaType.AVRO).encode(v1, {"id": 7})) == (7, None)
    assert value_decoder(SchemaType.AVRO, v2, writer=v2)(format_for(SchemaType.AVRO).encode(v2, {"id": 1})) == (1, None)


@pytest.mark.parametrize(("schema", "message"), [
    ({"type": "record", "name": "Node", "namespace": "ll", "fields": [
        {"name": "value", "type": "int"}, {"name": "next", "type": ["null", "Node"], "default": None}]},
     r"Avro schema is recursive: ll.Node contains itself \(ll.Node -> ll.Node\)"),
    ({"type": "record", "name": "Tree", "fields": [{"name": "kids", "type": {"type": "array", "items": {
        "type": "record", "name": "Kid", "fields": [{"name": "tree", "type": ["null", "Tree"]}]}}}]},
     r"recursive: Tree contains itself \(Tree -> Kid -> Tree\)"),
    ({"type": "bytes", "logicalType": "decimal"}, "Avro decimal has no precision"),
    ({"type": "record", "name": "R", "fields": [{"name": "d", "type": {"type": "bytes", "logicalType": "decimal"}}]},
     "Avro decimal in R has no precision"),
    ({"type": "record", "name": "R"}, "invalid Avro schema"),
    ("nope", "invalid Avro schema"),
])
def test_a_bad_avro_schema_is_refused(schema: Any, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        spark_type(SchemaType.AVRO, d(schema))


def test_avro_schema_that_is_not_json_is_refused() -> None:
    with pytest.raises(InvalidArgument, match="not valid JSON"):
        spark_type(SchemaType.AVRO, b"{record")


# --------------------------------------------------------------------------- Protobuf

ORDER_PROTO = b"""// danube: message=shop.Order
syntax = "proto3";
package shop;
import "google/protobuf/timestamp.proto";
import "google/protobuf/duration.proto";
import "google/protobuf/wrappers.proto";
import "google/protobuf/struct.proto";

message Address { string street = 1; string zip = 2; }

message Order {
  enum Status { STATUS_UNSPECIFIED = 0; NEW = 1; PAID = 2; }
  message Line { string sku = 1; sint32 qty = 2; double price = 3; }
  int64 id = 1;
  int32 qty = 2;
  uint32 points = 3;
  uint64 big = 4;
  sint64 delta = 5;
  fixed64 f64 = 6;
  sfixed32 sf32 = 7;
  float weight = 8;
  double total = 9;
  bool paid = 10;
  string note = 11;
  bytes blob = 12;
  Status status = 13;
  Address ship_to = 14;
  repeated Line lines = 15;
  repeated string tags = 16;
  map<string, int64> counters = 17;
  map<int32, Address> by_zone = 18;
  optional string coupon = 19;
  oneof payment { string card = 20; string iban = 21; }
  google.protobuf.Timestamp placed_at = 22;
  google.protobuf.Duration window = 23;
  google.protobuf.StringValue gift_message = 24;
  google.protobuf.Struct extra = 25;
  map<bool, string> flags = 26;
  fixed32 f32 = 27;
  sfixed64 sf64 = 28;
  google.protobuf.UInt64Value big_wrapped = 29;
  repeated google.protobuf.Timestamp history = 30;
}
"""
ORDER_PROTO_TYPE = struct_of(
    ("id", LongType()), ("qty", IntegerType()), ("points", LongType()), ("big", DecimalType(20, 0)),
    ("delta", LongType()), ("f64", DecimalType(20, 0)), ("sf32", IntegerType()), ("weight", FloatType()),
    ("total", DoubleType()), ("paid", BooleanType()), ("note", StringType()), ("blob", BinaryType()),
    ("status", StringType()), ("ship_to", ADDRESS_TYPE),
    ("lines", array_of(struct_of(("sku", StringType()), ("qty", IntegerType()), ("price", DoubleType())))),
    ("tags", array_of(StringType())), ("counters", map_of(StringType(), LongType())),
    ("by_zone", map_of(IntegerType(), ADDRESS_TYPE)), ("coupon", StringType()), ("card", StringType()),
    ("iban", StringType()), ("placed_at", TimestampType()), ("window", DayTimeIntervalType()),
    ("gift_message", StringType()), ("extra", StringType()), ("flags", map_of(BooleanType(), StringType())),
    ("f32", LongType()), ("sf64", LongType()), ("big_wrapped", DecimalType(20, 0)), ("history", array_of(TimestampType())),
)


def test_protobuf_type() -> None:
    assert spark_type(SchemaType.PROTOBUF, ORDER_PROTO) == ORDER_PROTO_TYPE


def test_protobuf_round_trip() -> None:
    value = {
        "id": "9007199254740993", "qty": -5, "points": 4000000000, "big": "18446744073709551615", "delta": -3,
        "f64": "18446744073709551614", "sf32": -7, "weight": 1.5, "total": 20.25, "paid": True, "note": "n",
        "blob": base64.b64encode(b"\x00\xff").decode(), "status": "PAID", "ship_to": {"street": "Main", "zip": "0815"},
        "lines": [{"sku": "a", "qty": -1, "price": 2.5}], "tags": ["x", "y"], "counters": {"a": "1"},
        "by_zone": {"3": {"street": "S", "zip": "Z"}}, "coupon": "", "card": "4111",
        "placed_at": "2024-05-01T12:00:00.123456789Z", "window": "90.5s", "gift_message": "hi",
        "extra": {"a": [1, "x", None]}, "flags": {"true": "yes"}, "f32": 4294967295, "sf64": str(-(2**63)),
        "big_wrapped": "18446744073709551615", "history": ["1970-01-01T00:00:00Z"],
    }
    [decoded] = round_trip(SchemaType.PROTOBUF, ORDER_PROTO, value)
    assert decoded == (
        9007199254740993, -5, 4000000000, Decimal(2**64 - 1), -3, Decimal(2**64 - 2), -7, 1.5, 20.25, True, "n",
        b"\x00\xff", "PAID", ("Main", "0815"), [("a", -1, 2.5)], ["x", "y"], {"a": 1}, {3: ("S", "Z")},
        "",  # a proto3 optional field set to its default is present: not None
        "4111", None, dt.datetime(2024, 5, 1, 12, 0, 0, 123456, tzinfo=UTC), dt.timedelta(seconds=90.5), "hi",
        '{"a":[1.0,"x",null]}', {True: "yes"}, 4294967295, -(2**63), Decimal(2**64 - 1),
        [dt.datetime(1970, 1, 1, tzinfo=UTC)],
    )


def test_protobuf_fields_left_out_of_the_payload() -> None:
    # Fields without presence are their default, as any protobuf reader sees them; fields
    # with presence (messages, optional, oneof members, wrappers) are None.
    [decoded] = round_trip(SchemaType.PROTOBUF, ORDER_PROTO, {})
    assert decoded == (
        0, 0, 0, Decimal(0), 0, Decimal(0), 0, 0.0, 0.0, False, "", b"", "STATUS_UNSPECIFIED", None, [], [], {}, {},
        None, None, None, None, None, None, None, {}, 0, 0, None, [],
    )
    assert [type(v) for v in decoded[7:9]] == [float, float]


def test_protobuf_special_values() -> None:
    value = {"status": 7, "total": "NaN", "weight": "-Infinity"}  # 7: a number the open enum does not name
    [decoded] = round_trip(SchemaType.PROTOBUF, ORDER_PROTO, value)
    assert decoded[12] == "7"
    assert decoded[8] != decoded[8] and decoded[7] == float("-inf")


ITEM_PROTO2 = b"""syntax = "proto2";
package shop;
message Item {
  enum Kind { BOOK = 1; TOY = 2; }
  required string sku = 1;
  optional int32 qty = 2 [default = 1];
  optional Kind kind = 3;
  repeated int64 ids = 4;
  optional group Extra = 5 { optional string note = 6; }
}
"""


def test_protobuf_proto2() -> None:
    assert spark_type(SchemaType.PROTOBUF, ITEM_PROTO2) == struct_of(
        ("sku", StringType()), ("qty", IntegerType()), ("kind", StringType()), ("ids", array_of(LongType())),
        ("extra", struct_of(("note", StringType()))))
    assert round_trip(SchemaType.PROTOBUF, ITEM_PROTO2, {"sku": "a"},
                      {"sku": "b", "qty": 0, "kind": "TOY", "ids": [1, "2"], "extra": {"note": "n"}}) == [
        ("a", None, None, [], None),  # optional fields with presence: absent, whatever their default
        ("b", 0, "TOY", [1, 2], ("n",)),
    ]


@given(INT64, st.integers(-(2**31), 2**31 - 1), st.integers(0, 2**64 - 1), st.text(), st.binary(),
       st.lists(st.text()), st.dictionaries(st.integers(-(2**31), 2**31 - 1), st.booleans()))
def test_protobuf_round_trip_any_value(i64: int, i32: int, u64: int, text: str, data: bytes, tags: list[str],
                                       marks: dict[int, bool]) -> None:
    value = {"id": str(i64), "qty": i32, "big": str(u64), "note": text, "blob": base64.b64encode(data).decode(),
             "tags": tags, "flags": {}, "by_zone": {str(k): {"street": str(v)} for k, v in marks.items()}}
    [decoded] = round_trip(SchemaType.PROTOBUF, ORDER_PROTO, value)
    assert decoded[:4:3] == (i64, u64) and decoded[1] == i32
    assert (decoded[10], decoded[11], decoded[15]) == (text, data, tags)
    assert decoded[17] == {k: (str(v), "") for k, v in marks.items()}


@pytest.mark.parametrize(("body", "message"), [
    ("message Node { int32 value = 1; Node next = 2; }",
     r"protobuf message shop.Node is recursive: it contains itself \(shop.Node -> shop.Node\)"),
    ("message Tree { repeated Branch branches = 1; }\nmessage Branch { map<string, Tree> trees = 1; }",
     r"shop.Tree is recursive: it contains itself \(shop.Tree -> shop.Branch -> shop.Tree\)"),
])
def test_a_recursive_protobuf_message_is_refused(body: str, message: str) -> None:
    definition = f'syntax = "proto3";\npackage shop;\n{body}\n'.encode()
    with pytest.raises(InvalidArgument, match=message + ".*a Spark column cannot hold a recursive type"):
        spark_type(SchemaType.PROTOBUF, definition)


def test_a_bad_protobuf_definition_is_refused() -> None:
    with pytest.raises(InvalidArgument, match="does not compile"):
        spark_type(SchemaType.PROTOBUF, b'syntax = "proto3"; message M { Missing m = 1; }')


def test_protobuf_from_its_normalized_form() -> None:
    normalized = format_for(SchemaType.PROTOBUF).normalize(ORDER_PROTO)
    assert spark_type(SchemaType.PROTOBUF, normalized) == ORDER_PROTO_TYPE


# --------------------------------------------------------------------------- speed


@pytest.mark.parametrize(("schema_type", "definition", "value", "mapper"), [
    (SchemaType.JSON_SCHEMA, ORDER_JSON, {"order_id": "o", "customer": {"id": 1}, "lines": []}, "_json_column"),
    (SchemaType.AVRO, EVENT_AVRO, {"id": 1, "score": 1.0, "name": None, "payload": b"", "labels": [], "sizes": {}},
     "_avro_column"),
    (SchemaType.PROTOBUF, ORDER_PROTO, {"id": "1"}, "_proto_message"),
])
def test_the_converter_tree_is_built_once_per_schema(monkeypatch: pytest.MonkeyPatch, schema_type: SchemaType,
                                                     definition: bytes, value: Any, mapper: str) -> None:
    decode = value_decoder(schema_type, definition)
    payload = format_for(schema_type).encode(definition, value)

    def mapped_again(*args: Any) -> Any:
        raise AssertionError("the schema was mapped again for a message")

    for name in (mapper, "_struct", "_array", "_map"):
        monkeypatch.setattr(schema_columns, name, mapped_again)
    assert decode(payload) == decode(payload)

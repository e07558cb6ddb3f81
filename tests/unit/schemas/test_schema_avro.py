"""The Avro schema format: normalization, compatibility reasons, validation, encode/decode."""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from typing import Any

import avro.io
import avro.schema
import pytest

from danube_zmq.schemas.avro_format import AVRO, AvroFormat, _compile
from danube_zmq.schemas.types import SchemaType
from danube_zmq.transport.errors import InvalidArgument


def d(schema: Any) -> bytes:
    return json.dumps(schema).encode()


def rec(*fields: dict[str, Any], name: str = "M", **extra: Any) -> bytes:
    return d({"type": "record", "name": name, **extra, "fields": list(fields)})


def f(name: str, type_: Any, **extra: Any) -> dict[str, Any]:
    return {"name": name, "type": type_, **extra}


ID = f("id", "long")
ADDR = {"type": "record", "name": "Addr", "fields": [f("zip", "string")]}
ADDR_CITY = {"type": "record", "name": "Addr", "fields": [f("zip", "string"), f("city", "string")]}
ADDR_ZIP_INT = {"type": "record", "name": "Addr", "fields": [f("zip", "int")]}


def enum(*symbols: str, **extra: Any) -> dict[str, Any]:
    return {"type": "enum", "name": "Color", "symbols": list(symbols), **extra}


def fixed(size: int, name: str = "Hash") -> dict[str, Any]:
    return {"type": "fixed", "name": name, "size": size}


@dataclass(frozen=True)
class Case:
    id: str
    old: bytes
    new: bytes
    backward: bool  # reader=new, writer=old
    forward: bool  # reader=old, writer=new
    mention: str = ""  # what every failing direction's reasons must name


def _promotion(old: str, new: str) -> Case:
    return Case(f"promote-{old}-{new}", rec(f("n", old)), rec(f("n", new)), True, False, "'n'")


CASES = [
    Case("add-field-with-default", rec(ID), rec(ID, f("tag", "string", default="")), True, True),
    Case("add-field-without-default", rec(ID), rec(ID, f("tag", "string")), False, True, "'tag'"),
    Case("add-optional-field", rec(ID), rec(ID, f("tag", ["null", "string"], default=None)), True, True),
    Case("remove-field-with-default", rec(ID, f("tag", "string", default="")), rec(ID), True, True),
    Case("remove-field-without-default", rec(ID, f("tag", "string")), rec(ID), True, False, "'tag'"),
    _promotion("int", "long"),
    _promotion("int", "float"),
    _promotion("int", "double"),
    _promotion("long", "float"),
    _promotion("long", "double"),
    _promotion("float", "double"),
    Case("string-to-bytes", rec(f("s", "string")), rec(f("s", "bytes")), True, True),
    Case("narrow-long-to-int", rec(f("n", "long")), rec(f("n", "int")), False, True, "'n'"),
    Case("int-to-string", rec(f("n", "int")), rec(f("n", "string")), False, False, "'n'"),
    Case("enum-add-symbol", rec(f("c", enum("A", "B"))), rec(f("c", enum("A", "B", "C"))), True, False, "'c'"),
    Case("enum-remove-symbol", rec(f("c", enum("A", "B", "C"))), rec(f("c", enum("A", "B"))), False, True, "'c'"),
    Case("enum-remove-symbol-with-default", rec(f("c", enum("A", "B", "C"))), rec(f("c", enum("A", "B", default="A"))),
         True, True),
    Case("union-add-branch", rec(f("u", ["null", "string"])), rec(f("u", ["null", "string", "int"])), True, False, "'u'"),
    Case("field-made-optional", rec(f("u", "string")), rec(f("u", ["null", "string"], default=None)), True, False, "'u'"),
    Case("union-branch-swapped", rec(f("u", ["null", "string"])), rec(f("u", ["null", "int"])), False, False, "'u'"),
    Case("nested-add-field-without-default", rec(f("addr", ADDR)), rec(f("addr", ADDR_CITY)), False, True, "'addr.city'"),
    Case("nested-type-change", rec(f("addr", ADDR)), rec(f("addr", ADDR_ZIP_INT)), False, False, "'addr.zip'"),
    Case("nested-in-optional-union", rec(f("addr", ["null", ADDR], default=None)),
         rec(f("addr", ["null", ADDR_CITY], default=None)), False, True, "'addr.city'"),
    Case("array-item-promotion", rec(f("xs", {"type": "array", "items": "int"})),
         rec(f("xs", {"type": "array", "items": "long"})), True, False, "'xs'"),
    Case("array-item-change", rec(f("xs", {"type": "array", "items": "int"})),
         rec(f("xs", {"type": "array", "items": "string"})), False, False, "/fields/0/type/items 'xs'"),
    Case("map-value-promotion", rec(f("m", {"type": "map", "values": "float"})),
         rec(f("m", {"type": "map", "values": "double"})), True, False, "/fields/0/type/values 'm'"),
    Case("array-of-records-nested", rec(f("xs", {"type": "array", "items": ADDR})),
         rec(f("xs", {"type": "array", "items": ADDR_CITY})), False, True, "'xs.city'"),
    Case("record-rename-without-alias", rec(ID, name="Old"), rec(ID, name="New"), False, False, "/name"),
    Case("record-rename-with-alias", rec(ID, name="Old"), rec(ID, name="New", aliases=["Old"]), True, False, "/name"),
    Case("namespaced-rename-with-short-alias", rec(ID, name="Old", namespace="acme"),
         rec(ID, name="New", namespace="acme", aliases=["Old"]), True, False, "/name"),
    Case("field-rename-with-alias", rec(ID, f("tag", "string")), rec(ID, f("label", "string", aliases=["tag"])),
         True, False, "'tag'"),
    Case("field-rename-without-alias", rec(ID, f("tag", "string")), rec(ID, f("label", "string")), False, False, "'"),
    Case("fixed-size-change", rec(f("h", fixed(16))), rec(f("h", fixed(32))), False, False, "/fields/0/type/size 'h'"),
    Case("fixed-rename", rec(f("h", fixed(16))), rec(f("h", fixed(16, "Digest"))), False, False, "/fields/0/type/name 'h'"),
    Case("doc-change-only", rec(ID, doc="v1"), rec(ID, doc="v2"), True, True),
]


@pytest.mark.parametrize("direction", ["backward", "forward"])
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_compatibility_matrix(case: Case, direction: str) -> None:
    if direction == "backward":
        reasons, expected = AVRO.reader_errors(reader=case.new, writer=case.old), case.backward
    else:
        reasons, expected = AVRO.reader_errors(reader=case.old, writer=case.new), case.forward
    assert (not reasons) is expected, reasons
    if not expected:
        assert case.mention in "\n".join(reasons), reasons


def test_matrix_is_large_enough() -> None:
    assert len(CASES) >= 25
    assert {c.id for c in CASES} == {c.id for c in CASES if c.id} and len({c.id for c in CASES}) == len(CASES)


def test_reason_format_names_location_and_field() -> None:
    reasons = AVRO.reader_errors(reader=rec(ID, f("tag", "string")), writer=rec(ID))
    assert reasons == ["/fields/1 'tag': reader field has no default and the writer does not have it"]


def test_every_incompatibility_reported_separately() -> None:
    old = rec(f("a", "long"), f("b", "string"))
    new = rec(f("a", "int"), f("b", "int"), f("c", "string"))
    reasons = AVRO.reader_errors(reader=new, writer=old)
    assert len(reasons) == 3
    assert [r.split(" ")[1] for r in reasons] == ["'a':", "'b':", "'c':"]


def test_transitive_chain() -> None:
    v1 = rec(ID)
    v2 = rec(ID, f("tag", "string", default=""))
    v3 = rec(ID, f("tag", "string"))  # drops the default: fine against v2, not v1
    assert AVRO.reader_errors(reader=v2, writer=v1) == []
    assert AVRO.reader_errors(reader=v3, writer=v2) == []
    transitive = AVRO.reader_errors(reader=v3, writer=v1)
    assert len(transitive) == 1 and "'tag'" in transitive[0]


def test_recursive_schema_does_not_loop() -> None:
    def node(*extra: dict[str, Any]) -> bytes:
        return rec(f("value", "long"), f("next", ["null", "Node"], default=None), *extra, name="Node")

    assert AVRO.reader_errors(reader=node(), writer=node()) == []
    reasons = AVRO.reader_errors(reader=node(f("tag", "string")), writer=node())
    assert reasons[-1] == "/fields/2 'tag': reader field has no default and the writer does not have it"
    assert all("'tag'" in r or "recursive reference to record Node" in r for r in reasons), reasons


# ---------------------------------------------------------------- normalize


def test_normalize_ignores_key_order_and_whitespace() -> None:
    a = b'{"type": "record", "name": "M", "fields": [{"name": "id", "type": "long", "default": 0}]}'
    b = b'{\n  "fields": [ {"default": 0, "type": {"type": "long"}, "name": "id"} ],\n  "name" : "M",\n  "type":"record"\n}'
    assert AVRO.normalize(a) == AVRO.normalize(b)


def test_normalize_unifies_namespace_spellings() -> None:
    a = d({"type": "record", "name": "acme.M", "fields": [f("id", "long")]})
    b = d({"type": "record", "name": "M", "namespace": "acme", "fields": [f("id", "long")]})
    assert AVRO.normalize(a) == AVRO.normalize(b)


def test_normalize_keeps_defaults() -> None:
    assert AVRO.normalize(rec(f("id", "long", default=0))) != AVRO.normalize(rec(f("id", "long", default=1)))
    assert AVRO.normalize(rec(f("id", "long", default=0))) != AVRO.normalize(rec(f("id", "long")))


def test_normalize_is_idempotent_and_parseable() -> None:
    once = AVRO.normalize(rec(ID, f("addr", ADDR), f("c", enum("A", "B"))))
    assert AVRO.normalize(once) == once
    assert b" " not in once and b"\n" not in once
    avro.schema.parse(once.decode())


# ---------------------------------------------------------------- validate / encode / decode

SCHEMA = rec(ID, f("name", "string"), f("addr", ADDR), f("tags", {"type": "array", "items": "string"}))
VALUE = {"id": 7, "name": "ada", "addr": {"zip": "1010"}, "tags": ["a", "b"]}


def test_type_and_singleton() -> None:
    assert AVRO.type is SchemaType.AVRO
    assert isinstance(AVRO, AvroFormat)


def test_round_trip() -> None:
    payload = AVRO.encode(SCHEMA, VALUE)
    assert AVRO.decode(SCHEMA, payload) == VALUE
    AVRO.validate(SCHEMA, payload)
    AVRO.validate(SCHEMA, bytearray(payload))


def test_avro_and_fastavro_encodings_are_identical() -> None:
    out = io.BytesIO()
    avro.io.DatumWriter(avro.schema.parse(SCHEMA.decode())).write(VALUE, avro.io.BinaryEncoder(out))
    assert out.getvalue() == AVRO.encode(SCHEMA, VALUE)


def test_validate_rejects_truncated_payload_naming_field() -> None:
    payload = AVRO.encode(SCHEMA, VALUE)
    with pytest.raises(InvalidArgument, match=r"truncated.*'addr'"):
        AVRO.validate(SCHEMA, payload[:6])
    for cut in range(len(payload)):
        with pytest.raises(InvalidArgument):
            AVRO.validate(SCHEMA, payload[:cut])


def test_validate_rejects_garbage() -> None:
    with pytest.raises(InvalidArgument, match="payload"):
        AVRO.validate(SCHEMA, b"\xff" * 32)
    with pytest.raises(InvalidArgument, match="not a valid Avro encoding"):
        AVRO.validate(rec(f("c", enum("A", "B"))), b"\x0a")  # enum index 5


def test_validate_rejects_trailing_bytes() -> None:
    payload = AVRO.encode(SCHEMA, VALUE)
    with pytest.raises(InvalidArgument, match=r"2 trailing byte"):
        AVRO.validate(SCHEMA, payload + b"\x00\x00")


def test_validate_caches_compiled_schema() -> None:
    definition = rec(f("cache_probe", "long"))
    AVRO.validate(definition, b"\x02")
    before = _compile.cache_info().hits
    AVRO.validate(definition, b"\x04")
    assert _compile.cache_info().hits == before + 1
    assert _compile.cache_info().maxsize == 256


def test_decode_with_reader_adding_defaulted_field() -> None:
    old = rec(ID)
    new = rec(ID, f("tag", "string", default="none"))
    assert AVRO.decode(old, AVRO.encode(old, {"id": 3}), reader=new) == {"id": 3, "tag": "none"}


def test_decode_with_reader_promoting_type() -> None:
    assert AVRO.decode(rec(f("n", "int")), AVRO.encode(rec(f("n", "int")), {"n": 5}), reader=rec(f("n", "double"))) == {
        "n": 5.0}


def test_decode_resolution_failure() -> None:
    old = rec(ID)
    with pytest.raises(InvalidArgument, match="tag"):
        AVRO.decode(old, AVRO.encode(old, {"id": 3}), reader=rec(ID, f("tag", "string")))


@pytest.mark.parametrize(
    ("value", "field"),
    [
        ({**VALUE, "id": "seven"}, "id"),
        ({**VALUE, "addr": {"zip": 1010}}, "zip"),
        ({k: v for k, v in VALUE.items() if k != "name"}, "name"),
        ({**VALUE, "tags": [1]}, "tags"),
    ],
)
def test_encode_bad_value_names_field(value: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidArgument, match=field):
        AVRO.encode(SCHEMA, value)


# ---------------------------------------------------------------- bad definitions


@pytest.mark.parametrize(
    ("definition", "problem"),
    [
        (b"not json", "not valid JSON"),
        (b"\xff\xfe", "not UTF-8"),
        (d({"type": "nope"}), "nope"),
        (d({"type": "record", "name": "M"}), "fields"),
        (d({"type": "record", "fields": []}), "Name"),
        (d({"type": "enum", "name": "E", "symbols": ["A", "A"]}), "invalid Avro schema"),
        (rec(f("a", "int"), f("a", "int")), "already in use"),
        (rec(f("a", "int", default="x")), "Default value"),
        (d({"type": "fixed", "name": "F", "size": -1}), "size"),
    ],
)
def test_bad_definitions(definition: bytes, problem: str) -> None:
    for call in (lambda: AVRO.normalize(definition), lambda: AVRO.validate(definition, b""),
                 lambda: AVRO.reader_errors(definition, rec(ID)), lambda: AVRO.reader_errors(rec(ID), definition)):
        with pytest.raises(InvalidArgument, match=problem):
            call()


def test_definition_must_be_bytes() -> None:
    with pytest.raises(InvalidArgument, match="bytes"):
        AVRO.normalize('{"type": "int"}')  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "items",
    ['"null"', '{"type": "fixed", "name": "Z", "size": 0}', '{"type": "record", "name": "E", "fields": []}',
     '{"type": "record", "name": "N", "fields": [{"name": "n", "type": "null"}]}'],
)
def test_arrays_of_zero_byte_items_are_refused(items: str) -> None:
    """A 5-byte payload could declare 2^30 such items: decoding would loop for a minute."""
    definition = f'{{"type": "record", "name": "R", "fields": [{{"name": "xs", "type": {{"type": "array", "items": {items}}}}}]}}'
    with pytest.raises(InvalidArgument, match="take no bytes"):
        AVRO.normalize(definition.encode())


def test_arrays_of_non_empty_items_are_fine() -> None:
    definition = b'{"type": "array", "items": ["null", "int"]}'  # a union index is one byte at least
    assert AVRO.decode(definition, AVRO.encode(definition, [None, 1])) == [None, 1]


def test_a_recursive_schema_refuses_a_payload_nested_past_the_recursion_limit() -> None:
    # fastavro's compiled reader overflowed the C stack on this 100 KB payload (the broker died).
    definition = json.dumps({"type": "record", "name": "Node",
                             "fields": [{"name": "next", "type": ["null", "Node"]}]}).encode()
    AVRO.validate(definition, b"\x02" * 50 + b"\x00")
    assert AVRO.decode(definition, b"\x02\x00") == {"next": {"next": None}}
    with pytest.raises(InvalidArgument, match="nests deeper than the broker decodes"):
        AVRO.validate(definition, b"\x02" * 100_000 + b"\x00")

"""JSON Schema format: compatibility rules, normalization, validation and the serializers."""

from __future__ import annotations

import json
from typing import Any

import pytest

from danube_zmq.schemas.json_format import JSON_SCHEMA, JsonSchemaFormat, _compiled
from danube_zmq.schemas.types import SchemaType
from danube_zmq.transport.errors import InvalidArgument


def js(schema: Any) -> bytes:
    return json.dumps(schema).encode()


def obj(props: dict[str, Any], required: list[str] | None = None, **extra: Any) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "object", "properties": props, **extra}
    if required:
        schema["required"] = required
    return schema


S, I, N = {"type": "string"}, {"type": "integer"}, {"type": "number"}
ADDRESS_V1 = obj({"address": obj({"zip": S, "city": S})})

# (id, old, new, backward ok, forward ok, path every reason of an incompatible direction names)
# backward: reader=new, writer=old; forward: reader=old, writer=new.
CASES: list[tuple[str, Any, Any, bool, bool, str]] = [
    ("optional-added", obj({"a": S}), obj({"a": S, "b": I}), True, True, ""),
    ("optional-removed", obj({"a": S, "b": I}), obj({"a": S}), True, True, ""),
    ("required-added", obj({"a": S}, ["a"]), obj({"a": S, "b": I}, ["a", "b"]), False, True, "#/properties/b"),
    ("required-removed", obj({"a": S, "b": I}, ["a", "b"]), obj({"a": S}, ["a"]), True, False, "#/properties/b"),
    ("optional-to-required", obj({"a": S}), obj({"a": S}, ["a"]), False, True, "#/properties/a"),
    ("required-to-optional", obj({"a": S}, ["a"]), obj({"a": S}), True, False, "#/properties/a"),
    ("type-changed", obj({"a": S}), obj({"a": I}), False, False, "#/properties/a"),
    ("integer-to-number", obj({"a": I}), obj({"a": N}), True, False, "#/properties/a"),
    ("type-widened-nullable", obj({"a": S}), obj({"a": {"type": ["string", "null"]}}), True, False, "#/properties/a"),
    ("type-added-to-any", obj({"a": {}}), obj({"a": S}), False, True, "#/properties/a"),
    ("additional-closed", obj({"a": S}), obj({"a": S}, additionalProperties=False), False, True, "#"),
    ("additional-opened", obj({"a": S}, additionalProperties=False), obj({"a": S}), True, False, "#"),
    ("closed-optional-added", obj({"a": S}, additionalProperties=False),
     obj({"a": S, "b": I}, additionalProperties=False), True, False, "#/properties/b"),
    ("additional-schema-vs-declared", obj({}, additionalProperties=S),
     obj({"n": I}, additionalProperties=S), False, False, "#/properties/n"),
    ("enum-narrowed", obj({"c": {"enum": ["r", "g", "b"]}}), obj({"c": {"enum": ["r", "g"]}}), False, True, "#/properties/c"),
    ("enum-widened", obj({"c": {"type": "string", "enum": ["r"]}}),
     obj({"c": {"type": "string", "enum": ["r", "g"]}}), True, False, "#/properties/c"),
    ("enum-added", obj({"c": S}), obj({"c": {"type": "string", "enum": ["r"]}}), False, True, "#/properties/c"),
    ("const-changed", obj({"v": {"const": 1}}), obj({"v": {"const": 2}}), False, False, "#/properties/v"),
    ("nested-type-changed", ADDRESS_V1, obj({"address": obj({"zip": I, "city": S})}), False, False,
     "#/properties/address/properties/zip"),
    ("nested-required-added", ADDRESS_V1, obj({"address": obj({"zip": S, "city": S}, ["zip"])}), False, True,
     "#/properties/address/properties/zip"),
    ("nested-optional-added", ADDRESS_V1, obj({"address": obj({"zip": S, "city": S, "street": S})}), True, True, ""),
    ("array-items-changed", obj({"tags": {"type": "array", "items": S}}), obj({"tags": {"type": "array", "items": I}}),
     False, False, "#/properties/tags/items"),
    ("array-items-integer-to-number", obj({"xs": {"type": "array", "items": I}}),
     obj({"xs": {"type": "array", "items": N}}), True, False, "#/properties/xs/items"),
    ("array-of-objects-required-added", obj({"xs": {"type": "array", "items": obj({"k": S})}}),
     obj({"xs": {"type": "array", "items": obj({"k": S}, ["k"])}}), False, True, "#/properties/xs/items/properties/k"),
    ("maximum-tightened", obj({"n": {"type": "integer", "maximum": 100}}), obj({"n": {"type": "integer", "maximum": 50}}),
     False, True, "#/properties/n"),
    ("minimum-loosened", obj({"n": {"type": "number", "minimum": 0}}), obj({"n": {"type": "number", "minimum": -10}}),
     True, False, "#/properties/n"),
    ("minimum-made-exclusive", obj({"n": {"type": "number", "minimum": 0}}),
     obj({"n": {"type": "number", "exclusiveMinimum": 0}}), False, True, "#/properties/n"),
    ("maxLength-tightened", obj({"s": {"type": "string", "maxLength": 10}}), obj({"s": {"type": "string", "maxLength": 5}}),
     False, True, "#/properties/s"),
    ("minLength-added", obj({"s": S}), obj({"s": {"type": "string", "minLength": 1}}), False, True, "#/properties/s"),
    ("pattern-changed", obj({"s": {"type": "string", "pattern": "^a"}}), obj({"s": {"type": "string", "pattern": "^b"}}),
     False, False, "#/properties/s"),
    ("maxItems-tightened", obj({"xs": {"type": "array", "maxItems": 5}}), obj({"xs": {"type": "array", "maxItems": 3}}),
     False, True, "#/properties/xs"),
    ("minItems-loosened", obj({"xs": {"type": "array", "minItems": 2}}), obj({"xs": {"type": "array", "minItems": 1}}),
     True, False, "#/properties/xs"),
    ("uniqueItems-added", obj({"xs": {"type": "array"}}), obj({"xs": {"type": "array", "uniqueItems": True}}),
     False, True, "#/properties/xs"),
    ("multipleOf-loosened", obj({"n": {"type": "integer", "multipleOf": 10}}),
     obj({"n": {"type": "integer", "multipleOf": 5}}), True, False, "#/properties/n"),
    ("oneOf-differs", obj({"v": {"oneOf": [S, I]}}), obj({"v": {"oneOf": [S, N]}}), False, False, "#/properties/v"),
    ("oneOf-identical", obj({"v": {"oneOf": [S, I]}, "w": S}), obj({"v": {"oneOf": [S, I]}}), True, True, ""),
    ("ref-target-same", {"$defs": {"id": S}, **obj({"a": {"$ref": "#/$defs/id"}})},
     {"$defs": {"id": S}, **obj({"a": {"$ref": "#/$defs/id"}, "b": S})}, True, True, ""),
    ("ref-target-changed", {"$defs": {"id": S}, **obj({"a": {"$ref": "#/$defs/id"}})},
     {"$defs": {"id": I}, **obj({"a": {"$ref": "#/$defs/id"}})}, False, False, "#/properties/a"),
    ("annotations-only", obj({"a": S}), obj({"a": {"type": "string", "description": "x", "default": "y"}}, title="T"),
     True, True, ""),
    ("root-true-to-object", True, {"type": "object"}, False, True, "#"),
]


@pytest.mark.parametrize(("old", "new", "backward_ok", "forward_ok", "path"),
                         [pytest.param(*case[1:], id=case[0]) for case in CASES])
def test_compatibility_matrix(old: Any, new: Any, backward_ok: bool, forward_ok: bool, path: str) -> None:
    """Each evolution is judged in both directions, and incompatible ones say where."""
    for reader, writer, ok in ((new, old, backward_ok), (old, new, forward_ok)):
        reasons = JSON_SCHEMA.reader_errors(js(reader), js(writer))
        if ok:
            assert reasons == []
        else:
            assert reasons, "expected the evolution to be reported"
            assert all(reason.startswith(path) for reason in reasons), reasons


def test_matrix_is_large_enough() -> None:
    assert len(CASES) >= 25


def test_reason_text_names_the_change() -> None:
    old, new = ADDRESS_V1, obj({"address": obj({"zip": I, "city": S})})
    assert JSON_SCHEMA.reader_errors(js(new), js(old)) == [
        "#/properties/address/properties/zip: type changed from string to integer"
    ]
    enum = JSON_SCHEMA.reader_errors(js(obj({"c": {"enum": ["r"]}})), js(obj({"c": {"enum": ["r", "g"]}})))
    assert enum == ['#/properties/c: enum narrowed: writer value "g" is not allowed by the reader']


def test_oneof_is_reported_as_unprovable() -> None:
    reasons = JSON_SCHEMA.reader_errors(js({"oneOf": [S, N]}), js({"oneOf": [S, I]}))
    assert reasons == ["#: cannot prove compatible: oneOf differs at #"]
    # A writer with a finite set of values is checked exactly, whatever keywords the reader uses.
    assert JSON_SCHEMA.reader_errors(js({"oneOf": [S, I]}), js({"enum": ["a", 1]})) == []
    assert JSON_SCHEMA.reader_errors(js({"oneOf": [S, I]}), js({"enum": ["a", 1.5]})) == [
        "#: writer value 1.5 is rejected by the reader: 1.5 is not valid under any of the schemas listed in the 'oneOf'"
        " keyword"
    ]
    assert JSON_SCHEMA.reader_errors(js({"const": 2}), js({"const": 1})) == [
        "#: const changed: writer value 1 is not allowed by the reader"
    ]


def test_transitive_chain() -> None:
    """v3 re-adds a removed property with another type: compatible with v2, not with v1."""
    v1 = js(obj({"id": S, "note": S}))
    v2 = js(obj({"id": S}))
    v3 = js(obj({"id": S, "note": I}))
    assert JSON_SCHEMA.reader_errors(reader=v2, writer=v1) == []
    assert JSON_SCHEMA.reader_errors(reader=v3, writer=v2) == []
    assert JSON_SCHEMA.reader_errors(reader=v3, writer=v1) == ["#/properties/note: type changed from string to integer"]


def test_normalize_ignores_spacing_and_key_order() -> None:
    a = b'{ "type": "object",\n  "properties": {"b": {"type": "string"}, "a": {"type": "integer"}} }'
    b = b'{"properties":{"a":{"type":"integer"},"b":{"type":"string"}},"type":"object"}'
    assert JSON_SCHEMA.normalize(a) == JSON_SCHEMA.normalize(b) == b
    assert JSON_SCHEMA.normalize(JSON_SCHEMA.normalize(a)) == b
    assert JSON_SCHEMA.normalize(b'{"title": "caf\\u00e9"}') == '{"title":"café"}'.encode()


def test_format_identity() -> None:
    assert isinstance(JSON_SCHEMA, JsonSchemaFormat)
    assert JSON_SCHEMA.type is SchemaType.JSON_SCHEMA
    assert _compiled.cache_info().maxsize == 256


PERSON = js(obj({"name": S, "age": {"type": "integer", "minimum": 0}, "address": ADDRESS_V1["properties"]["address"]},
                ["name"]))


def test_validate_accepts_a_good_payload() -> None:
    JSON_SCHEMA.validate(PERSON, b'{"name": "ada", "age": 36, "address": {"zip": "12345"}}')


@pytest.mark.parametrize(("payload", "expected"), [
    (b"{not json", "payload is not valid JSON"),
    (b'{"name": "ada", "age": NaN}', "payload is not valid JSON"),
    (b"\xff\xfe", "payload is not UTF-8"),
    (b'{"name": "ada", "address": {"zip": 12345}}', "$.address.zip"),
    (b'{"name": "ada", "age": -1}', "$.age"),
    (b'{"age": 3}', '"name" is a required property'),
])
def test_validate_rejects_with_the_field(payload: bytes, expected: str) -> None:
    with pytest.raises(InvalidArgument, match=r"^payload") as info:
        JSON_SCHEMA.validate(PERSON, payload)
    assert expected in str(info.value)


def test_encode_decode_round_trip() -> None:
    value = {"name": "zoë", "age": 7, "address": {"zip": "1", "city": "Wien"}}
    data = JSON_SCHEMA.encode(PERSON, value)
    assert data == json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()
    assert JSON_SCHEMA.decode(PERSON, data) == value
    reader = js(obj({"name": S, "age": N}))
    assert JSON_SCHEMA.decode(PERSON, data, reader=reader) == value


def test_encode_rejects_a_bad_value_naming_the_field() -> None:
    with pytest.raises(InvalidArgument, match=r"value invalid at \$\.address\.zip"):
        JSON_SCHEMA.encode(PERSON, {"name": "ada", "address": {"zip": 1}})
    with pytest.raises(InvalidArgument, match="cannot be encoded as JSON"):
        JSON_SCHEMA.encode(PERSON, {"name": {1, 2}})


def test_decode_checks_writer_and_reader() -> None:
    with pytest.raises(InvalidArgument, match=r"writer's schema at \$\.age"):
        JSON_SCHEMA.decode(PERSON, b'{"name": "a", "age": "old"}')
    strict_reader = js(obj({"name": S}, ["name", "age"]))
    with pytest.raises(InvalidArgument, match="reader's schema at \\$: \"age\" is a required property"):
        JSON_SCHEMA.decode(PERSON, b'{"name": "a"}', reader=strict_reader)


@pytest.mark.parametrize(("definition", "expected"), [
    (b"not json", "not valid JSON"),
    (b"[1, 2]", "must be a JSON object or boolean, got array"),
    (b'"string"', "must be a JSON object or boolean, got string"),
    (b'{"type": 5}', "invalid JSON schema at #/type"),
    (b'{"properties": {"a": {"minimum": "x"}}}', "invalid JSON schema at #/properties/a/minimum"),
    (b'{"$schema": "https://example.com/unknown"}', "not a known JSON Schema dialect"),
    (b"\xc3", "not UTF-8"),
])
def test_bad_definitions_are_refused(definition: bytes, expected: str) -> None:
    for call in (JSON_SCHEMA.normalize, lambda d: JSON_SCHEMA.validate(d, b"{}"),
                 lambda d: JSON_SCHEMA.reader_errors(d, b"{}"), lambda d: JSON_SCHEMA.reader_errors(b"{}", d)):
        with pytest.raises(InvalidArgument, match=r"definition|schema") as info:
            call(definition)
        assert expected in str(info.value)


def test_boolean_and_older_dialects() -> None:
    assert JSON_SCHEMA.normalize(b"true") == b"true"
    assert JSON_SCHEMA.reader_errors(b"true", b"false") == []
    assert JSON_SCHEMA.reader_errors(b"false", b"{}") == [
        "#: the reader accepts nothing (false schema) but the writer accepts values"
    ]
    draft4 = {"$schema": "http://json-schema.org/draft-04/schema#", "type": "number", "minimum": 0,
              "exclusiveMinimum": True}
    inclusive = {"$schema": "http://json-schema.org/draft-04/schema#", "type": "number", "minimum": 0}
    assert JSON_SCHEMA.reader_errors(js(inclusive), js(draft4)) == []
    assert JSON_SCHEMA.reader_errors(js(draft4), js(inclusive)) == ["#: lower bound tightened from >= 0 to > 0"]
    with pytest.raises(InvalidArgument, match=r"at \$"):
        JSON_SCHEMA.validate(js(draft4), b"0")


def test_unresolvable_remote_ref_fails_without_network() -> None:
    definition = js({"$ref": "https://example.invalid/schema.json"})
    with pytest.raises(InvalidArgument, match="cannot be resolved"):
        JSON_SCHEMA.validate(definition, b"{}")


def test_a_backtracking_pattern_is_matched_in_linear_time_and_named() -> None:
    # Python's re takes minutes on this input (2^40 paths); the linear engine microseconds.
    definition = js(obj({"name": {"type": "string", "pattern": "^(a+)+$"}}))
    with pytest.raises(InvalidArgument, match=r'at \$\.name: "a+!" does not match "\^\(a\+\)\+\$"'):
        JSON_SCHEMA.validate(definition, json.dumps({"name": "a" * 40 + "!"}).encode())
    JSON_SCHEMA.validate(definition, json.dumps({"name": "a" * 40}).encode())


@pytest.mark.parametrize(("schema", "expected"), [
    ({"type": "string", "pattern": "^(?=.*[A-Z])x"}, "linear-time engine"),
    ({"patternProperties": {"(a)\\1": {}}}, "linear-time engine"),
    ({"$schema": "http://json-schema.org/draft-03/schema#", "type": "string"}, "is not supported"),
])
def test_definitions_only_a_backtracking_validator_could_run_are_refused(schema: Any, expected: str) -> None:
    with pytest.raises(InvalidArgument, match=expected):
        JSON_SCHEMA.normalize(js(schema))


@pytest.mark.parametrize("schema", [
    {"$ref": "#"},
    {"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"},
    {"type": "object", "properties": {"next": {"$ref": "#"}}},
])
def test_ref_cycles_validate_without_a_hang(schema: Any) -> None:
    deep = b'{"next": ' * 900 + b"{}" + b"}" * 900
    JSON_SCHEMA.validate(js(schema), deep)
    with pytest.raises(InvalidArgument, match="not valid JSON"):  # deeper than the parser takes
        JSON_SCHEMA.validate(js(schema), b'{"next": ' * 100_000 + b"{}" + b"}" * 100_000)

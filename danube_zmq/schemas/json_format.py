"""JSON Schema as a registry schema format.

A definition is the UTF-8 JSON text of a JSON Schema (an object or a boolean schema). Its
dialect is taken from `$schema` (draft 3 to 2020-12, as `jsonschema` knows them) and
defaults to 2020-12. Payloads are UTF-8 JSON documents.

Compatibility (`reader_errors(reader, writer)`)
-----------------------------------------------
The question is "can a document that is valid under `writer` be invalid under `reader`?".
The answer is built like Confluent's JSON Schema checker (and stricter than Danube's, which
only looks at `required` and `type`). The two schemas are walked together from the root
through `properties`, `additionalProperties` and `items`; each reason names the path in
the schema, e.g. ``#/properties/address/properties/zip: type changed from string to integer``.
At every pair of sub-schemas:

- Boolean schemas: writer `false` accepts nothing, so anything reads it; reader `true`
  (or `{}`) reads anything; reader `false` reads nothing the writer sends.
- `type`: a missing `type` means every type. Every type the writer allows must be allowed
  by the reader; `integer` is covered by `number`, not the other way round.
- `enum` / `const` (a finite writer): when the writer lists its values, each value the
  writer itself accepts is checked against the reader sub-schema with the real validator,
  which is exact (enum widened: fine; narrowed: error). When the writer has no `enum` and
  the reader adds one (or a `const`), that is an error.
- Objects: a property the reader requires and the writer does not -> error (JSON Schema
  ignores `default`, so a default does not help). A property the writer declares and the
  reader forbids (reader `additionalProperties: false`) -> error. Reader closed while the
  writer is open -> error. A property both sides can carry is compared recursively, where
  an undeclared property takes its side's `additionalProperties` schema.
  Approximation: when the writer is open with an unconstrained `additionalProperties`
  (missing or `true`) and the reader declares a property the writer does not, the writer
  says nothing about that property and it is *not* reported (strictly, a writer document
  may carry it with any value). This keeps "add an optional property" compatible, and is
  why transitive modes matter: see the tests' v1 -> v2 -> v3 chain.
- Arrays: `items` (single-schema form) is compared recursively; `uniqueItems` added -> error.
- Bounds: `minimum`/`maximum`/`exclusiveMinimum`/`exclusiveMaximum` (draft-4 boolean
  exclusives included), `minLength`/`maxLength`, `minItems`/`maxItems`,
  `minProperties`/`maxProperties`: a reader bound tighter than the writer's, or added, is
  an error; loosened or removed is fine. `multipleOf`: the writer's must be a multiple of
  the reader's. `pattern`: added or changed -> error (regex inclusion is not decided).
  These keywords are only checked when the writer allows the type they apply to.
- Keywords not modelled (`oneOf`, `anyOf`, `allOf`, `not`, `if`/`then`/`else`,
  `patternProperties`, `prefixItems`, tuple `items`, `contains`, `dependent*`,
  `unevaluated*`, `propertyNames`, ...) are compared structurally: a reader keyword that
  differs from the writer's gives "cannot prove compatible: <keyword> differs at <path>",
  so the check stays conservative (a finite writer, above, is exempt: its values are
  run through the reader's validator). The same keyword only on the writer's side can only
  narrow what the writer sends, so it is ignored (which may in turn leave the writer
  looking wider than it is, e.g. a type given only inside `oneOf` counts as "any type").
- `$ref`: equal on both sides and every local (``#/...``) target it reaches, transitively,
  equal in both documents -> fine; otherwise "cannot prove compatible". A remote or anchor
  `$ref` is fine only if the texts and both documents' `$defs`/`definitions` are equal.
- Annotations (`title`, `description`, `default`, `examples`, `format`, `$comment`, ...) are
  ignored: `format` is not asserted by `validate` either.

Payloads are validated with `jsonschema-rs` (the Rust `jsonschema` crate, which Danube
itself validates with; ~50x faster than the Python validator on this machine), offline and
without format assertions. Its verdict decides and its first error names the path at
fault. Regular expressions (`pattern`, `patternProperties`) run in its linear-time
`regex` engine, never a backtracking one: a pattern such as `^(a+)+$` costs microseconds
on any input, and a pattern that engine cannot take (lookaround, backreferences) is
refused when the schema is registered, as is any definition it cannot compile (draft 3,
a remote `$ref`: validation never fetches one, no network on the produce path). Python
`jsonschema` only tells the dialect from `$schema`; the metaschema check is
`jsonschema-rs`'s too, which is ~500x faster on a large schema.
"""

from __future__ import annotations

import functools
import json
import math
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import jsonschema_rs
from jsonschema import Draft4Validator, Draft6Validator, Draft7Validator, Draft201909Validator, Draft202012Validator
from jsonschema.protocols import Validator
from jsonschema.validators import validator_for

from danube_zmq.schemas.types import SchemaType
from danube_zmq.transport.errors import InvalidArgument

__all__ = ["JSON_SCHEMA", "JsonSchemaFormat"]

_ALL_TYPES = frozenset({"null", "boolean", "object", "array", "number", "integer", "string"})
# Keywords whose semantics the checker does not model; see the module docstring.
_OPAQUE_KEYWORDS = (
    "allOf", "anyOf", "oneOf", "not", "if", "then", "else", "patternProperties", "propertyNames",
    "prefixItems", "additionalItems", "contains", "minContains", "maxContains", "dependencies",
    "dependentRequired", "dependentSchemas", "unevaluatedProperties", "unevaluatedItems",
    "$dynamicRef", "$recursiveRef",
)
_REF_KEYWORDS = ("$ref", "$dynamicRef", "$recursiveRef")
_MESSAGE_LIMIT = 300
# The dialects jsonschema-rs validates, by the Python class that names each.
_RS_CLASSES: dict[type[Validator], Any] = {
    Draft4Validator: jsonschema_rs.Draft4Validator, Draft6Validator: jsonschema_rs.Draft6Validator,
    Draft7Validator: jsonschema_rs.Draft7Validator, Draft201909Validator: jsonschema_rs.Draft201909Validator,
    Draft202012Validator: jsonschema_rs.Draft202012Validator,
}
# Per pattern: its compiled program and lazy DFA stay small, so 20,000 patterns cannot
# take gigabytes (the crate's defaults are 10 MiB and 2 MiB).
_REGEX_BYTES_MAX = 256 * 1024
_RS_OPTIONS: dict[str, Any] = {
    "offline": True,
    "pattern_options": jsonschema_rs.RegexOptions(size_limit=_REGEX_BYTES_MAX, dfa_size_limit=_REGEX_BYTES_MAX),
}


@dataclass(frozen=True)
class _Compiled:
    schema: dict[str, Any] | bool
    dialect: type[Validator]
    fast: Any  # the jsonschema_rs validator


# --------------------------------------------------------------------------- parsing


def _reject_constant(name: str) -> Any:
    # Python's json accepts NaN/Infinity, which are not JSON and no other client can read.
    raise ValueError(f"{name} is not valid JSON")


def _loads(data: bytes, what: str) -> Any:
    try:
        text = bytes(data).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidArgument(f"{what} is not UTF-8: {exc.reason} at byte {exc.start}") from None
    except TypeError:
        raise InvalidArgument(f"{what} must be bytes, got {type(data).__name__}") from None
    try:
        return json.loads(text, parse_constant=_reject_constant)
    except json.JSONDecodeError as exc:
        raise InvalidArgument(f"{what} is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except (ValueError, RecursionError) as exc:
        raise InvalidArgument(f"{what} is not valid JSON: {exc}") from None


def _dumps(value: Any, *, sort_keys: bool = False) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, sort_keys=sort_keys, allow_nan=False).encode()


def _validator_class(schema: dict[str, Any] | bool) -> type[Validator]:
    if not isinstance(schema, dict) or "$schema" not in schema:
        return Draft202012Validator
    dialect = schema["$schema"]
    if not isinstance(dialect, str):
        raise InvalidArgument(f"JSON schema $schema must be a string, got {json.dumps(dialect)}")
    # default=None makes an unknown dialect come back as None instead of a deprecation warning.
    cls = validator_for(schema, default=None)  # type: ignore[arg-type]
    if cls is None:
        raise InvalidArgument(f"JSON schema $schema {dialect!r} is not a known JSON Schema dialect")
    return cls


@functools.lru_cache(maxsize=256)
def _compiled(definition: bytes) -> _Compiled:
    schema = _loads(definition, "JSON schema definition")
    if not isinstance(schema, dict | bool):
        raise InvalidArgument(f"JSON schema definition must be a JSON object or boolean, got {_json_type(schema)}")
    cls = _validator_class(schema)
    if cls not in _RS_CLASSES:
        raise InvalidArgument(f"JSON schema dialect {schema['$schema']!r} is not supported"  # type: ignore[index]
                              " (draft 4, 6, 7, 2019-09 and 2020-12 are)")
    try:
        jsonschema_rs.meta.validate(schema)
    except jsonschema_rs.ValidationError as exc:
        where = _pointer(["#", *(str(p) for p in exc.instance_path)])
        raise InvalidArgument(f"invalid JSON schema at {where}: {_short(exc.message)}") from None
    return _Compiled(schema, cls, _rs_validator(cls, schema, "JSON schema"))


def _rs_validator(cls: type[Validator], schema: dict[str, Any] | bool, what: str) -> Any:
    try:
        return _RS_CLASSES[cls](schema, validate_formats=False, **_RS_OPTIONS)
    except jsonschema_rs.ValidationError as exc:
        if isinstance(exc.kind, jsonschema_rs.ValidationErrorKind.Referencing):
            raise InvalidArgument(f"{what}: a schema reference cannot be resolved: {_short(exc.message)}"
                                  " (remote references are never fetched)") from None
        where = _pointer(["#", *(str(p) for p in exc.instance_path)])
        raise InvalidArgument(f"{what} cannot be compiled at {where}: {_short(exc.message)}"
                              " (patterns run in a linear-time engine: no lookaround or backreferences)") from None
    except jsonschema_rs.ReferencingError as exc:
        raise InvalidArgument(f"{what}: a schema reference cannot be resolved: {_short(str(exc))}") from None
    except ValueError as exc:
        raise InvalidArgument(f"{what} cannot be compiled: {_short(str(exc))}") from None


def _compile(definition: bytes) -> _Compiled:
    if isinstance(definition, bytearray | memoryview):
        definition = bytes(definition)
    elif isinstance(definition, str):
        definition = definition.encode()
    if not isinstance(definition, bytes):
        raise InvalidArgument(f"JSON schema definition must be bytes, got {type(definition).__name__}")
    return _compiled(definition)


def _short(message: str) -> str:
    return message if len(message) <= _MESSAGE_LIMIT else message[: _MESSAGE_LIMIT - 3] + "..."


def _check(compiled: _Compiled, document: Any, what: str) -> None:
    try:
        compiled.fast.validate(document)
    except jsonschema_rs.ValidationError as exc:
        raise InvalidArgument(f"{what} at {_json_path(exc.instance_path)}: {_short(exc.message)}") from None
    except ValueError as exc:  # a value it cannot take (an int beyond 64 bits)
        raise InvalidArgument(f"{what}: cannot be validated: {_short(str(exc))}") from None


def _json_path(parts: list[str | int]) -> str:
    # jsonschema's notation ($.address.zip, $.tags[2]), which clients already match on.
    path = "$"
    for part in parts:
        path += f"[{part}]" if isinstance(part, int) else f".{part}"
    return path


# --------------------------------------------------------------------------- the format


class JsonSchemaFormat:
    """JSON Schema definitions and JSON payloads; see the module docstring for the rules."""

    type = SchemaType.JSON_SCHEMA

    def normalize(self, definition: bytes) -> bytes:
        return _dumps(_compile(definition).schema, sort_keys=True)

    def reader_errors(self, reader: bytes, writer: bytes) -> list[str]:
        r, w = _compile(reader), _compile(writer)
        ctx = _Context(r.schema, w.schema, r.dialect, w.dialect)
        return list(dict.fromkeys(_compare(ctx, r.schema, w.schema, "#")))

    def validate(self, definition: bytes, payload: bytes) -> None:
        compiled = _compile(definition)
        _check(compiled, _loads(payload, "payload"), "payload invalid")

    def encode(self, definition: bytes, value: Any) -> bytes:
        compiled = _compile(definition)
        try:
            data = _dumps(value)
        except (TypeError, ValueError) as exc:
            raise InvalidArgument(f"value cannot be encoded as JSON: {exc}") from None
        # Validate what the consumer will see (tuples become lists, int keys strings), not the Python value.
        _check(compiled, json.loads(data), "value invalid")
        return data

    def decode(self, definition: bytes, payload: bytes, reader: bytes | None = None) -> Any:
        writer = _compile(definition)
        reader_compiled = _compile(reader) if reader is not None else None
        document = _loads(payload, "payload")
        _check(writer, document, "payload invalid under the writer's schema")
        if reader_compiled is not None:
            _check(reader_compiled, document, "payload invalid under the reader's schema")
        return document


JSON_SCHEMA = JsonSchemaFormat()


# --------------------------------------------------------------------------- compatibility


@dataclass(frozen=True)
class _Context:
    reader_root: dict[str, Any] | bool
    writer_root: dict[str, Any] | bool
    reader_cls: type[Validator]
    writer_cls: type[Validator]


def _compare(ctx: _Context, reader: Any, writer: Any, path: str) -> Iterator[str]:
    if writer is False:
        return
    writer = {} if writer is True else writer
    if reader is True or reader == {}:
        return
    if reader is False:
        yield f"{path}: the reader accepts nothing (false schema) but the writer accepts values"
        return
    values = _finite_values(ctx, writer)
    if values is not None and not _has_ref(reader):
        # Exact: every value the writer can send is run through the reader, whatever its keywords.
        yield from _compare_values(ctx, reader, values, path)
        return
    yield from _compare_opaque(ctx, reader, writer, path)
    writer_types = _writer_types(writer, values)
    yield from _compare_types(_types(reader), writer_types, path)
    yield from _compare_enum(reader, values, path)
    if writer_types & {"number", "integer"}:
        yield from _compare_numbers(reader, writer, writer_types, path)
    if "string" in writer_types:
        yield from _compare_strings(reader, writer, path)
    if "array" in writer_types:
        yield from _compare_arrays(ctx, reader, writer, path)
    if "object" in writer_types:
        yield from _compare_objects(ctx, reader, writer, path)


# --- keywords compared structurally


def _compare_opaque(ctx: _Context, reader: dict[str, Any], writer: dict[str, Any], path: str) -> Iterator[str]:
    if "$ref" in reader and not _refs_agree(ctx, reader["$ref"], writer.get("$ref")):
        yield f"{path}: cannot prove compatible: $ref differs at {path}"
    for keyword in _OPAQUE_KEYWORDS:
        if keyword in reader and reader[keyword] != writer.get(keyword):
            yield f"{path}: cannot prove compatible: {keyword} differs at {path}"
    if isinstance(reader.get("items"), list) and reader["items"] != writer.get("items"):
        yield f"{path}: cannot prove compatible: items differs at {path}"


def _refs_agree(ctx: _Context, reader_ref: Any, writer_ref: Any) -> bool:
    if reader_ref != writer_ref or not isinstance(reader_ref, str):
        return False
    pending, seen = [reader_ref], set()
    while pending:
        ref = pending.pop()
        if ref in seen:
            continue
        seen.add(ref)
        if not ref.startswith("#/"):
            # Remote or anchor: equal texts plus equal local definitions is as far as we can tell.
            if not _same_definitions(ctx):
                return False
            continue
        target = _resolve(ctx.reader_root, ref)
        if target is None or target != _resolve(ctx.writer_root, ref):
            return False
        pending.extend(_refs_in(target))
    return True


def _same_definitions(ctx: _Context) -> bool:
    r, w = ctx.reader_root, ctx.writer_root
    if not isinstance(r, dict) or not isinstance(w, dict):
        return r == w
    return r.get("$defs") == w.get("$defs") and r.get("definitions") == w.get("definitions")


def _resolve(root: Any, ref: str) -> Any:
    node = root
    for raw in ref[2:].split("/"):
        part = urllib.parse.unquote(raw).replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


def _refs_in(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key in _REF_KEYWORDS and isinstance(value, str):
                yield value
            else:
                yield from _refs_in(value)
    elif isinstance(node, list):
        for item in node:
            yield from _refs_in(item)


def _has_ref(node: Any) -> bool:
    return next(_refs_in(node), None) is not None


# --- enum / const


def _finite_values(ctx: _Context, writer: dict[str, Any]) -> list[Any] | None:
    """The values a writer with `const`/`enum` can send (None: not a finite writer)."""
    if "const" in writer:
        values = [writer["const"]]
    elif isinstance(writer.get("enum"), list):
        values = list(writer["enum"])
    else:
        return None
    if _has_ref(writer):
        return values
    try:
        check = _rs_validator(ctx.writer_cls, writer, "writer schema")
    except InvalidArgument:
        return values  # the writer's root compiled; a part that does not alone says nothing narrower
    # A listed value the writer's other keywords reject can never be sent.
    return [v for v in values if _is_valid(check, v)]


def _is_valid(check: Any, value: Any) -> bool:
    try:
        return bool(check.is_valid(value))
    except ValueError:
        return False


def _compare_values(ctx: _Context, reader: dict[str, Any], values: list[Any], path: str) -> Iterator[str]:
    try:
        check = _rs_validator(ctx.reader_cls, reader, "reader schema")
    except InvalidArgument:
        yield f"{path}: cannot prove compatible: the reader's schema at {path} cannot be compiled alone"
        return
    reader_values = _reader_values(reader)
    for value in values:
        if _is_valid(check, value):
            continue
        shown = json.dumps(value)
        if reader_values is not None and not _contains(reader_values, value):
            change = "const changed" if "const" in reader else "enum narrowed"
            yield f"{path}: {change}: writer value {shown} is not allowed by the reader"
        else:
            error = next(iter(check.iter_errors(value)), None)
            reason = _short(error.message) if error is not None else "rejected"
            yield f"{path}: writer value {shown} is rejected by the reader: {reason}"


def _reader_values(schema: dict[str, Any]) -> list[Any] | None:
    if "const" in schema:
        return [schema["const"]]
    if isinstance(schema.get("enum"), list):
        return schema["enum"]
    return None


def _compare_enum(reader: dict[str, Any], values: list[Any] | None, path: str) -> Iterator[str]:
    reader_values = _reader_values(reader)
    if reader_values is None:
        return
    keyword = "const" if "const" in reader else "enum"
    if values is None:
        yield f"{path}: {keyword} added: the writer allows any value, the reader only {json.dumps(reader_values)}"
        return
    missing = [v for v in values if not _contains(reader_values, v)]
    if missing:
        yield f"{path}: {keyword} narrowed: writer values {json.dumps(missing)} are not allowed by the reader"


def _canonical(value: Any) -> str:
    # JSON equality: 1 == 1.0, but true != 1 (Python's == says otherwise).
    def norm(v: Any) -> Any:
        if isinstance(v, float) and v.is_integer():
            return int(v)
        if isinstance(v, dict):
            return {k: norm(x) for k, x in v.items()}
        if isinstance(v, list):
            return [norm(x) for x in v]
        return v

    return json.dumps(norm(value), sort_keys=True)


def _contains(values: list[Any], value: Any) -> bool:
    key = _canonical(value)
    return any(_canonical(v) == key for v in values)


# --- type


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer()):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def _types(schema: dict[str, Any]) -> frozenset[str]:
    declared = schema.get("type")
    if isinstance(declared, str):
        return frozenset({declared}) & _ALL_TYPES if declared != "any" else _ALL_TYPES
    if isinstance(declared, list) and all(isinstance(t, str) for t in declared):
        return _ALL_TYPES if "any" in declared else frozenset(declared) & _ALL_TYPES
    return _ALL_TYPES  # missing, or draft-3 schema-valued types: assume anything


def _writer_types(writer: dict[str, Any], values: list[Any] | None) -> frozenset[str]:
    types = _types(writer)
    if values is not None:
        types &= {_json_type(v) for v in values}
    return types


def _covered(writer_type: str, reader_types: frozenset[str]) -> bool:
    return writer_type in reader_types or (writer_type == "integer" and "number" in reader_types)


def _show_types(types: frozenset[str]) -> str:
    if types == _ALL_TYPES:
        return "any"
    if "number" in types:
        types = types - {"integer"}  # number already includes integer
    return next(iter(types)) if len(types) == 1 else "[" + ", ".join(sorted(types)) + "]"


def _compare_types(reader_types: frozenset[str], writer_types: frozenset[str], path: str) -> Iterator[str]:
    if any(not _covered(t, reader_types) for t in writer_types):
        yield f"{path}: type changed from {_show_types(writer_types)} to {_show_types(reader_types)}"


# --- bounds


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _lower(schema: dict[str, Any]) -> tuple[float, bool] | None:
    """The tightest lower bound as (value, exclusive)."""
    bounds = []
    if _number(schema.get("minimum")):
        bounds.append((schema["minimum"], schema.get("exclusiveMinimum") is True))  # draft-4 boolean form
    if _number(schema.get("exclusiveMinimum")):
        bounds.append((schema["exclusiveMinimum"], True))
    return max(bounds) if bounds else None


def _upper(schema: dict[str, Any]) -> tuple[float, bool] | None:
    bounds = []
    if _number(schema.get("maximum")):
        bounds.append((schema["maximum"], schema.get("exclusiveMaximum") is True))
    if _number(schema.get("exclusiveMaximum")):
        bounds.append((schema["exclusiveMaximum"], True))
    # Lowest value first; at equal values the exclusive bound is the tighter one.
    return min(bounds, key=lambda b: (b[0], not b[1])) if bounds else None


def _show_bound(bound: tuple[float, bool] | None, lower: bool) -> str:
    if bound is None:
        return "none"
    value, exclusive = bound
    return f"{'>' if lower else '<'}{'' if exclusive else '='} {value}"


def _compare_numbers(reader: dict[str, Any], writer: dict[str, Any], writer_types: frozenset[str], path: str) -> Iterator[str]:
    r_low, w_low = _lower(reader), _lower(writer)
    if r_low is not None and (w_low is None or r_low[0] > w_low[0] or (r_low[0] == w_low[0] and r_low[1] and not w_low[1])):
        yield f"{path}: lower bound tightened from {_show_bound(w_low, True)} to {_show_bound(r_low, True)}"
    r_up, w_up = _upper(reader), _upper(writer)
    if r_up is not None and (w_up is None or r_up[0] < w_up[0] or (r_up[0] == w_up[0] and r_up[1] and not w_up[1])):
        yield f"{path}: upper bound tightened from {_show_bound(w_up, False)} to {_show_bound(r_up, False)}"
    yield from _compare_multiple_of(reader.get("multipleOf"), writer.get("multipleOf"), writer_types, path)


def _compare_multiple_of(reader_step: Any, writer_step: Any, writer_types: frozenset[str], path: str) -> Iterator[str]:
    if not _number(reader_step):
        return
    reader_fraction = Fraction(str(reader_step))
    if writer_types <= {"integer"} and reader_fraction.denominator == 1 and reader_fraction == 1:
        return
    if _number(writer_step) and (Fraction(str(writer_step)) / reader_fraction).denominator == 1:
        return
    yield f"{path}: multipleOf changed from {writer_step if writer_step is not None else 'none'} to {reader_step}"


def _compare_min(reader: dict[str, Any], writer: dict[str, Any], keyword: str, path: str) -> Iterator[str]:
    r, w = reader.get(keyword), writer.get(keyword)
    if _number(r) and r > 0 and (not _number(w) or r > w):
        yield f"{path}: {keyword} tightened from {w if _number(w) else 'none'} to {r}"


def _compare_max(reader: dict[str, Any], writer: dict[str, Any], keyword: str, path: str) -> Iterator[str]:
    r, w = reader.get(keyword), writer.get(keyword)
    if _number(r) and (not _number(w) or r < w):
        yield f"{path}: {keyword} tightened from {w if _number(w) else 'none'} to {r}"


def _compare_strings(reader: dict[str, Any], writer: dict[str, Any], path: str) -> Iterator[str]:
    yield from _compare_min(reader, writer, "minLength", path)
    yield from _compare_max(reader, writer, "maxLength", path)
    if "pattern" in reader and reader["pattern"] != writer.get("pattern"):
        before = json.dumps(writer["pattern"]) if "pattern" in writer else "none"
        yield f"{path}: pattern changed from {before} to {json.dumps(reader['pattern'])}"


# --- arrays


def _compare_arrays(ctx: _Context, reader: dict[str, Any], writer: dict[str, Any], path: str) -> Iterator[str]:
    yield from _compare_min(reader, writer, "minItems", path)
    yield from _compare_max(reader, writer, "maxItems", path)
    if reader.get("uniqueItems") is True and writer.get("uniqueItems") is not True:
        yield f"{path}: uniqueItems added: the writer allows repeated items"
    r_items, w_items = reader.get("items", True), writer.get("items", True)
    # Tuple-form items are compared structurally in _compare_opaque; a tuple writer is wider than we model.
    if not isinstance(r_items, list):
        yield from _compare(ctx, r_items, {} if isinstance(w_items, list) else w_items, f"{path}/items")


# --- objects


def _compare_objects(ctx: _Context, reader: dict[str, Any], writer: dict[str, Any], path: str) -> Iterator[str]:
    yield from _compare_min(reader, writer, "minProperties", path)
    yield from _compare_max(reader, writer, "maxProperties", path)
    names = set(_properties(reader)) | set(_properties(writer)) | _required(reader)
    for name in sorted(names):
        yield from _compare_property(ctx, name, reader, writer, path)
    r_extra, w_extra = reader.get("additionalProperties", True), writer.get("additionalProperties", True)
    if r_extra is False and w_extra is not False:
        yield f"{path}: additionalProperties closed: the writer allows properties the reader forbids"
    elif r_extra is not False and w_extra is not False and _constrained(r_extra):
        yield from _compare(ctx, r_extra, w_extra, f"{path}/additionalProperties")


def _compare_property(ctx: _Context, name: str, reader: dict[str, Any], writer: dict[str, Any], path: str) -> Iterator[str]:
    here = f"{path}/properties/{_escape(name)}"
    r_props, w_props = _properties(reader), _properties(writer)
    r_extra, w_extra = reader.get("additionalProperties", True), writer.get("additionalProperties", True)
    writer_declares = name in w_props
    writer_can_send = writer_declares or w_extra is not False
    if name in _required(reader) and name not in _required(writer):
        why = "the writer never sends it" if not writer_can_send else "the writer may omit it"
        yield f"{here}: required by the reader but not by the writer ({why})"
    if not writer_can_send or (name in w_props and w_props[name] is False):
        return
    if name not in r_props and r_extra is False:
        if writer_declares:
            yield f"{here}: declared by the writer but not allowed by the reader (additionalProperties is false)"
        return  # an open writer is reported once, at the object
    reader_schema = r_props.get(name, r_extra)
    writer_schema = w_props.get(name, w_extra)
    if not writer_declares and not _constrained(writer_schema):
        return  # approximation: an unconstrained open writer says nothing about this property
    yield from _compare(ctx, reader_schema, writer_schema, here)


def _properties(schema: dict[str, Any]) -> dict[str, Any]:
    props = schema.get("properties")
    return props if isinstance(props, dict) else {}


def _required(schema: dict[str, Any]) -> set[str]:
    required = schema.get("required")
    if isinstance(required, list):
        return {r for r in required if isinstance(r, str)}
    # Draft 3 marks required on the property itself.
    return {name for name, sub in _properties(schema).items() if isinstance(sub, dict) and sub.get("required") is True}


def _constrained(schema: Any) -> bool:
    return schema is not True and schema != {}


def _escape(name: str) -> str:
    return name.replace("~", "~0").replace("/", "~1")


def _pointer(parts: list[str]) -> str:
    return "/".join([parts[0], *(_escape(p) for p in parts[1:])])

"""The Avro schema format of the registry.

Rules:

- A definition is Avro schema JSON as UTF-8 bytes. It is parsed by Apache `avro` (the
  reference parser, stricter about names, duplicate fields and union branches) and by
  `fastavro` (which checks that field defaults match their types); a definition either
  parser rejects raises `InvalidArgument` with the parser's reason.
- Before parsing, every alias of a named type is made fully qualified, as the Avro spec
  says aliases are relative to the type's namespace. Apache avro's checker compares the
  aliases literally against the writer's full name, so without this a record renamed in
  a namespace with a short alias would be reported incompatible although it is not.
- `normalize` is NOT Avro's Parsing Canonical Form: avro 1.12's `canonical_form` drops
  field defaults and aliases, and both decide compatibility, so two schemas that differ
  only in a default must not share a fingerprint. It is instead the full schema as avro
  re-emits it (`to_json`: names split into name + namespace, `{"type": "int"}` collapsed to
  `"int"`, named types referenced by full name) dumped with sorted keys and no whitespace.
  `doc` and custom properties are kept, so changing them makes a new version.
- `reader_errors` takes its verdict from `avro.compatibility.ReaderWriterCompatibilityChecker`
  at every node; the checker merges all findings into unordered sets of messages and
  locations, so this module walks the two schemas itself to pair each finding with its
  location (`/fields/1/type`, the checker's notation) and field name (`address.zip`).
- `validate`, `encode` and `decode` use fastavro on the schemaless binary encoding (no
  container header, no schema id); the parsed schemas are cached per definition.
- A recursive schema (a named type reachable from itself, e.g. a linked list) lets a
  payload nest as deep as it has bytes; fastavro's compiled reader recurses in C and a
  100 KB payload overflowed the stack (a crash of the whole broker). Such a schema is read
  with fastavro's pure-Python reader, under Python's recursion limit, and a payload
  nesting deeper than it allows is refused (`InvalidArgument`). A schema that is not
  recursive nests no deeper than its definition, which the registry bounds
  (`limits.schema_depth_max`).
"""

from __future__ import annotations

import functools
import io
import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import avro.compatibility as avro_compat
import avro.errors
import avro.schema
import fastavro
import fastavro._read_py
import fastavro.read
import fastavro.schema
import fastavro.validation

from danube_zmq.schemas.types import SchemaType
from danube_zmq.transport.errors import InvalidArgument

__all__ = ["AVRO", "AvroFormat"]

_CACHE_SIZE = 256
_NAMED_TYPES = frozenset({"record", "error", "enum", "fixed"})


@dataclass(frozen=True, slots=True)
class _Compiled:
    """One definition parsed by both libraries; shared through the cache, never mutated."""

    doc: Any  # the JSON document, aliases qualified
    avro: avro.schema.Schema
    fast: Any  # fastavro's parsed schema
    recursive: bool  # a named type reachable from itself: read with the pure-Python reader


# ---------------------------------------------------------------- parsing


def _load_json(definition: bytes) -> Any:
    try:
        text = definition.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InvalidArgument(f"Avro schema is not UTF-8 text: {e}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise InvalidArgument(f"Avro schema is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}") from None


def _qualify_aliases(node: Any, namespace: str | None) -> Any:
    """Return a copy of the JSON schema `node` with named types' aliases fully qualified."""
    if isinstance(node, list):
        return [_qualify_aliases(branch, namespace) for branch in node]
    if not isinstance(node, dict):
        return node
    out = dict(node)
    kind = node.get("type")
    if kind in _NAMED_TYPES and isinstance(node.get("name"), str):
        name: str = node["name"]
        if "." in name:
            namespace = name.rsplit(".", 1)[0]
        elif isinstance(node.get("namespace"), str):
            namespace = node["namespace"] or None
        aliases = node.get("aliases")
        if isinstance(aliases, list) and namespace:
            out["aliases"] = [a if not isinstance(a, str) or "." in a else f"{namespace}.{a}" for a in aliases]
    if kind in ("record", "error") and isinstance(node.get("fields"), list):
        out["fields"] = [_qualify_field(f, namespace) for f in node["fields"]]
    for key in ("items", "values"):
        if key in node:
            out[key] = _qualify_aliases(node[key], namespace)
    if isinstance(kind, (dict, list)):
        out["type"] = _qualify_aliases(kind, namespace)
    return out


def _qualify_field(field: Any, namespace: str | None) -> Any:
    # A field's own aliases are plain field names, only its type is walked.
    if not isinstance(field, dict) or "type" not in field:
        return field
    return {**field, "type": _qualify_aliases(field["type"], namespace)}


def _parse_avro(doc: Any) -> avro.schema.Schema:
    try:
        return avro.schema.parse(json.dumps(doc))
    except (avro.errors.AvroException, TypeError, ValueError, KeyError, AttributeError) as e:
        raise InvalidArgument(f"invalid Avro schema: {e}") from None


def _parse_fast(doc: Any) -> Any:
    try:
        return fastavro.parse_schema(doc)
    except (fastavro.schema.SchemaParseException, fastavro.schema.UnknownType, TypeError, ValueError, KeyError) as e:
        raise InvalidArgument(f"invalid Avro schema: {e}") from None


def _takes_no_bytes(schema: avro.schema.Schema, seen: set[int]) -> bool:
    """Whether a value of `schema` can encode to zero bytes (null, fixed(0), a record of
    only such fields). Every other type writes at least one byte."""
    if schema.type == "null":
        return True
    if schema.type == "fixed":
        return schema.size == 0  # type: ignore[attr-defined, no-any-return]
    if schema.type in ("record", "error"):
        if id(schema) in seen:  # a recursive record ends through a union or an array: >= 1 byte
            return False
        seen.add(id(schema))
        return all(_takes_no_bytes(f.type, seen) for f in schema.fields)  # type: ignore[attr-defined]
    return False


def _refuse_zero_byte_arrays(schema: avro.schema.Schema, path: str, seen: set[int]) -> None:
    """An array of items that take no bytes lets a 5-byte payload declare 2^30 items that a
    decoder then loops over for a minute: refused at registration, so validate stays bounded."""
    if id(schema) in seen:
        return
    seen.add(id(schema))
    if schema.type == "array":
        items = schema.items  # type: ignore[attr-defined]
        if _takes_no_bytes(items, set()):
            raise InvalidArgument(
                f"invalid Avro schema: {path or '/'}: an array of {items.type} items, which take no bytes, is refused"
                " (a tiny payload could declare billions of them)"
            )
        _refuse_zero_byte_arrays(items, f"{path}/items", seen)
    elif schema.type == "map":
        _refuse_zero_byte_arrays(schema.values, f"{path}/values", seen)  # type: ignore[attr-defined]
    elif schema.type == "union":
        for k, branch in enumerate(schema.schemas):  # type: ignore[attr-defined]
            _refuse_zero_byte_arrays(branch, f"{path}/{k}", seen)
    elif schema.type in ("record", "error"):
        for k, field in enumerate(schema.fields):  # type: ignore[attr-defined]
            _refuse_zero_byte_arrays(field.type, f"{path}/fields/{k}", seen)


@functools.lru_cache(maxsize=_CACHE_SIZE)
def _compile(definition: bytes) -> _Compiled:
    doc = _qualify_aliases(_load_json(definition), None)
    parsed = _parse_avro(doc)
    _refuse_zero_byte_arrays(parsed, "", set())
    return _Compiled(doc=doc, avro=parsed, fast=_parse_fast(doc), recursive=_is_recursive(parsed))


def _children(schema: avro.schema.Schema) -> list[avro.schema.Schema]:
    if isinstance(schema, avro.schema.RecordSchema):
        return [f.type for f in schema.fields]
    if isinstance(schema, avro.schema.ArraySchema):
        return [schema.items]
    if isinstance(schema, avro.schema.MapSchema):
        return [schema.values]
    if isinstance(schema, avro.schema.UnionSchema):
        return list(schema.schemas)
    return []


def _is_recursive(root: avro.schema.Schema) -> bool:
    """Whether some schema is reachable from itself (only a named type can be)."""
    on_path: set[int] = set()
    done: set[int] = set()
    stack: list[tuple[avro.schema.Schema, bool]] = [(root, False)]
    while stack:  # a depth-first walk without recursion: leaving a node pops it off the path
        schema, leaving = stack.pop()
        key = id(schema)
        if leaving:
            on_path.discard(key)
            done.add(key)
            continue
        if key in on_path:
            return True
        if key in done:
            continue
        on_path.add(key)
        stack.append((schema, True))
        stack.extend((child, False) for child in _children(schema))
    return False


def _compiled(definition: bytes | bytearray | memoryview) -> _Compiled:
    if not isinstance(definition, (bytes, bytearray, memoryview)):
        raise InvalidArgument(f"Avro schema definition must be bytes, not {type(definition).__name__}")
    return _compile(bytes(definition))


# ---------------------------------------------------------------- compatibility


def _describe(schema: avro.schema.Schema) -> str:
    if isinstance(schema, avro.schema.NamedSchema):
        return f"{schema.type} {schema.fullname}"
    if isinstance(schema, avro.schema.UnionSchema):
        return "union [" + ", ".join(_describe(s) for s in schema.schemas) + "]"
    return str(schema.type)


def _where(path: str, label: str) -> str:
    return f"{path} {label!r}" if label else path


def _is_compatible(reader: avro.schema.Schema, writer: avro.schema.Schema) -> bool:
    # A fresh checker each time: its memo is keyed on schema identity and never reset.
    result = avro_compat.ReaderWriterCompatibilityChecker().get_compatibility(reader, writer)
    return result.compatibility is not avro_compat.SchemaCompatibilityType.incompatible


def _same_kind(a: avro.schema.Schema, b: avro.schema.Schema) -> bool:
    if a.type != b.type:
        return False
    if isinstance(a, avro.schema.NamedSchema) and isinstance(b, avro.schema.NamedSchema):
        return avro_compat.schema_name_equals(a, b)
    return True


class _Explainer:
    """Pairs each incompatibility the avro checker finds with its location and field name."""

    def __init__(self) -> None:
        self._seen: set[tuple[int, int]] = set()

    def explain(self, reader: avro.schema.Schema, writer: avro.schema.Schema, path: str, label: str) -> list[str]:
        if _is_compatible(reader, writer):
            return []
        key = (id(reader), id(writer))
        if key in self._seen:  # a recursive type: its own findings are reported where it was first met
            return [f"{_where(path, label)}: recursive reference to {_describe(reader)}, incompatible as reported for it"]
        self._seen.add(key)
        reasons = list(self._structural(reader, writer, path, label))
        if reasons:
            return reasons
        raw = avro_compat.ReaderWriterCompatibilityChecker().get_compatibility(reader, writer)
        return [f"{_where(path, label)}: {'; '.join(sorted(raw.messages))}"]

    def _structural(self, reader: avro.schema.Schema, writer: avro.schema.Schema, path: str, label: str) -> Iterator[str]:
        where = _where(path, label)
        if isinstance(writer, avro.schema.UnionSchema):
            yield from self._writer_union(reader, writer, path, label)
        elif isinstance(reader, avro.schema.UnionSchema):
            yield from self._reader_union(reader, writer, path, label)
        elif reader.type != writer.type:
            yield f"{where}: reader type {_describe(reader)} cannot read writer type {_describe(writer)}"
        elif isinstance(reader, avro.schema.RecordSchema) and isinstance(writer, avro.schema.RecordSchema):
            yield from self._names(reader, writer, path, label)
            yield from self._record_fields(reader, writer, path, label)
        elif isinstance(reader, avro.schema.ArraySchema) and isinstance(writer, avro.schema.ArraySchema):
            yield from self.explain(reader.items, writer.items, f"{_join(path, 'items')}", label)
        elif isinstance(reader, avro.schema.MapSchema) and isinstance(writer, avro.schema.MapSchema):
            yield from self.explain(reader.values, writer.values, f"{_join(path, 'values')}", label)
        elif isinstance(reader, avro.schema.EnumSchema) and isinstance(writer, avro.schema.EnumSchema):
            yield from self._names(reader, writer, path, label)
            if not _ok(avro_compat.check_reader_enum_contains_writer_enum(reader, writer, [])):
                missing = sorted(set(writer.symbols) - set(reader.symbols))
                yield (f"{_where(_join(path, 'symbols'), label)}: reader enum {reader.fullname} lacks writer symbols "
                       f"{missing} and has no default symbol")
        elif isinstance(reader, avro.schema.FixedSchema) and isinstance(writer, avro.schema.FixedSchema):
            yield from self._names(reader, writer, path, label)
            if not _ok(avro_compat.check_fixed_size(reader, writer, [])):
                yield (f"{_where(_join(path, 'size'), label)}: reader fixed {reader.fullname} has size {reader.size}, "
                       f"writer has size {writer.size}")

    def _names(self, reader: avro.schema.NamedSchema, writer: avro.schema.NamedSchema, path: str, label: str) -> Iterator[str]:
        if not _ok(avro_compat.check_schema_names(reader, writer, [])):
            yield (f"{_where(_join(path, 'name'), label)}: reader name {reader.fullname} does not match writer name "
                   f"{writer.fullname} and the reader has no alias for it")

    def _record_fields(self, reader: avro.schema.RecordSchema, writer: avro.schema.RecordSchema, path: str,
                       label: str) -> Iterator[str]:
        for i, field in enumerate(reader.fields):
            field_path = _join(path, f"fields/{i}")
            field_label = f"{label}.{field.name}" if label else field.name
            source = avro_compat.lookup_writer_field(writer_schema=writer, reader_field=field)
            if source is None:
                if not field.has_default:
                    yield f"{_where(field_path, field_label)}: reader field has no default and the writer does not have it"
                continue
            yield from self.explain(field.type, source.type, _join(field_path, "type"), field_label)

    def _writer_union(self, reader: avro.schema.Schema, writer: avro.schema.UnionSchema, path: str,
                      label: str) -> Iterator[str]:
        for i, branch in enumerate(writer.schemas):
            if _is_compatible(reader, branch):
                continue
            if isinstance(reader, avro.schema.UnionSchema):
                match = next((r for r in reader.schemas if _same_kind(r, branch)), None)
                if match is None:
                    yield (f"{_where(_join(path, str(i)), label)}: writer union branch {_describe(branch)} "
                           f"has no matching branch in the reader's {_describe(reader)}")
                    continue
                yield from self.explain(match, branch, _join(path, str(i)), label)
            else:
                yield from self.explain(reader, branch, _join(path, str(i)), label)

    def _reader_union(self, reader: avro.schema.UnionSchema, writer: avro.schema.Schema, path: str,
                      label: str) -> Iterator[str]:
        # Explain against the branch meant for this writer type (same type and name), if any.
        match = next((r for r in reader.schemas if _same_kind(r, writer)), None)
        if match is not None and not isinstance(match, avro.schema.PrimitiveSchema):
            yield from self.explain(match, writer, path, label)
            return
        yield f"{_where(path, label)}: reader {_describe(reader)} has no branch that can read writer type {_describe(writer)}"


def _ok(result: avro_compat.SchemaCompatibilityResult) -> bool:
    return result.compatibility is not avro_compat.SchemaCompatibilityType.incompatible


def _join(path: str, segment: str) -> str:
    return f"/{segment}" if path == "/" else f"{path}/{segment}"


# ---------------------------------------------------------------- binary encoding


def _failing_field(compiled: _Compiled, payload: bytes) -> str | None:
    """Name the top-level record field where decoding `payload` breaks (error path only).

    fastavro's read errors never name a field, so this decodes growing prefixes of the
    record's field list; the first prefix that fails ends with the field at fault.
    """
    doc = compiled.doc
    if not isinstance(doc, dict) or doc.get("type") not in ("record", "error"):
        return None
    fields = doc.get("fields") or []
    read = _reader_for(compiled)
    for n in range(1, len(fields) + 1):
        try:
            prefix = fastavro.parse_schema({**doc, "fields": fields[:n]})
            read(io.BytesIO(payload), prefix, None)
        except Exception:  # any failure marks the field; the caller reports the real error
            return str(fields[n - 1].get("name"))
    return None


def _reader_for(*schemas: _Compiled | None) -> Any:
    if any(s is not None and s.recursive for s in schemas):
        return fastavro._read_py.schemaless_reader
    return fastavro.schemaless_reader


def _read(compiled: _Compiled, payload: bytes, reader: _Compiled | None) -> Any:
    stream = io.BytesIO(payload)
    try:
        value = _reader_for(compiled, reader)(stream, compiled.fast, reader.fast if reader else None)
    except RecursionError:
        raise InvalidArgument("payload nests deeper than the broker decodes (a recursive schema, read under"
                              f" Python's recursion limit of {sys.getrecursionlimit()} frames)") from None
    except fastavro.read.SchemaResolutionError as e:
        raise InvalidArgument(f"cannot read the payload with the reader schema: {e}") from None
    except (EOFError, StopIteration) as e:
        problem = f"payload is truncated ({e})" if str(e) else "payload is truncated"
        raise InvalidArgument(_with_field(problem, compiled, payload)) from None
    except (IndexError, ValueError, TypeError, KeyError, OverflowError, UnicodeDecodeError, MemoryError) as e:
        raise InvalidArgument(_with_field(f"payload is not a valid Avro encoding: {type(e).__name__}: {e}", compiled,
                                          payload)) from None
    left = len(payload) - stream.tell()
    if left:
        raise InvalidArgument(f"payload has {left} trailing byte(s) after the Avro value ({stream.tell()} byte(s) decoded)")
    return value


def _with_field(problem: str, compiled: _Compiled, payload: bytes) -> str:
    field = _failing_field(compiled, payload)
    return f"{problem} at field {field!r}" if field else problem


def _summary(schema: Any) -> str:
    if isinstance(schema, dict):
        return str(schema.get("name") or schema.get("type"))
    if isinstance(schema, list):
        return "union [" + ", ".join(_summary(s) for s in schema) + "]"
    return str(schema)


def _check_value(compiled: _Compiled, value: Any) -> None:
    try:
        fastavro.validation.validate(value, compiled.fast, raise_errors=True)
    except fastavro.validation.ValidationError as e:
        details = "; ".join(
            f"{err.field or '(root)'} is {err.datum!r} ({type(err.datum).__name__}), expected {_summary(err.schema)}"
            for err in e.errors
        )
        raise InvalidArgument(f"value does not match the Avro schema: {details}") from None


# ---------------------------------------------------------------- the format


class AvroFormat:
    """Avro as a registry schema format; see the module docstring for the rules."""

    type = SchemaType.AVRO

    def normalize(self, definition: bytes) -> bytes:
        compiled = _compiled(definition)
        return json.dumps(compiled.avro.to_json(), sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()

    def reader_errors(self, reader: bytes, writer: bytes) -> list[str]:
        r, w = _compiled(reader), _compiled(writer)
        reasons = _Explainer().explain(r.avro, w.avro, "/", "")
        return list(dict.fromkeys(reasons))  # one reason per finding, in schema order

    def validate(self, definition: bytes, payload: bytes) -> None:
        _read(_compiled(definition), bytes(payload), None)

    def encode(self, definition: bytes, value: Any) -> bytes:
        compiled = _compiled(definition)
        _check_value(compiled, value)
        out = io.BytesIO()
        try:
            fastavro.schemaless_writer(out, compiled.fast, value)
        except (TypeError, ValueError, KeyError, OverflowError, AttributeError) as e:
            raise InvalidArgument(f"value does not match the Avro schema: {e}") from None
        return out.getvalue()

    def decode(self, definition: bytes, payload: bytes, reader: bytes | None = None) -> Any:
        return _read(_compiled(definition), bytes(payload), _compiled(reader) if reader is not None else None)


AVRO = AvroFormat()

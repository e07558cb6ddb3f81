"""The Protobuf schema format of the registry.

What a user registers (the *definition*) is one of:

- the text of a ``.proto`` file, proto2 or proto3 (UTF-8, with a ``syntax``/``message``
  declaration). It may import only the ``google/protobuf/*.proto`` well-known types. It is
  compiled by running ``python -m grpc_tools.protoc`` in a subprocess (there is no system
  ``protoc``); a compile error becomes ``InvalidArgument`` carrying
  protoc's ``file:line:col: message`` text.
- a serialized ``google.protobuf.FileDescriptorSet``, as written by
  ``protoc --include_imports --descriptor_set_out``. The last file is the main file.
- the registry's normalized form (below), so normalized bytes are themselves a definition.

The schema's *message type* is the first message of the main file, unless the ``.proto``
text starts with the directive comment ``// danube: message=<full.name>`` on its first line
(e.g. ``// danube: message=shop.Order``).

Normalized form: the compact, key-sorted JSON
``{"descriptor_set": <base64>, "format": "danube-protobuf/1", "message": <full name>}`` where
the descriptor set is pruned to the main file and what it imports (dependencies first), the
main file is renamed ``danube/schema.proto`` (file names do not matter on the wire, and the
same schema compiled from text or from a user's descriptor set must fingerprint alike),
``source_code_info`` and default ``json_name`` values are cleared (comments, spacing and
protoc's derived JSON names are noise), and it is serialized with ``deterministic=True``.

Compatibility (``reader_errors``) follows the wire format, matching fields by number:

- types are compatible within a wire group: varint (int32, uint32, int64, uint64, bool,
  enum), zigzag (sint32, sint64), 32-bit (fixed32, sfixed32, float), 64-bit (fixed64,
  sfixed64, double). Narrowing (int64 -> int32) truncates like a C cast, as protobuf documents.
  Length-delimited: string <-> bytes (the bytes must be valid UTF-8) and message <-> bytes are
  fine, a message of another type is compared recursively, string <-> message is an error.
  Groups only match groups.
- a writer's singular field read as repeated is fine (a one-element list; parsers accept packed
  and unpacked encodings alike); a writer's repeated field read as singular is an error (the
  reader keeps only the last element, and a packed list is not read at all).
- a reader field that is proto2 ``required`` must be required in the writer too (present in
  every message it wrote); an absent or optional writer field is an error.
- the registry's rule, about the change rather than a direction (`evolution_errors(old,
  new)`, checked in every mode but NONE): a field the old version has and the new one
  lacks must be ``reserved`` (by number or name) in the new one, or it is reported
  "removed without being reserved". Protobuf itself would skip it as unknown; the rule
  stops a later version reusing the number. `reader_errors` leaves it out (with it, the
  FORWARD check reader=old, writer=new would report every *added* field);
  ``ProtobufFormat(require_reserved=True)`` folds it into `reader_errors` instead.
- enum values the writer has and the reader lacks: an error for closed (proto2) reader enums,
  which drop unknown values, and fine for open (proto3) ones, which keep them.
- moving a field into or out of a oneof, or between oneofs, is an error (setting one member
  clears the others, so data is lost).
- the top-level message type's full name must not change.

Compiled definitions are cached (bounded LRU), each with its own ``DescriptorPool`` so that
schemas never collide in the process-wide default pool.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import functools
import importlib.resources
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, json_format, message_factory
from google.protobuf.descriptor import Descriptor, EnumDescriptor, FieldDescriptor
from google.protobuf.message import DecodeError, EncodeError, Message
from google.protobuf.unknown_fields import UnknownFieldSet

from danube_zmq.schemas.types import SchemaType
from danube_zmq.transport.errors import InvalidArgument

__all__ = ["PROTOBUF", "ProtobufFormat", "is_map", "message_descriptor"]

_FORMAT_TAG = "danube-protobuf/1"
_MAIN_FILE = "danube/schema.proto"
_DIRECTIVE = re.compile(r"^\s*//\s*danube:\s*message\s*=\s*\.?([A-Za-z_][\w.]*)\s*$")
_LOOKS_LIKE_PROTO = re.compile(r"\b(syntax|message|edition)\b")
_IMPORT = re.compile(r'^\s*import\s+(?:public\s+|weak\s+)?"([^"]+)"', re.MULTILINE)
_PROTOC_TIMEOUT_S = 60

_F = FieldDescriptor
_TYPE_NAMES = {
    _F.TYPE_DOUBLE: "double", _F.TYPE_FLOAT: "float", _F.TYPE_INT64: "int64", _F.TYPE_UINT64: "uint64",
    _F.TYPE_INT32: "int32", _F.TYPE_FIXED64: "fixed64", _F.TYPE_FIXED32: "fixed32", _F.TYPE_BOOL: "bool",
    _F.TYPE_STRING: "string", _F.TYPE_GROUP: "group", _F.TYPE_MESSAGE: "message", _F.TYPE_BYTES: "bytes",
    _F.TYPE_UINT32: "uint32", _F.TYPE_ENUM: "enum", _F.TYPE_SFIXED32: "sfixed32", _F.TYPE_SFIXED64: "sfixed64",
    _F.TYPE_SINT32: "sint32", _F.TYPE_SINT64: "sint64",
}
# Types in one group share a wire encoding, so a reader can decode what a writer wrote.
_WIRE_GROUP = {
    **dict.fromkeys((_F.TYPE_INT32, _F.TYPE_UINT32, _F.TYPE_INT64, _F.TYPE_UINT64, _F.TYPE_BOOL, _F.TYPE_ENUM), "varint"),
    **dict.fromkeys((_F.TYPE_SINT32, _F.TYPE_SINT64), "zigzag"),
    **dict.fromkeys((_F.TYPE_FIXED32, _F.TYPE_SFIXED32, _F.TYPE_FLOAT), "i32"),
    **dict.fromkeys((_F.TYPE_FIXED64, _F.TYPE_SFIXED64, _F.TYPE_DOUBLE), "i64"),
    **dict.fromkeys((_F.TYPE_STRING, _F.TYPE_BYTES, _F.TYPE_MESSAGE), "len"),
    _F.TYPE_GROUP: "group",
}
# Expected wire type per group, to name a field whose bytes arrived with the wrong one.
_WIRE_TYPE = {"varint": 0, "zigzag": 0, "i64": 1, "len": 2, "group": 3, "i32": 5}


@dataclasses.dataclass(frozen=True)
class _Compiled:
    normalized: bytes
    descriptor: Descriptor
    cls: type[Message]


class ProtobufFormat:
    """Protobuf schemas; see the module docstring for the definition and the rules."""

    type = SchemaType.PROTOBUF

    def __init__(self, *, require_reserved: bool = False) -> None:
        self.require_reserved = require_reserved

    def normalize(self, definition: bytes) -> bytes:
        return _load(_as_bytes(definition, "definition")).normalized

    def reader_errors(self, reader: bytes, writer: bytes) -> list[str]:
        r = _load(_as_bytes(reader, "reader definition")).descriptor
        w = _load(_as_bytes(writer, "writer definition")).descriptor
        errors: list[str] = []
        if r.full_name != w.full_name:
            errors.append(f"message type renamed: the writer's is {w.full_name}, the reader's {r.full_name}")
        _Checker(self.require_reserved, errors).messages(r, w, r.full_name)
        return errors

    def evolution_errors(self, old: bytes, new: bytes) -> list[str]:
        """Fields `old` has that `new` drops without reserving their number or name."""
        lax = set(ProtobufFormat(require_reserved=False).reader_errors(new, old))
        return [e for e in ProtobufFormat(require_reserved=True).reader_errors(new, old) if e not in lax]

    def validate(self, definition: bytes, payload: bytes) -> None:
        compiled = _load(_as_bytes(definition, "definition"))
        message = _parse(compiled, _as_bytes(payload, "payload"))
        if not message.IsInitialized():
            missing = ", ".join(message.FindInitializationErrors())
            raise InvalidArgument(f"{compiled.descriptor.full_name} payload is missing required field(s): {missing}")
        misplaced = _misplaced_fields(message, compiled.descriptor.full_name)
        if misplaced:
            raise InvalidArgument(f"{compiled.descriptor.full_name} payload is not valid: {'; '.join(misplaced)}")

    def encode(self, definition: bytes, value: Any) -> bytes:
        compiled = _load(_as_bytes(definition, "definition"))
        name = compiled.descriptor.full_name
        if isinstance(value, Message):
            if value.DESCRIPTOR.full_name != name:
                raise InvalidArgument(f"cannot encode a {value.DESCRIPTOR.full_name} message with the {name} schema")
            message = value
        elif isinstance(value, dict):
            message = compiled.cls()
            try:
                json_format.ParseDict(value, message)
            except json_format.ParseError as exc:
                raise InvalidArgument(f"cannot encode value as {name}: {exc}") from None
        else:
            raise InvalidArgument(f"cannot encode a {type(value).__name__} as {name}: expected a dict or a {name} message")
        try:
            return message.SerializeToString(deterministic=True)
        except EncodeError as exc:
            raise InvalidArgument(f"cannot encode value as {name}: {exc}") from None

    def decode(self, definition: bytes, payload: bytes, reader: bytes | None = None) -> Any:
        compiled = _load(_as_bytes(definition, "definition"))
        if reader is not None:
            # Protobuf resolves writer against reader by field number on its own, so the reader's
            # class parses the writer's bytes directly.
            compiled = _load(_as_bytes(reader, "reader definition"))
        message = _parse(compiled, _as_bytes(payload, "payload"))
        return json_format.MessageToDict(message, preserving_proto_field_name=True)


PROTOBUF = ProtobufFormat()


# --- loading definitions -------------------------------------------------------------------


def _as_bytes(value: Any, what: str) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    raise InvalidArgument(f"protobuf {what} must be bytes, not {type(value).__name__}")


@functools.lru_cache(maxsize=256)
def _load(definition: bytes) -> _Compiled:
    files, message_name = _parse_definition(definition)
    fds = _canonical_set(files)
    pool = descriptor_pool.DescriptorPool()  # per definition: schemas must not clash by name
    for file in fds.file:
        try:
            pool.Add(file)
        except (TypeError, ValueError) as exc:
            raise InvalidArgument(f"protobuf descriptor set is not valid: {exc}") from None
    main = fds.file[-1]
    if message_name is None:
        if not main.message_type:
            raise InvalidArgument("protobuf schema defines no message type")
        message_name = f"{main.package}.{main.message_type[0].name}" if main.package else main.message_type[0].name
    try:
        descriptor = pool.FindMessageTypeByName(message_name)
    except KeyError:
        defined = ", ".join(_message_names(main)) or "none"
        raise InvalidArgument(f"protobuf message {message_name!r} is not defined in the schema (defined: {defined})") from None
    envelope = {
        "descriptor_set": base64.b64encode(fds.SerializeToString(deterministic=True)).decode("ascii"),
        "format": _FORMAT_TAG,
        "message": message_name,
    }
    normalized = json.dumps(envelope, sort_keys=True, separators=(",", ":")).encode()
    return _Compiled(normalized, descriptor, message_factory.GetMessageClass(descriptor))


def _message_names(file: descriptor_pb2.FileDescriptorProto) -> list[str]:
    prefix = f"{file.package}." if file.package else ""
    return [prefix + m.name for m in file.message_type]


def _parse_definition(definition: bytes) -> tuple[descriptor_pb2.FileDescriptorSet, str | None]:
    """The definition's descriptor set and the message it names, if any."""
    # No lstrip: a FileDescriptorSet starts with b"\n" and its first file's length may be 123, i.e. b"{".
    if definition.startswith(b"{"):
        return _parse_envelope(definition)
    fds = _try_descriptor_set(definition)
    if fds is not None:
        return fds, None
    try:
        text = definition.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidArgument("protobuf definition is neither a serialized FileDescriptorSet nor UTF-8 .proto text") from None
    if not _LOOKS_LIKE_PROTO.search(text):
        raise InvalidArgument("protobuf definition is not .proto text: it has no syntax or message declaration")
    return _compile_proto(text), _directive(text)


def _parse_envelope(definition: bytes) -> tuple[descriptor_pb2.FileDescriptorSet, str]:
    try:
        envelope = json.loads(definition)
        if envelope.get("format") != _FORMAT_TAG or not isinstance(envelope.get("message"), str):
            raise ValueError("unknown format")
        raw = base64.b64decode(envelope["descriptor_set"], validate=True)
    except (ValueError, AttributeError, TypeError, KeyError, binascii.Error):
        raise InvalidArgument(
            f'protobuf definition looks like JSON but is not a normalized schema {{"format": "{_FORMAT_TAG}", ...}}'
        ) from None
    fds = _try_descriptor_set(raw)
    if fds is None:
        raise InvalidArgument("normalized protobuf schema holds no valid FileDescriptorSet")
    return fds, envelope["message"].lstrip(".")


def _try_descriptor_set(data: bytes) -> descriptor_pb2.FileDescriptorSet | None:
    try:
        fds = descriptor_pb2.FileDescriptorSet.FromString(data)
    except DecodeError:
        return None
    # Text that happens to parse as protobuf would leave unnamed files or unknown fields.
    if not fds.file or any(not f.name for f in fds.file) or len(UnknownFieldSet(fds)):
        return None
    return fds


def _directive(text: str) -> str | None:
    first_line = text.lstrip("\ufeff").split("\n", 1)[0]
    if not re.match(r"\s*//\s*danube:", first_line):
        return None
    match = _DIRECTIVE.match(first_line)
    if match is None:
        raise InvalidArgument(f"bad directive {first_line.strip()!r}; expected '// danube: message=<full.name>'")
    return match.group(1)


def _compile_proto(text: str) -> descriptor_pb2.FileDescriptorSet:
    for imported in _IMPORT.findall(text):
        if not imported.startswith("google/protobuf/"):
            raise InvalidArgument(f"protobuf schema imports {imported!r}; only google/protobuf well-known types may be imported")
    include = str(importlib.resources.files("grpc_tools") / "_proto")
    with tempfile.TemporaryDirectory(prefix="danube-proto-") as tmp:
        Path(tmp, "schema.proto").write_text(text, encoding="utf-8")
        out = Path(tmp, "schema.pb")
        # A subprocess because protoc writes its errors to fd 2, which we need to capture.
        # Relative paths from cwd=tmp keep the temp dir out of protoc's "schema.proto:line:col" messages.
        command = [sys.executable, "-m", "grpc_tools.protoc", "-I.", f"-I{include}", "--include_imports",
                   f"--descriptor_set_out={out.name}", "schema.proto"]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=_PROTOC_TIMEOUT_S, cwd=tmp)
        except subprocess.TimeoutExpired:
            raise InvalidArgument(f"protobuf schema did not compile within {_PROTOC_TIMEOUT_S}s") from None
        if done.returncode != 0:
            detail = (done.stderr or done.stdout).strip() or f"protoc exited with {done.returncode}"
            raise InvalidArgument(f"protobuf schema does not compile: {detail}")
        return descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())


def _canonical_set(fds: descriptor_pb2.FileDescriptorSet) -> descriptor_pb2.FileDescriptorSet:
    """The main file and its imports, dependencies first, with noise cleared; see the module docstring."""
    by_name = {f.name: f for f in fds.file}
    main_name = fds.file[-1].name
    ordered: list[descriptor_pb2.FileDescriptorProto] = []
    visiting: set[str] = set()

    def visit(name: str, importer: str) -> None:
        if any(f.name == name for f in ordered):
            return
        if name not in by_name:
            raise InvalidArgument(f"protobuf file {importer!r} imports {name!r}, which is not in the FileDescriptorSet")
        if name in visiting:
            raise InvalidArgument(f"protobuf file {name!r} imports itself through a cycle")
        visiting.add(name)
        for dependency in by_name[name].dependency:
            visit(dependency, name)
        ordered.append(by_name[name])

    visit(main_name, main_name)
    if _MAIN_FILE in by_name and main_name != _MAIN_FILE:
        raise InvalidArgument(f"protobuf file name {_MAIN_FILE!r} is reserved for the schema's main file")
    result = descriptor_pb2.FileDescriptorSet()
    for source in ordered:
        file = result.file.add()
        file.CopyFrom(source)
        file.ClearField("source_code_info")
        for message in file.message_type:
            _clear_default_json_names(message)
        for extension in file.extension:
            _clear_json_name(extension)
    result.file[-1].name = _MAIN_FILE  # nothing imports the main file, so no dependency list needs fixing
    return result


def _clear_default_json_names(message: descriptor_pb2.DescriptorProto) -> None:
    for field in (*message.field, *message.extension):
        _clear_json_name(field)
    for nested in message.nested_type:
        _clear_default_json_names(nested)


def _clear_json_name(field: descriptor_pb2.FieldDescriptorProto) -> None:
    # protoc always fills json_name; only a custom one ([json_name = "..."]) carries meaning.
    if field.HasField("json_name") and field.json_name == _default_json_name(field.name):
        field.ClearField("json_name")


def _default_json_name(name: str) -> str:
    """protoc's ToJsonName: drop underscores, upper-casing the letter after each."""
    parts = name.split("_")
    return parts[0] + "".join(p[:1].upper() + p[1:] for p in parts[1:])


# --- payloads ------------------------------------------------------------------------------


def _parse(compiled: _Compiled, payload: bytes) -> Message:
    message = compiled.cls()
    try:
        message.ParseFromString(payload)
    except DecodeError as exc:
        raise InvalidArgument(f"payload is not a valid {compiled.descriptor.full_name} message: {exc}") from None
    return message


def _misplaced_fields(message: Message, path: str) -> list[str]:
    """Known field numbers that the parser kept as unknown: wrong wire type, or a closed enum's unknown value."""
    descriptor = message.DESCRIPTOR
    problems: list[str] = []
    for unknown in UnknownFieldSet(message):
        field = descriptor.fields_by_number.get(unknown.field_number)
        if field is None:
            continue  # a field from a newer writer: protobuf keeps it, and so do we
        where = f"{path}.{field.name} (field {field.number})"
        if field.type == _F.TYPE_ENUM and unknown.wire_type in (0, 2):
            problems.append(f"{where}: value not defined in closed enum {field.enum_type.full_name}")
        else:
            problems.append(f"{where}: wire type {unknown.wire_type} does not match type {_type_name(field)}")
    for field, value in message.ListFields():
        if field.type not in (_F.TYPE_MESSAGE, _F.TYPE_GROUP):
            continue
        if is_map(field):
            value_field = field.message_type.fields_by_number[2]
            if value_field.type != _F.TYPE_MESSAGE:
                continue
            children: Any = value.values()
        else:
            children = value if field.is_repeated else [value]
        for child in children:
            problems.extend(_misplaced_fields(child, f"{path}.{field.name}"))
    return problems


# --- compatibility -------------------------------------------------------------------------


def is_map(field: FieldDescriptor) -> bool:
    return field.type == _F.TYPE_MESSAGE and field.message_type.GetOptions().map_entry


def message_descriptor(definition: bytes) -> Descriptor:
    """The message type a definition describes (compiled once, cached), for readers of
    its structure such as the Spark source's column types."""
    return _load(_as_bytes(definition, "definition")).descriptor


def _type_name(field: FieldDescriptor) -> str:
    if field.type in (_F.TYPE_MESSAGE, _F.TYPE_GROUP):
        return f"{_TYPE_NAMES[field.type]} {field.message_type.full_name}"
    if field.type == _F.TYPE_ENUM:
        return f"enum {field.enum_type.full_name}"
    return _TYPE_NAMES[field.type]


class _Checker:
    """Collects why a reader's message type can't read a writer's, walking nested types by field number."""

    def __init__(self, require_reserved: bool, errors: list[str]) -> None:
        self.require_reserved = require_reserved
        self.errors = errors
        self.seen: set[tuple[str, str]] = set()  # recursive types would otherwise loop

    def messages(self, reader: Descriptor, writer: Descriptor, path: str) -> None:
        key = (reader.full_name, writer.full_name)
        if key in self.seen:
            return
        self.seen.add(key)
        reader_proto = descriptor_pb2.DescriptorProto()
        reader.CopyToProto(reader_proto)
        writer_proto = descriptor_pb2.DescriptorProto()
        writer.CopyToProto(writer_proto)
        for number, w_field in writer.fields_by_number.items():
            r_field = reader.fields_by_number.get(number)
            if r_field is None:
                self._removed(w_field, reader_proto, path)
            else:
                self.fields(r_field, w_field, reader, writer, reader_proto, writer_proto, path)
        for number, r_field in reader.fields_by_number.items():
            if number not in writer.fields_by_number and r_field.is_required:
                self.errors.append(f"{path}.{r_field.name} (field {number}): required in the reader but absent from the writer")

    def _removed(self, field: FieldDescriptor, reader_proto: descriptor_pb2.DescriptorProto, path: str) -> None:
        if not self.require_reserved:
            return
        number_reserved = any(r.start <= field.number < r.end for r in reader_proto.reserved_range)
        if number_reserved or field.name in reader_proto.reserved_name:
            return
        self.errors.append(
            f"{path}.{field.name} (field {field.number}): removed without being reserved "
            f"(the reader neither has field {field.number} nor reserves its number or name)"
        )

    def fields(self, r: FieldDescriptor, w: FieldDescriptor, reader: Descriptor, writer: Descriptor,
               reader_proto: descriptor_pb2.DescriptorProto, writer_proto: descriptor_pb2.DescriptorProto, path: str) -> None:
        where = f"{path}.{r.name} (field {r.number})"
        self._labels(r, w, where)
        self._oneofs(r, w, reader, writer, reader_proto, writer_proto, where)
        self._types(r, w, where, f"{path}.{r.name}")

    def _labels(self, r: FieldDescriptor, w: FieldDescriptor, where: str) -> None:
        if w.is_repeated and not r.is_repeated:
            self.errors.append(f"{where}: changed from repeated to singular")
        elif r.is_repeated and not w.is_repeated and is_map(r):
            self.errors.append(f"{where}: changed from singular to map")
        if r.is_required and not w.is_required:
            self.errors.append(f"{where}: changed from optional to required")

    def _oneofs(self, r: FieldDescriptor, w: FieldDescriptor, reader: Descriptor, writer: Descriptor,
                reader_proto: descriptor_pb2.DescriptorProto, writer_proto: descriptor_pb2.DescriptorProto, where: str) -> None:
        r_oneof = _real_oneof(r, reader_proto)
        w_oneof = _real_oneof(w, writer_proto)
        if r_oneof is None and w_oneof is None:
            return
        if w_oneof is None:
            self.errors.append(f"{where}: moved into oneof {r_oneof}")
            return
        if r_oneof is None:
            self.errors.append(f"{where}: moved out of oneof {w_oneof}")
            return
        # Compare the fellow members both sides know; a renamed oneof or a new member is harmless.
        common = set(reader.fields_by_number) & set(writer.fields_by_number)
        r_members = {f.number for f in r.containing_oneof.fields} & common
        w_members = {f.number for f in w.containing_oneof.fields} & common
        if r_members != w_members:
            self.errors.append(
                f"{where}: oneof membership changed (writer's oneof {w_oneof} has fields {sorted(w_members)}, "
                f"reader's oneof {r_oneof} has {sorted(r_members)})"
            )

    def _types(self, r: FieldDescriptor, w: FieldDescriptor, where: str, path: str) -> None:
        r_group, w_group = _WIRE_GROUP[r.type], _WIRE_GROUP[w.type]
        changed = f"{where}: type changed from {_type_name(w)} to {_type_name(r)}"
        if r_group != w_group:
            self.errors.append(changed)
        elif r.type == w.type == _F.TYPE_ENUM:
            self._enums(r.enum_type, w.enum_type, where)
        elif r.type in (_F.TYPE_MESSAGE, _F.TYPE_GROUP) and w.type == r.type:
            self.messages(r.message_type, w.message_type, path)
        elif {r.type, w.type} == {_F.TYPE_STRING, _F.TYPE_MESSAGE}:
            self.errors.append(changed)  # an encoded message is not text, and text is rarely a message

    def _enums(self, r: EnumDescriptor, w: EnumDescriptor, where: str) -> None:
        if not r.is_closed:
            return  # open (proto3) enums keep unknown values
        for number, value in w.values_by_number.items():
            if number not in r.values_by_number:
                self.errors.append(
                    f"{where}: enum value {value.name} ({number}) of {w.full_name} is missing from the reader's "
                    f"closed (proto2) enum {r.full_name}, which drops it as unknown"
                )


def _real_oneof(field: FieldDescriptor, parent: descriptor_pb2.DescriptorProto) -> str | None:
    """The field's oneof name, ignoring the synthetic oneof of a proto3 `optional` field."""
    oneof = field.containing_oneof
    if oneof is None:
        return None
    if any(f.number == field.number and f.proto3_optional for f in parent.field):
        return None
    return oneof.name

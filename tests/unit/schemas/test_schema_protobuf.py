"""The Protobuf schema format: compiling, normalizing, compatibility rules and payloads."""

from __future__ import annotations

import importlib.resources
import json
import subprocess
import sys
from pathlib import Path

import pytest

from danube_zmq.schemas.protobuf_format import PROTOBUF, ProtobufFormat, _load
from danube_zmq.schemas.types import SchemaType
from danube_zmq.transport.errors import InvalidArgument


def p3(body: str, package: str = "shop") -> bytes:
    return f'syntax = "proto3";\npackage {package};\n{body}\n'.encode()


def p2(body: str, package: str = "shop") -> bytes:
    return f'syntax = "proto2";\npackage {package};\n{body}\n'.encode()


ORDER_P3 = p3("message Order { int32 qty = 1; string name = 2; repeated string tags = 3; Customer customer = 4; }\n"
              "message Customer { string id = 1; int64 since = 2; }")
ORDER_P2 = p2("message Order { required int32 qty = 1; optional string name = 2; }")


def compile_descriptor_set(tmp_path: Path, text: bytes, name: str = "order.proto") -> bytes:
    """What a user's `protoc --include_imports --descriptor_set_out` would upload, with source info for good measure."""
    (tmp_path / name).write_bytes(text)
    include = str(importlib.resources.files("grpc_tools") / "_proto")
    subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", f"-I{tmp_path}", f"-I{include}", "--include_imports",
         "--include_source_info", f"--descriptor_set_out={tmp_path / 'out.pb'}", str(tmp_path / name)],
        check=True, capture_output=True,
    )
    return (tmp_path / "out.pb").read_bytes()


# --- registration and normalize ------------------------------------------------------------


def test_type_and_singleton() -> None:
    assert PROTOBUF.type is SchemaType.PROTOBUF
    assert isinstance(PROTOBUF, ProtobufFormat)


@pytest.mark.parametrize("definition", [ORDER_P3, ORDER_P2], ids=["proto3", "proto2"])
def test_proto_text_compiles_to_an_envelope(definition: bytes) -> None:
    normalized = PROTOBUF.normalize(definition)
    envelope = json.loads(normalized)
    assert envelope["message"] == "shop.Order"
    assert envelope["format"] == "danube-protobuf/1"
    assert PROTOBUF.normalize(normalized) == normalized  # the normalized form is itself a definition


def test_syntax_error_carries_protocs_location() -> None:
    with pytest.raises(InvalidArgument) as err:
        PROTOBUF.normalize(p3("message Order {\n  int32 qty = 1\n}"))
    assert "schema.proto:5:1:" in str(err.value)  # line 5: the `}` after the missing `;`
    assert "/tmp" not in str(err.value)


def test_unknown_type_is_a_compile_error() -> None:
    with pytest.raises(InvalidArgument, match=r"schema\.proto:3:\d+:.*Money"):
        PROTOBUF.normalize(p3("message Order { Money price = 1; }"))


def test_only_well_known_imports() -> None:
    with pytest.raises(InvalidArgument, match=r"imports 'common/money\.proto'"):
        PROTOBUF.normalize(p3('import "common/money.proto";\nmessage Order { int32 qty = 1; }'))
    definition = p3('import "google/protobuf/timestamp.proto";\nmessage Order { google.protobuf.Timestamp at = 1; }')
    payload = PROTOBUF.encode(definition, {"at": "2024-01-02T03:04:05Z"})
    assert PROTOBUF.decode(definition, payload) == {"at": "2024-01-02T03:04:05Z"}


@pytest.mark.parametrize("definition", [b"\xff\xfe\x00\x81", b"hello world", b"", b"{not json"])
def test_bad_definitions(definition: bytes) -> None:
    with pytest.raises(InvalidArgument, match="protobuf definition"):
        PROTOBUF.normalize(definition)


def test_definition_must_be_bytes() -> None:
    with pytest.raises(InvalidArgument, match="must be bytes"):
        PROTOBUF.normalize("syntax = 'proto3';")  # type: ignore[arg-type]


def test_schema_without_message() -> None:
    with pytest.raises(InvalidArgument, match="no message"):
        PROTOBUF.normalize(p3("enum Color { RED = 0; }"))


def test_descriptor_set_normalizes_like_the_proto(tmp_path: Path) -> None:
    fds = compile_descriptor_set(tmp_path, b"// a comment that lands in source_code_info\n" + ORDER_P3)
    assert PROTOBUF.normalize(fds) == PROTOBUF.normalize(ORDER_P3)


def test_descriptor_set_with_well_known_import(tmp_path: Path) -> None:
    text = p3('import "google/protobuf/timestamp.proto";\nmessage Order { google.protobuf.Timestamp at = 1; }')
    assert PROTOBUF.normalize(compile_descriptor_set(tmp_path, text)) == PROTOBUF.normalize(text)


def test_whitespace_and_comments_do_not_matter() -> None:
    spaced = (b'// header comment\nsyntax   =   "proto3";\n\n/* block */ package shop;\n'
              b"message Order {\n  int32 qty = 1; // trailing\n  string name = 2;\n  repeated string tags = 3;\n"
              b"  Customer customer = 4;\n}\n\nmessage Customer {\n\tstring id = 1;\n\tint64 since = 2;\n}\n")
    assert PROTOBUF.normalize(spaced) == PROTOBUF.normalize(ORDER_P3)


def test_a_real_change_changes_the_normal_form() -> None:
    assert PROTOBUF.normalize(ORDER_P3) != PROTOBUF.normalize(ORDER_P3.replace(b"qty = 1", b"quantity = 1"))


def test_directive_picks_the_message() -> None:
    definition = b"// danube: message=shop.Customer\n" + ORDER_P3
    assert json.loads(PROTOBUF.normalize(definition))["message"] == "shop.Customer"
    assert PROTOBUF.decode(definition, PROTOBUF.encode(definition, {"id": "c1"})) == {"id": "c1"}
    # Naming the default message explicitly is the same schema.
    assert PROTOBUF.normalize(b"// danube: message=shop.Order\n" + ORDER_P3) == PROTOBUF.normalize(ORDER_P3)


def test_directive_errors() -> None:
    with pytest.raises(InvalidArgument, match=r"'shop\.Nope' is not defined.*shop\.Order, shop\.Customer"):
        PROTOBUF.normalize(b"// danube: message=shop.Nope\n" + ORDER_P3)
    with pytest.raises(InvalidArgument, match="bad directive"):
        PROTOBUF.normalize(b"// danube: msg shop.Order\n" + ORDER_P3)


def test_compiled_definitions_are_cached_and_bounded() -> None:
    assert _load.cache_info().maxsize == 256
    PROTOBUF.normalize(ORDER_P3)
    hits = _load.cache_info().hits
    PROTOBUF.validate(ORDER_P3, b"")
    assert _load.cache_info().hits == hits + 1


# --- compatibility matrix ------------------------------------------------------------------

BASE = "message Order { int32 qty = 1; string name = 2; }"

# (id, old, new, BACKWARD reasons = reader_errors(reader=new, writer=old), FORWARD reasons = reader_errors(reader=old, writer=new)).
# Each expected reason is a substring one reported error must contain; [] means compatible.
CASES = [
    ("field added", p3(BASE), p3("message Order { int32 qty = 1; string name = 2; string note = 3; }"),
     [], ["shop.Order.note (field 3): removed without being reserved"]),
    ("field removed, not reserved", p3(BASE), p3("message Order { int32 qty = 1; }"),
     ["shop.Order.name (field 2): removed without being reserved"], []),
    ("field removed, number reserved", p3(BASE), p3("message Order { int32 qty = 1; reserved 2; }"), [], []),
    ("field removed, range reserved", p3(BASE), p3("message Order { int32 qty = 1; reserved 2 to 5; }"), [], []),
    ("field removed, name reserved", p3(BASE), p3('message Order { int32 qty = 1; reserved "name"; }'), [], []),
    ("number reused with another type", p3(BASE), p3("message Order { int32 qty = 1; int64 count = 2; }"),
     ["shop.Order.count (field 2): type changed from string to int64"],
     ["shop.Order.name (field 2): type changed from int64 to string"]),
    ("int32 -> int64", p3(BASE), p3("message Order { int64 qty = 1; string name = 2; }"), [], []),
    ("int32 -> uint64", p3(BASE), p3("message Order { uint64 qty = 1; string name = 2; }"), [], []),
    ("int32 -> bool", p3(BASE), p3("message Order { bool qty = 1; string name = 2; }"), [], []),
    ("int32 -> string", p3(BASE), p3("message Order { string qty = 1; string name = 2; }"),
     ["shop.Order.qty (field 1): type changed from int32 to string"],
     ["shop.Order.qty (field 1): type changed from string to int32"]),
    ("int32 -> sint32", p3(BASE), p3("message Order { sint32 qty = 1; string name = 2; }"),
     ["shop.Order.qty (field 1): type changed from int32 to sint32"], ["qty (field 1): type changed from sint32 to int32"]),
    ("sint32 -> sint64", p3("message Order { sint32 qty = 1; }"), p3("message Order { sint64 qty = 1; }"), [], []),
    ("fixed32 -> float", p3("message Order { fixed32 qty = 1; }"), p3("message Order { float qty = 1; }"), [], []),
    ("sfixed64 -> double", p3("message Order { sfixed64 qty = 1; }"), p3("message Order { double qty = 1; }"), [], []),
    ("float -> double", p3("message Order { float qty = 1; }"), p3("message Order { double qty = 1; }"),
     ["qty (field 1): type changed from float to double"], ["qty (field 1): type changed from double to float"]),
    ("string -> bytes", p3(BASE), p3("message Order { int32 qty = 1; bytes name = 2; }"), [], []),
    ("message -> bytes", p3("message Order { Item item = 1; }\nmessage Item { int32 id = 1; }"),
     p3("message Order { bytes item = 1; }"), [], []),
    ("message -> string", p3("message Order { Item item = 1; }\nmessage Item { int32 id = 1; }"),
     p3("message Order { string item = 1; }"),
     ["shop.Order.item (field 1): type changed from message shop.Item to string"],
     ["shop.Order.item (field 1): type changed from string to message shop.Item"]),
    ("int32 -> enum", p3(BASE), p3("message Order { Qty qty = 1; string name = 2; }\nenum Qty { ZERO = 0; }"), [], []),
    ("singular -> repeated", p3(BASE), p3("message Order { repeated int32 qty = 1; string name = 2; }"),
     [], ["shop.Order.qty (field 1): changed from repeated to singular"]),
    ("singular -> repeated string", p3(BASE), p3("message Order { int32 qty = 1; repeated string name = 2; }"),
     [], ["shop.Order.name (field 2): changed from repeated to singular"]),
    ("proto3 implicit -> optional", p3(BASE), p3("message Order { optional int32 qty = 1; string name = 2; }"), [], []),
    ("proto2 optional -> required", p2("message Order { optional int32 qty = 1; }"),
     p2("message Order { required int32 qty = 1; }"),
     ["shop.Order.qty (field 1): changed from optional to required"], []),
    ("proto2 required field added", p2("message Order { optional int32 qty = 1; }"),
     p2("message Order { optional int32 qty = 1; required string code = 2; }"),
     ["shop.Order.code (field 2): required in the reader but absent from the writer"],
     ["shop.Order.code (field 2): removed without being reserved"]),
    ("nested field type changed",
     p3("message Order { Customer customer = 1; }\nmessage Customer { string id = 1; }"),
     p3("message Order { Customer customer = 1; }\nmessage Customer { int64 id = 1; }"),
     ["shop.Order.customer.id (field 1): type changed from string to int64"],
     ["shop.Order.customer.id (field 1): type changed from int64 to string"]),
    ("nested field removed",
     p3("message Order { Customer customer = 1; }\nmessage Customer { string id = 1; string email = 2; }"),
     p3("message Order { Customer customer = 1; }\nmessage Customer { string id = 1; }"),
     ["shop.Order.customer.email (field 2): removed without being reserved"], []),
    ("nested message type swapped for a compatible one",
     p3("message Order { Customer who = 1; }\nmessage Customer { string id = 1; }"),
     p3("message Order { Client who = 1; }\nmessage Client { bytes id = 1; }"), [], []),
    ("map value type changed", p3("message Order { map<string, int32> attrs = 1; }"),
     p3("message Order { map<string, string> attrs = 1; }"),
     ["shop.Order.attrs.value (field 2): type changed from int32 to string"],
     ["shop.Order.attrs.value (field 2): type changed from string to int32"]),
    ("recursive type unchanged", p3("message Node { string name = 1; repeated Node children = 2; }"),
     p3("// reformatted\nmessage Node {\n string name = 1;\n repeated Node children = 2;\n}"), [], []),
    ("proto2 enum value removed",
     p2("message Order { optional Status status = 1; }\nenum Status { NEW = 0; PAID = 1; SHIPPED = 2; }"),
     p2("message Order { optional Status status = 1; }\nenum Status { NEW = 0; PAID = 1; reserved 2; }"),
     ["shop.Order.status (field 1): enum value SHIPPED (2) of shop.Status is missing from the reader's closed"], []),
    ("proto3 enum value removed (open enum keeps it)",
     p3("message Order { Status status = 1; }\nenum Status { NEW = 0; PAID = 1; SHIPPED = 2; }"),
     p3("message Order { Status status = 1; }\nenum Status { NEW = 0; PAID = 1; reserved 2; }"), [], []),
    ("message renamed", p3(BASE), p3("message Purchase { int32 qty = 1; string name = 2; }"),
     ["message type renamed: the writer's is shop.Order, the reader's shop.Purchase"],
     ["message type renamed: the writer's is shop.Purchase, the reader's shop.Order"]),
    ("package renamed", p3(BASE), p3(BASE, package="store"),
     ["message type renamed: the writer's is shop.Order, the reader's store.Order"],
     ["message type renamed: the writer's is store.Order, the reader's shop.Order"]),
    ("field moved into a oneof", p3("message Order { int32 qty = 1; string name = 2; string alias = 3; }"),
     p3("message Order { int32 qty = 1; oneof label { string name = 2; string alias = 3; } }"),
     ["shop.Order.name (field 2): moved into oneof label", "shop.Order.alias (field 3): moved into oneof label"],
     ["shop.Order.name (field 2): moved out of oneof label"]),
    ("oneof renamed", p3("message Order { oneof a { string x = 1; int32 y = 2; } }"),
     p3("message Order { oneof b { string x = 1; int32 y = 2; } }"), [], []),
    ("field moved between oneofs", p3("message Order { oneof a { string x = 1; int32 y = 2; } oneof b { int32 z = 3; } }"),
     p3("message Order { oneof a { string x = 1; } oneof b { int32 y = 2; int32 z = 3; } }"),
     ["shop.Order.y (field 2): oneof membership changed"], ["shop.Order.y (field 2): oneof membership changed"]),
]


def assert_reasons(errors: list[str], expected: list[str]) -> None:
    if not expected:
        assert errors == []
        return
    for reason in expected:
        assert any(reason in error for error in errors), f"{reason!r} not in {errors}"


@pytest.mark.parametrize(("old", "new", "backward", "forward"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_compatibility_matrix(old: bytes, new: bytes, backward: list[str], forward: list[str]) -> None:
    strict = ProtobufFormat(require_reserved=True)  # the reserved rule folded into both directions
    assert_reasons(strict.reader_errors(reader=new, writer=old), backward)
    assert_reasons(strict.reader_errors(reader=old, writer=new), forward)


def test_matrix_is_big_enough() -> None:
    assert len(CASES) >= 20


def test_identical_schemas_are_compatible() -> None:
    assert PROTOBUF.reader_errors(ORDER_P3, PROTOBUF.normalize(ORDER_P3)) == []
    assert PROTOBUF.reader_errors(ORDER_P2, ORDER_P2) == []


def test_reserved_rule_is_about_the_change_not_a_direction() -> None:
    """The default format leaves the rule out of reader_errors: an added field is fine both
    ways; `evolution_errors(old, new)` reports a removal that does not reserve."""
    added = p3("message Order { int32 qty = 1; string name = 2; string note = 3; }")
    assert PROTOBUF.reader_errors(reader=added, writer=p3(BASE)) == []
    assert PROTOBUF.reader_errors(reader=p3(BASE), writer=added) == []
    assert PROTOBUF.evolution_errors(p3(BASE), added) == []
    removed = p3("message Order { int32 qty = 1; }")
    assert PROTOBUF.reader_errors(reader=removed, writer=p3(BASE)) == []
    (reason,) = PROTOBUF.evolution_errors(p3(BASE), removed)
    assert reason.startswith("shop.Order.name (field 2): removed without being reserved")
    assert PROTOBUF.evolution_errors(p3(BASE), p3("message Order { int32 qty = 1; reserved 2; }")) == []


def test_reader_errors_rejects_a_bad_definition() -> None:
    with pytest.raises(InvalidArgument):
        PROTOBUF.reader_errors(reader=b"garbage", writer=ORDER_P3)


# --- payloads ------------------------------------------------------------------------------


def test_validate_accepts_a_good_payload() -> None:
    payload = PROTOBUF.encode(ORDER_P3, {"qty": 2, "name": "pen", "customer": {"id": "c1"}})
    PROTOBUF.validate(ORDER_P3, payload)
    PROTOBUF.validate(PROTOBUF.normalize(ORDER_P3), payload)


@pytest.mark.parametrize("payload", [b"\xff" * 11, b"\x12\x05ab", b"\x0b"], ids=["bad varint", "truncated", "lone group"])
def test_validate_rejects_garbage(payload: bytes) -> None:
    with pytest.raises(InvalidArgument, match=r"not a valid shop\.Order"):
        PROTOBUF.validate(ORDER_P3, payload)


def test_validate_names_a_missing_required_field() -> None:
    payload = PROTOBUF.encode(p2("message Order { optional string name = 2; }"), {"name": "pen"})
    with pytest.raises(InvalidArgument, match=r"missing required field.*qty"):
        PROTOBUF.validate(ORDER_P2, payload)


def test_validate_names_a_field_with_the_wrong_wire_type() -> None:
    payload = PROTOBUF.encode(p3("message Order { string qty = 1; }"), {"qty": "two"})
    with pytest.raises(InvalidArgument, match=r"shop\.Order\.qty \(field 1\): wire type 2 does not match type int32"):
        PROTOBUF.validate(ORDER_P3, payload)


def test_validate_names_a_nested_field_with_the_wrong_wire_type() -> None:
    payload = PROTOBUF.encode(p3("message Order { Customer customer = 4; }\nmessage Customer { int32 id = 1; }"),
                              {"customer": {"id": 7}})
    with pytest.raises(InvalidArgument, match=r"shop\.Order\.customer\.id \(field 1\)"):
        PROTOBUF.validate(ORDER_P3, payload)


def test_validate_names_an_unknown_closed_enum_value() -> None:
    writer = p2("message Order { optional Status status = 1; }\nenum Status { NEW = 0; SHIPPED = 2; }")
    reader = p2("message Order { optional Status status = 1; }\nenum Status { NEW = 0; }")
    payload = PROTOBUF.encode(writer, {"status": "SHIPPED"})
    with pytest.raises(InvalidArgument, match=r"status \(field 1\): value not defined in closed enum shop.Status"):
        PROTOBUF.validate(reader, payload)


def test_validate_ignores_fields_from_a_newer_writer() -> None:
    newer = p3(BASE.replace("}", "string note = 9; }"))
    PROTOBUF.validate(p3(BASE), PROTOBUF.encode(newer, {"qty": 1, "note": "x"}))


def test_encode_decode_round_trip() -> None:
    value = {"qty": 2, "name": "pen", "tags": ["a", "b"], "customer": {"id": "c1", "since": "1700000000000"}}
    payload = PROTOBUF.encode(ORDER_P3, value)
    assert isinstance(payload, bytes)
    assert PROTOBUF.decode(ORDER_P3, payload) == value  # int64 comes back as a string, as proto3 JSON says


def test_encode_proto2_and_missing_required() -> None:
    assert PROTOBUF.decode(ORDER_P2, PROTOBUF.encode(ORDER_P2, {"qty": 1})) == {"qty": 1}
    with pytest.raises(InvalidArgument, match="missing required fields: qty"):
        PROTOBUF.encode(ORDER_P2, {"name": "pen"})


def test_encode_names_an_unknown_field() -> None:
    with pytest.raises(InvalidArgument, match='no field named "colour"'):
        PROTOBUF.encode(ORDER_P3, {"qty": 1, "colour": "red"})


def test_encode_names_a_bad_value() -> None:
    with pytest.raises(InvalidArgument, match="qty"):
        PROTOBUF.encode(ORDER_P3, {"qty": "many"})


def test_encode_a_message_instance() -> None:
    cls = _load(ORDER_P3).cls
    message = cls(qty=5, name="pen")
    assert PROTOBUF.decode(ORDER_P3, PROTOBUF.encode(ORDER_P3, message)) == {"qty": 5, "name": "pen"}
    customer = _load(b"// danube: message=shop.Customer\n" + ORDER_P3).cls(id="c1")
    with pytest.raises(InvalidArgument, match=r"shop\.Customer message with the shop\.Order schema"):
        PROTOBUF.encode(ORDER_P3, customer)


def test_encode_rejects_other_values() -> None:
    with pytest.raises(InvalidArgument, match="expected a dict"):
        PROTOBUF.encode(ORDER_P3, [1, 2])


def test_decode_with_a_reader_schema() -> None:
    writer = p3("message Order { int32 qty = 1; string name = 2; string note = 3; }")
    reader = p3("message Order { int64 qty = 1; repeated string name = 2; reserved 3; }")
    payload = PROTOBUF.encode(writer, {"qty": 3, "name": "pen", "note": "dropped"})
    assert PROTOBUF.decode(writer, payload, reader=reader) == {"qty": "3", "name": ["pen"]}


def test_decode_rejects_garbage() -> None:
    with pytest.raises(InvalidArgument, match=r"not a valid shop\.Order"):
        PROTOBUF.decode(ORDER_P3, b"\xff" * 11)

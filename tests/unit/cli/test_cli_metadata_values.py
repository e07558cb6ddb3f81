"""How `danube admin metadata` reads a stored value (cli/metadata_values.py): each kind
of bytes the store holds, and the ambiguous ones, end up in the right form."""

from __future__ import annotations

import msgpack

from danube_zmq.cli.metadata_values import raw_text, readable
from danube_zmq.transport import cluster_records as cr


def test_a_cluster_record_is_named_with_its_fields() -> None:
    """An Assignment as stored by the brokers reads back as its type and field names."""
    value = readable(cr.encode(cr.Assignment(broker_id=42, epoch=3, assigned_ms=1_700_000_000_000)))
    assert value.format == "record"
    assert value.value["record"] == "Assignment"
    assert (value.value["broker_id"], value.value["epoch"]) == (42, 3)


def test_printable_text_stays_text_even_when_it_is_also_msgpack() -> None:
    """"7" is the msgpack integer 55 too; an operator who put "7" reads "7". The empty
    value (a namespace's record) is empty text."""
    assert (readable(b"7").format, readable(b"7").value) == ("text", "7")
    assert (readable(b"").format, readable(b"").value) == ("text", "")
    assert readable(b"tcp://10.0.0.1:6660\n").value == "tcp://10.0.0.1:6660\n"


def test_other_msgpack_is_json_with_bytes_inside_as_text_or_base64() -> None:
    """A map with non-string keys and bin values becomes a JSON object."""
    value = readable(msgpack.packb({1: b"ok", "b": b"\xff", "c": [None, True, 1.5]}, use_bin_type=True))
    assert value.format == "msgpack"
    assert value.value == {"1": "ok", "b": "base64:/w==", "c": [None, True, 1.5]}
    assert value.shown() == '{"1":"ok","b":"base64:/w==","c":[null,true,1.5]}'


def test_bytes_neither_text_nor_msgpack_are_base64_and_say_so() -> None:
    """Trailing bytes after a msgpack value, an extension type: not one plain msgpack
    value; not UTF-8 either, so base64 with its marker (what `metadata put` takes)."""
    for data in (b"\xff\xfe\x00\x01", msgpack.packb(msgpack.ExtType(5, b"x")) + b"\xff"):
        value = readable(data)
        assert value.format == "base64" and value.shown().startswith("base64:")
    assert readable(msgpack.packb(msgpack.ExtType(5, b"\xff"))).format == "base64"


def test_control_characters_that_are_not_msgpack_are_still_text() -> None:
    """UTF-8 with a control character that is not a whole msgpack value stays text."""
    assert (readable(b"\x01\x02").format, readable(b"\x01\x02").value) == ("text", "\x01\x02")


def test_raw_is_the_stored_bytes_as_before() -> None:
    assert raw_text(b"on") == "on"
    assert raw_text(b"\x92\x01\x02") == "base64:kgEC"

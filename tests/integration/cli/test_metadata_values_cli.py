"""`danube admin metadata get|list` against a real broker print stored values readable:
the broker's own records as JSON with their type and field names, other msgpack as
JSON, printable text as it is, bytes that are neither as base64 saying so; `--raw`
prints the stored bytes as before (UTF-8 text, else base64:...)."""

from __future__ import annotations

import asyncio
import base64
import json

import msgpack

from danube_zmq.client.admin import AdminClient
from danube_zmq.transport.admin_protocol import MetadataEntry
from tests.integration.cli.test_cluster_cli import danube

NOT_UTF8 = b"\xff\xfe\x00\x01"  # neither UTF-8 nor one whole msgpack value


def _metadata(broker, *args: str) -> str:
    out = danube("admin", "--endpoint", broker.admin_url, "metadata", *args)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_metadata_get_shows_records_and_msgpack_as_json_and_raw_bytes_on_request(broker) -> None:
    """A broker registration (a cluster record) shows its fields by name; a msgpack map
    put by hand shows as that map; "7" stays text; a value that is neither UTF-8 nor
    msgpack is base64 and says so; --raw gives the old base64 of a record."""
    packed = msgpack.packb({"owner": "ops", "limits": [1, 2], "blob": b"\x00\xff"}, use_bin_type=True)

    async def put() -> MetadataEntry:
        async with AdminClient(broker.admin_url) as admin:
            await admin.metadata_put("/ops/packed", packed)
            await admin.metadata_put("/ops/digit", b"7")
            await admin.metadata_put("/ops/binary", NOT_UTF8)
            [registration] = (await admin.metadata_list("/cluster/register/")).entries
            return registration

    registration = asyncio.run(put())
    registration_key = registration.key

    [entry] = json.loads(_metadata(broker, "get", registration_key, "-o", "json"))
    assert entry["value_format"] == "record"
    assert entry["value"]["record"] == "BrokerRegistration"
    assert entry["value"]["broker_url"] == broker.url and entry["value"]["admin_url"] == broker.admin_url
    [raw] = json.loads(_metadata(broker, "get", registration_key, "--raw", "-o", "json"))
    assert raw["value"] == "base64:" + base64.b64encode(registration.value).decode() and "value_format" not in raw

    [entry] = json.loads(_metadata(broker, "get", "/ops/packed", "-o", "json"))
    assert (entry["value_format"], entry["value"]) == (
        "msgpack", {"owner": "ops", "limits": [1, 2], "blob": "base64:" + base64.b64encode(b"\x00\xff").decode()})
    table = _metadata(broker, "get", "/ops/packed")
    assert '{"owner":"ops","limits":[1,2],' in table

    [entry] = json.loads(_metadata(broker, "get", "/ops/digit", "-o", "json"))
    assert (entry["value_format"], entry["value"]) == ("text", "7")

    expected = "base64:" + base64.b64encode(NOT_UTF8).decode()
    [entry] = json.loads(_metadata(broker, "get", "/ops/binary", "-o", "json"))
    assert (entry["value_format"], entry["value"]) == ("base64", expected)
    assert expected in _metadata(broker, "get", "/ops/binary")
    assert expected in _metadata(broker, "get", "/ops/binary", "--raw")

    listed = {e["key"]: e for e in json.loads(_metadata(broker, "list", "/ops/", "-o", "json"))}
    assert [listed[k]["value_format"] for k in ("/ops/binary", "/ops/digit", "/ops/packed")] == \
        ["base64", "text", "msgpack"]
    raw_listing = _metadata(broker, "list", "/ops/", "--raw")
    assert "base64:" + base64.b64encode(packed).decode() in raw_listing

"""WAL snapshot files without a broker: segment bytes -> Parquet (rows, footer, damage),
manifests (round trip, malformed ones named), the snapshot location (publish, list,
delete, shared files kept while named)."""

from __future__ import annotations

import io
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from danube_zmq.snapshots.export import CorruptSegment, export_segment, read_footer
from danube_zmq.snapshots.manifest import (
    FileRef,
    Manifest,
    SubscriptionState,
    TopicState,
    new_snapshot_id,
    segment_path,
    tail_path,
)
from danube_zmq.snapshots.store import SnapshotStore
from danube_zmq.storage.wal.format import HEADER_BYTES, encode_batch
from danube_zmq.transport.errors import InvalidArgument, NotFound


def segment_file(tmp_path: Path, base: int, payloads: list[bytes], **columns: object) -> Path:
    path = tmp_path / f"{base:020d}.wal"
    path.write_bytes(encode_batch(base, payloads, [1_700_000_000_000 + i for i in range(len(payloads))], 42,
                                  "producer-a", **columns))  # type: ignore[arg-type]
    return path


def test_a_segment_becomes_one_row_per_record_with_every_column(tmp_path: Path) -> None:
    path = segment_file(tmp_path, 10, [b"a" * 5, b"", b"ccc"], keys=["k1", None, "k3"],
                        attributes=[{"x": "1"}, None, {}], schema_id=7, schema_version=2)
    out = io.BytesIO()
    done = export_segment(path, out, where=str(path), topic="/default/t-part-1", partition=1, base_offset=10,
                          upto_offset=13, payloads=True)
    assert (done.base_offset, done.last_offset, done.records) == (10, 12, 3)
    assert done.record_bytes == path.stat().st_size
    rows = pq.read_table(io.BytesIO(out.getvalue())).to_pylist()
    assert [(r["offset"], r["key"], r["size"], r["payload"], r["attributes"]) for r in rows] == [
        (10, "k1", 5, b"aaaaa", [("x", "1")]), (11, None, 0, b"", None), (12, "k3", 3, b"ccc", None)]
    assert {(r["topic"], r["partition"], r["producer"], r["producer_id"], r["schema_id"], r["schema_version"])
            for r in rows} == {("/default/t-part-1", 1, "producer-a", 42, 7, 2)}
    assert rows[0]["publish_time"].timestamp() == 1_700_000_000
    assert sum(r["record_bytes"] for r in rows) == done.record_bytes and rows[0]["record_bytes"] > HEADER_BYTES
    footer = read_footer(io.BytesIO(out.getvalue()), "x")
    assert (footer.base_offset, footer.last_offset, footer.records, footer.record_bytes) == (10, 12, 3, done.record_bytes)


def test_the_cut_bounds_the_export_and_payloads_are_optional(tmp_path: Path) -> None:
    path = segment_file(tmp_path, 0, [b"x"] * 100)
    out = io.BytesIO()
    done = export_segment(path, out, where="p", topic="/default/t", partition=None, base_offset=0, upto_offset=40,
                          payloads=False)
    table = pq.read_table(io.BytesIO(out.getvalue()))
    assert done.records == table.num_rows == 40 and table.column("payload").null_count == 40
    assert table.column("partition").null_count == 40


def test_damage_and_short_files_are_named(tmp_path: Path) -> None:
    path = segment_file(tmp_path, 0, [b"payload-%d" % i for i in range(20)])
    with pytest.raises(CorruptSegment,
                       match=r"segment .*00000\.wal is damaged at byte \d+: ends at offset 20, before the cut at 30"):
        export_segment(path, io.BytesIO(), where=str(path), topic="/default/t", partition=None, base_offset=0,
                       upto_offset=30, payloads=False)
    data = bytearray(path.read_bytes())
    data[HEADER_BYTES * 3 + 60] ^= 0xFF  # inside a body after the first records
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptSegment, match=r"damaged at byte \d+: crc32c mismatch"):
        export_segment(path, io.BytesIO(), where=str(path), topic="/default/t", partition=None, base_offset=0,
                       upto_offset=20, payloads=False)
    with pytest.raises(CorruptSegment, match="not an exported segment"):
        read_footer(io.BytesIO(b"not parquet"), "somewhere")


@settings(max_examples=30, deadline=None)
@given(st.lists(st.binary(max_size=300), min_size=1, max_size=400), st.integers(0, 2**40))
def test_any_records_round_trip_in_windows(tmp_path_factory: pytest.TempPathFactory, payloads: list[bytes],
                                           base: int) -> None:
    from danube_zmq.snapshots import export

    tmp_path = tmp_path_factory.mktemp("seg")
    path = segment_file(tmp_path, base, payloads)
    window, export._WINDOW_BYTES = export._WINDOW_BYTES, 1024  # many row groups
    try:
        out = io.BytesIO()
        export_segment(path, out, where="p", topic="/default/t", partition=None, base_offset=base,
                       upto_offset=base + len(payloads), payloads=True)
    finally:
        export._WINDOW_BYTES = window
    rows = pq.read_table(io.BytesIO(out.getvalue())).to_pylist()
    assert [r["offset"] for r in rows] == list(range(base, base + len(payloads)))
    assert [r["payload"] for r in rows] == payloads


def manifest(snapshot_id: str, files: list[FileRef]) -> Manifest:
    return Manifest(snapshot_id=snapshot_id, created_ms=1, broker_id=5, broker_url="tcp://b", include_payloads=False,
                    topics=[TopicState(topic="/default/t", base_topic="/default/t", partition=None, log_start_offset=0,
                                       end_offset=10, messages_in=10, producers=["p"], files=files,
                                       subscriptions=[SubscriptionState(name="s", sub_type="shared", cursor=3,
                                                                        acked_above=[5, 7, 12], unacked=1,
                                                                        consumers=["c"], backlog_messages=4)])])


def test_manifests_round_trip_and_bad_ones_are_named() -> None:
    m = manifest("id-1", [FileRef("segments/default/t/a.parquet", 0, 9, 10, 300, True)])
    assert Manifest.from_json(m.to_json(), "x") == m
    assert m.topics[0].subscriptions[0].backlog_offsets(10) == 4  # 4, 6, 8, 9
    with pytest.raises(InvalidArgument, match=r"snapshot manifest s3://b/m\.json is not valid: JSONDecodeError"):
        Manifest.from_json("{", "s3://b/m.json")
    with pytest.raises(InvalidArgument, match="has format 9"):
        Manifest.from_json('{"format": 9}', "m")
    with pytest.raises(InvalidArgument, match="KeyError"):
        Manifest.from_json('{"format": 1, "topics": []}', "m")


def test_ids_and_paths_sort_by_time_and_offset() -> None:
    ids = [new_snapshot_id(ms, 3) for ms in (1_700_000_000_000, 1_700_000_000_999, 1_700_000_001_000)]
    assert ids == sorted(ids) and ids[0] == "20231114T221320.000Z-n3"
    assert segment_path("/default/t-part-0", 0, 99, False) == \
        "segments/default/t-part-0/00000000000000000000-00000000000000000099.parquet"
    assert tail_path("S", "/default/t", 100, 150, True).endswith("00000000000000000150.payloads.parquet")


def test_store_publishes_lists_deletes_and_keeps_named_shared_files(tmp_path: Path) -> None:
    store = SnapshotStore(str(tmp_path / "snaps"))
    assert store.snapshot_ids() == []
    shared = "segments/default/t/0-9.parquet"
    orphan = "segments/default/t/10-19.parquet"
    for path in (shared, orphan):
        store.publish(path, lambda f: f.write(b"data"))
    store.publish("snapshots/unfinished/tail/x.parquet", lambda f: f.write(b"no manifest"))
    store.write_manifest(manifest("id-2", [FileRef(shared, 0, 9, 10, 4, True)]))
    store.write_manifest(manifest("id-1", []))
    assert store.snapshot_ids() == ["id-1", "id-2"]  # the unfinished one is not listed
    assert store.delete_unreferenced_segments() == 0  # the orphan is too young to be sure
    assert store.delete_unreferenced_segments(now_s=4_102_444_800) == 1
    assert store.exists(shared) and not store.exists(orphan)
    store.delete("id-2")
    with pytest.raises(NotFound, match="snapshot 'id-2' not found"):
        store.manifest("id-2")
    with pytest.raises(NotFound):
        store.delete("id-2")
    assert store.delete_unreferenced_segments(now_s=4_102_444_800) == 1 and not store.exists(shared)
    assert not list((tmp_path / "snaps").rglob("*.tmp"))


def test_object_store_locations_work_the_same() -> None:
    store = SnapshotStore("memory://danube-snapshot-test")
    store.write_manifest(manifest("id-9", []))
    assert store.snapshot_ids() == ["id-9"] and store.manifest("id-9").broker_id == 5
    with pytest.raises(InvalidArgument, match="cannot be used"):
        SnapshotStore("nosuchproto://x")

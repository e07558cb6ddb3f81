"""The local metadata catalog: LevelDB and in-memory implementations behave the same."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from danube_zmq.storage.catalog import (
    Catalog,
    CatalogCorruption,
    LevelDbCatalog,
    MemoryCatalog,
    SegmentCatalog,
    SegmentDescriptor,
    covers_range,
    cursor_key,
    segment_key,
    topic_key,
)
from danube_zmq.transport.errors import FailedPrecondition, InvalidArgument

TOPIC = "/default/events"


@pytest.fixture(params=["leveldb", "memory"])
def catalog(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Catalog]:
    cat: Catalog = LevelDbCatalog(tmp_path / "catalog") if request.param == "leveldb" else MemoryCatalog()
    yield cat
    cat.close()


def desc(base: int, end: int, topic: str = TOPIC) -> SegmentDescriptor:
    return SegmentDescriptor(
        topic=topic,
        base_offset=base,
        end_offset=end,
        record_count=end - base + 1,
        size_bytes=100 * (end - base + 1),
        crc32c=0xDEADBEEF,
        object_key=f"default/events/{base:020d}.seg",
        created_ms=1_700_000_000_000,
    )


def test_get_put_delete_roundtrip(catalog: Catalog) -> None:
    """A put value is read back, overwritten by the next put, and gone after delete."""
    assert catalog.get("/a") is None
    catalog.put("/a", b"1")
    assert catalog.get("/a") == b"1"
    catalog.put("/a", b"2", sync=False)
    assert catalog.get("/a") == b"2"
    catalog.delete("/a")
    assert catalog.get("/a") is None
    catalog.delete("/a")  # deleting a missing key is not an error


def test_scan_returns_prefix_matches_sorted_by_key(catalog: Catalog) -> None:
    """scan(prefix) lists exactly the keys under the prefix, in byte order, whatever the insert order."""
    for key in ["/t/b", "/t/a/2", "/u/x", "/t/a/10", "/t", "/s/z", "/t/é"]:
        catalog.put(key, key.encode())
    assert [k for k, _ in catalog.scan("/t/")] == ["/t/a/10", "/t/a/2", "/t/b", "/t/é"]
    assert catalog.scan("/t/a/") == [("/t/a/10", b"/t/a/10"), ("/t/a/2", b"/t/a/2")]
    assert catalog.scan("/nothing/") == []
    assert [k for k, _ in catalog.scan("")] == sorted(["/t/b", "/t/a/2", "/u/x", "/t/a/10", "/t", "/s/z", "/t/é"])


def test_write_applies_puts_and_deletes_together(catalog: Catalog) -> None:
    """A write batch puts and deletes in one step; a key both put and deleted ends deleted."""
    catalog.put("/old", b"x")
    catalog.write({"/new1": b"1", "/new2": b"2", "/both": b"b"}, ["/old", "/both"], sync=True)
    assert catalog.scan("/") == [("/new1", b"1"), ("/new2", b"2")]


def test_write_with_bad_argument_writes_nothing(catalog: Catalog) -> None:
    """An invalid entry anywhere in a batch rejects the whole batch before anything is written."""
    with pytest.raises(InvalidArgument):
        catalog.write({"/ok": b"1", "/bad": "not bytes"}, sync=True)  # type: ignore[dict-item]
    with pytest.raises(InvalidArgument):
        catalog.write({"/ok": b"1"}, [""], sync=False)
    assert catalog.scan("") == []


def test_closed_catalog_refuses_calls(catalog: Catalog) -> None:
    catalog.close()
    with pytest.raises(FailedPrecondition):
        catalog.get("/a")
    catalog.close()  # idempotent


def test_leveldb_reopen_keeps_synced_writes(tmp_path: Path) -> None:
    """Everything written (synced or not) before a clean close is there after reopening the directory."""
    path = tmp_path / "catalog"
    with LevelDbCatalog(path) as cat:
        cat.write({"/a": b"1", "/b": b"2"}, sync=True)
        cat.put("/c", b"3", sync=False)
        cat.delete("/b")
    with LevelDbCatalog(path) as cat:
        assert cat.scan("/") == [("/a", b"1"), ("/c", b"3")]


def test_leveldb_second_handle_on_same_directory_is_refused(tmp_path: Path) -> None:
    """LevelDB locks its directory: a second handle in the same process fails with a clear error."""
    with LevelDbCatalog(tmp_path / "catalog"):
        with pytest.raises(FailedPrecondition, match="one handle per directory"):
            LevelDbCatalog(tmp_path / "catalog")


def test_batch_failing_half_way_is_not_applied(catalog: Catalog) -> None:
    """If reading the batch's entries fails after the first one, nothing of it is written."""

    class Boom(Exception):
        pass

    def entries() -> Iterator[tuple[str, bytes]]:
        yield "/a", b"1"
        raise Boom

    class ExplodingMapping(dict):  # a Mapping whose items() fails after the first entry
        def items(self):  # type: ignore[override]
            return entries()

    with pytest.raises(Boom):
        catalog.write(ExplodingMapping(), sync=True)
    assert catalog.scan("") == []


def test_keys_follow_danube_layout() -> None:
    assert topic_key(TOPIC) == "/topics/default/events"
    assert cursor_key(TOPIC, "sub-1") == "/topics/default/events/subscriptions/sub-1/cursor"
    assert segment_key(TOPIC, 42) == "/storage/topics/default/events/segments/00000000000000000042"
    with pytest.raises(InvalidArgument):
        segment_key("default/events", 0)
    with pytest.raises(InvalidArgument):
        topic_key("/a/b/c")
    with pytest.raises(InvalidArgument):
        cursor_key(TOPIC, "../x")


def test_descriptor_roundtrips_through_msgpack() -> None:
    d = desc(1000, 1999)
    assert SegmentDescriptor.from_bytes(d.to_bytes()) == d


@pytest.mark.parametrize(
    "data", [b"", b"\xc1", b"\x93\x01\x02\x03", SegmentDescriptor.__name__.encode()]
)
def test_descriptor_garbage_is_catalog_corruption(data: bytes) -> None:
    with pytest.raises(CatalogCorruption):
        SegmentDescriptor.from_bytes(data)


@pytest.mark.parametrize(
    "change",
    [
        {"end_offset": 5},  # end before base
        {"record_count": 0},
        {"record_count": 2000},  # more records than offsets
        {"crc32c": 1 << 32},
        {"size_bytes": -1},
        {"topic": "events"},
        {"object_key": ""},
    ],
)
def test_descriptor_rejects_invalid_fields(change: dict[str, object]) -> None:
    fields = {
        "topic": TOPIC, "base_offset": 10, "end_offset": 19, "record_count": 10, "size_bytes": 1,
        "crc32c": 0, "object_key": "k", "created_ms": 0,
    } | change
    with pytest.raises(InvalidArgument):
        SegmentDescriptor(**fields)  # type: ignore[arg-type]


@pytest.fixture
def segments(catalog: Catalog) -> SegmentCatalog:
    return SegmentCatalog(catalog)


def test_segments_list_sorted_by_offset_not_insert_order(segments: SegmentCatalog) -> None:
    """Segments come back in offset order (20-digit keys), per topic, whatever the insert order."""
    for base, end in [(10_000_000_000, 10_000_000_009), (0, 9), (100, 199), (10, 99)]:
        asyncio.run(segments.add(desc(base, end)))
    asyncio.run(segments.add(desc(0, 4, topic="/default/other")))
    assert [s.base_offset for s in segments.list(TOPIC)] == [0, 10, 100, 10_000_000_000]
    assert [s.base_offset for s in segments.list("/default/other")] == [0]


def test_covering_finds_the_segment_holding_an_offset(segments: SegmentCatalog) -> None:
    """covering() answers the segment whose inclusive range holds the offset, None in gaps and beyond."""
    asyncio.run(segments.add(desc(0, 9)))
    asyncio.run(segments.add(desc(10, 19)))
    asyncio.run(segments.add(desc(30, 39)))  # gap 20..29
    assert segments.covering(TOPIC, 0) == desc(0, 9)
    assert segments.covering(TOPIC, 9) == desc(0, 9)
    assert segments.covering(TOPIC, 10) == desc(10, 19)
    assert segments.covering(TOPIC, 25) is None
    assert segments.covering(TOPIC, 39) == desc(30, 39)
    assert segments.covering(TOPIC, 40) is None
    assert segments.covering("/default/none", 0) is None


def test_durable_end_stops_at_the_first_gap(segments: SegmentCatalog) -> None:
    """durable_end is the end of the gap-free run from the first segment; filling the gap extends it."""
    assert segments.durable_end(TOPIC) is None
    asyncio.run(segments.add(desc(100, 199)))  # the first segment need not start at 0 (retention removed older ones)
    assert segments.durable_end(TOPIC) == 199
    asyncio.run(segments.add(desc(300, 399)))
    assert segments.durable_end(TOPIC) == 199
    asyncio.run(segments.add(desc(200, 299)))
    assert segments.durable_end(TOPIC) == 399
    asyncio.run(segments.remove(TOPIC, 100))
    assert segments.durable_end(TOPIC) == 399
    asyncio.run(segments.remove(TOPIC, 200))
    assert segments.durable_end(TOPIC) == 399  # only 300..399 left: it is the first
    asyncio.run(segments.remove(TOPIC, 300))
    assert segments.durable_end(TOPIC) is None


def test_add_replaces_same_base_and_rejects_overlap(segments: SegmentCatalog) -> None:
    """Re-adding a base offset replaces its descriptor (a re-upload); an overlapping range is refused."""
    asyncio.run(segments.add(desc(0, 9)))
    asyncio.run(segments.add(desc(20, 29)))
    replaced = SegmentDescriptor(**{**_fields(desc(0, 9)), "crc32c": 7})
    asyncio.run(segments.add(replaced))
    assert segments.get(TOPIC, 0) == replaced
    for bad in [desc(5, 14), desc(10, 20), desc(15, 35), desc(0, 20)]:
        with pytest.raises(FailedPrecondition, match="overlaps"):
            asyncio.run(segments.add(bad))
    asyncio.run(segments.add(desc(10, 19)))
    assert segments.durable_end(TOPIC) == 29


def _fields(d: SegmentDescriptor) -> dict[str, object]:
    return {name: getattr(d, name) for name in SegmentDescriptor.__slots__}


def test_catalogs_agree_on_a_random_workload(tmp_path: Path) -> None:
    """The same seeded sequence of puts, deletes, batches and scans gives the same answers on both."""
    import random

    rng = random.Random(1234)
    level = LevelDbCatalog(tmp_path / "cat")
    memory = MemoryCatalog()
    keys = [f"/k/{rng.choice('abc')}/{i}" for i in range(40)]
    ops: list[Callable[[Catalog], object]] = []
    for _ in range(300):
        key = rng.choice(keys)
        r = rng.random()
        if r < 0.4:
            value = rng.randbytes(rng.randint(0, 20))
            ops.append(lambda c, k=key, v=value: c.put(k, v))
        elif r < 0.6:
            ops.append(lambda c, k=key: c.delete(k))
        elif r < 0.8:
            puts = {rng.choice(keys): rng.randbytes(3) for _ in range(3)}
            dels = [rng.choice(keys)]
            ops.append(lambda c, p=puts, d=dels: c.write(p, d, sync=False))
        else:
            prefix = rng.choice(["/k/", "/k/a/", "/k/b/1", ""])
            ops.append(lambda c, p=prefix: c.scan(p))
    for op in ops:
        assert op(level) == op(memory)
    assert level.scan("") == memory.scan("")
    level.close()


@given(st.lists(st.tuples(st.integers(0, 40), st.integers(0, 6)), max_size=8), st.integers(0, 60),
       st.integers(0, 60))
def test_covers_range_is_true_exactly_when_every_offset_is_in_a_segment(
        spans: list[tuple[int, int]], start: int, end: int) -> None:
    """A damaged WAL's range is served from durable segments only if each of its offsets
    is in one: compared with the set of offsets the (non-overlapping) segments hold, on
    random layouts with holes, and through SegmentCatalog on the last one."""
    chosen: list[SegmentDescriptor] = []
    for base, length in sorted(spans):
        if not chosen or base > chosen[-1].end_offset:
            chosen.append(desc(base, base + length))
    held = {offset for d in chosen for offset in range(d.base_offset, d.end_offset + 1)}
    assert covers_range(chosen, start, end) == all(offset in held for offset in range(start, end))


def test_covers_range_sees_a_hole_that_durable_end_of_the_last_segment_hides(segments: SegmentCatalog) -> None:
    """An upload that failed between two that succeeded leaves a hole: the range is not
    covered, although the last segment ends past it."""
    for base, end in [(0, 9), (20, 29)]:
        asyncio.run(segments.add(desc(base, end)))
    assert segments.covers_range(TOPIC, 0, 10) and segments.covers_range(TOPIC, 20, 30)
    assert not segments.covers_range(TOPIC, 0, 30) and not segments.covers_range(TOPIC, 5, 21)
    assert segments.covers_range(TOPIC, 7, 7)

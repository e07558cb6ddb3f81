"""Segment descriptors (`SegmentCatalog`) and the key-value catalogs they can live in.

On a broker the descriptors live in the Raft metadata store (through
`consensus/metadata_catalog.py`, a `DescriptorStore`). `LevelDbCatalog` is the local
LevelDB catalog a broker kept before the registry moved to the metadata store (it is
imported once, then set aside); `MemoryCatalog` serves unit tests.

Key layout (mirrors Danube's metadata keys; topic names are `/ns/topic`, already
validated, so every part is `[A-Za-z0-9_-]+` and safe in a key):

    /topics/{ns}/{topic}                                   -> topic record
    /topics/{ns}/{topic}/subscriptions/{sub}/cursor        -> cursor state
    /storage/topics/{ns}/{topic}/segments/{base_offset:020d} -> SegmentDescriptor

Base offsets are zero-padded to 20 digits (u64 max has 20), so key order is offset
order and a prefix scan lists a topic's segments sorted. Keys are UTF-8; LevelDB
compares bytes and UTF-8 byte order equals code point order, so `scan` sorts the same
way as Python's `sorted` on the strings (what `MemoryCatalog` does).

Implementations:
- `LevelDbCatalog(path)`: plyvel. LevelDB locks its directory: exactly **one handle per
  directory per process** (a second `plyvel.DB` on the same path, in this process or
  another, fails with "lock ... already held"). The broker owns it; the CLI and Spark
  never open a live catalog.
- `MemoryCatalog`: a dict, for unit tests of callers.
"""

from __future__ import annotations

import bisect
import itertools
import re
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import msgpack
import plyvel

from danube_zmq.transport.errors import FailedPrecondition, InternalError, InvalidArgument

__all__ = [
    "Catalog",
    "CatalogCorruption",
    "DescriptorStore",
    "LevelDbCatalog",
    "MemoryCatalog",
    "SegmentCatalog",
    "SegmentDescriptor",
    "check_offset",
    "cursor_key",
    "segment_key",
    "segments_prefix",
    "split_topic",
    "topic_key",
]

# u64 max is 18446744073709551615: 20 digits.
OFFSET_DIGITS = 20
OFFSET_MAX = (1 << 64) - 1
_CRC32C_MAX = (1 << 32) - 1

_PART = re.compile(r"[A-Za-z0-9_-]+")


class CatalogCorruption(InternalError):
    """A value in the catalog does not decode: the store is damaged or was written by a bug."""


class Catalog(Protocol):
    """Key-value metadata store. Keys are str (UTF-8), values bytes."""

    def get(self, key: str) -> bytes | None: ...

    def put(self, key: str, value: bytes, *, sync: bool = True) -> None: ...

    def delete(self, key: str, *, sync: bool = True) -> None: ...

    def scan(self, prefix: str) -> list[tuple[str, bytes]]:
        """Every (key, value) whose key starts with `prefix`, sorted by key."""
        ...

    def write(self, puts: Mapping[str, bytes], deletes: Iterable[str] = (), *, sync: bool) -> None:
        """Apply all puts and deletes atomically (all or none). A key both put and deleted ends up deleted."""
        ...

    def close(self) -> None: ...


class DescriptorStore(Protocol):
    """What `SegmentCatalog` needs: reads now, durable writes it waits for. Both local
    catalogs have it; so has the broker's view of the Raft metadata store."""

    def get(self, key: str) -> bytes | None: ...

    def scan(self, prefix: str) -> list[tuple[str, bytes]]: ...

    async def put_async(self, key: str, value: bytes) -> None: ...

    async def delete_async(self, key: str) -> None: ...


# ----------------------------------------------------------------------------- keys


def split_topic(topic: str) -> tuple[str, str]:
    """Split `/ns/topic` into its two parts; reject anything that would not be a safe key segment."""
    parts = topic.split("/") if isinstance(topic, str) else []
    if len(parts) != 3 or parts[0] != "" or not all(_PART.fullmatch(p) for p in parts[1:]):
        raise InvalidArgument(f"invalid topic name {topic!r}: expected /namespace/topic")
    return parts[1], parts[2]


def check_offset(name: str, offset: int) -> int:
    if not isinstance(offset, int) or isinstance(offset, bool) or not 0 <= offset <= OFFSET_MAX:
        raise InvalidArgument(f"{name} must be an integer in 0..2**64-1, got {offset!r}")
    return offset


def topic_key(topic: str) -> str:
    ns, name = split_topic(topic)
    return f"/topics/{ns}/{name}"


def cursor_key(topic: str, subscription: str) -> str:
    if not isinstance(subscription, str) or _PART.fullmatch(subscription) is None:
        raise InvalidArgument(f"invalid subscription name {subscription!r}")
    return f"{topic_key(topic)}/subscriptions/{subscription}/cursor"


def segments_prefix(topic: str) -> str:
    ns, name = split_topic(topic)
    return f"/storage/topics/{ns}/{name}/segments/"


def segment_key(topic: str, base_offset: int) -> str:
    check_offset("base_offset", base_offset)
    return f"{segments_prefix(topic)}{base_offset:0{OFFSET_DIGITS}d}"


def _encode_key(key: str) -> bytes:
    if not isinstance(key, str) or not key:
        raise InvalidArgument(f"catalog key must be a non-empty str, got {key!r}")
    return key.encode("utf-8")


def _check_value(key: str, value: bytes) -> bytes:
    if not isinstance(value, bytes | bytearray | memoryview):
        raise InvalidArgument(f"catalog value for {key!r} must be bytes, got {type(value).__name__}")
    return bytes(value)


# ----------------------------------------------------------------------------- LevelDB


class LevelDbCatalog:
    """The catalog in a LevelDB directory (plyvel). One handle per directory per process.

    `sync=True` makes LevelDB fsync its log before returning (about 1.7k single syncs/s on
    this machine, far more records per second when batched): use it for anything a later
    decision relies on (segment descriptors). Cursors may use `sync=False` plus a
    periodic synced batch.
    """

    def __init__(self, path: str | Path) -> None:
        self._path = Path(path)
        self._path.mkdir(parents=True, exist_ok=True)
        try:
            # paranoid_checks: a corrupt table is an error at open, not silently skipped data.
            self._db: plyvel.DB | None = plyvel.DB(
                str(self._path), create_if_missing=True, paranoid_checks=True
            )
        except plyvel.IOError as exc:
            raise FailedPrecondition(
                f"cannot open catalog {self._path}: {exc} (one handle per directory per process)"
            ) from exc

    @property
    def path(self) -> Path:
        return self._path

    def _live(self) -> plyvel.DB:
        if self._db is None:
            raise FailedPrecondition(f"catalog {self._path} is closed")
        return self._db

    def get(self, key: str) -> bytes | None:
        return self._live().get(_encode_key(key))

    def put(self, key: str, value: bytes, *, sync: bool = True) -> None:
        self._live().put(_encode_key(key), _check_value(key, value), sync=sync)

    def delete(self, key: str, *, sync: bool = True) -> None:
        self._live().delete(_encode_key(key), sync=sync)

    def scan(self, prefix: str) -> list[tuple[str, bytes]]:
        db = self._live()
        raw_prefix = prefix.encode("utf-8")
        # An empty prefix means "everything"; plyvel wants None for that.
        with db.iterator(prefix=raw_prefix or None) as it:
            return [(k.decode("utf-8"), v) for k, v in it]

    def write(self, puts: Mapping[str, bytes], deletes: Iterable[str] = (), *, sync: bool) -> None:
        db = self._live()
        # Validate everything before touching the batch, so a bad argument writes nothing.
        put_items = [(_encode_key(k), _check_value(k, v)) for k, v in puts.items()]
        delete_keys = [_encode_key(k) for k in deletes]
        # transaction=True: if building the batch raises, nothing is written.
        with db.write_batch(sync=sync, transaction=True) as batch:
            for k, v in put_items:
                batch.put(k, v)
            for k in delete_keys:
                batch.delete(k)

    async def put_async(self, key: str, value: bytes) -> None:
        self.put(key, value, sync=True)

    async def delete_async(self, key: str) -> None:
        self.delete(key, sync=True)

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None

    def __enter__(self) -> LevelDbCatalog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ----------------------------------------------------------------------------- memory


class MemoryCatalog:
    """The catalog in a dict, for tests. Same semantics as LevelDbCatalog; `sync` is ignored."""

    def __init__(self) -> None:
        self._data: dict[str, bytes] | None = {}
        # Callers may use it from worker threads as they would plyvel (which is thread-safe).
        self._lock = threading.Lock()

    def _live(self) -> dict[str, bytes]:
        if self._data is None:
            raise FailedPrecondition("catalog is closed")
        return self._data

    def get(self, key: str) -> bytes | None:
        _encode_key(key)
        with self._lock:
            return self._live().get(key)

    def put(self, key: str, value: bytes, *, sync: bool = True) -> None:
        self.write({key: value}, sync=sync)

    def delete(self, key: str, *, sync: bool = True) -> None:
        self.write({}, (key,), sync=sync)

    def scan(self, prefix: str) -> list[tuple[str, bytes]]:
        with self._lock:
            return sorted((k, v) for k, v in self._live().items() if k.startswith(prefix))

    def write(self, puts: Mapping[str, bytes], deletes: Iterable[str] = (), *, sync: bool) -> None:
        # Validate everything first, as LevelDbCatalog does, so a bad argument writes nothing.
        put_items = [(k, _check_value(k, v)) for k, v in puts.items()]
        delete_keys = list(deletes)
        for k in [k for k, _ in put_items] + delete_keys:
            _encode_key(k)
        with self._lock:
            data = self._live()
            for k, v in put_items:
                data[k] = v
            for k in delete_keys:
                data.pop(k, None)

    async def put_async(self, key: str, value: bytes) -> None:
        self.put(key, value, sync=True)

    async def delete_async(self, key: str) -> None:
        self.delete(key, sync=True)

    def close(self) -> None:
        with self._lock:
            self._data = None


# ----------------------------------------------------------------------------- segments

_DESCRIPTOR_VERSION = 1


@dataclass(frozen=True, slots=True, kw_only=True)
class SegmentDescriptor:
    """One sealed segment in the durable store.

    `end_offset` is inclusive. `crc32c` covers the whole object, `size_bytes` is its length.
    `object_key` is relative to the durable store's URL (`{ns}/{topic}/{base:020d}.seg`), so
    moving the store's prefix does not rewrite the catalog.
    """

    topic: str
    base_offset: int
    end_offset: int
    record_count: int
    size_bytes: int
    crc32c: int
    object_key: str
    created_ms: int

    def __post_init__(self) -> None:
        split_topic(self.topic)
        check_offset("base_offset", self.base_offset)
        check_offset("end_offset", self.end_offset)
        if self.end_offset < self.base_offset:
            raise InvalidArgument(
                f"segment {self.topic}@{self.base_offset}: end_offset {self.end_offset} < base_offset"
            )
        span = self.end_offset - self.base_offset + 1
        for name in ("record_count", "size_bytes", "created_ms"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise InvalidArgument(f"segment {self.topic}@{self.base_offset}: {name} must be an int >= 0")
        if not 1 <= self.record_count <= span:
            raise InvalidArgument(
                f"segment {self.topic}@{self.base_offset}: record_count {self.record_count} not in 1..{span}"
            )
        if not isinstance(self.crc32c, int) or not 0 <= self.crc32c <= _CRC32C_MAX:
            raise InvalidArgument(f"segment {self.topic}@{self.base_offset}: crc32c must be a u32")
        if not isinstance(self.object_key, str) or not self.object_key:
            raise InvalidArgument(f"segment {self.topic}@{self.base_offset}: object_key must be a non-empty str")

    def covers(self, offset: int) -> bool:
        return self.base_offset <= offset <= self.end_offset

    def to_bytes(self) -> bytes:
        # A versioned array, not a map: compact, and the field order is the schema.
        return msgpack.packb(
            [
                _DESCRIPTOR_VERSION,
                self.topic,
                self.base_offset,
                self.end_offset,
                self.record_count,
                self.size_bytes,
                self.crc32c,
                self.object_key,
                self.created_ms,
            ],
            use_bin_type=True,
        )

    @classmethod
    def from_bytes(cls, data: bytes) -> SegmentDescriptor:
        try:
            fields: Any = msgpack.unpackb(data, raw=False, use_list=True, strict_map_key=True)
        except Exception as exc:  # msgpack raises several unrelated types on garbage
            raise CatalogCorruption(f"segment descriptor does not decode: {exc}") from exc
        if not isinstance(fields, list) or len(fields) != 9 or fields[0] != _DESCRIPTOR_VERSION:
            raise CatalogCorruption(f"segment descriptor has an unknown shape: {fields!r:.200}")
        _, topic, base, end, count, size, crc, key, created = fields
        try:
            return cls(
                topic=topic,
                base_offset=base,
                end_offset=end,
                record_count=count,
                size_bytes=size,
                crc32c=crc,
                object_key=key,
                created_ms=created,
            )
        except InvalidArgument as exc:
            raise CatalogCorruption(f"segment descriptor is invalid: {exc}") from exc


class SegmentCatalog:
    """Typed access to the segment descriptors of every topic in a `Catalog`.

    Invariant kept by `add`: a topic's segments never overlap. They may have gaps
    (a segment whose upload has not finished yet); `durable_end` stops at the first gap.
    """

    def __init__(self, catalog: DescriptorStore) -> None:
        self._catalog = catalog

    async def add(self, desc: SegmentDescriptor) -> None:
        """Record `desc` (durably). Replaces a descriptor with the same base offset
        (a re-upload); raises FailedPrecondition if it would overlap another segment."""
        segments = self.list(desc.topic)
        bases = [s.base_offset for s in segments]
        i = bisect.bisect_left(bases, desc.base_offset)
        before = segments[i - 1] if i > 0 else None
        after_index = i + 1 if i < len(segments) and bases[i] == desc.base_offset else i
        after = segments[after_index] if after_index < len(segments) else None
        if before is not None and before.end_offset >= desc.base_offset:
            raise FailedPrecondition(
                f"segment {desc.topic}@{desc.base_offset}..{desc.end_offset} overlaps "
                f"{before.base_offset}..{before.end_offset}"
            )
        if after is not None and after.base_offset <= desc.end_offset:
            raise FailedPrecondition(
                f"segment {desc.topic}@{desc.base_offset}..{desc.end_offset} overlaps "
                f"{after.base_offset}..{after.end_offset}"
            )
        await self._catalog.put_async(segment_key(desc.topic, desc.base_offset), desc.to_bytes())

    def get(self, topic: str, base_offset: int) -> SegmentDescriptor | None:
        raw = self._catalog.get(segment_key(topic, base_offset))
        return None if raw is None else SegmentDescriptor.from_bytes(raw)

    def list(self, topic: str) -> list[SegmentDescriptor]:
        """The topic's segments, sorted by base offset (the key order)."""
        out = [SegmentDescriptor.from_bytes(v) for _, v in self._catalog.scan(segments_prefix(topic))]
        for prev, cur in itertools.pairwise(out):
            assert prev.end_offset < cur.base_offset, f"overlapping segments in catalog: {prev} {cur}"
        return out

    def covering(self, topic: str, offset: int) -> SegmentDescriptor | None:
        """The segment whose range contains `offset`, or None."""
        check_offset("offset", offset)
        segments = self.list(topic)
        i = bisect.bisect_right([s.base_offset for s in segments], offset) - 1
        if i >= 0 and segments[i].covers(offset):
            return segments[i]
        return None

    async def remove(self, topic: str, base_offset: int) -> None:
        await self._catalog.delete_async(segment_key(topic, base_offset))

    def covers_range(self, topic: str, start_offset: int, end_offset: int) -> bool:
        """Whether the topic's segments hold every offset of `start_offset..end_offset - 1`."""
        return covers_range(self.list(topic), start_offset, end_offset)

    def durable_end(self, topic: str) -> int | None:
        """The highest end_offset reachable from the first segment without a gap; None if none."""
        segments = self.list(topic)
        if not segments:
            return None
        end = segments[0].end_offset
        for seg in segments[1:]:
            if seg.base_offset != end + 1:
                break
            end = seg.end_offset
        return end


def covers_range(segments: Sequence[SegmentDescriptor], start_offset: int, end_offset: int) -> bool:
    """Whether `segments` (sorted, not overlapping) hold every offset of
    `start_offset..end_offset - 1` without a hole: a range a damaged WAL held may be
    served from the durable store instead only then (a segment whose upload failed
    leaves a hole that a later segment's end would hide)."""
    offset = start_offset
    for seg in segments:
        if offset >= end_offset:
            break
        if seg.end_offset < offset:
            continue
        if seg.base_offset > offset:
            return False
        offset = seg.end_offset + 1
    return offset >= end_offset

"""DurableStore and Uploader against a local directory, memory://, and real emulators of
S3 (moto), GCS (gcp-storage-emulator) and Azure Blob (Azurite), started by tests/emulators.py."""

from __future__ import annotations

import asyncio
import os
import random
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import crc32c
import pytest
from fsspec.callbacks import Callback

from danube_zmq.storage.catalog import MemoryCatalog, SegmentCatalog
from danube_zmq.storage.durable import (
    DurableCorruption,
    DurableStore,
    SealedSegment,
    Uploader,
    UploaderConfig,
    compacted_key,
    cursors_key,
)
from danube_zmq.transport.errors import InvalidArgument, NotFound, ResourceExhausted

TOPIC = "/default/events"
MIB = 1 << 20
PART_BYTES = 5 * MIB  # the smallest part s3 allows: a 12 MiB file becomes a real multipart upload
BACKENDS = ["local", "memory", "s3", "gs", "az"]
EMULATOR_FIXTURE = {"s3": "moto_store", "gs": "gcs_store", "az": "azurite_store"}


def make_file(path: Path, size: int, seed: int) -> bytes:
    data = random.Random(seed).randbytes(size)
    path.write_bytes(data)
    return data


def open_store(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> DurableStore:
    # A fresh prefix per test: the emulators (and memory://) live for the whole session.
    unique = uuid.uuid4().hex[:12]
    if backend == "local":
        return DurableStore(f"file://{tmp_path}/durable", upload_part_bytes=PART_BYTES)
    if backend == "memory":
        return DurableStore(f"memory://danube-test-{unique}")
    url, options = request.getfixturevalue(EMULATOR_FIXTURE[backend])
    return DurableStore(f"{url}/{unique}", storage_options=options, upload_part_bytes=PART_BYTES)


@pytest.fixture(params=BACKENDS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[DurableStore]:
    durable = open_store(request.param, request, tmp_path)
    yield durable
    if durable.kind != "filesystem":
        # memory:// lives in a process-wide dict; the emulators for the whole session.
        root = durable.path_of("x")[: -len("/x")]
        if durable.fs.exists(root):
            durable.fs.rm(root, recursive=True)


class FailAt(Callback):
    """A progress callback that raises on the first report short of the whole file."""

    def __init__(self) -> None:
        super().__init__()
        self.raised = False

    def call(self, *args: object, **kwargs: object) -> None:
        if self.size and 0 < self.value < self.size:
            self.raised = True
            raise ConnectionResetError(f"injected: connection lost after {self.value} of {self.size} bytes")


def test_publish_then_fetch_roundtrips_a_multi_mib_segment(store: DurableStore, tmp_path: Path) -> None:
    """A 12 MiB segment is published under its segment key and fetched back bit for bit, size and crc checked."""
    data = make_file(tmp_path / "seg.wal", 12 * MIB, seed=1)
    key = store.segment_key(TOPIC, 1_000)
    assert key == "default/events/00000000000000001000.seg"
    assert not store.exists(key)
    size, crc = store.publish(tmp_path / "seg.wal", key)
    assert (size, crc) == (len(data), crc32c.crc32c(data))
    assert store.exists(key)
    assert store.size(key) == size
    dest = tmp_path / "fetched" / "seg.wal"
    assert store.fetch(key, dest, size_bytes=size, crc32c=crc) == (size, crc)
    assert dest.read_bytes() == data
    assert [p.name for p in dest.parent.iterdir()] == ["seg.wal"]  # no temp file left


def test_publish_interrupted_half_way_leaves_no_final_key(
    store: DurableStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An upload that dies after part of the bytes (the progress callback raises) leaves nothing under
    the key: local and memory write a temp file / build the bytes first, s3 aborts its multipart upload,
    gs abandons its resumable session. Azure sends a file this size as one Put Blob request, so it never
    reports partial progress: there the publish simply completes whole."""
    data = make_file(tmp_path / "seg.wal", 12 * MIB, seed=2)
    key = store.segment_key(TOPIC, 0)
    progress = FailAt()
    if store.protocol == "abfs":
        assert store.publish(tmp_path / "seg.wal", key, progress=progress) == (len(data), crc32c.crc32c(data))
        assert not progress.raised
        return
    if store.protocol == "gs":
        # gcp-storage-emulator answers 501 to cancelling a resumable upload (real GCS: 499), and
        # gcsfs retries a 5xx six times with backoff (~30 s). Skip just that cancel request; the
        # session is never finalized either way, so no object can appear.
        real_call = store.fs._call

        async def call_without_session_cancel(method: str, path: str, *args: object, **kwargs: object) -> object:
            if method == "DELETE" and "upload_id=" in path:
                return None
            return await real_call(method, path, *args, **kwargs)

        monkeypatch.setattr(store.fs, "_call", call_without_session_cancel)
    with pytest.raises(ConnectionResetError, match="injected"):
        store.publish(tmp_path / "seg.wal", key, progress=progress)
    monkeypatch.undo()
    assert progress.raised
    assert not store.exists(key)
    with pytest.raises(NotFound, match=key):
        store.fetch(key, tmp_path / "out.wal")
    if store.kind == "filesystem":
        directory = Path(store.path_of(key)).parent
        assert list(directory.iterdir()) == []  # the temp file is gone too


def test_local_publish_failing_fsync_leaves_no_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A disk error at fsync (after all bytes are written to the temp file) leaves neither the key nor a temp file."""
    store = DurableStore(str(tmp_path / "durable"))  # a plain path works like file://
    make_file(tmp_path / "seg.wal", 3 * MIB, seed=3)
    key = store.segment_key(TOPIC, 0)
    real_fsync = os.fsync

    def failing_fsync(fd: int) -> None:
        if os.path.isdir(f"/proc/self/fd/{fd}"):
            return real_fsync(fd)
        raise OSError(5, "injected EIO")

    monkeypatch.setattr(os, "fsync", failing_fsync)
    with pytest.raises(OSError, match="injected EIO"):
        store.publish(tmp_path / "seg.wal", key)
    monkeypatch.undo()
    assert not store.exists(key)
    assert list(Path(store.path_of(key)).parent.iterdir()) == []


def test_concurrent_reader_never_sees_a_partial_object(store: DurableStore, tmp_path: Path) -> None:
    """While a 12 MiB publish runs, another thread polling the key sees either nothing or the whole object."""
    make_file(tmp_path / "seg.wal", 12 * MIB, seed=4)
    key = store.segment_key(TOPIC, 77)
    seen: list[int | None] = []
    done = threading.Event()

    def publish() -> None:
        try:
            store.publish(tmp_path / "seg.wal", key)
        finally:
            done.set()

    writer = threading.Thread(target=publish)
    writer.start()
    while not done.is_set():
        try:
            seen.append(store.size(key))
        except NotFound:
            seen.append(None)
        time.sleep(0.002)
    writer.join()
    seen.append(store.size(key))
    assert set(seen) <= {None, 12 * MIB}, f"saw partial sizes {sorted({s for s in seen if s})}"
    assert seen[-1] == 12 * MIB


def test_fetch_detects_corruption_and_truncation(store: DurableStore, tmp_path: Path) -> None:
    """A flipped byte (crc) or a short / long object (size) is DurableCorruption naming the key; dest is untouched."""
    data = make_file(tmp_path / "seg.wal", 256 * 1024, seed=5)
    key = store.segment_key(TOPIC, 5)
    size, crc = store.publish(tmp_path / "seg.wal", key)
    dest = tmp_path / "out" / "seg.wal"
    path = store.path_of(key)

    flipped = bytearray(data)
    flipped[len(data) // 2] ^= 0x01
    for bad in (bytes(flipped), data[:-1], data + b"x"):
        store.fs.pipe_file(path, bad)
        with pytest.raises(DurableCorruption, match=key):
            store.fetch(key, dest, size_bytes=size, crc32c=crc)
        assert not dest.exists()
        assert list(dest.parent.iterdir()) == []

    store.fs.pipe_file(path, data)
    store.fetch(key, dest, size_bytes=size, crc32c=crc)
    assert dest.read_bytes() == data


def test_delete_removes_the_object_and_is_idempotent(store: DurableStore, tmp_path: Path) -> None:
    make_file(tmp_path / "seg.wal", 4096, seed=6)
    key = store.segment_key(TOPIC, 9)
    store.publish(tmp_path / "seg.wal", key)
    assert store.exists(key)
    store.delete(key)
    assert not store.exists(key)
    store.delete(key)
    with pytest.raises(NotFound):
        store.fetch(key, tmp_path / "out.wal")


def test_checkpoint_only_segments_are_listed_by_base_offset(store: DurableStore, tmp_path: Path) -> None:
    """A topic's checkpoints-only segments (`cursors_key`) are found by listing, in offset
    order, in every backend: its sealed segments, another topic's objects and nothing at
    all (a topic never published) are not listed; a deleted one is gone from the list."""
    source = tmp_path / "tail"
    make_file(source, 100, seed=3)
    assert store.cursor_bases(TOPIC) == []
    for base in (1200, 7, 30):
        store.publish(source, cursors_key(TOPIC, base))
    store.publish(source, store.segment_key(TOPIC, 0))
    store.publish(source, cursors_key("/default/other", 5))
    assert store.cursor_bases(TOPIC) == [7, 30, 1200]
    store.delete(cursors_key(TOPIC, 30))
    assert store.cursor_bases(TOPIC) == [7, 1200]


def test_compacted_ledgers_are_listed_by_horizon(store: DurableStore, tmp_path: Path) -> None:
    """A topic's compacted ledgers (`compacted_key`) are listed by horizon, ascending,
    apart from its segments, its checkpoints-only segments and other topics' ledgers;
    a deleted one is gone from the list, and one fetched back has the same bytes."""
    source = tmp_path / "ledger"
    data = make_file(source, 300, seed=4)
    assert store.compacted_horizons(TOPIC) == []
    for horizon in (900, 33):
        store.publish(source, compacted_key(TOPIC, horizon))
    store.publish(source, cursors_key(TOPIC, 40))
    store.publish(source, store.segment_key(TOPIC, 0))
    store.publish(source, compacted_key("/default/other", 5))
    assert store.compacted_horizons(TOPIC) == [33, 900]
    assert store.cursor_bases(TOPIC) == [40]
    store.delete(compacted_key(TOPIC, 33))
    assert store.compacted_horizons(TOPIC) == [900]
    store.fetch(compacted_key(TOPIC, 900), tmp_path / "back")
    assert (tmp_path / "back").read_bytes() == data


def test_keys_are_checked(tmp_path: Path) -> None:
    store = DurableStore(str(tmp_path))
    for bad in ["", "/abs", "a/../b", "a//b", "a/b.tmp-1"]:
        with pytest.raises(InvalidArgument, match=r"invalid durable key|non-empty"):
            store.path_of(bad)


# ----------------------------------------------------------------------------- Uploader


class FlakyStore:
    """Wraps a DurableStore: the first `failures` publishes of each key fail half-way (after the real
    upload was interrupted); records the highest number of publishes running at once."""

    def __init__(self, inner: DurableStore, segments: SegmentCatalog, failures: int, hold_s: float = 0.05) -> None:
        self.inner = inner
        self.segments = segments
        self.failures = failures
        self.hold_s = hold_s
        self.calls: dict[str, int] = {}
        self.running = 0
        self.running_max = 0
        self.descriptor_seen_during_publish = False
        self._lock = threading.Lock()

    def segment_key(self, topic: str, base_offset: int) -> str:
        return self.inner.segment_key(topic, base_offset)

    def publish(self, local_path: Path, key: str) -> tuple[int, int]:
        with self._lock:
            self.calls[key] = self.calls.get(key, 0) + 1
            attempt = self.calls[key]
            self.running += 1
            self.running_max = max(self.running_max, self.running)
        try:
            base = int(key.rsplit("/", 1)[1].split(".")[0])
            if self.segments.get(TOPIC, base) is not None:
                self.descriptor_seen_during_publish = True
            time.sleep(self.hold_s)  # keep uploads overlapping so the concurrency bound is exercised
            if attempt <= self.failures:
                raise ConnectionResetError(f"injected failure {attempt} for {key}")
            return self.inner.publish(local_path, key)
        finally:
            with self._lock:
                self.running -= 1


def sealed(tmp_path: Path, index: int, size: int = 64 * 1024) -> tuple[SealedSegment, bytes]:
    base = index * 100
    path = tmp_path / "wal" / f"{base:020d}.wal"
    path.parent.mkdir(exist_ok=True)
    data = make_file(path, size, seed=100 + index)
    return SealedSegment(topic=TOPIC, base_offset=base, end_offset=base + 99, record_count=100, local_path=path), data


async def test_uploader_retries_flaky_store_and_records_descriptor_after_success(
    store: DurableStore, tmp_path: Path
) -> None:
    """Six segments, a store failing each twice, at most two uploads at once: every segment is retried,
    its descriptor is recorded only after the object is complete, and the descriptors fetch back clean."""
    segments = SegmentCatalog(MemoryCatalog())
    flaky = FlakyStore(store, segments, failures=2)
    config = UploaderConfig(uploads_max=2, pending_uploads_max=8, attempts_max=4, backoff_ms_base=20)
    files = [sealed(tmp_path, i) for i in range(6)]
    async with Uploader(flaky, segments, config) as uploader:
        for segment, _ in files:
            uploader.submit(segment)
        assert uploader.statistics().pending == 6
        await uploader.wait_idle()
        stats = uploader.statistics()
    assert flaky.running_max == 2
    assert not flaky.descriptor_seen_during_publish
    assert set(flaky.calls.values()) == {3}
    assert (stats.uploaded_segments, stats.failed_attempts, stats.failures, stats.pending) == (6, 12, (), 0)
    listed = segments.list(TOPIC)
    assert [d.base_offset for d in listed] == [i * 100 for i in range(6)]
    assert segments.durable_end(TOPIC) == 599
    for desc, (_, data) in zip(listed, files, strict=True):
        assert (desc.size_bytes, desc.crc32c, desc.record_count) == (len(data), crc32c.crc32c(data), 100)
        dest = tmp_path / "fetched" / f"{desc.base_offset}.wal"
        await asyncio.to_thread(store.fetch_segment, desc, dest)
        assert dest.read_bytes() == data


async def test_uploader_backs_off_exponentially(tmp_path: Path) -> None:
    """Retry delays are 200 ms, 400 ms, ... capped at backoff_ms_max (sleep is injected and recorded)."""
    delays: list[float] = []

    async def fake_sleep(seconds: float) -> None:
        delays.append(seconds)

    segments = SegmentCatalog(MemoryCatalog())
    flaky = FlakyStore(DurableStore(f"memory://danube-test-{uuid.uuid4().hex}"), segments, failures=5, hold_s=0)
    config = UploaderConfig(attempts_max=6, backoff_ms_base=200, backoff_ms_max=1000)
    async with Uploader(flaky, segments, config, sleep=fake_sleep) as uploader:
        uploader.submit(sealed(tmp_path, 0)[0])
        await uploader.wait_idle()
    assert delays == [0.2, 0.4, 0.8, 1.0, 1.0]
    assert segments.durable_end(TOPIC) == 99


async def test_uploader_gives_up_then_retries_on_resubmit(tmp_path: Path) -> None:
    """After attempts_max failures the error is kept in statistics and no descriptor is written;
    submitting the same segment again retries it and clears the failure."""
    segments = SegmentCatalog(MemoryCatalog())
    flaky = FlakyStore(DurableStore(f"memory://danube-test-{uuid.uuid4().hex}"), segments, failures=3, hold_s=0)
    config = UploaderConfig(attempts_max=3, backoff_ms_base=1)
    segment, _ = sealed(tmp_path, 0)
    async with Uploader(flaky, segments, config) as uploader:
        uploader.submit(segment)
        await uploader.wait_idle()
        failures = uploader.statistics().failures
        assert len(failures) == 1
        assert (failures[0].base_offset, failures[0].attempts) == (0, 3)
        assert "injected failure 3" in failures[0].error
        assert segments.list(TOPIC) == []
        uploader.submit(segment)
        await uploader.wait_idle()
        assert uploader.statistics().failures == ()
    assert segments.durable_end(TOPIC) == 99


async def test_uploader_rejects_submits_beyond_pending_uploads_max(tmp_path: Path) -> None:
    """With pending_uploads_max pending, submit raises ResourceExhausted; re-submitting a pending segment is a no-op."""
    release = threading.Event()

    class BlockingStore(FlakyStore):
        def publish(self, local_path: Path, key: str) -> tuple[int, int]:
            release.wait(10)
            return super().publish(local_path, key)

    segments = SegmentCatalog(MemoryCatalog())
    blocking = BlockingStore(DurableStore(f"memory://danube-test-{uuid.uuid4().hex}"), segments, failures=0, hold_s=0)
    config = UploaderConfig(uploads_max=1, pending_uploads_max=2)
    async with Uploader(blocking, segments, config) as uploader:
        first, second, third = (sealed(tmp_path, i)[0] for i in range(3))
        uploader.submit(first)
        uploader.submit(second)
        uploader.submit(first)  # already pending: ignored
        with pytest.raises(ResourceExhausted, match="pending_uploads_max"):
            uploader.submit(third)
        await asyncio.sleep(0.05)
        assert (uploader.statistics().pending, uploader.statistics().in_flight) == (2, 1)
        release.set()
        await uploader.wait_idle()
        uploader.submit(third)
        await uploader.wait_idle()
    assert segments.durable_end(TOPIC) == 299

"""DurableStore: sealed segment files in a file system or an object store, through fsspec.

One class serves Danube's three storage modes:
- `local` and `shared_fs`: a directory (`/path`, `file:///path`; a shared mount for
  shared_fs). Published by write-to-temp, fsync, `os.replace`, fsync of the directory.
- `object_store`: `s3://bucket/prefix`, `gs://bucket/prefix`, `az://container/prefix`
  (or `abfs://`), `memory://prefix` for tests. Published by one whole-object upload
  (`put_file`: a single PUT, or a multipart / resumable / block upload that the store
  makes visible only when it is committed), then the size is checked with `info()`.

Either way no reader ever sees a half-written object under its final key.

Keys are relative to the store URL: a segment lives at `{ns}/{topic}/{base:020d}.seg`
(`segment_key`), i.e. `{prefix}/{ns}/{topic}/{base:020d}.seg` in the bucket or
directory. The objects are opaque bytes here (the WAL's sealed segment files). Beside
them, under the same topic prefix and found by listing (no descriptor): checkpoints-only
segments `{base:020d}.cursors` (`cursors_key`, `cursor_bases`) and compacted ledgers
`{horizon:020d}.compacted` (`compacted_key`, `compacted_horizons`).

Every method blocks (file and network I/O): call them from a worker thread
(`asyncio.to_thread`), as `Uploader` does.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import crc32c as crc32c_lib
import fsspec
import fsspec.core
from fsspec.callbacks import Callback, NoOpCallback
from fsspec.implementations.local import LocalFileSystem
from fsspec.implementations.memory import MemoryFileSystem

from danube_zmq.storage.catalog import OFFSET_DIGITS, SegmentDescriptor, check_offset, split_topic
from danube_zmq.storage.paths import check_key, join_key, show
from danube_zmq.transport.errors import InternalError, InvalidArgument, NotFound

__all__ = ["DurableCorruption", "DurableStore", "compacted_key", "cursors_key", "segment_key"]

# Read and copy in 1 MiB pieces: large enough for throughput, small enough that a
# publish or fetch holds a bounded amount of memory whatever the segment size.
_CHUNK_BYTES = 1 << 20
# Temporary files carry this marker; keys may not contain it, so a temporary
# file is never mistaken for (or collides with) a published object.
_TMP_MARKER = ".tmp-"
SEGMENT_SUFFIX = ".seg"
# A WAL segment holding cursor checkpoints only (no record: it cannot be sealed, its
# successor would take its base offset), published as it is so that the topic's next
# broker finds cursors newer than the newest sealed segment's (`cursors_key`).
CURSORS_SUFFIX = ".cursors"
# A topic's compacted ledger (`storage/wal/compacted.py`), named by its horizon as the
# local file is, so that the newest is the last listed and survives the topic's moves.
COMPACTED_SUFFIX = ".compacted"

StoreKind = Literal["filesystem", "object_store", "memory"]


class DurableCorruption(InternalError):
    """A durable object does not match its descriptor (size or crc32c), or an upload
    did not land whole. The message names the key."""


def segment_key(topic: str, base_offset: int) -> str:
    """The object key of a segment, relative to the store URL: `{ns}/{topic}/{base:020d}.seg`."""
    ns, name = split_topic(topic)
    check_offset("base_offset", base_offset)
    return f"{ns}/{name}/{base_offset:0{OFFSET_DIGITS}d}{SEGMENT_SUFFIX}"


def cursors_key(topic: str, base_offset: int) -> str:
    """The object key of a topic's checkpoints-only WAL segment starting at `base_offset`:
    `{ns}/{topic}/{base:020d}.cursors`. It has no descriptor in the metadata store: the
    next broker lists them (`DurableStore.cursor_bases`)."""
    ns, name = split_topic(topic)
    check_offset("base_offset", base_offset)
    return f"{ns}/{name}/{base_offset:0{OFFSET_DIGITS}d}{CURSORS_SUFFIX}"


def compacted_key(topic: str, horizon: int) -> str:
    """The object key of a topic's compacted ledger for `horizon`:
    `{ns}/{topic}/{horizon:020d}.compacted`. No descriptor: listed (`compacted_horizons`)."""
    ns, name = split_topic(topic)
    check_offset("horizon", horizon)
    return f"{ns}/{name}/{horizon:0{OFFSET_DIGITS}d}{COMPACTED_SUFFIX}"


def _check_key(key: str) -> str:
    # Keys also come from segment descriptors in the metadata store, which an admin can write.
    check_key(key, "durable key")
    if _TMP_MARKER in key:
        raise InvalidArgument(f"invalid durable key {show(key)}: it holds {_TMP_MARKER!r}")
    return key


def _temp_name(path: str) -> str:
    # Not the injected rng on purpose: shared_fs means several broker processes (each
    # with its own seeded rng) may write temp files in the same directory; the names
    # must be unique across processes, not reproducible.
    return f"{path}{_TMP_MARKER}{secrets.token_hex(8)}"


def _fsync_dir(directory: str) -> None:
    """Make a rename or create in `directory` durable (POSIX: fsync the directory)."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _makedirs_durable(directory: str) -> None:
    """mkdir -p, fsyncing each parent after creating a child so the new path survives a crash."""
    missing: list[str] = []
    current = directory
    while not os.path.isdir(current):
        missing.append(current)
        parent = os.path.dirname(current)
        if parent == current:
            break
        current = parent
    for path in reversed(missing):
        with contextlib.suppress(FileExistsError):  # another broker on a shared fs made it first
            os.mkdir(path)
        _fsync_dir(os.path.dirname(path))


class DurableStore:
    """Publish, fetch, delete sealed segments under one URL. See the module docstring.

    `storage_options` go to the fsspec file system (credentials, `endpoint_url`,
    `connection_string`, ...). `upload_part_bytes` sets the part size of multipart
    (s3) and resumable (gs) uploads; None keeps the library's default (50 MiB).
    """

    def __init__(
        self,
        url: str,
        *,
        storage_options: dict[str, Any] | None = None,
        upload_part_bytes: int | None = None,
    ) -> None:
        if upload_part_bytes is not None and upload_part_bytes < 5 * (1 << 20):
            # S3 rejects parts under 5 MiB (except the last); gs wants multiples of 256 KiB.
            raise InvalidArgument(f"upload_part_bytes must be >= 5 MiB, got {upload_part_bytes}")
        self._url = url
        fs, root = fsspec.core.url_to_fs(url, **(storage_options or {}))
        self._fs: fsspec.AbstractFileSystem = fs
        self._root = root.rstrip("/")
        self._upload_part_bytes = upload_part_bytes
        self._kind: StoreKind
        if isinstance(fs, LocalFileSystem):
            self._kind = "filesystem"
        elif isinstance(fs, MemoryFileSystem):
            # MemoryFileSystem publishes a file when it is *opened* for writing, so an
            # upload through put_file/open would be visible half-written: use pipe_file.
            self._kind = "memory"
        else:
            self._kind = "object_store"
        protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
        self._protocol: str = protocol

    def __repr__(self) -> str:
        return f"DurableStore({self._url!r}, kind={self._kind})"

    @property
    def url(self) -> str:
        return self._url

    @property
    def kind(self) -> StoreKind:
        return self._kind

    @property
    def protocol(self) -> str:
        """The file system's main protocol: "file", "memory", "s3", "gs", "abfs", ..."""
        return self._protocol

    @property
    def fs(self) -> fsspec.AbstractFileSystem:
        return self._fs

    segment_key = staticmethod(segment_key)

    def path_of(self, key: str) -> str:
        """The full fsspec path of `key` (`{root}/{key}`)."""
        _check_key(key)
        return join_key(self._root, key, "durable key")

    # ------------------------------------------------------------------ publish

    def publish(self, local_path: Path, key: str, *, progress: Callback | None = None) -> tuple[int, int]:
        """Copy the local file to `key`, atomically. Returns (size_bytes, crc32c) of what was published.

        `progress` (an fsspec Callback) is told the size and each uploaded piece; if it
        raises, the publish is abandoned and no object appears under `key`.
        """
        path = self.path_of(key)
        progress = progress if progress is not None else NoOpCallback()
        if self._kind == "filesystem":
            return self._publish_file(Path(local_path), path, progress)
        if self._kind == "memory":
            return self._publish_memory(Path(local_path), path, progress)
        return self._publish_object(Path(local_path), path, key, progress)

    def _publish_file(self, local_path: Path, path: str, progress: Callback) -> tuple[int, int]:
        directory = os.path.dirname(path)
        _makedirs_durable(directory)
        tmp = _temp_name(path)
        size = 0
        crc = 0
        try:
            with open(local_path, "rb") as src, open(tmp, "xb") as dst:
                progress.set_size(os.fstat(src.fileno()).st_size)
                while chunk := src.read(_CHUNK_BYTES):
                    crc = crc32c_lib.crc32c(chunk, crc)
                    dst.write(chunk)
                    size += len(chunk)
                    progress.relative_update(len(chunk))
                dst.flush()
                os.fsync(dst.fileno())
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
        _fsync_dir(directory)
        return size, crc

    def _publish_memory(self, local_path: Path, path: str, progress: Callback) -> tuple[int, int]:
        pieces: list[bytes] = []
        crc = 0
        with open(local_path, "rb") as src:
            progress.set_size(os.fstat(src.fileno()).st_size)
            while chunk := src.read(_CHUNK_BYTES):
                crc = crc32c_lib.crc32c(chunk, crc)
                pieces.append(chunk)
                progress.relative_update(len(chunk))
        data = b"".join(pieces)
        self._fs.pipe_file(path, data)  # one assignment into the store: all or nothing
        return len(data), crc

    def _checksum(self, local_path: Path) -> tuple[int, int]:
        size = 0
        crc = 0
        with open(local_path, "rb") as src:
            while chunk := src.read(_CHUNK_BYTES):
                crc = crc32c_lib.crc32c(chunk, crc)
                size += len(chunk)
        return size, crc

    def _publish_object(self, local_path: Path, path: str, key: str, progress: Callback) -> tuple[int, int]:
        # The segment is sealed (immutable), so the checksum pass and the upload read the same bytes;
        # the size check below catches a file that changed anyway.
        size, crc = self._checksum(local_path)
        kwargs: dict[str, Any] = {}
        if self._upload_part_bytes is not None and self._protocol in ("s3", "s3a", "gs", "gcs"):
            kwargs["chunksize"] = self._upload_part_bytes
        # s3fs aborts its multipart upload and gcsfs deletes its resumable session when
        # the upload fails; Azure commits a block list only at the end. Nothing partial
        # ever becomes visible under `path`.
        self._fs.put_file(str(local_path), path, callback=progress, **kwargs)
        self._fs.invalidate_cache(path)
        stored = self._fs.info(path)["size"]
        if stored != size:
            with contextlib.suppress(FileNotFoundError):
                self._fs.rm_file(path)
            raise DurableCorruption(f"durable object {key}: stored {stored} bytes after upload, expected {size}")
        return size, crc

    # ------------------------------------------------------------------ fetch

    def fetch(
        self,
        key: str,
        dest: Path,
        *,
        size_bytes: int | None = None,
        crc32c: int | None = None,
    ) -> tuple[int, int]:
        """Download `key` to `dest` (atomically: temp file, fsync, rename) and check it.

        If `size_bytes` / `crc32c` are given (from the segment descriptor) and the object
        differs, raise DurableCorruption naming the key and leave `dest` untouched. Reads
        at most `size_bytes + 1` bytes. Returns (size_bytes, crc32c) of what was read.
        """
        path = self.path_of(key)
        dest = Path(dest)
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = _temp_name(str(dest))
        limit = None if size_bytes is None else size_bytes + 1
        size = 0
        crc = 0
        try:
            with open(tmp, "xb") as out:
                for chunk in self._read_chunks(path, key, limit):
                    crc = crc32c_lib.crc32c(chunk, crc)
                    out.write(chunk)
                    size += len(chunk)
                out.flush()
                os.fsync(out.fileno())
            if size_bytes is not None and size != size_bytes:
                shown = f"more than {size_bytes}" if size > size_bytes else str(size)
                raise DurableCorruption(f"durable object {key}: {shown} bytes, descriptor says {size_bytes}")
            if crc32c is not None and crc != crc32c:
                raise DurableCorruption(f"durable object {key}: crc32c {crc:#010x}, descriptor says {crc32c:#010x}")
            os.replace(tmp, dest)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
        _fsync_dir(str(dest.parent))
        return size, crc

    def fetch_segment(self, desc: SegmentDescriptor, dest: Path) -> None:
        """`fetch` a segment and check it against its SegmentDescriptor."""
        self.fetch(desc.object_key, dest, size_bytes=desc.size_bytes, crc32c=desc.crc32c)

    def _read_chunks(self, path: str, key: str, limit: int | None) -> Iterator[bytes]:
        try:
            if self._kind == "memory":
                # A MemoryFile opened for reading is shared by every reader (one seek
                # position); cat_file copies instead.
                data = self._fs.cat_file(path, start=0, end=limit)
                for start in range(0, len(data), _CHUNK_BYTES):
                    yield data[start : start + _CHUNK_BYTES]
                return
            if self._kind == "object_store":
                self._fs.invalidate_cache(path)
            remaining = limit
            with self._fs.open(path, "rb") as src:
                while remaining is None or remaining > 0:
                    want = _CHUNK_BYTES if remaining is None else min(_CHUNK_BYTES, remaining)
                    chunk = src.read(want)
                    if not chunk:
                        return
                    if remaining is not None:
                        remaining -= len(chunk)
                    yield chunk
        except FileNotFoundError as exc:
            raise NotFound(f"durable object {key} not found") from exc

    # ------------------------------------------------------------------ delete, exists

    def delete(self, key: str) -> None:
        """Remove `key`; a missing object is not an error (retention may run twice)."""
        path = self.path_of(key)
        if self._kind == "filesystem":
            try:
                os.unlink(path)
            except FileNotFoundError:
                return
            _fsync_dir(os.path.dirname(path))
            return
        with contextlib.suppress(FileNotFoundError):
            self._fs.rm_file(path)
        self._fs.invalidate_cache(path)

    def cursor_bases(self, topic: str) -> list[int]:
        """The base offsets of `topic`'s checkpoints-only segments (`cursors_key`), in
        ascending order; temporary files are left out."""
        return self._listed_offsets(topic, CURSORS_SUFFIX)

    def compacted_horizons(self, topic: str) -> list[int]:
        """The horizons of `topic`'s compacted ledgers (`compacted_key`), in ascending
        order; temporary files are left out."""
        return self._listed_offsets(topic, COMPACTED_SUFFIX)

    def _listed_offsets(self, topic: str, suffix: str) -> list[int]:
        """The 20-digit offsets naming `topic`'s objects that end in `suffix`, ascending."""
        ns, name = split_topic(topic)
        directory = self.path_of(f"{ns}/{name}")
        try:
            if self._kind == "filesystem":
                names = os.listdir(directory)
            else:
                self._fs.invalidate_cache(directory)  # another broker may have written one
                names = [entry.rstrip("/").rsplit("/", 1)[-1] for entry in self._fs.ls(directory, detail=False)]
        except FileNotFoundError:
            return []
        offsets = []
        for entry in names:
            stem = entry[:-len(suffix)]
            if entry.endswith(suffix) and len(stem) == OFFSET_DIGITS and stem.isdigit() and stem.isascii():
                offsets.append(int(stem))
        return sorted(offsets)

    def exists(self, key: str) -> bool:
        path = self.path_of(key)
        if self._kind == "filesystem":
            return os.path.isfile(path)
        # Another broker may have written or deleted it: never answer from a listing cache.
        self._fs.invalidate_cache(path)
        return bool(self._fs.isfile(path))

    def size(self, key: str) -> int:
        path = self.path_of(key)
        try:
            self._fs.invalidate_cache(path)
            return int(self._fs.info(path)["size"])
        except FileNotFoundError as exc:
            raise NotFound(f"durable object {key} not found") from exc

"""The snapshot location: an fsspec URL (a local path, a shared file system, `s3://`,
`gs://`, `az://`, `memory://`) holding manifests and Parquet files (`manifest.py`).

Readers (the CLI, Spark's data source, the backlog report) only read; the broker's
snapshot actor is the only writer for its topics. Files are published whole: on file
systems written to a temporary name and renamed, on object stores put as one object;
a manifest is written after every file it names, so a listed snapshot is complete.
"""

from __future__ import annotations

import contextlib
import posixpath
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import IO

import fsspec

from danube_zmq.snapshots.manifest import MANIFEST, SEGMENTS_DIR, SNAPSHOTS_DIR, Manifest, manifest_path
from danube_zmq.storage.paths import check_snapshot_id, join_key, resolve_inside
from danube_zmq.transport.errors import InvalidArgument, NotFound, Unavailable

__all__ = ["SnapshotStore", "select_manifests"]

# A shared segment file nobody names is deleted only when older than this: another
# broker's export in progress may be about to name it.
_ORPHAN_AGE_S = 3600.0


class SnapshotStore:
    def __init__(self, url: str, **storage_options: object) -> None:
        try:
            self.fs, root = fsspec.core.url_to_fs(url, **storage_options)
        except (ImportError, ValueError) as exc:
            raise InvalidArgument(f"snapshot location {url!r} cannot be used: {exc}") from None
        self.url = url
        self.root = root.rstrip("/")
        self._local = "file" in _protocols(self.fs)

    def __repr__(self) -> str:
        return f"SnapshotStore({self.url!r})"

    def path(self, relative: str) -> str:
        """The full path of `relative` (checked: a relative key that stays under the root;
        on a local file system, also once symlinks are resolved)."""
        joined = join_key(self.root, relative, "snapshot path")
        if self._local:
            resolve_inside(self.root, relative)
        return joined

    # ---------------------------------------------------------------- reading

    def snapshot_ids(self) -> list[str]:
        """Ids of the complete snapshots (those with a manifest), oldest first."""
        base = self.path(SNAPSHOTS_DIR)
        try:
            found = self.fs.glob(f"{base}/*/{MANIFEST}")
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise Unavailable(f"cannot list snapshots at {self.url}: {exc}") from None
        names = (posixpath.basename(posixpath.dirname(p)) for p in found)
        return sorted(name for name in names if _is_snapshot_id(name))  # others were not made by a broker

    def manifest(self, snapshot_id: str) -> Manifest:
        check_snapshot_id(snapshot_id)
        where = f"{self.url}/{manifest_path(snapshot_id)}"
        try:
            with self.fs.open(self.path(manifest_path(snapshot_id)), "rb") as file:
                return Manifest.from_json(file.read(), where)
        except FileNotFoundError:
            raise NotFound(f"snapshot {snapshot_id!r} not found at {self.url}") from None
        except OSError as exc:
            raise Unavailable(f"cannot read {where}: {exc}") from None

    def manifests(self) -> Iterator[Manifest]:
        for snapshot_id in self.snapshot_ids():
            yield self.manifest(snapshot_id)

    def exists(self, relative: str) -> bool:
        return bool(self.fs.exists(self.path(relative)))

    def open_read(self, relative: str) -> IO[bytes]:
        return self.fs.open(self.path(relative), "rb")  # type: ignore[no-any-return]

    # ---------------------------------------------------------------- writing

    def publish(self, relative: str, write: Callable[[IO[bytes]], None]) -> None:
        """Write a file whole: readers see all of it or nothing."""
        final = self.path(relative)
        self.fs.makedirs(posixpath.dirname(final), exist_ok=True)
        if not self._local:
            with self.fs.open(final, "wb") as file:
                write(file)
            return
        temp = f"{final}.{uuid.uuid4().hex[:8]}.tmp"
        try:
            with self.fs.open(temp, "wb") as file:
                write(file)
            self.fs.mv(temp, final)
        except BaseException:
            with contextlib.suppress(OSError):
                self.fs.rm(temp)
            raise

    def write_manifest(self, manifest: Manifest) -> None:
        data = manifest.to_json().encode()
        self.publish(manifest_path(manifest.snapshot_id), lambda file: file.write(data))

    def delete(self, snapshot_id: str) -> None:
        check_snapshot_id(snapshot_id)
        directory = self.path(f"{SNAPSHOTS_DIR}/{snapshot_id}")
        if not self.fs.exists(directory):
            raise NotFound(f"snapshot {snapshot_id!r} not found at {self.url}")
        # The manifest first: from then on the snapshot is not listed, whatever happens next.
        with contextlib.suppress(FileNotFoundError):
            self.fs.rm(self.path(manifest_path(snapshot_id)))
        self.fs.rm(directory, recursive=True)

    def delete_unreferenced_segments(self, now_s: float | None = None) -> int:
        """Delete shared segment files no manifest names (older than an hour); returns how many."""
        referenced = {f.path for m in self.manifests() for f in m.files if f.shared}
        base = self.path(SEGMENTS_DIR)
        try:
            found = self.fs.find(base, detail=True)
        except FileNotFoundError:
            return 0
        now_s = time.time() if now_s is None else now_s
        deleted = 0
        for path, info in found.items():
            relative = path[len(self.root) + 1:]
            if relative in referenced or not path.endswith(".parquet"):
                continue
            if now_s - _modified_s(info, now_s) < _ORPHAN_AGE_S:
                continue
            with contextlib.suppress(FileNotFoundError):
                self.fs.rm(path)
                deleted += 1
        return deleted


def _is_snapshot_id(name: str) -> bool:
    try:
        check_snapshot_id(name)
    except InvalidArgument:
        return False
    return True


def _protocols(fs: fsspec.AbstractFileSystem) -> set[str]:
    protocol = fs.protocol
    return {protocol} if isinstance(protocol, str) else set(protocol)


def _modified_s(info: dict[str, object], default: float) -> float:
    for key in ("mtime", "LastModified", "last_modified", "updated", "created"):
        value = info.get(key)
        if isinstance(value, int | float):
            return float(value)
        if hasattr(value, "timestamp"):
            return float(value.timestamp())  # type: ignore[union-attr]
        if isinstance(value, str):
            with contextlib.suppress(ValueError):
                return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    return default


def select_manifests(store: SnapshotStore, from_ms: int | None = None, to_ms: int | None = None) -> list[Manifest]:
    """The snapshots taken in [from_ms, to_ms], oldest first."""
    out = []
    for snapshot_id in store.snapshot_ids():
        manifest = store.manifest(snapshot_id)
        if (from_ms is None or manifest.created_ms >= from_ms) and (to_ms is None or manifest.created_ms <= to_ms):
            out.append(manifest)
    return out

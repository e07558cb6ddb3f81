"""A reliable topic's compacted ledger in the durable store (storage.mode shared_fs and
object_store), so that its compacted view survives moves, failovers and a new disk.

The ledger object sits under the topic's prefix beside its segments, named by its
horizon as the local file is: `{ns}/{topic}/{horizon:020d}.compacted` (`compacted_key`).
Like the checkpoints-only `.cursors` objects it has no descriptor in the metadata store:
the newest is found by listing (`DurableStore.compacted_horizons`).

1. A compaction's worker thread, once its ledger is committed beside the WAL, publishes
   it (`publish_new_ledger`: the store's atomic `publish`), then deletes the older
   ledger objects. The compaction is done only then: a failed upload fails it, the new
   local file goes and the previous view stays, so a view in use here is always one the
   store holds too.
2. A topic starting (`WalCompaction.load`) downloads the store's newest ledger when it
   is newer than this disk's or this disk has none (`fetch_newer_ledger`): into a
   scratch directory, checked whole (`Ledger.open`: every record's CRC), then renamed in
   beside the WAL. A local ledger newer than the store's (a kill -9 cut its upload
   short) is published once it opened whole (`publish_ledger`).
3. Deleting the topic deletes its ledger objects (`TopicFiles.delete_durable`).

Every function here blocks on the store: run it in the topic's executor.
"""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path

from danube_zmq.storage.durable import DurableStore, compacted_key
from danube_zmq.storage.wal import files as wal_files
from danube_zmq.storage.wal.compacted import Ledger, ledger_file_name, ledgers_in
from danube_zmq.transport.errors import DanubeError, Unavailable

__all__ = ["fetch_newer_ledger", "publish_ledger", "publish_new_ledger"]

log = logging.getLogger("danube_zmq.topic")

# The scratch directory of a download: `WalCompaction.load` removes any a crash left.
SCRATCH_PREFIX = ".compacting-"


def publish_ledger(store: DurableStore, topic: str, path: Path, horizon: int) -> None:
    """Publish the ledger at `path` as the topic's, then delete the older ones."""
    store.publish(path, compacted_key(topic, horizon))
    # Older ones only after the new one is whole in the store: a reader of the store
    # always finds a view.
    for older in store.compacted_horizons(topic):
        if older >= horizon:
            break
        try:
            store.delete(compacted_key(topic, older))
        except (OSError, DanubeError) as exc:  # left behind: the next upload or the topic's deletion lists it
            log.warning("%s: older compacted ledger %d not deleted from the durable store: %s", topic, older, exc)


def publish_new_ledger(store: DurableStore, topic: str, path: Path, horizon: int) -> None:
    """`publish_ledger` for a compaction that just committed `path`. On failure `path`
    is deleted (the previous view stays: the store holds it) and the error raised,
    UNAVAILABLE when the store or the disk failed."""
    try:
        publish_ledger(store, topic, path, horizon)
    except BaseException as exc:
        try:
            wal_files.current.unlink(path)
        except FileNotFoundError:
            pass
        if isinstance(exc, OSError | DanubeError):
            why = exc.message if isinstance(exc, DanubeError) else f"{type(exc).__name__}: {exc}"
            raise Unavailable(f"the compacted ledger was not uploaded to the durable store ({why});"
                              " the previous view stays") from exc
        raise


def fetch_newer_ledger(store: DurableStore, topic: str, wal_dir: Path) -> int | None:
    """Download the store's newest ledger into `wal_dir` when it is newer than the
    newest there (or there is none); the store's newest horizon (None: it holds none).
    A damaged object raises CorruptRecord and leaves `wal_dir` as it was."""
    stored = store.compacted_horizons(topic)
    if not stored:
        return None
    newest = stored[-1]
    local = ledgers_in(wal_dir)
    if local and local[-1][0] >= newest:
        return newest
    name = ledger_file_name(newest)
    with tempfile.TemporaryDirectory(dir=wal_dir, prefix=SCRATCH_PREFIX) as scratch:
        staged = Path(scratch) / name
        store.fetch(compacted_key(topic, newest), staged)
        # Checked before it takes its final name: a ledger file there is trusted to be whole.
        Ledger.open(staged).close()
        wal_files.current.replace(staged, wal_dir / name)
        wal_files.current.fsync_directory(wal_dir)
    return newest

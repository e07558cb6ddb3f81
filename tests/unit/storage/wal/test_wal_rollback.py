"""After a failed fsync the WAL cuts back to its last successful fsync (never trusting
pages whose write-back failed), and carries on from there."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from danube_zmq.clock import SystemClock
from danube_zmq.storage.wal import WalLog, encode_batch
from danube_zmq.storage.wal import files as wal_files


def batch(log: WalLog, n: int, tag: bytes) -> bytes:
    return encode_batch(log.next_offset, [tag + bytes([i]) for i in range(n)], [0] * n, 7, "p")


def test_failed_fsync_rolls_back_to_the_last_synced_record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Records whose fsync failed are cut from the file; earlier synced ones stay, and
    the next append reuses the offsets and survives a reopen."""
    log = WalLog.open(tmp_path, segment_bytes_max=1 << 20, segment_age_ms_max=None, clock=SystemClock())
    log.append(batch(log, 3, b"a"), 3)
    log.sync()
    size_synced = (tmp_path / "00000000000000000000.wal").stat().st_size
    log.append(batch(log, 2, b"b"), 2)
    real_fsync = os.fsync

    def failing_fsync(fd: int) -> None:
        raise OSError(errno.EIO, "injected fsync failure")

    monkeypatch.setattr(wal_files.current, "fsync", failing_fsync)
    with pytest.raises(OSError):
        log.sync()
    monkeypatch.setattr(wal_files.current, "fsync", real_fsync)
    assert log.rollback_unsynced() == 3 and log.next_offset == 3 and log.writable
    assert (tmp_path / "00000000000000000000.wal").stat().st_size == size_synced
    log.append(batch(log, 2, b"c"), 2)
    log.sync()
    log.close()
    reopened = WalLog.open(tmp_path, segment_bytes_max=1 << 20, segment_age_ms_max=None, clock=SystemClock())
    records = reopened.read(0, max_bytes=1 << 20, upto_offset=reopened.next_offset)
    assert records.offsets == [0, 1, 2, 3, 4]
    assert [p[:1] for p in records.payloads] == [b"a", b"a", b"a", b"c", b"c"]
    reopened.close()


def test_rollback_that_fails_leaves_the_log_unwritable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """If even the cut fails, the log says it is not writable (the topic reopens it)."""
    log = WalLog.open(tmp_path, segment_bytes_max=1 << 20, segment_age_ms_max=None, clock=SystemClock())
    log.append(batch(log, 2, b"a"), 2)

    def failing(*args: object) -> None:
        raise OSError(errno.EIO, "injected")

    monkeypatch.setattr(wal_files.current, "fsync", failing)
    monkeypatch.setattr(wal_files.current, "ftruncate", failing)
    with pytest.raises(OSError):
        log.rollback_unsynced()
    assert not log.writable

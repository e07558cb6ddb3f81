"""A topic's compacted ledger in the durable store (`ledger_store.py`, durable modes):
published under the topic's prefix by horizon with the older ones deleted, listed apart
from segments, checkpoints and temporary files, downloaded only when newer than the
local one and checked whole before it takes its name; a failed upload leaves the
previous view, a damaged object leaves the WAL directory as it was."""

from __future__ import annotations

from pathlib import Path
from unittest import mock

import pytest

from danube_zmq.actors.topic.wal.ledger_store import fetch_newer_ledger, publish_ledger, publish_new_ledger
from danube_zmq.storage.durable import DurableStore, compacted_key, cursors_key, segment_key
from danube_zmq.storage.wal import HEADER_BYTES, CorruptRecord, RecordBatch
from danube_zmq.storage.wal.compacted import Ledger, LedgerWriter, ledger_file_name, ledgers_in
from danube_zmq.transport.errors import Unavailable

TOPIC = "/ns/orders"


def write_ledger(directory: Path, horizon: int, tag: str = "v") -> Path:
    """A ledger holding one record at each even offset below `horizon`."""
    directory.mkdir(parents=True, exist_ok=True)
    offsets = list(range(0, horizon, 2))
    n = len(offsets)
    batch = RecordBatch(offsets=offsets, payloads=[f"{tag}{o}".encode() for o in offsets],
                        keys=[f"k{o}" for o in offsets], attributes=[None] * n, publish_times=offsets,
                        producer_ids=[1] * n, producer_names=["p"] * n, schema_ids=[None] * n,
                        schema_versions=[None] * n, sequence_ids=[None] * n)
    with LedgerWriter(directory, horizon) as writer:
        writer.append(batch, [True] * n)
        return writer.commit()


def rows(path: Path) -> list[tuple[int, bytes]]:
    with Ledger.open(path) as ledger:
        return [(o, p) for b in ledger.records() for o, p in zip(b.offsets, b.payloads, strict=True)]


@pytest.fixture
def store(tmp_path: Path) -> DurableStore:
    return DurableStore(str(tmp_path / "store"))


def test_a_published_ledger_replaces_the_older_ones_and_is_listed_apart(tmp_path: Path, store: DurableStore) -> None:
    """Each ledger lands under `{ns}/{topic}/{horizon:020d}.compacted`; publishing one
    deletes the older ones only; segments, checkpoints-only segments and
    temporary files of the same topic are neither listed nor touched."""
    local = tmp_path / "wal"
    other = tmp_path / "other.bin"
    other.write_bytes(b"bytes")
    store.publish(other, segment_key(TOPIC, 0))
    store.publish(other, cursors_key(TOPIC, 40))
    (Path(store.path_of(compacted_key(TOPIC, 90))).parent / f"{ledger_file_name(90)}.tmp-0123").write_bytes(b"x")
    assert compacted_key(TOPIC, 10) == f"ns/orders/{ledger_file_name(10)}"
    publish_ledger(store, TOPIC, write_ledger(local, 20), 20)
    assert store.compacted_horizons(TOPIC) == [20]
    publish_ledger(store, TOPIC, write_ledger(local, 10), 10)
    assert store.compacted_horizons(TOPIC) == [10, 20]  # an older one never deletes a newer one
    publish_ledger(store, TOPIC, write_ledger(local, 30), 30)
    assert store.compacted_horizons(TOPIC) == [30]
    assert store.cursor_bases(TOPIC) == [40] and store.exists(segment_key(TOPIC, 0))
    assert store.compacted_horizons("/ns/other") == []


def test_publish_new_ledger_failing_drops_the_new_file_and_keeps_the_old_view(tmp_path: Path,
                                                                             store: DurableStore) -> None:
    """An upload that fails (the store unreachable) fails the compaction with
    UNAVAILABLE naming why, and deletes the new local ledger: this disk and the store
    keep the previous view alike."""
    local = tmp_path / "wal"
    publish_new_ledger(store, TOPIC, write_ledger(local, 10), 10)
    new = write_ledger(local, 20)
    with mock.patch.object(store, "publish", side_effect=OSError("connection refused")), \
            pytest.raises(Unavailable, match=r"not uploaded to the durable store .*connection refused"):
        publish_new_ledger(store, TOPIC, new, 20)
    assert not new.exists() and [h for h, _ in ledgers_in(local)] == [10]
    assert store.compacted_horizons(TOPIC) == [10]


def test_the_stores_ledger_is_fetched_only_when_newer_and_checked(tmp_path: Path, store: DurableStore) -> None:
    """None in the store: nothing fetched. The store's newer (or no local one): it is
    downloaded beside the WAL under its name, the same records. The local one as new or
    newer: nothing fetched, the store's newest horizon answered (the caller uploads a
    newer local one)."""
    wal_dir = tmp_path / "wal"
    wal_dir.mkdir()
    assert fetch_newer_ledger(store, TOPIC, wal_dir) is None
    elsewhere = tmp_path / "elsewhere"
    publish_ledger(store, TOPIC, write_ledger(elsewhere, 20, tag="moved"), 20)
    assert fetch_newer_ledger(store, TOPIC, wal_dir) == 20
    [(horizon, path)] = ledgers_in(wal_dir)
    assert horizon == 20 and rows(path) == rows(elsewhere / ledger_file_name(20))
    assert sorted(p.name for p in wal_dir.iterdir()) == [ledger_file_name(20)]  # no scratch left
    write_ledger(wal_dir, 30)
    with mock.patch.object(store, "fetch", side_effect=AssertionError("fetched")):
        assert fetch_newer_ledger(store, TOPIC, wal_dir) == 20
        publish_ledger(store, TOPIC, write_ledger(elsewhere, 30), 30)
        assert fetch_newer_ledger(store, TOPIC, wal_dir) == 30


def test_a_damaged_ledger_in_the_store_is_never_used(tmp_path: Path, store: DurableStore) -> None:
    """A ledger object with a flipped bit raises CorruptRecord and leaves the WAL
    directory as it was: the older local ledger stays the newest there."""
    wal_dir = tmp_path / "wal"
    write_ledger(wal_dir, 10)
    publish_ledger(store, TOPIC, write_ledger(tmp_path / "elsewhere", 20), 20)
    stored = Path(store.path_of(compacted_key(TOPIC, 20)))
    data = bytearray(stored.read_bytes())
    data[HEADER_BYTES + 2] ^= 0x01
    stored.write_bytes(bytes(data))
    with pytest.raises(CorruptRecord, match="crc32c mismatch"):
        fetch_newer_ledger(store, TOPIC, wal_dir)
    assert sorted(p.name for p in wal_dir.iterdir()) == [ledger_file_name(10)]

"""tests/chaos/harness/power.py's pure parts: the torn Raft log record of R3 (on a real LevelDB
store) and the loss window of B6-interval."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from danube_zmq.consensus.log_store import RaftLogStore
from danube_zmq.consensus.types import Entry, HardState
from tests.chaos.harness.checkers import check_run
from tests.chaos.harness.history import Op
from tests.chaos.harness.power import RAFT_STORE, last_record, loss_window, tear_raft_log


def _store_with(data_dir: Path, batches: list[int], payload: int) -> list[Entry]:
    store = RaftLogStore.open(data_dir / RAFT_STORE)
    written: list[Entry] = []
    try:
        for size in batches:
            entries = [Entry(index=len(written) + i + 1, term=1, kind=1, data=b"x" * payload) for i in range(size)]
            store.append(entries, hard_state=HardState(term=1, voted_for=1, commit_index=len(written)))
            written += entries
    finally:
        store.close()
    return written


@settings(max_examples=15, deadline=None)
@given(batches=st.lists(st.integers(1, 4), min_size=1, max_size=12), payload=st.sampled_from([10, 3_000, 40_000]),
       seed=st.integers(0, 1_000))
def test_a_torn_last_raft_record_loses_that_batch_and_nothing_before(tmp_path_factory: pytest.TempPathFactory,
                                                                     batches: list[int], payload: int,
                                                                     seed: int) -> None:
    """Tearing the last record of the Raft store's LevelDB log (records of any size,
    fragments across 32 KiB blocks included) drops exactly the last write batch: the
    store opens (a torn tail is the end of the log, not corruption) with every entry of
    the earlier batches, byte for byte."""
    data_dir = tmp_path_factory.mktemp("raft")
    written = _store_with(data_dir, batches, payload)
    said = tear_raft_log(data_dir, random.Random(seed))
    assert "torn at byte" in said, said
    store = RaftLogStore.open(data_dir / RAFT_STORE)
    try:
        kept = len(written) - batches[-1]
        assert store.last_index() == kept, said
        if kept:
            assert store.entries(1, kept + 1, 1 << 30) == written[:kept]
    finally:
        store.close()


def test_last_record_of_an_empty_log_is_none(tmp_path: Path) -> None:
    """A LevelDB log with no record (a store just opened) has nothing to tear."""
    empty = tmp_path / "000001.log"
    empty.write_bytes(b"")
    assert last_record(empty) is None


def _send(seq: int, invoke_ns: int, ok_ns: int) -> list[Op]:
    value = {"producer": "p", "seq": seq, "topic": "/t", "reliable": True}
    return [Op(type="invoke", process="p", f="send", value=value, time_ns=invoke_ns),
            Op(type="ok", process="p", f="send", value={**value, "offset": seq}, time_ns=ok_ns)]


def _deliver(seq: int, t: int) -> Op:
    return Op(type="ok", process="c", f="deliver", time_ns=t, value={
        "subscription": "ex", "sub_type": "exclusive", "producer": "p", "seq": seq, "topic": "/t",
        "offset": seq, "redelivery": 0})


def test_the_loss_window_excuses_only_what_was_acked_after_the_last_fsync() -> None:
    """B6-interval: of two acknowledged messages never delivered, the one acknowledged
    after the owner's last fsync began (and within the window) is excused; the one
    acknowledged before it stays lost, so the run is invalid."""
    ms = 1_000_000
    ops = sorted([*_send(0, 1 * ms, 2 * ms), *_send(1, 3 * ms, 4 * ms), *_send(2, 5 * ms, 60 * ms),
                  _deliver(1, 70 * ms)], key=lambda op: op.time_ns)
    notes = {"owner": "broker-1", "last_fsync_ns": {"broker-1": 10 * ms}, "power_loss_ns": 100 * ms}
    report, fields = loss_window(check_run("B6-interval", ops), ops, notes, window_ms=200)
    assert fields["lost_in_window"] == 1  # seq 2, acked at 60 ms, after the fsync at 10 ms
    assert report.lost == 1 and not report.valid  # seq 0, acked at 2 ms, before it
    everything = sorted([*ops, _deliver(0, 80 * ms)], key=lambda op: op.time_ns)
    report, fields = loss_window(check_run("B6-interval", everything), everything, notes, window_ms=200)
    assert report.lost == 0 and fields["lost_in_window"] == 1


def test_a_wal_unsynced_past_the_window_fails_the_run() -> None:
    """B6-interval: when the owner's last fsync began longer than the window before the
    power loss, the run fails a criterion even with nothing lost."""
    ms = 1_000_000
    ops = sorted([*_send(0, 1 * ms, 2 * ms), _deliver(0, 3 * ms)], key=lambda op: op.time_ns)
    notes = {"owner": "broker-1", "last_fsync_ns": {"broker-1": 10 * ms}, "power_loss_ns": 1_500 * ms}
    report, fields = loss_window(check_run("B6-interval", ops), ops, notes, window_ms=1_200)
    assert report.criteria_failed == 1 and not report.valid and fields["unsynced_ms_at_loss"] == 1_490
    notes["last_fsync_ns"]["broker-1"] = 400 * ms
    report, _ = loss_window(check_run("B6-interval", ops), ops, notes, window_ms=1_200)
    assert report.criteria_failed == 0 and report.valid


def test_a_raft_store_with_a_corrupt_record_before_its_tail_refuses_to_open(tmp_path: Path) -> None:
    """R3's other half: a byte flipped inside an earlier record of the Raft store's
    LevelDB log (not a torn tail: a write that was acknowledged) is corruption, and the
    store refuses to open (paranoid checks), so the node cannot run, vote or campaign on
    a log that silently lost acknowledged entries before it is repaired."""
    from danube_zmq.consensus.log_store import LogStoreCorruption

    _store_with(tmp_path, [1, 1, 1, 1], payload=100)
    log = max((tmp_path / RAFT_STORE / "raft-log").glob("*.log"), key=lambda p: p.stat().st_size)
    first = last_record(log)
    assert first is not None
    data = bytearray(log.read_bytes())
    data[20] ^= 0xFF  # inside the first record's payload, far from the tail
    log.write_bytes(bytes(data))
    with pytest.raises(LogStoreCorruption):
        RaftLogStore.open(tmp_path / RAFT_STORE).close()

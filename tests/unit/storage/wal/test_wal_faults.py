"""The WAL under disk faults, through its file layer with `chaos.disk.FaultyFiles`:
power loss at a random point of a group-commit run (W1), fsync and write failures (W5),
short writes, and the power-loss model itself. Every run takes a seed; a failure names
it and `run_group_commit(seed)` replays it exactly."""

from __future__ import annotations

import errno
import os
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from danube_zmq.clock import ManualClock
from danube_zmq.storage.wal import WalLog, encode_batch
from danube_zmq.storage.wal import files as wal_files
from tests.chaos.harness.disk import FaultyFiles, Ledger, Rule, crash_journal

APPENDS = 10_000


@pytest.fixture
def layer_restored() -> Iterator[None]:
    """Whatever a test installs, the real file layer is back afterwards."""
    previous = wal_files.current
    yield
    wal_files.install(previous)


def open_log(directory: Path, **options: object) -> WalLog:
    settings: dict = {"segment_bytes_max": 8 * 1024, "segment_age_ms_max": None, "index_interval_bytes": 1024}
    settings.update(options)
    return WalLog.open(directory, clock=ManualClock(), **settings)


def payload(seed: int, offset: int) -> bytes:
    return f"{seed}:{offset}".encode() * (1 + offset % 7)


@dataclass
class Run:
    """What a run acknowledged: offset -> payload, only after its `sync` returned."""

    acked: dict[int, bytes] = field(default_factory=dict)
    failed_batches: int = 0
    appends: int = 0


def group_commit(wal: WalLog, rng: random.Random, seed: int, appends: int, run: Run) -> WalLog:
    """The topic actor's write loop: a few batches appended, one sync, then acks; a
    failed append or sync refuses the whole group and rolls back to the last fsync;
    when even that fails the log is closed and opened again (`_reopen_wal`). Returns
    the log in use at the end."""
    while run.appends < appends:
        group: dict[int, bytes] = {}
        try:
            for _ in range(rng.randint(1, 4)):
                count = rng.randint(1, 5)
                base = wal.next_offset
                payloads = [payload(seed, base + i) for i in range(count)]
                wal.append(encode_batch(base, payloads, [0] * count, 1, "p"), count)
                group.update(zip(range(base, base + count), payloads, strict=True))
                run.appends += 1
            wal.sync()
        except OSError:
            run.failed_batches += 1
            try:
                wal.rollback_unsynced()
            except OSError:
                wal = reopen(wal)
            continue
        run.acked.update(group)
    return wal


def reopen(wal: WalLog) -> WalLog:
    """Close a log whose tail is unknown (errors ignored, as the actor logs them) and
    open it again; recovery fsyncs what it keeps. Injected faults may fail the open too."""
    try:
        wal.close()
    except OSError:
        pass
    for _ in range(100):
        try:
            return open_log(wal.directory)
        except OSError:
            continue
    raise AssertionError("the log could not be opened again in 100 tries")


def recovered(directory: Path) -> tuple[WalLog, dict[int, bytes]]:
    wal = open_log(directory)
    batch = wal.read(wal.log_start_offset, max_bytes=1 << 30, upto_offset=wal.next_offset)
    return wal, dict(zip(batch.offsets, batch.payloads, strict=True))


def check_after_crash(directory: Path, seed: int, run: Run) -> None:
    """Every acked record is there with its payload, offsets are continuous, and a new
    append takes the next offset (past every acked one) and reads back."""
    wal, records = recovered(directory)
    try:
        lost = sorted(set(run.acked) - set(records))
        assert not lost, f"seed {seed}: acked offsets lost: {lost[:10]}"
        changed = [o for o, p in run.acked.items() if records[o] != p]
        assert not changed, f"seed {seed}: acked offsets hold other data: {changed[:10]}"
        assert sorted(records) == list(range(len(records))), f"seed {seed}: offsets not continuous"
        assert wal.next_offset == len(records) and wal.next_offset > max(run.acked, default=-1)
        base = wal.append(encode_batch(wal.next_offset, [b"after"], [0], 1, "p"), 1)
        wal.sync()
        assert wal.read(base, max_bytes=1 << 20, upto_offset=base + 1).payloads == [b"after"]
    finally:
        wal.close()


def run_group_commit(directory: Path, seed: int, *, appends: int = APPENDS, rules: tuple[Rule, ...] = ()) -> Run:
    """One seeded W1/W5 run: group commits until a random crash point, power loss
    (half the seeds keep a random part of the unsynced tail), recovery checked."""
    rng = random.Random(seed)
    layer = FaultyFiles(seed=seed, rules=rules, os_fsync=False)
    wal_files.install(layer)
    run = Run()
    group_commit(open_log(directory), rng, seed, rng.randrange(1, appends + 1), run)
    layer.crash(torn_tail=rng.random() < 0.5)  # the WAL object is dead with the process
    wal_files.install(FaultyFiles(seed=seed, os_fsync=False))
    check_after_crash(directory, seed, run)
    return run


@pytest.mark.parametrize("seed", range(20))
def test_acked_records_survive_power_loss_at_a_random_point(tmp_path: Path, seed: int, layer_restored: None) -> None:
    """W1: group commits of 1-4 batches of 1-5 records on 8 KiB segments (many rolls),
    power loss at a random append of up to 10k, with or without a torn tail: every
    record acked before the crash is present with its payload, offsets are continuous,
    and the next offset is past every acked one (no offset reused)."""
    run = run_group_commit(tmp_path, seed)
    assert run.acked or run.appends <= 4


@pytest.mark.chaos
@pytest.mark.parametrize("seed", range(20, 220))
def test_acked_records_survive_power_loss_200_seeds(tmp_path: Path, seed: int, layer_restored: None) -> None:
    """W1 at the size of reliability.md's table: 200 seeds of the run above."""
    run_group_commit(tmp_path, seed)


def test_power_loss_drops_unsynced_records(tmp_path: Path, layer_restored: None) -> None:
    """The model has teeth: records appended but never synced are gone after `crash`,
    and a segment created by a roll whose directory was never fsynced disappears."""
    layer = FaultyFiles(seed=1, os_fsync=False)
    wal_files.install(layer)
    wal = open_log(tmp_path, segment_bytes_max=250)
    wal.append(encode_batch(0, [b"a" * 150], [0], 1, "p"), 1)
    wal.sync()
    wal.append(encode_batch(1, [b"b" * 100], [0], 1, "p"), 1)  # rolls: a new file, entry not synced
    wal.append(encode_batch(2, [b"c" * 10], [0], 1, "p"), 1)
    assert len(list(tmp_path.glob("*.wal"))) == 2
    report = layer.crash()
    assert [Path(p).name for p in report.files_removed] == ["00000000000000000001.wal"]
    wal, records = recovered(tmp_path)
    assert records == {0: b"a" * 150} and wal.next_offset == 1
    wal.close()


def test_fsync_eio_once_refuses_the_group_and_loses_nothing_acked(tmp_path: Path, layer_restored: None) -> None:
    """W5: fsync of a segment fails with EIO once: that group is not acknowledged, the
    log cuts back to its last fsync and goes on; after a power loss every acked record
    is there and none of the refused ones reads as acked data."""
    rules = (Rule(op="fsync", error="EIO", match=".wal", skip=30, times=1),)
    run = run_group_commit(tmp_path, seed=7, appends=500, rules=rules)
    assert run.failed_batches == 1


@pytest.mark.parametrize("seed", range(10))
def test_random_write_and_fsync_faults_never_lose_acked_records(tmp_path: Path, seed: int,
                                                                layer_restored: None) -> None:
    """Seeded ENOSPC and EIO on writes, EIO on fsync and short writes, each on a few
    percent of calls, then power loss: acked records all survive, whatever failed."""
    rules = (
        Rule(op="write", error="ENOSPC", match=".wal", times=0, probability=0.02),
        Rule(op="write", error="EIO", match=".wal", times=0, probability=0.01),
        Rule(op="write", error="short", match=".wal", times=0, probability=0.05),
        Rule(op="fsync", error="EIO", match=".wal", times=0, probability=0.03),
    )
    run = run_group_commit(tmp_path, seed, appends=2_000, rules=rules)
    assert run.failed_batches > 0, "the faults must have hit"


def test_short_writes_still_store_whole_records(tmp_path: Path, layer_restored: None) -> None:
    """Every write returns fewer bytes than asked: the segment writes the rest, and
    every record reads back whole after a reopen."""
    wal_files.install(FaultyFiles(seed=3, rules=(Rule(op="write", error="short", times=0),), os_fsync=False))
    with open_log(tmp_path) as wal:
        for offset in range(50):
            wal.append(encode_batch(offset, [payload(3, offset)], [0], 1, "p"), 1)
        wal.sync()
    wal, records = recovered(tmp_path)
    assert records == {offset: payload(3, offset) for offset in range(50)}
    wal.close()


def test_failed_write_propagates_its_errno(tmp_path: Path, layer_restored: None) -> None:
    """An injected ENOSPC reaches the caller as that OSError (the topic maps it to
    RESOURCE_EXHAUSTED) and leaves nothing half-written."""
    wal_files.install(FaultyFiles(seed=0, rules=(Rule(op="write", error="ENOSPC", match=".wal"),), os_fsync=False))
    with open_log(tmp_path) as wal:
        with pytest.raises(OSError) as caught:
            wal.append(encode_batch(0, [b"x"], [0], 1, "p"), 1)
        assert caught.value.errno == errno.ENOSPC and wal.next_offset == 0
        wal.append(encode_batch(0, [b"y"], [0], 1, "p"), 1)
    wal, records = recovered(tmp_path)
    assert records == {0: b"y"}
    wal.close()


def test_journal_replay_crashes_like_the_process_ledger(tmp_path: Path, layer_restored: None) -> None:
    """The journal a broker process leaves gives the same power loss as the in-process
    ledger: the same files cut to the same lengths (what `crash_journal` relies on after
    a kill -9)."""
    journal = tmp_path / "journal"
    layer = FaultyFiles(seed=5, journal=journal, os_fsync=False)
    wal_files.install(layer)
    data = tmp_path / "wal"
    wal = open_log(data, segment_bytes_max=300)
    rng = random.Random(5)
    wal = group_commit(wal, rng, 5, 200, Run())
    wal.append(encode_batch(wal.next_offset, [b"unsynced" * 20], [0], 1, "p"), 1)
    expected = {path: (state.durable_bytes, state.entry_durable) for path, state in layer.ledger.files.items()}
    assert expected == {path: (state.durable_bytes, state.entry_durable)
                        for path, state in Ledger.replay(journal).files.items()}
    sizes_before = {p.name: p.stat().st_size for p in data.iterdir() if p.is_file()}
    report = crash_journal(journal, seed=5)
    assert report.bytes_dropped > 0 and journal.read_bytes() == b""
    for path, (durable_bytes, entry_durable) in expected.items():
        if entry_durable:
            assert os.path.getsize(path) == min(durable_bytes, sizes_before[Path(path).name])
        else:
            assert not os.path.exists(path)


def test_rules_reject_what_they_cannot_do() -> None:
    """A misspelt op or errno, or a short fsync, is refused when the rule is made."""
    with pytest.raises(ValueError):
        Rule(op="fsynk")
    with pytest.raises(ValueError):
        Rule(op="fsync", error="ENOPE")
    with pytest.raises(ValueError):
        Rule(op="fsync", error="short")


def test_close_after_a_failed_rollback_keeps_the_log_openable(tmp_path: Path, layer_restored: None) -> None:
    """Found by the seeded run above (seed 0): a sync fails, the rollback's cut reaches
    the file but its fsync fails too (the log is unwritable), and the topic closes the
    log to reopen it. Closing must not fsync and raise the acknowledged frontier over
    records the cut removed: the log reopens at its last good fsync, not as damaged."""
    layer = FaultyFiles(seed=0, os_fsync=False)
    wal_files.install(layer)
    wal = open_log(tmp_path)
    wal.append(encode_batch(0, [b"kept"], [0], 1, "p"), 1)
    wal.sync()
    layer.arm((Rule(op="fsync", error="EIO", match=".wal", times=2),))
    wal.append(encode_batch(1, [b"refused"] * 5, [0] * 5, 1, "p"), 5)
    with pytest.raises(OSError):
        wal.sync()
    with pytest.raises(OSError):
        wal.rollback_unsynced()  # the cut is made, its fsync fails
    assert not wal.writable
    wal.close()
    wal, records = recovered(tmp_path)
    assert records == {0: b"kept"} and wal.next_offset == 1
    wal.close()

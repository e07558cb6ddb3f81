"""Crash scenarios on a whole cluster's disks (docs/reliability.md 4.2: B6 on all three
brokers, R3): the fault-injecting WAL layer of tests/chaos/harness/disk.py in brokers started by their
hosts' supervisors, a power loss of every broker at once, a torn Raft log record, and
the checks these add to `check_run`.

    Disks(dir, env)      per host: a control file and a journal; `env(host)` puts
                         DIR/site/ (SITECUSTOMIZE) on the host's PYTHONPATH, so the
                         supervisor's brokers (restarts too) journal their WAL fsyncs
    power_loss_all(run)  B6: faults.power_loss(every broker): each WAL cut to what was
                         fsynced (half the seeds keep a torn part of the rest), restart
    raft_torn(run)       R3: faults.power_loss(leader or follower): the last record of
                         its Raft log (LevelDB's write-ahead log) torn, restart
    loss_window(...)     B6-interval: a lost message is excused only when acknowledged
                         after the owner's last fsync began and within the window
    raft_logs_agree(...) R3: after the cluster is down, every node's Raft log read back:
                         log matching, committed entries on a majority, the torn node
                         caught up

The schedules take the scenarios' `Run` (tests/chaos/harness/scenarios.py) and use only its cluster,
faults, rng, notes and waits.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import random
import struct
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tests.chaos.harness import checkers
from tests.chaos.harness.checkers import Report
from tests.chaos.harness.cluster import Broker
from tests.chaos.harness.disk import crash_journal, fsync_starts, write_control
from tests.chaos.harness.history import Op
from tests.chaos.harness.hosts import Host

if TYPE_CHECKING:
    from tests.chaos.harness.scenarios import Run

# Written into each run's disks directory and put on the hosts' PYTHONPATH (as the clock
# shim's source is written at run time: nothing outside the Python package to install).
SITECUSTOMIZE = '''\
"""Put on a namespace host's PYTHONPATH by tests/chaos/harness/power.py (B6): a broker its host's
supervisor starts there (`-m danube_zmq.cli.main broker start ...`, a restart too) runs
with tests/chaos/harness/disk.py's fault-injecting WAL file layer, journalling every fsync to the
journal named in $DANUBE_CHAOS_DISK_CONTROL. Every other process is left alone."""

import os
import sys

_control = os.environ.get("DANUBE_CHAOS_DISK_CONTROL")
_argv = getattr(sys, "orig_argv", [])
if _control and "danube_zmq.cli.main" in _argv \\
        and _argv[_argv.index("danube_zmq.cli.main") + 1:][:2] == ["broker", "start"]:
    from pathlib import Path

    from tests.chaos.harness.disk import FaultyFiles
    from danube_zmq.storage.wal import files

    files.install(FaultyFiles.from_control(Path(_control)))
'''
CONTROL_ENV = "DANUBE_CHAOS_DISK_CONTROL"
INTERVAL_MS = 200  # B6-interval: storage.wal_sync_interval_ms
# The interval plus one flush, and room for this loaded 2-core machine: the bound the
# interval test of tests/chaos/test_disk_faults.py holds the WAL's fsyncs to.
SYNC_SLACK_MS = 1_000
INTERVAL_ENV = (("DANUBE_STORAGE__WAL_SYNC", "interval"),
                ("DANUBE_STORAGE__WAL_SYNC_INTERVAL_MS", str(INTERVAL_MS)))
RAFT_STORE = "metadata"  # a broker's Raft store: DATA_DIR/metadata (consensus/log_store.py)
REJOIN_DEADLINE_S = 60.0  # R3: the torn node applies what was committed when it came back


class Disks:
    """The WAL of every broker on the faulty layer of tests/chaos/harness/disk.py, by host: one
    control file and one journal each (one broker per host)."""

    def __init__(self, directory: Path, env: Sequence[tuple[str, str]] = ()) -> None:
        self.directory = directory.resolve()
        self.directory.mkdir(parents=True, exist_ok=True)
        self.extra = dict(env)

    def control(self, host: Host | str) -> Path:
        return self.directory / f"{getattr(host, 'name', host)}.control.json"

    def journal(self, host: Host | str) -> Path:
        return self.directory / f"{getattr(host, 'name', host)}.journal"

    def env(self, host: Host) -> dict[str, str]:
        control = self.control(host)
        if not control.exists():
            write_control(control, seed=0, journal=self.journal(host))
        site = self.directory / "site"
        if not (site / "sitecustomize.py").exists():
            site.mkdir(exist_ok=True)
            (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
        path = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH", "")) if p)
        return {"PYTHONPATH": path, CONTROL_ENV: str(control), **self.extra}


# -- B6: every broker loses power at once ----------------------------------------------

def power_loss_all(run: Run) -> None:
    """B6: once 20-80% of the sends are acknowledged, every broker loses power at once
    (kill -9 with the supervisors held; each WAL cut to its fsynced length, on half the
    seeds with a random part of the unsynced tail kept: a torn write); the supervisors
    restart them. The owner at that moment and each journal's last fsync go to the
    notes (the interval variant's window)."""
    disks = run.disks
    assert disks is not None
    at = run.rng.uniform(0.2, 0.8)
    torn = run.rng.random() < 0.5
    run.notes.update(power_loss_at=round(at, 3), torn_tail=torn)
    run.sent_fraction(at)
    run.notes["owner"] = run.owner().name
    last_fsync: dict[str, int | None] = {}

    def cut(broker: Broker) -> str:
        journal = disks.journal(broker.host)
        starts = fsync_starts(journal)
        last_fsync[broker.name] = starts[-1] if starts else None
        report = crash_journal(journal, seed=run.seed, torn_tail=torn)
        return (f"WAL cut to what was fsynced: {report.bytes_dropped} bytes dropped from {report.files_cut}"
                f" files, {len(report.files_removed)} unsynced files removed")

    fault = run.faults.power_loss(run.cluster.brokers, cut)
    run.notes["last_fsync_ns"] = last_fsync
    if last_fsync.get(run.notes["owner"]) is None:  # a power loss without the layer tests nothing
        raise AssertionError(f"the owner {run.notes['owner']} journalled no WAL fsync: is the faulty layer"
                             f" installed (see {disks.directory})? (seed {run.seed})")
    run.notes["power_loss_ns"] = int(fault.started_at * 1e9)


def loss_window(report: Report, ops: list[Op], notes: dict[str, Any], window_ms: float) -> tuple[Report, dict[str, Any]]:
    """B6 with `wal_sync: interval`: a message acknowledged but never delivered is
    excused (`lost_in_window`) only when it was acknowledged after the owner's last WAL
    fsync began and within `window_ms` before the power loss; every other one stays
    lost. The owner's WAL unsynced for longer than `window_ms` at the power loss is a
    failed criterion. With `wal_sync: always` nothing is excused (not called)."""
    outcomes, _ = checkers.send_outcomes(ops)
    acked_ns = {o.message: o.complete_ns for o in outcomes if o.result == "ok" and o.complete_ns is not None}
    delivered: dict[str, set[tuple[str, int]]] = {}
    for op in ops:
        if op.type == "ok" and op.f in ("subscribe", "deliver"):
            seen = delivered.setdefault(str(op.value["subscription"]), set())
            if op.f == "deliver" and op.value.get("producer") is not None:
                seen.add((str(op.value["producer"]), int(op.value["seq"])))
    crash_ns = int(notes["power_loss_ns"])
    last_sync = notes["last_fsync_ns"].get(notes["owner"]) or 0
    since = max(last_sync, crash_ns - int(window_ms * 1e6))
    excused = {(sub, m) for sub, seen in delivered.items() for m in acked_ns.keys() - seen if acked_ns[m] >= since}
    fields = {"lost_in_window": len(excused), "window_ms": window_ms,
              "unsynced_ms_at_loss": round((crash_ns - last_sync) / 1e6) if last_sync else None}
    unsynced_ms = (crash_ns - last_sync) / 1e6 if last_sync else None
    if unsynced_ms is not None and unsynced_ms > window_ms:
        report = dataclasses.replace(report, criteria_failed=report.criteria_failed + 1, findings=(
            *report.findings, f"the owner's WAL went {unsynced_ms:.0f} ms without an fsync before the power loss,"
                              f" past the {window_ms:g} ms window"))
    if excused:
        lost = report.lost - len(excused)
        findings = tuple(f for f in report.findings if lost or "acknowledged messages lost" not in f)
        report = dataclasses.replace(report, lost=lost, findings=(
            *findings, f"{len(excused)} (subscription, message) pairs lost within the interval window (allowed)"))
    return report, fields


# -- R3: a torn Raft log ---------------------------------------------------------------

_BLOCK = 32 * 1024  # LevelDB's log format (doc/log_format.md): 32 KiB blocks,
_HEADER = struct.Struct("<IHB")  # each fragment: crc32c u32 LE, length u16 LE, type u8
_FULL, _FIRST = 1, 2


def last_record(path: Path) -> tuple[int, int] | None:
    """The byte range [start, end) of the last whole record of a LevelDB log file (the
    last write batch), or None when it holds none."""
    data = path.read_bytes()
    position, last = 0, None
    start = 0
    while position + _HEADER.size <= len(data):
        left = _BLOCK - position % _BLOCK
        if left < _HEADER.size:  # a block's trailer: zero padding
            position += left
            continue
        _, length, kind = _HEADER.unpack_from(data, position)
        end = position + _HEADER.size + length
        if kind == 0 or end > len(data):
            break
        if kind in (_FULL, _FIRST):
            start = position
        if kind in (_FULL, 4):  # FULL or LAST ends a record
            last = (start, end)
        position = end
    return last


def tear_raft_log(data_dir: Path, rng: random.Random) -> str:
    """Cut the newest LevelDB log of a dead broker's Raft store inside its last record
    (a write batch: entries, a hard state), as a power loss during that append would."""
    logs = sorted((data_dir / RAFT_STORE / "raft-log").glob("*.log"))
    for path in reversed(logs):
        found = last_record(path)
        if found is not None:
            start, end = found
            keep = rng.randrange(start + 1, end)
            os.truncate(path, keep)
            return f"Raft log {path.name} torn at byte {keep} inside its last record [{start}, {end})"
    return "no Raft log record to tear"


def raft_torn(run: Run) -> None:
    """R3: under the metadata writes, the Raft leader or a follower (drawn from the
    seed) loses power: kill -9 with its supervisor held, the last record of its Raft
    log torn, restart. The cluster must go on (a new leader among the others when the
    leader was hit) and the node rejoin: it applies, within REJOIN_DEADLINE_S, what
    the cluster had committed once it was back (`rejoined` in the notes); its log is
    compared with the others' after the run (`raft_logs_agree`)."""
    writers = [name for name in run.processes if name.startswith("admin-")]
    run.wait(lambda: all(run.acked(w) >= 20 for w in writers), "metadata writes before the power loss")
    leader = run.leader()
    victim = leader if run.rng.random() < 0.5 else run.rng.choice([b for b in run.cluster.brokers if b != leader])
    run.notes.update(leader=leader.name, victim=victim.name, victim_role="leader" if victim == leader else "follower")
    run.faults.power_loss([victim], lambda broker: tear_raft_log(broker.data_dir, run.rng))
    if victim == leader:
        survivors = [b for b in run.cluster.brokers if b != victim]
        run.notes["leaders"] = [leader.name, run.leader(among=survivors).name]
    run.notes["leader_after_heal"] = run.leader().name
    # Rejoined: the torn node applies what the cluster had committed once it was back.
    target = max(v.commit_index for v in asyncio.run(run.cluster.raft_views()).values())
    started = time.monotonic()
    while True:
        view = asyncio.run(run.cluster.raft_views()).get(victim.node_id)
        if view is not None and view.applied_index >= target:
            run.notes["rejoined"] = {"commit_index": target, "seconds": round(time.monotonic() - started, 1)}
            return
        if time.monotonic() - started > REJOIN_DEADLINE_S:
            run.notes["rejoined"] = {"commit_index": target, "problem": f"{victim.name} applied"
                                     f" {None if view is None else view.applied_index} of {target} after"
                                     f" {REJOIN_DEADLINE_S:g} s"}
            return
        time.sleep(0.2)


def raft_logs_agree(brokers: Sequence[Broker], victim: str) -> tuple[list[str], dict[str, Any]]:
    """Every node's Raft log, read back after the cluster is down: no two nodes hold
    different entries at an index where their terms agree (log matching); every index
    from the newest compaction point up to the highest commit index is the same entry
    on a majority (committed entries intact); the torn node holds every index up to its
    own commit index (it rejoined and caught up). The problems found, and the figures
    for the row."""
    from danube_zmq.consensus.log_store import RaftLogStore

    logs: dict[str, dict[int, tuple[int, int, bytes]]] = {}
    commits: dict[str, int] = {}
    firsts: dict[str, int] = {}
    for broker in brokers:
        store = RaftLogStore.open(broker.data_dir / RAFT_STORE)
        try:
            first, last = store.first_index(), store.last_index()
            entries = store.entries(first, last + 1, 1 << 40) if last >= first else []
            logs[broker.name] = {e.index: (e.term, e.kind, e.data) for e in entries}
            commits[broker.name], firsts[broker.name] = store.hard_state().commit_index, first
        finally:
            store.close()
    problems = []
    names = sorted(logs)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            for index in sorted(logs[a].keys() & logs[b].keys()):
                if logs[a][index][0] == logs[b][index][0] and logs[a][index] != logs[b][index]:
                    problems.append(f"{a} and {b} hold different entries at index {index}, term {logs[a][index][0]}")
                    break
    committed = max(commits.values(), default=0)
    majority = len(brokers) // 2 + 1
    for index in range(max(firsts.values(), default=1), committed + 1):
        held = [logs[n][index] for n in names if index in logs[n]]
        if not held or max(held.count(x) for x in held) < majority:
            problems.append(f"committed index {index} (of {committed}) is not the same entry on a majority:"
                            f" {len(held)} nodes hold it")
            break
    torn = logs.get(victim, {})
    missing = [i for i in range(firsts.get(victim, 1), commits.get(victim, 0) + 1) if i not in torn]
    if missing:
        problems.append(f"{victim} lacks {len(missing)} entries of its own committed prefix (e.g. {missing[:5]})")
    figures = {"commit_index": commits, "last_index": {n: max(logs[n], default=0) for n in names},
               "first_index": firsts}
    return problems, figures


def judge_loss_window(run: Run, report: Report, ops: list[Op]) -> tuple[Report, dict[str, Any]]:
    """B6-interval: `loss_window` with the interval plus its slack."""
    return loss_window(report, ops, run.notes, INTERVAL_MS + SYNC_SLACK_MS)


def judge_raft_logs(run: Run, report: Report, ops: list[Op]) -> tuple[Report, dict[str, Any]]:
    """R3: `raft_logs_agree`; each problem is a failed criterion."""
    problems, figures = raft_logs_agree(run.cluster.brokers, run.notes["victim"])
    rejoined = run.notes.get("rejoined", {"problem": "the schedule never checked the rejoin"})
    if "problem" in rejoined:
        problems.append(f"not rejoined: {rejoined['problem']}")
    elif figures["last_index"].get(run.notes["victim"], 0) < rejoined["commit_index"]:
        problems.append(f"{run.notes['victim']}'s log ends below index {rejoined['commit_index']}, which it had applied")
    if problems:
        report = dataclasses.replace(report, criteria_failed=report.criteria_failed + len(problems),
                                     findings=(*report.findings, *problems))
    return report, {"raft_logs": figures}

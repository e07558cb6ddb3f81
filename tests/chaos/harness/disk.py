"""Disk faults for the WAL, in user space: a fault-injecting file layer and power loss.

`FaultyFiles` replaces the WAL's file layer (`danube_zmq.storage.wal.files`) in a test
process or in a broker started by this module's launcher; the product never imports it.

* Seeded faults: `Rule`s fail matching calls with an errno (ENOSPC, EIO, ...) or make a
  write short, after `skip` matching calls, `times` times, each with a `probability`
  drawn from the layer's `random.Random(seed)`: a failing seed replays.
* Power loss (the LazyFS idea): a `Ledger` holds each file's durable length, advanced
  only by an fsync of the file, and whether its directory entry is durable (a file
  created here is not, until its directory is fsynced). `crash` cuts every file to its
  durable length (or leaves a random part of the unsynced tail: a torn write) and
  removes files whose entry never became durable.

A broker process cannot run `crash` on itself after a kill -9, so the ledger also
appends each event to a journal file (JSON lines; a kill -9 keeps the page cache, so
every event written before the kill is read back). The test kills the broker, replays
the journal with `crash_journal` and restarts it.

    python -m tests.chaos.harness.disk broker --control CONTROL.json -- broker start ARGS...
    python -m tests.chaos.harness.disk crash --journal JOURNAL [--seed N] [--torn-tail]

CONTROL.json: `{"seed": 1, "journal": "/path/journal", "rules": [{"op": "fsync",
"error": "EIO", "match": ".wal", "skip": 0, "times": 1}]}`. The broker re-reads it
when it changes (its mtime), so a test arms a fault mid-run by rewriting it (write a
temporary file and rename it over, so a half-written file is never read).

What the model leaves out, on purpose (say so where a result depends on it):
* Overwrites below a file's durable length (the frontier's two slots) are kept by a
  crash, as if durable: the kept value never runs ahead of the fsynced records
  (`frontier.py` writes it after their fsync), so recovery sees what it would see a
  moment after a real crash.
* Renames and directories themselves (mkdir) count as durable at once.
* Only what goes through the WAL's file layer: the metadata store, the catalog and
  cursors live through a crash as through a kill -9.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import random
import shutil
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from danube_zmq.storage.wal import files as wal_files

StrPath = str | os.PathLike[str]
Buffer = bytes | bytearray | memoryview

OPS = ("open", "write", "fsync", "fsync_dir", "truncate", "rename")
SHORT = "short"  # Rule.error for a short write: fewer bytes than asked, no error


@dataclass(frozen=True, slots=True, kw_only=True)
class Rule:
    """Fail (or shorten) calls of `op` on paths containing `match`."""

    op: str
    error: str = "EIO"  # an errno name, or "short" (op "write" only)
    match: str = ""
    skip: int = 0  # matching calls let through before the first fault
    times: int = 1  # faults injected before the rule is spent; 0: no end
    probability: float = 1.0  # of a fault at each matching call after `skip`

    def __post_init__(self) -> None:
        if self.op not in OPS:
            raise ValueError(f"rule op {self.op!r} is not one of {OPS}")
        if self.error == SHORT:
            if self.op != "write":
                raise ValueError("a short result is for op 'write' only")
        elif not isinstance(getattr(errno, self.error, None), int):
            raise ValueError(f"rule error {self.error!r} is not an errno name")
        if self.skip < 0 or self.times < 0 or not 0.0 <= self.probability <= 1.0:
            raise ValueError(f"rule {self}: skip and times >= 0, probability in [0, 1]")

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Rule:
        return cls(**data)


@dataclass(slots=True)
class FileState:
    durable_bytes: int
    entry_durable: bool


@dataclass(frozen=True, slots=True)
class CrashReport:
    files_removed: tuple[str, ...]
    bytes_dropped: int  # unsynced bytes cut from the files kept
    files_cut: int


class Ledger:
    """What a power loss would keep: each file's durable length and whether its entry is
    durable. Events are applied here and, with a journal, appended to it."""

    def __init__(self, journal: Path | None = None) -> None:
        self.files: dict[str, FileState] = {}
        self._lock = threading.Lock()
        self._journal_fd = -1
        if journal is not None:
            self._journal_fd = os.open(journal, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)

    @classmethod
    def replay(cls, journal: Path) -> Ledger:
        ledger = cls()
        if journal.exists():
            for line in journal.read_text().splitlines():
                try:
                    event = json.loads(line)
                except ValueError:
                    continue  # a line cut by the kill: its call had not returned
                ledger._apply(event[0], *event[1:])
        return ledger

    def event(self, kind: str, *args: Any) -> None:
        with self._lock:
            self._apply(kind, *args)
            if self._journal_fd >= 0:
                os.write(self._journal_fd, (json.dumps([kind, *args]) + "\n").encode())

    def _apply(self, kind: str, *args: Any) -> None:
        files = self.files
        if kind == "created":
            files[str(args[0])] = FileState(durable_bytes=0, entry_durable=False)
        elif kind == "known":  # a file that was there before we saw it: durable as found
            files.setdefault(str(args[0]), FileState(durable_bytes=int(args[1]), entry_durable=True))
        elif kind == "synced":
            state = files.setdefault(str(args[0]), FileState(durable_bytes=0, entry_durable=True))
            state.durable_bytes = int(args[1])
        elif kind == "truncated":
            state = files.get(str(args[0]))
            if state is not None:
                state.durable_bytes = min(state.durable_bytes, int(args[1]))
        elif kind == "dir_synced":
            directory = str(args[0])
            for path, state in files.items():
                if os.path.dirname(path) == directory:
                    state.entry_durable = True
        elif kind == "renamed":
            state = files.pop(str(args[0]), None)
            if state is None:
                files.pop(str(args[1]), None)  # untracked: durable as it is
            else:
                files[str(args[1])] = state
        elif kind == "unlinked":
            files.pop(str(args[0]), None)
        else:
            raise ValueError(f"unknown ledger event {kind!r}")

    def close(self) -> None:
        if self._journal_fd >= 0:
            os.close(self._journal_fd)
            self._journal_fd = -1


def crash(ledger: Ledger, rng: random.Random, *, torn_tail: bool = False) -> CrashReport:
    """Power loss: cut every file to its durable length (with `torn_tail`, keep a random
    part of what follows it), remove files whose directory entry never became durable.
    Afterwards the ledger holds every remaining file as durable."""
    removed: list[str] = []
    dropped = 0
    cut = 0
    for path, state in sorted(ledger.files.items()):
        try:
            size = os.path.getsize(path)
        except FileNotFoundError:
            continue
        if not state.entry_durable:
            os.unlink(path)
            removed.append(path)
            continue
        if size > state.durable_bytes:
            keep = state.durable_bytes + (rng.randrange(size - state.durable_bytes + 1) if torn_tail else 0)
            os.truncate(path, keep)
            dropped += size - keep
            cut += 1
    ledger.files = {path: FileState(durable_bytes=os.path.getsize(path), entry_durable=True)
                    for path in ledger.files if os.path.exists(path)}
    return CrashReport(files_removed=tuple(removed), bytes_dropped=dropped, files_cut=cut)


def fsync_starts(journal: Path, suffix: str = ".wal") -> list[int]:
    """When each fsync of a file ending in `suffix` began (`time.monotonic_ns()`), in
    journal order."""
    starts = []
    if journal.exists():
        for line in journal.read_text().splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue  # a line cut by the kill
            if event[0] == "synced" and len(event) > 3 and str(event[1]).endswith(suffix):
                starts.append(int(event[3]))
    return starts


def crash_journal(journal: Path, *, seed: int, torn_tail: bool = False) -> CrashReport:
    """Power loss for a process that wrote `journal` and is dead now (kill -9 first).
    The journal is emptied: every file left is durable, as a restart finds it."""
    report = crash(Ledger.replay(journal), random.Random(seed), torn_tail=torn_tail)
    journal.write_bytes(b"")
    return report


@dataclass(slots=True)
class _Armed:
    rule: Rule
    seen: int = 0
    fired: int = 0


@dataclass(slots=True)
class _Control:
    path: Path
    # (inode, mtime): a control file replaced by a rename is a new inode, even when the
    # coarse file clock gives two quick writes the same mtime.
    version: tuple[int, int] = (-1, -1)


class FaultyFiles(wal_files.FileLayer):
    """The WAL's file layer with seeded faults and a power-loss ledger. Thread-safe
    where the WAL needs it (one writer per file, topics on different threads)."""

    def __init__(self, *, seed: int, rules: Iterable[Rule] = (), journal: Path | None = None,
                 os_fsync: bool = True) -> None:
        self.seed = seed
        # False: fsync only advances the ledger. For in-process power-loss tests, where
        # `crash` is the only power loss and waiting for the disk would only cost time.
        self._os_fsync = os_fsync
        self.rng = random.Random(seed)
        self.ledger = Ledger(journal)
        self._armed = [_Armed(rule) for rule in rules]
        self._paths: dict[int, tuple[str, bool]] = {}  # fd -> (path, is a directory)
        self._lock = threading.Lock()
        self._control: _Control | None = None
        self.injected: list[tuple[str, str, str]] = []  # (op, error, path) of each fault

    @classmethod
    def from_control(cls, control: Path) -> FaultyFiles:
        data = json.loads(control.read_text())
        journal = data.get("journal")
        layer = cls(seed=int(data.get("seed", 0)), journal=Path(journal) if journal else None)
        layer._control = _Control(path=control)
        layer._reload()
        return layer

    def arm(self, rules: Iterable[Rule]) -> None:
        """Replace the rules (counters start again)."""
        with self._lock:
            self._armed = [_Armed(rule) for rule in rules]

    # -- faults ---------------------------------------------------------------------

    def _reload(self) -> None:
        control = self._control
        assert control is not None
        try:
            stat = control.path.stat()
        except FileNotFoundError:
            return
        version = (stat.st_ino, stat.st_mtime_ns)
        if version != control.version:
            control.version = version
            data = json.loads(control.path.read_text())
            self.arm(Rule.from_json(rule) for rule in data.get("rules", []))

    def _fault(self, op: str, path: str) -> str | None:
        """The error to inject on this call (an errno name or SHORT), or None."""
        if self._control is not None:
            self._reload()
        with self._lock:
            for armed in self._armed:
                rule = armed.rule
                if rule.op != op or rule.match not in path or (rule.times and armed.fired >= rule.times):
                    continue
                armed.seen += 1
                if armed.seen <= rule.skip:
                    continue
                if rule.probability < 1.0 and self.rng.random() >= rule.probability:
                    continue
                armed.fired += 1
                self.injected.append((op, rule.error, path))
                return rule.error
        return None

    def _raise(self, error: str, op: str, path: str) -> None:
        code = getattr(errno, error)
        raise OSError(code, f"{os.strerror(code)} (injected by chaos.disk: {op} {path})")

    def _path(self, fd: int) -> str:
        return self._paths.get(fd, ("", False))[0]

    # -- the file layer --------------------------------------------------------------

    def open(self, path: StrPath, flags: int, mode: int = 0o777, *, dir_fd: int | None = None) -> int:
        assert dir_fd is None, "the WAL opens by path"
        name = os.path.abspath(os.fspath(path))
        error = self._fault("open", name)
        if error is not None:
            self._raise(error, "open", name)
        is_directory = bool(flags & os.O_DIRECTORY)
        new = bool(flags & os.O_CREAT) and not os.path.exists(name)
        if new:
            self.ledger.event("created", name)  # before the call: a kill in between leaves no stray file
        fd = os.open(name, flags, mode)
        if not new and not is_directory:
            self.ledger.event("known", name, os.fstat(fd).st_size)
        with self._lock:
            self._paths[fd] = (name, is_directory)
        return fd

    def pwrite(self, fd: int, data: Buffer, position: int) -> int:
        name = self._path(fd)
        error = self._fault("write", name)
        if error == SHORT:
            view = memoryview(data)
            if len(view) > 1:
                return os.pwrite(fd, view[: self.rng.randrange(1, len(view))], position)
        elif error is not None:
            self._raise(error, "write", name)
        return os.pwrite(fd, data, position)

    def fsync(self, fd: int) -> None:
        name, is_directory = self._paths.get(fd, ("", False))
        op = "fsync_dir" if is_directory else "fsync"
        error = self._fault(op, name)
        if error is not None:
            # Nothing becomes durable; Linux may already have dropped the dirty pages.
            self._raise(error, op, name)
        started_ns = time.monotonic_ns()
        if self._os_fsync:
            os.fsync(fd)
        if is_directory:
            self.ledger.event("dir_synced", name)
        elif name:
            # With when the fsync began (CLOCK_MONOTONIC, the same in every process): a
            # test compares it with its acknowledgement times (`fsync_starts`).
            self.ledger.event("synced", name, os.fstat(fd).st_size, started_ns)

    def ftruncate(self, fd: int, length: int) -> None:
        name = self._path(fd)
        error = self._fault("truncate", name)
        if error is not None:
            self._raise(error, "truncate", name)
        os.ftruncate(fd, length)
        if name:
            self.ledger.event("truncated", name, length)

    def close(self, fd: int) -> None:
        with self._lock:
            self._paths.pop(fd, None)
        os.close(fd)

    def replace(self, source: StrPath, target: StrPath) -> None:
        self._move(os.replace, source, target)

    def rename(self, source: StrPath, target: StrPath) -> None:
        self._move(os.rename, source, target)

    def _move(self, call: Callable[[str, str], None], source: StrPath, target: StrPath) -> None:
        src = os.path.abspath(os.fspath(source))
        dst = os.path.abspath(os.fspath(target))
        error = self._fault("rename", src)
        if error is not None:
            self._raise(error, "rename", src)
        call(src, dst)
        self.ledger.event("renamed", src, dst)

    def unlink(self, path: StrPath) -> None:
        name = os.path.abspath(os.fspath(path))
        os.unlink(name)
        self.ledger.event("unlinked", name)

    def copy_file(self, source: StrPath, target: StrPath) -> str:
        dst = os.path.abspath(os.fspath(target))
        self.ledger.event("created", dst)
        return shutil.copyfile(source, dst)

    # -- power loss ------------------------------------------------------------------

    def crash(self, *, torn_tail: bool = False) -> CrashReport:
        """Power loss now, in this process: every descriptor opened through this layer
        is closed (whatever held it is dead from now on), then `crash`."""
        with self._lock:
            fds, self._paths = list(self._paths), {}
        for fd in fds:
            try:
                os.close(fd)
            except OSError:
                pass
        return crash(self.ledger, self.rng, torn_tail=torn_tail)


def write_control(control: Path, *, seed: int, journal: Path, rules: Iterable[Rule] = ()) -> None:
    """Write (or rewrite, arming new rules in a running broker) a launcher's control
    file: a temporary file renamed over it, so the broker never reads half of one."""
    data = {"seed": seed, "journal": str(journal),
            "rules": [{name: getattr(rule, name) for name in Rule.__dataclass_fields__} for rule in rules]}
    temporary = control.with_name(control.name + ".tmp")
    temporary.write_text(json.dumps(data))
    os.replace(temporary, control)


def launcher(control: Path) -> tuple[str, ...]:
    """The interpreter arguments that run `danube ...` under the faulty layer
    (`sys.executable, *launcher(control), "broker", "start", ...`)."""
    return ("-m", "tests.chaos.harness.disk", "broker", "--control", str(control), "--")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos.harness.disk", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    broker = commands.add_parser("broker", help="run `danube ARGS...` with the faulty WAL file layer installed")
    broker.add_argument("--control", type=Path, required=True, help="JSON: seed, journal, rules")
    broker.add_argument("danube_args", nargs=argparse.REMAINDER, help="after --: the danube command line")
    crasher = commands.add_parser("crash", help="power loss for a dead broker: cut its WAL files per the journal")
    crasher.add_argument("--journal", type=Path, required=True)
    crasher.add_argument("--seed", type=int, default=0)
    crasher.add_argument("--torn-tail", action="store_true")
    args = parser.parse_args(argv)
    if args.command == "crash":
        report = crash_journal(args.journal, seed=args.seed, torn_tail=args.torn_tail)
        print(json.dumps({"files_removed": list(report.files_removed), "bytes_dropped": report.bytes_dropped,
                          "files_cut": report.files_cut}))
        return
    danube_args = args.danube_args[1:] if args.danube_args[:1] == ["--"] else args.danube_args
    wal_files.install(FaultyFiles.from_control(args.control))
    from danube_zmq.cli.main import cli

    cli.main(args=danube_args, prog_name="danube")


if __name__ == "__main__":
    main(sys.argv[1:])

"""Histories: what each client process saw, one Jepsen-style operation record a line.

A record is `Op(type, process, f, value, time_ns)`:

- `type`: `invoke` (the call started), `ok` (it took effect), `fail` (it certainly did
  not), `info` (unknown: it may or may not have taken effect, e.g. a timeout, a lost
  connection, a process stopped with the call in flight);
- `process`: the name of the logical client that made it (`producer-0`,
  `consumer-excl-0`, `admin-3`);
- `f`: the operation (`send`, `deliver`, `put`, `get`, `cas`, `delete`, ...);
- `value`: a JSON object; it names the operation instance (a send's `seq`) so an
  invocation and its completion pair up even when many are in flight at once;
- `time_ns`: `time.monotonic_ns()`. CLOCK_MONOTONIC is one clock for the whole machine
  (network namespaces do not isolate time), so records of different processes and the
  harness's fault records compare directly.

Each process appends to its own `<dir>/<process>.jsonl` through a `HistoryWriter`:
bounded in records and bytes (a workload that outruns it gets `ResourceExhausted`,
never a file that fills the disk), buffered, and written to the file by `flush()`.
Workloads flush *before* the effect they record can be observed (a producer flushes its
invocations before sending, a consumer its deliveries before acking), so a process
killed with SIGKILL never leaves an effect its history does not show: the kernel keeps
what was written.

`load_history(dir)` reads every file back in time order; a torn last line (a process
killed mid-write) is dropped, any other bad line is an error naming file and line.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from danube_zmq.transport.errors import InvalidArgument, ResourceExhausted

__all__ = ["TYPES", "HistoryWriter", "Op", "load_history", "pair_ops"]

TYPES = ("invoke", "ok", "fail", "info")


@dataclass(frozen=True, slots=True, kw_only=True)
class Op:
    """One operation record (see the module docstring)."""

    type: str
    process: str
    f: str
    value: Mapping[str, Any] = field(default_factory=dict)
    time_ns: int

    def to_json(self) -> str:
        return json.dumps({"type": self.type, "process": self.process, "f": self.f, "value": dict(self.value),
                           "time": self.time_ns}, separators=(",", ":"), sort_keys=True)

    @classmethod
    def from_json(cls, line: str) -> Op:
        raw = json.loads(line)
        if not isinstance(raw, dict):
            raise InvalidArgument("an op record is a JSON object")
        op = cls(type=raw.get("type"), process=raw.get("process"), f=raw.get("f"), value=raw.get("value", {}),
                 time_ns=raw.get("time"))
        op.validate()
        return op

    def validate(self) -> None:
        if self.type not in TYPES:
            raise InvalidArgument(f"op type must be one of {TYPES}, got {self.type!r}")
        if not isinstance(self.process, str) or not self.process:
            raise InvalidArgument(f"op process must be a non-empty str, got {self.process!r}")
        if not isinstance(self.f, str) or not self.f:
            raise InvalidArgument(f"op f must be a non-empty str, got {self.f!r}")
        if not isinstance(self.value, Mapping):
            raise InvalidArgument(f"op value must be an object, got {self.value!r:.80}")
        if type(self.time_ns) is not int or self.time_ns < 0:
            raise InvalidArgument(f"op time must be a non-negative int (ns), got {self.time_ns!r}")


class HistoryWriter:
    """Appends one process's records to `<directory>/<process>.jsonl`.

    `append` buffers; `flush` writes the buffer to the file (one `write`, no fsync: a
    killed process's records survive in the page cache, and a host crash is not a fault
    the workload processes live through). Past `records_max` records or `bytes_max`
    bytes, `append` raises `ResourceExhausted`."""

    def __init__(self, directory: Path, process: str, *, records_max: int = 1_000_000,
                 bytes_max: int = 256 * 1024 * 1024) -> None:
        if not process or "/" in process or process.startswith("."):
            raise InvalidArgument(f"process name {process!r} is not a plain file name")
        self.process = process
        self.path = Path(directory) / f"{process}.jsonl"
        self.records_max = records_max
        self.bytes_max = bytes_max
        self.records = 0
        self.bytes = 0
        self._buffer: list[str] = []
        self._file: TextIO | None = open(self.path, "a", encoding="utf-8")  # closed by close()

    def append(self, type: str, f: str, value: Mapping[str, Any], time_ns: int) -> Op:
        op = Op(type=type, process=self.process, f=f, value=value, time_ns=time_ns)
        op.validate()
        line = op.to_json() + "\n"
        if self.records >= self.records_max or self.bytes + len(line) > self.bytes_max:
            raise ResourceExhausted(f"history of {self.process}: past records_max={self.records_max} or "
                                    f"bytes_max={self.bytes_max}")
        self.records += 1
        self.bytes += len(line)
        self._buffer.append(line)
        return op

    def flush(self) -> None:
        if self._buffer and self._file is not None:
            self._file.write("".join(self._buffer))
            self._file.flush()
            self._buffer.clear()

    def close(self) -> None:
        if self._file is not None:
            self.flush()
            os.fsync(self._file.fileno())
            self._file.close()
            self._file = None

    def __enter__(self) -> HistoryWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def load_history(directory: Path) -> list[Op]:
    """Every `*.jsonl` of `directory`, merged in time order (ties: by file, then line)."""
    ops: list[tuple[int, str, int, Op]] = []
    for path in sorted(Path(directory).glob("*.jsonl")):
        lines = path.read_text(encoding="utf-8", errors="replace").split("\n")
        torn_tail = not lines[-1]  # a complete file ends with "\n"
        if torn_tail:
            lines.pop()
        for number, line in enumerate(lines, 1):
            try:
                op = Op.from_json(line)
            except (ValueError, InvalidArgument) as exc:
                if number == len(lines) and not torn_tail:
                    break  # the writer was killed mid-line: that record never finished
                raise InvalidArgument(f"{path}:{number}: bad op record: {exc}") from None
            ops.append((op.time_ns, path.name, number, op))
    ops.sort(key=lambda item: item[:3])
    return [op for *_, op in ops]


def pair_ops(ops: Iterable[Op], f: str, key: str) -> tuple[list[tuple[Op, Op | None]], list[Op]]:
    """Pair each `invoke` of `f` with its completion: the next `ok`/`fail`/`info` of the
    same process with the same `value[key]`. Returns (pairs, orphans), pairs in
    invocation order: an invocation with no completion pairs with None (its outcome is
    unknown, as `info`); a completion with no invocation, or an invocation made again
    before the first completed, is an orphan (a bug of the recorder, reported)."""
    open_: dict[tuple[str, Any], int] = {}
    pairs: list[tuple[Op, Op | None]] = []
    orphans: list[Op] = []
    for op in ops:
        if op.f != f:
            continue
        ident = (op.process, _hashable(op.value.get(key)))
        if op.type == "invoke":
            if ident in open_:
                orphans.append(pairs[open_[ident]][0])
            open_[ident] = len(pairs)
            pairs.append((op, None))
        elif ident in open_:
            at = open_.pop(ident)
            pairs[at] = (pairs[at][0], op)
        else:
            orphans.append(op)
    return pairs, orphans


def _hashable(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(_hashable(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _hashable(v)) for k, v in value.items()))
    return value

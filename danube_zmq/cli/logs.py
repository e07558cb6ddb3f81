"""Where log records go: one handler on the root logger, on stderr.

    format text, stderr a terminal  rich (colour, aligned columns)
    format text, stderr a file/pipe one plain line per record: `TIME LEVEL LOGGER: MESSAGE`
    format json                     one JSON object per line (time, level, logger, message[, exc])

A file never gets rich's output: rich wraps at 80 columns when it cannot measure a
terminal, and one record would then span several lines. In a line, newlines of a
message or a traceback are written as `\\n`, so one line is always one record.

`RepeatFilter` lets one warning of a logger and message (numbers folded) through per interval; the
next one let through says how many it held back. The broker sets both from its
`logging:` section (`logging.format`, `logging.repeat_interval_ms`).
"""

from __future__ import annotations

import json
import logging
import re
import sys
import time
from collections import OrderedDict
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

__all__ = ["LOG_FORMATS", "JsonFormatter", "LineFormatter", "RepeatFilter", "setup_logging"]

LOG_FORMATS = ("text", "json")
DEFAULT_REPEAT_INTERVAL_MS = 60_000
# The (logger, template) pairs remembered; past it the least recently logged is forgotten
# (it may then log once more early), so a logger with endless distinct templates costs
# bounded memory.
REPEAT_KEYS_MAX = 1024


def _timestamp(record: logging.LogRecord) -> str:
    return datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class LineFormatter(logging.Formatter):
    """`2026-12-02T05:18:14.123Z WARNING danube_zmq.peers: message`, one line per record."""

    def format(self, record: logging.LogRecord) -> str:
        text = f"{_timestamp(record)} {record.levelname} {record.name}: {record.getMessage()}"
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        if record.stack_info:
            text += "\n" + self.formatStack(record.stack_info)
        return text.replace("\\", "\\\\").replace("\r", "\\r").replace("\n", "\\n")


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, message, and exc (a traceback)."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, object] = {"time": _timestamp(record), "level": record.levelname, "logger": record.name,
                                  "message": record.getMessage()}
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        return json.dumps(out, ensure_ascii=False, default=str)


class RepeatFilter(logging.Filter):
    """Warnings and worse: one record per (logger, level, message with its numbers folded)
    each `interval_ms`. Numbers fold (a peer's port, a count, an id), names do not: the
    first refusal of another principal or topic is always shown.

    A record held back is counted; the next one let through for that key ends with
    `(N more like it in the last S s not shown)`. Below WARNING every record passes
    (debug output is asked for). `interval_ms` 0 lets everything through.
    """

    def __init__(self, interval_ms: int, now_ms: Callable[[], float] | None = None,
                 keys_max: int = REPEAT_KEYS_MAX) -> None:
        super().__init__()
        self.interval_ms = interval_ms
        self._now_ms = now_ms or (lambda: time.monotonic() * 1000)
        self._keys_max = keys_max
        # key -> [when the last record was let through (ms), records held back since]
        self._seen: OrderedDict[tuple[str, int, str], list[float]] = OrderedDict()

    def filter(self, record: logging.LogRecord) -> bool:
        if self.interval_ms <= 0 or record.levelno < logging.WARNING:
            return True
        key = self.key(record)
        now = self._now_ms()
        seen = self._seen.get(key)
        if seen is not None and now - seen[0] < self.interval_ms:
            seen[1] += 1
            return False
        if seen is not None and seen[1]:
            _append(record, f" ({int(seen[1])} more like it in the last {(now - seen[0]) / 1000:.0f} s not shown)")
        self._seen[key] = [now, 0]
        self._seen.move_to_end(key)
        while len(self._seen) > self._keys_max:
            self._seen.popitem(last=False)
        return True


    @staticmethod
    def key(record: logging.LogRecord) -> tuple[str, int, str]:
        return record.name, record.levelno, _DIGITS.sub("#", record.getMessage())


_DIGITS = re.compile(r"\d+")


def _append(record: logging.LogRecord, text: str) -> None:
    """Append `text` to the record's message, whatever its args are."""
    record.msg = record.getMessage() + text
    record.args = None


class _DanubeLogHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """The plain handler the CLI adds (found again by its class). It writes to the
    sys.stderr of the moment, as rich's console does: tests swap the stream."""

    @property  # type: ignore[override]
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:
        pass  # always sys.stderr


def setup_logging(level: str | None, fmt: str = "text", repeat_interval_ms: int = DEFAULT_REPEAT_INTERVAL_MS) -> None:
    """Install (or replace) the CLI's one handler on the root logger.

    `level` None keeps the root logger's level. Leaves any other handler alone (no `basicConfig(force=True)`), so calling the CLI
    in-process, as tests do, does not undo their log capture.
    """
    if fmt not in LOG_FORMATS:
        raise ValueError(f"log format must be one of {', '.join(LOG_FORMATS)}, got {fmt!r}")
    root = logging.getLogger()
    for handler in [h for h in root.handlers if getattr(h, "_danube_cli", False)]:
        root.removeHandler(handler)
    handler: logging.Handler
    if fmt == "text" and sys.stderr.isatty():
        # rich only on a terminal, imported then: a CLI that logs to a file never loads it.
        from rich.logging import RichHandler

        from danube_zmq.cli.output import stderr_console

        handler = RichHandler(console=stderr_console(), show_path=False, markup=False)
    else:
        handler = _DanubeLogHandler()
        handler.setFormatter(JsonFormatter() if fmt == "json" else LineFormatter())
    handler._danube_cli = True  # type: ignore[attr-defined]  # found again and replaced by the next call
    handler.addFilter(RepeatFilter(repeat_interval_ms))
    root.addHandler(handler)
    if level is not None:
        root.setLevel(level.upper())

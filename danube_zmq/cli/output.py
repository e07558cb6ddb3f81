"""Terminal output for the `danube` command: rich tables for people, JSON for programs.

Rules every command follows:

- Results go to stdout; status, progress and errors go to stderr, so that
  `danube consume --json | jq` sees nothing but results.
- Colour is off when the stream is not a terminal or `NO_COLOR` is set (rich
  honours both); `FORCE_COLOR` turns it back on.
- When stdout is not a terminal, tables are plain space-separated columns,
  never wrapped or cut to 80 columns, so that `grep` and `awk` see whole names.
- JSON is one compact document per line (JSON lines).
- Text that comes from the network (payloads, names) is printed without rich
  markup, so a payload like `[bold]` stays as it is.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Sequence
from typing import Any

import click
from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

__all__ = [
    "emit_json",
    "emit_line",
    "emit_table",
    "status",
    "stderr_console",
    "stderr_is_terminal",
    "stdout_console",
]

# Width used for tables when stdout is a pipe or a file: wide enough that rich
# never wraps or truncates a cell.
_PIPE_WIDTH = 10_000


def stdout_console() -> Console:
    """A console on sys.stdout, looked up at each write (tests swap the stream)."""
    if sys.stdout.isatty():
        return Console(highlight=False)
    return Console(highlight=False, width=_PIPE_WIDTH, soft_wrap=True)


def stderr_console() -> Console:
    """A console on sys.stderr, looked up at each write."""
    return Console(stderr=True, highlight=False)


def stderr_is_terminal() -> bool:
    return sys.stderr.isatty()


def status(text: str) -> None:
    """One status line on stderr (plain text, no markup)."""
    click.echo(text, err=True)


def emit_line(text: str) -> None:
    """One result line on stdout, as is."""
    click.echo(text)


def emit_json(value: Any) -> None:
    """One JSON document on one line of stdout."""
    click.echo(json.dumps(value, ensure_ascii=False, separators=(",", ":")))


def emit_table(
    columns: Sequence[str],
    rows: Iterable[Sequence[Any]],
    *,
    title: str | None = None,
) -> None:
    """A table on stdout; cells are shown with str() and no markup; None shows as '-'."""
    console = stdout_console()
    # On a terminal a light frame; in a pipe plain columns, so awk and cut see fields.
    table = Table(
        title=title,
        box=box.SIMPLE_HEAD if console.is_terminal else None,
        pad_edge=console.is_terminal,
        title_justify="left",
        header_style="bold",
    )
    for name in columns:
        table.add_column(name, overflow="fold")
    for row in rows:
        table.add_row(*(_cell(value) for value in row))
    console.print(table)


def _cell(value: Any) -> Text:
    if value is None:
        return Text("-")
    if isinstance(value, (list, tuple)):
        return Text(",".join(str(v) for v in value) or "-")
    return Text(str(value))

"""Seeded repeated runs that CI spreads over consecutive runs (issue 40, item 6).

A parametrized test gives its values with `rotating(values, runs)`: each value lands in
one of `runs` slots (value i in slot i % runs), and a run that rotates keeps the slot
`key % runs` and deselects the others. Every value runs in its own slot, so `runs`
consecutive keys run them all; nothing is dropped, only spread.

The key comes from the environment variable DANUBE_ROTATION:

- unset, empty or `all`: no rotation, every value runs (a plain `pytest -m slow`, and
  `tox -e slow`, which sets `all`);
- `day`: the UTC date, as days since 1970-01-01 (what CI's `tox -e full` sets): the
  same slots all day, the next slots the next day, so CI on `runs` consecutive days
  covers every value;
- an integer: that key, to replay a CI run (its header prints the key it used).

The key is fixed once in the controlling process (pytest_configure), before any
pytest-xdist worker starts, so a run that crosses midnight still agrees on it."""

from __future__ import annotations

import datetime
import os
from collections.abc import Iterable, Sequence

import pytest

ENV = "DANUBE_ROTATION"


def rotating(values: Iterable[object], runs: int) -> list[object]:
    """`values` as pytest params, value i in rotation slot i % runs."""
    return [pytest.param(value, marks=pytest.mark.rotation(slot=i % runs, runs=runs))
            for i, value in enumerate(values)]


def resolve_key(setting: str | None, today: datetime.date | None = None) -> int | None:
    """The rotation key DANUBE_ROTATION names: None for every slot."""
    setting = (setting or "").strip().lower()
    if setting in ("", "all"):
        return None
    if setting == "day":
        today = today or datetime.datetime.now(datetime.UTC).date()
        return (today - datetime.date(1970, 1, 1)).days
    try:
        key = int(setting)
    except ValueError:
        raise pytest.UsageError(f"{ENV}={setting!r}: expected all, day or an integer key") from None
    if key < 0:
        raise pytest.UsageError(f"{ENV}={setting!r}: a key is 0 or more")
    return key


def kept(slot: int, runs: int, key: int | None) -> bool:
    return key is None or key % runs == slot


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "rotation(slot, runs): one of `runs` slots of a seeded repeated run; with "
        f"{ENV} set (day or a key) only slot key % runs runs (tests/rotation.py)")
    key = resolve_key(os.environ.get(ENV))
    if key is not None:
        os.environ[ENV] = str(key)  # fixed now: xdist workers inherit it
    config.stash[_KEY] = key


_KEY = pytest.StashKey[int | None]()


def pytest_report_header(config: pytest.Config) -> str:
    key = config.stash.get(_KEY, None)
    if key is None:
        return f"rotation: every slot ({ENV} unset or all)"
    return f"rotation: key {key} ({ENV}={key} replays this run; {ENV}=all runs every slot)"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    key = config.stash.get(_KEY, None)
    if key is None:
        return
    keep: list[pytest.Item] = []
    drop: list[pytest.Item] = []
    for item in items:
        mark = item.get_closest_marker("rotation")
        (keep if mark is None or kept(mark.kwargs["slot"], mark.kwargs["runs"], key) else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def slots_of(values: Sequence[object], runs: int, key: int) -> list[object]:
    """The values a run with `key` keeps (for the docs and tests of this module)."""
    return [value for i, value in enumerate(values) if kept(i % runs, runs, key)]

"""The log's repeat filter and line formats (cli/logs.py): a warning repeated within the
interval is held back and counted, the next one let through says how many were; a
record is one line whatever its message or traceback holds."""

from __future__ import annotations

import json
import logging
import random

from danube_zmq.cli.logs import JsonFormatter, LineFormatter, RepeatFilter


def _record(template: str, *args: object, name: str = "danube_zmq.peers", level: int = logging.WARNING,
            exc: bool = False) -> logging.LogRecord:
    exc_info = None
    if exc:
        try:
            raise ValueError("boom\nsecond line")
        except ValueError as err:
            exc_info = (type(err), err, err.__traceback__)
    return logging.LogRecord(name, level, __file__, 1, template, args, exc_info)


def test_a_repeated_warning_passes_once_per_interval_and_counts_the_rest() -> None:
    """Randomized: warnings of a few templates and loggers at random times; each passes
    exactly when its key's last pass is an interval old, and the passing one carries the
    number held back since, so that passed + reported == logged for every key."""
    rng = random.Random(38)
    for _ in range(20):
        now = [0.0]
        interval = rng.choice([10, 1000, 60_000])
        flt = RepeatFilter(interval, now_ms=lambda now=now: now[0])
        logged: dict[tuple[str, str], int] = {}
        accounted: dict[tuple[str, str], int] = {}
        last_pass: dict[tuple[str, str], float] = {}
        for _ in range(500):
            now[0] += rng.expovariate(1 / (interval / 7))
            key = (rng.choice(["a", "b"]), rng.choice(["cut %d", "slow %s"]))
            record = _record(key[1], 7, name=key[0])
            logged[key] = logged.get(key, 0) + 1
            expected = key not in last_pass or now[0] - last_pass[key] >= interval
            assert flt.filter(record) is expected
            if expected:
                last_pass[key] = now[0]
                message = record.getMessage()
                held = int(message.split("(", 1)[1].split()[0]) if "more like it" in message else 0
                accounted[key] = accounted.get(key, 0) + 1 + held
        for (name, template), count in logged.items():
            still_held = int(flt._seen[RepeatFilter.key(_record(template, 7, name=name))][1])  # reported next
            assert accounted[(name, template)] + still_held == count


def test_the_count_of_held_back_warnings_is_said_once() -> None:
    now = [0.0]
    flt = RepeatFilter(1000, now_ms=lambda: now[0])
    assert flt.filter(_record("cut %d connections", 1))
    for ms in (100, 200, 300):
        now[0] = ms
        assert not flt.filter(_record("cut %d connections", 2))
    now[0] = 1500
    record = _record("cut %d connections", 3)
    assert flt.filter(record)
    assert record.getMessage() == "cut 3 connections (3 more like it in the last 2 s not shown)"
    now[0] = 2600
    record = _record("cut %d connections", 4)
    assert flt.filter(record) and record.getMessage() == "cut 4 connections"


def test_a_warning_naming_someone_else_is_not_held_back() -> None:
    """Numbers fold, names do not: a refusal of another principal is shown at once."""
    flt = RepeatFilter(60_000, now_ms=lambda: 0.0)
    assert flt.filter(_record("Send from %s refused on %s:%d", "user 't-scope'", "10.0.0.1", 4100))
    assert not flt.filter(_record("Send from %s refused on %s:%d", "user 't-scope'", "10.0.0.1", 4101))
    assert flt.filter(_record("Send from %s refused on %s:%d", "user 'writer'", "10.0.0.1", 4102))


def test_info_and_other_templates_are_never_held_back() -> None:
    flt = RepeatFilter(60_000, now_ms=lambda: 0.0)
    assert all(flt.filter(_record("started %s", i, level=logging.INFO)) for i in range(5))
    assert flt.filter(_record("one %s", 1)) and flt.filter(_record("two %s", 1))
    assert flt.filter(_record("one %s", 1, name="danube_zmq.other"))
    assert all(RepeatFilter(0).filter(_record("one %s", i)) for i in range(5))


def test_the_filter_remembers_a_bounded_number_of_templates() -> None:
    flt = RepeatFilter(60_000, now_ms=lambda: 0.0, keys_max=8)
    for i in range(100):
        flt.filter(_record("template " + "x" * i))  # digits would fold into one key
    assert len(flt._seen) == 8


def test_a_record_is_one_line_in_text_and_in_json() -> None:
    record = _record("line one\nline two %s", "x", exc=True)
    text = LineFormatter().format(record)
    assert "\n" not in text and "line one\\nline two x" in text and "ValueError: boom\\nsecond line" in text
    assert " WARNING danube_zmq.peers: " in text
    line = JsonFormatter().format(record)
    assert "\n" not in line
    parsed = json.loads(line)
    assert parsed["message"] == "line one\nline two x" and "ValueError" in parsed["exc"]
    assert parsed["level"] == "WARNING" and parsed["logger"] == "danube_zmq.peers" and parsed["time"].endswith("Z")

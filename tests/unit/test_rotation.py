"""The rotation of seeded repeated runs (tests/rotation.py): every value runs in exactly
one slot, `runs` consecutive keys cover them all, `all` (or nothing) runs every value,
and the key is the UTC day with `day`."""

from __future__ import annotations

import datetime

import pytest

from tests.paths import ROOT
from tests.rotation import resolve_key, rotating, slots_of


@pytest.mark.parametrize("count, runs", [(10, 5), (5, 5), (7, 3), (1, 4)])
def test_consecutive_keys_cover_every_value_once(count: int, runs: int) -> None:
    values = list(range(100, 100 + count))
    for start in (0, 3, 20_424):
        seen = [v for key in range(start, start + runs) for v in slots_of(values, runs, key)]
        assert sorted(seen) == values


def test_each_run_keeps_one_slot_of_the_values() -> None:
    values = list(range(100, 110))
    assert slots_of(values, 5, 0) == [100, 105]
    assert slots_of(values, 5, 7) == [102, 107]


def test_params_carry_their_slot_and_keep_their_ids() -> None:
    params = rotating(range(100, 104), runs=3)
    assert [p.values for p in params] == [(100,), (101,), (102,), (103,)]
    assert [p.id for p in params] == [None] * 4
    assert [(m.kwargs["slot"], m.kwargs["runs"]) for p in params for m in p.marks] == [(0, 3), (1, 3), (2, 3), (0, 3)]


def test_the_key_is_every_slot_a_day_or_an_integer() -> None:
    assert resolve_key(None) is None and resolve_key("") is None and resolve_key(" All ") is None
    assert resolve_key("day", today=datetime.date(1970, 1, 1)) == 0
    assert resolve_key("day", today=datetime.date(2026, 12, 2)) == 20_789
    assert resolve_key("17") == 17
    for bad in ("tuesday", "-1", "1.5"):
        with pytest.raises(pytest.UsageError, match="DANUBE_ROTATION"):
            resolve_key(bad)


def test_a_rotating_run_deselects_the_other_slots(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    pytester.makeconftest('pytest_plugins = ["tests.rotation"]')
    pytester.makeini("[pytest]\nasyncio_default_fixture_loop_scope = function\n")  # as setup.cfg has it
    pytester.makepyfile(test_seeds='''
import pytest
from tests.rotation import rotating

@pytest.mark.parametrize("seed", rotating(range(100, 110), runs=5))
def test_seed(seed):
    assert seed >= 100

def test_plain():
    pass
''')
    monkeypatch.setenv("PYTHONPATH", str(ROOT))  # `tests.rotation`
    monkeypatch.setenv("DANUBE_ROTATION", "6")
    result = pytester.runpytest_inprocess("-v", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=3, deselected=8)
    result.stdout.fnmatch_lines(["rotation: key 6 *", "*test_seed?101? PASSED*", "*test_seed?106? PASSED*"])
    monkeypatch.setenv("DANUBE_ROTATION", "all")
    pytester.runpytest_inprocess("-p", "no:cacheprovider").assert_outcomes(passed=11)

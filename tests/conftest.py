"""Fixtures shared by every test folder: the object-store emulators (tests/emulators.py),
the rotation of seeded repeated runs across CI runs (tests/rotation.py), pytester (to
test that rotation), the crash runs' one-line reports at the end of a run, and hypothesis
without its per-example deadline: a property test fails on what it checks, never on how
long an example took on a busy 2-core machine (a deadline is a timed unit test)."""

import os

import pytest
from hypothesis import settings

from tests.paths import ROOT

# The chaos harness runs its workers and faulty brokers as `python -m tests.chaos.harness...`:
# every process the tests start finds the checkout's `tests` package.
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)

settings.register_profile("danube", deadline=None)
settings.load_profile("danube")

pytest_plugins = ["tests.emulators", "tests.rotation", "pytester"]

# The kill -9 crash runs (tests/integration/storage/test_reliable_crash.py) print one line each:
# gathered from the tests' captured output and shown at the end, so they are seen with
# pytest-xdist too (which shows no test's output; with -s they print as they run).
_CRASH_RUNS: list[str] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "call":
        _CRASH_RUNS.extend(line for line in report.capstdout.splitlines() if line.startswith("crash run "))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _CRASH_RUNS:
        terminalreporter.section("crash runs")
        for line in _CRASH_RUNS:
            terminalreporter.write_line(line)


@pytest.hookimpl(tryfirst=True)  # before xdist names the groups (`--dist loadgroup`)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The modules with slow, then cluster tests run first: xdist (`--dist loadfile`)
    hands modules out in this order, so the long ones start early and no worker is left
    running one alone at the end (measured: about a minute of one busy core). The chaos
    smoke and the spark suite are a group each, for `--dist loadgroup`: one worker runs
    every Spark test (one JVM) while the other runs the chaos smoke, which waits more
    than it computes (28% of two cores)."""
    rank: dict[str, int] = {}
    for item in items:
        module = item.nodeid.split("::")[0]
        mine = 0 if item.get_closest_marker("slow") else 1 if item.get_closest_marker("cluster") else 2
        rank[module] = min(mine, rank.get(module, 2))
        for suite in ("spark", "chaos_smoke"):
            if item.get_closest_marker(suite):
                item.add_marker(pytest.mark.xdist_group(suite))
    items.sort(key=lambda item: rank[item.nodeid.split("::")[0]])

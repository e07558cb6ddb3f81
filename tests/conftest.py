"""Fixtures shared by every test folder: the object-store emulators (tests/emulators.py),
the rotation of seeded repeated runs across CI runs (tests/rotation.py), pytester (to
test that rotation), the crash runs' one-line reports at the end of a run, and hypothesis
without its per-example deadline: a property test fails on what it checks, never on how
long an example took on a busy 2-core machine (a deadline is a timed unit test)."""

import os
from collections.abc import Iterator

import pytest
from hypothesis import settings

from tests.paths import ROOT
from tests.spark_cluster import SparkCluster

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
# Seconds per test module (setup, call and teardown, as the workers report them): the
# modules that cost CI the most, shown at the end of a run (issue 40: CI minutes per suite).
_MODULE_SECONDS: dict[str, float] = {}
_MODULES_SHOWN = 15


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    module = report.nodeid.split("::")[0]
    _MODULE_SECONDS[module] = _MODULE_SECONDS.get(module, 0.0) + report.duration
    if report.when == "call":
        _CRASH_RUNS.extend(line for line in report.capstdout.splitlines() if line.startswith("crash run "))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _CRASH_RUNS:
        terminalreporter.section("crash runs")
        for line in _CRASH_RUNS:
            terminalreporter.write_line(line)
    if len(_MODULE_SECONDS) > 1:
        total = sum(_MODULE_SECONDS.values())
        terminalreporter.section(f"slowest {_MODULES_SHOWN} modules (of {total:.0f} s in tests)")
        for module, seconds in sorted(_MODULE_SECONDS.items(), key=lambda kv: -kv[1])[:_MODULES_SHOWN]:
            terminalreporter.write_line(f"{seconds:8.1f}s {module}")


@pytest.fixture(scope="session")
def spark_standalone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkCluster]:
    """One Spark standalone cluster per test process (an xdist worker) that asks for it:
    its two JVMs take many seconds to start on a loaded machine. A test that needs to
    know its executors ran there compares `apps` before and after."""
    pytest.importorskip("pyspark")
    cluster = SparkCluster(tmp_path_factory.mktemp("spark-standalone")).start()
    yield cluster
    cluster.stop()


# The markers whose modules xdist hands out first, in this order (the rest after).
_FIRST = (("spark",), ("slow",), ("cluster", "chaos_smoke"))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Modules with spark tests first, then slow, then cluster and chaos-smoke tests:
    xdist (`--dist loadfile`) hands modules out in this order, so the longest start
    early and no worker is left running one alone at the end (measured: the Spark
    pipeline and report modules are the longest, 166-210 s each). Within a rank, collection order."""
    rank: dict[str, int] = {}
    for item in items:
        module = item.nodeid.split("::")[0]
        mine = next((i for i, marks in enumerate(_FIRST) if any(item.get_closest_marker(m) for m in marks)),
                    len(_FIRST))
        rank[module] = min(mine, rank.get(module, len(_FIRST)))
    items.sort(key=lambda item: rank[item.nodeid.split("::")[0]])

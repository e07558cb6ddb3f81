"""Every script in examples/ runs to completion (exit 0) against a real broker."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.paths import ROOT

EXAMPLES_DIR = ROOT / "examples"
# quickstart.py is exercised on its own; every other script is checked here.
EXAMPLES = sorted(p for p in EXAMPLES_DIR.glob("*.py") if p.name != "quickstart.py")
# spark_pipeline.py needs Spark and starts its own broker: the spark suite runs it
# (tests/integration/spark/test_spark_pipeline.py).
AGAINST_A_BROKER = [p for p in EXAMPLES if p.name != "spark_pipeline.py"]
TIMEOUT_S = 60


def test_examples_exist() -> None:
    assert EXAMPLES, f"no examples found in {EXAMPLES_DIR}"


@pytest.mark.parametrize("script", EXAMPLES, ids=lambda p: p.stem)
def test_example_has_a_module_docstring(script: Path) -> None:
    docstring = ast.get_docstring(ast.parse(script.read_text(), filename=str(script)))
    assert docstring and docstring.strip(), f"{script.name} has no module docstring"


@pytest.mark.parametrize("script", AGAINST_A_BROKER, ids=lambda p: p.stem)
def test_example_runs(broker, script: Path) -> None:
    env = {**os.environ, "DANUBE_SERVICE_URL": broker.url, "DANUBE_ADMIN_ENDPOINT": broker.admin_url}
    try:
        result = subprocess.run(
            [sys.executable, str(script), broker.url],
            capture_output=True, text=True, env=env, timeout=TIMEOUT_S, cwd=EXAMPLES_DIR.parent,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{script.name} did not finish within {TIMEOUT_S} s\n"
                    f"--- stdout ---\n{_text(exc.stdout)}\n--- stderr ---\n{_text(exc.stderr)}")
    assert result.returncode == 0, (
        f"{script.name} exited with {result.returncode}\n"
        f"--- stdout ---\n{result.stdout}\n--- stderr ---\n{result.stderr}"
    )


def _text(output: str | bytes | None) -> str:
    """TimeoutExpired carries bytes even with text=True."""
    if isinstance(output, bytes):
        return output.decode(errors="replace")
    return output or ""

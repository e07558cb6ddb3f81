"""The README's "Use it" commands, run as written against a broker on free ports with a
tmp data dir: the backlog report they end with names the reliable topic's subscription
and its backlog (a snapshot of non-reliable topics only would be empty)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

from tests.integration.conftest import start_broker
from tests.paths import ROOT

README = ROOT / "README.md"


def use_it_commands() -> list[list[str]]:
    """The first bash block under "## Use it", comments dropped, as argv lists."""
    section = README.read_text().split("## Use it", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    assert block is not None, "README's Use it section has no bash block"
    return [shlex.split(line, comments=True) for line in block.group(1).splitlines() if line.strip()]


def test_the_readme_flow_ends_with_a_non_empty_backlog_report(tmp_path: Path) -> None:
    commands = use_it_commands()
    assert commands[0][:3] == [".venv/bin/danube", "broker", "start"]
    assert commands[-1][:3] == ["./run", "report", "backlog"]
    broker = start_broker(tmp_path)  # the README's broker start, on free ports
    (tmp_path / "danube-data").symlink_to(tmp_path / "data")  # the default data dir the README reads
    env = {**os.environ, "DANUBE_SERVICE_URL": broker.url, "DANUBE_ADMIN_ENDPOINT": broker.admin_url}
    danube = [sys.executable, "-m", "danube_zmq.cli.main"]
    try:
        for argv in commands[1:]:
            # ./run report installs the report extra first; this venv has what it needs.
            command = danube + (argv[1:] if argv[0] == "./run" else argv[1:] if argv[0] == ".venv/bin/danube" else [])
            assert command != danube, f"README command not understood: {argv}"
            done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
            assert done.returncode == 0, (argv, done.stdout, done.stderr)
    finally:
        assert broker.stop() == 0, broker.log()
    report = done.stdout
    row = next((line for line in report.splitlines() if "billing" in line), None)
    assert row is not None, report
    assert "/default/orders" in row and re.search(r"\b6\b", row), row
    assert "computed by python" in report


def readme_python_snippet() -> str:
    """The Python block under "## Use it", as written."""
    section = README.read_text().split("## Use it", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```python\n(.*?)```", section, re.S)
    assert block is not None, "README's Use it section has no python block"
    return block.group(1)


def test_the_readme_python_snippet_runs_on_a_fresh_broker(tmp_path: Path) -> None:
    """The snippet subscribes before any producer made the topic: on a fresh broker the
    subscription creates it (allow_auto_topic_creation), and the message sent after
    arrives. Run as written, the broker's URL in DANUBE_SERVICE_URL as `cluster up` says."""
    script = tmp_path / "snippet.py"
    script.write_text(readme_python_snippet())
    broker = start_broker(tmp_path)
    try:
        done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True,
                              timeout=60, env={**os.environ, "DANUBE_SERVICE_URL": broker.url})
    finally:
        assert broker.stop() == 0, broker.log()
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip().endswith("b'hello'"), done.stdout

"""docs/security.md's worked example stays true to examples/secured_cluster.sh, the
script a test runs: every command the example shows is in the script as written."""

from __future__ import annotations

import re

from tests.paths import ROOT


def _worked_example() -> str:
    text = (ROOT / "docs" / "security.md").read_text()
    start = text.index("## Worked example: from zero to a secured 3-broker cluster")
    end = text.index("\n## ", start + 1)
    return text[start:end]


def test_every_command_of_the_worked_example_is_in_the_script_a_test_runs() -> None:
    """Each line of the worked example's shell blocks (the YAML block aside) appears,
    stripped, among the lines of examples/secured_cluster.sh (`$DANUBE` there is the
    `danube` command), so a command changed in one place and not the other fails here."""
    script = (ROOT / "examples" / "secured_cluster.sh").read_text().replace("$DANUBE ", "danube ")
    script_lines = {line.strip() for line in script.splitlines()}
    blocks = re.findall(r"```\n(.*?)```", _worked_example(), flags=re.S)
    shown = [line.strip() for block in blocks for line in block.splitlines() if line.strip()]
    assert len(shown) >= 15, shown
    missing = [line for line in shown if line not in script_lines]
    assert not missing, f"in docs/security.md's worked example but not in the script: {missing}"

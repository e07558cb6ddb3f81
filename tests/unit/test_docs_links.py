"""Every relative link of every Markdown file in the checkout leads to a file or folder
that exists: docs move with the code (a folder renamed, a module split) or fail here."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from tests.paths import ROOT

_LINK = re.compile(r"\]\(([^)\s]+)\)")


def markdown_files(root: Path) -> list[Path]:
    listed = subprocess.run(["git", "ls-files", "*.md"], cwd=root, capture_output=True, text=True, check=True)
    return [root / name for name in listed.stdout.split()]


def broken_links(path: Path, root: Path = ROOT) -> list[str]:
    """`file:line: target` of each relative link in `path` that leads nowhere."""
    broken = []
    in_code = False
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if line.lstrip().startswith("```"):
            in_code = not in_code
        if in_code:
            continue
        for target in _LINK.findall(line):
            target = target.split("#", 1)[0]
            if not target or re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("/"):
                continue
            if not (path.parent / target).exists():
                broken.append(f"{path.relative_to(root)}:{number}: {target}")
    return broken


def test_every_relative_link_resolves() -> None:
    files = markdown_files(ROOT)
    assert len(files) > 20
    broken = [link for path in files for link in broken_links(path)]
    assert not broken, "links to nothing:\n" + "\n".join(broken)


def test_a_planted_broken_link_is_named(tmp_path: Path) -> None:
    (tmp_path / "there.md").write_text("x")
    page = tmp_path / "page.md"
    page.write_text("[ok](there.md) [web](https://x.org) [gone](../actors/gone.py#L3)\n```\n[code](nope)\n```\n")
    assert [line.split(": ", 1)[1] for line in broken_links(page, tmp_path)] == ["../actors/gone.py"]


"""The broker actor changes its state only in its handlers (issue 20, broker split parts 2
and 3): `actors/broker*.py` and the modules of the broker's children that carry its
former side jobs hold no `asyncio.Lock`, no `asyncio.sleep` with a nonzero delay (a
sleep loop; timers are messages: `system.schedule_once`) and no `create_task` (a side
task). Every file is parsed (ast, nothing is imported). What still remains is listed in
`ALLOWED` with why; an entry that is no longer found fails too, so the list only shrinks."""

from __future__ import annotations

import ast
from pathlib import Path

ACTORS = Path(__file__).resolve().parents[2] / "actors"
# The broker's children that took over its side tasks (their waits are their own handlers').
CHILDREN = ("hand_over.py", "remote_admin.py", "metadata_watch.py", "cursor_flusher.py")

# (file, enclosing function, what) -> why it is still there.
ALLOWED: dict[tuple[str, str, str], str] = {}


def _what(call: ast.Call) -> str | None:
    func = call.func
    if not isinstance(func, ast.Attribute):
        return None
    if func.attr == "create_task":
        return "create_task"
    if isinstance(func.value, ast.Name) and func.value.id == "asyncio":
        if func.attr == "Lock":
            return "asyncio.Lock"
        if func.attr == "sleep":
            zero = len(call.args) == 1 and isinstance(call.args[0], ast.Constant) and call.args[0].value == 0
            return None if zero else "asyncio.sleep"
    return None


def findings(path: Path) -> list[tuple[str, str, str, int]]:
    """(file, enclosing function, what, line) of each lock, nonzero sleep and task in `path`."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []

    def visit(node: ast.AST, function: str) -> None:
        for child in ast.iter_child_nodes(node):
            name = child.name if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef) else function
            if isinstance(child, ast.Call) and (what := _what(child)) is not None:
                found.append((path.name, function, what, child.lineno))
            visit(child, name)

    visit(tree, "<module>")
    return found


def test_broker_files_hold_no_lock_no_sleep_loop_and_no_side_task_beyond_the_listed() -> None:
    """Every lock, nonzero sleep and `create_task` in actors/broker*.py and `CHILDREN` is in `ALLOWED`
    (named with its file, function and line otherwise), and every entry of `ALLOWED`
    is still there."""
    paths = sorted(ACTORS.glob("broker*.py")) + [ACTORS / name for name in CHILDREN]
    assert len(paths) > len(CHILDREN) and all(path.exists() for path in paths), "actors/broker*.py not found"
    found = [f for path in paths for f in findings(path)]
    unlisted = [f"{file}:{line} {what} in {function}" for file, function, what, line in found
                if (file, function, what) not in ALLOWED]
    assert not unlisted, "the broker changes state outside its handlers:\n" + "\n".join(unlisted)
    stale = set(ALLOWED) - {(file, function, what) for file, function, what, _ in found}
    assert not stale, f"gone from the code, drop them from ALLOWED: {sorted(stale)}"


def test_a_planted_sleep_loop_lock_and_task_are_each_found(tmp_path: Path) -> None:
    """The scan reads the spellings the code uses (no aliases): a planted
    `asyncio.sleep(0.2)`, `asyncio.Lock()` and `loop.create_task(...)` are each named
    with their function; `asyncio.sleep(0)` (a yield) is not."""
    planted = tmp_path / "broker_planted.py"
    planted.write_text(
        "import asyncio\n"
        "class B:\n"
        "    async def retry(self):\n"
        "        while True:\n"
        "            await asyncio.sleep(0.2)\n"
        "    def turn(self):\n"
        "        return asyncio.Lock()\n"
        "    def side(self, loop):\n"
        "        loop.create_task(self.retry())\n"
        "    async def yields(self):\n"
        "        await asyncio.sleep(0)\n")
    assert [(function, what) for _, function, what, _ in findings(planted)] == [
        ("retry", "asyncio.sleep"), ("turn", "asyncio.Lock"), ("side", "create_task")]

"""Actors change their state only in their handlers (DESIGN: timers are messages, no
locks, no side tasks): no module under `actors/` holds an `asyncio.Lock`, an
`asyncio.sleep` with a nonzero delay (a sleep loop; timers are messages:
`system.schedule_once`) or a `create_task` (a side task). Every file is parsed (ast,
nothing is imported). What still remains is listed in `ALLOWED` with why; an entry that
is no longer found fails too, so the list only shrinks. (Until issue 40 this scanned
actors/broker*.py and four of the broker's children only.)"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.paths import PACKAGE

ACTORS = PACKAGE / "actors"

# (file, enclosing function, what) -> why it is still there.
ALLOWED: dict[tuple[str, str, str], str] = {
    ("sockets/gateway.py", "bind_or_close", "asyncio.sleep"): (
        "no actor's loop: a bind retried for up to REBIND_WAIT_S at start, before the socket serves"
        " (a port a stopping broker still holds)"),
}


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


def findings(path: Path, name: str | None = None) -> list[tuple[str, str, str, int]]:
    """(file, enclosing function, what, line) of each lock, nonzero sleep and task in
    `path`; the file is named `name` (its name by default)."""
    name = name or path.name
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []

    def visit(node: ast.AST, function: str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = child.name if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef) else function
            if isinstance(child, ast.Call) and (what := _what(child)) is not None:
                found.append((name, function, what, child.lineno))
            visit(child, inner)

    visit(tree, "<module>")
    return found


def test_actor_modules_hold_no_lock_no_sleep_loop_and_no_side_task_beyond_the_listed() -> None:
    """Every lock, nonzero sleep and `create_task` in actors/ (every module, in every
    folder) is in `ALLOWED` (named with its file, function and line otherwise), and
    every entry of `ALLOWED` is still there."""
    paths = sorted(ACTORS.rglob("*.py"))
    assert len(paths) > 50 and (ACTORS / "broker" / "broker.py") in paths and (ACTORS / "topic" / "shell.py") in paths
    # Named by their path under actors/: topic/shell.py and subscription/shell.py are two files.
    found = [f for path in paths for f in findings(path, str(path.relative_to(ACTORS)))]
    unlisted = [f"{file}:{line} {what} in {function}" for file, function, what, line in found
                if (file, function, what) not in ALLOWED]
    assert not unlisted, "an actor changes state outside its handlers:\n" + "\n".join(unlisted)
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

"""The reliable topic's storage side stays split by job behind a narrow interface
(issue 40, item 2): every module of `actors/topic/wal/` is under 500 lines and its
functions under 70; the topic shell tells storage sides apart by what the interface
declares (`TopicStorage.reliable_log`), never by `isinstance` on a storage; and no
storage module reaches back into the shell (it imports nothing of `shell.py` and
touches no `.shell`: all it may use of its topic is `storage.TopicPort`). Files are
parsed (ast), nothing is imported; each check is also run on a regrown sample, so that
it is known to fail."""

from __future__ import annotations

import ast

from tests.paths import PACKAGE

TOPIC = PACKAGE / "actors" / "topic"
WAL = TOPIC / "wal"
MODULE_LINES_MAX = 500
FUNCTION_LINES_MAX = 70
# The storage sides' modules: the WAL parts and the memory tail.
STORAGE_MODULES = sorted(WAL.glob("*.py")) + [TOPIC / "memory_tail.py"]


def _storage_classes() -> set[str]:
    """Classes defined by the storage sides and their interface: an isinstance on one of
    them in the shell is a reach around the interface."""
    names = set()
    for path in [*STORAGE_MODULES, TOPIC / "storage.py"]:
        tree = ast.parse(path.read_text(), filename=str(path))
        names |= {node.name for node in ast.walk(tree) if isinstance(node, ast.ClassDef)}
    return names


def long_functions(source: str) -> list[tuple[str, int]]:
    tree = ast.parse(source)
    return [(node.name, node.end_lineno - node.lineno + 1) for node in ast.walk(tree)
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            and node.end_lineno is not None and node.end_lineno - node.lineno + 1 > FUNCTION_LINES_MAX]


def storage_isinstance_calls(source: str, classes: set[str]) -> list[str]:
    """The `isinstance(...)` calls in `source` that test a storage side: on anything
    named `storage`, or against a storage class."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "isinstance"):
            continue
        subject = ast.unparse(node.args[0]) if node.args else ""
        kinds = {n.id if isinstance(n, ast.Name) else n.attr for n in ast.walk(node.args[1])
                 if isinstance(n, ast.Name | ast.Attribute)} if len(node.args) > 1 else set()
        if "storage" in subject or kinds & classes:
            found.append(ast.unparse(node))
    return found


def shell_reach_backs(source: str) -> list[str]:
    """Imports of the topic shell's module and uses of a `.shell` attribute."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module is not None and node.module.endswith("topic.shell"):
            found.append(f"from {node.module} import ...")
        elif isinstance(node, ast.Attribute) and node.attr == "shell":
            found.append(ast.unparse(node))
    return found


def test_each_module_of_the_wal_split_is_under_500_lines_and_its_functions_under_70() -> None:
    """Every module of actors/topic/wal/ (the facade included) is under 500 lines, its
    functions under 70: a part that regrows is split again, not let grow."""
    modules = sorted(WAL.glob("*.py"))
    assert {path.name for path in modules} >= {"__init__.py", "commit.py", "reads.py", "retention.py", "cursors.py"}
    assert not (TOPIC / "wal_storage.py").exists(), "the one-file WalStorage is back"
    for path in modules:
        source = path.read_text()
        lines = len(source.splitlines())
        assert lines < MODULE_LINES_MAX, f"{path.name} has {lines} lines (at most {MODULE_LINES_MAX - 1})"
        assert not long_functions(source), f"{path.name}: functions over {FUNCTION_LINES_MAX} lines: " \
                                           f"{long_functions(source)}"
    regrown = "def f() -> None:\n" + "    x = 1\n" * FUNCTION_LINES_MAX
    assert long_functions(regrown) == [("f", FUNCTION_LINES_MAX + 1)]


def test_the_shell_tells_storages_apart_by_the_interface_not_isinstance() -> None:
    """shell.py has no `isinstance(` on its storage or against a storage class (it asks
    `storage.reliable_log`); the check catches the six the shell had before the split."""
    classes = _storage_classes()
    assert {"WalStorage", "MemoryTail", "TopicStorage"} <= classes
    shell = (TOPIC / "shell.py").read_text()
    assert storage_isinstance_calls(shell, classes) == []
    assert storage_isinstance_calls("isinstance(self.storage, WalStorage)\nisinstance(x, storage.MemoryTail)\n"
                                    "isinstance(topic.storage, object)\nisinstance(answer, PersistCursor)\n",
                                    classes) == ["isinstance(self.storage, WalStorage)",
                                                 "isinstance(x, storage.MemoryTail)",
                                                 "isinstance(topic.storage, object)"]


def test_no_storage_module_reaches_back_into_the_shell() -> None:
    """The storage sides use their topic only through `storage.TopicPort`: none imports
    the shell's module or touches a `.shell` attribute."""
    for path in STORAGE_MODULES:
        assert shell_reach_backs(path.read_text()) == [], path.name
    assert shell_reach_backs("from danube_zmq.actors.topic.shell import TopicActor\n"
                             "self.shell.system.tell(x, y)\n") == [
        "from danube_zmq.actors.topic.shell import ...", "self.shell"]

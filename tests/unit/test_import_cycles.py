"""No import cycle among danube_zmq's modules, even inside one folder.

A cycle is what a module-level import cannot load, so it hides as an import inside a
function (`dispatch/rule.py` used to import the concrete rules that import it). Every
import counts here, at module level or inside a function, but for those under
`if TYPE_CHECKING:`: a type hint naming the object that holds this one (a servicer
naming its door) is not loaded at run time. `from package import module` depends on
that module, not on the package's other modules.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.unit.test_import_layers import ROOT, imported, modules


def _runtime_tree(path: Path) -> ast.Module:
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            node.body = [ast.Pass()]
    return tree


def import_graph(root: Path) -> dict[str, set[str]]:
    """Module -> the danube_zmq modules it imports at run time."""
    found = dict(modules(root))
    graph: dict[str, set[str]] = {}
    for module, path in found.items():
        tree = _runtime_tree(path)
        deps = set()
        submodules = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for alias in node.names:
                    if f"{node.module}.{alias.name}" in found:
                        submodules.add((node.module, f"{node.module}.{alias.name}"))
        for target, _line in imported(module, path, tree):
            if target in found:
                deps.add(target)
        for package, submodule in submodules:
            deps.add(submodule)
            if all(sub in found for pkg, sub in submodules if pkg == package):
                deps.discard(package)
        deps.discard(module)
        graph[module] = deps
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_import_cycle() -> None:
    found = cycles(import_graph(ROOT))
    assert not found, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_a_planted_cycle_inside_a_function_is_found(tmp_path: Path) -> None:
    """As `make_rule` was: the cycle closes through an import inside a function; one
    closed only under TYPE_CHECKING is not a cycle."""
    package = tmp_path / "danube_zmq" / "dispatch"
    package.mkdir(parents=True)
    (tmp_path / "danube_zmq" / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "rule.py").write_text("def make():\n    from danube_zmq.dispatch.shared import Shared\n    return Shared\n")
    (package / "shared.py").write_text("from danube_zmq.dispatch.rule import make\n\nShared = make\n")
    (package / "hint.py").write_text(
        "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from danube_zmq.dispatch.door import Door\n")
    (package / "door.py").write_text("from danube_zmq.dispatch import hint\n")
    assert cycles(import_graph(tmp_path)) == [["danube_zmq.dispatch.rule", "danube_zmq.dispatch.shared"]]

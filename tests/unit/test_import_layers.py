"""The import direction: a package imports only packages below it in LAYERS.

Every module under danube_zmq/ is parsed (ast, nothing is imported),
and every `import danube_zmq.x` / `from danube_zmq.x import ...` in it is checked,
including imports inside functions and under TYPE_CHECKING: a lazy import is still a
dependency, only a later one. A package absent from LAYERS fails too, so a new package
has to be placed in the order before it lands.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from tests.paths import ROOT

# Lowest first. A package may import itself and any package of a lower rank; packages of
# one rank are independent of each other. Why this order (docs/architecture.md, Layers):
# the wire format and names are at the bottom; storage and consensus keep bytes and
# metadata without knowing who asks; the client speaks the protocol; the runtime runs
# actors; the broker's actors use all of those; the commands start the broker or a load.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("clock",),                      # danube_zmq/clock.py: time as a dependency, no imports
    ("transport",),                  # protocols, codec, errors, topic names
    ("security",),                   # CURVE keys, JWT tokens, RBAC decisions
    ("storage", "rpc"),              # WAL, durable segments, catalog; a request/reply session with a port
    ("config",),                     # the broker configuration, read by the broker, the doors and the CLI
    ("consensus", "snapshots"),      # Raft metadata store; WAL snapshots
    ("schemas", "report"),           # schema registry; Spark reports of snapshots
    ("client",),                     # the client library
    ("runtime", "doors", "spark"),   # actor system, event loop; the gRPC doors, console and MCP (clients);
                                     # topics as a Spark source and sink (a client)
    ("actors", "loadgen"),           # the broker's actors; the load behind `danube bench`
    ("cli",),                        # the `danube` command
    ("",),                           # danube_zmq/__init__.py: the public facade
)
# Pairs a rank would allow and the design does not: the broker's actors reach other
# brokers through `rpc` (a request/reply session), never through the client library,
# whose adapters (the gRPC doors) live in `doors`.
FORBIDDEN: dict[tuple[str, str], str] = {
    ("actors", "client"): "the actors call peers through danube_zmq.rpc; client adapters live in doors/",
}
RANK = {name: rank for rank, names in enumerate(LAYERS) for name in names}


def layer_of(module: str) -> str | None:
    """`danube_zmq.storage.wal.log` -> `storage`; None outside danube_zmq."""
    parts = module.split(".")
    if parts[0] != "danube_zmq":
        return None
    return parts[1] if len(parts) > 1 else ""


def top_level(root: Path) -> list[str]:
    """The names directly under danube_zmq/: its packages and its top modules (`clock`)."""
    names = []
    for child in sorted((root / "danube_zmq").iterdir()):
        if child.is_dir() and (child / "__init__.py").exists():
            names.append(child.name)
        elif child.suffix == ".py" and child.name != "__init__.py":
            names.append(child.stem)
    return names


def modules(root: Path) -> Iterator[tuple[str, Path]]:
    """(dotted module name, file) of every module of the danube_zmq package."""
    for path in sorted((root / "danube_zmq").rglob("*.py")):
        relative = path.relative_to(root).with_suffix("").parts
        if relative[-1] == "__init__":
            relative = relative[:-1]
        yield ".".join(relative), path


def imported(module: str, path: Path, tree: ast.Module) -> Iterator[tuple[str, int]]:
    """(imported module, line) for every import statement anywhere in the module."""
    is_package = path.name == "__init__.py"
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                base = base[: len(base) - node.level + (1 if is_package else 0)]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            if target == "danube_zmq":  # `from danube_zmq import storage` names a package,
                for alias in node.names:  # `from danube_zmq import DanubeClient` the facade
                    named = f"danube_zmq.{alias.name}"
                    yield (named if layer_of(named) in RANK else target), node.lineno
            else:
                yield target, node.lineno


def violations(root: Path) -> list[str]:
    """Every import of a package from a package not below it, as `file:line: ...`."""
    found = []
    for module, path in modules(root):
        source = layer_of(module)
        if source not in RANK:
            found.append(f"{path.relative_to(root)}: package {source!r} is not placed in LAYERS")
            continue
        tree = ast.parse(path.read_text(), filename=str(path))
        for target_module, line in imported(module, path, tree):
            target = layer_of(target_module)
            if target is None or target == source:
                continue
            if target not in RANK:
                found.append(f"{path.relative_to(root)}:{line}: imports {target_module}, "
                             f"of a package not placed in LAYERS")
                continue
            if (source, target) in FORBIDDEN:
                found.append(f"{path.relative_to(root)}:{line}: {source} imports {target_module}: "
                             f"{FORBIDDEN[source, target]}")
                continue
            if RANK[target] >= RANK[source]:
                found.append(f"{path.relative_to(root)}:{line}: {source or 'danube_zmq'} (layer "
                             f"{RANK[source]}) imports {target_module} ({target or 'danube_zmq'}, "
                             f"layer {RANK[target]}): a layer imports only layers below it")
    return found


def test_no_package_imports_a_package_at_or_above_its_layer() -> None:
    """Lower layers never import higher ones (storage never imports actors, the runtime
    never imports the broker's actors, ...); the message names each offending file:line."""
    found = violations(ROOT)
    assert not found, "imports against the layer order:\n" + "\n".join(found)


def test_a_planted_upward_import_is_named_with_its_file_and_line(tmp_path: Path) -> None:
    """The checker is not vacuous: a copy of the layout where storage imports the
    broker's actors (inside a function, as lazy imports are) fails with that file:line."""
    package = tmp_path / "danube_zmq"
    for name in ("storage", "actors"):
        (package / name).mkdir(parents=True)
        (package / name / "__init__.py").write_text("")
    (package / "actors" / "broker.py").write_text("from danube_zmq.storage import wal\n")
    (package / "storage" / "wal.py").write_text(
        '"""A WAL."""\n\n\ndef f():\n    from danube_zmq.actors.broker.broker import Broker\n    return Broker\n')
    assert violations(tmp_path) == [
        f"danube_zmq/storage/wal.py:5: storage (layer {RANK['storage']}) imports danube_zmq.actors.broker.broker"
        f" (actors, layer {RANK['actors']}):"
        " a layer imports only layers below it"]


def test_every_package_has_a_place_in_the_order() -> None:
    """A package added under danube_zmq/ without a layer fails, rather than escape the check."""
    unplaced = set(top_level(ROOT)) - set(RANK)
    assert unplaced == set()

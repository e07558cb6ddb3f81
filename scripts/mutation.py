"""Mutation testing of the pure cores: does each core's test suite notice a one-token bug?

For each core (its source files and the unit tests that exercise them), this script
parses the sources with `ast`, lists every place a small bug could be planted, takes a
seeded sample, and for each sampled mutant in turn writes the mutated module over the
original file (restored afterwards, whatever happens), runs the core's tests in a
subprocess with a timeout, and records KILLED (a test failed), TIMEOUT or SURVIVED.
The Raft core's survivors then meet a fast simulator run too (seeded chaos, safety
invariants at every step). Score = (killed + timeouts) / (mutants - equivalent ones).

Mutations, one at a time: comparisons flipped and shifted at the boundary (`<` <-> `<=`,
`==` <-> `!=`, `is` <-> `is not`, `in` <-> `not in`), `and` <-> `or`, `+` <-> `-`,
integer constants +1 / -1, True <-> False, `not x` -> `x`, and deletion of a simple
statement (assignment, call, return, raise, del, continue, break). Asserts, docstrings,
log calls and annotations are left alone. Equivalent mutants (no behaviour can tell
them apart) are listed with a reason in scripts/mutation_skip.txt.

    python scripts/mutation.py                     # every core, 150 mutants each, seed 19
    python scripts/mutation.py raft --sample 0     # every mutant of the Raft core
    python scripts/mutation.py wal --list          # the mutants, without running them

Run through `tox -e mutation` (not in tox's env_list, nor in .ci/run: it takes minutes).
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SKIP_FILE = ROOT / "scripts" / "mutation_skip.txt"


@dataclasses.dataclass(frozen=True)
class Core:
    name: str
    sources: tuple[str, ...]
    tests: tuple[str, ...]
    simulator: bool = False  # survivors also meet the Raft simulator


CORES = {
    core.name: core
    for core in (
        Core("raft", ("danube_zmq/consensus/raft/core.py",),
             ("tests/unit/consensus/raft/test_raft_core.py", "tests/unit/consensus/raft/test_raft_core_edges.py",
              "tests/unit/consensus/raft/test_raft_recovery.py"),
             simulator=True),
        Core("dispatch", tuple(f"danube_zmq/actors/dispatch/{n}.py" for n in ("rule", "exclusive", "failover", "shared",
                                                                     "key_shared", "tracker")),
             ("tests/unit/actors/dispatch/test_dispatch_rules.py", "tests/unit/actors/dispatch/test_delivery_tracker.py",
              "tests/unit/actors/dispatch/test_tracker_set_policy.py")),
        Core("wal", ("danube_zmq/storage/wal/format.py",),
             ("tests/unit/storage/wal/test_wal_format.py", "tests/unit/storage/wal/test_wal_log.py")),
        Core("load", ("danube_zmq/actors/load/placement.py", "danube_zmq/actors/load/rebalance.py"),
             ("tests/unit/actors/load/test_load_manager.py",)),
    )
}
# Seeded chaos runs: ~1 s, and they catch what the example tests miss in the Raft core.
SIMULATOR_COMMAND = ("-m", "danube_zmq.consensus.simulator", "--seeds", "24", "--ticks", "300")

_FLIP = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq, ast.NotEq: ast.Eq,
         ast.Is: ast.IsNot, ast.IsNot: ast.Is, ast.In: ast.NotIn, ast.NotIn: ast.In}
_SWAP = {ast.Lt: ast.Gt, ast.LtE: ast.GtE, ast.Gt: ast.Lt, ast.GtE: ast.LtE}
_SYMBOL = {ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!=", ast.Is: "is",
           ast.IsNot: "is not", ast.In: "in", ast.NotIn: "not in"}
_DELETABLE = (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Expr, ast.Return, ast.Raise, ast.Delete, ast.Continue,
              ast.Break)


@dataclasses.dataclass(frozen=True)
class Mutant:
    path: str
    node: int  # index in ast.walk order of the pristine tree
    op: str  # what to do to that node (see _apply)
    arg: int  # operand index / statement index
    line: int
    description: str
    scope: str = ""  # the enclosing function or class, dotted

    def key(self, source_lines: list[str]) -> str:
        """Stable across edits elsewhere in the file: path | scope | source line | change."""
        return f"{self.path} | {self.scope} | {source_lines[self.line - 1].strip()} | {self.description}"


def _parents(tree: ast.AST) -> dict[int, ast.AST]:
    out = {}
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            out[id(child)] = node
    return out


def _skipped_subtrees(tree: ast.AST) -> set[int]:
    """Nodes never mutated: asserts, annotations, docstrings, log calls, __slots__."""
    skip: set[int] = set()

    def mark(node: ast.AST | None) -> None:
        if node is not None:
            skip.update(id(n) for n in ast.walk(node))

    for node in ast.walk(tree):
        if isinstance(node, ast.Assert):
            mark(node)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            mark(node.returns)
            for a in [*node.args.args, *node.args.kwonlyargs, *node.args.posonlyargs]:
                mark(a.annotation)
        elif isinstance(node, ast.AnnAssign):
            mark(node.annotation)
        elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            mark(node)
        elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
            func = node.value.func
            if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id in ("log", "logger"):
                mark(node)
        elif isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__slots__" for t in node.targets):
            mark(node)
        elif isinstance(node, ast.JoinedStr):
            mark(node)
    return skip


def mutants_of(path: str) -> list[Mutant]:
    source = (ROOT / path).read_text()
    tree = ast.parse(source)
    skip = _skipped_subtrees(tree)
    parents = _parents(tree)
    out: list[Mutant] = []
    for i, node in enumerate(ast.walk(tree)):
        if id(node) in skip:
            continue
        line = getattr(node, "lineno", 0)
        names, up = [], parents.get(id(node))
        while up is not None:
            if isinstance(up, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.append(up.name)
            up = parents.get(id(up))
        scope = ".".join(reversed(names))

        def add(op: str, arg: int, description: str, at: int = line, index: int = i, where: str = scope) -> None:
            out.append(Mutant(path, index, op, arg, at, description, where))

        if isinstance(node, ast.Compare):
            for k, cmp in enumerate(node.ops):
                flip = _FLIP.get(type(cmp))
                if flip is not None:
                    add("flip", k, f"{_SYMBOL[type(cmp)]} -> {_SYMBOL[flip]}")
                swap = _SWAP.get(type(cmp))
                if swap is not None:
                    add("swap", k, f"{_SYMBOL[type(cmp)]} -> {_SYMBOL[swap]}")
        elif isinstance(node, ast.BoolOp):
            add("boolop", 0, "and -> or" if isinstance(node.op, ast.And) else "or -> and")
        elif isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub)):
            add("binop", 0, "+ -> -" if isinstance(node.op, ast.Add) else "- -> +")
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            add("not", 0, "not x -> x")
        elif isinstance(node, ast.Constant) and type(node.value) is bool:
            add("bool", 0, f"{node.value} -> {not node.value}")
        elif isinstance(node, ast.Constant) and type(node.value) is int:
            add("int", 1, f"{node.value} -> {node.value + 1}")
            add("int", -1, f"{node.value} -> {node.value - 1}")
        for field in ("body", "orelse", "finalbody"):
            body = getattr(node, field, None)
            if not isinstance(body, list):
                continue
            for k, stmt in enumerate(body):
                if isinstance(stmt, _DELETABLE) and id(stmt) not in skip:
                    text = ast.unparse(stmt).splitlines()[0][:60]
                    holder = getattr(node, "name", None) if isinstance(
                        node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) else None
                    where = f"{scope}.{holder}".lstrip(".") if holder else scope
                    add(f"delete:{field}", k, f"delete `{text}`", stmt.lineno, where=where)
    return out


def _apply(source: str, mutant: Mutant) -> str:
    tree = ast.parse(source)
    node = list(ast.walk(tree))[mutant.node]
    op = mutant.op
    if op == "flip":
        node.ops[mutant.arg] = _FLIP[type(node.ops[mutant.arg])]()
    elif op == "swap":
        node.ops[mutant.arg] = _SWAP[type(node.ops[mutant.arg])]()
    elif op == "boolop":
        node.op = ast.Or() if isinstance(node.op, ast.And) else ast.And()
    elif op == "binop":
        node.op = ast.Sub() if isinstance(node.op, ast.Add) else ast.Add()
    elif op == "not":
        parent = _parents(tree)[id(node)]
        for field, value in ast.iter_fields(parent):
            if value is node:
                setattr(parent, field, node.operand)
            elif isinstance(value, list):
                value[:] = [node.operand if v is node else v for v in value]
    elif op == "bool":
        node.value = not node.value
    elif op == "int":
        node.value = node.value + mutant.arg
    elif op.startswith("delete:"):
        body = getattr(node, op.split(":", 1)[1])
        old = body[mutant.arg]
        body[mutant.arg] = ast.copy_location(ast.Pass(), old)
    else:  # pragma: no cover
        raise ValueError(op)
    ast.fix_missing_locations(tree)
    return ast.unparse(tree)


def _load_skips() -> dict[str, str]:
    skips: dict[str, str] = {}
    if SKIP_FILE.exists():
        for raw in SKIP_FILE.read_text().splitlines():
            if not raw.strip() or raw.lstrip().startswith("#"):
                continue
            key, _, reason = raw.rpartition(" # ")
            skips[key.strip()] = reason.strip()
    return skips


def _run(args: list[str], timeout_s: float) -> str:
    """'killed', 'survived' or 'timeout' for one test run against the current files."""
    with tempfile.TemporaryDirectory(prefix="mutation-pyc-") as pyc:
        env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "PYTHONPYCACHEPREFIX": pyc}
        process = subprocess.Popen([sys.executable, *args], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            code = process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            return "timeout"
    return "survived" if code == 0 else "killed"


def _pytest(core: Core) -> list[str]:
    return ["-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *core.tests]


def run_core(core: Core, sample: int, seed: int, timeout_factor: float, listing: bool) -> dict[str, object]:
    skips = _load_skips()
    originals = {path: (ROOT / path).read_text() for path in core.sources}
    lines = {path: text.splitlines() for path, text in originals.items()}
    everything = [m for path in core.sources for m in mutants_of(path)]
    # Draw from every mutant, then drop the equivalent ones: listing one more in the skip
    # file leaves the rest of a seed's sample as it was, so scores before and after compare.
    rng = random.Random(f"{seed}:{core.name}")
    drawn = everything if sample <= 0 or sample >= len(everything) else rng.sample(everything, sample)
    equivalent = [m for m in drawn if m.key(lines[m.path]) in skips]
    chosen = [m for m in drawn if m.key(lines[m.path]) not in skips]
    chosen.sort(key=lambda m: (m.path, m.line, m.description))
    if listing:
        for m in chosen:
            print(f"{m.path}:{m.line}: {m.description}")
        return {"core": core.name, "mutants": len(chosen)}
    began = time.monotonic()
    if _run(_pytest(core), 600) != "survived":
        raise SystemExit(f"{core.name}: the tests fail on the unmutated code; fix that first")
    baseline_s = time.monotonic() - began
    timeout_s = max(20.0, baseline_s * timeout_factor)
    counts = {"killed": 0, "timeout": 0, "survived": 0, "killed_by_simulator": 0}
    survivors: list[Mutant] = []
    restore = dict(originals)

    def put_back(*_: object) -> None:
        for path, text in restore.items():
            (ROOT / path).write_text(text)

    previous = signal.signal(signal.SIGTERM, lambda *a: (put_back(), sys.exit(143)))
    try:
        for n, m in enumerate(chosen, 1):
            mutated = _apply(originals[m.path], m)
            if mutated == ast.unparse(ast.parse(originals[m.path])):
                continue
            (ROOT / m.path).write_text(mutated)
            try:
                outcome = _run(_pytest(core), timeout_s)
                if outcome == "survived" and core.simulator:
                    if _run(list(SIMULATOR_COMMAND), timeout_s) != "survived":
                        outcome = "killed_by_simulator"
            finally:
                (ROOT / m.path).write_text(originals[m.path])
            counts[outcome] += 1
            if outcome == "survived":
                survivors.append(m)
            print(f"  [{n}/{len(chosen)}] {outcome:>19}  {m.path}:{m.line}: {m.description}", flush=True)
    finally:
        put_back()
        signal.signal(signal.SIGTERM, previous)
    total = sum(counts.values())
    detected = total - counts["survived"]
    score = detected / total if total else 1.0
    print(f"\n{core.name}: {detected}/{total} killed ({score:.0%}): {counts['killed']} by the tests, "
          f"{counts['killed_by_simulator']} by the simulator, {counts['timeout']} timeouts, {counts['survived']} "
          f"survived; {len(equivalent)} of the {len(drawn)} drawn equivalent, skipped; {len(everything)} mutants in all, "
          f"{time.monotonic() - began:.0f} s")
    for m in survivors:
        print(f"  SURVIVED {m.key(lines[m.path])}")
    return {"core": core.name, "score": score, "total": total, "survivors": len(survivors),
            "equivalent": len(equivalent), **counts}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("cores", nargs="*", help=f"cores to mutate: {', '.join(CORES)} (default: all)")
    parser.add_argument("--tests", nargs="+", default=None, help="run these test files instead of the core's")
    parser.add_argument("--sample", type=int, default=150,
                        help="mutants drawn per core, equivalent ones then skipped (0: all)")
    parser.add_argument("--seed", type=int, default=19)
    parser.add_argument("--timeout-factor", type=float, default=5.0, help="per-mutant timeout, x the clean run")
    parser.add_argument("--list", action="store_true", help="list the sampled mutants, run nothing")
    parser.add_argument("--fail-under", type=float, default=0.0, help="exit 1 if a core scores below this (0..1)")
    args = parser.parse_args(argv)
    unknown = [name for name in args.cores if name not in CORES]
    if unknown:
        parser.error(f"unknown core {unknown[0]!r}; choose from {', '.join(CORES)}")
    cores = [CORES[name] for name in (args.cores or list(CORES))]
    if args.tests:
        cores = [dataclasses.replace(core, tests=tuple(args.tests)) for core in cores]
    results = [run_core(core, args.sample, args.seed, args.timeout_factor, args.list) for core in cores]
    if args.list:
        return 0
    print(f"\nseed {args.seed}, {args.sample or 'all'} mutants drawn per core; score = killed / non-equivalent")
    print("core       score  killed/total  survived  equivalent")
    for r in results:
        print(f"{r['core']:<10} {r['score']:>5.0%}  {r['total'] - r['survivors']:>6}/{r['total']:<5}  {r['survivors']:>8}  "
              f"{r['equivalent']:>10}")
    return 1 if any(r["score"] < args.fail_under for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())

"""The broker actor keeps one job, lifecycle and routing (STYLE.md 5, issue 40): its other
jobs are children (policy keeper, registry admin, hand-overs, watches) and composed
helpers (admin, files, damage, parked requests). These fail when it regrows: a base
class besides `Actor` (a mixin spreads one object over files), or a class of 700 lines
or more (several jobs again). The scan covers every actor class under actors/."""

from __future__ import annotations

import ast
import inspect

from danube_zmq.actors.broker.broker import BrokerActor
from danube_zmq.runtime.actor import Actor
from tests.paths import PACKAGE

ACTORS = PACKAGE / "actors"
LINES_MAX = 700


def test_the_broker_actor_has_no_base_but_the_actor_base() -> None:
    assert BrokerActor.__bases__ == (Actor,)


def test_the_broker_actor_class_stays_under_700_lines() -> None:
    lines = len(inspect.getsource(BrokerActor).splitlines())
    assert lines < LINES_MAX, f"BrokerActor is {lines} lines: give a job of it a child actor or a helper"


def test_no_actor_class_under_actors_mixes_anything_in() -> None:
    """An actor class (one that names `Actor` among its bases) names nothing else."""
    mixed = []
    for path in sorted(ACTORS.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                bases = [ast.unparse(base) for base in node.bases]
                if "Actor" in bases and bases != ["Actor"]:
                    mixed.append(f"{path.relative_to(ACTORS)}: {node.name}({', '.join(bases)})")
    assert mixed == []

"""The metadata store's local-read API (`local_get`, `local_scan`, `local_revision`,
`local_events_since`) and the rule that only consensus/ reaches into the Raft peer's
state machine: everything else reads the local replica through the store."""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path

from danube_zmq.consensus.metadata_store import embedded_store
from tests.paths import PACKAGE, ROOT

_CONSENSUS = PACKAGE / "consensus"


def _peer_state_reaches(path: Path) -> list[str]:
    """`<x>.peer.state` or `peer.state` in the file, as "path:line"."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if not isinstance(node, ast.Attribute) or node.attr != "state":
            continue
        owner = node.value
        if (isinstance(owner, ast.Attribute) and owner.attr == "peer") or (
                isinstance(owner, ast.Name) and owner.id == "peer"):
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def test_no_module_outside_consensus_reads_the_peer_state() -> None:
    """Every module outside consensus/ (tests aside) reads the local replica through
    `RaftMetadataStore.local_*`: an AST walk finds no `.peer.state` (the broker reached
    into it 16 times). The walk itself is checked on a planted line, so it cannot pass
    by finding nothing."""
    paths = [path for folder in (PACKAGE, ROOT / "benchmarks", ROOT / "examples", ROOT / "scripts")
             for path in sorted(folder.rglob("*.py")) if not path.is_relative_to(_CONSENSUS)]
    assert len(paths) > 250
    reaches = [reach for path in paths for reach in _peer_state_reaches(path)]
    assert reaches == []


def test_the_peer_state_check_finds_a_planted_reach(tmp_path: Path) -> None:
    """The walk of the test above flags both shapes of the reach it forbids."""
    planted = ROOT / "tests" / "unit" / f"_planted_{tmp_path.name}.py"
    planted.write_text("def f(store, peer):\n    return store.peer.state.get('k'), peer.state.revision\n")
    try:
        assert len(_peer_state_reaches(planted)) == 2
    finally:
        planted.unlink()


def test_local_reads_see_the_store_s_own_writes(tmp_path: Path) -> None:
    """A write through the store is applied locally before it returns: `local_get`,
    `local_scan` (in key order) and `local_revision` show it at once, and
    `local_events_since` lists the events after a revision under a prefix only."""

    async def run() -> None:
        async with embedded_store(tmp_path) as store:
            before = store.local_revision()
            await store.put("/a/2", b"two")
            await store.put("/a/1", b"one")
            await store.put("/b/1", b"other")
            value = store.local_get("/a/1")
            assert value is not None and value.value == b"one"
            assert store.local_get("/a/3") is None
            assert [(k, v.value) for k, v in store.local_scan("/a/")] == [("/a/1", b"one"), ("/a/2", b"two")]
            assert store.local_revision() == before + 3
            assert [e.key for e in store.local_events_since("/a/", before)] == ["/a/2", "/a/1"]
            assert store.running and store.is_leader and store.batch_keys_max > 0

    asyncio.run(run())

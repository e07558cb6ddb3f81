"""Disaster recovery (issue 19, section 3): `force_new_cluster` turns one stopped member of
a cluster that lost its quorum into a single-voter cluster, from its own log store,
keeping every entry; restarted from that store, the Raft core leads alone at once."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from danube_zmq.consensus.log_store import RaftLogStore
from danube_zmq.consensus.raft import Apply, ProposalResult, Propose, RaftConfig, RaftNode, Restore, Role, bootstrap
from danube_zmq.consensus.raft import force_new_cluster as new_cluster_entry
from danube_zmq.consensus.recovery import force_new_cluster
from danube_zmq.consensus.types import Entry, EntryKind, HardState, Membership, SnapshotMeta
from danube_zmq.transport.errors import FailedPrecondition, InvalidArgument


def _member_of_three(path: Path, node_id: int = 2, committed: int = 4, last: int = 6, term: int = 3) -> None:
    """A stopped voter of {1, 2, 3}: the bootstrap entry, then commands 2..last of `term`,
    of which it knows `committed` are committed."""
    boot = bootstrap([1, 2, 3])
    with RaftLogStore.open(path) as store:
        store.node_id(lambda: node_id)
        store.append(boot.entries, hard_state=boot.hard_state)
        store.append([Entry(index=i, term=term, kind=EntryKind.COMMAND, data=b"c%d" % i) for i in range(2, last + 1)],
                     hard_state=HardState(term=term, voted_for=1, commit_index=committed))


def _restart(path: Path, node_id: int) -> tuple[RaftNode, list]:
    with RaftLogStore.open(path) as store:
        hs = store.hard_state()
        entries = store.entries(store.first_index(), store.last_index() + 1, 1 << 40)
    node = RaftNode(RaftConfig(node_id=node_id), random.Random(node_id))
    return node, node.step(Restore(hard_state=hs, entries=entries))


def test_a_recovered_member_leads_alone_with_its_whole_log(tmp_path: Path) -> None:
    """Node 2 of three, the others lost: after recovery its store names it the only voter
    in a new term, every earlier entry is kept and committed (the two it did not know
    committed included), and restarted it leads at once and commits a new proposal alone."""
    _member_of_three(tmp_path)
    report = force_new_cluster(tmp_path)
    assert report.changed and report.node_id == 2
    assert report.previous == Membership(voters=[1, 2, 3], learners=[])
    assert (report.config_index, report.term, report.committed_before, report.forced_commits) == (7, 4, 4, 2)
    with RaftLogStore.open(tmp_path) as store:
        assert store.membership() == Membership(voters=[2], learners=[])
        assert store.hard_state() == HardState(term=4, voted_for=None, commit_index=7)
        assert store.last_index() == 7 and store.term_of(6) == 3
    node, fx = _restart(tmp_path, 2)
    assert node.role is Role.LEADER and node.term == 5
    applied = [e.index for effect in fx if isinstance(effect, Apply) for e in effect.entries]
    assert applied == list(range(1, 9))  # the old log, the new config, the leader's NOOP
    fx = node.step(Propose(request_id=1, data=b"after"))
    (result,) = [e for e in fx if isinstance(e, ProposalResult)]
    assert result.error is None and node.commit_index == result.index


def test_recovery_is_idempotent(tmp_path: Path) -> None:
    """Run twice (an operator retrying): the second run finds the sole voter and writes nothing."""
    _member_of_three(tmp_path)
    first = force_new_cluster(tmp_path)
    second = force_new_cluster(tmp_path, node_id=2)
    assert first.changed and not second.changed and second.config_index == 0
    with RaftLogStore.open(tmp_path) as store:
        assert store.last_index() == first.config_index


def test_recovery_refuses_another_members_store_an_empty_one_and_a_running_one(tmp_path: Path) -> None:
    """Clear errors, nothing written: a node id that is not the store's, a store with no
    log, and a store a running peer holds open (the LevelDB lock)."""
    _member_of_three(tmp_path / "a")
    with pytest.raises(FailedPrecondition, match="belongs to raft node 2"):
        force_new_cluster(tmp_path / "a", node_id=3)
    with pytest.raises(FailedPrecondition, match="no raft node id"):
        force_new_cluster(tmp_path / "empty")
    with pytest.raises(FailedPrecondition, match="no raft log"):
        force_new_cluster(tmp_path / "empty", node_id=1)
    with RaftLogStore.open(tmp_path / "a"), pytest.raises(FailedPrecondition):
        force_new_cluster(tmp_path / "a")
    with RaftLogStore.open(tmp_path / "a") as store:
        assert store.membership() == Membership(voters=[1, 2, 3], learners=[])


def test_recovery_after_a_snapshot_compacted_the_whole_log(tmp_path: Path) -> None:
    """A store whose log was compacted away behind a snapshot recovers too: the new
    configuration entry follows the snapshot's index, in a term past the snapshot's."""
    _member_of_three(tmp_path, committed=6)
    with RaftLogStore.open(tmp_path) as store:
        meta = SnapshotMeta(last_index=6, last_term=3, membership=Membership(voters=[1, 2, 3], learners=[]))
        store.save_snapshot(meta, b"state")
        store.compact(6, 3)
        assert store.last_index() == 6
    report = force_new_cluster(tmp_path)
    assert report.config_index == 7 and report.forced_commits == 0
    with RaftLogStore.open(tmp_path) as store:
        assert store.membership() == Membership(voters=[2], learners=[])


def test_the_new_cluster_entry_is_past_every_known_term() -> None:
    """The pure part: the term is one past the larger of the hard state's and the last
    entry's; the entry follows the log and is committed; a bad node id is refused."""
    entry, hs = new_cluster_entry(3, HardState(term=5, voted_for=1, commit_index=2), 9, 4)
    assert (entry.index, entry.term, entry.kind) == (10, 6, EntryKind.CONFIG)
    assert hs == HardState(term=6, voted_for=None, commit_index=10)
    entry, hs = new_cluster_entry(3, HardState(term=2, voted_for=None, commit_index=2), 9, 7)
    assert entry.term == hs.term == 8
    with pytest.raises(InvalidArgument):
        new_cluster_entry(0, HardState(term=1, voted_for=None, commit_index=1), 1, 1)

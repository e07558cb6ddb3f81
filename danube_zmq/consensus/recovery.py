"""Disaster recovery of the metadata cluster: one surviving member becomes a cluster of one.

When a quorum of voters is lost for good (disks gone, or a membership change that left
the cluster without a reachable majority), no leader can ever be elected again. Like
etcd's `--force-new-cluster`, `force_new_cluster(data_dir)` rewrites the membership in
one stopped member's own log store: it appends a configuration entry naming that member
as the only voter (no learners), in a term past every term it knew, and marks its whole
log committed. Started again, the member leads at once, with its log and state intact.
Others rejoin from empty data dirs as learners (`add-node`, then `promote-node`).

Run offline: `danube admin cluster recover --data-dir DIR`, or `danube broker start
--force-new-cluster`. The LevelDB lock refuses a store a running broker holds.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from danube_zmq.consensus.log_store import RaftLogStore
from danube_zmq.consensus.raft.core import force_new_cluster as _new_cluster_entry
from danube_zmq.consensus.types import Membership
from danube_zmq.transport.errors import FailedPrecondition

__all__ = ["RecoveryReport", "force_new_cluster"]


@dataclass(frozen=True, slots=True, kw_only=True)
class RecoveryReport:
    node_id: int
    previous: Membership | None  # the membership the store held before
    changed: bool  # False: it already was the only voter, nothing was written
    term: int  # the term the member restarts in
    config_index: int  # index of the new configuration entry (0 if unchanged)
    committed_before: int  # the commit index the store had recorded
    forced_commits: int  # entries after it that were not known committed and now are


def force_new_cluster(data_dir: str | Path, node_id: int | None = None) -> RecoveryReport:
    """Make the stopped Raft member stored in `data_dir` (a broker's `data_dir/metadata`)
    the sole voter of a new configuration; see the module docstring."""
    store = RaftLogStore.open(Path(data_dir))
    try:
        stored = _stored_node_id(store)
        if stored is None and node_id is None:
            raise FailedPrecondition(f"{data_dir} holds no raft node id; pass the member's node id")
        if stored is not None and node_id is not None and stored != node_id:
            raise FailedPrecondition(f"{data_dir} belongs to raft node {stored}, not {node_id}")
        member = stored if stored is not None else node_id
        assert member is not None
        hs = store.hard_state()
        previous = store.membership()
        if previous is None or (store.last_index() == 0 and hs.term == 0):
            raise FailedPrecondition(f"{data_dir} holds no raft log to recover from")
        if previous.voters == [member] and not previous.learners:
            return RecoveryReport(node_id=member, previous=previous, changed=False, term=hs.term, config_index=0,
                                  committed_before=hs.commit_index, forced_commits=0)
        entry, new_hs = _new_cluster_entry(member, hs, store.last_index(), store.last_term())
        store.append([entry], hard_state=new_hs)
        store.node_id(lambda: member)
        return RecoveryReport(node_id=member, previous=previous, changed=True, term=new_hs.term,
                              config_index=entry.index, committed_before=hs.commit_index,
                              forced_commits=max(0, entry.index - 1 - hs.commit_index))
    finally:
        store.close()


def _stored_node_id(store: RaftLogStore) -> int | None:
    def absent() -> int:
        raise LookupError  # no node id file: do not create one

    try:
        return store.node_id(absent)
    except LookupError:
        return None

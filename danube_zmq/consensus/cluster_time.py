"""Cluster time: the clock Raft TTLs (broker leases, load reports) run on.

No node's wall clock decides when a lease ends (the chaos scenario R4 stepped one by
30 s and every lease expired at once). As in etcd, the leader keeps lease time on its
monotonic clock:

- the leader stamps every `PutWithTtl` and `ExpireTtlKeys` as it appends them with
  `base + (monotonic_now - monotonic_at_base)`;
- on winning an election `base` is the log's time (the state machine's `ttl_clock_ms`:
  the highest stamp applied), so time stands still between the old leader's last stamp
  and the new leader's first one, and the new leader's no-op restarts every TTL from
  there (`MetadataStateMachine.note_new_leader`): a leader change only makes leases
  longer;
- a stamp applied that is ahead of this reckoning (entries of an earlier term applied
  late) moves it forward: stamps in the log never go back (the state machine also
  counts a stamp below its time as its time).

A follower keeps the same reckoning from the stamps it applies (a lease renewal every
few seconds): `now_ms` is then an estimate of the leader's time, good for saying when a
lease ends, never used to expire anything. "Did that broker renew lately" is not judged
on cluster time (it stands still through an election): each node judges it on its own
monotonic clock (consensus/renewals.py). Before any stamp exists (a new cluster) the
wall clock seeds it: nothing has a TTL yet.

Pure: the caller passes every reading of its injected clock.
"""

from __future__ import annotations

__all__ = ["ClusterTime"]


class ClusterTime:
    """One node's reckoning of cluster time (see the module docstring)."""

    __slots__ = ("_at_ms", "_base_ms", "_term")

    def __init__(self) -> None:
        self._base_ms: int | None = None  # cluster time at monotonic `_at_ms` (None: no reckoning yet)
        self._at_ms = 0
        self._term = 0  # the term this node leads with its reckoning (0: not leading)

    def now_ms(self, monotonic_ms: int) -> int | None:
        """Cluster time now (None: no stamp seen and never led)."""
        if self._base_ms is None:
            return None
        return self._base_ms + max(0, monotonic_ms - self._at_ms)

    def lead(self, term: int, log_time_ms: int, monotonic_ms: int, wall_ms: int) -> int:
        """Cluster time for a leader of `term`; the first call of a term restarts it at the
        log's time (the wall clock only when the log has no stamp yet)."""
        if term != self._term:
            self._term = term
            self._base_ms, self._at_ms = (log_time_ms if log_time_ms > 0 else max(0, wall_ms)), monotonic_ms
        self.observe(log_time_ms, monotonic_ms)
        now = self.now_ms(monotonic_ms)
        assert now is not None
        return now

    def observe(self, log_time_ms: int, monotonic_ms: int) -> None:
        """The state machine's time after an apply: cluster time is at least that."""
        now = self.now_ms(monotonic_ms)
        if log_time_ms > 0 and (now is None or log_time_ms > now):
            self._base_ms, self._at_ms = log_time_ms, monotonic_ms

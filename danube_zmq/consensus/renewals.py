"""When this node last saw each TTL key renewed, on its own monotonic clock.

"Did that broker renew its lease lately?" (the load manager's suspects, redirects, move
targets) is a local judgement, not a replicated one, so it reads no cluster time: cluster
time (consensus/cluster_time.py) stands still from a dead leader's last stamp until the
new leader's first, and the new leader's no-op renews every TTL. Judged on it, a dead
leader looked alive for as long as the election took.

A renewal counts from when its log entry reached this node (appended by the leader,
received by a follower), not from when it applied: the dead leader's last renewal may
commit only with the new leader's no-op, after the election. An entry applied with no
arrival seen (replayed at start, or from a snapshot) counts from when it applied: a node
that just started calls every owner alive for half a TTL, never dead too early.

Pure: the caller passes every reading of its injected clock. Bounded by the caller:
arrivals are dropped once their index applied (`applied_upto`), keys with `retain`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

__all__ = ["Renewals"]


class Renewals:
    """One node's record of TTL renewals (see the module docstring)."""

    __slots__ = ("_arrived", "_renewed")

    def __init__(self) -> None:
        self._arrived: dict[int, int] = {}  # log index of a TTL put -> when it reached this node's log
        self._renewed: dict[str, int] = {}  # key -> when its last renewal reached this node

    def __len__(self) -> int:
        return len(self._renewed)

    def arrived(self, index: int, monotonic_ms: int) -> None:
        """Log entry `index`, a TTL put, reached this node's log (a later entry at the same
        index, after a truncation, replaces it)."""
        self._arrived[index] = monotonic_ms

    def applied(self, index: int, key: str, monotonic_ms: int) -> None:
        """Log entry `index` renewed `key` as it applied now."""
        self._renewed[key] = self._arrived.pop(index, monotonic_ms)

    def applied_upto(self, index: int) -> None:
        """Every entry up to `index` applied: arrivals there that renewed nothing (a
        rejected put, an entry truncated away) are dropped."""
        if self._arrived and min(self._arrived) <= index:
            self._arrived = {i: at for i, at in self._arrived.items() if i > index}

    def restored(self, keys: Iterable[str], index: int, monotonic_ms: int) -> None:
        """The state became a snapshot's, up to log entry `index`, holding TTL `keys`:
        their renewals count from now (when they happened is not in the snapshot)."""
        self._renewed = dict.fromkeys(keys, monotonic_ms)
        self.applied_upto(index)

    def age_ms(self, key: str, monotonic_ms: int) -> int:
        """How long ago `key`'s last renewal reached this node (a key never seen renewed
        here counts from this first question)."""
        return max(0, monotonic_ms - self._renewed.setdefault(key, monotonic_ms))

    def retain(self, keep: Callable[[str], bool]) -> None:
        """Forget the keys `keep` rejects (deleted, expired, no TTL any more)."""
        self._renewed = {key: at for key, at in self._renewed.items() if keep(key)}

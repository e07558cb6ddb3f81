"""Delayed-delivery index: the pure core that holds Pulsar-style delayed messages in bounded RAM.

A message published with a delivery time (`deliver_at_ms`) waits in this index until a
subscription's clock passes that time. Holding 10 million of them as Python objects
would need gigabytes, so, like Pulsar's `BucketDelayedDeliveryTracker`, the index keeps
only what may be due soonest in RAM and spills the rest as sorted runs:

    add --> open bucket (a heap in RAM)
              | reaches open_entries_max: seal
              v
            run = the bucket sorted, written through the `RunStore` port;
            only its first `segment_entries` entries stay in RAM (its "segment")
              | the entries of a run's segment have all been popped
              v
            its next segment is read from the store; a run read to its end is deleted

Entries are `(deliver_at_ms, offset)`, offsets unique (topic offsets), ordered by
`(deliver_at_ms, offset)`. Every entry of a run not yet read sorts after the entries
of that run in RAM, so the smallest entry held is the smallest of the open bucket and
of a heap over the runs' segments in RAM: `next_due` is O(1), `pop_due` O(k log n).

Bounds (STYLE 10), with R = ceil(entries_max / open_entries_max):
    - at most R runs: when a seal makes R + 1, the two runs holding the fewest entries
      are merged into one (read whole, merged, written back: they hold at most
      2 * open_entries_max entries together, so a merge costs at most twice the seal
      that caused it). Without merging, runs popped down to a few entries each would
      pile up, each with a segment in RAM (Pulsar merges buckets for the same reason).
      `drop_below` rewrites a run in place of the old one, never adding one.
    - RAM: at most open_entries_max + R * segment_entries entries (plus the list
      `pop_due` returns), whatever `entries_max` is; 65_536 + 153 * 1_024 (about 220k
      entries) for 10 million.
    - `entries_max`: the caller checks `room()` before `add` (backpressure is the
      caller's: the subscription stops reading delayed messages from the log).

No I/O of its own (the runs go through the injected `RunStore`; the shell's is a
scratch directory, see `actors/subscription/delayed_spill.py`), no clock (times are
arguments), no randomness. The index starts empty and clears the store: it is rebuilt
from the topic's log at every start.
"""

from __future__ import annotations

import heapq
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Protocol

__all__ = ["DelayedIndex", "RunStore"]


class RunStore(Protocol):
    """Where sealed runs go: numbered, immutable sequences of sorted entries."""

    def write(self, run_id: int, entries: Sequence[tuple[int, int]]) -> None:
        """Store `entries` (already sorted) as run `run_id`."""

    def read(self, run_id: int, start: int, count: int) -> list[tuple[int, int]]:
        """Entries `start .. start + count - 1` of run `run_id` (fewer at its end)."""
        ...

    def delete(self, run_id: int) -> None:
        """Forget run `run_id` (a missing run is fine)."""

    def clear(self) -> None:
        """Forget every run."""


@dataclass(slots=True)
class _Run:
    run_id: int
    size: int  # entries written to the store
    read_end: int  # entries read from the store so far: the next segment starts here
    loaded: int  # entries read and not yet popped or dropped: in the heap
    min_offset: int  # a lower bound of the offsets it still holds: its lowest when written

    def remaining(self) -> int:
        return self.loaded + self.size - self.read_end


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class DelayedIndex:
    """Delayed entries `(deliver_at_ms, offset)`, popped in that order once due; see the module docstring."""

    def __init__(
        self, *, store: RunStore, entries_max: int, open_entries_max: int = 65_536, segment_entries: int = 1_024
    ) -> None:
        for name, value in (
            ("entries_max", entries_max),
            ("open_entries_max", open_entries_max),
            ("segment_entries", segment_entries),
        ):
            assert _is_int(value) and value >= 1, (name, value)
        self.entries_max = entries_max
        self.open_entries_max = open_entries_max
        self.segment_entries = segment_entries
        # ceil(entries_max / open_entries_max): see "Bounds" in the module docstring.
        self.runs_max = -(-entries_max // open_entries_max)
        self._store = store
        self._open: list[tuple[int, int]] = []  # heap of (deliver_at_ms, offset)
        self._heap: list[tuple[int, int, int]] = []  # heap of (deliver_at_ms, offset, run_id): runs' segments
        self._runs: dict[int, _Run] = {}
        self._next_run_id = 0
        self._count = 0
        store.clear()

    # -- reading ---------------------------------------------------------------

    def __len__(self) -> int:
        """Entries held, in RAM or spilled, not yet popped or dropped."""
        return self._count

    def room(self) -> int:
        """How many entries `add` may still take."""
        return self.entries_max - self._count

    def runs(self) -> int:
        """Runs in the store now (at most `runs_max`)."""
        return len(self._runs)

    def memory_entries(self) -> int:
        """Entries in RAM now: the open bucket and the runs' segments."""
        return len(self._open) + len(self._heap)

    def next_due(self) -> tuple[int, int] | None:
        """The smallest entry `(deliver_at_ms, offset)`, None when empty."""
        if self._open and (not self._heap or self._open[0] < self._heap[0]):
            return self._open[0]
        if self._heap:
            deliver_at_ms, offset, _ = self._heap[0]
            return deliver_at_ms, offset
        return None

    def low_offset(self) -> int | None:
        """A lower bound of the lowest offset held, None when empty: a retention floor.

        Exact over the entries in RAM; for the part of a run not read yet, the lowest
        offset it had when written (conservative: those entries may be gone since).
        O(entries in RAM + runs): for a retention pass, not for every message.
        """
        lows = [run.min_offset for run in self._runs.values() if run.read_end < run.size]
        if self._open:
            lows.append(min(entry[1] for entry in self._open))
        if self._heap:
            lows.append(min(entry[1] for entry in self._heap))
        return min(lows) if lows else None

    # -- writing ---------------------------------------------------------------

    def add(self, deliver_at_ms: int, offset: int) -> None:
        """Hold `offset` until `deliver_at_ms`; the caller checked `room()`."""
        assert _is_int(deliver_at_ms) and _is_int(offset), (deliver_at_ms, offset)
        assert self._count < self.entries_max, "add without room(): the caller applies backpressure"
        heapq.heappush(self._open, (deliver_at_ms, offset))
        self._count += 1
        if len(self._open) >= self.open_entries_max:
            self._seal()

    def pop_due(self, now_ms: int, limit: int) -> list[tuple[int, int]]:
        """Up to `limit` entries with deliver_at_ms <= now_ms, ascending; they leave the index."""
        assert _is_int(now_ms) and _is_int(limit) and limit >= 0, (now_ms, limit)
        due: list[tuple[int, int]] = []
        open_, heap = self._open, self._heap
        while len(due) < limit:
            # (t, o) < (t, o, run_id) compares t, then o: offsets are unique, so the run id never decides.
            if open_ and (not heap or open_[0] < heap[0]):
                if open_[0][0] > now_ms:
                    break
                due.append(heapq.heappop(open_))
            elif heap:
                if heap[0][0] > now_ms:
                    break
                deliver_at_ms, offset, run_id = heapq.heappop(heap)
                due.append((deliver_at_ms, offset))
                self._popped_from(self._runs[run_id])
            else:
                break
        self._count -= len(due)
        return due

    def drop_below(self, offset_end: int) -> int:
        """Remove every entry with offset < `offset_end`; returns how many were removed.

        For expired messages (a TTL) or ones the log no longer holds. A run whose lowest
        offset when written is at or above `offset_end` is not touched. Any other run is
        read whole; when it loses entries it is written again under a new id (or deleted,
        emptied), else only its lowest offset is brought up to date. Rare; I/O in
        proportion to the runs touched.
        """
        assert _is_int(offset_end), offset_end
        before = self._count
        kept_open = [entry for entry in self._open if entry[1] >= offset_end]
        if len(kept_open) < len(self._open):
            heapq.heapify(kept_open)
            self._open = kept_open
        touched = [run for run in self._runs.values() if run.min_offset < offset_end]
        changed: dict[int, list[tuple[int, int]]] = {}
        for run_id, entries in self._entries_of(touched).items():
            kept = [entry for entry in entries if entry[1] >= offset_end]
            if len(kept) < len(entries):
                changed[run_id] = kept
            else:
                self._runs[run_id].min_offset = min(entry[1] for entry in entries)
        if changed:
            self._remove(changed)
            for kept in changed.values():
                if kept:
                    self._write_run(kept)
        self._count = len(self._open) + sum(run.remaining() for run in self._runs.values())
        return before - self._count

    def clear(self) -> None:
        """Forget every entry and every run."""
        self._open = []
        self._heap = []
        self._runs = {}
        self._count = 0
        self._store.clear()

    # -- runs ------------------------------------------------------------------

    def _seal(self) -> None:
        entries = sorted(self._open)
        self._open = []
        self._write_run(entries)
        if len(self._runs) > self.runs_max:
            self._merge_smallest()

    def _write_run(self, entries: list[tuple[int, int]]) -> None:
        """Write sorted `entries` as a new run and load its first segment."""
        assert entries
        run_id = self._next_run_id
        self._next_run_id += 1
        self._store.write(run_id, entries)
        run = _Run(run_id, len(entries), 0, 0, min(entry[1] for entry in entries))
        self._runs[run_id] = run
        self._load_segment(run)

    def _load_segment(self, run: _Run) -> None:
        count = min(self.segment_entries, run.size - run.read_end)
        assert count > 0 and run.loaded == 0, run
        segment = self._store.read(run.run_id, run.read_end, count)
        assert len(segment) == count, (run, len(segment))
        run.read_end += count
        run.loaded = count
        heap, run_id = self._heap, run.run_id
        for deliver_at_ms, offset in segment:
            heapq.heappush(heap, (deliver_at_ms, offset, run_id))

    def _popped_from(self, run: _Run) -> None:
        """One of `run`'s entries in RAM left: load its next segment, or delete it read to its end."""
        run.loaded -= 1
        if run.loaded:
            return
        if run.read_end < run.size:
            self._load_segment(run)
        else:
            del self._runs[run.run_id]
            self._store.delete(run.run_id)

    def _entries_of(self, runs: Sequence[_Run]) -> dict[int, list[tuple[int, int]]]:
        """The entries each of `runs` holds, sorted: those in RAM, then the rest read whole."""
        held: dict[int, list[tuple[int, int]]] = {run.run_id: [] for run in runs}
        if held:
            for deliver_at_ms, offset, run_id in self._heap:
                if run_id in held:
                    held[run_id].append((deliver_at_ms, offset))
        for run in runs:
            entries = held[run.run_id]
            entries.sort()  # entries in RAM sort before every entry not read yet
            if run.read_end < run.size:
                entries += self._store.read(run.run_id, run.read_end, run.size - run.read_end)
        return held

    def _remove(self, run_ids: Collection[int]) -> None:
        """Take runs out of the heap, the index and the store."""
        kept = [entry for entry in self._heap if entry[2] not in run_ids]
        heapq.heapify(kept)
        self._heap = kept
        for run_id in run_ids:
            del self._runs[run_id]
            self._store.delete(run_id)

    def _merge_smallest(self) -> None:
        """Merge the two runs holding the fewest entries into one: `runs_max` holds again."""
        held = self._entries_of(sorted(self._runs.values(), key=_Run.remaining)[:2])
        self._remove(held)
        self._write_run(sorted(entry for entries in held.values() for entry in entries))

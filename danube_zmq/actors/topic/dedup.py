"""Producer deduplication (pure): the sequence ids a reliable topic has taken, per
producer name, so that a message sent again is answered with its first offset and
stored once (Pulsar's message deduplication).

A producer numbers its messages (`Send.sequence_ids`, strictly increasing within a
batch and across batches). The table keeps, per producer name:

- `pushed`: the highest id accepted (queued, being written or written);
- `persisted`: the highest id committed (written, and fsynced with `wal_sync: always`);
- the offsets of its last `window` committed messages, as runs of consecutive ids at
  consecutive offsets (one run per batch of automatic ids), to answer a message sent
  again with the offset it was stored at (-1 past the window, as Pulsar answers every
  duplicate);
- when it last sent or attached: a producer gone longer than `inactivity_ms` is
  forgotten (Pulsar's brokerDeduplicationProducerInactivityTimeoutMinutes), and past
  `producers_max` names the least recently active is.

Durability: every record carries its id (`format.py`, `sequence_id`), written in the
same append as the message, so the log is the truth. The topic writes the table
(`encode`) in the WAL as a checkpoint after the batches of each flush while it changed,
tagged with the committed offset it covers (`as_of`); a restart, kill -9 or local move
takes the newest one and replays the records after it (`replay`), and the last
`window` records before it for the offsets. Nothing here does I/O.
"""

from __future__ import annotations

import itertools
import operator
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from itertools import islice

import msgpack

from danube_zmq.transport.errors import InvalidArgument, Unavailable

__all__ = ["DedupTable"]


@dataclass(slots=True)
class _Producer:
    pushed: int
    persisted: int
    active_ms: int
    # (first id, last id, first offset): committed ids at consecutive offsets, oldest first.
    runs: deque[tuple[int, int, int]] = field(default_factory=deque)
    in_window: int = 0  # messages the runs cover


class DedupTable:
    def __init__(self, *, window: int, producers_max: int, inactivity_ms: int) -> None:
        assert window >= 1 and producers_max >= 1 and inactivity_ms >= 1
        self.window = window
        self.producers_max = producers_max
        self.inactivity_ms = inactivity_ms
        self._producers: dict[str, _Producer] = {}
        self.changed = False  # since the last `encode`
        self.evicted = 0  # producers forgotten for the bound (not for inactivity)

    def __len__(self) -> int:
        return len(self._producers)

    def last_sequence_id(self, name: str) -> int:
        """The highest id of `name` stored (-1: none known)."""
        producer = self._producers.get(name)
        return -1 if producer is None else producer.persisted

    def duplicates(self, name: str, ids: Sequence[int]) -> int:
        """How many of a batch's leading ids were taken already (they are not stored
        again); the rest are new. Raises InvalidArgument for ids that do not increase,
        and Unavailable when a duplicate's first copy is still being written (sent again
        once it is, it is answered with its offset)."""
        if any(map(operator.ge, ids, islice(ids, 1, None))):  # in C: a batch may hold thousands
            later, earlier = next((b, a) for a, b in itertools.pairwise(ids) if b <= a)
            raise InvalidArgument(f"sequence ids must increase within a batch: {later} follows {earlier}")
        if ids and ids[0] < 0:
            raise InvalidArgument(f"a sequence id must be at least 0, got {ids[0]}")
        producer = self._producers.get(name)
        if producer is None:
            return 0
        count = 0
        for sequence_id in ids:
            if sequence_id > producer.pushed:
                break
            count += 1
        if count and ids[count - 1] > producer.persisted:
            raise Unavailable(f"message {ids[count - 1]} of producer '{name}' is a duplicate of one still being"
                              " written; send it again")
        return count

    def offsets_of(self, name: str, ids: Iterable[int]) -> list[int]:
        """The offsets the duplicates `ids` were stored at (-1: before the window)."""
        producer = self._producers.get(name)
        runs = () if producer is None else producer.runs
        out = []
        for sequence_id in ids:
            offset = -1
            for first, last, first_offset in reversed(runs):
                if first <= sequence_id <= last:
                    offset = first_offset + sequence_id - first
                    break
                if last < sequence_id:
                    break
            out.append(offset)
        return out

    def pushed(self, name: str, last_id: int, now_ms: int) -> None:
        """A batch of `name` ending at `last_id` is queued for the log."""
        producer = self._entry(name, now_ms)
        producer.pushed = max(producer.pushed, last_id)
        producer.active_ms = now_ms

    def attached(self, name: str, now_ms: int) -> None:
        producer = self._producers.get(name)
        if producer is not None:
            producer.active_ms = now_ms

    def persisted(self, name: str, ids: Sequence[int], base_offset: int, now_ms: int) -> None:
        """The records of `ids` (increasing) are committed at `base_offset ..`."""
        if not ids:
            return
        producer = self._entry(name, now_ms)
        if ids[-1] - ids[0] == len(ids) - 1:  # increasing: consecutive (automatic ids), one run
            self._add_run(producer, ids[0], ids[-1], base_offset)
            producer.pushed = max(producer.pushed, producer.persisted)
            self.changed = True
            return
        start = 0
        for i in range(1, len(ids) + 1):
            if i == len(ids) or ids[i] != ids[i - 1] + 1:
                self._add_run(producer, ids[start], ids[i - 1], base_offset + start)
                start = i
        producer.pushed = max(producer.pushed, producer.persisted)
        self.changed = True

    def _add_run(self, producer: _Producer, first: int, last: int, first_offset: int) -> None:
        runs = producer.runs
        if runs and runs[-1][1] + 1 == first and runs[-1][2] + runs[-1][1] - runs[-1][0] + 1 == first_offset:
            before = runs.pop()
            runs.append((before[0], last, before[2]))
        else:
            runs.append((first, last, first_offset))
        producer.persisted = max(producer.persisted, last)
        producer.in_window += last - first + 1
        while producer.in_window > self.window:
            old_first, old_last, old_offset = runs[0]
            excess = producer.in_window - self.window
            if old_last - old_first + 1 <= excess:
                runs.popleft()
                producer.in_window -= old_last - old_first + 1
            else:  # the oldest run loses its first ids
                runs[0] = (old_first + excess, old_last, old_offset + excess)
                producer.in_window -= excess

    def rollback(self, in_flight: Iterable[tuple[str, int]]) -> None:
        """Batches were refused or their write failed: `pushed` goes back to what is
        committed, and up again for the (name, last id) batches still in flight."""
        for producer in self._producers.values():
            producer.pushed = producer.persisted
        for name, last_id in in_flight:
            producer = self._producers.get(name)
            if producer is not None:
                producer.pushed = max(producer.pushed, last_id)

    def expire(self, now_ms: int, attached: set[str]) -> list[str]:
        """Forget the producers not attached and silent for `inactivity_ms`."""
        gone = [name for name, p in self._producers.items()
                if name not in attached and now_ms - p.active_ms >= self.inactivity_ms]
        for name in gone:
            del self._producers[name]
        if gone:
            self.changed = True
        return gone

    def replay(self, names: Sequence[str], ids: Sequence[int | None], offsets: Sequence[int], now_ms: int) -> None:
        """Committed records (their producer names, ids and offsets, in log order), as
        recovery reads them after the checkpoint it started from; ids at or below a
        producer's highest (stored while deduplication was off) add nothing."""
        for name, sequence_id, offset in zip(names, ids, offsets, strict=True):
            if sequence_id is None:
                continue
            producer = self._entry(name, now_ms)
            if sequence_id > producer.persisted:
                self._add_run(producer, sequence_id, sequence_id, offset)
                producer.pushed = max(producer.pushed, sequence_id)
                self.changed = True

    def encode(self, as_of: int) -> bytes:
        """The table as of committed offset `as_of`, for its WAL checkpoint."""
        self.changed = False
        return msgpack.packb([as_of, {name: [p.persisted, p.active_ms] for name, p in self._producers.items()}],
                             use_bin_type=True)

    @staticmethod
    def decode(state: bytes) -> tuple[int, dict[str, tuple[int, int]]]:
        """(as_of, {name: (highest id, last active ms)}) from a checkpoint's state;
        raises ValueError on bytes that are not one."""
        try:
            as_of, entries = msgpack.unpackb(state, raw=False, strict_map_key=True)
            return int(as_of), {str(name): (int(persisted), int(active_ms))
                                for name, (persisted, active_ms) in entries.items()}
        except (ValueError, TypeError, AttributeError, msgpack.UnpackException) as exc:
            raise ValueError(f"undecodable deduplication checkpoint: {exc}") from None

    def restore(self, entries: dict[str, tuple[int, int]], now_ms: int) -> None:
        """Take a checkpoint's entries (after replaying the records around it): the
        highest id of each, the later activity."""
        for name, (persisted, active_ms) in entries.items():
            producer = self._entry(name, active_ms)
            producer.persisted = max(producer.persisted, persisted)
            producer.pushed = max(producer.pushed, producer.persisted)
            producer.active_ms = max(producer.active_ms, min(active_ms, now_ms))

    def _entry(self, name: str, now_ms: int) -> _Producer:
        producer = self._producers.get(name)
        if producer is None:
            if len(self._producers) >= self.producers_max:
                oldest = min(self._producers, key=lambda n: self._producers[n].active_ms)
                del self._producers[oldest]
                self.evicted += 1
            producer = self._producers[name] = _Producer(pushed=-1, persisted=-1, active_ms=now_ms)
        return producer

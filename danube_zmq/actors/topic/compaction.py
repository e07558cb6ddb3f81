"""Which records topic compaction keeps: the pure rule, no I/O.

Compaction (Pulsar's, Kafka's log compaction) keeps, for each key, only the latest
record, and drops a key entirely when its latest record has an empty payload (a
tombstone). Records without a key pass through unchanged, as in Pulsar's
TwoPhaseCompactor with null keys retained.

Two phases use this table, as Pulsar's compactor does: phase 1 `add`s every record in
offset order, so the table ends holding each live key's latest offset; phase 2 asks
`keeps` of each record while copying them into the compacted ledger. A tombstone
removes its key at once (Pulsar's `latestForKey.remove`): a deleted key holds no memory
and no place under `keys_max`, and a later value brings it back. The table is one dict
of key -> offset: its size is the compactor's memory, hence the bound.
"""

from __future__ import annotations

from collections.abc import Sequence

from danube_zmq.transport.errors import ResourceExhausted


class TooManyKeys(ResourceExhausted):
    """Phase 1 met more live keys than `storage.compaction_keys_max` allows; the
    compaction stopped and wrote nothing."""

    # Retrying the same compaction meets the same keys: only a larger limit, or keys
    # deleted by tombstones, lets it pass.
    retriable = False

    def __init__(self, keys_max: int) -> None:
        super().__init__(f"compaction stopped: more than {keys_max:,} distinct keys (storage.compaction_keys_max)")
        self.keys_max = keys_max


class CompactionKeys:
    """Each live key's latest offset, fed in offset order by `add`; asked by `keeps`."""

    __slots__ = ("_keys_max", "_last_offset", "_latest")

    def __init__(self, keys_max: int) -> None:
        assert keys_max >= 0, keys_max
        self._keys_max = keys_max
        self._latest: dict[str, int] = {}
        self._last_offset = -1  # records come in offset order: checked batch by batch

    def __len__(self) -> int:
        """Live keys: those whose latest record is not a tombstone."""
        return len(self._latest)

    def add(self, offsets: Sequence[int], keys: Sequence[str | None], payloads: Sequence[bytes]) -> None:
        """Take records (columns of one batch, offsets increasing and above every offset
        added before). Raises TooManyKeys when a key not in the table would make it
        hold more than `keys_max` keys; the records before it are taken."""
        if not offsets:
            return
        assert offsets[0] > self._last_offset, f"offset {offsets[0]} added after {self._last_offset}"
        latest = self._latest
        keys_max = self._keys_max
        for offset, key, payload in zip(offsets, keys, payloads, strict=True):
            if key is None:
                continue
            if payload:
                # `len` first: the membership test runs only at the limit.
                if len(latest) >= keys_max and key not in latest:
                    raise TooManyKeys(keys_max)
                latest[key] = offset
            else:
                latest.pop(key, None)
        self._last_offset = offsets[-1]

    def keeps(self, offset: int, key: str | None, payload: bytes) -> bool:
        """Whether the compacted ledger holds this record: a keyless one always, a keyed
        one when it is its key's latest and not a tombstone."""
        return key is None or (bool(payload) and self._latest.get(key) == offset)

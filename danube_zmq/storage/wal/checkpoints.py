"""The recovery rule for cursor checkpoints (pure): which cursor a topic resumes from.

A checkpoint record sits in the WAL after the messages it covers (`format.py`); a log
recovers to its whole-record prefix, so a checkpoint past a torn tail is gone with the
tail and the subscription's older one counts: its cursor goes back (redelivery), never
past an acknowledgement. Among those left, the newest of each subscription wins; a
deletion (state None) stays as a marker (None) until a newer checkpoint names it, so a
topic can tell "deleted here" from "never heard of" (the metadata store's record of a
deleted subscription may lag behind the WAL's marker after a crash).
"""

from __future__ import annotations

from collections.abc import Iterable

from danube_zmq.storage.wal.format import Checkpoint

__all__ = ["DEDUP_CHECKPOINT", "is_cursor", "newest_checkpoints"]

# A checkpoint named with "#" is the topic's own state, not a subscription's cursor:
# subscription names are [A-Za-z0-9_-]+ (`storage/paths.py`), so none clashes. The
# deduplication table (`actors/topic/dedup.py`) is the one there is.
DEDUP_CHECKPOINT = "#dedup"


def is_cursor(name: str) -> bool:
    return not name.startswith("#")


def newest_checkpoints(checkpoints: Iterable[Checkpoint]) -> dict[str, bytes | None]:
    """Each subscription's newest state among `checkpoints` (in log order); None: its
    newest checkpoint is a deletion."""
    return {checkpoint.subscription: checkpoint.state for checkpoint in checkpoints}

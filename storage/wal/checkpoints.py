"""The recovery rule for cursor checkpoints (pure): which cursor a topic resumes from.

A checkpoint record sits in the WAL after the messages it covers (`format.py`); a log
recovers to its whole-record prefix, so a checkpoint past a torn tail is gone with the
tail and the subscription's older one counts: its cursor goes back (redelivery), never
past an acknowledgement. Among those left, the newest of each subscription wins; a
deletion (state None) removes the subscription until a newer checkpoint names it.
"""

from __future__ import annotations

from collections.abc import Iterable

from danube_zmq.storage.wal.format import Checkpoint

__all__ = ["newest_checkpoints"]


def newest_checkpoints(checkpoints: Iterable[Checkpoint]) -> dict[str, bytes]:
    """Each subscription's newest state among `checkpoints` (in log order)."""
    newest: dict[str, bytes] = {}
    for checkpoint in checkpoints:
        if checkpoint.state is None:
            newest.pop(checkpoint.subscription, None)
        else:
            newest[checkpoint.subscription] = checkpoint.state
    return newest

"""`TopicLog`: what a reliable topic holds, as every part of its storage side reads it:
the local WAL, the durable segments older history lives in, and the committed end.

The commit part (`commit.py`) opens, grows and reopens the WAL and moves the committed
end; the durable-segments part (`segments.py`) adds the segments the broker uploaded
and retention (`retention.py`) drops them; the others only read. The worker thread
writes the active segment while the actor reads only committed offsets.
"""

from __future__ import annotations

from danube_zmq.storage.wal import WalLog
from danube_zmq.transport.internal_protocol import DurableSegment


class TopicLog:
    def __init__(self, durable: list[DurableSegment]) -> None:
        self.wal: WalLog | None = None  # open between the storage's start and stop
        self.committed_offset = 0  # every offset below is durable (or written, in interval mode)
        self.durable: list[DurableSegment] = sorted(durable, key=lambda s: s.base_offset)

    def log_start(self) -> int:
        """The first offset the topic still holds, locally or in the durable store."""
        assert self.wal is not None
        if self.durable and self.durable[0].base_offset < self.wal.log_start_offset:
            return self.durable[0].base_offset
        return self.wal.log_start_offset

    def log_bytes(self, start: int, end: int) -> int:
        """Bytes the records [start, end) take: measured in the local WAL, estimated from
        descriptor sizes for durable segments."""
        assert self.wal is not None
        total = self.wal.bytes_between(start, end)
        for segment in self.durable:
            low, high = max(start, segment.base_offset), min(end, self.wal.log_start_offset, segment.end_offset + 1)
            if low < high:
                total += segment.size_bytes * (high - low) // (segment.end_offset + 1 - segment.base_offset)
        return total

    def backlog_bytes_after(self, cursor: int, backlog_messages: int) -> int | None:
        """Bytes of the records after `cursor`: measured in the local WAL, estimated from
        descriptor sizes for durable segments, prorated for out-of-order acks."""
        if self.wal is None:
            return None
        start, end = cursor + 1, self.committed_offset
        if start >= end:
            return 0
        return self.log_bytes(start, end) * backlog_messages // (end - start)

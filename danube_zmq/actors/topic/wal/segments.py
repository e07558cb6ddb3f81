"""A reliable topic's sealed segments on their way to the durable store
(`DurableSegments`), and the receipts that wait for them.

6. Durable modes: each sealed WAL segment is reported to the broker (`SegmentSealed`),
   whose uploader copies it to the durable store; `SegmentDurable` comes back with its
   descriptor, and readers of older offsets find it (`reads.py`); local WAL files
   covered by durable segments are deleted after `local_retention_*` (`retention.py`).
   With `storage.seal_every_flush` each flush seals its own segment, and the receipts of
   its batches wait here until that segment is durable, at most
   `storage.receipts_held_max` of them (then sends are refused).
"""

from __future__ import annotations

import bisect
import time
from collections import deque

from danube_zmq.actors.metrics import METRICS
from danube_zmq.actors.topic.storage import TopicPort
from danube_zmq.actors.topic.wal.cursors import WalCursors
from danube_zmq.actors.topic.wal.log import TopicLog
from danube_zmq.config.broker_config import BrokerConfig
from danube_zmq.storage.wal import SegmentInfo
from danube_zmq.transport import client_protocol as cp
from danube_zmq.transport.common import Error
from danube_zmq.transport.errors import ErrorCode
from danube_zmq.transport.internal_protocol import DurableSegment, SegmentDurable, SegmentSealed


class DurableSegments:
    def __init__(self, *, port: TopicPort, config: BrokerConfig, topic_log: TopicLog, cursors: WalCursors,
                 durable_mode: bool) -> None:
        self.port = port
        self.topic = port.topic
        self.config = config
        self.topic_log = topic_log
        self.cursors = cursors
        self.durable_mode = durable_mode
        self.sealed_reported = -1  # highest base offset of a sealed segment told to the broker
        # Receipts waiting for their segment, in offset order: (first offset, last offset,
        # identity, request id, producer id, time.perf_counter() at acceptance).
        self.receipts_held: deque[tuple[int, int, bytes, int, int, float, list[int] | None]] = deque()

    def start(self) -> None:
        self.ack_latency = METRICS.produce_ack_latency.labels(topic=self.topic)  # after the shell's label

    def report_sealed(self, *, again: bool = False, segments: list[SegmentInfo] | None = None) -> None:
        """Tell the broker about sealed WAL segments not yet durable (durable modes):
        the log's, or `segments` (a log closed at stop)."""
        if segments is None:
            if self.topic_log.wal is None:
                return
            segments = self.topic_log.wal.segments()
        if not self.durable_mode:
            return
        # By base and end: a segment uploaded before a crash may have been reopened and grown.
        durable = {s.base_offset: s.end_offset for s in self.topic_log.durable}
        for info in segments:
            if not info.sealed or durable.get(info.base_offset, -1) >= info.next_offset - 1 \
                    or info.next_offset == info.base_offset:
                continue
            if info.base_offset > self.sealed_reported or again or info.base_offset in durable:
                self.port.tell_broker(SegmentSealed(
                    topic=self.topic, base_offset=info.base_offset, end_offset=info.next_offset - 1,
                    record_count=info.next_offset - info.base_offset, path=str(info.path)))
                self.sealed_reported = max(self.sealed_reported, info.base_offset)

    def segment_durable(self, msg: SegmentDurable) -> None:
        durable = self.topic_log.durable
        same = [i for i, s in enumerate(durable) if s.base_offset == msg.segment.base_offset]
        if not same:
            durable.append(msg.segment)
            durable.sort(key=lambda s: s.base_offset)
        elif durable[same[0]].end_offset < msg.segment.end_offset:
            # Uploaded again, longer: a segment whose seal a crash cut was reopened and grew.
            durable[same[0]] = msg.segment
        self._release_receipts()
        self.cursors.drop_covered_tails(msg.segment.base_offset)

    # ------------------------------------------------------------- receipts held
    def refusal(self) -> str | None:
        """Why a send is refused for the receipts held already, or None (none held: never,
        `receipts_held_max` is at least 1)."""
        if len(self.receipts_held) < self.config.storage.receipts_held_max:
            return None
        return (f"topic {self.topic}: {len(self.receipts_held)} receipts wait for their segments' uploads"
                " (storage.receipts_held_max); retry")

    def hold_receipt(self, first: int, last: int, identity: bytes, request_id: int, producer_id: int,
                     accepted_s: float, offsets: list[int] | None = None) -> None:
        """Answered once `first..last` are in durable segments, with `offsets` when given
        (deduplicated messages in it), else with those."""
        self.receipts_held.append((first, last, identity, request_id, producer_id, accepted_s, offsets))

    def _release_receipts(self) -> None:
        """Answer the held receipts whose batches are in durable segments, in offset order
        (a later segment uploaded first waits for the earlier one)."""
        held, durable = self.receipts_held, self.topic_log.durable
        while held:
            first, last, identity, request_id, producer_id, accepted_s, offsets = held[0]
            index = bisect.bisect_right(durable, first, key=_base_offset) - 1
            if index < 0 or durable[index].end_offset < last:
                return
            held.popleft()
            self.port.reply(identity, cp.SendReceipt(
                request_id=request_id, producer_id=producer_id,
                offsets=list(range(first, last + 1)) if offsets is None else offsets))
            self.ack_latency.observe(time.perf_counter() - accepted_s)

    def refuse_held(self, state: str) -> None:
        """The topic stops (`state`: moved, restarted, closed). Written, but their
        segments' uploads finish after the topic is gone (no one left to answer then):
        sent again, stored twice, rather than waited for until the client's request
        timeout with its later batches held behind them."""
        for _, _, identity, request_id, _, _, _ in self.receipts_held:
            self.port.reply(identity, Error(
                request_id=request_id, code=ErrorCode.UNAVAILABLE,
                message=f"topic {self.topic} {state} before this batch reached the durable store; send it again"))
        self.receipts_held.clear()


def _base_offset(segment: DurableSegment) -> int:
    return segment.base_offset

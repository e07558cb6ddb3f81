"""A broker's load report: CPU and memory (psutil) and, per topic served here, message
and byte rates in and out since the last report, producers, consumers, subscriptions
and backlog. The broker publishes it at `/cluster/load/{broker_id}`; the leader's load
manager reads every broker's to place and rebalance topics.

Rates come from the counters the topic actors already keep (`DescribePartition`):
the difference since the previous sample over the time between them. Bytes out are
estimated as messages out times the topic's mean message size (the subscriptions count
messages, not bytes).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import psutil

from danube_zmq.actors.load.reports import LoadReport, TopicLoad
from danube_zmq.transport import cluster_records as cr
from danube_zmq.transport.admin_protocol import PartitionInfo


@dataclass(frozen=True, slots=True)
class _Counters:
    at_ms: int
    messages_in: int
    bytes_in: int
    messages_out: int


class LoadSampler:
    """Turns counter samples into rates; keeps only the topics of the last sample."""

    def __init__(self) -> None:
        self._previous: dict[str, _Counters] = {}
        psutil.cpu_percent(None)  # the first call only starts the measurement

    def report(self, broker_id: int, partitions: Iterable[PartitionInfo], now_ms: int) -> cr.LoadReportRecord:
        topics = []
        current: dict[str, _Counters] = {}
        for info in partitions:
            out = sum(s.delivered_messages for s in info.subscriptions)
            counters = _Counters(now_ms, info.messages_in, info.bytes_in, out)
            current[info.name] = counters
            before = self._previous.get(info.name)
            seconds = (now_ms - before.at_ms) / 1000 if before is not None else 0.0
            if before is None or seconds <= 0:
                rate_in = bytes_in = rate_out = 0.0
            else:
                rate_in = max(0, info.messages_in - before.messages_in) / seconds
                bytes_in = max(0, info.bytes_in - before.bytes_in) / seconds
                rate_out = max(0, out - before.messages_out) / seconds
            mean_size = info.bytes_in / info.messages_in if info.messages_in else 0.0
            topics.append(cr.TopicLoadRecord(
                topic=info.name, msg_rate_in=rate_in, msg_rate_out=rate_out, byte_rate_in=bytes_in,
                byte_rate_out=rate_out * mean_size, producers=len(info.producers),
                consumers=sum(len(s.consumers) for s in info.subscriptions), subscriptions=len(info.subscriptions),
                backlog=sum(s.backlog_messages if s.backlog_messages is not None else s.pending_messages
                            for s in info.subscriptions)))
        self._previous = current
        return cr.LoadReportRecord(broker_id=broker_id, cpu_percent=float(psutil.cpu_percent(None)),
                                   memory_percent=float(psutil.virtual_memory().percent), topics=topics,
                                   reported_ms=now_ms)


def as_load_report(record: cr.LoadReportRecord) -> LoadReport:
    """The pure core's view of a published report."""
    return LoadReport(broker_id=record.broker_id, cpu_percent=record.cpu_percent,
                      memory_percent=record.memory_percent, topics=tuple(
                          TopicLoad(topic=t.topic, msg_rate_in=t.msg_rate_in, msg_rate_out=t.msg_rate_out,
                                    byte_rate_in=t.byte_rate_in, byte_rate_out=t.byte_rate_out, producers=t.producers,
                                    consumers=t.consumers, subscriptions=t.subscriptions, backlog=t.backlog)
                          for t in record.topics))

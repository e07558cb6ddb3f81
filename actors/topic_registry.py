"""What a broker knows of a topic: a name resolved against the topic records in the
metadata store, and the entry of a topic (or partition) served here."""

from __future__ import annotations

from dataclasses import dataclass

from danube_zmq.transport import cluster_records as cr
from danube_zmq.transport.topic_name import TopicName


@dataclass(slots=True)
class TopicEntry:
    """A topic (or one partition) served here, and its actor."""

    name: TopicName
    dispatch_strategy: int
    endpoint: str


@dataclass(frozen=True, slots=True)
class Resolved:
    """A name resolved against the topic records: `base` has the record (a partitioned
    topic's base, or the topic itself); `name` is what was asked for."""

    name: TopicName
    base: TopicName
    record: cr.TopicRecord

    @property
    def partitioned_base(self) -> bool:
        """The name is a partitioned topic's base (it has no actor of its own)."""
        return self.record.partitions > 0 and self.name.full == self.base.full

    def served_names(self) -> list[str]:
        """The topics with an actor that the name stands for."""
        if self.partitioned_base:
            return [self.base.partition_name(i) for i in range(self.record.partitions)]
        return [self.name.full]

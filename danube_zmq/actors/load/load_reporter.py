"""The load reporter: the actor that publishes this broker's load report.

A child of the broker actor, spawned once the broker has joined the cluster. A
`PublishLoad` timer message every `load_manager.report_interval_ms`: it asks the broker
which topic actors it serves (`ServedTopics`; nothing while it holds no lease), asks each
for its counters (`DescribePartition`), and writes the report (`load_report.py`) at
`/cluster/load/{broker_id}` with a TTL of three intervals, so a dead broker's goes away.
"""

from __future__ import annotations

import contextlib
import logging

from danube_zmq.actors.load.load_report import LoadSampler
from danube_zmq.consensus.metadata_store import RaftMetadataStore
from danube_zmq.runtime.actor import Actor
from danube_zmq.transport import cluster_records as cr
from danube_zmq.transport.errors import DanubeError
from danube_zmq.transport.internal_protocol import (
    DescribePartition,
    PartitionStats,
    PublishLoad,
    ServedTopics,
    ServedTopicsList,
)

__all__ = ["LoadReporter"]

log = logging.getLogger("danube_zmq.broker")


class LoadReporter(Actor):
    def __init__(self, *, metadata: RaftMetadataStore, broker_endpoint: str, broker_id: int, interval_ms: int) -> None:
        self.metadata = metadata
        self.broker_endpoint = broker_endpoint
        self.broker_id = broker_id
        self.interval_ms = interval_ms
        self.sampler = LoadSampler()
        self.published_at_ms: int | None = None

    async def on_start(self) -> None:
        self.system.schedule_periodic(self.endpoint, self.interval_ms, PublishLoad())

    async def handle_PublishLoad(self, msg: PublishLoad) -> None:
        clock = self.system.clock
        if self.published_at_ms is not None and clock.monotonic_ms() - self.published_at_ms < self.interval_ms // 2:
            return  # timer messages queued while a slow report was written: one report does
        self.published_at_ms = clock.monotonic_ms()
        served = await self.system.ask(self.broker_endpoint, ServedTopics(), timeout_ms=self.interval_ms)
        assert isinstance(served, ServedTopicsList)
        if not served.serving:
            return
        partitions = []
        for endpoint in served.endpoints:
            with contextlib.suppress(DanubeError):  # stopped meanwhile
                stats = await self.system.ask(endpoint, DescribePartition(), timeout_ms=self.interval_ms)
                assert isinstance(stats, PartitionStats)
                partitions.append(stats.info)
        report = self.sampler.report(self.broker_id, partitions, clock.now_ms())
        try:
            await self.metadata.put_with_ttl(cr.load_key(self.broker_id), cr.encode(report), 3 * self.interval_ms)
        except DanubeError as exc:
            log.info("load report not published (%s)", exc)

"""A broker publishes its load report (`/cluster/load/{broker_id}`) every report
interval, listing the topics it serves. Real broker process, the client and the admin
client."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from danube_zmq import DanubeClient
from danube_zmq.client.admin import AdminClient
from danube_zmq.transport import cluster_records as cr
from tests.integration.conftest import start_broker


def test_the_load_report_lists_the_topics_served_and_is_renewed(tmp_path: Path) -> None:
    """With a 200 ms report interval, a topic with a producer that sent appears in the
    broker's published report (with its producer), and the report is published again
    (its `reported_ms` grows): the publishing runs on a timer, not once."""
    broker = start_broker(tmp_path, env={"DANUBE_LOAD_MANAGER__REPORT_INTERVAL_MS": "200"})
    topic = "/default/load-report"

    async def run() -> None:
        async with DanubeClient(broker.url) as client, AdminClient(broker.admin_url) as admin:
            producer = await client.create_producer(topic)
            await producer.send(b"x")
            deadline = time.monotonic() + 30
            first: cr.LoadReportRecord | None = None
            while True:
                assert time.monotonic() < deadline, "no load report listing the topic was published"
                entries = (await admin.metadata_list(cr.LOAD)).entries
                reports = [cr.decode(e.value, cr.LoadReportRecord) for e in entries]
                served = [t for r in reports for t in r.topics if t.topic == topic and t.producers == 1]
                if served and first is None:
                    first = reports[0]
                elif served and first is not None and reports[0].reported_ms > first.reported_ms:
                    break
                await asyncio.sleep(0.1)
            await producer.close()

    try:
        asyncio.run(run())
    finally:
        code = broker.stop()
    assert code == 0, f"broker did not stop cleanly (exit {code}):\n{broker.log()}"

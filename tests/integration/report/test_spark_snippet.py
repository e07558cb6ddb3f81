"""docs/operations.md's "In Spark directly" snippet, run as written in a fresh Python
against snapshots of a real broker, with Spark's default worker Python (the first
`python3` on the PATH) one that has no danube-zmq, as on most machines."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import venv
from pathlib import Path

import pytest

pytest.importorskip("pyspark")

from danube_zmq import DanubeClient
from danube_zmq.client.admin import AdminClient
from tests.integration.conftest import start_broker
from tests.paths import ROOT

pytestmark = [pytest.mark.spark, pytest.mark.timeout(600)]

OPERATIONS = ROOT / "docs" / "operations.md"


def spark_snippet() -> str:
    section = OPERATIONS.read_text().split("In Spark directly", 1)[1]
    block = re.search(r"```python\n(.*?)```", section, re.S)
    assert block is not None, "operations.md's 'In Spark directly' has no python block"
    return block.group(1)


async def _traffic(url: str, admin_url: str) -> None:
    async with DanubeClient(url) as client:
        producer = await client.create_producer("/default/orders", dispatch="reliable")
        consumer = await client.subscribe("/default/orders", "billing")
        for i in range(5):
            producer.send_nowait(f"order-{i}".encode())
        await producer.flush()
        await consumer.close()
    async with AdminClient(admin_url) as admin:
        await admin.create_snapshot()


def test_the_spark_snippet_runs_as_written(tmp_path: Path) -> None:
    broker = start_broker(tmp_path, env={"DANUBE_SNAPSHOTS__INCLUDE_PAYLOADS": "true"})
    try:
        asyncio.run(_traffic(broker.url, broker.admin_url))
    finally:
        assert broker.stop() == 0, broker.log()
    (tmp_path / "danube-data").symlink_to(tmp_path / "data")  # the default data dir the snippet reads
    bare = tmp_path / "bare"
    venv.create(bare, with_pip=False)
    env = {k: v for k, v in os.environ.items() if k not in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "PYTHONPATH")}
    env["PATH"] = f"{bare / 'bin'}{os.pathsep}{env['PATH']}"
    done = subprocess.run([sys.executable, "-c", spark_snippet()], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    assert re.search(r"\|/default/orders\s*\|\s*5\|", done.stdout), done.stdout
    assert re.search(r"\|/default/orders\s*\|\s*billing\s*\|\s*5\|", done.stdout), done.stdout
    assert re.search(r"\|/default/orders\s*\|\s*4\|\s*order-4\|", done.stdout), done.stdout

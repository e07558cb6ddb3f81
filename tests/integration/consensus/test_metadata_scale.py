"""Metadata work at scale on three broker processes: creating thousands of partitions
never starves a broker's event loop, so every broker keeps answering the admin API and
keeps its lease while the leader places them and the owners load them."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from danube_zmq import DanubeClient
from danube_zmq.client.admin import AdminClient
from danube_zmq.transport.errors import DanubeError
from tests.integration.actors.test_cluster import running_cluster

pytestmark = pytest.mark.cluster

PARTITIONS = 4_000
SERVED_S_MAX = 300.0
ANSWER_MS_MAX = 5_000  # a broker that does not answer the admin API within this is stuck


def test_thousands_of_partitions_are_placed_while_every_broker_keeps_its_lease(tmp_path: Path) -> None:
    """One `GetPartitions(create=true, partitions=4000)` (over one metadata batch, under
    a raised limit) while a background task asks every broker's admin API for the
    registered brokers: every partition gets served, every answer comes (within a
    generous 5 s), all three brokers stay registered throughout, and no broker logs a
    lost or unrenewed lease. Before placement was incremental, the leader summed every
    broker's topics once per new partition, on its event loop."""
    # running_cluster's leases last 3 s: a loop held for seconds loses one
    env = {"DANUBE_POLICIES__PARTITIONS_PER_TOPIC_MAX": str(PARTITIONS)}
    with running_cluster(tmp_path, env=env) as nodes:
        async def watch(stop: asyncio.Event, seen: list[int], missed: list[str]) -> None:
            while not stop.is_set():
                for node in nodes:
                    try:
                        async with AdminClient(node.admin_url, timeout_ms=ANSWER_MS_MAX) as admin:
                            seen.append(len(await admin.list_brokers()))
                    except DanubeError as exc:
                        missed.append(f"{node.admin_url}: {exc}")
                await asyncio.sleep(0.2)

        async def run() -> tuple[list[int], list[str]]:
            stop, seen, missed = asyncio.Event(), [], []
            watcher = asyncio.create_task(watch(stop, seen, missed))
            try:
                async with DanubeClient(nodes[0].url) as client:
                    names = await client._get_partitions("/default/wide", create=True, partitions=PARTITIONS)
                    assert len(names) == PARTITIONS
                    deadline = time.monotonic() + SERVED_S_MAX
                    sample = names[::200] + names[-1:]
                    owners = set()
                    for name in sample:  # a lookup waits until the partition has a broker
                        while True:
                            try:
                                owners.add(await client.lookup(name))
                                break
                            except DanubeError:
                                assert time.monotonic() < deadline, f"{name} not served in {SERVED_S_MAX} s"
                assert owners == {node.url for node in nodes}, owners  # spread over the three
                await asyncio.sleep(3.0)  # a lease lost at the end of the burst shows by now
            finally:
                stop.set()
                await watcher
            return seen, missed

        seen, missed = asyncio.run(run())
        logs = "".join(node.process.log() for node in nodes if node.process is not None)
        assert not missed, missed[:5]
        assert seen and min(seen) == 3, f"a broker's registration lapsed: {sorted(set(seen))}"
        assert "lost its lease" not in logs and "could not renew its lease" not in logs


CREATORS = 8  # topics of 1,000 partitions created at once, through the three brokers


def test_concurrent_bulk_creates_never_let_a_renewing_broker_lapse(tmp_path: Path) -> None:
    """Eight topics of 1,000 partitions created at once, spread over the three brokers
    (their metadata batches forwarded to the leader and queued together), while every
    broker's admin API is asked for the registered brokers: every answer names all
    three, and no broker logs a lost or unrenewed lease nor the leader a failover. The
    renewals (3 s leases) wait in the leader's queue behind these batches unless they
    go first. (Admin answers may be slow here: a broker actor awaits each create it is
    asked for before its next request; not what this test is about.)"""
    with running_cluster(tmp_path) as nodes:
        async def watch(stop: asyncio.Event, seen: list[int], missed: list[str]) -> None:
            while not stop.is_set():
                for node in nodes:
                    try:
                        async with AdminClient(node.admin_url, timeout_ms=ANSWER_MS_MAX) as admin:
                            seen.append(len(await admin.list_brokers()))
                    except DanubeError as exc:
                        missed.append(f"{node.admin_url}: {exc}")
                await asyncio.sleep(0.2)

        async def create(n: int) -> list[str]:
            async with DanubeClient(nodes[n % len(nodes)].url) as client:
                return await client._get_partitions(f"/default/bulk-{n}", create=True, partitions=1_000)

        async def run() -> tuple[list[int], list[str]]:
            stop, seen, missed = asyncio.Event(), [], []
            watcher = asyncio.create_task(watch(stop, seen, missed))
            try:
                created = await asyncio.gather(*(create(n) for n in range(CREATORS)))
                assert [len(names) for names in created] == [1_000] * CREATORS
                async with DanubeClient(nodes[0].url) as client:
                    deadline = time.monotonic() + SERVED_S_MAX
                    for names in created:  # a lookup waits until the partition has a broker
                        for name in names[::250] + names[-1:]:
                            while True:
                                try:
                                    await client.lookup(name)
                                    break
                                except DanubeError:
                                    assert time.monotonic() < deadline, f"{name} not served in {SERVED_S_MAX} s"
                await asyncio.sleep(3.0)  # a lease lost at the end of the burst shows by now
            finally:
                stop.set()
                await watcher
            return seen, missed

        seen, missed = asyncio.run(run())
        logs = "".join(node.process.log() for node in nodes if node.process is not None)
        assert len(seen) > len(missed), missed[:5]
        assert min(seen) == 3, f"a broker's registration lapsed: {sorted(set(seen))}"
        for sign in ("lost its lease", "could not renew its lease", "is gone:"):
            assert sign not in logs, sign

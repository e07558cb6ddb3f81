"""`danube admin topics list` and `topics describe` name each partition's broker, on a
real three-broker cluster: the broker id and client URL every partition is served
from (the one a client lookup is sent to), in the table and in `--output json`, and
after `topics unload` of one partition its new broker."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from danube_zmq import DanubeClient
from danube_zmq.client.admin import AdminClient
from tests.integration.actors.test_cluster import running_cluster
from tests.integration.cli.test_cluster_cli import danube
from tests.integration.consensus.test_metadata_cluster import Node

pytestmark = pytest.mark.cluster

TOPIC = "/default/owned"
PARTITIONS = [f"{TOPIC}-part-{i}" for i in range(3)]
MOVE_S_MAX = 20.0


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[list[Node]]:
    with running_cluster(tmp_path) as nodes:
        yield nodes


def _admin(node: Node, *args: str) -> str:
    out = danube("admin", "--endpoint", node.admin_url, *args)
    assert out.returncode == 0, out.stderr
    return out.stdout


def _described(node: Node) -> dict[str, tuple[int | None, str | None]]:
    description = json.loads(_admin(node, "topics", "describe", TOPIC, "-o", "json"))
    return {p["name"]: (p["broker_id"], p["broker_url"]) for p in description["partitions"]}


def _listed(node: Node) -> dict[str, tuple[int | None, str | None]]:
    [topic] = [t for t in json.loads(_admin(node, "topics", "list", "default", "-o", "json")) if t["name"] == TOPIC]
    return {o["name"]: (o["broker_id"], o["broker_url"]) for o in topic["owners"]}


async def _lookups(node: Node) -> dict[str, str]:
    async with DanubeClient(node.url) as client:
        return {partition: await client.lookup(partition) for partition in PARTITIONS}


async def _broker_ids(node: Node) -> dict[str, int]:
    async with AdminClient(node.admin_url) as admin:
        return {b.broker_url: b.broker_id for b in await admin.list_brokers()}


def _eventually(check: Any, what: str) -> Any:
    deadline = time.monotonic() + MOVE_S_MAX
    while True:
        found = check()
        if found:
            return found
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


def test_list_and_describe_show_each_partitions_broker_and_follow_an_unload(cluster: list[Node]) -> None:
    """A 3-partition topic: every partition's broker id and URL in `topics describe` and
    `topics list` (JSON and table) are the ones a client lookup gives, asked of any
    broker; after `topics unload` of one partition, describe shows its new broker and
    the other partitions' brokers unchanged."""
    first, other = cluster[0], cluster[2]
    _admin(first, "topics", "create", TOPIC, "--partitions", "3")
    ids = asyncio.run(_broker_ids(first))
    # Placed by the leader's load manager: the list shows each partition once it has a broker.
    def placed() -> dict[str, tuple[int | None, str | None]] | None:
        owners = _listed(other)
        return owners if all(broker_id is not None for broker_id, _ in owners.values()) else None

    listed = _eventually(placed, "the partitions were not all placed")
    lookups = asyncio.run(_lookups(first))
    expected = {p: (ids[url], url) for p, url in lookups.items()}
    assert listed == expected
    assert _described(first) == expected
    assert _described(other) == expected

    table = _admin(other, "topics", "describe", TOPIC)
    for partition, (broker_id, url) in expected.items():
        # The broker by name and id ("broker-2 (7160...)"), then its URL.
        assert re.search(rf"^{partition}\s+broker-\d+ \({broker_id}\)\s+{re.escape(url)}\s", table, re.M), table
    listing = _admin(first, "topics", "list", "default")
    for partition, (broker_id, url) in expected.items():
        assert re.search(rf"^{partition}\s+-\s+non_reliable\s+broker-\d+ \({broker_id}\)\s+{re.escape(url)}\s*$",
                         listing, re.M), listing

    moving = PARTITIONS[1]
    _admin(other, "topics", "unload", moving)

    def moved() -> dict[str, tuple[int | None, str | None]] | None:
        now = _described(first)
        return now if now[moving][0] not in (None, expected[moving][0]) else None

    after = _eventually(moved, f"{moving} did not move")
    new_url = asyncio.run(_lookups(first))[moving]
    assert after[moving] == (ids[new_url], new_url)
    assert {p: after[p] for p in PARTITIONS if p != moving} == {p: expected[p] for p in PARTITIONS if p != moving}
    assert _listed(other)[moving] == after[moving]

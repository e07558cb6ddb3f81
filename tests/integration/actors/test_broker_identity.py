"""Brokers as an operator sees them through `danube admin`, on three broker processes:
each named broker-N (its Raft node id, as `danube cluster up` and `cluster status` name
it) beside its id wherever a broker is named; a stopped broker shown as such, not
`active`; and one idle topic on a near-idle cluster overloading no broker."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

from danube_zmq.client.admin import AdminClient
from tests.integration.cli.test_cluster_cli import danube
from tests.integration.consensus.test_metadata_cluster import Node, agreed_leader, start_cluster

pytestmark = pytest.mark.cluster

LEASE_MS = 2000


def admin_cli(node: Node, *args: str) -> str:
    done = danube("admin", "--endpoint", node.admin_url, *args)
    assert done.returncode == 0, done.stderr
    return done.stdout


def brokers(node: Node) -> list[dict[str, object]]:
    return json.loads(admin_cli(node, "brokers", "list", "-o", "json"))


def test_brokers_are_named_by_node_shown_down_when_stopped_and_not_overloaded_when_idle(tmp_path: Path) -> None:
    nodes = start_cluster(tmp_path, 3, env={"DANUBE_CLUSTER__LEASE_TTL_MS": str(LEASE_MS)})
    try:
        asyncio.run(agreed_leader(nodes))
        deadline = time.monotonic() + 30
        while len(listed := brokers(nodes[0])) < 3:
            assert time.monotonic() < deadline, listed
            time.sleep(0.3)
        by_url = {b["broker_url"]: b for b in listed}
        for node in nodes:  # broker-N is Raft node N
            assert (by_url[node.url]["name"], by_url[node.url]["node_id"]) == (f"broker-{node.node_id}", node.node_id)
        table = admin_cli(nodes[0], "brokers", "list")
        assert table.splitlines()[0].split()[:2] == ["NAME", "BROKER-ID"]
        assert {line.split()[0] for line in table.splitlines()[1:]} == {"broker-1", "broker-2", "broker-3"}

        # One idle topic (load 0.2) on a near-idle cluster: above the mean, yet not overloaded.
        admin_cli(nodes[0], "topics", "create", "/default/solo")
        balance = json.loads(admin_cli(nodes[0], "brokers", "balance", "-o", "json"))
        holder = next(b for b in balance["brokers"] if b["topic_count"] == 1)
        assert holder["load"] > balance["mean_load"] and holder["name"] == by_url[
            next(u for u, b in by_url.items() if b["broker_id"] == holder["broker_id"])]["name"]
        assert not any(b["overloaded"] for b in balance["brokers"]), balance

        # Describe names the topic's broker by name and id.
        label = f"{holder['name']} ({holder['broker_id']})"
        assert f"broker {label}" in admin_cli(nodes[0], "topics", "describe", "/default/solo").splitlines()[0]
        assert label in admin_cli(nodes[0], "topics", "list", "default")

        # A stopped broker: never listed active once its lease has had time to lapse, then down.
        stopped = nodes[2]
        stopped_id = by_url[stopped.url]["broker_id"]
        stopped.stop()
        seen: list[str] = []
        deadline = time.monotonic() + 30
        while not seen or seen[-1] != "down":
            assert time.monotonic() < deadline, seen
            rows = {b["broker_id"]: b for b in brokers(nodes[0])}
            assert stopped_id in rows, f"the stopped broker is not listed: {rows}"
            seen.append(str(rows[stopped_id]["status"]))
        assert rows[stopped_id]["name"] == "broker-3" and rows[stopped_id]["role"] == "-"
        assert set(seen) <= {"active", "unreachable", "down"}, seen
        assert "active" not in seen[seen.index("unreachable"):] if "unreachable" in seen else True

        async def leases_listed() -> list[str]:
            async with AdminClient(nodes[0].admin_url) as client:
                return [b.status for b in await client.list_brokers()]

        assert sorted(asyncio.run(leases_listed())) == ["active", "active", "down"]
    finally:
        for node in nodes:
            node.stop()

"""A secured 3-broker cluster end to end: security.mode curve, HS256 tokens, RBAC.

Three broker processes on loopback share one cluster key pair (CURVE on the client,
admin and Raft ports) and one HS256 secret; `alice` is the one super admin. Once the
cluster is up nobody uses the cluster key: alice's token writes the roles and bindings,
and every client of the scenario dials over CURVE with a fresh key pair of its own and
a token of a principal bound to what it does (`ingest` produces, `reader` consumes,
`operator` manages topics in namespace `default`). Storage is shared_fs with a seal per
group commit, so a topic's log outlives its broker.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import zmq
import zmq.asyncio

from danube_zmq import DanubeClient
from danube_zmq.client.admin import AdminClient
from danube_zmq.security.handshake import HandshakeWatch
from danube_zmq.security.tokens import TokenSigner
from danube_zmq.storage.catalog import SegmentDescriptor, segments_prefix
from danube_zmq.transport.client_protocol import DispatchStrategy
from danube_zmq.transport.errors import DanubeError, PermissionDenied, Unauthenticated
from tests.integration.actors.test_cluster import running_cluster
from tests.integration.conftest import make_curve_keys, write_jwt_secret
from tests.integration.consensus.test_metadata_cluster import Node
from tests.paths import ROOT

pytestmark = pytest.mark.cluster

TOPIC = "/default/payments"
DEADLINE_S = 60.0


class Tokens:
    def __init__(self, secret: bytes) -> None:
        self.signer = TokenSigner("HS256", secret, issuer="danube", audience="danube", now_s=time.time)

    def __call__(self, subject: str, principal_type: str = "user") -> str:
        return self.signer.create(subject, principal_type, 3600)


async def _owner(node: Node, token: str, server_key: str) -> str:
    async with DanubeClient(node.url, server_public_key=server_key, token=token) as client:
        return await client.lookup(TOPIC)


async def _uploaded_through(admin: AdminClient, offset: int) -> bool:
    """Whether the segments recorded in the metadata store (what a new owner reads)
    hold every offset up to `offset`."""
    listed = await admin.metadata_list(segments_prefix(TOPIC))
    ends = [SegmentDescriptor.from_bytes(entry.value).end_offset for entry in listed.entries]
    return bool(ends) and max(ends) >= offset


async def _refuses_plaintext(url: str) -> str:
    """The cause a plaintext DEALER's handshake with `url` fails with (libzmq reports
    it on the socket's monitor; a CURVE listener never completes it)."""
    context = zmq.asyncio.Context.instance()
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    watch = HandshakeWatch(sock, context, url=url, curve=False)
    try:
        sock.connect(url)
        sock.send(b"plaintext probe")
        return str(await asyncio.wait_for(watch.failure(), DEADLINE_S))
    finally:
        watch.close()
        sock.close(linger=0)


def test_a_secured_cluster_produces_consumes_moves_and_fails_over_without_loss(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every port of every broker refuses a plaintext peer (client and admin through the
    client library, Raft through a raw socket). `operator`'s token creates a reliable
    topic and unloads it (ManageTopic at namespace scope), but cannot write metadata;
    `ingest` produces and cannot consume; two consumers of `reader` share one Shared
    subscription and ack. Then the topic's owner is killed with kill -9 and another
    broker takes the topic from the durable segments: every message acknowledged before
    the move, between the move and the kill, and after the failover is consumed; no
    offset is given twice. The kill comes once the metadata store records the segments
    holding every acknowledged offset: what a dead disk loses before that is the window
    `test_failover_loses_at_most_the_uploads_in_flight` measures, not this test's."""
    keys = make_curve_keys(tmp_path / "keys")
    secret, secret_env = write_jwt_secret(tmp_path)
    tokens = Tokens(secret)
    server_key = keys.server_public_key
    env = {**keys.broker_env(), **secret_env,
           "DANUBE_STORAGE__MODE": "shared_fs", "DANUBE_STORAGE__DURABLE_URL": str(tmp_path / "shared"),
           "DANUBE_STORAGE__SEAL_EVERY_FLUSH": "true", "DANUBE_STORAGE__LOCAL_RETENTION_MS": "0"}
    # The readiness polls of running_cluster and the scenario's admin calls: alice's
    # token (a super admin) over CURVE with a fresh client pair, never the cluster key.
    monkeypatch.setenv("DANUBE_SERVER_KEY", server_key)
    monkeypatch.delenv("DANUBE_CLIENT_KEYS", raising=False)
    monkeypatch.setenv("DANUBE_TOKEN", tokens("alice"))
    monkeypatch.delenv("DANUBE_TOKEN_FILE", raising=False)

    async def run(nodes: list[Node]) -> None:
        for node in nodes:
            for url in (node.url, node.admin_url, node.raft):
                assert "requires CURVE" in await _refuses_plaintext(url), url
            with monkeypatch.context() as plaintext, pytest.raises(Unauthenticated, match="requires CURVE"):
                plaintext.delenv("DANUBE_SERVER_KEY")
                async with DanubeClient(node.url, token=tokens("ingest", "service_account")):
                    pass
            with pytest.raises(Unauthenticated, match="requires CURVE"):
                async with AdminClient(node.admin_url, token=tokens("alice"), use_env=False):
                    pass

        async with AdminClient(nodes[0].admin_url) as alice:
            await alice.create_role("producer", ["Lookup", "Produce"])
            await alice.create_role("consumer", ["Lookup", "Consume"])
            await alice.create_role("topic-admin", ["Lookup", "ManageTopic"])
            await alice.create_binding("ingest", "service_account", ["producer"], f"topic:{TOPIC}")
            await alice.create_binding("reader", "service_account", ["consumer"], f"topic:{TOPIC}")
            await alice.create_binding("operator", "user", ["topic-admin"], "namespace:default")
        operator = {"server_public_key": server_key, "token": tokens("operator"), "use_env": False}
        await _eventually_allowed(lambda: _create_topic(nodes[0], operator))
        async with AdminClient(nodes[1].admin_url, **operator) as admin:
            with pytest.raises(PermissionDenied, match="ManageCluster"):
                await admin.metadata_put("/security/roles/sneaky", b"x")
        first_owner_url = await _owner(nodes[0], tokens("operator"), server_key)
        first_owner = next(node for node in nodes if node.url == first_owner_url)

        # The clients start at the first owner: after the unload it no longer serves the
        # topic, so the kill below never takes the broker they look topics up on.
        as_ingest = {"server_public_key": server_key, "token": tokens("ingest", "service_account")}
        as_reader = {"server_public_key": server_key, "token": tokens("reader", "service_account")}
        async with DanubeClient(first_owner.url, **as_ingest) as producing, \
                DanubeClient(first_owner.url, **as_reader) as consuming:
            producer = await producing.create_producer(TOPIC, dispatch="reliable")
            with pytest.raises(PermissionDenied, match="Consume"):
                await producing.subscribe(TOPIC, "not-mine")
            consumers = [await consuming.subscribe(TOPIC, "work", sub_type="shared", consumer_name=f"w{i}",
                                                   initial_position="earliest") for i in range(2)]
            acked: dict[bytes, int] = {}
            received: dict[bytes, list[int]] = {}
            per_consumer = [0, 0]

            async def produce(start: int, stop: int) -> None:
                for i in range(start, stop):
                    payload = f"p{i:04d}".encode()
                    acked[payload] = (await producer.send(payload)).offset

            async def consume(index: int) -> None:
                while True:
                    try:
                        message = await consumers[index].receive(timeout=1)
                    except DanubeError:
                        continue
                    received.setdefault(message.payload, []).append(message.offset)
                    per_consumer[index] += 1
                    await consumers[index].ack(message)

            readers = [asyncio.create_task(consume(i)) for i in range(2)]
            try:
                await produce(0, 100)
                async with AdminClient(nodes[2].admin_url, **operator) as admin:
                    await admin.unload_topic(TOPIC)
                second_owner_url = await _eventually(
                    lambda: _moved_from(nodes[2], first_owner_url, tokens("operator"), server_key), "the topic moved")
                await produce(100, 200)
                # Pause the producer until the store records segments holding every
                # acknowledged offset, then kill -9 the topic's broker (not restarted).
                async with AdminClient(nodes[0].admin_url) as alice:
                    last = max(acked.values())
                    await _eventually(lambda: _uploaded_through(alice, last), "the segments were recorded")
                victim = next(node for node in nodes if node.url == second_owner_url)
                victim.kill()
                killed_at = time.monotonic()
                await produce(200, 300)  # retried by the client until another broker serves the topic
                resumed_s = time.monotonic() - killed_at
                await _eventually(lambda: _holds(received, acked), "every acknowledged message consumed", 60)
            finally:
                for reader in readers:
                    reader.cancel()
                await asyncio.gather(*readers, return_exceptions=True)
        third_owner_url = await _owner(first_owner, tokens("operator"), server_key)

        assert third_owner_url not in (second_owner_url, ""), third_owner_url
        assert list(acked) == [f"p{i:04d}".encode() for i in range(300)]
        offsets = list(acked.values())
        assert len(set(offsets)) == len(offsets), "an offset was given twice"
        assert all(acked[p] in got for p, got in received.items() if p in acked), "an offset names another message"
        assert not set(received) - set(acked), "a message nobody sent was consumed"
        assert all(per_consumer), f"the Shared subscription fed one consumer only: {per_consumer}"
        print(f"secured cluster: owners {first_owner_url} -> {second_owner_url} -> (kill -9) {third_owner_url};"
              f" sends resumed {resumed_s:.2f} s after the kill; {len(acked)} acknowledged, all consumed,"
              f" {sum(map(len, received.values())) - len(received)} delivered again; per consumer {per_consumer}")

    with running_cluster(tmp_path, env=env) as nodes:
        asyncio.run(run(nodes))


async def _create_topic(node: Node, operator: dict[str, Any]) -> None:
    async with AdminClient(node.admin_url, **operator) as admin:
        await admin.create_topic(TOPIC, dispatch_strategy=DispatchStrategy.RELIABLE)


async def _eventually_allowed(action: Any) -> None:
    """`action` once every broker's watch of /security/ holds the new bindings (a request
    that reaches a broker before it is PERMISSION_DENIED)."""
    deadline = time.monotonic() + DEADLINE_S
    while True:
        try:
            return await action()
        except PermissionDenied:
            assert time.monotonic() < deadline, "the bindings never reached the broker"
            await asyncio.sleep(0.05)


async def _moved_from(node: Node, before: str, token: str, server_key: str) -> str | None:
    owner = await _owner(node, token, server_key)
    return owner if owner and owner != before else None


def _holds(received: dict[bytes, list[int]], acked: dict[bytes, int]) -> bool:
    return set(acked) <= set(received)


async def _eventually(check: Any, what: str, timeout_s: float = DEADLINE_S) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        result = check()
        if asyncio.iscoroutine(result):
            try:
                result = await result
            except DanubeError:
                result = None
        if result:
            return result
        assert time.monotonic() < deadline, f"not within {timeout_s:g} s: {what}"
        await asyncio.sleep(0.05)


EXAMPLE = ROOT / "examples" / "secured_cluster.sh"


def test_the_secured_cluster_example_runs_from_zero_with_the_project_commands(tmp_path: Path) -> None:
    """examples/secured_cluster.sh (the worked example of docs/security.md) against a
    fresh directory: `danube cluster up --security-dir` makes the cluster key, the JWT
    secret and an admin token, starts three brokers in mode curve, and the example's
    roles, bindings, tokens, produce and consume work as written; each request it expects
    refused is refused for the reason it names (not a timeout); `cluster status` and
    `down` work on the secured cluster. The key files are private to their owner.
    `danube` is not on PATH: the script finds the venv beside its repo (here a copy of
    the script in a repo whose .venv is this test's environment)."""
    from tests.integration.cli.test_cluster_cli import _ports

    data_dir = tmp_path / "secure"
    repo = tmp_path / "repo"
    (repo / "examples").mkdir(parents=True)
    script = repo / "examples" / EXAMPLE.name
    shutil.copy(EXAMPLE, script)
    (repo / ".venv").mkdir()
    (repo / ".venv" / "bin").symlink_to(Path(sys.executable).parent)
    venv_bin = str(Path(sys.executable).parent)
    path = ":".join(d for d in os.environ["PATH"].split(":") if d and d != venv_bin)
    assert shutil.which("danube", path=path) is None, "this test needs a PATH without danube"
    env = {**os.environ, "PATH": path,
           "CLIENT_PORT": str(_ports(3)), "ADMIN_PORT": str(_ports(3)), "RAFT_PORT": str(_ports(3)),
           "METRICS_PORT": str(_ports(3)), "SUPERVISOR_PORT": str(_ports(1))}
    env.pop("DANUBE", None)
    done = subprocess.run(["bash", str(script), str(data_dir)], capture_output=True, text=True, env=env,
                          timeout=600)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert out.count("refused as expected") == 6, out
    assert "lacks Consume on topic /default/orders" in out, out
    assert "lacks Produce on topic /default/other" in out, out
    assert "lacks ManageTopic on topic /default/orders" in out, out
    assert "no credentials" in out, out
    assert "requires CURVE" in out, out
    assert "revoked" in out, out
    assert out.count("order") >= 5 and "secured cluster example: done" in out, out
    security = data_dir / "security"
    for private in ("cluster.key_secret", "jwt.secret", "admin.jwt"):
        assert (security / private).stat().st_mode & 0o077 == 0, private
    layout = json.loads((data_dir / "cluster.json").read_text())
    assert layout["security"]["server_key_file"] == str(security / "broker-keys" / "cluster.key")

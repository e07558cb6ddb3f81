"""security.mode curve against real brokers: CurveZMQ on the client, admin and Raft ports.

Keys are generated in the test's tmp dir (`curve_keys`); `curve_broker` is a standalone
broker process in mode curve. The tests that must look inside the broker (the key bound
to a session, the Raft peer's message count) run a real `BrokerService` in this process.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import zmq
import zmq.asyncio

from danube_zmq import DanubeClient
from danube_zmq.actors.service import BrokerService
from danube_zmq.actors.sockets.gateway import Gateway
from danube_zmq.client.admin import AdminClient
from danube_zmq.config.broker_config import BrokerConfig, BrokerSection, ClusterSection, SecuritySection
from danube_zmq.security.keys import load_key_pair
from danube_zmq.security.rbac import Principal, PrincipalType
from danube_zmq.transport.client_protocol import DispatchStrategy
from danube_zmq.transport.errors import ConfigError, Unauthenticated
from danube_zmq.transport.internal_protocol import AdminRequest
from tests.integration.actors.test_metrics_endpoint import get
from tests.integration.actors.test_subscriptions import drain
from tests.integration.conftest import (
    BrokerProcess,
    CurveKeys,
    allow_client_key,
    allow_client_key_async,
    free_port,
    make_curve_keys,
    start_broker,
)

MARKER = b"curve-marker-7f3a9c-not-in-clear"
LONG_TIMEOUT_MS = 60_000  # a refused handshake must fail long before this (not a Timeout)


def _client_keys(keys: CurveKeys) -> dict[str, Any]:
    return {"server_public_key": keys.server_public_key, "client_keys": str(keys.client_secret_file)}


@pytest.mark.parametrize("dispatch", ["non_reliable", "reliable"])
async def test_produce_and_consume_over_curve(curve_broker: BrokerProcess, curve_keys: CurveKeys,
                                              dispatch: str) -> None:
    """A producer and a consumer with the cluster's server key and a client key pair send
    and receive 50 messages in order, on both dispatch paths."""
    async with DanubeClient(curve_broker.url, **_client_keys(curve_keys)) as client:
        producer = await client.create_producer(f"/default/c-{dispatch}", dispatch=dispatch)
        consumer = await client.subscribe(f"/default/c-{dispatch}", "s")
        for i in range(50):
            await producer.send(f"m{i}".encode())
        got = await drain(consumer, 50)
    assert [m.payload for m in got] == [f"m{i}".encode() for i in range(50)]


def test_the_sync_client_takes_the_same_keys(curve_broker: BrokerProcess, curve_keys: CurveKeys) -> None:
    """SyncClient passes server_public_key and client_keys to the client it wraps: a
    message goes and comes back over CURVE."""
    from danube_zmq import SyncClient

    with SyncClient(curve_broker.url, **_client_keys(curve_keys)) as client:
        producer = client.create_producer("/default/sync")
        consumer = client.subscribe("/default/sync", "s")
        producer.send(b"sync")
        assert consumer.receive(timeout=30).payload == b"sync"


async def test_a_client_without_client_keys_connects_with_a_fresh_pair_and_holds_no_rights(
        curve_broker: BrokerProcess, curve_keys: CurveKeys) -> None:
    """Only the server key given: the client dials with a pair of its own and its Connect
    is served (the client port admits any key), but that key is on no allow-list and no
    token came with it: producing is UNAUTHENTICATED, naming both cures."""
    async with DanubeClient(curve_broker.url, server_public_key=curve_keys.server_public_key) as client:
        with pytest.raises(Unauthenticated, match="not on the client-key allow-list and its Connect carried no"):
            await client.create_producer("/default/fresh")


async def test_admin_requests_over_curve_from_the_library_and_the_cli(curve_broker: BrokerProcess,
                                                                      curve_keys: CurveKeys) -> None:
    """AdminClient creates and lists a namespace over CURVE; `danube admin` does the same
    with --server-key/--client-keys, and without them fails with the clear error, exit 1."""
    async with AdminClient(curve_broker.admin_url, **_client_keys(curve_keys)) as admin:
        await admin.create_namespace("secured")
        assert "secured" in await admin.list_namespaces()
    env = {k: v for k, v in os.environ.items() if k not in ("DANUBE_SERVER_KEY", "DANUBE_CLIENT_KEYS")}
    base = [sys.executable, "-m", "danube_zmq.cli.main", "admin", "--endpoint", curve_broker.admin_url]
    listed = subprocess.run([*base, "--server-key", str(curve_keys.broker_keys_dir / "cluster.key"),
                             "--client-keys", str(curve_keys.client_secret_file), "namespaces", "list"],
                            capture_output=True, text=True, env=env, timeout=60)
    assert listed.returncode == 0, listed.stderr
    assert "secured" in listed.stdout
    refused = subprocess.run([*base, "--timeout-ms", str(LONG_TIMEOUT_MS), "namespaces", "list"],
                             capture_output=True, text=True, env=env, timeout=60)
    assert refused.returncode == 1
    assert "requires CURVE" in refused.stderr and "DANUBE_SERVER_KEY" in refused.stderr


async def test_cli_produce_and_consume_take_the_keys_from_the_environment(curve_broker: BrokerProcess,
                                                                          curve_keys: CurveKeys) -> None:
    """`danube produce` and `danube consume` with DANUBE_SERVER_KEY and DANUBE_CLIENT_KEYS
    set reach a CURVE broker."""
    env = {**os.environ, **curve_keys.client_env()}
    base = [sys.executable, "-m", "danube_zmq.cli.main"]
    produced = subprocess.run([*base, "produce", "-s", curve_broker.url, "-t", "/default/cli", "-m", "hello",
                               "--count", "3"], capture_output=True, text=True, env=env, timeout=60)
    assert produced.returncode == 0, produced.stderr
    consumed = subprocess.run([*base, "consume", "-s", curve_broker.url, "-t", "/default/cli", "-m", "sub",
                               "--initial-position", "earliest", "--count", "3"],
                              capture_output=True, text=True, env=env, timeout=60)
    assert consumed.returncode == 0, consumed.stderr
    assert consumed.stdout.count("hello") == 3


async def test_a_plaintext_client_against_a_curve_broker_fails_fast_with_the_cause(
        curve_broker: BrokerProcess, monkeypatch: pytest.MonkeyPatch) -> None:
    """No server key: DanubeClient and AdminClient raise Unauthenticated naming the cure
    (give server_public_key / DANUBE_SERVER_KEY), not a Timeout after the request timeout."""
    monkeypatch.delenv("DANUBE_SERVER_KEY", raising=False)
    monkeypatch.delenv("DANUBE_CLIENT_KEYS", raising=False)
    with pytest.raises(Unauthenticated, match="requires CURVE: give server_public_key / DANUBE_SERVER_KEY"):
        async with DanubeClient(curve_broker.url, request_timeout_ms=LONG_TIMEOUT_MS):
            pass
    with pytest.raises(Unauthenticated, match="requires CURVE"):
        async with AdminClient(curve_broker.admin_url, timeout_ms=LONG_TIMEOUT_MS):
            pass


async def test_a_curve_client_against_a_plaintext_broker_fails_fast(broker: BrokerProcess,
                                                                    tmp_path: Path) -> None:
    """A server key against a broker in mode none: Unauthenticated at once, not a Timeout."""
    keys = make_curve_keys(tmp_path / "other")
    with pytest.raises(Unauthenticated, match="CURVE"):
        async with DanubeClient(broker.url, request_timeout_ms=LONG_TIMEOUT_MS, **_client_keys(keys)):
            pass


async def test_a_wrong_server_key_fails_fast(curve_broker: BrokerProcess, tmp_path: Path) -> None:
    """Another cluster's public key: the broker cannot open the client's HELLO and drops
    it; the client says 'CURVE handshake ... failed: wrong server key?' at once."""
    other = make_curve_keys(tmp_path / "other")
    for make in (lambda: DanubeClient(curve_broker.url, request_timeout_ms=LONG_TIMEOUT_MS, **_client_keys(other)),
                 lambda: AdminClient(curve_broker.admin_url, timeout_ms=LONG_TIMEOUT_MS, **_client_keys(other))):
        with pytest.raises(Unauthenticated, match=r"CURVE handshake with .* failed: wrong server key"):
            async with make():
                pass


class _Recorder:
    """A TCP proxy that keeps every byte it forwards, both ways."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.seen = bytearray()
        self.server: asyncio.AbstractServer | None = None

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"tcp://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)

        async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    self.seen += data
                    dst.write(data)
                    await dst.drain()
            except (ConnectionError, asyncio.CancelledError):
                pass
            finally:
                dst.close()

        await asyncio.gather(pump(reader, up_writer), pump(up_reader, writer))

    def close(self) -> None:
        if self.server is not None:
            self.server.close()


@pytest.mark.parametrize("mode", ["none", "curve"])
async def test_payloads_are_not_in_clear_on_the_wire_with_curve(tmp_path: Path, mode: str) -> None:
    """Through a recording TCP proxy: in mode none the payload's bytes pass in clear (the
    check can fail), in mode curve neither the payload nor the topic name appears."""
    keys = make_curve_keys(tmp_path / "keys")
    broker = start_broker(tmp_path, env=keys.broker_env() if mode == "curve" else None)
    recorder = _Recorder(int(broker.url.rsplit(":", 1)[1]))
    try:
        if mode == "curve":
            await allow_client_key_async([broker], keys)
        url = await recorder.start()
        options = _client_keys(keys) if mode == "curve" else {}
        async with DanubeClient(url, **options) as client:
            producer = await client.create_producer("/default/wiretap")
            consumer = await client.subscribe("/default/wiretap", "s")
            await producer.send(MARKER)
            assert (await drain(consumer, 1))[0].payload == MARKER
        seen = bytes(recorder.seen)
        assert len(seen) > 200
        if mode == "curve":
            assert MARKER not in seen and b"wiretap" not in seen
        else:
            assert MARKER in seen
    finally:
        recorder.close()
        assert broker.stop() == 0, broker.log()


# ---------------------------------------------------------------- in this process


def _curve_config(tmp_path: Path, keys: CurveKeys, **cluster: Any) -> BrokerConfig:
    return BrokerConfig(
        broker=BrokerSection(listen="tcp://127.0.0.1:0", admin_listen="tcp://127.0.0.1:0", metrics_port=0,
                             data_dir=str(tmp_path / "data")),
        cluster=ClusterSection(**cluster),
        security=SecuritySection(mode="curve", broker_key_file=str(keys.cluster_secret_file),
                                 broker_public_keys_dir=str(keys.broker_keys_dir), super_admins=("alice",)))


async def test_the_gateway_binds_the_authenticated_key_of_each_session_and_admin_request(
        tmp_path: Path, curve_keys: CurveKeys) -> None:
    """The key ZAP authenticated (the frame's User-Id) is the client's public key: on its
    gateway session after Connect, and on each AdminRequest the admin gateway forwards.
    The cluster key is a `broker` principal; the client key is nobody until the allow-list
    in the store names it (the gateway's watch feeds `replace_client_keys`), and never a
    broker even if listed as one."""
    async with BrokerService(_curve_config(tmp_path, curve_keys)) as service:
        system, credentials = service._system, service.credentials
        assert system is not None and credentials is not None
        client_key = curve_keys.client_public_key.encode()
        assert credentials.principal_of_key(client_key) is None
        process = BrokerProcess(url=service.client_url, admin_url=service.admin_url, process=None,  # type: ignore[arg-type]
                                log_path=tmp_path / "none")
        await allow_client_key_async([process], curve_keys)
        assert credentials.principal_of_key(client_key) == Principal(name="alice", type=PrincipalType.USER)
        forwarded: list[AdminRequest] = []
        tell = system.tell

        def spy(endpoint: str, msg: Any) -> bool:
            if isinstance(msg, AdminRequest):
                forwarded.append(msg)
            return tell(endpoint, msg)

        system.tell = spy  # type: ignore[method-assign]
        async with DanubeClient(service.client_url, **_client_keys(curve_keys)):
            gateway = system.actor(system.gateway_endpoint)
            assert isinstance(gateway, Gateway)
            assert {s.public_key for s in gateway.sessions.values()} == {client_key}
        async with AdminClient(service.admin_url, **_client_keys(curve_keys)) as admin:
            await admin.list_namespaces()
        assert [r.public_key for r in forwarded] == [client_key]
        cluster_key = load_key_pair(curve_keys.cluster_secret_file).public
        assert credentials.principal_of_key(cluster_key) == Principal(name="broker", type=PrincipalType.BROKER)
        credentials.replace_client_keys({client_key: Principal(name="alice", type=PrincipalType.USER),
                                         cluster_key: Principal(name="mallory", type=PrincipalType.USER)})
        assert credentials.principal_of_key(client_key) == Principal(name="alice", type=PrincipalType.USER)
        assert credentials.principal_of_key(cluster_key) == Principal(name="broker", type=PrincipalType.BROKER)


async def test_a_client_key_dialing_the_raft_port_is_refused_before_any_message(
        tmp_path: Path, curve_keys: CurveKeys) -> None:
    """A single-voter cluster with a Raft port: a DEALER with a client key (not a broker
    key) is refused by ZAP and none of its frames reaches the Raft peer (its received
    count stays); the same frames from the cluster key are received (the count moves).
    The broker's metrics count the refusal (danube_curve_handshakes_refused_total)."""
    raft = f"tcp://127.0.0.1:{free_port()}"
    config = _curve_config(tmp_path, curve_keys, raft_listen=raft, peers=(f"1={raft}",))
    metrics_port = free_port()
    config = dataclasses.replace(config, broker=dataclasses.replace(config.broker, metrics_port=metrics_port))
    async with BrokerService(config) as service:
        assert service.metadata is not None and service.credentials is not None
        peer = service.metadata.peer
        ctx = zmq.asyncio.Context()
        try:
            async def send_as(pair_file: Path) -> Any:
                pair = load_key_pair(pair_file)
                dealer = ctx.socket(zmq.DEALER)
                dealer.setsockopt(zmq.LINGER, 0)
                dealer.curve_serverkey = load_key_pair(curve_keys.cluster_secret_file).public
                dealer.curve_publickey, dealer.curve_secretkey = pair.public, pair.secret
                dealer.setsockopt(zmq.IDENTITY, b"2")
                dealer.connect(raft)
                for _ in range(5):
                    await dealer.send(b"\x00not a raft frame")
                await asyncio.sleep(0)
                return dealer

            before = peer.statistics(with_log=False).messages_received
            spoofer = await send_as(curve_keys.client_secret_file)
            deadline = time.monotonic() + 30
            while service.credentials.statistics().refused["raft"] == 0:
                assert time.monotonic() < deadline, "ZAP never saw the client key"
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.5)  # anything that got through would be counted by now
            assert peer.statistics(with_log=False).messages_received == before
            # The scrape samples on this loop: fetched from another thread.
            _, body = await asyncio.to_thread(get, f"http://127.0.0.1:{metrics_port}/metrics")
            assert 'danube_curve_handshakes_refused_total{port="raft"} ' in body
            assert 'danube_curve_handshakes_refused_total{port="raft"} 0.0' not in body
            spoofer.close(linger=0)
            broker = await send_as(curve_keys.cluster_secret_file)
            while peer.statistics(with_log=False).messages_received < before + 5:
                assert time.monotonic() < deadline, "frames from the broker key never arrived"
                await asyncio.sleep(0.05)
            broker.close(linger=0)
        finally:
            ctx.destroy(linger=0)


async def test_a_broker_key_dir_without_the_cluster_key_is_refused_at_start(tmp_path: Path,
                                                                            curve_keys: CurveKeys) -> None:
    """The cluster pair's public key missing from broker_public_keys_dir would refuse
    every broker on every Raft port: a ConfigError naming the key, before any bind."""
    other = make_curve_keys(tmp_path / "other")
    config = BrokerConfig(
        broker=BrokerSection(listen="tcp://127.0.0.1:0", admin_listen="tcp://127.0.0.1:0", metrics_port=0,
                             data_dir=str(tmp_path / "data")),
        security=SecuritySection(mode="curve", broker_key_file=str(curve_keys.cluster_secret_file),
                                 broker_public_keys_dir=str(other.broker_keys_dir)))
    with pytest.raises(ConfigError, match=r"security\.broker_public_keys_dir.*does not hold the public key"):
        async with BrokerService(config):
            pass


@pytest.mark.cluster
def test_a_curve_cluster_forms_and_hands_a_reliable_topic_over(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             curve_keys: CurveKeys) -> None:
    """Three brokers in mode curve (one cluster key pair): Raft forms over CURVE (a leader
    agreed, every broker registered), and unloading a reliable topic hands its WAL to
    another broker over the brokers' own CURVE admin clients: every acknowledged message
    is consumed after the move, with offsets continuing. The test's clients take the
    keys from DANUBE_SERVER_KEY / DANUBE_CLIENT_KEYS."""
    from tests.integration.actors.test_cluster import _owners, running_cluster

    # Until alice's key is on the allow-list the readiness polls dial as the cluster key
    # (the broker principal: cluster status and brokers are within its rights).
    monkeypatch.setenv("DANUBE_SERVER_KEY", curve_keys.server_public_key)
    monkeypatch.setenv("DANUBE_CLIENT_KEYS", str(curve_keys.cluster_secret_file))
    topic = "/default/secured-move"

    async def run(nodes: list[Any]) -> None:
        async with AdminClient(nodes[0].admin_url) as admin:
            await admin.create_topic(topic, dispatch_strategy=DispatchStrategy.RELIABLE)
        before = (await _owners(nodes[0], [topic]))[topic]
        async with DanubeClient(nodes[1].url) as client:
            producer = await client.create_producer(topic, dispatch="reliable")
            offsets = [(await producer.send(f"m{i}".encode())).offset for i in range(30)]
            async with AdminClient(nodes[0].admin_url) as admin:
                await admin.unload_topic(topic)
            deadline = time.monotonic() + 30
            while (await _owners(nodes[0], [topic]))[topic] == before:
                assert time.monotonic() < deadline, "the topic did not move"
                await asyncio.sleep(0.05)
            offsets += [(await producer.send(f"m{i}".encode())).offset for i in range(30, 60)]
            consumer = await client.subscribe(topic, "audit", initial_position="earliest")
            got = await drain(consumer, 60, timeout_s=60)
        assert offsets == list(range(60))
        assert [m.payload for m in got] == [f"m{i}".encode() for i in range(60)]

    with running_cluster(tmp_path, env=curve_keys.broker_env()) as nodes:
        allow_client_key(nodes, curve_keys)
        for name, value in curve_keys.client_env().items():
            monkeypatch.setenv(name, value)
        asyncio.run(run(nodes))


async def test_broker_io_threads_sets_the_zeromq_context_every_socket_uses(tmp_path: Path,
                                                                        curve_keys: CurveKeys) -> None:
    """broker.io_threads reaches the one ZeroMQ context of a CURVE broker (where libzmq
    encrypts and decrypts), and the broker serves on it: Connect over CURVE is answered."""
    config = _curve_config(tmp_path, curve_keys)
    config = dataclasses.replace(config, broker=dataclasses.replace(config.broker, io_threads=2))
    async with BrokerService(config) as service:
        assert service._context is not None and service._context.get(zmq.IO_THREADS) == 2
        async with AdminClient(service.admin_url, **curve_keys.cluster_admin()) as admin:  # type: ignore[arg-type]
            await admin.list_brokers()

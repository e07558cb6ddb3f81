"""Fixtures that start real broker processes (`danube broker start`) on free ports."""

from __future__ import annotations

import asyncio
import os
import random
import re
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import zmq

from danube_zmq.security.keys import generate_key_pair, load_key_pair
from danube_zmq.transport.admin_protocol import ADMIN_PROTOCOL
from danube_zmq.transport.common import PROTOCOL_VERSION, Connect


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


_EPHEMERAL = _ephemeral_range()
_PORTS_RNG = random.Random()  # seeded from the OS, whatever a test does to `random`
_PORTS_GIVEN: set[int] = set()


def _port_range(low: int, high: int) -> tuple[int, int]:
    """This test process's share of low..high: under pytest-xdist each worker (gwN of
    PYTEST_XDIST_WORKER_COUNT) picks from a slice of its own, so two workers never pick
    the same port in the moment before either binds it."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER", ""), os.environ.get("PYTEST_XDIST_WORKER_COUNT", "")
    if not (worker.startswith("gw") and worker[2:].isdigit() and count.isdigit() and int(count) > 1):
        return low, high
    index, share = int(worker[2:]), (high - low + 1) // int(count)
    return low + index * share, low + (index + 1) * share - 1


_PORTS = _port_range(10_000, _EPHEMERAL[0] - 1)


def free_port() -> int:
    """A free port outside the kernel's ephemeral range: a port picked now and bound a
    moment later (a broker's, a cluster node's chosen up front) cannot be taken in
    between by the outgoing connections of the brokers already running. Never the same
    port twice in one test process (two picked before either is bound would clash), and
    from a generator of its own (a test may seed the global `random`)."""
    for _ in range(200):
        port = _PORTS_RNG.randint(*_PORTS)
        if port in _PORTS_GIVEN:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            _PORTS_GIVEN.add(port)
            return port
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class BrokerProcess:
    url: str
    admin_url: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 10.0) -> int:
        if self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                # Every thread's stack into the broker's log first (faulthandler), so the
                # failure says where the broker hung.
                self.process.send_signal(signal.SIGUSR1)
                time.sleep(1.0)
                self.process.kill()
                self.process.wait(5)
        return self.process.returncode


def wait_ready(admin_url: str, process: subprocess.Popen[bytes], timeout_s: float = 60.0,
               env: dict[str, str] | None = None) -> None:
    """Poll the admin socket with Connect until the broker answers (over CURVE when the
    broker's `env` sets security.mode curve: dialed with its own cluster key pair).
    Generous: a broker with its gRPC doors imports grpc first, and a loaded 2-core
    machine can take many seconds for that; a broker that died is seen at once."""
    ctx = zmq.Context.instance()
    cluster_key_file = (env or {}).get("DANUBE_SECURITY__BROKER_KEY_FILE") \
        if (env or {}).get("DANUBE_SECURITY__MODE") == "curve" else None
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"broker exited with {process.returncode} before it was ready")
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RCVTIMEO, 300)
        if cluster_key_file is not None:
            pair = load_key_pair(cluster_key_file)
            sock.curve_serverkey, sock.curve_publickey, sock.curve_secretkey = pair.public, pair.public, pair.secret
        sock.connect(admin_url)
        try:
            sock.send(ADMIN_PROTOCOL.encode(Connect(request_id=1, protocol_version=PROTOCOL_VERSION, client_name="t")))
            sock.recv()
            return
        except zmq.Again:
            pass
        finally:
            sock.close(linger=0)
    raise RuntimeError("broker did not answer within the start timeout")


def wait_serving(broker: BrokerProcess, timeout_s: float = 60.0) -> None:
    """Wait for the broker's `danube broker N listening: ...` line on stdout, printed once
    every actor behind its ports is up: the admin port answers Connect a moment earlier,
    and requests in that moment are refused with UNAVAILABLE "broker starting; retry"."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if _SERVING.search(broker.log()):
            return
        if broker.process.poll() is not None:
            raise RuntimeError(f"broker exited with {broker.process.returncode} before it was serving")
        time.sleep(0.05)
    raise RuntimeError("broker answered Connect but did not log that it is listening within the start timeout")


_SERVING = re.compile(r"broker \d+ listening: clients ")


def start_broker(tmp_path: Path, *extra: str, env: dict[str, str] | None = None,
                 url: str | None = None, admin_url: str | None = None,
                 launcher: tuple[str, ...] = ("-m", "danube_zmq.cli.main")) -> BrokerProcess:
    """A broker on free loopback ports with its data in `tmp_path/data`, ready. `launcher`:
    what runs `danube broker start ...` (the chaos harness's fault-injecting wrapper)."""
    url = url or f"tcp://127.0.0.1:{free_port()}"
    admin_url = admin_url or f"tcp://127.0.0.1:{free_port()}"
    log_path = tmp_path / f"broker-{time.monotonic_ns()}.log"
    full_env = {**os.environ, "DANUBE_BROKER__SESSION_TIMEOUT_MS": "1500",
                "DANUBE_BROKER__HEARTBEAT_INTERVAL_MS": "300", **(env or {})}
    with open(log_path, "wb") as log_file:
        process = subprocess.Popen(
            [sys.executable, *launcher, "broker", "start", "--listen", url,
             "--admin-listen", admin_url, "--metrics-port", "0", "--data-dir", str(tmp_path / "data"), *extra],
            stdout=log_file, stderr=subprocess.STDOUT, env=full_env)
    broker = BrokerProcess(url=url, admin_url=admin_url, process=process, log_path=log_path)
    try:
        wait_ready(admin_url, process, env=env)
        wait_serving(broker)
    except Exception:
        broker.stop(signal.SIGKILL)
        raise RuntimeError(f"broker failed to start:\n{broker.log()}") from None
    return broker


@pytest.fixture
def broker(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[BrokerProcess]:
    """A broker of the test's own, its data in `tmp_path/data`, stopped cleanly (exit 0)
    after the test; in a module that sets `SHARED_BROKER = True`, the module's broker
    (`shared_broker`) instead, unless the test is marked `own_broker`."""
    if getattr(request.module, "SHARED_BROKER", False) and request.node.get_closest_marker("own_broker") is None:
        shared: BrokerProcess = request.getfixturevalue("shared_broker")
        yield shared
        code = shared.process.poll()
        assert code is None, f"the module's shared broker exited (exit {code}) during this test:\n{shared.log()}"
        return
    process = start_broker(tmp_path)
    yield process
    code = process.stop()
    assert code == 0, f"broker did not stop cleanly (exit {code}):\n{process.log()}"


@pytest.fixture(scope="module")
def shared_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """One broker for a whole module (issue 40, item 6: a broker start is a second or
    more on a loaded machine), for modules whose tests never stop, pause, restart or
    reconfigure the broker, never read its data dir or log, and name their topics,
    subscriptions and producers so that no test sees another's: such a module sets
    `SHARED_BROKER = True` and its tests take `broker` as usual (a test that needs a
    broker of its own is marked `own_broker`). After each test the broker must still
    run; after the module it must stop cleanly (exit 0), as a test's own broker does."""
    process = start_broker(tmp_path_factory.mktemp("shared-broker"))
    yield process
    code = process.stop()
    assert code == 0, f"the module's shared broker did not stop cleanly (exit {code}):\n{process.log()}"


@pytest.fixture
def broker_factory(tmp_path: Path) -> Iterator[object]:
    started: list[BrokerProcess] = []

    def make(*extra: str, env: dict[str, str] | None = None, url: str | None = None,
             admin_url: str | None = None) -> BrokerProcess:
        process = start_broker(tmp_path, *extra, env=env, url=url, admin_url=admin_url)
        started.append(process)
        return process

    yield make
    for process in started:
        process.stop(signal.SIGKILL)


@dataclass(frozen=True)
class CurveKeys:
    """Keys for a CURVE cluster in a tmp dir: the cluster pair (every broker's
    broker_key_file), the broker public keys dir, and one client pair."""

    cluster_secret_file: Path
    broker_keys_dir: Path
    server_public_key: str
    client_secret_file: Path
    client_public_key: str

    def broker_env(self) -> dict[str, str]:
        """Mode curve, with `alice` (the client key's principal once `allow_client_key`
        registered it) a super admin."""
        return {"DANUBE_SECURITY__MODE": "curve", "DANUBE_SECURITY__BROKER_KEY_FILE": str(self.cluster_secret_file),
                "DANUBE_SECURITY__BROKER_PUBLIC_KEYS_DIR": str(self.broker_keys_dir),
                "DANUBE_SECURITY__SUPER_ADMINS": "alice"}

    def cluster_admin(self) -> dict[str, object]:
        """AdminClient arguments dialing with the cluster key pair: the `broker`
        principal, which holds ManageCluster (so it may write the allow-list)."""
        pair = load_key_pair(self.cluster_secret_file)
        return {"server_public_key": pair.public, "client_keys": pair, "use_env": False}

    def client_env(self) -> dict[str, str]:
        return {"DANUBE_SERVER_KEY": self.server_public_key, "DANUBE_CLIENT_KEYS": str(self.client_secret_file)}


def make_curve_keys(directory: Path) -> CurveKeys:
    cluster = generate_key_pair(directory / "broker-keys", "cluster")
    client = generate_key_pair(directory / "client-keys", "alice")
    return CurveKeys(cluster_secret_file=cluster.secret_file, broker_keys_dir=cluster.public_file.parent,
                     server_public_key=cluster.public_key, client_secret_file=client.secret_file,
                     client_public_key=client.public_key)


def write_jwt_secret(directory: Path) -> tuple[bytes, dict[str, str]]:
    """A fresh HS256 secret in `directory/jwt.secret` (mode 0600, as a user keeps it) and
    the broker environment that names it."""
    # Text, as a user keeps it: random bytes end in a line end one time in 256, which the
    # broker strips (a pasted secret's newline), and the secret is then a byte short.
    secret = secrets.token_hex(32).encode()
    secret_file = directory / "jwt.secret"
    secret_file.write_bytes(secret)
    secret_file.chmod(0o600)
    return secret, {"DANUBE_SECURITY__JWT_SECRET_FILE": str(secret_file)}


async def allow_client_key_async(brokers: list[BrokerProcess] | list[object], keys: CurveKeys,
                                 principal: str = "alice", timeout_s: float = 30.0) -> None:
    """Register the client key of `keys` as `principal` (user) on the allow-list (with
    the cluster key pair), then wait until every broker's client and admin ports serve
    it: its watches of /security/ have the entry."""
    from danube_zmq import DanubeClient
    from danube_zmq.client.admin import AdminClient
    from danube_zmq.transport.errors import NotFound, Unauthenticated, Unavailable

    async with AdminClient(brokers[0].admin_url, **keys.cluster_admin()) as admin:  # type: ignore[union-attr]
        await admin.add_client_key(keys.client_public_key, principal, "user")
    as_client = {"server_public_key": keys.server_public_key, "client_keys": str(keys.client_secret_file)}
    deadline = time.monotonic() + timeout_s
    for broker in brokers:
        while True:
            try:
                async with AdminClient(broker.admin_url, use_env=False, **as_client) as admin:  # type: ignore[union-attr]
                    await admin.list_namespaces()
                async with DanubeClient(broker.url, **as_client) as client:  # type: ignore[union-attr]
                    try:
                        await client.lookup("/default/allow-probe")
                    except NotFound:
                        pass
                break
            except (Unauthenticated, Unavailable):
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.05)


def allow_client_key(brokers: list[BrokerProcess] | list[object], keys: CurveKeys, principal: str = "alice") -> None:
    asyncio.run(allow_client_key_async(brokers, keys, principal))


@pytest.fixture
def curve_keys(tmp_path: Path) -> CurveKeys:
    return make_curve_keys(tmp_path / "keys")


@pytest.fixture
def curve_broker(tmp_path: Path, curve_keys: CurveKeys) -> Iterator[BrokerProcess]:
    """A standalone broker in security.mode curve (keys: the `curve_keys` fixture)."""
    process = start_broker(tmp_path, env=curve_keys.broker_env())
    try:
        allow_client_key([process], curve_keys)
    except BaseException:
        process.stop()
        raise
    yield process
    code = process.stop()
    assert code == 0, f"broker did not stop cleanly (exit {code}):\n{process.log()}"

"""The peer brokers of the side-by-side suite, on loopback, each on a free port with its
data in a temporary directory: Redis (AOF), NATS (with JetStream), Mosquitto, RabbitMQ.

`ensure_installed` installs the Debian packages of missing servers once
(`scripts/install-peers.sh`); a server that cannot be installed or started is skipped
with a line saying why. Every process started here is stopped by its PID (and its
children) at the end.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
BINARIES = {"redis": "redis-server", "nats": "nats-server", "mosquitto": "mosquitto",
            "rabbitmq": "/usr/lib/rabbitmq/bin/rabbitmq-server"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def missing() -> list[str]:
    return [name for name, binary in BINARIES.items() if shutil.which(binary) is None and not Path(binary).exists()]


def ensure_installed() -> list[str]:
    """Install what is missing; returns the servers still missing afterwards."""
    if missing():
        subprocess.run(["bash", str(ROOT / "scripts" / "install-peers.sh")], check=False)
    return missing()


class Peer:
    def __init__(self, name: str, port: int, process: subprocess.Popen[bytes], url: str) -> None:
        self.name, self.port, self.process, self.url = name, port, process, url

    @property
    def pid(self) -> int:
        return self.process.pid


class PeerServers:
    def __init__(self, work_dir: Path) -> None:
        self.work_dir = work_dir
        self.peers: dict[str, Peer] = {}
        self.skipped: dict[str, str] = {}
        self._epmd: set[int] = set()

    def start(self, names: list[str]) -> PeerServers:
        for name in names:
            try:
                self.peers[name] = getattr(self, f"_start_{name}")()
            except Exception as exc:  # a peer that does not come up is skipped, not fatal
                self.skipped[name] = f"{type(exc).__name__}: {exc}"
        return self

    def _spawn(self, name: str, argv: list[str], port: int, url: str, env: dict[str, str] | None = None,
               timeout_s: float = 60) -> Peer:
        base = self.work_dir / name
        base.mkdir(parents=True, exist_ok=True)
        log = open(base / "server.log", "wb")
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=base, env=env or dict(os.environ),
                                   start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise RuntimeError(f"{name} exited ({process.returncode}): {(base / 'server.log').read_text()[-500:]}")
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", port)) == 0:
                    return Peer(name, port, process, url)
            time.sleep(0.2)
        _stop(process)
        raise RuntimeError(f"{name} did not listen on {port} within {timeout_s:g} s")

    def _start_redis(self) -> Peer:
        port = free_port()
        base = self.work_dir / "redis"
        base.mkdir(parents=True, exist_ok=True)
        return self._spawn("redis", ["redis-server", "--bind", "127.0.0.1", "--port", str(port), "--dir", str(base),
                                     "--save", "", "--appendonly", "yes", "--appendfsync", "everysec",
                                     "--client-output-buffer-limit", "pubsub 0 0 0", "--daemonize", "no"],
                           port, f"redis://127.0.0.1:{port}")

    def _start_nats(self) -> Peer:
        port = free_port()
        store = self.work_dir / "nats" / "js"
        return self._spawn("nats", ["nats-server", "-a", "127.0.0.1", "-p", str(port), "-js", "-sd", str(store)],
                           port, f"nats://127.0.0.1:{port}")

    def _start_mosquitto(self) -> Peer:
        port = free_port()
        base = self.work_dir / "mosquitto"
        base.mkdir(parents=True, exist_ok=True)
        (base / "mosquitto.conf").write_text(
            f"listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\nmax_inflight_messages 1000\n"
            "max_queued_messages 1000000\nmax_queued_bytes 0\nlog_dest stderr\n")
        return self._spawn("mosquitto", ["mosquitto", "-c", str(base / "mosquitto.conf")], port,
                           f"127.0.0.1:{port}")

    def _start_rabbitmq(self) -> Peer:
        port, dist = free_port(), free_port()
        base = self.work_dir / "rabbitmq"
        (base / "home").mkdir(parents=True, exist_ok=True)
        (base / "enabled_plugins").write_text("[].\n")
        env = {**os.environ, "HOME": str(base / "home"), "RABBITMQ_NODENAME": f"bench{port}@localhost",
               "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1", "RABBITMQ_NODE_PORT": str(port),
               "RABBITMQ_DIST_PORT": str(dist), "ERL_EPMD_ADDRESS": "127.0.0.1",
               "RABBITMQ_MNESIA_BASE": str(base / "mnesia"), "RABBITMQ_LOG_BASE": str(base / "log"),
               "RABBITMQ_ENABLED_PLUGINS_FILE": str(base / "enabled_plugins")}
        epmd_before = _epmd_pids()
        peer = self._spawn("rabbitmq", [BINARIES["rabbitmq"]], port, f"amqp://guest:guest@127.0.0.1:{port}/%2F",
                           env=env, timeout_s=120)
        # Erlang starts epmd as a daemon of its own, outside the server's process tree.
        self._epmd = _epmd_pids() - epmd_before
        return peer

    def stop(self) -> None:
        for peer in self.peers.values():
            _stop(peer.process)
        self.peers.clear()
        for pid in self._epmd:
            try:
                psutil.Process(pid).terminate()
            except psutil.NoSuchProcess:
                pass


def _epmd_pids() -> set[int]:
    return {p.pid for p in psutil.process_iter(["name"]) if p.info["name"] == "epmd"}


def _stop(process: subprocess.Popen[bytes]) -> None:
    try:
        parent = psutil.Process(process.pid)
        family = [parent, *parent.children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    for proc in family:
        try:
            proc.send_signal(signal.SIGTERM)
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(family, timeout=20)
    for proc in alive:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass

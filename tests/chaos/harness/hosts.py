"""Hosts for chaos runs: Linux network namespaces on a bridge, made and removed by us.

    root namespace                      namespace dz<run>h1 ... dz<run>hN
    bridge dz<run>br 10.77.<net>.254  --veth dz<run>v<i> == eth0 10.77.<net>.<i>
    (the tests' own processes)          (one broker and its supervisor each)

Each run picks a free `<net>` and a random `<run>` id, so two runs never collide, and
writes what it made to a state file (`/run/danube-tests/chaos/harness/<run>.json`, with its pid)
before making it: `__exit__` and atexit remove everything even after a failure, and
`sweep_stale()` removes what a run whose process died (kill -9, power cut of the
test) left behind. Namespaces do not end their processes when deleted, so the
processes in them are killed first (`ip netns pids`); the pid namespace is shared,
so pids seen here are the pids inside.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import json
import os
import random
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

STATE_DIR = Path("/run/danube-chaos")
PREFIX = "dz"
HOSTS_MAX = 9  # one digit in interface names: `dz<run>v<i>` stays within IFNAMSIZ (15)
_RUN_ID = re.compile(r"^[0-9a-z]{4}$")
_IP_TIMEOUT_S = 20.0


class HostsUnavailable(RuntimeError):
    """This machine cannot run namespace hosts (the message says what is missing)."""


def missing_prerequisites() -> str | None:
    """Why namespace hosts cannot run here, or None when they can."""
    if os.geteuid() != 0:
        return "network namespaces need root (run the chaos suite as root)"
    if shutil.which("ip") is None:
        return "the `ip` command is missing (Debian package iproute2)"
    probe = f"{PREFIX}probe{os.getpid() % 100000}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True, timeout=_IP_TIMEOUT_S)
    if made.returncode != 0:
        return f"`ip netns add` fails here: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True, timeout=_IP_TIMEOUT_S)
    return None


def install_tools() -> None:
    """nft, iptables and faketime through scripts/install-chaos.sh when one is missing."""
    script = Path(__file__).resolve().parents[3] / "scripts" / "install-chaos.sh"
    done = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise HostsUnavailable(f"scripts/install-chaos.sh failed: {done.stderr.strip() or done.stdout.strip()}")


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=_IP_TIMEOUT_S)
    if check and done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")
    return done


@dataclass(frozen=True)
class Host:
    """One namespace host: `name` (h1...) is its name in the convention, `address` its
    only address besides loopback."""

    name: str
    index: int
    netns: str
    address: str
    veth: str  # the root side of its veth pair, on the bridge

    def argv(self, argv: Sequence[str]) -> list[str]:
        return ["ip", "netns", "exec", self.netns, *argv]

    def run(self, argv: Sequence[str], *, timeout: float = 120, check: bool = False,
            **kwargs: Any) -> subprocess.CompletedProcess[str]:
        """Run `argv` inside this host and wait for it (text output captured unless the
        caller passes its own stdout/stderr)."""
        kwargs.setdefault("capture_output", "stdout" not in kwargs and "stderr" not in kwargs)
        return subprocess.run(self.argv(argv), text=True, timeout=timeout, check=check, **kwargs)

    def popen(self, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[Any]:
        """Start `argv` inside this host; the caller owns the process (Hosts kills what
        is left in the namespace at the end anyway)."""
        return subprocess.Popen(self.argv(argv), **kwargs)

    def pids(self) -> list[int]:
        """Every process whose network namespace is this host's."""
        done = _ip("netns", "pids", self.netns, check=False)
        return [int(p) for p in done.stdout.split()] if done.returncode == 0 else []


@dataclass(frozen=True)
class _Plan:
    """Everything a run makes, written down before it is made (the state file)."""

    run: str
    net: int
    owner_pid: int
    owner_started: float
    count: int

    @property
    def bridge(self) -> str:
        return f"{PREFIX}{self.run}br"

    def netns(self, i: int) -> str:
        return f"{PREFIX}{self.run}h{i}"

    def veth(self, i: int) -> str:
        return f"{PREFIX}{self.run}v{i}"

    def peer(self, i: int) -> str:
        return f"{PREFIX}{self.run}p{i}"

    @property
    def path(self) -> Path:
        return STATE_DIR / f"{self.run}.json"

    def owner_alive(self) -> bool:
        try:
            return abs(psutil.Process(self.owner_pid).create_time() - self.owner_started) < 1.0
        except psutil.Error:
            return False

    @staticmethod
    def load(path: Path) -> _Plan | None:
        try:
            data = json.loads(path.read_text())
            plan = _Plan(run=str(data["run"]), net=int(data["net"]), owner_pid=int(data["owner_pid"]),
                         owner_started=float(data["owner_started"]), count=int(data["count"]))
        except (OSError, ValueError, KeyError, TypeError):
            return None
        return plan if _RUN_ID.match(plan.run) and 1 <= plan.count <= HOSTS_MAX else None


@contextlib.contextmanager
def _state_lock() -> Iterator[None]:
    """Serializes choosing a run id and net, and sweeping, between concurrent runs."""
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    with open(STATE_DIR / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _remove(plan: _Plan) -> list[str]:
    """Remove everything `plan` names that exists: processes in its namespaces, the
    namespaces (their veth ends go with them), the bridge, the state file. Returns the
    errors (empty when all is gone)."""
    errors = []
    namespaces = [plan.netns(i) for i in range(1, plan.count + 1)]
    for _ in range(50):  # a process may fork while we kill (thespian does): until none is left
        pids = [int(p) for ns in namespaces for p in _ip("netns", "pids", ns, check=False).stdout.split()]
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)  # a paused process must run to die promptly
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)
    else:
        errors.append(f"processes still running in {namespaces}")
    existing = set(_ip("netns", "list", check=False).stdout.split())
    for ns in namespaces:
        if ns in existing:
            done = _ip("netns", "del", ns, check=False)
            if done.returncode != 0:
                errors.append(f"ip netns del {ns}: {done.stderr.strip()}")
    for link in [*(plan.veth(i) for i in range(1, plan.count + 1)), plan.bridge]:
        if _ip("link", "show", link, check=False).returncode == 0:
            done = _ip("link", "del", link, check=False)
            # A veth goes away with its peer's namespace, possibly between show and del.
            if done.returncode != 0 and _ip("link", "show", link, check=False).returncode == 0:
                errors.append(f"ip link del {link}: {done.stderr.strip()}")
    if not errors:
        with contextlib.suppress(FileNotFoundError):
            plan.path.unlink()
    return errors


_OUR_NAME = re.compile(rf"^{PREFIX}([0-9a-z]{{4}})(?:h|v|p)([1-9])$|^{PREFIX}([0-9a-z]{{4}})br$")


def sweep_stale() -> list[str]:
    """Remove what runs whose process is gone left behind; the runs swept. A run's
    state file is written (under the lock held here) before anything is made, so
    names of our shape that no state file claims are leftovers too (a state file lost
    with its run's removal half done)."""
    swept = []
    with _state_lock():
        live = set()
        for path in sorted(STATE_DIR.glob("*.json")):
            plan = _Plan.load(path)
            if plan is None:
                continue
            if plan.owner_alive():
                live.add(plan.run)
            else:
                _remove(plan)
                swept.append(plan.run)
        names = _ip("netns", "list", check=False).stdout.split() + [
            line.split(":")[1].strip().split("@")[0] for line in _ip("-o", "link", check=False).stdout.splitlines()]
        orphans: dict[str, int] = {}
        for name in names:
            match = _OUR_NAME.match(name)
            if match is not None:
                run = match.group(1) or match.group(3)
                if run not in live and run not in swept:
                    orphans[run] = max(orphans.get(run, 1), int(match.group(2) or 1))
        for run, count in sorted(orphans.items()):
            _remove(_Plan(run=run, net=0, owner_pid=0, owner_started=0.0, count=count))
            swept.append(run)
    return swept


def _nets_in_use() -> set[int]:
    used = set()
    for path in STATE_DIR.glob("*.json"):
        plan = _Plan.load(path)
        if plan is not None:
            used.add(plan.net)
    for match in re.finditer(r"inet 10\.77\.(\d+)\.", _ip("-o", "addr", check=False).stdout):
        used.add(int(match.group(1)))
    return used


class Hosts:
    """`count` namespace hosts on a bridge: `with Hosts(3) as hosts: hosts[0].run(...)`."""

    def __init__(self, count: int = 3) -> None:
        if not 1 <= count <= HOSTS_MAX:
            raise ValueError(f"1 to {HOSTS_MAX} hosts, not {count}")
        self.count = count
        self.hosts: list[Host] = []
        self._plan: _Plan | None = None

    @property
    def run_id(self) -> str:
        assert self._plan is not None
        return self._plan.run

    @property
    def net(self) -> int:
        assert self._plan is not None
        return self._plan.net

    @property
    def bridge_address(self) -> str:
        """The root namespace's address on the bridge: where the tests' processes are."""
        return f"10.77.{self.net}.254"

    def __getitem__(self, index: int) -> Host:
        return self.hosts[index]

    def __iter__(self) -> Iterator[Host]:
        return iter(self.hosts)

    def __len__(self) -> int:
        return len(self.hosts)

    def by_name(self, name: str) -> Host:
        return next(h for h in self.hosts if h.name == name)

    def by_address(self, address: str) -> Host:
        return next(h for h in self.hosts if h.address == address)

    def __enter__(self) -> Hosts:
        reason = missing_prerequisites()
        if reason is not None:
            raise HostsUnavailable(reason)
        sweep_stale()
        me = psutil.Process()
        rng = random.SystemRandom()  # names only need to differ between runs, not replay
        with _state_lock():
            used_runs = {p.stem for p in STATE_DIR.glob("*.json")}
            run = next(r for r in ("".join(rng.choice("0123456789abcdefghijklmnopqrstuvwxyz") for _ in range(4))
                                   for _ in range(1000)) if r not in used_runs)
            free = sorted(set(range(1, 254)) - _nets_in_use())
            if not free:
                raise HostsUnavailable("every 10.77.N.0/24 net is in use by other chaos runs")
            plan = _Plan(run=run, net=rng.choice(free), owner_pid=me.pid, owner_started=me.create_time(),
                         count=self.count)
            plan.path.write_text(json.dumps(plan.__dict__) + "\n")
        self._plan = plan
        atexit.register(self.remove)
        try:
            self._make(plan)
        except BaseException:
            self.remove()
            raise
        return self

    def _make(self, plan: _Plan) -> None:
        _ip("link", "add", plan.bridge, "type", "bridge")
        _ip("addr", "add", f"10.77.{plan.net}.254/24", "dev", plan.bridge)
        _ip("link", "set", plan.bridge, "up")
        for i in range(1, plan.count + 1):
            ns, veth, peer = plan.netns(i), plan.veth(i), plan.peer(i)
            _ip("netns", "add", ns)
            _ip("link", "add", veth, "type", "veth", "peer", "name", peer)
            _ip("link", "set", veth, "master", plan.bridge)
            _ip("link", "set", veth, "up")
            _ip("link", "set", peer, "netns", ns)
            inside = ("netns", "exec", ns, "ip")
            _ip(*inside, "link", "set", peer, "name", "eth0")
            _ip(*inside, "addr", "add", f"10.77.{plan.net}.{i}/24", "dev", "eth0")
            _ip(*inside, "link", "set", "eth0", "up")
            _ip(*inside, "link", "set", "lo", "up")
            self.hosts.append(Host(name=f"h{i}", index=i, netns=ns, address=f"10.77.{plan.net}.{i}", veth=veth))

    def remove(self) -> None:
        """Remove everything this run made (idempotent); raises if something stays."""
        plan, self._plan = self._plan, None
        if plan is None:
            return
        atexit.unregister(self.remove)
        with _state_lock():
            errors = _remove(plan)
        self.hosts = []
        if errors:
            raise RuntimeError(f"chaos hosts of run {plan.run} not fully removed: {'; '.join(errors)}")

    def __exit__(self, *exc: object) -> None:
        self.remove()

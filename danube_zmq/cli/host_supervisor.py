"""The cluster's control plane: thespian actors that start, watch and restart broker
processes (`danube cluster up/status/down`).

    ActorSystem (multiprocTCPBase, one per host; admin port bound to the cluster's
    |            private address, no authentication)
    +-- HostSupervisor  (globalName "danube-supervisor"): one BrokerKeeper per broker;
        |                a keeper that exits is started again (ChildActorExited)
        +-- BrokerKeeper  one broker process (`danube broker start ...`): started,
                          checked every 0.2 s, started again when it exits, within a
                          budget of restarts per minute; its pid in `data_dir/broker.pid`
                          so a restarted keeper adopts a running broker

`cluster stop-broker ID` holds one broker: its keeper stops it cleanly and exits, and
no keeper is started for it again until `cluster start-broker ID`.

Only low-rate control messages cross thespian (pickled, about 2k/s at most): start,
status, stop. Data, Raft and leases stay on ZeroMQ, and failure detection for topics
is the brokers' own (leases): thespian notices a crashed convention member only after
about 22 minutes. A broker restarted by its keeper within its lease keeps its topics.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

import psutil
from thespian.actors import (
    ActorExitRequest,
    ActorSystemConventionUpdate,
    ActorTypeDispatcher,
    ChildActorExited,
    WakeupMessage,
)

log = logging.getLogger("danube_zmq.supervisor")

SUPERVISOR_NAME = "danube-supervisor"
POLL = timedelta(seconds=0.2)
RESTARTS_PER_MINUTE_MAX = 10
STOP_WAIT_S = 20.0


@dataclass(frozen=True)
class BrokerSpec:
    """How to run one broker: its command line, environment and files."""

    name: str
    node_id: int
    argv: list[str]
    env: dict[str, str]
    data_dir: str
    log_path: str
    host: str | None = None  # the `danube-host` capability of the system to run it on (None: this one)


@dataclass(frozen=True)
class StartBrokers:
    specs: list[BrokerSpec]


@dataclass(frozen=True)
class BrokerStatus:
    name: str
    node_id: int
    pid: int | None
    running: bool
    restarts: int
    last_exit: str = ""
    host: str = ""  # the `danube-host` of the system it runs on
    stopped: bool = False  # held by `cluster stop-broker`: not restarted until `start-broker`


@dataclass(frozen=True)
class GetStatus:
    pass


@dataclass(frozen=True)
class Status:
    brokers: list[BrokerStatus]
    host: str = field(default_factory=lambda: os.uname().nodename)


@dataclass(frozen=True)
class StopBrokers:
    pass


@dataclass(frozen=True)
class StopBroker:
    """Stop one broker cleanly and keep it stopped: answered `Stopped` once it exited."""

    name: str


@dataclass(frozen=True)
class StartBroker:
    """Start a broker held by `StopBroker` again (or one its keeper gave up on), with
    the spec it was started with: answered `Status` at once."""

    name: str


@dataclass(frozen=True)
class Refused:
    reason: str


@dataclass(frozen=True)
class GetHosts:
    """Which hosts (systems with a `danube-host` capability) the convention has."""


@dataclass(frozen=True)
class Hosts:
    names: list[str]


HOST_ENV = "DANUBE_HOST_NAME"  # set in each system's processes: the host its keepers report


@dataclass(frozen=True)
class Stopped:
    names: list[str]


class HostSupervisor(ActorTypeDispatcher):
    def __init__(self) -> None:
        super().__init__()
        self.specs: dict[str, BrokerSpec] = {}
        self.keepers: dict[str, object] = {}  # name -> keeper address
        self.status: dict[str, BrokerStatus] = {}
        self.stopping_for: object | None = None
        self.held: dict[str, list[object]] = {}  # name -> who waits for it to have stopped
        self.hosts: set[str] = {os.environ.get(HOST_ENV, "")}
        self.watching = False

    def receiveMessage(self, msg: object, sender: object) -> object:
        if not self.watching:  # hear of the convention's members (not possible in __init__)
            self.watching = True
            self.notifyOnSystemRegistrationChanges(True)
        return super().receiveMessage(msg, sender)

    def receiveMsg_ActorSystemConventionUpdate(self, msg: ActorSystemConventionUpdate, sender: object) -> None:
        name = (msg.remoteCapabilities or {}).get("danube-host")
        if name:
            if msg.remoteAdded:
                self.hosts.add(name)
            else:
                self.hosts.discard(name)

    def receiveMsg_GetHosts(self, msg: GetHosts, sender: object) -> None:
        self.send(sender, Hosts(names=sorted(h for h in self.hosts if h)))

    def receiveMsg_StartBrokers(self, msg: StartBrokers, sender: object) -> None:
        for spec in msg.specs:
            self.specs[spec.name] = spec
            if spec.name not in self.keepers:
                self._start_keeper(spec)
        self.send(sender, Status(brokers=self._statuses()))

    def _start_keeper(self, spec: BrokerSpec) -> None:
        # Placed by capability: on the system (this host or a convention member) whose
        # `danube-host` is the spec's.
        keeper = self.createActor(BrokerKeeper, targetActorRequirements={"danube-host": spec.host} if spec.host else None)
        self.keepers[spec.name] = keeper
        self.send(keeper, spec)

    def receiveMsg_BrokerStatus(self, msg: BrokerStatus, sender: object) -> None:
        # Restarts are counted here, by new pids: a keeper that was replaced starts its
        # own count again.
        if msg.name in self.held:
            return  # the last word of a keeper being stopped: the broker is held stopped
        previous = self.status.get(msg.name)
        restarts = previous.restarts if previous is not None else 0
        if previous is not None and previous.pid is not None and msg.pid is not None and msg.pid != previous.pid:
            restarts += 1
        self.status[msg.name] = dataclasses.replace(msg, restarts=restarts)

    def receiveMsg_GetStatus(self, msg: GetStatus, sender: object) -> None:
        self.send(sender, Status(brokers=self._statuses()))

    def _statuses(self) -> list[BrokerStatus]:
        return [self.status.get(name, BrokerStatus(name=name, node_id=spec.node_id, pid=None, running=False,
                                                   restarts=0, last_exit="starting"))
                for name, spec in sorted(self.specs.items())]

    def receiveMsg_StopBrokers(self, msg: StopBrokers, sender: object) -> None:
        self.stopping_for = sender
        if not self.keepers:
            self.send(sender, Stopped(names=sorted(self.specs)))
            return
        for keeper in self.keepers.values():
            self.send(keeper, ActorExitRequest())

    def receiveMsg_StopBroker(self, msg: StopBroker, sender: object) -> None:
        if msg.name not in self.specs:
            self.send(sender, Refused(reason=f"no broker {msg.name} here (brokers: {', '.join(sorted(self.specs))})"))
            return
        if msg.name not in self.keepers:  # held already
            self.send(sender, Stopped(names=[msg.name]))
            return
        self.held.setdefault(msg.name, []).append(sender)
        self.send(self.keepers[msg.name], ActorExitRequest())

    def receiveMsg_StartBroker(self, msg: StartBroker, sender: object) -> None:
        spec = self.specs.get(msg.name)
        if spec is None:
            self.send(sender, Refused(reason=f"no broker {msg.name} here (brokers: {', '.join(sorted(self.specs))})"))
            return
        if msg.name in self.held:
            if msg.name in self.keepers:
                self.send(sender, Refused(reason=f"{msg.name} is still stopping; try again"))
                return
            del self.held[msg.name]
            self._start_keeper(spec)
        else:
            status = self.status.get(msg.name)
            if status is None or status.running:
                self.send(sender, Refused(reason=f"{msg.name} is running"))
                return
            # Its keeper gave up restarting it: the keeper started in its place
            # (ChildActorExited) starts it.
            self.send(self.keepers[msg.name], ActorExitRequest())
        self.send(sender, Status(brokers=self._statuses()))

    def receiveMsg_ChildActorExited(self, msg: ChildActorExited, sender: object) -> None:
        name = next((n for n, a in self.keepers.items() if a == msg.childAddress), None)
        if name is None:
            return  # a duplicate notice (thespian may send two), or a keeper already replaced
        del self.keepers[name]
        if name in self.held:
            previous = self.status.get(name)
            self.status[name] = BrokerStatus(name=name, node_id=self.specs[name].node_id, pid=None, running=False,
                                             restarts=previous.restarts if previous else 0,
                                             last_exit="stopped by `cluster stop-broker`", stopped=True,
                                             host=previous.host if previous else "")
            for asker in self.held[name]:
                self.send(asker, Stopped(names=[name]))
            self.held[name] = []
        if self.stopping_for is not None:
            if not self.keepers:
                self.send(self.stopping_for, Stopped(names=sorted(self.specs)))
            return
        if name in self.held:
            return
        logging.warning("keeper of broker %s exited; starting another (it adopts the running broker)", name)
        self._start_keeper(self.specs[name])


class BrokerKeeper(ActorTypeDispatcher):
    @staticmethod
    def actorSystemCapabilityCheck(capabilities: dict[str, object], requirements: dict[str, object] | None) -> bool:
        wanted = (requirements or {}).get("danube-host")
        return bool(capabilities.get("danube-broker-host")) and (wanted is None or capabilities.get("danube-host") == wanted)

    def __init__(self) -> None:
        super().__init__()
        self.spec: BrokerSpec | None = None
        self.process: subprocess.Popen[bytes] | None = None
        self.adopted: psutil.Process | None = None
        self.restarts = 0
        self.restart_times: list[float] = []
        self.last_exit = ""
        self.given_up = False
        self.supervisor: object | None = None

    def receiveMsg_BrokerSpec(self, msg: BrokerSpec, sender: object) -> None:
        self.spec = msg
        self.supervisor = sender
        self.adopted = self._running_broker()
        if self.adopted is None:
            self._start()
        self._report()
        self.wakeupAfter(POLL)

    def receiveMsg_WakeupMessage(self, msg: WakeupMessage, sender: object) -> None:
        if self.spec is None:
            return
        code = self._exit_code()
        if code is not None and not self.given_up:
            self.last_exit = f"exited with {code}"
            now = time.monotonic()
            self.restart_times = [t for t in self.restart_times if now - t < 60] + [now]
            if len(self.restart_times) > RESTARTS_PER_MINUTE_MAX:
                self.given_up = True
                self.last_exit += f"; more than {RESTARTS_PER_MINUTE_MAX} restarts in a minute: not restarted"
                logging.error("broker %s: %s", self.spec.name, self.last_exit)
            else:
                self.restarts += 1
                logging.warning("broker %s %s; restarting it", self.spec.name, self.last_exit)
                self._start()
            self._report()
        self.wakeupAfter(POLL)

    def receiveMsg_ActorExitRequest(self, msg: ActorExitRequest, sender: object) -> None:
        """Stop the broker cleanly (SIGTERM, then SIGKILL after `STOP_WAIT_S`)."""
        process = self.process or self.adopted
        if process is None:
            return
        with contextlib.suppress(ProcessLookupError, psutil.NoSuchProcess):
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(STOP_WAIT_S)
            except (subprocess.TimeoutExpired, psutil.TimeoutExpired):
                process.kill()
                process.wait(5)
        self._forget_pid()

    def _start(self) -> None:
        spec = self.spec
        assert spec is not None
        Path(spec.data_dir).mkdir(parents=True, exist_ok=True)
        with open(spec.log_path, "ab") as out:
            self.process = subprocess.Popen(spec.argv, stdout=out, stderr=subprocess.STDOUT,
                                            env={**os.environ, **spec.env}, start_new_session=True)
        self.adopted = None
        Path(spec.data_dir, "broker.pid").write_text(f"{self.process.pid}\n")

    def _running_broker(self) -> psutil.Process | None:
        """The broker a previous keeper started, if it is still running."""
        assert self.spec is not None
        try:
            pid = int(Path(self.spec.data_dir, "broker.pid").read_text())
            process = psutil.Process(pid)
            if process.is_running() and process.status() != psutil.STATUS_ZOMBIE \
                    and "broker" in process.cmdline():
                return process
        except (OSError, ValueError, psutil.Error):
            pass
        return None

    def _exit_code(self) -> int | None:
        if self.process is not None:
            return self.process.poll()
        if self.adopted is not None:
            try:
                if self.adopted.is_running() and self.adopted.status() != psutil.STATUS_ZOMBIE:
                    return None
            except psutil.NoSuchProcess:
                pass
            return -1  # not our child: its exit code is its parent's to read
        return None

    def _forget_pid(self) -> None:
        if self.spec is not None:
            with contextlib.suppress(OSError):
                Path(self.spec.data_dir, "broker.pid").unlink()

    def _report(self) -> None:
        assert self.spec is not None
        process = self.process or self.adopted
        pid = process.pid if process is not None else None
        self.send(self.supervisor, BrokerStatus(name=self.spec.name, node_id=self.spec.node_id, pid=pid,
                                              running=self._exit_code() is None, restarts=self.restarts,
                                              last_exit=self.last_exit, host=os.environ.get(HOST_ENV, "")))


def bind_to_base_address() -> None:
    """Make thespian listen on THESPIAN_BASE_IPADDR only. Thespian 4 binds its admin and
    actor sockets to every interface (`IPActorAddress.bindname` is ('', port) for an
    externally reachable address), and its admin port has no authentication; the
    processes it forks from this one inherit the change."""
    from thespian.system.transport import IPBase

    original = IPBase.IPActorAddress.__init__
    if getattr(original, "danube_bound", False):
        return

    def init(self: IPBase.IPActorAddress, *args: object, **kwargs: object) -> None:
        original(self, *args, **kwargs)
        base = os.environ.get("THESPIAN_BASE_IPADDR")
        if base and self.bindname[0] == "":
            self.bindname = (base, self.bindname[1])

    init.danube_bound = True  # type: ignore[attr-defined]
    IPBase.IPActorAddress.__init__ = init  # type: ignore[method-assign]


def main() -> None:
    """Start this host's ActorSystem and its supervisor, then return (the system's
    admin process keeps running): `python -m danube_zmq.cli.host_supervisor --bind IP
    --port N [--convention HOST:PORT]`, as `danube cluster up` runs it."""
    import argparse

    from thespian.actors import ActorSystem

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--bind", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--convention")
    parser.add_argument("--host-name", default=os.uname().nodename)
    args = parser.parse_args()
    os.environ["THESPIAN_BASE_IPADDR"] = args.bind
    os.environ[HOST_ENV] = args.host_name
    bind_to_base_address()
    capabilities: dict[str, object] = {"Admin Port": args.port, "danube-broker-host": True,
                                       "danube-host": args.host_name}
    if args.convention:
        capabilities["Convention Address.IPv4"] = args.convention
    system = ActorSystem("multiprocTCPBase", capabilities)
    system.createActor(HostSupervisor, globalName=SUPERVISOR_NAME)


if __name__ == "__main__":
    # Run the module's own `main`, not this copy's: the actor and message classes must
    # pickle as danube_zmq.cli.host_supervisor.*, not __main__.*.
    from danube_zmq.cli.host_supervisor import main as module_main

    module_main()

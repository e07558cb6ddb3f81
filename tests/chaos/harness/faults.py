"""Process and network faults on namespace hosts, each reversible and recorded.

A `Faults` recorder starts faults and keeps every one (kind, targets, what was done,
start and heal times on its injected monotonic clock) for the availability checker;
`heal_all()` (and `__exit__`) undoes whatever is still in place, even after a failure.

    process:  kill9(broker)        SIGKILL; healed when its host's supervisor has
                                   started it again (a new pid, in the same namespace)
              power_loss(brokers, while_down)  SIGKILL of all at once with their
                                   supervisors held, files changed while down, restart
              pause(broker)        SIGSTOP; heal is SIGCONT
    network:  partition(A, B)      nothing between the groups of hosts, both ways
              isolate(h)           h against every other host
              bridge(a, b, c)      a and c cannot talk, both talk to b
              one_way(src, dst)    dst drops what src sends (dst's input only)
              loss(h, percent)     each packet in or out of h dropped at random
              delay(h, ms)         netem, only where the kernel has it
    clock:    clock_jump(clocks, h, s)  h's wall clock stepped by s seconds (tests/chaos/harness/clock.py)

Network faults are nftables rules inside the hosts' own namespaces (a table per fault
per host, so faults compose and heal is deleting that table), dropping on input as
Jepsen's partitions do: a sender sees silence, not an error. The tests' own address
(the bridge) is never cut: clients keep seeing the brokers they talk to.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from tests.chaos.harness.clock import Clocks
from tests.chaos.harness.cluster import Broker
from tests.chaos.harness.hosts import Host, Hosts

RESTART_DEADLINE_S = 60.0
_NFT_TIMEOUT_S = 20.0


class FaultUnavailable(RuntimeError):
    """This machine cannot inject the fault (the message says why)."""


@dataclass
class Fault:
    """One injected fault: what it did, to whom, and when (monotonic seconds)."""

    id: int
    kind: str  # kill9, pause, partition, one_way, loss, delay
    targets: tuple[str, ...]  # host or broker names
    description: str
    started_at: float
    healed_at: float | None = None
    _undo: Callable[[], None] | None = field(default=None, repr=False)

    @property
    def active(self) -> bool:
        return self.healed_at is None

    def record(self) -> dict[str, object]:
        """The fault as JSON-able data, for histories and the availability checker."""
        return {"id": self.id, "kind": self.kind, "targets": list(self.targets), "description": self.description,
                "started_at": self.started_at, "healed_at": self.healed_at}


def _nft(host: Host, script: str) -> None:
    done = host.run(["nft", "-f", "-"], input=script, timeout=_NFT_TIMEOUT_S)
    if done.returncode != 0:
        raise FaultUnavailable(f"nft on {host.name} failed: {done.stderr.strip()} (script: {script!r})")


def _drop_table(host: Host, table: str, rules: Sequence[str]) -> None:
    """A table of its own in `host`: an input and an output chain with `rules`
    ("input ip saddr 10.77.1.2 drop" ...), each rule starting with its chain."""
    lines = [f"table inet {table} {{",
             "  chain input { type filter hook input priority -10; policy accept; }",
             "  chain output { type filter hook output priority -10; policy accept; }", "}"]
    lines += [f"add rule inet {table} {rule}" for rule in rules]
    _nft(host, "\n".join(lines) + "\n")


def _delete_table(host: Host, table: str, *, family: str = "inet") -> None:
    host.run(["nft", "delete", "table", family, table], timeout=_NFT_TIMEOUT_S)


class Faults:
    """Injects faults on namespace hosts and their brokers and records them:
    `with Faults(hosts) as faults: faults.isolate(hosts[0])`."""

    def __init__(self, hosts: Hosts, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.hosts = hosts
        self.clock = clock
        self.history: list[Fault] = []
        self._ids = itertools.count(1)

    def _record(self, kind: str, targets: Iterable[str], description: str,
                undo: Callable[[], None] | None) -> Fault:
        fault = Fault(id=next(self._ids), kind=kind, targets=tuple(targets), description=description,
                      started_at=self.clock(), _undo=undo)
        self.history.append(fault)
        return fault

    def heal(self, fault: Fault) -> Fault:
        """Undo `fault` (a no-op when already healed) and record when."""
        if fault.active:
            if fault._undo is not None:
                fault._undo()
            fault.healed_at = self.clock()
        return fault

    def records(self) -> list[dict[str, object]]:
        return [fault.record() for fault in self.history]

    def heal_all(self) -> None:
        """Heal every active fault, newest first; raise the first failure after trying all."""
        errors = []
        for fault in reversed(self.history):
            try:
                self.heal(fault)
            except Exception as exc:  # every fault gets its heal; the first error is raised after
                errors.append(exc)
        if errors:
            raise errors[0]

    def __enter__(self) -> Faults:
        return self

    def __exit__(self, *exc: object) -> None:
        self.heal_all()

    # -- processes -------------------------------------------------------------------

    def kill9(self, broker: Broker, *, deadline_s: float = RESTART_DEADLINE_S) -> Fault:
        """SIGKILL `broker`; return once its host's supervisor has started it again (a new
        pid, running in the same namespace), the fault healed at that moment."""
        pid = broker.pid()
        if pid is None:
            raise RuntimeError(f"{broker.name} has no pid file: is it running?")
        os.kill(pid, signal.SIGKILL)
        fault = self._record("kill9", [broker.name], f"kill -9 {broker.name} (pid {pid}) on {broker.host.name}", None)
        deadline = time.monotonic() + deadline_s
        while time.monotonic() < deadline:
            new = broker.pid()
            if new is not None and new != pid and new in broker.host.pids():
                fault.healed_at = self.clock()
                fault.description += f"; restarted as pid {new} on {broker.host.name}"
                return fault
            time.sleep(0.1)
        raise AssertionError(f"{broker.name} was not restarted on {broker.host.name} within {deadline_s:g} s"
                             f" after kill -9 (pid {pid}); see {broker.log_path}")

    def power_loss(self, brokers: Sequence[Broker], while_down: Callable[[Broker], str], *,
                   deadline_s: float = RESTART_DEADLINE_S) -> Fault:
        """kill -9 `brokers` at once while every other process on their hosts (the
        supervisors that would restart them at once) is stopped with SIGSTOP; once each
        broker is dead, `while_down(broker)` does to its files what the power loss
        leaves (cut to what was fsynced, a torn Raft record) and says what it did; then
        the supervisors go on and restart them, which is the heal."""
        hosts = {b.host.name: b.host for b in brokers}
        pids = {b.name: b.pid() for b in brokers}
        if None in pids.values():
            raise RuntimeError(f"no pid file for some of {pids}: are they running?")
        held = [pid for host in hosts.values() for pid in host.pids() if pid not in pids.values()]
        done: list[str] = []
        try:
            for pid in held:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGSTOP)
            for pid in pids.values():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            fault = self._record("power_loss", [b.name for b in brokers],
                                 "power loss of " + ", ".join(f"{b.name} (pid {pids[b.name]})" for b in brokers), None)
            deadline = time.monotonic() + deadline_s
            for pid in pids.values():
                while _alive(pid):  # its files are closed only once it is dead (a zombie is)
                    if time.monotonic() > deadline:
                        raise AssertionError(f"pid {pid} still alive {deadline_s:g} s after SIGKILL")
                    time.sleep(0.02)
            done = [f"{b.name}: {while_down(b)}" for b in brokers]
        finally:
            for pid in held:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
        fault.description += "; " + "; ".join(done)
        for broker in brokers:
            while True:
                new = broker.pid()
                if new is not None and new != pids[broker.name] and new in broker.host.pids():
                    break
                if time.monotonic() > deadline:
                    raise AssertionError(f"{broker.name} was not restarted on {broker.host.name} within"
                                         f" {deadline_s:g} s after the power loss; see {broker.log_path}")
                time.sleep(0.1)
        fault.healed_at = self.clock()
        return fault

    def pause(self, broker: Broker) -> Fault:
        """SIGSTOP `broker`; heal sends SIGCONT."""
        pid = broker.pid()
        if pid is None:
            raise RuntimeError(f"{broker.name} has no pid file: is it running?")
        os.kill(pid, signal.SIGSTOP)

        def resume() -> None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)

        return self._record("pause", [broker.name], f"SIGSTOP {broker.name} (pid {pid})", resume)

    def mark(self, kind: str, targets: Iterable[str], description: str) -> Fault:
        """Record a disruption the caller carries out itself (a topic move through the
        admin API, a client process killed), so the checkers see it; `heal(fault)` when
        it is over records that time and undoes nothing."""
        return self._record(kind, targets, description, None)

    def pause_process(self, pid: int, name: str) -> Fault:
        """SIGSTOP any process (a workload consumer, P2); heal sends SIGCONT."""
        os.kill(pid, signal.SIGSTOP)

        def resume() -> None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)

        return self._record("pause", [name], f"SIGSTOP {name} (pid {pid})", resume)

    def clock_jump(self, clocks: Clocks, host: Host, seconds: float) -> Fault:
        """Step the wall clock of every process on `host` by `seconds` (tests/chaos/harness/clock.py:
        the processes must have been started with `clocks.env(host)`); heal sets it
        back to real time, itself a step of -`seconds`."""
        clocks.set(host, clocks.offset(host) + seconds)
        return self._record("clock", [host.name], f"wall clock of {host.name} {seconds:+g} s",
                            lambda: clocks.set(host, clocks.offset(host) - seconds))

    # -- network ---------------------------------------------------------------------

    def _blocks(self, kind: str, pairs: Sequence[tuple[Host, Host]], description: str) -> Fault:
        """Drop, at each pair's receiver, the packets from its sender."""
        fault_id = next(self._ids)
        table = f"dzfault{fault_id}"
        by_receiver: dict[str, list[str]] = {}
        for src, dst in pairs:
            by_receiver.setdefault(dst.name, []).append(f"input ip saddr {src.address} drop")
        receivers = [self.hosts.by_name(n) for n in by_receiver]
        made: list[Host] = []

        def undo() -> None:
            for host in made:
                _delete_table(host, table)

        try:
            for host in receivers:
                _drop_table(host, table, by_receiver[host.name])
                made.append(host)
        except BaseException:
            undo()
            raise
        fault = Fault(id=fault_id, kind=kind, targets=tuple(sorted({h.name for p in pairs for h in p})),
                      description=description, started_at=self.clock(), _undo=undo)
        self.history.append(fault)
        return fault

    def partition(self, side_a: Sequence[Host], side_b: Sequence[Host]) -> Fault:
        """No packet between a host of `side_a` and one of `side_b`, either way."""
        pairs = [(a, b) for a in side_a for b in side_b] + [(b, a) for a in side_a for b in side_b]
        names = (",".join(h.name for h in side_a), ",".join(h.name for h in side_b))
        return self._blocks("partition", pairs, f"partition {names[0]} | {names[1]}")

    def isolate(self, host: Host) -> Fault:
        """`host` against every other host (the bridge's own address stays reachable)."""
        others = [h for h in self.hosts if h.name != host.name]
        return self.partition([host], others)

    def bridge(self, a: Host, b: Host, c: Host) -> Fault:
        """`a` and `c` cannot talk; both still talk to `b` (the bridge node)."""
        return self._blocks("partition", [(a, c), (c, a)], f"bridge {a.name} - {b.name} - {c.name}"
                                                             f" ({a.name} and {c.name} cut)")

    def one_way(self, src: Host, dst: Host) -> Fault:
        """`dst` drops everything from `src`; `src` still hears `dst`."""
        return self._blocks("one_way", [(src, dst)], f"one-way: {dst.name} drops what {src.name} sends")

    def loss(self, host: Host, percent: int) -> Fault:
        """Each packet into or out of `host` dropped with probability percent/100 (nft
        numgen random: no netem needed)."""
        if not 0 < percent <= 100:
            raise ValueError(f"percent in 1..100, not {percent}")
        fault_id = next(self._ids)
        table = f"dzfault{fault_id}"
        # netdev ingress and egress of the host's interface: a dropped packet is silent
        # to its sender (an output-chain drop would fail its send with EPERM instead).
        # IP only: lost ARP would stall whole bursts in the neighbour queue instead.
        _nft(host, f"""table netdev {table} {{
  chain in {{ type filter hook ingress device "eth0" priority 0; policy accept;
    meta protocol ip numgen random mod 100 <= {percent - 1} drop; }}
  chain out {{ type filter hook egress device "eth0" priority 0; policy accept;
    meta protocol ip numgen random mod 100 <= {percent - 1} drop; }}
}}
""")
        fault = Fault(id=fault_id, kind="loss", targets=(host.name,), description=f"{percent}% loss on {host.name}",
                      started_at=self.clock(), _undo=lambda: _delete_table(host, table, family="netdev"))
        self.history.append(fault)
        return fault

    def delay(self, host: Host, delay_ms: int, jitter_ms: int = 0) -> Fault:
        """Outgoing packets of `host` delayed by netem; FaultUnavailable where the kernel
        has no netem (CONFIG_NET_SCH_NETEM unset), with nothing changed."""
        argv = ["tc", "qdisc", "add", "dev", "eth0", "root", "netem", "delay", f"{delay_ms}ms"]
        if jitter_ms:
            argv.append(f"{jitter_ms}ms")
        done = host.run(argv, timeout=_NFT_TIMEOUT_S)
        if done.returncode != 0:
            raise FaultUnavailable(f"delay is unavailable on this machine: `tc ... netem` failed"
                                   f" ({done.stderr.strip()}); the kernel needs CONFIG_NET_SCH_NETEM"
                                   " (module sch_netem)")

        def undo() -> None:
            host.run(["tc", "qdisc", "del", "dev", "eth0", "root"], timeout=_NFT_TIMEOUT_S)

        return self._record("delay", [host.name], f"{delay_ms}±{jitter_ms} ms delay out of {host.name}", undo)


def _alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie does not: it holds no file any more)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def netem_available(host: Host) -> bool:
    """Whether this kernel takes a netem qdisc (tried, and removed, on `host`)."""
    done = host.run(["tc", "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms"], timeout=_NFT_TIMEOUT_S)
    if done.returncode == 0:
        host.run(["tc", "qdisc", "del", "dev", "lo", "root"], timeout=_NFT_TIMEOUT_S)
    return done.returncode == 0


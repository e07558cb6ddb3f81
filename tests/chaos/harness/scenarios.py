"""The chaos scenarios on namespace hosts (docs/reliability.md 4.2: B1-B4, R-leader):
a 3-broker cluster (tests/chaos/harness/cluster.py), the recording workload (tests/chaos/harness/workload.py), one
fault schedule drawn from a seed (tests/chaos/harness/faults.py), heal, a final drain, and the
checkers (tests/chaos/harness/checkers.py) -> a `Report`.

    python -m tests.chaos.harness.scenarios run B1 --seed 7 [--runs 3] [--messages N] [--rate R]

runs seeds 7, 8, 9 and prints one JSON line per run and the merged row; the exit
status is 1 when a run is not valid. A run replays from its seed: the seed draws the
fault's timing, which broker the clients enter by, and the metadata operations (the
cluster's own elections are not in the seed: which broker is leader or owner is
looked up, and the fault follows it).

One run:

    Hosts(3) -> Cluster (broker-1..3 on h1..h3) -> workload processes in the root
    namespace, reaching the brokers over the bridge (which faults never cut):
      B*: consumers on Exclusive, Shared (x2) and Failover subscriptions, then one
          reliable producer ((producer, seq) payloads) entering by a seeded broker
      R-leader: three metadata processes (put / get / cas through all admin ports)
          and an observer of each node's (term, role)
    -> the fault schedule, against the broker the cluster says owns the topic (or
       leads Raft) at that moment
    -> the producer finishes its count (or is stopped `tail_s` after the last heal)
    -> SIGUSR1 to the consumers: each exits once nothing came for its drain time
    -> check_run(history, faults) -> Report

Every wait has a deadline; every process, fault and namespace is removed on the way
out (the `with` blocks), a failure included.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.chaos.harness import checkers
from tests.chaos.harness.checkers import Report, check_run
from tests.chaos.harness.clock import Clocks
from tests.chaos.harness.cluster import CONFIG, Broker, Cluster
from tests.chaos.harness.faults import Fault, Faults
from tests.chaos.harness.history import Op, load_history
from tests.chaos.harness.hosts import Host, Hosts, install_tools
from tests.chaos.harness.membership import judge_membership, membership_change
from tests.chaos.harness.power import (
    INTERVAL_ENV,
    Disks,
    judge_loss_window,
    judge_raft_logs,
    power_loss_all,
    raft_torn,
)
from tests.chaos.harness.workload import RECEIVER_QUEUE_SIZE, command

__all__ = ["SCENARIOS", "Scenario", "ScenarioError", "main", "run_scenario"]

TOPIC = "/default/chaos-scenario"
DEADLINE_S = 180.0  # any one wait of a run; a run fails naming what never came
CONSUMERS = (("consumer-ex", "ex", "exclusive"), ("consumer-sh-0", "sh", "shared"),
             ("consumer-sh-1", "sh", "shared"), ("consumer-fo", "fo", "failover"))
METADATA_PROCESSES = 3
# B5, B7: a second Failover consumer, so that the subscription's active consumer can switch.
FAILOVER_PAIR = (*CONSUMERS, ("consumer-fo-1", "fo", "failover"))
HOLD = 10  # B7: unacknowledged messages the killed Shared consumer holds
SESSION_S = 6.0  # B7: past the brokers' session timeout (5 s) before a killed consumer's successor starts
# B7: redelivery after an unacknowledged delivery's timeout, shortened from the default
# 30 s so the run shows it within its length.
B7_CONFIG = "reliable:\n  ack_timeout_ms: 10000\n"
B7_ACK_TIMEOUT_MS = 10_000


class ScenarioError(AssertionError):
    """A run could not be carried out (a process failed, a wait ran out): not a
    checker finding, which is in the Report."""


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    schedule: Callable[[Run], None]
    kind: str = "queue"  # queue: producer + consumers; metadata: Raft registers + observer; mixed: both
    messages: int = 3_000  # producer count (queue) at most
    rate: float = 300.0  # messages per second
    tail_s: float = 8.0  # after the last heal, the workload goes on this long at least
    consumers: tuple[tuple[str, str, str], ...] = CONSUMERS  # (process name, subscription, type)
    holder: str | None = None  # B7: the consumer that stops acknowledging (`--hold`) and is killed
    repeats: int = 10  # B5: topic moves
    fault_s: tuple[float, float] = (10.0, 30.0)  # R2: partition length, drawn from the seed
    config: str = ""  # broker YAML appended to tests/chaos/harness/cluster.py's CONFIG
    clocks: bool = False  # the brokers run under tests/chaos/harness/clock.py's wall-clock shim
    hold_s: float = 60.0  # P*: how long the pressure lasts
    # B1/B2's criteria (reliability.md 4.2): the producer's first acknowledgement after each
    # heal within this; duplicates at most what the consumers may hold unacknowledged per kill.
    resume_within_s: float | None = None
    duplicates_bounded: bool = False
    hosts: int = 3  # namespace hosts; brokers start on the first 3 (R5: a 4th joins later)
    disks: bool = False  # every broker's WAL on tests/chaos/harness/disk.py's layer (B6: power loss)
    env: tuple[tuple[str, str], ...] = ()  # broker environment (DANUBE_STORAGE__WAL_SYNC ...), with `disks`
    # The scenario's own criteria, judged after the run (the cluster is down by then):
    # (run, report, ops) -> the report (criteria_failed, findings) and the row's fields.
    judge: Callable[[Run, Report, list[Op]], tuple[Report, dict[str, Any]]] | None = None


@dataclass
class Run:
    """One run in progress: what a schedule needs to act on the cluster."""

    scenario: Scenario
    seed: int
    rng: random.Random
    cluster: Cluster
    faults: Faults
    history: Path
    logs: Path
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    killed: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)  # by kill_process: exit -9 expected
    consumer_options: dict[str, dict[str, Any]] = field(default_factory=dict)  # name -> command() options
    notes: dict[str, Any] = field(default_factory=dict)
    clocks: Clocks | None = None
    disks: Disks | None = None

    # -- processes ---------------------------------------------------------------------

    def spawn(self, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        with open(self.logs / f"{name}.log", "wb") as log:
            process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        self.processes[name] = process
        return process

    def spawn_consumer(self, name: str, options: dict[str, Any]) -> None:
        self.consumer_options[name] = options
        self.spawn(name, command("consume", name=name, **options))

    def consumers(self) -> list[str]:
        """The consumer processes started and not killed."""
        return [name for name in self.consumer_options if name in self.processes]

    def kill_process(self, name: str) -> Fault:
        """kill -9 workload process `name` (recorded as a fault, healed by the caller)."""
        process = self.processes.pop(name)
        process.kill()
        process.wait(30)
        self.killed[name] = process
        return self.faults.mark("kill9_client", [name], f"kill -9 {name} (pid {process.pid})")

    def count(self, name: str, text: str) -> int:
        path = self.history / f"{name}.jsonl"
        return path.read_text().count(text) if path.exists() else 0

    def log(self, name: str) -> str:
        path = self.logs / f"{name}.log"
        return path.read_text()[-3000:] if path.exists() else ""

    def acked(self, name: str) -> int:
        """Acknowledged operations in `name`'s history so far."""
        path = self.history / f"{name}.jsonl"
        return path.read_text().count('"type":"ok"') if path.exists() else 0

    def has(self, name: str, text: str) -> bool:
        path = self.history / f"{name}.jsonl"
        return path.exists() and text in path.read_text()

    def wait(self, condition: Callable[[], bool], what: str, deadline_s: float = DEADLINE_S) -> None:
        deadline = time.monotonic() + deadline_s
        while not condition():
            if time.monotonic() > deadline:
                raise ScenarioError(f"not within {deadline_s:g} s: {what} (seed {self.seed})")
            for name, process in self.processes.items():
                if process.poll() not in (None, 0):
                    raise ScenarioError(f"{name} exited {process.returncode} while waiting for {what}"
                                        f" (seed {self.seed}):\n{self.log(name)}")
            time.sleep(0.05)

    def sent_fraction(self, fraction: float) -> None:
        """Wait until `fraction` of the producer's count is acknowledged."""
        wanted = max(1, int(self.scenario.messages * fraction))
        self.wait(lambda: self.acked("producer-0") >= wanted, f"{wanted} sends acknowledged")

    def sent_seconds(self, seconds: float) -> None:
        """Wait until `seconds` worth of sends (at the scenario's rate) are acknowledged."""
        wanted = max(1, int(self.scenario.rate * seconds))
        self.wait(lambda: self.acked("producer-0") >= wanted, f"{wanted} sends acknowledged")

    def stop(self, name: str, sig: int = signal.SIGTERM) -> None:
        process = self.processes[name]
        if process.poll() is None:
            process.send_signal(sig)

    def kill_all(self) -> None:
        for process in [*self.processes.values(), *self.killed.values()]:
            if process.poll() is None:
                process.kill()
        for process in self.processes.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(10)

    # -- the cluster -------------------------------------------------------------------

    def owner(self) -> Broker:
        """The broker that owns the topic now, as the first broker answering a lookup says."""
        return asyncio.run(_owner(self.cluster, TOPIC, self.seed))

    def leader(self, **kwargs: Any) -> Broker:
        return asyncio.run(self.cluster.wait_leader(**kwargs))

    def unload(self, via: Broker) -> None:
        """`danube admin topics unload TOPIC` through `via`'s admin port, again while the
        topic is between brokers (FailedPrecondition / Unavailable say "retry")."""
        asyncio.run(_unload(via, TOPIC, self.seed))


async def _unload(via: Broker, topic: str, seed: int) -> None:
    from danube_zmq.client.admin import AdminClient
    from danube_zmq.transport.errors import DanubeError, FailedPrecondition

    deadline = time.monotonic() + DEADLINE_S
    while True:
        try:
            async with AdminClient(via.admin_url, timeout_ms=10_000) as admin:
                await admin.unload_topic(topic, timeout_ms=30_000)
            return
        except DanubeError as exc:
            if not (exc.retriable or isinstance(exc, FailedPrecondition)) or time.monotonic() > deadline:
                raise ScenarioError(f"unload of {topic} through {via.name} failed: {exc!r} (seed {seed})") from exc
        await asyncio.sleep(0.5)


async def _owner(cluster: Cluster, topic: str, seed: int) -> Broker:
    from danube_zmq import DanubeClient
    from danube_zmq.transport.errors import DanubeError

    deadline = time.monotonic() + DEADLINE_S
    last: object = None
    while time.monotonic() < deadline:
        for broker in cluster.brokers:
            try:
                async with DanubeClient(broker.url, request_timeout_ms=2_000, operation_retries_max=1) as client:
                    return cluster.broker(await asyncio.wait_for(client.lookup(topic), 5))
            except (DanubeError, OSError, TimeoutError, StopIteration) as exc:
                last = exc
        await asyncio.sleep(0.2)
    raise ScenarioError(f"no broker named the owner of {topic} within {DEADLINE_S:g} s (last: {last!r}; seed {seed})")


# -- fault schedules -------------------------------------------------------------------

def _owner_kill(run: Run) -> None:
    """B1: kill -9 the topic's owner once 20-80% of the sends are acknowledged; its
    host's supervisor restarts it (Faults.kill9 returns then: the heal)."""
    at = run.rng.uniform(0.2, 0.8)
    run.notes["kill_at"] = round(at, 3)
    run.sent_fraction(at)
    run.faults.kill9(run.owner())


def _hard_bounce(run: Run) -> None:
    """B2 (Kafka's hard bounce): kill -9 whichever broker owns the topic, 5 times, 5 s
    apart (each after the previous one has been restarted)."""
    run.sent_seconds(run.rng.uniform(2.0, 5.0))
    for i in range(5):
        victim = run.owner()
        run.notes.setdefault("victims", []).append(victim.name)
        run.faults.kill9(victim)
        if i < 4:
            time.sleep(5)


def _owner_pause(run: Run) -> None:
    """B3: SIGSTOP the owner for 15 s while the producer keeps sending, then SIGCONT.
    Its lease runs out meanwhile: another broker takes the topic over and the resumed
    one must not append (an append of the old owner would show as an offset naming two
    messages, or a lost acknowledged message)."""
    run.sent_seconds(run.rng.uniform(2.0, 6.0))
    fault = run.faults.pause(run.owner())
    time.sleep(15)
    run.faults.heal(fault)


def _owner_isolate(run: Run) -> None:
    """B4: isolate the owner's host from the other brokers for 30 s, then heal. The
    clients (on the bridge) still reach it: it must stop acknowledging once its lease
    is gone, and the majority's new owner serves the topic."""
    run.sent_seconds(run.rng.uniform(2.0, 6.0))
    owner = run.owner()
    fault = run.faults.isolate(owner.host)
    time.sleep(30)
    run.faults.heal(fault)


def _leader_isolate(run: Run, partition_s: float) -> None:
    """R-leader: isolate the Raft leader's host while the metadata workload runs; the
    majority elects another leader (asserted); heal after `partition_s`."""
    writers = [f"admin-{i}" for i in range(METADATA_PROCESSES)]
    run.wait(lambda: all(run.acked(w) >= 20 for w in writers), "metadata writes before the partition")
    time.sleep(run.rng.uniform(0.0, 2.0))
    old = run.leader()
    fault = run.faults.isolate(old.host)
    new = run.leader(among=[b for b in run.cluster.brokers if b is not old], exclude=old.node_id)
    run.notes["leaders"] = [old.name, new.name]
    time.sleep(max(0.0, partition_s - (run.faults.clock() - fault.started_at)))
    run.faults.heal(fault)


def _topic_moves(run: Run) -> None:
    """B5: while the producer sends, move the topic off its owner `repeats` times, a
    few seconds apart (`topics unload` through a seeded broker's admin port: the owner
    seals it and the load manager assigns it to another broker). Each move is a fault
    from the unload to the moment a lookup names a new owner; the owners are in the
    notes, and a move that leaves the topic where it was fails the run."""
    run.sent_seconds(run.rng.uniform(2.0, 5.0))
    owners = [run.owner().name]
    for _ in range(run.scenario.repeats):
        old = run.cluster.broker(owners[-1])
        via = run.rng.choice(run.cluster.brokers)
        fault = run.faults.mark("move", [old.name], f"topics unload {TOPIC} (owner {old.name}, via {via.name})")
        run.unload(via)
        deadline = time.monotonic() + DEADLINE_S / 3
        while (new := run.owner()) is old:
            if time.monotonic() > deadline:
                raise ScenarioError(f"the owner of {TOPIC} is still {old.name} {DEADLINE_S / 3:g} s after its unload"
                                    f" (owners so far {owners}; seed {run.seed})")
            time.sleep(0.2)
        run.faults.heal(fault)
        fault.description += f"; now on {new.name}"
        owners.append(new.name)
        time.sleep(run.rng.uniform(2.0, 4.0))
    run.notes["owners"] = owners


def _consumer_crash(run: Run) -> None:
    """B7: the holding Shared consumer is killed with SIGKILL once it has received HOLD
    messages it never acknowledges (they must come to the other Shared consumer:
    checked after the run, with the time they took); then the Exclusive and the active
    Failover consumers are killed and, past the session timeout, started again as new
    processes (the Failover standby takes over meanwhile): first deliveries stay in
    send order on both subscriptions."""
    holder = run.scenario.holder
    assert holder is not None
    run.wait(lambda: run.count(holder, '"held":true') >= HOLD, f"{holder} holding {HOLD} unacknowledged messages")
    time.sleep(run.rng.uniform(0.0, 1.0))
    run.faults.heal(run.kill_process(holder))  # nothing restarts it: its messages must move
    time.sleep(run.rng.uniform(1.0, 3.0))
    failover = [name for name, _, sub_type in run.scenario.consumers if sub_type == "failover"]
    active = max(failover, key=lambda name: run.count(name, '"f":"deliver"'))
    crashed = [("consumer-ex", run.kill_process("consumer-ex")), (active, run.kill_process(active))]
    run.notes["crashed"] = [holder, "consumer-ex", active]
    time.sleep(SESSION_S)
    for name, fault in crashed:
        run.spawn_consumer(f"{name}-r1", run.consumer_options[name])
        run.faults.heal(fault)
    run.wait(lambda: all(run.has(f"{name}-r1", '"f":"subscribe"') for name, _ in crashed), "the restarted consumers subscribed")


def _raft_partition(run: Run, shape: str) -> None:
    """R2: one partition shape for a seeded 10-30 s (`fault_s`) under the metadata
    workload, around the Raft leader of that moment (L; the followers F1, F2 in a
    seeded order):
      bridge: L and F2 cannot talk, both reach F1 (the bridge node)
      one_way: F1 and F2 drop what L sends; L still hears them
      follower: F1 isolated from L and F2 (the majority keeps the leader)
      minority_leader: L isolated (the majority F1, F2 must elect a leader: awaited)
    then heal; the leader after the heal is in the notes."""
    writers = [f"admin-{i}" for i in range(METADATA_PROCESSES)]
    run.wait(lambda: all(run.acked(w) >= 20 for w in writers), "metadata writes before the partition")
    time.sleep(run.rng.uniform(0.0, 2.0))
    partition_s = run.rng.uniform(*run.scenario.fault_s)
    leader = run.leader()
    f1, f2 = run.rng.sample([b for b in run.cluster.brokers if b is not leader], 2)
    run.notes.update(shape=shape, leader=leader.name, followers=[f1.name, f2.name], partition_s=round(partition_s, 1))
    if shape == "bridge":
        made = [run.faults.bridge(leader.host, f1.host, f2.host)]
    elif shape == "one_way":
        made = [run.faults.one_way(leader.host, f1.host), run.faults.one_way(leader.host, f2.host)]
    elif shape == "follower":
        made = [run.faults.isolate(f1.host)]
    elif shape == "minority_leader":
        made = [run.faults.isolate(leader.host)]
        run.notes["majority_leader"] = run.leader(among=[f1, f2], exclude=leader.node_id).name
    else:
        raise ValueError(f"unknown partition shape {shape!r}")
    time.sleep(max(0.0, partition_s - (run.faults.clock() - made[0].started_at)))
    for fault in made:
        run.faults.heal(fault)
    run.notes["leader_after_heal"] = run.leader().name
def _clock_jumps(run: Run, cycles: int = 2) -> None:
    """R4: step the wall clock of the Raft leader's host, then of the topic owner's (a
    seeded follower's when the leader owns the topic), by +30 s and by -30 s (each held
    3-6 s, then set right), `cycles` times each, under
    metadata writes and a reliable stream. Raft, leases and fencing must run on the
    monotonic clock: no election beyond one, nothing lost, linearizable."""
    assert run.clocks is not None
    writers = [f"admin-{i}" for i in range(METADATA_PROCESSES)]
    run.wait(lambda: all(run.acked(w) >= 20 for w in writers), "metadata writes before the first jump")
    run.sent_seconds(run.rng.uniform(2.0, 4.0))
    leader = run.leader()
    for role in ("leader", "owner"):
        target = leader if role == "leader" else run.owner()
        if role == "owner" and target == leader:  # one host already had it: a follower's clock instead
            role, target = "follower", run.rng.choice([b for b in run.cluster.brokers if b != leader])
        run.notes.setdefault("targets", []).append(f"{role} {target.name}")
        for _ in range(cycles):
            for step in (30.0, -30.0):
                fault = run.faults.clock_jump(run.clocks, target.host, step)
                time.sleep(run.rng.uniform(3.0, 6.0))
                run.faults.heal(fault)
                # a topic moved off a live broker would show here (a wall-clock lease expiry)
                run.notes.setdefault("owners_after_steps", []).append(run.owner().name)


# -- back-pressure (P1-P3): the owner's memory under a backlog, a stall, a flood ---------

def _rss_mib(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


class RssSampler:
    """The resident set of one process, sampled every `interval_s` in a thread:
    `with RssSampler(pid) as rss: ...`, then `rss.figures()` (MiB: start, peak, end)."""

    def __init__(self, pid: int, interval_s: float = 0.5) -> None:
        self.pid, self.interval_s = pid, interval_s
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="rss", daemon=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            value = _rss_mib(self.pid)
            if value is not None:
                self.samples.append(value)
            self._stop.wait(self.interval_s)

    def figures(self) -> dict[str, float]:
        if not self.samples:
            raise ScenarioError(f"no RSS sample of pid {self.pid}")
        start, peak, end = self.samples[0], max(self.samples), self.samples[-1]
        return {"rss_start_mib": round(start, 1), "rss_peak_mib": round(peak, 1), "rss_end_mib": round(end, 1),
                "rss_growth_mib": round(peak - start, 1)}

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)


def _count(run: Run, name: str, text: str) -> int:
    path = run.history / f"{name}.jsonl"
    return path.read_text().count(text) if path.exists() else 0


def _consumer(run: Run, name: str, subscription: str, sub_type: str, **options: Any) -> None:
    budget_s = run.scenario.messages / run.scenario.rate + 2 * DEADLINE_S
    run.spawn(name, command("consume", url=run.rng.choice(run.cluster.brokers).url, topic=TOPIC, name=name,
                            history_dir=run.history, subscription=subscription, sub_type=sub_type,
                            duration_s=budget_s, **options))


def _producers(run: Run, count: int, **options: Any) -> list[str]:
    scenario = run.scenario
    names = [f"producer-{i}" for i in range(count)]
    for name in names:
        run.spawn(name, command("produce", url=run.rng.choice(run.cluster.brokers).url, topic=TOPIC, name=name,
                                history_dir=run.history, reliable=True, count=scenario.messages, rate=scenario.rate,
                                pad_bytes=1024, duration_s=scenario.messages / scenario.rate + DEADLINE_S,
                                grace_s=30, **options))
    return names


def _under_pressure(run: Run, producers: list[str], consumers: list[str],
                    during: Callable[[], None]) -> tuple[dict[str, float], float, dict[str, int], dict[str, int]]:
    """Wait for the consumers and 2 s of sends, then run `during` while sampling the
    owner's RSS: its figures, the seconds it took, and the acknowledged sends and the
    deliveries per consumer at its start and its end."""
    run.wait(lambda: all(run.has(name, '"f":"subscribe"') for name in consumers), "every consumer subscribed")
    run.wait(lambda: sum(run.acked(p) for p in producers) >= 2 * run.scenario.rate, "2 s of sends acknowledged")
    owner = run.owner()
    pid = owner.pid()
    if pid is None:
        raise ScenarioError(f"the owner {owner.name} has no pid (seed {run.seed})")
    run.notes["owner"] = owner.name

    def counts() -> dict[str, int]:
        return {"acked": sum(run.acked(p) for p in producers),
                **{c: _count(run, c, '"f":"deliver"') for c in consumers}}

    with RssSampler(pid) as rss:
        time.sleep(1.0)  # the start sample is taken under load, with the topic's buffers made
        before, started = counts(), time.monotonic()
        during()
        after, took = counts(), time.monotonic() - started
    return rss.figures(), took, before, after


def _slow_consumer(run: Run) -> None:
    """P1: a reliable 1 KiB stream; subscription `slow` acknowledges 10 msg/s, `fast`
    keeps up. For `hold_s` the slow backlog grows in the WAL, not in the owner's memory,
    and the fast subscription keeps pace with the producer; then the slow consumer
    speeds up (the drain) and must get everything."""
    consumers = ["consumer-fast", "consumer-slow"]
    _consumer(run, "consumer-fast", "fast", "exclusive")
    _consumer(run, "consumer-slow", "slow", "exclusive", ack_rate=10)
    producers = _producers(run, 1)
    figures, took, before, after = _under_pressure(run, producers, consumers,
                                                   lambda: time.sleep(run.scenario.hold_s))
    acked = after["acked"] - before["acked"]
    fast = after["consumer-fast"] - before["consumer-fast"]
    run.notes.update(figures, seconds=round(took, 1), acked_rate=round(acked / took), fast_rate=round(fast / took),
                     fast_ratio=round(fast / max(1, acked), 3),
                     slow_delivered=after["consumer-slow"], slow_backlog=after["acked"] - after["consumer-slow"])
    _finish_producer(run, producers)
    _drain_consumers(run, consumers)


def _stalled_consumer(run: Run) -> None:
    """P2: two consumers on a Shared subscription and an Exclusive one; one Shared
    consumer's process is stopped (SIGSTOP) for `hold_s`: the owner's memory stays
    bounded, and what it held unacknowledged is redelivered to the other Shared
    consumer after the ack timeout (the cluster's `reliable.ack_timeout_ms`)."""
    consumers = ["consumer-sh-0", "consumer-sh-1", "consumer-ex"]
    _consumer(run, "consumer-sh-0", "sh", "shared")
    _consumer(run, "consumer-sh-1", "sh", "shared")
    _consumer(run, "consumer-ex", "ex", "exclusive")
    producers = _producers(run, 1)

    def stall() -> None:
        fault = run.faults.pause_process(run.processes["consumer-sh-0"].pid, "consumer-sh-0")
        time.sleep(run.scenario.hold_s)
        run.faults.heal(fault)

    figures, took, before, after = _under_pressure(run, producers, consumers, stall)
    acked = after["acked"] - before["acked"]
    run.notes.update(figures, seconds=round(took, 1), acked_rate=round(acked / took),
                     sh1_rate=round((after["consumer-sh-1"] - before["consumer-sh-1"]) / took))
    _finish_producer(run, producers)
    _drain_consumers(run, consumers)
    other = [json.loads(line) for line in (run.history / "consumer-sh-1.jsonl").read_text().splitlines()
             if '"f":"deliver"' in line]
    stalled = {(json.loads(line)["value"]["producer"], json.loads(line)["value"]["seq"])
               for line in (run.history / "consumer-sh-0.jsonl").read_text().splitlines() if '"f":"deliver"' in line}
    # What the stopped consumer held unacknowledged was mostly still in its client's
    # queue (never recorded), so count every redelivery the other consumer got; of those,
    # `..._recorded` the stopped one had recorded before it stopped.
    redelivered = [d for d in other if d["value"]["redelivery"] > 0]
    run.notes["redelivered_to_other"] = len(redelivered)
    run.notes["redelivered_to_other_recorded"] = sum(
        1 for d in redelivered if (d["value"]["producer"], d["value"]["seq"]) in stalled)


def _producer_flood(run: Run, producers_n: int = 4) -> None:
    """P3: `producers_n` reliable producers at far more than the owner can store (each
    offering `rate` 1 KiB messages a second, 5,000 in flight), one Exclusive consumer:
    the owner's memory stays bounded, the producers are held back (their receipts come
    at the rate the owner stores, or RESOURCE_EXHAUSTED, which the client retries), and
    nothing acknowledged is lost."""
    consumers = ["consumer-ex"]
    _consumer(run, "consumer-ex", "ex", "exclusive", deliveries_max=run.scenario.messages)
    producers = _producers(run, producers_n, inflight_max=5_000)
    figures, took, before, after = _under_pressure(run, producers, consumers,
                                                   lambda: time.sleep(run.scenario.hold_s))
    acked = after["acked"] - before["acked"]
    run.notes.update(figures, seconds=round(took, 1), offered_rate=round(producers_n * run.scenario.rate),
                     acked_rate=round(acked / took),
                     resource_exhausted=sum(_count(run, p, "RESOURCE_EXHAUSTED") for p in producers))
    for name in producers:
        run.stop(name)
    run.wait(lambda: all(run.processes[n].poll() is not None for n in producers), "the producers stopped")
    _drain_consumers(run, consumers)


SCENARIOS: dict[str, Scenario] = {s.name: s for s in (
    Scenario("B1", "owner kill -9 mid-stream", _owner_kill, messages=3_000, rate=300, resume_within_s=10.0,
             duplicates_bounded=True),
    Scenario("B2", "hard bounce: owner kill -9 x5, 5 s apart", _hard_bounce, messages=100_000, rate=300,
             resume_within_s=10.0, duplicates_bounded=True),
    Scenario("B3", "SIGSTOP of the owner for 15 s", _owner_pause, messages=100_000, rate=300),
    Scenario("B4", "owner isolated from the other brokers for 30 s", _owner_isolate, messages=100_000, rate=300),
    Scenario("R-leader", "Raft leader isolated for 10 s under metadata writes",
             lambda run: _leader_isolate(run, 10.0), kind="metadata", tail_s=6.0),
    Scenario("B5", "topic moved between brokers 10 times under load", _topic_moves, messages=100_000, rate=300,
             consumers=FAILOVER_PAIR),
    Scenario("B7", "kill -9 of a Shared consumer holding 10 unacknowledged messages, then of the Exclusive and"
             " the active Failover consumers (restarted)", _consumer_crash, messages=100_000, rate=300,
             consumers=FAILOVER_PAIR, holder="consumer-sh-0", config=B7_CONFIG, tail_s=15.0),
    *(Scenario(f"R2-{shape.replace('_', '-')}", f"Raft partition ({shape.replace('_', ' ')}) for 10-30 s under"
               " metadata writes", lambda run, shape=shape: _raft_partition(run, shape), kind="metadata", tail_s=6.0)
      for shape in ("bridge", "one_way", "follower", "minority_leader")),
    Scenario("R4", "wall clock of the Raft leader's, then the owner's host stepped +-30 s, twice each",
             _clock_jumps, kind="mixed", messages=100_000, rate=200, tail_s=8.0, clocks=True),
    Scenario("P1", "slow consumer (10 msg/s) beside a fast one under a 2,000 msg/s x 1 KiB stream",
             _slow_consumer, kind="pressure", messages=1_000_000, rate=2_000, tail_s=2.0),
    Scenario("P2", "a Shared consumer stopped (SIGSTOP) under a 2,000 msg/s x 1 KiB stream",
             _stalled_consumer, kind="pressure", messages=1_000_000, rate=2_000, tail_s=2.0,
             config="reliable:\n  ack_timeout_ms: 5000\n"),
    Scenario("P3", "4 producers flooding one topic (1 KiB, 20,000 msg/s offered each)",
             _producer_flood, kind="pressure", messages=10_000_000, rate=20_000, tail_s=2.0, hold_s=20.0),
    Scenario("B6", "power loss of all 3 brokers at once (wal_sync always): WALs cut to what was fsynced",
             power_loss_all, messages=3_000, rate=300, disks=True),
    Scenario("B6-interval", "power loss of all 3 brokers at once (wal_sync interval, 200 ms)", power_loss_all,
             messages=3_000, rate=300, disks=True, env=INTERVAL_ENV, judge=judge_loss_window),
    Scenario("R3", "Raft leader or follower loses power under metadata writes: its Raft log's last record torn",
             raft_torn, kind="metadata", tail_s=6.0, judge=judge_raft_logs),
    Scenario("R5", "Raft membership: a 4th node added and promoted, a founder removed, the leader killed during"
             " each change", membership_change, kind="metadata", tail_s=6.0, hosts=4, judge=judge_membership),
)}


# -- one run ---------------------------------------------------------------------------

def run_scenario(name: str, seed: int, work_dir: Path, **overrides: Any) -> tuple[Report, dict[str, Any]]:
    """One run of scenario `name` from `seed` in `work_dir` (histories, logs, broker
    data): its Report and the row to print (JSON-able: seed, faults, counts, notes).
    `overrides` replace Scenario fields (messages, rate, tail_s)."""
    base = SCENARIOS[name]
    scenario = Scenario(**{**base.__dict__, **overrides})
    work_dir.mkdir(parents=True, exist_ok=True)
    history, logs = work_dir / "history", work_dir / "logs"
    history.mkdir(exist_ok=True)
    logs.mkdir(exist_ok=True)
    install_tools()
    with contextlib.ExitStack() as stack:
        hosts = stack.enter_context(Hosts(scenario.hosts))
        clocks = stack.enter_context(Clocks(hosts, work_dir / "clocks")) if scenario.clocks else None
        disks = Disks(work_dir / "disks", scenario.env) if scenario.disks else None
        cluster = stack.enter_context(Cluster(hosts, work_dir / "cluster", config=CONFIG + scenario.config,
                                              host_env=_host_env(clocks, disks), members=3))
        faults = stack.enter_context(Faults(hosts))
        run = Run(scenario=scenario, seed=seed, rng=random.Random(seed), cluster=cluster, faults=faults,
                  history=history, logs=logs, clocks=clocks, disks=disks)
        try:
            cluster_ready = asyncio.run(cluster.wait_leader(deadline_s=DEADLINE_S))
            run.notes["first_leader"] = cluster_ready.name
            if clocks is not None:
                _check_shimmed(cluster, clocks, seed)
            {"queue": _queue_run, "metadata": _metadata_run, "mixed": _mixed_run,
             "pressure": scenario.schedule}[scenario.kind](run)
        finally:
            faults.heal_all()
            run.kill_all()
    records = faults.history
    ops = load_history(history)
    metadata = scenario.kind in ("metadata", "mixed")
    report = check_run(f"{name} {scenario.description}", ops, [_checker_fault(f) for f in records],
                       check_linearizable=False)
    raft = checkers.check_raft(ops, checkers.leader_observations(ops)) if metadata else None
    if raft is not None and raft.linearizable is False:
        report = dataclasses.replace(report, not_linearizable=1, findings=(*report.findings, raft.explanation))
    extra: dict[str, Any] = {}
    report = _check_criteria(report, scenario, records)
    if scenario.holder is not None:
        report, extra = _check_held(report, ops, scenario.holder, records)
    if scenario.judge is not None:
        report, judged = scenario.judge(run, report, ops)
        extra.update(judged)
    if sum(sub_type == "failover" for *_, sub_type in scenario.consumers) > 1:
        extra["failover_switches"] = _failover_switches(ops)
    row = {"scenario": name, "seed": seed, "valid": report.valid, "faults": [f.description for f in records],
           **{k: getattr(report, k) for k in ("attempted", "acked", "failed", "info", "deliveries", "lost",
                                               "unexpected", "duplicates", "redeliveries", "recovered",
                                               "nonmonotonic", "inconsistent_offsets", "offset_gaps_explained",
                                               "offset_gaps_unexplained", "split_terms", "not_linearizable",
                                               "never_recovered", "criteria_failed")},
           "recovery_ack_ms": [round(t) for t in report.recovery_ack_ms],
           "recovery_delivery_ms": [round(t) for t in report.recovery_delivery_ms],
           **extra, "notes": run.notes, "findings": list(report.findings)}
    if raft is not None:
        row["metadata_ops"] = dict(Counter(f"{op.f} {op.type}" for op in ops if op.f in checkers.METADATA_FS
                                           and op.type != "invoke"))
        row.update(linearizable=raft.linearizable, terms=raft.terms, linearizability=raft.explanation)
        row["elections"] = max(0, raft.terms - 1)  # terms the observer saw begin after its first
    return report, row


def _check_criteria(report: Report, scenario: Scenario, faults: list[Fault]) -> Report:
    """The scenario's own pass criteria beyond the checkers' (B1, B2): each fault's heal
    followed by an acknowledged send within `resume_within_s`, unless the next fault
    began before that send (B2's kills come 5 s apart: the last heal is the one judged);
    duplicates at most the messages the consumers may hold delivered and unacknowledged
    at each kill (their receiver queues, `max_unacked` in the reference's words). A miss
    is a finding and makes the run invalid."""
    findings: list[str] = []
    if scenario.resume_within_s is not None:
        bound_ms = scenario.resume_within_s * 1000
        late = []
        for i, took_ms in enumerate(report.recovery_ack_ms):
            if took_ms <= bound_ms:
                continue
            healed = faults[i].healed_at if i < len(faults) else None
            following = faults[i + 1].started_at if i + 1 < len(faults) else None
            if healed is not None and following is not None and (following - healed) * 1000 < took_ms:
                continue  # interrupted: the next fault came first
            late.append(took_ms)
        if late:
            findings.append(f"the producer resumed {max(late):,.0f} ms after a heal"
                            f" (criterion: within {scenario.resume_within_s:g} s)")
    if scenario.duplicates_bounded:
        bound = len(faults) * len(scenario.consumers) * RECEIVER_QUEUE_SIZE
        if report.duplicates > bound:
            findings.append(f"{report.duplicates} duplicates, more than the {bound} the consumers could hold"
                            f" unacknowledged at {len(faults)} kills")
    if not findings:
        return report
    return dataclasses.replace(report, criteria_failed=report.criteria_failed + len(findings),
                               findings=(*report.findings, *findings))


def _check_held(report: Report, ops: list[Op], holder: str, faults: list[Fault]) -> tuple[Report, dict[str, Any]]:
    """B7: each message `holder` received without acknowledging (`held`) must be
    delivered again on its subscription by another consumer after `holder` was killed;
    one that never is counts as lost (the queue checker alone would not see it: the
    killed consumer's delivery is on the subscription's record). Returns the report and
    the row's fields: held, redelivered, and the time from the kill to each one's first
    delivery elsewhere (the pass criterion: within the ack timeout + 1 s)."""
    kill = next(f for f in faults if f.targets == (holder,))
    kill_ns = int(kill.started_at * 1e9)
    held = {(op.value["producer"], op.value["seq"]): op.value["subscription"] for op in ops
            if op.process == holder and op.f == "deliver" and op.value.get("held")}
    first: dict[tuple[str, int], int] = {}
    for op in ops:
        if op.f == "deliver" and op.process != holder and op.time_ns >= kill_ns:
            key = (op.value.get("producer"), op.value.get("seq"))
            if held.get(key) == op.value.get("subscription"):
                first.setdefault(key, op.time_ns)
    missing = sorted(set(held) - set(first))
    delays_ms = sorted((t - kill_ns) / 1e6 for t in first.values())
    fields = {"held": len(held), "held_redelivered": len(first),
              "held_redelivery_ms_max": round(delays_ms[-1]) if delays_ms else None}
    if not held:
        missing_text = f"{holder} held no message when it was killed: B7 tested nothing"
        return dataclasses.replace(report, never_recovered=report.never_recovered + 1,
                                   findings=(*report.findings, missing_text)), fields
    if missing:
        report = dataclasses.replace(report, lost=report.lost + len(missing), findings=(
            *report.findings, f"{len(missing)} messages held by the killed {holder} never delivered to another"
                              f" consumer of its subscription (e.g. {missing[:5]})"))
    return report, fields


def _failover_switches(ops: list[Op]) -> int:
    """How often the process receiving first deliveries on the Failover subscription
    changed: the takeovers the order checker judged."""
    seen: set[tuple[str, int]] = set()
    switches, last = 0, None
    for op in ops:
        if op.f != "deliver" or op.value.get("sub_type") != "failover":
            continue
        key = (op.value.get("producer"), op.value.get("seq"))
        if key in seen:
            continue
        seen.add(key)
        switches += last is not None and op.process != last
        last = op.process
    return switches
def _check_shimmed(cluster: Cluster, clocks: Clocks, seed: int) -> None:
    """Every broker maps the wall-clock shim (a clock fault on a broker without it would
    test nothing)."""
    for broker in cluster.brokers:
        pid = broker.pid()
        maps = Path(f"/proc/{pid}/maps").read_text() if pid is not None else ""
        if str(clocks.library) not in maps:
            raise ScenarioError(f"{broker.name} (pid {pid}) runs without the clock shim {clocks.library} (seed {seed})")


def _host_env(clocks: Clocks | None, disks: Disks | None) -> Callable[[Host], dict[str, str]] | None:
    """The extra environment of each host's supervisor (its brokers inherit it): the
    clock shim, the faulty WAL layer, or both."""
    if clocks is None and disks is None:
        return None
    return lambda host: {**(clocks.env(host) if clocks else {}), **(disks.env(host) if disks else {})}


def _checker_fault(fault: Fault) -> checkers.Fault:
    healed = fault.healed_at if fault.healed_at is not None else fault.started_at
    return checkers.Fault(fault.description, int(fault.started_at * 1e9), int(healed * 1e9))


def _queue_run(run: Run) -> None:
    _start_queue(run)
    run.scenario.schedule(run)
    _finish_producer(run, ["producer-0"])
    _drain_consumers(run)


def _drain_consumers(run: Run, names: list[str] | None = None) -> None:
    names = names or run.consumers()
    for name in names:
        run.stop(name, signal.SIGUSR1)  # drain: exit once nothing more comes
    run.wait(lambda: all(run.processes[name].poll() is not None for name in names), "the consumers drained")


def _start_queue(run: Run) -> None:
    scenario = run.scenario
    entry = run.rng.choice(run.cluster.brokers)  # the producer enters by any broker: lookups redirect it
    run.notes["producer_entry"] = entry.name
    budget_s = scenario.messages / scenario.rate + DEADLINE_S
    for name, sub, sub_type in scenario.consumers:
        options: dict[str, Any] = dict(url=run.rng.choice(run.cluster.brokers).url, topic=TOPIC,
                                       history_dir=run.history, subscription=sub, sub_type=sub_type,
                                       duration_s=budget_s + DEADLINE_S)
        if name == scenario.holder:
            options.update(hold=HOLD, hold_after=run.rng.randint(300, 1_500))
            run.notes["hold_after"] = options["hold_after"]
        run.spawn_consumer(name, options)
    run.spawn("producer-0", command("produce", url=entry.url, topic=TOPIC, name="producer-0",
                                    history_dir=run.history, reliable=True, count=scenario.messages,
                                    rate=scenario.rate, duration_s=budget_s, grace_s=30))
    run.wait(lambda: all(run.has(name, '"f":"subscribe"') for name, *_ in scenario.consumers),
             "every consumer subscribed")


def _metadata_run(run: Run) -> None:
    scenario = run.scenario
    writers = _start_metadata(run)
    scenario.schedule(run)
    _finish_producer(run, writers)
    run.stop("observer")
    run.wait(lambda: run.processes["observer"].poll() is not None, "the observer stopped")


def _mixed_run(run: Run) -> None:
    """The metadata workload and the queue workload at once (R4)."""
    writers = _start_metadata(run)
    _start_queue(run)
    run.scenario.schedule(run)
    _finish_producer(run, ["producer-0", *writers])
    _drain_consumers(run)
    run.stop("observer")
    run.wait(lambda: run.processes["observer"].poll() is not None, "the observer stopped")


def _start_metadata(run: Run) -> list[str]:
    urls = [b.admin_url for b in run.cluster.brokers]
    run.spawn("observer", command("observe", name="observer", history_dir=run.history, admin_url=urls,
                                  interval_ms=100, request_timeout_ms=500, duration_s=DEADLINE_S * 2))
    writers = [f"admin-{i}" for i in range(METADATA_PROCESSES)]
    for i, name in enumerate(writers):
        run.spawn(name, command("metadata", name=name, history_dir=run.history, admin_url=urls, ops=100_000,
                                keys=10, seed=run.seed * 100 + i, pause_ms=20, request_timeout_ms=1_500,
                                duration_s=DEADLINE_S * 2))
    return writers


def _finish_producer(run: Run, names: list[str]) -> None:
    """Let the writers go on until they finish their count, or until `tail_s` after
    the last heal with a write acknowledged since; then SIGTERM (what is in flight is
    recorded `info`)."""
    healed = max((f.healed_at or f.started_at for f in run.faults.history), default=run.faults.clock())
    counts = {name: run.acked(name) for name in names}
    deadline = time.monotonic() + DEADLINE_S

    def done() -> bool:
        if all(run.processes[n].poll() is not None for n in names):
            return True
        settled = run.faults.clock() - healed >= run.scenario.tail_s
        return (settled and all(run.acked(n) > counts[n] for n in names)) or time.monotonic() > deadline

    run.wait(done, "the writers finished", DEADLINE_S + 10)
    for name in names:
        run.stop(name)
    run.wait(lambda: all(run.processes[n].poll() is not None for n in names), "the writers stopped")


# -- the command line ------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos.harness.scenarios", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    run_ = commands.add_parser("run", help="run a scenario from a seed (and the next seeds with --runs)")
    run_.add_argument("name", choices=sorted(SCENARIOS))
    run_.add_argument("--seed", type=int, required=True)
    run_.add_argument("--runs", type=int, default=1, help="seeds seed, seed+1, ...")
    run_.add_argument("--messages", type=int, help="producer count (default: the scenario's)")
    run_.add_argument("--rate", type=float, help="messages per second (default: the scenario's)")
    run_.add_argument("--repeats", type=int, help="B5: topic moves (default 10)")
    run_.add_argument("--fault-s", type=float, nargs=2, metavar=("MIN", "MAX"),
                      help="R2: partition length range in seconds (default 10 30)")
    run_.add_argument("--hold-s", type=float, help="P*: how long the pressure lasts (default: the scenario's)")
    run_.add_argument("--work-dir", type=Path, help="histories, logs and data (default: a new temporary dir)")
    commands.add_parser("list", help="the scenarios")
    args = parser.parse_args(argv)
    if args.command == "list":
        for s in SCENARIOS.values():
            print(f"{s.name}\t{s.description}")
        return 0
    if args.runs <= 0:
        raise SystemExit("--runs must be positive")
    overrides = {k: v for k, v in (("messages", args.messages), ("rate", args.rate), ("repeats", args.repeats),
                                   ("fault_s", tuple(args.fault_s) if args.fault_s else None),
                                   ("hold_s", args.hold_s)) if v is not None}
    work = args.work_dir or Path(tempfile.mkdtemp(prefix=f"chaos-{args.name}-"))
    merged: Report | None = None
    for seed in range(args.seed, args.seed + args.runs):
        report, row = run_scenario(args.name, seed, work / f"seed-{seed}", **overrides)
        print(json.dumps(row), flush=True)
        merged = report if merged is None else merged.merge(report)
    assert merged is not None
    print(f"{Report.HEADER}\n{merged.row()}\n(histories and logs in {work})")
    return 0 if merged.valid else 1


if __name__ == "__main__":
    sys.exit(main())

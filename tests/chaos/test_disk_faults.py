"""Disk faults on a real broker process: power loss (B6-style) and a failing fsync (W5),
through the chaos launcher (`python -m tests.chaos.harness.disk broker ...`), which runs
`danube broker start` with the fault-injecting WAL file layer and a journal of what
each fsync made durable.

Power loss = kill -9, then `crash_journal` cuts every WAL file to what was fsynced
(half the seeds keep a random part of the unsynced tail), then a restart on the same
data dir. With `storage.wal_sync: always` (the default) nothing is acknowledged before
its fsync, so the check is Jepsen's queue checker: every acknowledged message is
consumed (lost = 0), nothing never sent is consumed (unexpected = 0), first deliveries
in send order, offsets continuous; duplicates are counted and reported.

The metadata store, catalog and cursors are not on the faulty layer: they live through
the crash as through a kill -9 (tests/chaos/harness/README.md, "Disk faults")."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import json
import random
import signal
import struct
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from danube_zmq import DanubeClient, SubType
from danube_zmq.transport.errors import DanubeError, Timeout
from tests.chaos.harness.disk import Rule, crash_journal, fsync_starts, launcher, write_control
from tests.integration.conftest import BrokerProcess, start_broker

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the chaos harness runs on Linux")

TOPIC = "/default/power"
# Small segments, so crashes land around rolls and new files too.
ENV = {"DANUBE_STORAGE__WAL_SEGMENT_BYTES_MAX": str(64 * 1024), "DANUBE_STORAGE__WAL_SYNC": "always"}
PADDING = b"p" * 92  # 100-byte messages: the sequence number, then padding
DEADLINE_S = 120.0  # every wait is bounded; generous, never a timing assertion


def encode(seq: int) -> bytes:
    return struct.pack(">Q", seq) + PADDING


@dataclass
class Outcome:
    acked: set[int] = field(default_factory=set)
    failed: dict[int, str] = field(default_factory=dict)  # seq -> error text
    acked_ns: dict[int, int] = field(default_factory=dict)  # seq -> time.monotonic_ns() of its receipt


class DiskChaos:
    """One broker under the launcher, restartable on the same ports and data dir."""

    def __init__(self, tmp_path: Path, seed: int, *, extra: tuple[str, ...] = (),
                 env: dict[str, str] | None = None) -> None:
        self.tmp_path = tmp_path
        self.seed = seed
        self.env = {**ENV, **(env or {})}
        self.control = tmp_path / "control.json"
        self.journal = tmp_path / "journal"
        self.extra = extra
        write_control(self.control, seed=seed, journal=self.journal)
        self.broker = self._start()
        self.crashes: list[dict[str, int]] = []

    def _start(self, **ports: str) -> BrokerProcess:
        return start_broker(self.tmp_path, *self.extra, env=self.env, launcher=launcher(self.control), **ports)

    def arm(self, *rules: Rule) -> None:
        write_control(self.control, seed=self.seed, journal=self.journal, rules=rules)

    def power_loss(self, *, torn_tail: bool) -> None:
        """kill -9, cut the WAL files to what was fsynced, restart (blocking: run in a thread)."""
        self.broker.stop(signal.SIGKILL)
        self.fsyncs_at_kill = fsync_starts(self.journal)
        report = crash_journal(self.journal, seed=self.seed, torn_tail=torn_tail)
        self.crashes.append({"bytes_dropped": report.bytes_dropped, "files_cut": report.files_cut,
                             "files_removed": len(report.files_removed)})
        self.broker = self._start(url=self.broker.url, admin_url=self.broker.admin_url)

    def stop(self) -> None:
        self.broker.stop(signal.SIGKILL)


async def stream(producer, messages: int, outcome: Outcome, *, chunk: int | None = None,
                 pause_s: float = 0.0) -> None:
    """Send seq 0..messages-1 without waiting for each receipt; callbacks sort them.
    With `chunk`, wait for the receipts after each `chunk` sends (many small flushes),
    then `pause_s` (a paced stream)."""
    def on_done(seq: int):
        def record(error: BaseException | None, message_id: object) -> None:
            if error is None:
                outcome.acked.add(seq)
                outcome.acked_ns[seq] = time.monotonic_ns()
            else:
                outcome.failed[seq] = f"{type(error).__name__}: {error}"
        return record

    deadline = time.monotonic() + DEADLINE_S
    for seq in range(messages):
        while True:
            try:
                producer.send_nowait(encode(seq), callback=on_done(seq))
                break
            except DanubeError:  # the pending queue is full: wait for room
                assert time.monotonic() < deadline, f"no room to send seq {seq} in {DEADLINE_S} s"
                await asyncio.sleep(0.005)
        if chunk is not None and seq % chunk == chunk - 1:
            with contextlib.suppress(DanubeError):  # the broker is down: the client resends
                await producer.flush(timeout=DEADLINE_S)
            await asyncio.sleep(pause_s)
    try:
        await producer.flush()
    except DanubeError:
        pass


async def wait_acked(outcome: Outcome, count: int) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while len(outcome.acked) < count:
        assert time.monotonic() < deadline, f"only {len(outcome.acked)} of {count} acks in {DEADLINE_S} s"
        await asyncio.sleep(0.005)


async def settle(outcome: Outcome, messages: int) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while len(outcome.acked) + len(outcome.failed) < messages and time.monotonic() < deadline:
        await asyncio.sleep(0.05)


async def consume_all(client: DanubeClient, name: str) -> list[tuple[int, int]]:
    """(offset, seq) of everything from the earliest offset, until 3 s idle."""
    consumer = await client.subscribe(TOPIC, name, sub_type=SubType.EXCLUSIVE, initial_position="earliest",
                                      receiver_queue_size=5000)
    received: list[tuple[int, int]] = []
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        try:
            message = await consumer.receive(timeout=3)
        except Timeout:
            break
        received.append((message.message_id.offset, struct.unpack(">Q", message.payload[:8])[0]))
        await consumer.ack(message)
    return received


def check_queue(seed: int, outcome: Outcome, received: list[tuple[int, int]], messages: int,
                chaos: DiskChaos) -> dict[str, object]:
    """Jepsen's queue checker on one run; the figures for the report."""
    seqs = [seq for _, seq in received]
    seen = set(seqs)
    lost = outcome.acked - seen
    unexpected = seen - set(range(messages))
    log_tail = chaos.broker.log()[-3000:]
    assert not lost, f"seed {seed}: {len(lost)} acknowledged messages lost, e.g. {sorted(lost)[:10]}\n{log_tail}"
    assert not unexpected, f"seed {seed}: never sent: {sorted(unexpected)[:10]}"
    firsts = list(dict.fromkeys(seqs))
    assert firsts == sorted(firsts), f"seed {seed}: first deliveries out of send order"
    offsets = [offset for offset, _ in received]
    assert offsets == list(range(len(offsets))), f"seed {seed}: offsets not continuous from 0"
    report = {"seed": seed, "acked": len(outcome.acked), "failed": len(outcome.failed), "stored": len(received),
              "lost": 0, "unexpected": 0, "duplicates": len(seqs) - len(seen), "crashes": chaos.crashes}
    print(f"disk chaos run {json.dumps(report)}")
    return report


async def power_loss_run(tmp_path: Path, seed: int, messages: int) -> dict[str, object]:
    """Stream `messages` reliable sends; at a seeded point between 20% and 80% of the
    acks, power loss and restart; then consume everything and check."""
    rng = random.Random(seed)
    chaos = DiskChaos(tmp_path, seed)
    outcome = Outcome()
    try:
        async with DanubeClient(chaos.broker.url, request_timeout_ms=3000) as client:
            producer = await client.create_producer(TOPIC, dispatch="reliable", name="streamer")

            async def fault() -> None:
                await wait_acked(outcome, rng.randrange(messages // 5, messages * 4 // 5))
                torn_tail = rng.random() < 0.5
                await asyncio.get_running_loop().run_in_executor(
                    None, functools.partial(chaos.power_loss, torn_tail=torn_tail))

            await asyncio.gather(stream(producer, messages, outcome), fault())
            await settle(outcome, messages)
            received = await consume_all(client, f"check-{seed}")
        return check_queue(seed, outcome, received, messages, chaos)
    finally:
        chaos.stop()


@pytest.mark.chaos_smoke
async def test_acked_messages_survive_power_loss(tmp_path: Path) -> None:
    """B6 on one broker (CI smoke, one seed): kill -9 and every WAL file cut to its
    last fsync mid-stream, restart: lost = 0, unexpected = 0, send order and continuous
    offsets kept."""
    report = await power_loss_run(tmp_path, seed=1, messages=5_000)
    assert report["acked"] > 0


@pytest.mark.chaos
@pytest.mark.parametrize("seed", range(100, 110))
async def test_acked_messages_survive_power_loss_10_seeds(tmp_path: Path, seed: int) -> None:
    """B6 at the table's size for one broker: 10 seeds of 20k messages each."""
    report = await power_loss_run(tmp_path, seed=seed, messages=20_000)
    assert report["acked"] > 0


@pytest.mark.chaos
async def test_fsync_eio_fails_the_flush_and_loses_nothing_acked(tmp_path: Path) -> None:
    """W5 on a broker process: a segment fsync fails with EIO once mid-stream. The sends
    of that flush fail (INTERNAL, "write failed", the injected error named), none of
    them acknowledged; the stream goes on; after a power loss and restart every
    acknowledged message is consumed."""
    seed, messages = 5, 5_000
    chaos = DiskChaos(tmp_path, seed)
    outcome = Outcome()
    try:
        async with DanubeClient(chaos.broker.url, request_timeout_ms=3000, operation_retries_max=0) as client:
            producer = await client.create_producer(TOPIC, dispatch="reliable", name="streamer")
            # 50 flushes of 100 messages at least: the 20th segment fsync from now fails.
            chaos.arm(Rule(op="fsync", error="EIO", match=".wal", skip=19, times=1))
            await stream(producer, messages, outcome, chunk=100)
            await settle(outcome, messages)
            assert outcome.failed, "the injected fsync failure must fail some sends"
            text = next(iter(outcome.failed.values()))
            assert "write failed" in text and "injected by chaos.disk" in text, text
            assert not set(outcome.failed) & outcome.acked
            await asyncio.get_running_loop().run_in_executor(None, functools.partial(chaos.power_loss,
                                                                                     torn_tail=True))
            received = await consume_all(client, "check")
        check_queue(seed, outcome, received, messages, chaos)
    finally:
        chaos.stop()


INTERVAL_MS = 200
# The interval plus one flush, and room for a loaded machine (one flush here takes
# ~1-10 ms); before the fix the WAL went unsynced for seconds at this rate.
SYNC_SLACK_MS = 1000
INTERVAL_ENV = {"DANUBE_STORAGE__WAL_SYNC": "interval", "DANUBE_STORAGE__WAL_SYNC_INTERVAL_MS": str(INTERVAL_MS),
                # Large segments: only the interval's fsyncs, none from rolls.
                "DANUBE_STORAGE__WAL_SEGMENT_BYTES_MAX": str(256 * 1024 * 1024)}


@pytest.mark.chaos
async def test_interval_power_loss_loses_at_most_what_came_after_the_last_fsync(tmp_path: Path) -> None:
    """B6 with `wal_sync: interval` (200 ms): a producer at full rate, power loss at
    ~60% of the acks, restart. What is lost was all acknowledged after the last segment
    fsync began (the promise of interval mode), nothing never sent is consumed; and the
    WAL was fsynced all through the stream (the longest time written data went unsynced,
    within the interval plus a slack for one flush and a loaded machine: under load a
    due fsync used to be skipped while a flush ran, or dropped with a full mailbox)."""
    seed, messages = 7, 600_000
    chaos = DiskChaos(tmp_path, seed, env=INTERVAL_ENV)
    outcome = Outcome()
    try:
        async with DanubeClient(chaos.broker.url, request_timeout_ms=3000) as client:
            producer = await client.create_producer(TOPIC, dispatch="reliable", name="streamer")
            started_ns = time.monotonic_ns()
            killed_ns: list[int] = []

            async def fault() -> None:
                await wait_acked(outcome, messages * 3 // 5)
                killed_ns.append(time.monotonic_ns())
                await asyncio.get_running_loop().run_in_executor(
                    None, functools.partial(chaos.power_loss, torn_tail=False))

            await asyncio.gather(stream(producer, messages, outcome), fault())
            await settle(outcome, messages)
            received = await consume_all(client, "check")
    finally:
        chaos.stop()
    fsyncs = [t for t in chaos.fsyncs_at_kill if t >= started_ns]
    assert fsyncs, "no segment fsync while streaming"
    last_sync_ns = fsyncs[-1]
    seen = {seq for _, seq in received}
    lost = outcome.acked - seen
    early = sorted(seq for seq in lost if outcome.acked_ns[seq] <= last_sync_ns)
    assert not early, f"lost although acknowledged before the last fsync began: {early[:10]}"
    assert not seen - set(range(messages)), "consumed a message never sent"
    # How long written data went unsynced: between fsyncs, and from the last to the kill.
    gaps_ms = sorted((b - a) / 1e6 for a, b in itertools.pairwise([*fsyncs, killed_ns[0]]))
    assert gaps_ms[-1] < INTERVAL_MS + SYNC_SLACK_MS, f"unsynced for {gaps_ms[-1]:.0f} ms at most, not within " \
        f"{INTERVAL_MS} + {SYNC_SLACK_MS} ms: {gaps_ms[-5:]}"
    acked_before = sum(1 for t in outcome.acked_ns.values() if t <= last_sync_ns)
    streamed_s = (killed_ns[0] - started_ns) / 1e9
    print(f"interval power loss: {len(outcome.acked)} acked ({acked_before} before the last fsync), "
          f"{len(lost)} lost, {len(fsyncs)} segment fsyncs in the {streamed_s:.1f} s before the power loss, "
          f"gap p50 {gaps_ms[len(gaps_ms) // 2]:.0f} ms, max {gaps_ms[-1]:.0f} ms (interval {INTERVAL_MS} ms)")


@pytest.mark.chaos
@pytest.mark.timeout(600)
async def test_interval_power_loss_never_gives_a_delivered_offset_to_another_message(tmp_path: Path) -> None:
    """B6 with `wal_sync: interval`, found by the 3-broker scenario `B6-interval` (seed
    1): records written but not yet fsynced are delivered to a caught-up consumer (and
    acknowledged); a power loss drops them, and the restarted broker gave their offsets
    to the next messages. An offset must never name two messages: the subscription's
    cursor, flushed past the dropped offsets, would skip the new messages there, losing
    sends acknowledged after the restart. Checked: every offset seen (by the live
    consumer before and after the power loss, and by a fresh one at the end) names one
    message, and every send acknowledged after the restart reaches the live
    subscription."""
    seed, messages = 11, 6_000
    chaos = DiskChaos(tmp_path, seed, env=INTERVAL_ENV)
    outcome = Outcome()
    seen: dict[int, set[int]] = {}  # offset -> seqs delivered there
    live_seqs: set[int] = set()
    restarted_ns: list[int] = []
    try:
        async with DanubeClient(chaos.broker.url, request_timeout_ms=3000) as client:
            producer = await client.create_producer(TOPIC, dispatch="reliable", name="streamer")
            live = await client.subscribe(TOPIC, "live", sub_type=SubType.EXCLUSIVE, initial_position="earliest",
                                          receiver_queue_size=5000)
            done = asyncio.Event()

            async def receive() -> None:
                while not done.is_set():
                    try:
                        message = await live.receive(timeout=1)
                    except Timeout:
                        continue
                    except DanubeError:
                        await asyncio.sleep(0.1)  # the broker is down: the client re-attaches
                        continue
                    seq = struct.unpack(">Q", message.payload[:8])[0]
                    seen.setdefault(message.message_id.offset, set()).add(seq)
                    live_seqs.add(seq)
                    with contextlib.suppress(DanubeError):
                        await live.ack(message)

            async def fault() -> None:
                await wait_acked(outcome, messages // 2)
                await asyncio.get_running_loop().run_in_executor(
                    None, functools.partial(chaos.power_loss, torn_tail=False))
                restarted_ns.append(time.monotonic_ns())

            receiver = asyncio.create_task(receive())
            # Paced (~2,000 msg/s) so that the live consumer keeps up and receives records
            # before their fsync, as a consumer of a moderate stream does.
            await asyncio.gather(stream(producer, messages, outcome, chunk=20, pause_s=0.01), fault())
            await settle(outcome, messages)
            after = {seq for seq, t in outcome.acked_ns.items() if t > restarted_ns[0]}
            deadline = time.monotonic() + 60  # a message the live subscription skipped never comes
            while not after <= live_seqs and time.monotonic() < deadline:
                await asyncio.sleep(0.2)
            done.set()
            await receiver
            for offset, seq in await consume_all(client, "check"):
                seen.setdefault(offset, set()).add(seq)
    finally:
        chaos.stop()
    reused = {offset: sorted(seqs) for offset, seqs in seen.items() if len(seqs) > 1}
    print(f"interval power loss, live consumer: {len(outcome.acked)} acked, {len(after)} after the restart,"
          f" {len(seen)} offsets seen, {len(reused)} reused; crash {chaos.crashes}")
    assert not reused, f"{len(reused)} offsets named two messages, e.g. {sorted(reused.items())[:5]}; {chaos.crashes}"
    missing = sorted(after - live_seqs)
    assert not missing, f"{len(missing)} sends acknowledged after the restart never reached the live subscription," \
        f" e.g. {missing[:10]}"

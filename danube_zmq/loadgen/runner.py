"""The load of `danube bench`: producers, consumers, and what they measure.

- Producers (one client, one task each) send stamped messages (`stamp.py`) with
  `send_nowait`, at `rate` msg/s in total or as fast as the broker takes them, for
  `count` messages or `duration_s` seconds; every receipt records its produce-ack
  latency. Producer i writes topic i mod `topics`. Receipts are taken a batch at a
  time (the producer's `on_batch`): batches come back in send order per partition
  topic, so the send times wait in a list and a batch takes its count of them, in
  numpy. On a partitioned topic the bench therefore opens a client
  producer per partition topic and routes round-robin itself, so it knows each
  message's partition when it sends it.
- Consumers (`consumers` per subscription, `subscriptions` distinct subscriptions per
  topic) take what their queue holds with `batch_receive` and account for the batch at
  once (numpy): the end-to-end latency of every message (the batch's receive time
  minus the stamped send time: one machine's CLOCK_MONOTONIC, so producers and
  consumers must share a machine; one clock read per batch, so a message is timed when
  the application gets it, as with a per-message receive) and, per subscription, which
  (producer, sequence) pairs arrived: loss and duplicates. On reliable topics they ack
  each batch with one call.
- `e2e` runs the consumers in a child process (the GIL would otherwise make producers
  and consumers share one core) and the producers here.
- When the broker listens on this machine, its CPU and peak RSS over the run are read
  with psutil.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import multiprocessing as mp
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import psutil

from danube_zmq.client.client import DanubeClient
from danube_zmq.client.errors import ProducerQueueFull
from danube_zmq.client.message import BatchReceipt
from danube_zmq.loadgen.accounting import Delivery
from danube_zmq.loadgen.histogram import LatencyBuffer, LatencyHistogram
from danube_zmq.loadgen.spread import CpuSamples, CpuWindow, deal, send_offset_ns
from danube_zmq.loadgen.stamp import STAMP_BYTES, Stamper, read_stamp, read_stamps
from danube_zmq.runtime import event_loop
from danube_zmq.transport.errors import DanubeError, InvalidArgument, Timeout

__all__ = ["BenchConfig", "BenchResult", "run_consume", "run_e2e", "run_produce"]

Progress = Callable[[str], None]

_PROGRESS_EVERY_S = 1.0
_RSS_SAMPLE_S = 0.25
_YIELD_EVERY = 256  # messages between yields at max rate, so receipts get handled
_READY_TIMEOUT_S = 30.0
_RECEIVE_BATCH_MAX = 5000  # messages per batch_receive: bounds the arrays one batch costs
_SMALL_BATCH = 8  # up to this many messages a batch is accounted message by message (`_account`)
# The consumers' permits: NATS's default pending limit for a subscriber (65,536
# messages). A non-reliable subscription drops what its consumer has no permits for
# past `dispatch.pending_messages_max`; a deep window rides out a consumer process
# that lost its CPU for a few tens of milliseconds at 300k msg/s.
_RECEIVER_QUEUE_SIZE = 65_536
_SENT_COMPACT = 1 << 16  # answered send times dropped from the front of the list this many at a time


@dataclass(frozen=True, slots=True, kw_only=True)
class BenchConfig:
    url: str
    topic: str
    reliable: bool = False
    size: int = 100
    rate: float = 0.0  # msg/s over all producers; 0: as fast as possible
    count: int | None = None  # messages over all producers
    duration_s: float | None = None
    producers: int = 1
    producer_processes: int = 1  # the producers dealt over this many processes, so the client is not the limit
    consumers: int = 1  # per subscription
    subscriptions: int = 1  # distinct subscriptions per topic (fan-out)
    sub_type: str = "shared"
    topics: int = 1
    partitions: int | None = None
    batch_max_messages: int = 1000
    batch_max_delay_ms: int = 10
    max_inflight_batches: int | None = None  # per producer partition; None: the client's default
    subscription: str = "bench"
    idle_timeout_s: float = 5.0  # consumers stop after this long without a message

    def __post_init__(self) -> None:
        if (self.count is None) == (self.duration_s is None):
            raise InvalidArgument("give a message count or a duration, exactly one")
        for name in ("producers", "producer_processes", "consumers", "subscriptions", "topics", "batch_max_messages"):
            if getattr(self, name) < 1:
                raise InvalidArgument(f"{name} must be >= 1")
        if self.rate < 0 or (self.count is not None and self.count < 1):
            raise InvalidArgument("rate must be >= 0 and count >= 1")
        if self.max_inflight_batches is not None and self.max_inflight_batches < 1:
            raise InvalidArgument("max_inflight_batches must be >= 1")
        if self.producer_processes > self.producers:
            raise InvalidArgument("producer_processes must be <= producers")

    def topic_names(self) -> list[str]:
        return [self.topic] if self.topics == 1 else [f"{self.topic}-{i}" for i in range(self.topics)]

    def subscription_names(self) -> list[str]:
        if self.subscriptions == 1:
            return [self.subscription]
        return [f"{self.subscription}-{i}" for i in range(self.subscriptions)]

    def quota(self, producer: int) -> int | None:
        if self.count is None:
            return None
        share, extra = divmod(self.count, self.producers)
        return share + (1 if producer < extra else 0)


@dataclass(slots=True)
class BenchResult:
    mode: str
    config: dict[str, Any]
    elapsed_s: float = 0.0
    sent: int = 0
    acked: int = 0
    failed: int = 0
    received: int = 0
    lost: int | None = None
    duplicates: int | None = None
    msg_s: float = 0.0
    mb_s: float = 0.0
    per_subscription: dict[str, dict[str, int | None]] | None = None  # received, lost, duplicates
    e2e_latency_us: dict[str, float | None] | None = None
    ack_latency_us: dict[str, float | None] | None = None
    broker: dict[str, Any] | None = None
    # The bench's own processes, % of one core each over its window: the client must not be the limit.
    clients: dict[str, Any] | None = None
    errors: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# ----------------------------------------------------------------- broker resources


class BrokerProbe:
    """CPU and peak RSS of the broker process listening on the service URL's port, when
    it runs on this machine (found through its listening socket)."""

    def __init__(self, url: str) -> None:
        self.process: psutil.Process | None = _local_listener(url)
        self.rss_max = 0
        self._cpu_start = 0.0
        self._wall_start = 0.0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self.process is None:
            return
        with contextlib.suppress(psutil.Error):
            times = self.process.cpu_times()
            self._cpu_start, self._wall_start = times.user + times.system, time.monotonic()
            self._task = asyncio.get_running_loop().create_task(self._sample())

    async def _sample(self) -> None:
        assert self.process is not None
        while True:
            with contextlib.suppress(psutil.Error):
                self.rss_max = max(self.rss_max, self.process.memory_info().rss)
            await asyncio.sleep(_RSS_SAMPLE_S)

    async def stop(self) -> dict[str, Any] | None:
        if self.process is None or self._task is None:
            return None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        try:
            times = self.process.cpu_times()
            self.rss_max = max(self.rss_max, self.process.memory_info().rss)
        except psutil.Error:
            return None
        wall = max(time.monotonic() - self._wall_start, 1e-9)
        cpu_s = times.user + times.system - self._cpu_start
        return {"pid": self.process.pid, "cpu_percent": round(100 * cpu_s / wall, 1), "cpu_s": round(cpu_s, 3),
                "wall_s": round(wall, 3), "rss_max_mb": round(self.rss_max / 2**20, 1)}


def _local_listener(url: str) -> psutil.Process | None:
    if not url.startswith("tcp://"):
        return None
    host, _, port = url[len("tcp://"):].rpartition(":")
    host = host.strip("[]")
    try:
        local = host == "localhost" or host == "*" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return None
    if not local or not port.isdigit():
        return None
    try:
        for conn in psutil.net_connections(kind="tcp"):
            if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == int(port) and conn.pid:
                return psutil.Process(conn.pid)
    except psutil.Error:
        return None
    return None


# ----------------------------------------------------------------- producing


@dataclass(slots=True)
class _ProduceState:
    histogram: LatencyHistogram = field(default_factory=LatencyHistogram)
    sent: dict[int, int] = field(default_factory=dict)
    acked: int = 0
    failed: int = 0
    errors: list[str] = field(default_factory=list)
    last_ack_ns: int = 0
    receipts: list[_Receipts] = field(default_factory=list)


class _Receipts:
    """The receipts of one client producer on one partition topic. Batches come back in
    send order, so `on_batch`, called once per batch, takes the batch's count of the
    oldest send times; latencies go into the histogram a few thousand at a time
    (`LatencyBuffer`), a big batch's as one array, a small one's value by value (a numpy
    array per one-message batch cost more than the client's own work for it)."""

    __slots__ = ("_head", "_latencies", "_state", "sent_ns")

    def __init__(self, state: _ProduceState) -> None:
        self._state = state
        self._latencies = LatencyBuffer(state.histogram)
        self.sent_ns: list[int] = []  # send times; those before `_head` are answered
        self._head = 0
        state.receipts.append(self)

    def on_batch(self, receipt: BatchReceipt) -> None:
        now = time.monotonic_ns()
        count, head = receipt.count, self._head
        sent = self.sent_ns[head:head + count]
        head += count
        if head >= _SENT_COMPACT:
            del self.sent_ns[:head]
            head = 0
        self._head = head
        state = self._state
        if receipt.error is None:
            state.acked += count
            state.last_ack_ns = now
            latencies = self._latencies
            if count <= _SMALL_BATCH:
                for sent_ns in sent:
                    latencies.add(now - sent_ns)
            else:
                latencies.add_many(now - np.array(sent, dtype=np.int64))
        else:
            state.failed += count
            if len(state.errors) < 10:
                error = receipt.error
                state.errors.append(f"{type(error).__name__}: {error}")

    def flush(self) -> None:
        self._latencies.flush()


async def _open_producers(client: DanubeClient, cfg: BenchConfig, topic: str,
                          state: _ProduceState) -> list[tuple[Any, _Receipts]]:
    """One client producer on `topic`, or one per partition topic when it has several,
    each with the receipts its batches report to."""
    options: dict[str, Any] = {"dispatch": "reliable" if cfg.reliable else "non_reliable",
                               "batch_messages_max": cfg.batch_max_messages, "batch_delay_ms": cfg.batch_max_delay_ms,
                               "inflight_batches_max": cfg.max_inflight_batches}

    async def open_one(name: str, **extra: Any) -> tuple[Any, _Receipts]:
        receipts = _Receipts(state)
        return await client.create_producer(name, on_batch=receipts.on_batch, **extra, **options), receipts

    producer, receipts = await open_one(topic, partitions=cfg.partitions)
    names = producer.partitions
    if len(names) == 1:
        return [(producer, receipts)]
    await producer.close()
    return [await open_one(name) for name in names]


async def _produce_one(cfg: BenchConfig, index: int, opened: list[tuple[Any, _Receipts]], state: _ProduceState,
                       start_ns: int, deadline_ns: int | None) -> None:
    producers = [producer for producer, _ in opened]
    lanes = [(producer, receipts.sent_ns) for producer, receipts in opened]  # per partition topic
    stamper = Stamper(index, cfg.size)
    quota = cfg.quota(index)
    interval_ns = int(1e9 * cfg.producers / cfg.rate) if cfg.rate else 0
    first_ns = start_ns + send_offset_ns(index, cfg.producers, interval_ns)
    sequence = 0
    try:
        while (quota is None or sequence < quota) and (deadline_ns is None or time.monotonic_ns() < deadline_ns):
            if interval_ns:
                delay_ns = first_ns + sequence * interval_ns - time.monotonic_ns()
                if delay_ns > 0:
                    await asyncio.sleep(delay_ns / 1e9)
            elif sequence % _YIELD_EVERY == 0:
                await asyncio.sleep(0)
            producer, sent_ns = lanes[sequence % len(lanes)]
            now = time.monotonic_ns()
            sent_ns.append(now)  # before sending: the receipt can never come first
            try:
                producer.send_nowait(stamper.payload(sequence, now))
            except ProducerQueueFull:
                sent_ns.pop()
                await asyncio.sleep(0.001)  # receipts free room; the same sequence goes next
                continue
            sequence += 1
            state.sent[index] = sequence
        await asyncio.gather(*(p.flush() for p in producers))
    finally:
        state.sent[index] = sequence
        await asyncio.gather(*(p.close() for p in producers))


@dataclass(slots=True)
class ProduceOutcome:
    """What one producing process measured: its producers' counts and receipts, and its
    own CPU over the sending window."""

    start_ns: int
    end_ns: int
    sent: dict[int, int]
    acked: int
    failed: int
    histogram: bytes  # encoded LatencyHistogram of produce-ack latencies
    errors: list[str]
    cpu_percent: float


async def produce(cfg: BenchConfig, indices: list[int], start: Callable[[], Awaitable[int]],
                  progress: Progress | None = None) -> ProduceOutcome:
    """Open the producers `indices` on one client, then (`start` returning the common
    start time, CLOCK_MONOTONIC ns) send until their quota or the duration is done. The
    producers are open before the clock starts: opening 200 of them takes a while, and
    pacing from before that would send a burst to catch up."""
    state = _ProduceState()
    async with DanubeClient(cfg.url, client_name="danube-bench-producers") as client:
        names = cfg.topic_names()
        opened = await asyncio.gather(*(_open_producers(client, cfg, names[i % cfg.topics], state) for i in indices))
        start_ns = await start()
        window = CpuWindow(time.process_time(), time.monotonic())
        deadline_ns = None if cfg.duration_s is None else start_ns + int(cfg.duration_s * 1e9)
        ticker = _ticker(progress, lambda: f"sent {sum(state.sent.values()):,}, acked {state.acked:,}", start_ns)
        try:
            await asyncio.gather(*(_produce_one(cfg, i, lanes, state, start_ns, deadline_ns)
                                   for i, lanes in zip(indices, opened, strict=True)))
        finally:
            ticker.cancel()
        cpu = window.percent(time.process_time(), time.monotonic())
    # Every receipt has run by now (the producers closed, then the client).
    for receipts in state.receipts:
        receipts.flush()
    return ProduceOutcome(start_ns=start_ns, end_ns=state.last_ack_ns or time.monotonic_ns(), sent=dict(state.sent),
                          acked=state.acked, failed=state.failed, histogram=state.histogram.encode(),
                          errors=state.errors, cpu_percent=cpu)


def _producer_process(cfg: BenchConfig, indices: list[int], ready: Any, go: Any, start_ns: Any, out: Any) -> None:
    """One of `producer_processes`: opens its producers, says so, and starts sending at
    the start time the parent shares once every process is ready."""
    async def start() -> int:
        ready.release()
        await asyncio.get_running_loop().run_in_executor(None, go.wait, 600)
        return int(start_ns.value)

    async def main() -> None:
        try:
            out.put(await produce(cfg, indices, start))
        except DanubeError as exc:
            ready.release()
            out.put(exc.message)
    event_loop.run(main())


async def _produce_spread(cfg: BenchConfig, probe: BrokerProbe) -> list[ProduceOutcome]:
    """The producers dealt over `producer_processes` child processes, all starting at one
    time once every child has opened its producers; the broker probed over the window."""
    context = mp.get_context("spawn")
    ready, go, start_ns, out = context.Semaphore(0), context.Event(), context.Value("q", 0), context.Queue()
    shares = deal(cfg.producers, cfg.producer_processes)
    children = [context.Process(target=_producer_process, args=(cfg, share, ready, go, start_ns, out), daemon=True)
                for share in shares]
    for child in children:
        child.start()
    loop = asyncio.get_running_loop()
    try:
        for _ in children:
            if not await loop.run_in_executor(None, ready.acquire, True, _READY_TIMEOUT_S * 4):
                raise Timeout(f"bench producer processes did not open their producers within {_READY_TIMEOUT_S * 4:g} s")
        probe.start()
        start_ns.value = time.monotonic_ns()
        go.set()
        outcomes = [await loop.run_in_executor(None, out.get, True, 600) for _ in children]
    finally:
        for child in children:
            await loop.run_in_executor(None, child.join, 10)
            if child.is_alive():
                child.kill()
    failed = [outcome for outcome in outcomes if isinstance(outcome, str)]
    if failed:
        raise InvalidArgument(f"bench producers failed: {failed[0]}")
    return outcomes


async def run_produce(cfg: BenchConfig, *, progress: Progress | None = None, mode: str = "produce") -> BenchResult:
    result = BenchResult(mode=mode, config=asdict(cfg))
    probe = BrokerProbe(cfg.url)
    if cfg.producer_processes == 1:
        async def start() -> int:
            probe.start()
            return time.monotonic_ns()
        outcomes = [await produce(cfg, list(range(cfg.producers)), start, progress)]
    else:
        outcomes = await _produce_spread(cfg, probe)
    result.broker = await probe.stop()
    start_ns = min(outcome.start_ns for outcome in outcomes)
    histogram = LatencyHistogram()
    sent: dict[int, int] = {}
    for outcome in outcomes:
        histogram.merge(LatencyHistogram(outcome.histogram))
        sent.update(outcome.sent)
        result.acked += outcome.acked
        result.failed += outcome.failed
        result.errors += outcome.errors[:10 - len(result.errors)]
    result.elapsed_s = (max(outcome.end_ns for outcome in outcomes) - start_ns) / 1e9
    result.sent = sum(sent.values())
    result.msg_s = round(result.acked / result.elapsed_s, 1) if result.elapsed_s > 0 else 0.0
    result.mb_s = round(result.msg_s * cfg.size / 1e6, 2)
    result.ack_latency_us = histogram.summary_us()
    result.clients = {"producer_cpu_percent": [outcome.cpu_percent for outcome in outcomes]}
    result.config["sent_per_producer"] = {index: sent[index] for index in sorted(sent)}
    result.config["start_ns"] = start_ns
    return result


def _ticker(progress: Progress | None, line: Callable[[], str], start_ns: int) -> asyncio.Task[None]:
    async def tick() -> None:
        while True:
            await asyncio.sleep(_PROGRESS_EVERY_S)
            if progress is not None:
                progress(f"{(time.monotonic_ns() - start_ns) / 1e9:6.1f} s  {line()}")
    return asyncio.get_running_loop().create_task(tick())


# ----------------------------------------------------------------- consuming


@dataclass(slots=True)
class ConsumeOutcome:
    first_ns: int
    last_ns: int
    histogram: bytes  # encoded LatencyHistogram
    deliveries: dict[str, Delivery]  # per subscription
    errors: list[str]
    cpu_percent: float | None = None  # this process, from the first receive to the last

    @property
    def received(self) -> int:
        return sum(d.received for d in self.deliveries.values())


async def consume(cfg: BenchConfig, *, expected: int | None, ready: Callable[[], None] | None = None,
                  progress: Progress | None = None) -> ConsumeOutcome:
    """Receive until every subscription got `expected` messages, `duration_s` passed
    (when no count), or `idle_timeout_s` passed without a message once messages flowed."""
    deliveries = {name: Delivery() for name in cfg.subscription_names()}
    histogram = LatencyHistogram()
    latencies = LatencyBuffer(histogram)
    errors: list[str] = []
    first_ns = last_ns = 0
    cpu = CpuSamples()
    done = asyncio.Event()
    async with DanubeClient(cfg.url, client_name="danube-bench-consumers") as client:
        consumers = []
        for topic in cfg.topic_names():
            for name in cfg.subscription_names():
                for _ in range(cfg.consumers):
                    consumer = await client.subscribe(topic, name, sub_type=cfg.sub_type,
                                                      receiver_queue_size=_RECEIVER_QUEUE_SIZE)
                    consumers.append((consumer, deliveries[name]))
        if ready is not None:
            ready()
        start_ns = time.monotonic_ns()

        async def receive(consumer: Any, delivery: Delivery) -> None:
            nonlocal first_ns, last_ns
            while not done.is_set():
                try:
                    batch = await consumer.batch_receive(_RECEIVE_BATCH_MAX,
                                                         timeout=cfg.idle_timeout_s if first_ns else None)
                except Timeout:
                    done.set()
                    return
                now = time.monotonic_ns()
                if cpu.due(now):
                    cpu.record(time.process_time(), now)
                if not first_ns:
                    first_ns = now
                last_ns = now
                _account(batch, delivery, errors, latencies, now)
                if cfg.reliable:
                    await consumer.ack(batch)
                if expected is not None and all(d.received >= expected for d in deliveries.values()):
                    done.set()

        deadline = None if cfg.duration_s is None else cfg.duration_s + cfg.idle_timeout_s
        ticker = _ticker(progress, lambda: f"received {sum(d.received for d in deliveries.values()):,}", start_ns)
        tasks = [asyncio.get_running_loop().create_task(receive(c, d)) for c, d in consumers]
        try:
            async with asyncio.timeout(deadline):
                await done.wait()
        except TimeoutError:
            pass
        finally:
            done.set()
            ticker.cancel()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for consumer, _ in consumers:
                with contextlib.suppress(DanubeError):
                    await consumer.close()
    latencies.flush()
    return ConsumeOutcome(first_ns=first_ns, last_ns=last_ns, histogram=histogram.encode(), deliveries=deliveries,
                          errors=errors, cpu_percent=cpu.percent())


def _account(batch: list[Any], delivery: Delivery, errors: list[str], latencies: LatencyBuffer, now_ns: int) -> None:
    """Record a received batch in `delivery` and its latencies at `now_ns`. A batch of a
    few messages (many slow producers: one message each) is read message by message: the
    numpy path costs tens of µs a call whatever the batch holds, which made the bench's
    consumer the busiest process on the machine at 10,000 one-message batches/s."""
    if len(batch) <= _SMALL_BATCH:
        for message in batch:
            payload = message.payload
            if len(payload) < STAMP_BYTES:
                if len(errors) < 10:
                    errors.append(f"a {len(payload)}-byte message carries no benchmark stamp")
                continue
            producer, sequence, sent_ns = read_stamp(payload)
            delivery.record(producer, sequence)
            latencies.add(now_ns - sent_ns)
        return
    payloads = [m.payload for m in batch]
    try:
        stamps = read_stamps(payloads)
    except InvalidArgument as exc:
        if len(errors) < 10:
            errors.append(exc.message)
        stamps = read_stamps([p for p in payloads if len(p) >= STAMP_BYTES])
    if not len(stamps):
        return
    producers = stamps.producer
    if (producers == producers[0]).all():
        delivery.record_many(int(producers[0]), stamps.sequence)
    else:
        for producer in np.unique(producers).tolist():
            delivery.record_many(producer, stamps.sequence[producers == producer])
    latencies.add_many(now_ns - stamps.sent_ns)


async def run_consume(cfg: BenchConfig, *, progress: Progress | None = None) -> BenchResult:
    result = BenchResult(mode="consume", config=asdict(cfg))
    probe = BrokerProbe(cfg.url)
    probe.start()
    outcome = await consume(cfg, expected=cfg.count, progress=progress)
    result.broker = await probe.stop()
    _fill_consumed(result, outcome)
    elapsed = (outcome.last_ns - outcome.first_ns) / 1e9
    result.elapsed_s = round(elapsed, 3)
    result.msg_s = round(outcome.received / elapsed, 1) if elapsed > 0 else 0.0
    result.mb_s = round(result.msg_s * cfg.size / 1e6, 2)
    return result


def _fill_consumed(result: BenchResult, outcome: ConsumeOutcome, sent: dict[int, int] | None = None) -> None:
    """Received and duplicates (and lost, given what each producer sent): summed over
    the subscriptions, and per subscription."""
    per = result.per_subscription = {
        name: {"received": d.received, "lost": None if sent is None else d.lost(sent), "duplicates": d.duplicates}
        for name, d in outcome.deliveries.items()}
    result.received = outcome.received
    result.duplicates = sum(d.duplicates for d in outcome.deliveries.values())
    if sent is not None:
        result.lost = sum(int(figures["lost"] or 0) for figures in per.values())
    result.e2e_latency_us = LatencyHistogram(outcome.histogram).summary_us()
    result.errors += outcome.errors


# ----------------------------------------------------------------- end to end


def _consumer_process(cfg: BenchConfig, expected: int | None, ready: Any, out: Any) -> None:
    async def main() -> None:
        try:
            outcome = await consume(cfg, expected=expected, ready=ready.set)
            out.put(outcome)
        except DanubeError as exc:
            ready.set()
            out.put(exc.message)
    event_loop.run(main())


async def run_e2e(cfg: BenchConfig, *, progress: Progress | None = None) -> BenchResult:
    """Consumers in a child process, producers here; throughput from the first send to
    the last receive."""
    # Topics must exist before consumers subscribe: one producer per topic creates it.
    async with DanubeClient(cfg.url, client_name="danube-bench-setup") as client:
        for topic in cfg.topic_names():
            producer = await client.create_producer(topic, dispatch="reliable" if cfg.reliable else "non_reliable",
                                                    partitions=cfg.partitions)
            await producer.close()
    context = mp.get_context("spawn")
    ready, out = context.Event(), context.Queue()
    child = context.Process(target=_consumer_process, args=(cfg, cfg.count, ready, out), daemon=True)
    child.start()
    loop = asyncio.get_running_loop()
    if not await loop.run_in_executor(None, ready.wait, _READY_TIMEOUT_S):
        child.kill()
        raise Timeout(f"bench consumers did not subscribe within {_READY_TIMEOUT_S:g} s")
    result = await run_produce(cfg, progress=progress, mode="e2e")
    outcome = await loop.run_in_executor(None, out.get, True, 600)
    await loop.run_in_executor(None, child.join, 10)
    if isinstance(outcome, str):
        raise InvalidArgument(f"bench consumers failed: {outcome}")
    _fill_consumed(result, outcome, result.config["sent_per_producer"])
    result.clients = {**(result.clients or {}), "consumer_cpu_percent": outcome.cpu_percent}
    # One machine, one CLOCK_MONOTONIC: from the first send to the last receive.
    span = (outcome.last_ns - result.config["start_ns"]) / 1e9
    if outcome.received and span > 0:
        result.elapsed_s = round(span, 3)
        result.msg_s = round(outcome.received / span, 1)
        result.mb_s = round(result.msg_s * cfg.size / 1e6, 2)
    return result

"""The chaos client workload: producer and consumer processes that record histories.

    python -m tests.chaos.harness.workload produce --url URL --topic T --name producer-0 \\
        --history-dir DIR [--reliable] [--count N] [--rate R] [--duration-s S]
    python -m tests.chaos.harness.workload consume --url URL --topic T --name consumer-0 \\
        --history-dir DIR --subscription S --sub-type exclusive|shared|failover \\
        [--duration-s S] [--idle-exit-s S]

Each is one OS process (so a fault can hit it alone, and a namespace host can run it:
`command(...)` builds the argv to prefix with `ip netns exec`), using the project's
client, and writes `DIR/<name>.jsonl` (tests/chaos/harness/history.py; the records are those
tests/chaos/harness/checkers.py reads).

Producer: message `seq` (0, 1, ...) carries `{"producer": name, "seq": seq}` as JSON,
sent at `rate` messages per second with `send_nowait`, at most `inflight_max`
unanswered. Each send is recorded `invoke` and the record written to the file before
the message is handed to the client (a consumer can never see a message its history
has not invoked), then `ok` with its MessageId (topic, offset) when the receipt comes,
or `info` with the error: the client retries retriable errors itself, so an error that
reaches us may follow an attempt that was stored. Only a send refused before it left
(`send_nowait` raising) is a certain `fail`.

Consumer: subscribes from the earliest offset, records `subscribe`, then each delivery
(`deliver`: producer, seq, topic, offset, redelivery count) and writes the records
before it acknowledges them, so a consumer killed with SIGKILL has recorded every
message it acknowledged.

With `--hold N --hold-after M` a consumer acknowledges its first M deliveries (about:
holding starts at the first batch received past M), then receives N more without
acknowledging them (their `deliver` records say `held`), then nothing: B7 kills it
holding them, and they must come to the subscription's other consumers.

Both stop after `count` (producer) or `duration_s`, on SIGTERM or SIGINT; a consumer
also after `idle_exit_s` without a delivery, and, once sent SIGUSR1 (the final drain:
the producers are done), after `drain_idle_s` without one. The drain wait must outlast
a reconnect (the client's backoff reaches 5 s), which a fixed idle exit would have to
outlast during the whole run. On stop, a producer
waits at most `grace_s` for the receipts in flight and records those still missing as
`info`. Every loop is bounded in count and time. The last stdout line is a JSON
summary.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any, TypeVar

from danube_zmq.client.admin import AdminClient
from danube_zmq.client.client import DanubeClient
from danube_zmq.client.errors import ProducerQueueFull
from danube_zmq.client.message import MessageId
from danube_zmq.transport.client_protocol import DispatchStrategy, InitialPosition, SubType
from danube_zmq.transport.errors import DanubeError, InvalidArgument, NotFound, PermissionDenied, Timeout
from tests.chaos.harness.history import HistoryWriter

__all__ = ["command", "decode_payload", "encode_payload", "main"]

T = TypeVar("T")

TICK_S = 0.01  # pacing: the sends due are made every tick
ATTACH_DEADLINE_S = 60.0  # create_producer / subscribe retried this long (a broker restarting)
RECEIVER_QUEUE_SIZE = 1_000  # a consumer's window: what it may hold delivered and unacknowledged
SUB_TYPES = {"exclusive": SubType.EXCLUSIVE, "shared": SubType.SHARED, "failover": SubType.FAILOVER}


def encode_payload(producer: str, seq: int, pad_bytes: int = 0) -> bytes:
    body = {"producer": producer, "seq": seq}
    if pad_bytes:
        body["pad"] = "x" * pad_bytes
    return json.dumps(body, separators=(",", ":")).encode()


def decode_payload(payload: bytes) -> tuple[str, int] | None:
    """(producer, seq), or None for a payload this workload did not write."""
    try:
        body = json.loads(payload)
        return str(body["producer"]), int(body["seq"])
    except (ValueError, KeyError, TypeError):
        return None


def command(kind: str, *, name: str, history_dir: Path | str, **options: Any) -> list[str]:
    """The argv that runs one workload process (`kind`: produce, consume, metadata,
    observe); options are the long flags with `_` for `-` (True adds a bare flag,
    False/None leaves it out, a list repeats the flag)."""
    argv = [sys.executable, "-m", "tests.chaos.harness.workload", kind, "--name", name, "--history-dir", str(history_dir)]
    for key, value in options.items():
        flag = "--" + key.replace("_", "-")
        for item in value if isinstance(value, list | tuple) else [value]:
            if item is True:
                argv.append(flag)
            elif item not in (False, None):
                argv += [flag, str(item)]
    return argv


def _now() -> int:
    return time.monotonic_ns()


def _stop_event() -> asyncio.Event:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    return stop


async def _attach(what: str, make: Callable[[], Awaitable[T]], stop: asyncio.Event) -> T:
    """`make()` until it succeeds, a retriable error at a time, for ATTACH_DEADLINE_S.
    NotFound counts as retriable: a consumer may start before the producer that creates
    the topic."""
    deadline = time.monotonic() + ATTACH_DEADLINE_S
    while True:
        try:
            return await make()
        except DanubeError as exc:
            if not (exc.retriable or isinstance(exc, NotFound)) or time.monotonic() > deadline or stop.is_set():
                raise
            print(f"{what}: {exc!r}; again", file=sys.stderr, flush=True)
            await asyncio.sleep(0.5)


async def produce(args: argparse.Namespace) -> dict[str, Any]:
    stop = _stop_event()
    writer = HistoryWriter(Path(args.history_dir), args.name, records_max=args.count * 2 + 10)
    inflight: dict[int, int] = {}  # seq -> invoke time: sends without an answer yet
    counts = {"invoked": 0, "ok": 0, "fail": 0, "info": 0}
    finished = False

    def on_done(seq: int) -> Callable[[DanubeError | None, MessageId | None], None]:
        def record(error: DanubeError | None, message_id: MessageId | None) -> None:
            if finished or inflight.pop(seq, None) is None:
                return
            if error is None:
                assert message_id is not None
                writer.append("ok", "send", {"producer": args.name, "seq": seq, "topic": message_id.topic,
                                             "offset": message_id.offset}, _now())
                counts["ok"] += 1
            else:
                writer.append("info", "send", {"producer": args.name, "seq": seq, "error": error.code.name}, _now())
                counts["info"] += 1
        return record

    async with DanubeClient(args.url, client_name=args.name, request_timeout_ms=args.request_timeout_ms) as client:
        dispatch = DispatchStrategy.RELIABLE if args.reliable else DispatchStrategy.NON_RELIABLE
        producer = await _attach("create_producer", lambda: client.create_producer(
            args.topic, name=args.name, dispatch=dispatch), stop)
        started = time.monotonic()
        seq = 0
        while seq < args.count and not stop.is_set() and time.monotonic() - started < args.duration_s:
            due = min(args.count, int((time.monotonic() - started) * args.rate) + 1)
            batch = []
            while seq < due and len(inflight) < args.inflight_max:
                now = _now()
                writer.append("invoke", "send", {"producer": args.name, "seq": seq, "topic": args.topic,
                                                 "reliable": args.reliable}, now)
                inflight[seq] = now
                batch.append(seq)
                seq += 1
            writer.flush()  # the invocations are on file before any of them can be seen
            counts["invoked"] += len(batch)
            for s in batch:
                try:
                    producer.send_nowait(encode_payload(args.name, s, args.pad_bytes), callback=on_done(s))
                except (ProducerQueueFull, InvalidArgument) as exc:  # refused here: certainly not sent
                    inflight.pop(s, None)
                    writer.append("fail", "send", {"producer": args.name, "seq": s, "error": type(exc).__name__},
                                  _now())
                    counts["fail"] += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), TICK_S)
        grace_end = time.monotonic() + args.grace_s
        while inflight and time.monotonic() < grace_end:
            writer.flush()
            await asyncio.sleep(TICK_S)
        finished = True
        for s in sorted(inflight):
            writer.append("info", "send", {"producer": args.name, "seq": s, "error": "in flight at stop"}, _now())
            counts["info"] += 1
        writer.close()
    return counts


async def consume(args: argparse.Namespace) -> dict[str, Any]:
    stop = _stop_event()
    writer = HistoryWriter(Path(args.history_dir), args.name, records_max=args.deliveries_max + 10)
    counts = {"delivered": 0, "redelivered": 0, "unreadable": 0, "ack_errors": 0, "held": 0}
    async with DanubeClient(args.url, client_name=args.name, request_timeout_ms=args.request_timeout_ms) as client:
        consumer = await _attach("subscribe", lambda: client.subscribe(
            args.topic, args.subscription, sub_type=SUB_TYPES[args.sub_type], consumer_name=args.name,
            initial_position=InitialPosition.EARLIEST, receiver_queue_size=args.receiver_queue_size), stop)
        writer.append("ok", "subscribe", {"subscription": args.subscription, "sub_type": args.sub_type}, _now())
        writer.flush()
        started = last = time.monotonic()
        drain_from: list[float] = []  # when SIGUSR1 came
        asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, lambda: drain_from.append(time.monotonic()))
        while not stop.is_set() and counts["delivered"] < args.deliveries_max:
            now = time.monotonic()
            if now - started > args.duration_s or (args.idle_exit_s and now - last > args.idle_exit_s):
                break
            if drain_from and now - max(last, drain_from[0]) > args.drain_idle_s:
                break
            wanted = min(1_000, args.deliveries_max - counts["delivered"])
            holding = bool(args.hold) and counts["delivered"] >= args.hold_after
            if holding:  # B7: a consumer that stops acknowledging, to be killed holding them
                wanted = min(wanted, args.hold - counts["held"])
                if wanted <= 0:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), 0.2)
                    continue
            try:
                if args.ack_rate and not drain_from:  # a slow consumer (P1): about a second's worth at a time
                    wanted = min(wanted, max(1, int(args.ack_rate)))
                messages = await consumer.batch_receive(wanted, timeout=0.2)
            except Timeout:
                continue
            last = time.monotonic()
            for msg in messages:
                message = decode_payload(msg.payload)
                counts["unreadable"] += message is None
                counts["redelivered"] += msg.redelivery_count > 0
                writer.append("ok", "deliver", {
                    "subscription": args.subscription, "sub_type": args.sub_type,
                    "producer": message[0] if message else None, "seq": message[1] if message else None,
                    "topic": msg.topic, "offset": msg.offset, "redelivery": msg.redelivery_count,
                    **({"held": True} if holding else {})}, _now())
            counts["delivered"] += len(messages)
            writer.flush()  # recorded before acknowledged
            if holding:
                counts["held"] += len(messages)
                continue
            if args.ack_rate and not drain_from:  # a slow consumer (P1); the drain is at full speed
                await asyncio.sleep(len(messages) / args.ack_rate)
            try:
                await consumer.ack(messages)
            except DanubeError as exc:  # not acknowledged: it comes again, which the history shows
                counts["ack_errors"] += 1
                print(f"ack: {exc!r}", file=sys.stderr, flush=True)
        writer.close()
    return counts


async def metadata(args: argparse.Namespace) -> dict[str, Any]:
    """Register operations on `keys` metadata keys through the admin API, one at a time,
    each sent to one of the `admin_url`s picked by the seeded generator: put (a value
    unique to this process), a linearizable get, or a get then a compare-and-swap on the
    version it read. Values are unique and never deleted, so "version is n" is "value is
    the one read at version n": the cas is recorded with that value as `expected`."""
    stop = _stop_event()
    rng = random.Random(args.seed)
    writer = HistoryWriter(Path(args.history_dir), args.name, records_max=args.ops * 2 + 10)
    counts = {"ok": 0, "info": 0, "fail": 0}
    keys = [f"{args.key_prefix}/k{i}" for i in range(args.keys)]
    admins = [AdminClient(url, timeout_ms=args.request_timeout_ms, client_name=args.name) for url in args.admin_url]

    async def call(f: str, value: dict[str, Any], operation: Coroutine[Any, Any, dict[str, Any]]) -> None:
        writer.append("invoke", f, value, _now())
        writer.flush()
        try:
            result = await operation
        except (InvalidArgument, PermissionDenied) as exc:  # refused as asked: never applied
            writer.append("fail", f, {"error": exc.code.name}, _now())
            counts["fail"] += 1
        except DanubeError as exc:  # a timeout, a lost leader: it may have been applied
            writer.append("info", f, {"error": exc.code.name}, _now())
            counts["info"] += 1
        else:
            writer.append("ok", f, result, _now())
            counts["ok"] += 1
        writer.flush()

    try:
        for admin in admins:
            await _connect(admin, stop)
        started = time.monotonic()
        for n in range(args.ops):
            if stop.is_set() or time.monotonic() - started > args.duration_s:
                break
            admin = rng.choice(admins)
            key = rng.choice(keys)
            value = f"{args.name}-{n}"
            choice = rng.random()
            if choice < 0.5:
                await call("put", {"key": key, "value": value}, _put(admin, key, value))
            elif choice < 0.8:
                await call("get", {"key": key}, _get(admin, key))
            else:
                try:
                    current = await admin.metadata_get(key)
                except DanubeError:
                    continue  # nothing done yet: no operation to record
                await call("cas", {"key": key, "value": value, "expected": current.value.decode() if current else None},
                           _cas(admin, key, current.version if current else 0, value))
            if args.pause_ms:
                await asyncio.sleep(args.pause_ms / 1000)
    finally:
        for admin in admins:
            admin.close()
        writer.close()
    return counts


async def _connect(admin: AdminClient, stop: asyncio.Event) -> None:
    """The `Connect` handshake, retried for ATTACH_DEADLINE_S (a node still starting);
    later requests ride libzmq's own reconnects across a node's restart."""
    async def attempt() -> object:
        try:
            return await admin.connect()
        except DanubeError:
            admin.close()  # so that the next attempt opens a fresh socket
            raise

    await _attach(f"connect {admin.endpoint}", attempt, stop)


async def _put(admin: AdminClient, key: str, value: str) -> dict[str, Any]:
    await admin.metadata_put(key, value.encode())
    return {}


async def _get(admin: AdminClient, key: str) -> dict[str, Any]:
    entry = await admin.metadata_get(key)
    return {"result": None if entry is None else entry.value.decode()}


async def _cas(admin: AdminClient, key: str, expected_version: int, value: str) -> dict[str, Any]:
    written = await admin.metadata_cas(key, expected_version, value.encode())
    return {"result": written.succeeded}


async def observe(args: argparse.Namespace) -> dict[str, Any]:
    """Every `interval_ms`, each node's own view (`cluster_status`): `status` records
    {node, term, role, leader} for Election Safety (checkers.leader_observations). An
    unreachable node is skipped, not recorded."""
    stop = _stop_event()
    writer = HistoryWriter(Path(args.history_dir), args.name, records_max=args.records_max)
    admins = [AdminClient(url, timeout_ms=args.request_timeout_ms, client_name=args.name) for url in args.admin_url]
    counts = {"observations": 0, "unreachable": 0}
    try:
        for admin in admins:
            await _connect(admin, stop)
        started = time.monotonic()
        while not stop.is_set() and time.monotonic() - started < args.duration_s \
                and writer.records + len(admins) <= args.records_max:
            for admin in admins:
                try:
                    status = await admin.cluster_status()
                except DanubeError:
                    counts["unreachable"] += 1
                    continue
                writer.append("ok", "status", {"node": status.node_id, "term": status.term, "role": status.role,
                                               "leader": status.leader_id}, _now())
                counts["observations"] += 1
            writer.flush()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), args.interval_ms / 1000)
    finally:
        for admin in admins:
            admin.close()
        writer.close()
    return counts


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos.harness.workload", description=__doc__.split("\n")[0])
    kinds = parser.add_subparsers(dest="kind", required=True)
    for kind in ("produce", "consume"):
        sub = kinds.add_parser(kind)
        sub.add_argument("--url", required=True, help="any broker's client URL (redirects are followed)")
        sub.add_argument("--topic", required=True)
        sub.add_argument("--name", required=True, help="the process name: history file, producer/consumer name")
        sub.add_argument("--history-dir", required=True)
        sub.add_argument("--duration-s", type=float, default=300.0, help="stop after this long at most")
        sub.add_argument("--request-timeout-ms", type=int, default=5_000)
    metadata_ = kinds.add_parser("metadata")
    observe_ = kinds.add_parser("observe")
    for sub in (metadata_, observe_):
        sub.add_argument("--admin-url", action="append", required=True, help="a node's admin URL (repeatable)")
        sub.add_argument("--name", required=True, help="the process name: history file, client name")
        sub.add_argument("--history-dir", required=True)
        sub.add_argument("--duration-s", type=float, default=300.0, help="stop after this long at most")
        sub.add_argument("--request-timeout-ms", type=int, default=3_000)
    metadata_.add_argument("--ops", type=int, default=1_000, help="operations at most")
    metadata_.add_argument("--keys", type=int, default=10, help="how many keys the operations spread over")
    metadata_.add_argument("--key-prefix", default="/chaos/registers")
    metadata_.add_argument("--seed", type=int, default=0, help="picks node, key and operation; replays exactly")
    metadata_.add_argument("--pause-ms", type=float, default=0.0, help="between operations")
    observe_.add_argument("--interval-ms", type=float, default=200.0)
    observe_.add_argument("--records-max", type=int, default=100_000)
    produce_ = kinds.choices["produce"]
    produce_.add_argument("--reliable", action="store_true", help="a reliable (WAL) producer")
    produce_.add_argument("--count", type=int, default=10_000, help="messages to send at most")
    produce_.add_argument("--rate", type=float, default=1_000.0, help="messages per second")
    produce_.add_argument("--inflight-max", type=int, default=5_000, help="sends without an answer at most")
    produce_.add_argument("--pad-bytes", type=int, default=0, help="padding added to each payload")
    produce_.add_argument("--grace-s", type=float, default=10.0, help="at stop, wait this long for receipts")
    consume_ = kinds.choices["consume"]
    consume_.add_argument("--subscription", required=True)
    consume_.add_argument("--sub-type", choices=sorted(SUB_TYPES), default="shared")
    consume_.add_argument("--idle-exit-s", type=float, default=0.0, help="stop after this long with no delivery")
    consume_.add_argument("--drain-idle-s", type=float, default=6.0,
                          help="after SIGUSR1, stop after this long with no delivery")
    consume_.add_argument("--deliveries-max", type=int, default=1_000_000, help="stop after this many deliveries")
    consume_.add_argument("--receiver-queue-size", type=int, default=RECEIVER_QUEUE_SIZE)
    consume_.add_argument("--hold", type=int, default=0,
                          help="once --hold-after deliveries are made, receive this many more without acknowledging"
                               " them (recorded with held: true), then receive nothing until stopped")
    consume_.add_argument("--hold-after", type=int, default=0, help="deliveries acknowledged before holding")
    consume_.add_argument("--ack-rate", type=float, default=0.0,
                          help="acknowledge at most this many messages per second until SIGUSR1 (0: no limit)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    for name in ("duration_s", "rate", "count", "inflight_max", "deliveries_max", "ops", "keys", "interval_ms"):
        if getattr(args, name, 1) is not None and getattr(args, name, 1) <= 0:
            raise SystemExit(f"--{name.replace('_', '-')} must be positive")
    Path(args.history_dir).mkdir(parents=True, exist_ok=True)
    run = {"produce": produce, "consume": consume, "metadata": metadata, "observe": observe}[args.kind]
    counts = asyncio.run(run(args))
    print(json.dumps({"name": args.name, **counts}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

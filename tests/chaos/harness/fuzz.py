"""Frame fuzzing of a real broker's client and admin ports (reliability.md S1-S3).

`FrameGenerator` is the pure part: from a seeded `random.Random` it makes the ZeroMQ
messages a hostile or broken peer could send, starting from a valid request of every
type the port takes (`CLIENT_REQUESTS`, `ADMIN_REQUESTS`, built from each message's
annotations, so a new message type is fuzzed without a line here) and breaking it:
mutated fields, wrong tags, extra or missing fields, truncations, flipped bytes,
random bytes, msgpack bombs (2**32-1 declared lengths with short bodies, deep
nesting), frames over `limits.frame_bytes_max` and messages of more parts than
`limits.requests_per_message_max`.

`run(seed, seconds)` starts a broker process on loopback, sends those messages for a
bounded time over several DEALER connections to each port while a bystander producer
sends valid batches on a connection of its own, then checks that the broker is alive
and serving (a produce/consume round trip that finds every acknowledged bystander
message, and an admin request), that no actor failed (`danube_actor_failures_total`
is 0 and the log has no handler failure) and that its RSS stayed within budget. A
failing seed replays: `python -m tests.chaos.harness.fuzz --seed S --seconds N` (the
same messages in the same order; what the broker answers, and when, may differ).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import dataclasses
import json
import math
import os
import random
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import types
import typing
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack
import psutil
import zmq
from zmq.utils.monitor import recv_monitor_message

from danube_zmq.transport.admin_protocol import ADMIN_REQUESTS
from danube_zmq.transport.client_protocol import CLIENT_REQUESTS
from danube_zmq.transport.codec import Message, Struct
from danube_zmq.transport.common import PROTOCOL_VERSION

MIB = 1 << 20
ERROR_TAG = 3  # transport/common.py Error
CONNECT_TAG, CONNECTED_TAG, PING_TAG, PONG_TAG = 1, 2, 5, 6
RELIABLE = 1  # DispatchStrategy.RELIABLE

# The broker's limits for a fuzz run (environment overrides of config/broker_config.py). Kept
# small so that what the limits let a peer make the broker hold is well inside the
# RSS budget: inbound 16 MiB over all connections, outbound 16 MiB, a frame 2 MiB.
BROKER_ENV = {
    "DANUBE_LIMITS__FRAME_BYTES_MAX": str(2 * MIB),
    "DANUBE_LIMITS__INBOUND_BYTES_PER_CONNECTION_MAX": str(4 * MIB),
    "DANUBE_LIMITS__INBOUND_BYTES_MAX": str(16 * MIB),
    "DANUBE_LIMITS__OUTBOUND_BYTES_PER_CONNECTION_MAX": str(4 * MIB),
    "DANUBE_LIMITS__OUTBOUND_BYTES_MAX": str(16 * MIB),
    "DANUBE_POLICIES__MAX_MESSAGE_SIZE": str(256 * 1024),
    # The bystander's namespace: one no mutation names, so the admin requests the fuzzer
    # sends validly (a namespace's policies, quotas, limits) never reach its topic.
    "DANUBE_BOOTSTRAP_NAMESPACES": "default,fuzz-bystander",
}
FRAME_BYTES_MAX = 2 * MIB  # over max_message_size + the 1 MiB envelope, as config demands
REQUESTS_PER_MESSAGE_MAX = 1024  # the default of limits.requests_per_message_max
# RSS growth allowed over the run: the limits above bound what peers make the broker
# hold (16 MiB in, 16 MiB out); the rest is room for the topics the fuzzer creates
# (their caches and WAL buffers) and the allocator's slack.
RSS_BUDGET_BYTES = 64 * MIB

# Names the generator draws strings from: valid ones reach deep into the broker (topics
# get created, producers attach, namespaces are listed) while staying a handful, so the
# state a run makes is bounded; the rest are shapes a name check must refuse.
TOPICS = ("/default/fuzz-0", "/default/fuzz-1", "/fuzz/fuzz-2", "/default/fuzz-3-partition-0")
NAMES = ("default", "fuzz", "fuzz-sub", "fuzz-producer", "public", "x", "")
HOSTILE_STRINGS = ("../../etc/passwd", "/default/../x", "/default/a\x00b", "\u202e", "/" * 300,
                   "/default/" + "a" * 300, "é" * 50, "/default/x/y/z", " ", "\n")
BOUNDARY_INTS = (0, 1, -1, 2, 127, 128, 255, 256, 65535, 65536, 2**31 - 1, 2**31, 2**32 - 1, 2**32,
                 2**53, 2**63 - 1, 2**63, 2**64 - 1, -(2**31), -(2**63))
BYSTANDER_TOPIC = "/fuzz-bystander/topic"  # no mutation names it or its namespace: only the bystander writes it


@dataclass(frozen=True)
class Case:
    """One ZeroMQ message to send: its kind (for the report) and its parts."""

    kind: str
    parts: tuple[bytes, ...]


# Kinds and their weights: mostly frames that get past msgpack and into the handlers,
# where the bugs live; the costly ones (oversize, many parts) rarely.
KINDS = {"valid": 12, "mutated": 30, "wrong_tag": 6, "fields": 8, "truncated": 8, "bitflip": 10,
         "random": 6, "bomb": 8, "empty": 2, "multipart": 6, "too_many_parts": 1, "oversize": 1,
         "hostile_schema": 1}
REGISTER_SCHEMA_TAG = 39
# Schema definitions that stalled or bloated the broker (issue 37): a backtracking
# pattern, deep nesting, a property bomb, a $ref cycle, a recursive Avro record.
HOSTILE_SCHEMAS: tuple[tuple[str, Callable[[random.Random], bytes]], ...] = (
    ("json_schema", lambda rng: b'{"type":"string","pattern":"^(a+)+$"}'),
    ("json_schema", lambda rng: b'{"type":"object","properties":{"e":{"type":"string","pattern":'
                                b'"^([a-zA-Z0-9]+\\\\.?)+@x$"}}}'),
    ("json_schema", lambda rng: b'{"items":' * (depth := rng.choice((200, 2000))) + b'{}' + b'}' * depth),
    ("json_schema", lambda rng: json.dumps({"type": "object", "patternProperties": {
        f"^p{i}(a+)+$": {"type": "string"} for i in range(rng.choice((1000, 20_000)))}}).encode()),
    ("json_schema", lambda rng: b'{"$defs":{"a":{"$ref":"#/$defs/b"},"b":{"$ref":"#/$defs/a"}},"$ref":"#/$defs/a"}'),
    ("avro", lambda rng: b'{"type":"record","name":"R","fields":[{"name":"n","type":["null","R"]}]}'),
    ("avro", lambda rng: (b'{"type":"record","name":"R0","fields":[' + b''.join(
        b'{"name":"f","type":{"type":"record","name":"R%d","fields":[' % i for i in range(1, 2000))
        + b']}}' * 1999 + b']}')),
)


class FrameGenerator:
    """Seeded messages for one port: `case()` draws a kind and makes its message."""

    def __init__(self, rng: random.Random, requests: Sequence[type[Message]], *,
                 frame_bytes_max: int = FRAME_BYTES_MAX,
                 requests_per_message_max: int = REQUESTS_PER_MESSAGE_MAX) -> None:
        self.rng = rng
        self.requests = tuple(requests)
        self.frame_bytes_max = frame_bytes_max
        self.requests_per_message_max = requests_per_message_max
        self.known_ints: list[int] = []  # ids the broker gave out (producers, consumers)
        self._kinds = list(KINDS)
        self._weights = list(KINDS.values())
        self._shapes: dict[type[Struct], tuple[Any, ...]] = {}

    def learn_id(self, value: int) -> None:
        """Remember an id the broker answered with, so mutations can name live objects."""
        if len(self.known_ints) >= 64:
            self.known_ints.pop(0)
        self.known_ints.append(value)

    def case(self, kind: str | None = None) -> Case:
        kind = kind or self.rng.choices(self._kinds, self._weights)[0]
        return Case(kind, tuple(getattr(self, f"_{kind}")()))

    # ----------------------------------------------------------------- values
    def valid_items(self, cls: type[Message]) -> list[Any]:
        """[tag, fields...] of a well-typed `cls`: every field of its type (the trailing
        defaulted ones sometimes left out, as an older peer would)."""
        fields = self._shape(cls)
        count = len(fields)
        if self.rng.random() < 0.3:
            count = self.rng.randint(cls._required, len(fields))
        return [cls.TAG, *(self.value_of(tp, 0) for tp in fields[:count])]

    def _shape(self, cls: type[Struct]) -> tuple[Any, ...]:
        """The annotations of `cls`'s fields, in wire order (looked up once a class)."""
        shape = self._shapes.get(cls)
        if shape is None:
            hints = typing.get_type_hints(cls)
            shape = self._shapes[cls] = tuple(hints[f.name] for f in dataclasses.fields(cls))
        return shape

    def value_of(self, tp: Any, depth: int) -> Any:
        rng = self.rng
        origin = typing.get_origin(tp)
        if tp is int:
            pick = rng.random()
            if pick < 0.5:
                return rng.randint(0, 16)
            if pick < 0.7 and self.known_ints:
                return rng.choice(self.known_ints)
            return rng.choice(BOUNDARY_INTS) if pick < 0.9 else rng.randint(0, 2**63 - 1)
        if tp is float:
            return rng.choice((0.0, 1.5, -1.0, 1e308, rng.random()))
        if tp is bool:
            return rng.random() < 0.5
        if tp is str:
            return self._string()
        if tp is bytes:
            return rng.randbytes(rng.choice((0, 1, 8, 100, 1000)))
        if origin in (typing.Union, types.UnionType):
            inner = next(a for a in typing.get_args(tp) if a is not type(None))
            return None if rng.random() < 0.4 else self.value_of(inner, depth)
        if origin is list:
            (item,) = typing.get_args(tp)
            return [self.value_of(item, depth + 1) for _ in range(rng.choice((0, 1, 1, 2, 5)) if depth < 3 else 0)]
        if origin is dict:
            _, value = typing.get_args(tp)
            return {self._string(): self.value_of(value, depth + 1) for _ in range(rng.choice((0, 1, 3)))}
        if isinstance(tp, type) and issubclass(tp, Struct):
            return [self.value_of(field_tp, depth + 1) for field_tp in self._shape(tp)]
        raise TypeError(f"no generator for {tp!r}")  # a new field type: teach value_of

    def _string(self) -> str:
        pick = self.rng.random()
        if pick < 0.5:
            return self.rng.choice(TOPICS)
        if pick < 0.8:
            return self.rng.choice(NAMES)
        if pick < 0.95:
            return self.rng.choice(HOSTILE_STRINGS)
        return "".join(chr(self.rng.randint(1, 0x2FFF)) for _ in range(self.rng.randint(0, 64)))

    def wild_value(self) -> Any:
        """Any msgpack value, mostly of the wrong type for wherever it lands."""
        rng = self.rng
        return rng.choice((
            lambda: None, lambda: rng.random() < 0.5, lambda: rng.choice(BOUNDARY_INTS),
            lambda: rng.choice((math.nan, math.inf, -0.0, 1e-300)), self._string,
            lambda: rng.randbytes(rng.randint(0, 64)), lambda: "x" * rng.choice((1000, 65536)),
            lambda: [self.wild_value() for _ in range(rng.randint(0, 3))],
            lambda: {self._string(): self.wild_value() for _ in range(rng.randint(0, 3))},
            lambda: list(range(rng.choice((100, 10_000)))),
            lambda: [[[[[[[]]]]]]],
        ))()

    def _pack(self, items: Any) -> bytes:
        return msgpack.packb(items, use_bin_type=True)

    def _valid_frame(self) -> bytes:
        return self._pack(self.valid_items(self.rng.choice(self.requests)))

    # ------------------------------------------------------------------ kinds
    def _valid(self) -> list[bytes]:
        return [self._valid_frame()]

    def _mutated(self) -> list[bytes]:
        items = self.valid_items(self.rng.choice(self.requests))
        for _ in range(self.rng.choice((1, 1, 1, 2, 3))):
            where = self.rng.randrange(1, len(items)) if len(items) > 1 else 0
            items[where] = self.wild_value()
        return [self._pack(items)]

    def _wrong_tag(self) -> list[bytes]:
        items = self.valid_items(self.rng.choice(self.requests))
        items[0] = self.rng.choice((0, -1, 2**64 - 1, 2**31, self.rng.randint(0, 300), "1", None, 1.0, [1]))
        return [self._pack(items)]

    def _fields(self) -> list[bytes]:
        items = self.valid_items(self.rng.choice(self.requests))
        if self.rng.random() < 0.5 and len(items) > 1:
            del items[self.rng.randrange(1, len(items)):]
        else:
            items.extend(self.wild_value() for _ in range(self.rng.randint(1, 4)))
        return [self._pack(items)]

    def _truncated(self) -> list[bytes]:
        frame = self._valid_frame()
        return [frame[: self.rng.randrange(len(frame))]]

    def _bitflip(self) -> list[bytes]:
        frame = bytearray(self._valid_frame())
        for _ in range(self.rng.randint(1, 4)):
            frame[self.rng.randrange(len(frame))] = self.rng.randrange(256)
        return [bytes(frame)]

    def _random(self) -> list[bytes]:
        return [self.rng.randbytes(self.rng.choice((1, 2, 5, 16, 64, 256, 4096)))]

    def _empty(self) -> list[bytes]:
        return [b""] * self.rng.randint(1, 3)

    def _bomb(self) -> list[bytes]:
        """A declared size far past the frame (the decoder must refuse it before
        allocating), or nesting deeper than any message; alone or as a field."""
        rng = self.rng
        huge = rng.choice((2**32 - 1, 2**31, 10**9, 1 << 20))
        body = rng.randbytes(rng.randint(0, 10))
        bomb = rng.choice((
            lambda: b"\xdd" + struct.pack(">I", huge) + body,  # array 32
            lambda: b"\xdf" + struct.pack(">I", huge) + body,  # map 32
            lambda: b"\xdb" + struct.pack(">I", huge) + body,  # str 32
            lambda: b"\xc6" + struct.pack(">I", huge) + body,  # bin 32
            lambda: b"\xc9" + struct.pack(">I", huge) + b"\x01" + body,  # ext 32
            lambda: b"\xdc\xff\xff" + body,  # array 16 of 65535
            lambda: b"\x91" * rng.choice((100, 1000, 10_000, 100_000)) + b"\xc0",  # deep arrays
            lambda: b"\x81\xa1k" * rng.choice((1000, 10_000)) + b"\xc0",  # deep maps
        ))()
        if rng.random() < 0.5:
            return [bomb]
        # As a field of a request whose tag and id are fine: [tag, id, <bomb>]
        cls = rng.choice(self.requests)
        return [b"\x93" + self._pack(cls.TAG) + self._pack(rng.randint(0, 100)) + bomb]

    def _multipart(self) -> list[bytes]:
        return [self.case(self.rng.choice(("valid", "mutated", "truncated", "random"))).parts[0]
                for _ in range(self.rng.randint(2, 64))]

    def _too_many_parts(self) -> list[bytes]:
        count = self.requests_per_message_max + self.rng.randint(1, 200)
        ping = self._pack([PING_TAG, 1])
        return [ping] * count

    def _hostile_schema(self) -> list[bytes]:
        """A RegisterSchema of a definition built to stall or bloat the registry (client
        port only; elsewhere a mutated frame)."""
        if not any(cls.TAG == REGISTER_SCHEMA_TAG for cls in self.requests):
            return self._mutated()
        index = self.rng.randrange(len(HOSTILE_SCHEMAS))
        schema_type, make = HOSTILE_SCHEMAS[index]
        definition = make(self.rng)[: self.frame_bytes_max - 1024]
        # A subject of its own per definition: each is compiled, not refused as incompatible.
        return [self._pack([REGISTER_SCHEMA_TAG, self.rng.randint(0, 100), f"fuzz-hostile-{index}", schema_type,
                            definition])]

    def _oversize(self) -> list[bytes]:
        # A Send-shaped frame one to a thousand bytes over the limit: libzmq cuts the
        # connection at the header (ZMQ_MAXMSGSIZE), the broker never sees it.
        size = self.frame_bytes_max + self.rng.randint(1, 1000)
        return [b"\xc6" + struct.pack(">I", size - 5) + bytes(size - 5)]


# ---------------------------------------------------------------------- the run
@dataclass
class Report:
    seed: int
    seconds: float
    messages_sent: int = 0
    frames_sent: int = 0
    send_refused: int = 0  # EAGAIN at the DEALER (its queue to the broker full)
    by_kind: Counter[str] = field(default_factory=Counter)
    answers: int = 0
    errors_answered: Counter[str] = field(default_factory=Counter)  # by error code
    unreadable_answers: int = 0  # a reply that is not a msgpack [tag, ...]: a broker bug
    connections_cut: int = 0  # DISCONNECTED events at the fuzzing DEALERs
    bystander_acked: int = 0
    takeovers_tried: int = 0  # connections made with the bystander's routing id
    frames_stolen: int = 0  # answers to the bystander's requests that reached such a connection
    bystander_consumed: int = 0
    bystander_stored_unacked: int = 0  # refused after they were written: stored all the same
    actor_failures: float = -1.0
    log_failures: list[str] = field(default_factory=list)
    rss_start_bytes: int = 0
    rss_peak_bytes: int = 0
    rss_end_bytes: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["by_kind"] = dict(self.by_kind)
        out["errors_answered"] = dict(self.errors_answered)
        out["rss_growth_mib"] = round((self.rss_peak_bytes - self.rss_start_bytes) / MIB, 1)
        return out


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class FuzzBroker:
    """A standalone broker on free loopback ports, its data in a temporary directory."""

    process: subprocess.Popen[bytes]
    url: str
    admin_url: str
    metrics_url: str
    log_path: Path
    data_dir: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def metric(self, name: str) -> float:
        with urllib.request.urlopen(self.metrics_url, timeout=10) as answer:
            text = answer.read().decode()
        total = 0.0
        for line in text.splitlines():
            if line.startswith(name) and (line[len(name)] in " {"):
                total += float(line.rsplit(" ", 1)[1])
        return total

    def rss(self) -> int:
        return int(psutil.Process(self.process.pid).memory_info().rss)


@contextlib.contextmanager
def fuzz_broker(env: dict[str, str] | None = None) -> Iterator[FuzzBroker]:
    work = Path(tempfile.mkdtemp(prefix="danube-fuzz-"))
    url, admin_url = f"tcp://127.0.0.1:{_free_port()}", f"tcp://127.0.0.1:{_free_port()}"
    metrics_port = _free_port()
    log_path = work / "broker.log"
    with open(log_path, "wb") as log_file:
        process = subprocess.Popen(
            [sys.executable, "-m", "danube_zmq.cli.main", "broker", "start", "--listen", url,
             "--admin-listen", admin_url, "--metrics-port", str(metrics_port), "--data-dir", str(work / "data")],
            stdout=log_file, stderr=subprocess.STDOUT, env={**os.environ, **BROKER_ENV, **(env or {})},
            preexec_fn=_die_with_parent)
    broker = FuzzBroker(process, url, admin_url, f"http://127.0.0.1:{metrics_port}/metrics", log_path, work)
    try:
        _wait_ready(broker)
        yield broker
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(5)
        if os.environ.get("DANUBE_FUZZ_KEEP") is None:
            shutil.rmtree(work, ignore_errors=True)


def _die_with_parent() -> None:
    # The broker ends with the fuzzer even when that is killed -9 (no `finally` runs).
    ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


_PR_SET_PDEATHSIG = 1


def _wait_ready(broker: FuzzBroker, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if broker.process.poll() is not None:
            raise RuntimeError(f"broker exited with {broker.process.returncode}:\n{broker.log()}")
        with contextlib.suppress(OSError):
            broker.metric("danube_actor_failures_total")
            return
        time.sleep(0.2)
    raise RuntimeError(f"broker did not serve /metrics within {timeout_s} s:\n{broker.log()}")


class _Peer:
    """One fuzzing DEALER, with a monitor counting the connections the broker cut."""

    def __init__(self, ctx: zmq.Context[Any], url: str, gen: FrameGenerator, rng: random.Random) -> None:
        self.sock = ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.SNDHWM, 100)
        self.sock.setsockopt(zmq.RCVHWM, 1000)
        self.sock.setsockopt(zmq.ROUTING_ID, b"\x01" + rng.randbytes(15))
        self.monitor = self.sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        self.sock.connect(url)
        self.gen = gen

    def send(self, case: Case, report: Report) -> bool:
        """False when the DEALER's queue to the broker is full (the message is dropped)."""
        try:
            self.sock.send_multipart(case.parts, zmq.NOBLOCK, copy=len(case.parts) > 1)
        except zmq.Again:
            report.send_refused += 1
            return False
        report.messages_sent += 1
        report.frames_sent += len(case.parts)
        report.by_kind[case.kind] += 1
        return True

    def drain(self, report: Report) -> None:
        while True:
            try:
                frame = self.sock.recv(zmq.NOBLOCK)
            except zmq.Again:
                break
            report.answers += 1
            try:
                reply = msgpack.unpackb(frame, raw=False, strict_map_key=False)
                tag = reply[0]
            except Exception:  # whatever it is, the broker must never send it
                report.unreadable_answers += 1
                continue
            if tag == ERROR_TAG and len(reply) > 2:
                report.errors_answered[str(reply[2])] += 1
            else:
                # Ids the broker gave out (ProducerCreated, Subscribed: [tag, rid, id, ...]).
                if len(reply) > 2 and type(reply[2]) is int and reply[2] > 16:
                    self.gen.learn_id(reply[2])
        while self.monitor.poll(0):
            if recv_monitor_message(self.monitor)["event"] == zmq.EVENT_DISCONNECTED:
                report.connections_cut += 1

    def close(self) -> None:
        self.sock.disable_monitor()
        self.monitor.close(linger=0)
        self.sock.close(linger=0)


class _Bystander:
    """A well-behaved raw producer on its own connection and topic, sending a one-message
    batch now and then while the fuzzing goes on; what the broker acknowledges must be
    consumed at the end."""

    def __init__(self, ctx: zmq.Context[Any], url: str) -> None:
        self.sock = ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.identity = b"\x01bystander-" + os.urandom(4)
        self.sock.setsockopt(zmq.ROUTING_ID, self.identity)
        self.sock.connect(url)
        self.next_id = 1
        self.pending: dict[int, bytes] = {}  # request id -> payload
        self.acked: dict[int, bytes] = {}  # offset -> payload
        self.failed: list[Any] = []
        self.producer_id = 0

    def request(self, *items: Any, timeout_s: float = 30.0) -> list[Any]:
        request_id, self.next_id = self.next_id, self.next_id + 1
        self.sock.send(msgpack.packb([items[0], request_id, *items[1:]], use_bin_type=True))
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.sock.poll(100):
                reply = msgpack.unpackb(self.sock.recv(), raw=False)
                if reply[1] == request_id:
                    return reply
        raise TimeoutError(f"no answer to {items[0]} within {timeout_s} s")

    def start(self) -> None:
        self.request(CONNECT_TAG, PROTOCOL_VERSION, "fuzz-bystander")
        self.attach()

    def attach(self) -> None:
        # CreateProducer, reliable (the topic keeps what it acknowledged for the check).
        created = self.request(20, BYSTANDER_TOPIC, "fuzz-bystander", RELIABLE)
        if created[0] != 21:
            raise RuntimeError(f"bystander could not attach: {created}")
        self.producer_id = created[2]

    def send(self, now_ms: int) -> None:
        request_id, self.next_id = self.next_id, self.next_id + 1
        payload = f"bystander-{request_id}".encode()
        self.pending[request_id] = payload
        self.sock.send(msgpack.packb([23, request_id, self.producer_id, [payload], [now_ms]], use_bin_type=True))

    def ping(self) -> None:
        request_id, self.next_id = self.next_id, self.next_id + 1
        self.sock.send(msgpack.packb([PING_TAG, request_id], use_bin_type=True))

    def drain(self) -> None:
        while self.sock.poll(0):
            reply = msgpack.unpackb(self.sock.recv(), raw=False)
            payload = self.pending.pop(reply[1], None)
            if payload is None:
                continue
            if reply[0] == 24:  # SendReceipt
                self.acked[reply[3][0]] = payload
            else:
                self.failed.append(reply)

    def settle(self, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while self.pending and time.monotonic() < deadline:
            self.sock.poll(100)
            self.drain()


class _Thief:
    """The session takeover of issue 37: a connection with the bystander's routing id
    (and a Ping), now and then. It must never displace the bystander nor receive
    anything of its session (a receipt for one of its sends)."""

    def __init__(self, ctx: zmq.Context[Any], url: str, identity: bytes) -> None:
        self.sock = ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.ROUTING_ID, identity)
        self.sock.connect(url)
        self.sock.send(msgpack.packb([PING_TAG, 1], use_bin_type=True))

    def drain(self, bystander: _Bystander, report: Report) -> None:
        while self.sock.poll(0):
            reply = msgpack.unpackb(self.sock.recv(), raw=False)
            if reply[0] != PONG_TAG and reply[0] != ERROR_TAG and reply[1] in bystander.pending:
                report.frames_stolen += 1

    def close(self) -> None:
        self.sock.close(linger=0)


def fuzz(broker: FuzzBroker, seed: int, seconds: float, *, client_peers: int = 4, admin_peers: int = 2,
         rss_budget_bytes: int = RSS_BUDGET_BYTES) -> Report:
    """Fuzz `broker` for `seconds` from `seed`, then check it; the report's `problems`
    lists every failed check (empty: passed)."""
    rng = random.Random(seed)
    report = Report(seed=seed, seconds=seconds)
    ctx: zmq.Context[Any] = zmq.Context()
    client_gen = FrameGenerator(random.Random(rng.random()), CLIENT_REQUESTS)
    admin_gen = FrameGenerator(random.Random(rng.random()), ADMIN_REQUESTS)
    peers = [_Peer(ctx, broker.url, client_gen, rng) for _ in range(client_peers)]
    peers += [_Peer(ctx, broker.admin_url, admin_gen, rng) for _ in range(admin_peers)]
    bystander = _Bystander(ctx, broker.url)
    try:
        bystander.start()
        # A session on some of the client connections, so session paths get fuzzed too.
        for peer in peers[: client_peers // 2]:
            peer.send(Case("connect", (msgpack.packb([CONNECT_TAG, 1, PROTOCOL_VERSION, "fuzz"]),)), report)
        report.rss_start_bytes = report.rss_peak_bytes = broker.rss()
        deadline = time.monotonic() + seconds
        last_bystander = last_rss = 0.0
        thief: _Thief | None = None
        while time.monotonic() < deadline and broker.process.poll() is None:
            peer = rng.choice(peers)
            if not peer.send(peer.gen.case(), report):
                time.sleep(0.001)  # the broker is behind (or cut this peer): no busy loop
            now = time.monotonic()
            if now - last_bystander > 0.05:
                last_bystander = now
                if thief is not None:
                    thief.drain(bystander, report)
                bystander.send(int(time.time() * 1000))
                bystander.drain()
                for each in peers:
                    each.drain(report)
            if now - last_rss > 0.25:
                last_rss = now
                report.rss_peak_bytes = max(report.rss_peak_bytes, broker.rss())
                if rng.random() < 0.1:  # the bystander's routing id, tried by another connection
                    if thief is not None:
                        thief.close()
                    thief = _Thief(ctx, broker.url, bystander.identity)
                    report.takeovers_tried += 1
                if rng.random() < 0.2:  # a fresh connection now and then (identity, handshake, cut)
                    index = rng.randrange(len(peers))
                    old = peers[index]
                    old.drain(report)
                    url = old.sock.getsockopt(zmq.LAST_ENDPOINT).decode()
                    old.close()
                    peers[index] = _Peer(ctx, url, old.gen, rng)
        if thief is not None:
            thief.drain(bystander, report)
            thief.close()
            thief = None
        _check(broker, report, bystander, peers, rss_budget_bytes)
    finally:
        for peer in peers:
            peer.close()
        if thief is not None:
            thief.close()
        bystander.sock.close(linger=0)
        ctx.term()
    return report


def _check(broker: FuzzBroker, report: Report, bystander: _Bystander, peers: list[_Peer],
           rss_budget_bytes: int) -> None:
    if broker.process.poll() is not None:
        report.problems.append(f"broker exited with {broker.process.returncode}")
        return
    time.sleep(1.0)  # the last answers in flight
    for peer in peers:
        peer.drain(report)
    bystander.settle()
    report.bystander_acked = len(bystander.acked)
    if bystander.pending:
        report.problems.append(f"bystander: {len(bystander.pending)} sends never answered")
    if bystander.failed:
        report.problems.append(f"bystander: sends refused: {bystander.failed[:3]}")
    try:
        if bystander.request(PING_TAG)[0] != PONG_TAG:
            report.problems.append("bystander: Ping not answered with Pong")
    except TimeoutError as exc:
        report.problems.append(f"bystander: {exc}")
    try:
        asyncio.run(_round_trip(broker, bystander, report))
    except Exception as exc:  # the check failed: say how
        report.problems.append(f"round trip failed: {type(exc).__name__}: {exc}")
    report.rss_end_bytes = broker.rss()
    report.rss_peak_bytes = max(report.rss_peak_bytes, report.rss_end_bytes)
    if report.rss_peak_bytes > report.rss_start_bytes + rss_budget_bytes:
        report.problems.append(f"RSS peak {report.rss_peak_bytes / MIB:.1f} MiB over start "
                               f"{report.rss_start_bytes / MIB:.1f} MiB + {rss_budget_bytes / MIB:.0f} MiB")
    report.actor_failures = broker.metric("danube_actor_failures_total")
    if report.actor_failures:
        report.problems.append(f"danube_actor_failures_total = {report.actor_failures:g}")
    report.log_failures = [line for line in broker.log().splitlines()
                           if re.search(r"handler for \S+ raised|Traceback|CRITICAL", line)][:20]
    if report.log_failures:
        report.problems.append(f"{len(report.log_failures)} failure lines in the broker log")
    if report.frames_stolen:
        report.problems.append(f"{report.frames_stolen} answers to the bystander reached a connection that only"
                               " took its routing id")
    if report.unreadable_answers:
        report.problems.append(f"{report.unreadable_answers} answers were not msgpack [tag, ...]")


async def _round_trip(broker: FuzzBroker, bystander: _Bystander, report: Report) -> None:
    """Through the real client: every acknowledged bystander message is consumed, a new
    one goes round, and the admin port lists the namespaces."""
    from danube_zmq import DanubeClient, DispatchStrategy, SubType
    from danube_zmq.client.admin import AdminClient

    async with DanubeClient(broker.url, client_name="fuzz-check") as client:
        consumer = await client.subscribe(BYSTANDER_TOPIC, "fuzz-check", sub_type=SubType.EXCLUSIVE,
                                          initial_position="earliest")
        producer = await client.create_producer(BYSTANDER_TOPIC, name="fuzz-check-producer",
                                                dispatch=DispatchStrategy.RELIABLE)
        final = await producer.send(b"after the fuzzing")
        expected = {**bystander.acked, final.offset: b"after the fuzzing"}
        seen: dict[int, bytes] = {}
        # Read up to the last offset, not up to as many messages as were acknowledged: the
        # topic may hold more. A batch refused after it was written (the topic stopped with
        # its flush in flight, "... before this batch was acknowledged; send it again") is
        # stored all the same (at least once), and takes offsets below the final message.
        last, reached = max(expected), -1
        while reached < last:
            msg = await consumer.receive(timeout=30)
            seen[msg.message_id.offset] = bytes(msg.payload)
            reached = max(reached, msg.message_id.offset)
            await consumer.ack(msg)
        report.bystander_consumed = sum(seen.get(offset) == payload for offset, payload in bystander.acked.items())
        report.bystander_stored_unacked = sum(payload.startswith(b"bystander-") for offset, payload in seen.items()
                                              if offset not in expected)
        missing = [offset for offset, payload in expected.items() if seen.get(offset) != payload]
        if missing:
            report.problems.append(f"acknowledged bystander messages not consumed: offsets {missing[:10]}")
    async with AdminClient(broker.admin_url, timeout_ms=10_000, use_env=False) as admin:
        if "default" not in await admin.list_namespaces():
            report.problems.append("admin: namespace 'default' missing after the fuzzing")


def run(seed: int, seconds: float, **options: Any) -> Report:
    with fuzz_broker() as broker:
        return fuzz(broker, seed, seconds, **options)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=None, help="default: a random one (printed)")
    parser.add_argument("--seconds", type=float, default=60.0)
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**32)
    print(f"fuzzing with --seed {seed} --seconds {args.seconds:g}", file=sys.stderr, flush=True)
    report = run(seed, args.seconds)
    print(json.dumps(report.to_json(), indent=2))
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())

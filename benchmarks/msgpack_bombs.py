"""msgpack bombs against the client protocol's decoder (reliability.md S1, S2): the
time each takes to be refused and the memory its decode allocates.

    .venv/bin/python benchmarks/msgpack_bombs.py [--repeat 200]

Each bomb is decoded `repeat` times with `CLIENT_PROTOCOL.decode` (what the gateway
calls on every frame); reported: the outcome (the error's first words), median and max
time per decode, and the peak of Python allocations during one decode (tracemalloc).
Targets (S2): each refused in under 10 ms, growth under 10 MiB.
"""

from __future__ import annotations

import argparse
import statistics
import struct
import time
import tracemalloc

import msgpack

from danube_zmq.transport.client_protocol import CLIENT_PROTOCOL
from danube_zmq.transport.errors import InvalidArgument

_PING = b"\x92\x05"  # [Ping tag, <request id>]: the bomb where an integer is expected

BOMBS = {
    "array32 2**32-1, 10-byte body": b"\xdd" + struct.pack(">I", 2**32 - 1) + bytes(10),
    "map32 of 1M declared in a 1 KiB frame": b"\xdf" + struct.pack(">I", 1 << 20) + bytes(1019),
    "str32 2**32-1, 10-byte body": b"\xdb" + struct.pack(">I", 2**32 - 1) + bytes(10),
    "bin32 of 100 MiB, 10-byte body": _PING + b"\xc6" + struct.pack(">I", 100 << 20) + bytes(10),
    "ext32 2**32-1": b"\xc9" + struct.pack(">I", 2**32 - 1) + b"\x01" + bytes(10),
    "arrays nested 10,000 deep": b"\x91" * 10_000 + b"\xc0",
    "arrays nested 1,020 deep as a field": _PING + b"\x91" * 1020 + b"\xc0",
    "1M-int array cut at 1 MiB, as a field": _PING + msgpack.packb(list(range(1 << 20)))[: 1 << 20],
}


def measure(frame: bytes, repeat: int) -> tuple[str, float, float, int]:
    outcome = "decoded"
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        try:
            CLIENT_PROTOCOL.decode(frame)
        except InvalidArgument as exc:
            outcome = str(exc)[:48]
        times.append(time.perf_counter() - started)
    tracemalloc.start()
    try:
        CLIENT_PROTOCOL.decode(frame)
    except InvalidArgument:
        pass
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return outcome, statistics.median(times) * 1000, max(times) * 1000, peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=200)
    args = parser.parse_args()
    print(f"{'bomb':40} {'frame B':>9} {'p50 ms':>8} {'max ms':>8} {'peak KiB':>9}  outcome")
    for name, frame in BOMBS.items():
        outcome, p50_ms, max_ms, peak = measure(frame, args.repeat)
        print(f"{name:40} {len(frame):>9} {p50_ms:>8.3f} {max_ms:>8.3f} {peak / 1024:>9.1f}  {outcome}")


if __name__ == "__main__":
    main()

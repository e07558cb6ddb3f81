"""What a benchmark message carries so the consumer can measure and check it: the
producer's index, the message's sequence number within that producer, and the send
time (CLOCK_MONOTONIC, shared by the processes of one machine), then filler up to the
requested size. 20 bytes; smaller messages cannot be checked."""

from __future__ import annotations

import struct

from danube_zmq.transport.errors import InvalidArgument

__all__ = ["STAMP_BYTES", "Stamper", "read_stamp"]

_STAMP = struct.Struct(">IQQ")  # producer, sequence, send time in ns
STAMP_BYTES = _STAMP.size


class Stamper:
    """Builds payloads of `size` bytes for one producer."""

    __slots__ = ("_filler", "producer")

    def __init__(self, producer: int, size: int) -> None:
        if size < STAMP_BYTES:
            raise InvalidArgument(f"benchmark messages are at least {STAMP_BYTES} bytes (stamp), not {size}")
        self.producer = producer
        self._filler = b"x" * (size - STAMP_BYTES)

    def payload(self, sequence: int, now_ns: int) -> bytes:
        return _STAMP.pack(self.producer, sequence, now_ns) + self._filler


def read_stamp(payload: bytes) -> tuple[int, int, int]:
    """(producer, sequence, send time ns); a payload too short for one is an error."""
    if len(payload) < STAMP_BYTES:
        raise InvalidArgument(f"a {len(payload)}-byte message carries no benchmark stamp")
    producer, sequence, sent_ns = _STAMP.unpack_from(payload)
    return producer, sequence, sent_ns

"""What a benchmark message carries so the consumer can measure and check it: the
producer's index, the message's sequence number within that producer, and the send
time (CLOCK_MONOTONIC, shared by the processes of one machine), then filler up to the
requested size. 20 bytes; smaller messages cannot be checked.

`read_stamps` reads a whole received batch into numpy arrays at once, so a consumer at
hundreds of thousands of messages per second does no Python work per message here."""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from danube_zmq.transport.errors import InvalidArgument

__all__ = ["STAMP_BYTES", "Stamper", "Stamps", "read_stamp", "read_stamps"]

_STAMP = struct.Struct(">IQQ")  # producer, sequence, send time in ns
STAMP_BYTES = _STAMP.size
_FIELDS = {"names": ["producer", "sequence", "sent_ns"], "formats": [">u4", ">u8", ">u8"], "offsets": [0, 4, 12]}
_STAMP_DTYPE = np.dtype({**_FIELDS, "itemsize": STAMP_BYTES})


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


@dataclass(frozen=True, slots=True)
class Stamps:
    """The stamps of a batch, one int64 array per field, in the batch's order. A
    sequence too large for int64 reads as negative, which accounting counts as
    unexpected, as it does any sequence out of range."""

    producer: np.ndarray
    sequence: np.ndarray
    sent_ns: np.ndarray

    def __len__(self) -> int:
        return len(self.producer)


def read_stamps(payloads: Sequence[bytes]) -> Stamps:
    """`read_stamp` of every payload at once. A payload too short for a stamp is an
    error naming how many were; the caller may read the others."""
    sizes = set(map(len, payloads))
    if sizes and min(sizes) < STAMP_BYTES:
        short = sum(1 for p in payloads if len(p) < STAMP_BYTES)
        raise InvalidArgument(f"{short} of {len(payloads)} messages carry no benchmark stamp"
                              f" (shortest {min(sizes)} bytes, a stamp is {STAMP_BYTES})")
    if len(sizes) == 1:
        # One size (the usual case): the joined payloads are an array of records whose
        # itemsize skips the filler, read without touching each message.
        records = np.frombuffer(b"".join(payloads), dtype=np.dtype({**_FIELDS, "itemsize": sizes.pop()}))
    else:
        records = np.frombuffer(b"".join(p[:STAMP_BYTES] for p in payloads), dtype=_STAMP_DTYPE)
    return Stamps(records["producer"].astype(np.int64), records["sequence"].astype(np.int64),
                  records["sent_ns"].astype(np.int64))

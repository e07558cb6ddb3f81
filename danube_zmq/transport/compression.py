"""Payload compression, as producers write it and consumers read it (Pulsar's
`compressionType`): the codecs, and decompression bounded in bytes.

A producer created with `compression=` compresses each message's payload and names the
codec in the reserved attribute `__compression`; the broker stores and delivers the
bytes as they are (it decompresses only to validate a payload against its schema), and
a consumer decompresses and takes the attribute away. Each message is compressed on its
own, not its batch as in Pulsar: the broker stores, indexes, dispatches and compacts
messages one by one, which a batch compressed as one piece would not let it do without
decompressing. An empty payload is never compressed: it stays a compaction tombstone.

The libraries are the codecs' own well-kept bindings: `lz4` (python-lz4; LZ4 blocks
with their size ahead, as Pulsar's LZ4), `zstandard` (python-zstandard, Zstandard
frames with their content size)
and `cramjam` for snappy (wheels with the codec built in, where python-snappy needs the
system's libsnappy); zlib is Python's own.
"""

from __future__ import annotations

import threading
import zlib
from collections.abc import Callable
from typing import Any

from danube_zmq.transport.errors import InvalidArgument

__all__ = ["CODECS", "COMPRESSION", "check_codec", "compress", "decompress"]

# The reserved attribute naming a message's codec (absent: not compressed).
COMPRESSION = "__compression"

_ZSTD_LEVEL = 3  # zstd's own default: most of its ratio at a few µs a KiB


def _library(name: str) -> Any:
    """A codec's library, imported at its first use (8 ms for the three at start:
    the CLI and every client would pay it)."""
    import importlib

    return importlib.import_module(name)


def _lz4(data: bytes) -> bytes:
    # A block with its size ahead (4 bytes, little-endian), checked before decompressing.
    return _library("lz4.block").compress(data, store_size=True)


_zstd_state = threading.local()  # a context per thread: making one costs more than a KiB's compression


def _zstd_context(kind: str) -> Any:
    context = getattr(_zstd_state, kind, None)
    if context is None:
        zstandard = _library("zstandard")
        context = zstandard.ZstdCompressor(level=_ZSTD_LEVEL) if kind == "compressor" else zstandard.ZstdDecompressor()
        setattr(_zstd_state, kind, context)
    return context


def _zstd(data: bytes) -> bytes:
    return _zstd_context("compressor").compress(data)


def _snappy(data: bytes) -> bytes:
    return bytes(_library("cramjam").snappy.compress_raw(data))


_COMPRESSORS: dict[str, Callable[[bytes], bytes]] = {
    "lz4": _lz4, "zstd": _zstd, "snappy": _snappy, "zlib": zlib.compress,
}
CODECS = tuple(_COMPRESSORS)


def check_codec(codec: str) -> str:
    if codec not in _COMPRESSORS:
        raise InvalidArgument(f"unknown compression {codec!r}: one of {', '.join(CODECS)}")
    return codec


def compress(codec: str, data: bytes) -> bytes:
    return _COMPRESSORS[check_codec(codec)](data)


def decompress(codec: str, data: bytes, bytes_max: int) -> bytes:
    """`data` decompressed; INVALID_ARGUMENT naming the codec when it is not whole data of
    it, or would decompress to more than `bytes_max` bytes (a bomb is stopped there,
    never decompressed whole)."""
    check_codec(codec)
    try:
        return _DECOMPRESSORS[codec](data, bytes_max)
    except InvalidArgument:
        raise
    except Exception as exc:  # each library raises its own types on bad data
        raise InvalidArgument(f"payload is not valid {codec} data: {exc}") from None


def _too_large(codec: str, bytes_max: int) -> InvalidArgument:
    return InvalidArgument(f"{codec} payload decompresses to more than {bytes_max} bytes")


def _lz4_decompress(data: bytes, bytes_max: int) -> bytes:
    if len(data) < 4 or int.from_bytes(data[:4], "little") > bytes_max:
        if len(data) < 4:
            raise InvalidArgument("payload is not an lz4 block with its size")
        raise _too_large("lz4", bytes_max)
    return _library("lz4.block").decompress(data)


def _zstd_decompress(data: bytes, bytes_max: int) -> bytes:
    # The frame's declared size is refused before any output; without one (-1: not as
    # `_zstd` writes), `max_output_size` stops the output there.
    zstandard = _library("zstandard")
    if zstandard.frame_content_size(data) > bytes_max:
        raise _too_large("zstd", bytes_max)
    try:
        return _zstd_context("decompressor").decompress(data, max_output_size=bytes_max)
    except zstandard.ZstdError as exc:
        if "output size" in str(exc) or "exceeds" in str(exc):
            raise _too_large("zstd", bytes_max) from None
        raise


def _snappy_decompress(data: bytes, bytes_max: int) -> bytes:
    snappy = _library("cramjam").snappy
    if snappy.decompress_raw_len(data) > bytes_max:
        raise _too_large("snappy", bytes_max)
    return bytes(snappy.decompress_raw(data))


def _zlib_decompress(data: bytes, bytes_max: int) -> bytes:
    decompressor = zlib.decompressobj()
    out = decompressor.decompress(data, bytes_max + 1)
    if len(out) > bytes_max:
        raise _too_large("zlib", bytes_max)
    if not decompressor.eof or decompressor.unused_data:
        raise InvalidArgument("payload is not one whole zlib stream")
    return out


_DECOMPRESSORS: dict[str, Callable[[bytes, int], bytes]] = {
    "lz4": _lz4_decompress, "zstd": _zstd_decompress, "snappy": _snappy_decompress, "zlib": _zlib_decompress,
}

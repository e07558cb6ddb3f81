"""Payload compression's codecs (transport/compression.py): every codec gives back what
it took, decompression is bounded in bytes (a bomb stops at the bound, whole or not),
and bad data is INVALID_ARGUMENT naming the codec, never a library's own error."""

from __future__ import annotations

import os
import tracemalloc

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from danube_zmq.transport.compression import CODECS, check_codec, compress, decompress
from danube_zmq.transport.errors import InvalidArgument


@pytest.mark.parametrize("codec", CODECS)
@settings(max_examples=50, deadline=None)
@given(data=st.binary(max_size=4096) | st.text(max_size=2000).map(str.encode))
def test_every_codec_gives_back_what_it_took(codec: str, data: bytes) -> None:
    assert decompress(codec, compress(codec, data), len(data)) == data


@pytest.mark.parametrize("codec", CODECS)
def test_the_bound_is_exact(codec: str) -> None:
    data = b"0123456789" * 1000
    packed = compress(codec, data)
    assert decompress(codec, packed, len(data)) == data
    with pytest.raises(InvalidArgument, match=f"{codec} payload decompresses to more than {len(data) - 1} bytes"):
        decompress(codec, packed, len(data) - 1)


@pytest.mark.parametrize("codec", CODECS)
def test_a_bomb_stops_at_the_bound_without_being_decompressed(codec: str) -> None:
    """64 MiB of zeros compress to a few KiB; with a 1 MiB bound, decompressing it takes
    at most a few MiB of memory, never 64."""
    bomb = compress(codec, bytes(64 << 20))
    tracemalloc.start()
    try:
        with pytest.raises(InvalidArgument, match="decompresses to more than 1048576 bytes"):
            decompress(codec, bomb, 1 << 20)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20, peak


@pytest.mark.parametrize("codec", CODECS)
def test_bad_data_is_invalid_argument_naming_the_codec(codec: str) -> None:
    with pytest.raises(InvalidArgument, match=codec):
        decompress(codec, os.urandom(64), 1 << 20)
    packed = compress(codec, b"hello " * 100)
    with pytest.raises(InvalidArgument, match=codec):
        decompress(codec, packed[: len(packed) // 2], 1 << 20)  # cut short


def test_an_unknown_codec_is_named() -> None:
    with pytest.raises(InvalidArgument, match="unknown compression 'brotli': one of lz4, zstd, snappy, zlib"):
        check_codec("brotli")
    with pytest.raises(InvalidArgument, match="unknown compression"):
        decompress("gzip", b"", 10)

"""Danube's StorageService through the gRPC door: `ListSegmentDescriptors` names a
reliable topic's sealed, uploaded segments (what `danube-iceberg` polls for), read
from the segment catalog, each matching the object in the durable store."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from types import SimpleNamespace

import crc32c
import grpc
import pytest

from danube_zmq import DanubeClient
from danube_zmq.transport.danube_proto import DanubeApi_pb2 as pb
from danube_zmq.transport.danube_proto import DanubeApi_pb2_grpc as pb_grpc
from tests.integration.conftest import free_port, start_broker
from tests.integration.storage.test_durable_topics import broker_env, wait_until

TOPIC = "/default/iceberg-feed"


@pytest.fixture(scope="module")
def storage_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimpleNamespace]:
    """A broker uploading sealed 32 KiB WAL segments to a shared filesystem, with the door."""
    tmp = tmp_path_factory.mktemp("storage")
    shared = tmp / "shared"
    grpc_url = f"http://127.0.0.1:{free_port()}"
    process = start_broker(tmp, "--grpc-listen", grpc_url, env=broker_env("shared_fs", str(shared), {}))
    yield SimpleNamespace(process=process, grpc_url=grpc_url, shared=shared)
    assert process.stop() == 0, process.log()


def _list(grpc_url: str, topic: str, after_offset: int = 0) -> list[pb.SegmentDescriptorProto]:
    with grpc.insecure_channel(grpc_url.removeprefix("http://")) as channel:
        answer = pb_grpc.StorageServiceStub(channel).ListSegmentDescriptors(
            pb.ListSegmentDescriptorsRequest(topic=topic, after_offset=after_offset), timeout=10)
    return list(answer.segments)


async def test_sealed_segments_are_listed_as_the_durable_store_holds_them(storage_broker: SimpleNamespace) -> None:
    async with DanubeClient(storage_broker.process.url) as client:
        producer = await client.create_producer(TOPIC, dispatch="reliable")
        for i in range(5000):
            producer.send_nowait(f"m{i:05d}".encode() + b"x" * 90)
        await producer.flush()
    # Danube's filter: segments starting after `after_offset`, so -1 is not expressible and
    # a first segment at offset 0 is never listed (as Danube's broker answers).
    await wait_until(lambda: len(_list(storage_broker.grpc_url, TOPIC)) >= 2, 30, "uploaded segments listed")
    listed = _list(storage_broker.grpc_url, TOPIC)
    starts = [s.start_offset for s in listed]
    assert starts == sorted(starts) and starts[0] > 0, starts
    for before, after in itertools.pairwise(listed):
        assert after.start_offset == before.end_offset + 1, (before, after)
    for segment in listed:
        stored = (storage_broker.shared / segment.segment_id).read_bytes()
        assert segment.size == len(stored) and segment.etag == f"{crc32c.crc32c(stored):08x}", segment
        assert segment.created_at > 1_700_000_000  # seconds, as Danube's
    # Incremental polling, and Danube's way of naming the topic (no leading slash).
    # Uploads go on meanwhile, so the later listing may hold more segments than the first.
    later = [s.start_offset for s in _list(storage_broker.grpc_url, TOPIC.lstrip("/"),
                                           after_offset=listed[0].start_offset)]
    assert later[:len(starts) - 1] == starts[1:] and len(later) >= 1, (later, starts)


def test_unknown_and_malformed_topics_are_refused(storage_broker: SimpleNamespace) -> None:
    with pytest.raises(grpc.RpcError) as missing:
        _list(storage_broker.grpc_url, "/default/no-such-topic")
    assert missing.value.code() == grpc.StatusCode.NOT_FOUND, missing.value
    with pytest.raises(grpc.RpcError) as bad:
        _list(storage_broker.grpc_url, "/default/bad name")
    assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT, bad.value

"""The gRPC door's StorageService (`DanubeApi.proto`, `doors/grpc/client_door.py`).

`ListSegmentDescriptors` names a topic's sealed segments in the durable store, the
ones with a start offset past `after_offset`, for tools that poll for new history
(Danube's `danube-iceberg`). They come from the segment catalog in the Raft metadata
store (`storage/catalog.py`), read from this broker's applied state: a segment is
listed once its upload is recorded, never before.

What a descriptor names is one of our segments (`storage/wal/segment.py` framing),
not Danube's: a tool can learn which offsets are durable and where, but
`danube-iceberg`, which parses Danube's segment format, cannot read the objects
(docs/danube-compat.md). Our own readers of durable history are the Spark data source
and `danube report`.

The catalog read bypasses the broker's RBAC, so the door first asks the broker, with
the caller's own connection, to look the topic up: a caller who may not look it up
gets the broker's PERMISSION_DENIED, and a topic that does not exist NOT_FOUND.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import grpc

from danube_zmq.consensus.metadata_catalog import MetadataCatalog
from danube_zmq.doors.grpc.calls import abort_with, caller_of
from danube_zmq.storage.catalog import SegmentCatalog, SegmentDescriptor
from danube_zmq.transport.danube_proto import DanubeApi_pb2 as pb
from danube_zmq.transport.danube_proto import DanubeApi_pb2_grpc as pb_grpc
from danube_zmq.transport.errors import DanubeError, Unavailable
from danube_zmq.transport.topic_name import parse_topic

if TYPE_CHECKING:
    from danube_zmq.doors.grpc.client_door import GrpcDoor

# Descriptors in one answer: a long-lived topic may hold more segments than a gRPC message
# (4 MiB by default) carries. The rest come on the next poll: callers poll with the last
# start offset they saw as `after_offset` (Danube's danube-iceberg does).
DESCRIPTORS_PER_ANSWER_MAX = 10_000


def segments_after(segments: list[SegmentDescriptor], after_offset: int,
                   limit: int = DESCRIPTORS_PER_ANSWER_MAX) -> list[SegmentDescriptor]:
    """The first `limit` of `segments` (in offset order) starting past `after_offset`."""
    return [s for s in segments if s.base_offset > after_offset][:limit]


def descriptor_proto(segment: SegmentDescriptor) -> Any:
    return pb.SegmentDescriptorProto(
        segment_id=segment.object_key, start_offset=segment.base_offset, end_offset=segment.end_offset,
        size=segment.size_bytes,
        # Danube's etag is the object store's; ours is the object's CRC32C, which the
        # reader checks, as a fixed-width hex string.
        etag=f"{segment.crc32c:08x}",
        # Danube's created_at is in seconds; ours is kept in milliseconds.
        created_at=segment.created_ms // 1000)


class StorageDoor(pb_grpc.StorageServiceServicer):
    def __init__(self, door: GrpcDoor) -> None:
        self.door = door

    async def ListSegmentDescriptors(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        caller = await caller_of(context, self.door.security)
        try:
            # Danube's tools name topics without the leading slash ("default/sensor-data").
            topic = parse_topic(request.topic if request.topic.startswith("/") else f"/{request.topic}").full
            await self.door.control(caller, lambda c: c.lookup(topic))
            if self.door.metadata is None:
                raise Unavailable("this broker has no metadata store to read the segment catalog from")
            segments = SegmentCatalog(MetadataCatalog(self.door.metadata)).list(topic)
        except DanubeError as exc:
            await abort_with(context, exc)
        return pb.ListSegmentDescriptorsResponse(segments=[
            descriptor_proto(s) for s in segments_after(segments, request.after_offset)])

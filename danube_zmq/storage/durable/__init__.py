"""Durable segments: sealed WAL segment files in a file system or an object store (see README.md)."""

from danube_zmq.storage.durable.store import (
    DurableCorruption,
    DurableStore,
    compacted_key,
    cursors_key,
    segment_key,
)
from danube_zmq.storage.durable.uploader import (
    SealedSegment,
    Uploader,
    UploaderConfig,
    UploaderStatistics,
    UploadFailure,
)

__all__ = [
    "DurableCorruption",
    "DurableStore",
    "SealedSegment",
    "UploadFailure",
    "Uploader",
    "UploaderConfig",
    "UploaderStatistics",
    "compacted_key",
    "cursors_key",
    "segment_key",
]

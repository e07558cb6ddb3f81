"""Durable segments: sealed WAL segment files in a file system or an object store (see README.md)."""

from danube_zmq.storage.durable.store import DurableCorruption, DurableStore, cursors_key, segment_key
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
    "cursors_key",
    "segment_key",
]

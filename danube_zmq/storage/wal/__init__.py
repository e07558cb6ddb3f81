"""The write-ahead log of one reliable topic: segment files of CRC-checked records.

Pure, synchronous Python: the topic actor calls it from a worker thread (writer) and
reads committed offsets from the event loop. See README.md for the layout and paths.
"""

from danube_zmq.storage.wal.errors import CorruptRecord, OffsetOutOfRange, WalDamaged
from danube_zmq.storage.wal.format import (
    HEADER,
    HEADER_BYTES,
    RECORD_BODY_BYTES_MAX,
    Checkpoint,
    Fault,
    FaultKind,
    RecordBatch,
    ScanResult,
    encode_batch,
    encode_checkpoints,
    scan,
)
from danube_zmq.storage.wal.log import RecoveryReport, RepairReport, WalLog, WalStatistics, segment_checkpoints
from danube_zmq.storage.wal.segment import SegmentInfo, segment_file_name

__all__ = [
    "HEADER",
    "HEADER_BYTES",
    "RECORD_BODY_BYTES_MAX",
    "Checkpoint",
    "CorruptRecord",
    "Fault",
    "FaultKind",
    "OffsetOutOfRange",
    "RecordBatch",
    "RecoveryReport",
    "RepairReport",
    "ScanResult",
    "SegmentInfo",
    "WalDamaged",
    "WalLog",
    "WalStatistics",
    "encode_batch",
    "encode_checkpoints",
    "scan",
    "segment_checkpoints",
    "segment_file_name",
]

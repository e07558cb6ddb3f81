"""The write-ahead log of one reliable topic: a directory of segment files.

    <directory>/00000000000000000000.wal   sealed (immutable, whole)
                00000000000000004096.wal   sealed
                00000000000000009000.wal   active (appends go here)

Threads. The writer side (`append`, `sync`, `roll`, `seal_active`,
`delete_segments_before`, `close`) is not thread-safe: one thread at a time (the topic
actor's worker). `read` may run at the same time from one other thread (the event
loop) on committed offsets, that is below what the writer has appended and synced:
it reads through the segments' own read-only descriptors with `os.pread`, on a
snapshot of the segment tuple, which the writer replaces and never mutates.

Errors. Assertions guard our bugs (an append not starting at `next_offset`); the
world's faults are exceptions: `CorruptRecord` where the log must be whole,
`OffsetOutOfRange` for reads below the first offset, and an `OSError` from write or
fsync propagates unchanged (the caller maps ENOSPC to RESOURCE_EXHAUSTED).
"""

from __future__ import annotations

import logging
from bisect import bisect_right
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from danube_zmq.clock import Clock
from danube_zmq.storage.wal import files as wal_files
from danube_zmq.storage.wal import frontier as wal_frontier
from danube_zmq.storage.wal import gaps as wal_gaps
from danube_zmq.storage.wal.checkpoints import is_cursor, newest_checkpoints
from danube_zmq.storage.wal.errors import CorruptRecord, OffsetOutOfRange, WalDamaged
from danube_zmq.storage.wal.format import (
    HEADER,
    HEADER_BYTES,
    RECORD_BODY_BYTES_MAX,
    Checkpoint,
    RecordBatch,
    encode_checkpoints,
)
from danube_zmq.storage.wal.frontier import FrontierFile
from danube_zmq.storage.wal.recovery import judge
from danube_zmq.storage.wal.segment import (
    INDEX_INTERVAL_BYTES,
    SEGMENT_SUFFIX,
    Segment,
    SegmentDeleted,
    SegmentInfo,
    parse_segment_file_name,
)
from danube_zmq.transport.errors import FailedPrecondition

log = logging.getLogger("danube_zmq.storage.wal")

QUARANTINE_DIR = "quarantine"


@dataclass(frozen=True, slots=True, kw_only=True)
class RecoveryReport:
    """What `WalLog.open` found on disk."""

    segments: int
    records: int  # records kept, from log_start_offset to next_offset
    log_start_offset: int
    next_offset: int
    truncated_bytes: int  # torn or corrupt tail dropped from the active segment


@dataclass(frozen=True, slots=True, kw_only=True)
class RepairReport:
    """What `WalLog.repair` gave up: `lost` offsets [start, end) (None: none), the part of
    them below the acknowledged frontier (`acknowledged_lost`), where the log goes on, and
    the files set aside."""

    lost: tuple[int, int] | None
    acknowledged_lost: tuple[int, int] | None
    next_offset: int
    quarantined: list[Path]


@dataclass(frozen=True, slots=True, kw_only=True)
class WalStatistics:
    segments: int
    bytes: int
    next_offset: int
    log_start_offset: int
    appends: int  # `append` calls since open
    syncs: int  # fsyncs of segment data since open (`sync` calls that had data, and rolls)


class WalLog:
    """A topic's write-ahead log. Build it with `WalLog.open`, which recovers."""

    def __init__(
        self,
        directory: Path,
        *,
        segment_bytes_max: int,
        segment_age_ms_max: int | None,
        clock: Clock,
        index_interval_bytes: int = INDEX_INTERVAL_BYTES,
        body_bytes_max: int = RECORD_BODY_BYTES_MAX,
    ) -> None:
        """Configuration only; nothing is read or written until `open` recovers."""
        assert segment_bytes_max > 0, segment_bytes_max
        assert segment_age_ms_max is None or segment_age_ms_max > 0, segment_age_ms_max
        self.directory = Path(directory)
        self.segment_bytes_max = segment_bytes_max
        self.segment_age_ms_max = segment_age_ms_max
        self._clock = clock
        self._index_interval_bytes = index_interval_bytes
        self._body_bytes_max = body_bytes_max
        # The last segment is the active one. Replaced, never mutated (readers snapshot it).
        self._segments: tuple[Segment, ...] = ()
        self._next_offset = 0
        self._directory_unsynced = False
        self._recovery: RecoveryReport | None = None
        self._appends = 0
        self._syncs = 0
        self._closed = False
        self._frontier: FrontierFile | None = None
        # (start, end) offset ranges between segments that a repair gave up (`gaps.py`).
        self._gaps: frozenset[tuple[int, int]] = frozenset()
        # Each subscription's newest cursor checkpoint (state bytes; None: a deletion
        # marker, kept until `settle_deletions`): found at open, updated by
        # `append_checkpoints`, written again at the start of each new segment so that
        # deleting old segments never loses a cursor or a deletion.
        self._checkpoints: dict[str, bytes | None] = {}

    # -- lifecycle ------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        directory: Path,
        *,
        segment_bytes_max: int,
        segment_age_ms_max: int | None,
        clock: Clock,
        start_offset: int | None = None,
        index_interval_bytes: int = INDEX_INTERVAL_BYTES,
        body_bytes_max: int = RECORD_BODY_BYTES_MAX,
    ) -> WalLog:
        """Open (creating the directory if needed) and recover.

        Every sealed segment must be whole; the active one loses a torn tail (logged),
        that is a bad or partial suffix with no valid record after it and at or above
        the acknowledged frontier (`frontier.py`). Anything else raises `WalDamaged`
        with nothing cut (see `recovery.py`). An empty directory starts at `start_offset`
        (default 0); with segments present, `start_offset` is a floor the recovered log
        must reach (`FailedPrecondition` otherwise: offsets would be reused).
        """
        wal = cls(
            directory,
            segment_bytes_max=segment_bytes_max,
            segment_age_ms_max=segment_age_ms_max,
            clock=clock,
            index_interval_bytes=index_interval_bytes,
            body_bytes_max=body_bytes_max,
        )
        wal._recover(start_offset)
        return wal

    @classmethod
    def repair(cls, directory: Path, *, resume_offset: int, clock: Clock,
               body_bytes_max: int = RECORD_BODY_BYTES_MAX) -> RepairReport:
        """An operator accepted the loss: keep the readable prefix of a damaged log, give
        up the rest, and continue at or past `resume_offset` (the highest offset the
        topic may have given out, from the metadata store), so no offset is ever reused.

        The first damaged segment is cut at its fault (a copy was kept in `quarantine/`);
        later segments move into `quarantine/`. The given-up range is recorded in `gaps`
        (readers skip it) and a new active segment starts after it. Cursor checkpoints
        are not given up with the messages: the newest readable one of each subscription
        (in the set-aside files too, up to their first fault) is written again at the
        end of what is kept, so a repair never resets a subscription. Run on a closed log.
        """
        directory = Path(directory)
        paths = sorted(p for p in directory.iterdir() if p.name.endswith(SEGMENT_SUFFIX))
        gaps = wal_gaps.read(directory)
        acknowledged = wal_frontier.read(directory)
        kept: list[Segment] = []
        claimed_end = max(resume_offset, acknowledged or 0)
        quarantined: list[Path] = []
        later_checkpoints: list[Checkpoint] = []  # readable in the files given up
        created: Segment | None = None
        try:
            for number, path in enumerate(paths):
                segment = Segment.open(path, clock=clock, writable=True, body_bytes_max=body_bytes_max)
                if kept and segment.base_offset != kept[-1].next_offset \
                        and (kept[-1].next_offset, segment.base_offset) not in gaps:
                    segment.close()
                    later_checkpoints = _readable_checkpoints(paths[number:], clock, body_bytes_max)
                    quarantined += _set_aside(paths[number:], directory)
                    break
                kept.append(segment)
                fault = segment.recover()
                if fault is None:
                    continue
                claimed_end = max(claimed_end, segment.survey_after(fault).end_offset or 0)
                quarantined.append(_quarantine(path, fault.position))
                segment.truncate_torn_tail()
                for later in paths[number + 1:]:
                    claimed_end = max(claimed_end, _file_base_offset(later) or 0)
                later_checkpoints = _readable_checkpoints(paths[number + 1:], clock, body_bytes_max)
                quarantined += _set_aside(paths[number + 1:], directory)
                break
            prefix_end = kept[-1].next_offset if kept else resume_offset
            resume = max(claimed_end, prefix_end)
            lost = (prefix_end, resume) if resume > prefix_end else None
            cursors = newest_checkpoints([c for segment in kept for c in segment.checkpoints] + later_checkpoints)
            if lost is not None:
                if kept and kept[-1].size_bytes == 0:
                    kept.pop().delete()  # an empty file cannot be sealed; nothing in it is lost
                if kept:
                    gaps = gaps | {(kept[-1].next_offset, resume)}
                    wal_gaps.write(directory, gaps)
                created = Segment.create(directory, resume, clock=clock, body_bytes_max=body_bytes_max)
            elif not kept:
                created = Segment.create(directory, resume, clock=clock, body_bytes_max=body_bytes_max)
            last = created or (kept[-1] if kept else None)
            if later_checkpoints and cursors and last is not None:
                # The log's last segment gets them all (as at a roll): it is read last at open.
                last.append(encode_checkpoints(last.next_offset, sorted(cursors.items())), 0)
                last.sync()
            for segment in kept:
                if not segment.sealed:
                    segment.seal()
            frontier = FrontierFile(directory)
            frontier.advance(resume)
            frontier.sync()
            frontier.close()
            _fsync_directory(directory)
        finally:
            for segment in kept:
                segment.close()
            if created is not None:
                created.close()
        acknowledged_lost = None
        if lost is not None and acknowledged is not None and acknowledged > lost[0]:
            acknowledged_lost = (lost[0], min(acknowledged, lost[1]))
        log.error("WAL %s repaired with loss accepted: offsets %s given up (acknowledged among them: %s); the log"
                  " continues at %d; set aside: %s", directory, _range_text(lost), _range_text(acknowledged_lost),
                  resume, ", ".join(map(str, quarantined)) or "nothing")
        return RepairReport(lost=lost, acknowledged_lost=acknowledged_lost, next_offset=resume,
                            quarantined=quarantined)

    def _recover(self, start_offset: int | None) -> None:
        assert not self._segments, "recover runs once, from open"
        self.directory.mkdir(parents=True, exist_ok=True)
        paths = sorted(p for p in self.directory.iterdir() if p.name.endswith(SEGMENT_SUFFIX))
        gaps = wal_gaps.read(self.directory)
        acknowledged = wal_frontier.read(self.directory)
        segments: list[Segment] = []
        truncated_bytes = 0
        try:
            for number, path in enumerate(paths):
                active = number == len(paths) - 1
                segment = Segment.open(
                    path,
                    clock=self._clock,
                    writable=active,
                    index_interval_bytes=self._index_interval_bytes,
                    body_bytes_max=self._body_bytes_max,
                )
                segments.append(segment)
                if segments[:-1] and segment.base_offset != segments[-2].next_offset \
                        and (segments[-2].next_offset, segment.base_offset) not in gaps:
                    previous = segments[-2]
                    reason = f"segment starts at offset {segment.base_offset}, {previous.path.name} ends at {previous.next_offset}"
                    raise self._damaged(segment, 0, reason, previous.next_offset, paths, acknowledged, None)
                fault = segment.recover()
                if fault is None:
                    continue
                if not active:
                    reason = f"{fault.kind} in a sealed segment: {fault.reason}"
                    raise self._damaged(segment, fault.position, reason, segment.next_offset, paths, acknowledged, None)
                after = segment.survey_after(fault)
                verdict = judge(fault=fault, fault_offset=segment.next_offset, after=after,
                                acknowledged_offset=acknowledged)
                if verdict.corrupt:
                    raise self._damaged(segment, fault.position, verdict.reason, segment.next_offset, paths, acknowledged,
                                        after.end_offset)
                truncated_bytes = segment.truncate_torn_tail()
                log.warning(
                    "WAL %s: dropped %d bytes of torn tail at byte %d (%s: %s); next offset %d",
                    path,
                    truncated_bytes,
                    fault.position,
                    fault.kind,
                    fault.reason,
                    segment.next_offset,
                )
            end = segments[-1].next_offset if segments else start_offset or 0
            if acknowledged is not None and end < acknowledged:
                # Whole files, but fewer records than were fsynced: files lost or cut.
                reason = f"the log ends at offset {end}, below the acknowledged frontier {acknowledged}"
                if segments:
                    raise self._damaged(segments[-1], segments[-1].size_bytes, reason, end, paths, acknowledged, None)
                raise WalDamaged(self.directory, 0, reason, valid_end=end, claimed_end=acknowledged,
                                 acknowledged_offset=acknowledged, quarantined=None)
            if not segments:
                segments.append(self._create_segment(start_offset or 0))
            elif start_offset is not None and segments[-1].next_offset < start_offset:
                raise FailedPrecondition(
                    f"WAL {self.directory} ends at offset {segments[-1].next_offset}, below the start offset {start_offset}"
                )
            # What recovery kept may have lived in the page cache only (the process
            # crashed, not the machine): fsync it before anything builds on it.
            segments[-1].sync_recovered()
            self._frontier = FrontierFile(self.directory)
        except BaseException:
            for segment in segments:
                segment.close()
            raise
        self._segments = tuple(segments)
        self._gaps = gaps
        self._next_offset = segments[-1].next_offset
        self._checkpoints = newest_checkpoints(c for segment in segments for c in segment.checkpoints)
        self._frontier.advance(self._next_offset)  # all of it is fsynced now
        self._recovery = RecoveryReport(
            segments=len(segments),
            records=self._next_offset - segments[0].base_offset,
            log_start_offset=segments[0].base_offset,
            next_offset=self._next_offset,
            truncated_bytes=truncated_bytes,
        )

    def _damaged(self, segment: Segment, position: int, reason: str, valid_end: int, paths: list[Path],
                 acknowledged: int | None, survey_end: int | None) -> WalDamaged:
        """The error for damage found at `position` of `segment`, after its file was
        copied to `quarantine/`, logged at ERROR."""
        later = [base for base in map(_file_base_offset, paths) if base is not None and base > segment.base_offset]
        claimed_end = max(valid_end, acknowledged or 0, survey_end or 0, *later)
        quarantined = _quarantine(segment.path, position)
        log.error("WAL %s: damaged at byte %d: %s. Records from offset %d on cannot be read (the log held offsets"
                  " up to at least %d); the topic is not served. The file is kept as it was; a copy is in %s",
                  segment.path, position, reason, valid_end, claimed_end - 1, quarantined)
        return WalDamaged(segment.path, position, reason, valid_end=valid_end, claimed_end=claimed_end,
                          acknowledged_offset=acknowledged, quarantined=quarantined)

    def close(self) -> None:
        """Sync what was appended, then close every segment. Idempotent. A log whose
        failed write could not be cut back (not `writable`) is closed without a sync:
        its segment's end is unknown, and a sync would raise the acknowledged frontier
        over records the cut may have removed; the next open recovers what is there."""
        if self._closed:
            return
        try:
            if self.writable:
                self.sync()
            if self._frontier is not None:
                self._frontier.sync()
        finally:
            self._closed = True
            for segment in self._segments:
                segment.close()
            if self._frontier is not None:
                self._frontier.close()

    def __enter__(self) -> WalLog:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- state ----------------------------------------------------------------------

    @property
    def next_offset(self) -> int:
        """The offset the next appended record gets."""
        return self._next_offset

    @property
    def log_start_offset(self) -> int:
        """The first offset still held (earlier segments were deleted)."""
        return self._segments[0].base_offset

    def recovery(self) -> RecoveryReport:
        assert self._recovery is not None
        return self._recovery

    def segments(self) -> list[SegmentInfo]:
        return [segment.info() for segment in self._segments]

    def statistics(self) -> WalStatistics:
        segments = self._segments
        return WalStatistics(
            segments=len(segments),
            bytes=sum(segment.size_bytes for segment in segments),
            next_offset=self._next_offset,
            log_start_offset=segments[0].base_offset,
            appends=self._appends,
            syncs=self._syncs,
        )

    # -- writer side ----------------------------------------------------------------

    def should_roll(self, incoming_bytes: int = 0) -> bool:
        """Roll before this append? When the active segment is not empty and the append
        would take it above `segment_bytes_max`, or it is `segment_age_ms_max` old."""
        active = self._segments[-1]
        if active.next_offset == active.base_offset:
            # A lone batch larger than segment_bytes_max gets its own segment; one with
            # checkpoints only keeps them (its successor would reuse its file name).
            return False
        if active.size_bytes + incoming_bytes > self.segment_bytes_max:
            return True
        age_ms_max = self.segment_age_ms_max
        return age_ms_max is not None and self._clock.monotonic_ms() - active.created_ms >= age_ms_max

    def append(self, encoded: bytes | bytearray | memoryview, count: int) -> int:
        """Append `count` records encoded by `encode_batch(log.next_offset, ...)`; return
        their base offset. Written, not synced: call `sync` before acknowledging."""
        assert not self._closed, "append to a closed WAL"
        base_offset = self._next_offset
        # Pairs with encode_batch: a cheap look at the first header only.
        assert count > 0 and len(encoded) >= count * HEADER_BYTES, (count, len(encoded))
        assert HEADER.unpack_from(encoded, 0)[0] == base_offset, "records must start at next_offset"
        if self.should_roll(len(encoded)):
            self.roll()
        self._segments[-1].append(encoded, count)
        self._next_offset = base_offset + count
        self._appends += 1
        return base_offset

    def append_checkpoints(self, entries: Sequence[tuple[str, bytes | None]]) -> None:
        """Append cursor checkpoints (subscription, state; None: deleted) after every
        record appended so far: they are synced by the same `sync` as those records and
        never cover records after them. Written, not synced."""
        assert not self._closed, "append to a closed WAL"
        if not entries:
            return
        encoded = encode_checkpoints(self._next_offset, entries)
        if self.should_roll(len(encoded)):
            self.roll()
        self._segments[-1].append(encoded, 0)
        for subscription, state in entries:
            self._checkpoints[subscription] = state

    def checkpoints(self) -> dict[str, bytes]:
        """Each live subscription's newest cursor checkpoint in the log (state bytes)."""
        return {name: state for name, state in self._checkpoints.items() if state is not None and is_cursor(name)}

    def deleted_subscriptions(self) -> set[str]:
        """Subscriptions whose newest checkpoint is a deletion marker not yet settled."""
        return {name for name, state in self._checkpoints.items() if state is None and is_cursor(name)}

    def topic_checkpoint(self, name: str) -> bytes | None:
        """The topic's own newest checkpoint `name` (`checkpoints.DEDUP_CHECKPOINT`);
        None: none, or its newest is a deletion."""
        return self._checkpoints.get(name)

    def settle_deletions(self, names: Iterable[str]) -> None:
        """These deletions are recorded elsewhere too (the metadata store): new segments
        need not carry their markers (the set of markers stays bounded)."""
        for name in names:
            if name in self._checkpoints and self._checkpoints[name] is None:
                del self._checkpoints[name]

    def sync(self) -> None:
        """fsync the active segment, and the directory if a file was created or deleted."""
        assert not self._closed, "sync of a closed WAL"
        if self._segments[-1].sync():
            self._syncs += 1
        if self._directory_unsynced:
            _fsync_directory(self.directory)
            self._directory_unsynced = False
        # Everything appended is durable now: the caller may acknowledge up to here.
        assert self._frontier is not None
        self._frontier.advance(self._next_offset)

    @property
    def writable(self) -> bool:
        """False once a failed write could not be cut back: reopen the log."""
        return not self._closed and not self._segments[-1].broken

    def bytes_between(self, start_offset: int, end_offset: int) -> int:
        """Bytes the records [start_offset, end_offset) take in the WAL files (headers
        included, cursor checkpoints between them left out), for the part of the range
        the local WAL still holds."""
        total = 0
        for segment in self._segments:
            low = max(start_offset, segment.base_offset)
            high = min(end_offset, segment.next_offset)
            if low < high:
                try:
                    start, end = segment.position_of(low), segment.position_of(high)
                    total += end - start - segment.checkpoint_bytes(start, end)
                except SegmentDeleted:
                    continue
        return total

    def rollback_unsynced(self) -> int:
        """After a failed append or sync: cut the active segment back to its last
        successful fsync (see `Segment.truncate_to_synced`); sealed segments were fsynced
        when they were rolled. Returns the new `next_offset`. An OSError here leaves the
        segment refusing appends: reopen the log."""
        assert not self._closed
        self._next_offset = self._segments[-1].truncate_to_synced()
        return self._next_offset

    def roll(self) -> None:
        """Seal the active segment (fsync, close for writing) and start a new one at next_offset."""
        active = self._segments[-1]
        assert active.next_offset > active.base_offset, "rolling a segment without records would reuse its file name"
        # fsync first, then create: a failure of either leaves the log as it was.
        if active.sync():
            self._syncs += 1
        segment = self._create_segment(self._next_offset)
        active.seal()
        self._segments = (*self._segments, segment)
        if self._checkpoints:
            # The new segment starts with every cursor: the old ones may be deleted.
            # Synced at once: retention may delete the old ones before the next sync.
            segment.append(encode_checkpoints(self._next_offset, sorted(self._checkpoints.items())), 0)
            if segment.sync():
                self._syncs += 1
        assert self._frontier is not None
        self._frontier.advance(self._next_offset)  # the sealed segment was fsynced whole

    def seal_active(self) -> SegmentInfo | None:
        """Make the active segment sealed and immutable (before upload or a move); None
        when it holds no records, as there is nothing to seal."""
        active = self._segments[-1]
        if active.next_offset == active.base_offset:
            return None
        self.roll()
        return active.info()

    def delete_segments_before(self, offset: int) -> int:
        """Delete the sealed segments whose records all lie below `offset`; never the
        active one. Returns how many were deleted."""
        segments = self._segments
        keep_from = 0
        while keep_from < len(segments) - 1 and segments[keep_from].next_offset <= offset:
            keep_from += 1
        if keep_from == 0:
            return 0
        self._segments = segments[keep_from:]  # readers starting now no longer see them
        for segment in segments[:keep_from]:
            segment.delete()
        self._directory_unsynced = True
        return keep_from

    def gap_end(self, offset: int) -> int | None:
        """When `offset` lies in a range a repair gave up (between two segments), where
        the log goes on; None otherwise."""
        for start, end in self._gaps:
            if start <= offset < end:
                return end
        return None

    def _create_segment(self, base_offset: int) -> Segment:
        segment = Segment.create(
            self.directory,
            base_offset,
            clock=self._clock,
            index_interval_bytes=self._index_interval_bytes,
            body_bytes_max=self._body_bytes_max,
        )
        self._directory_unsynced = True  # the new name must survive a crash too
        return segment

    # -- reader side ----------------------------------------------------------------

    def read(self, start_offset: int, *, max_bytes: int, upto_offset: int) -> RecordBatch:
        """Records from `start_offset` up to `upto_offset` (exclusive: pass the committed,
        synced frontier) within `max_bytes` of record bytes (16-byte headers included),
        across segment files; at least one record when any is available.

        Raises `OffsetOutOfRange` below `log_start_offset`, `CorruptRecord` on damage.
        """
        assert not self._closed, "read of a closed WAL"
        segments = self._segments  # one snapshot: the writer replaces the tuple
        log_start_offset = segments[0].base_offset
        if start_offset < log_start_offset:
            raise OffsetOutOfRange(start_offset, log_start_offset)
        upto_offset = min(upto_offset, segments[-1].next_offset)
        if start_offset >= upto_offset:
            return RecordBatch.empty()
        number = bisect_right(segments, start_offset, key=_base_offset) - 1
        batches: list[RecordBatch] = []
        bytes_left = max_bytes
        offset = start_offset
        try:
            for segment in segments[number:]:
                if offset >= upto_offset or offset < segment.base_offset:
                    break  # the end, or a gap a repair left (`gap_end` says where it ends)
                records, size_bytes = segment.read(
                    offset, max_bytes=bytes_left, upto_offset=upto_offset, min_one_record=not batches
                )
                if records:
                    batches.append(records)
                    offset = records.offsets[-1] + 1
                    bytes_left -= size_bytes
                if offset < min(segment.next_offset, upto_offset) or bytes_left <= 0:
                    break  # max_bytes stopped us inside this segment
        except SegmentDeleted:
            raise OffsetOutOfRange(offset, self._segments[0].base_offset) from None
        if not batches:
            return RecordBatch.empty()
        return RecordBatch.concat(batches)


def _base_offset(segment: Segment) -> int:
    return segment.base_offset


def _file_base_offset(path: Path) -> int | None:
    return parse_segment_file_name(path.name)


def _range_text(offsets: tuple[int, int] | None) -> str:
    return "none" if offsets is None else f"{offsets[0]}..{offsets[1] - 1}"


def segment_checkpoints(paths: list[Path], clock: Clock,
                        body_bytes_max: int = RECORD_BODY_BYTES_MAX) -> dict[str, bytes | None]:
    """Each subscription's newest checkpoint (None: a deletion marker) in the whole
    records of the segment files `paths`, oldest first (durable segments a broker
    loading the topic downloaded: every segment begins with every cursor)."""
    newest = newest_checkpoints(_readable_checkpoints(paths, clock, body_bytes_max))
    return {name: state for name, state in newest.items() if is_cursor(name)}


def _readable_checkpoints(paths: list[Path], clock: Clock, body_bytes_max: int) -> list[Checkpoint]:
    """The checkpoints in the whole records of `paths` (files a repair gives up), in
    log order, each file up to its first fault; a file that cannot be read adds none."""
    found: list[Checkpoint] = []
    for path in paths:
        try:
            segment = Segment.open(path, clock=clock, writable=False, body_bytes_max=body_bytes_max)
            try:
                segment.recover()
                found += segment.checkpoints
            finally:
                segment.close()
        except (OSError, CorruptRecord) as exc:
            log.error("WAL %s: unreadable (%s): its cursor checkpoints are not used", path, exc)
    return found


def _set_aside(paths: list[Path], directory: Path) -> list[Path]:
    """Move whole segment files into `quarantine/` (a repair gave them up)."""
    moved = []
    (directory / QUARANTINE_DIR).mkdir(exist_ok=True)
    for path in paths:
        target = directory / QUARANTINE_DIR / path.name
        wal_files.current.replace(path, target)
        moved.append(target)
    return moved


def _quarantine(path: Path, position: int) -> Path:
    """Copy a damaged file, as it is, to `<wal dir>/quarantine/<name>.<byte>` (once: a
    copy made at an earlier open is kept); the original stays in place untouched."""
    directory = path.parent / QUARANTINE_DIR
    directory.mkdir(exist_ok=True)
    target = directory / f"{path.name}.{position}"
    if not target.exists():
        temporary = target.with_name(target.name + ".tmp")
        wal_files.current.copy_file(path, temporary)
        wal_files.current.replace(temporary, target)
    return target


def _fsync_directory(directory: Path) -> None:
    """fsync a directory so that file creations and deletions in it survive a crash."""
    wal_files.current.fsync_directory(directory)

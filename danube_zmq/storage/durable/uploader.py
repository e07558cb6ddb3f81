"""Uploader: sealed segments go to the durable store in the background.

`submit(SealedSegment)` queues one upload (bounded: `pending_uploads_max`, beyond which
it raises ResourceExhausted so the WAL keeps the segment local and tries later). At most
`uploads_max` uploads run at once (an asyncio.Semaphore); each blocking
`DurableStore.publish` runs in a worker thread. A failed attempt is retried after an
exponential backoff (`backoff_ms_base` doubling up to `backoff_ms_max`), up to
`attempts_max` attempts. Only when the object is complete (publish returned, size
checked) is its `SegmentDescriptor` recorded in the `SegmentCatalog`: a descriptor
always names a whole object.

After the last attempt the error is logged and kept in `statistics().failures`; the
segment stays local, and submitting it again retries it (and clears the failure).

Lifecycle: `start()`, `stop()` or `async with`. `wait_idle()` returns when nothing is
pending (tests, clean shutdown). `stop()` cancels uploads still running: their
segments stay local with no descriptor, and an object that a cancelled worker thread
still finishes is an orphan that the next upload of that segment overwrites.
An unexpected error (a bug) in an upload task is not swallowed: the task group fails
and `wait_idle()` / `stop()` raise it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from danube_zmq.clock import Clock, SystemClock
from danube_zmq.storage.catalog import SegmentCatalog, SegmentDescriptor, check_offset, split_topic
from danube_zmq.transport.errors import FailedPrecondition, InvalidArgument, ResourceExhausted

__all__ = ["SealedSegment", "UploadFailure", "Uploader", "UploaderConfig", "UploaderStatistics"]

log = logging.getLogger("danube_zmq.storage.uploader")

# Errors longer than this are cut in statistics (they may embed whole HTTP bodies).
_ERROR_CHARS_MAX = 500


class SegmentPublisher(Protocol):
    """What the uploader needs from a DurableStore (tests wrap one to inject faults)."""

    def segment_key(self, topic: str, base_offset: int) -> str: ...

    def publish(self, local_path: Path, key: str) -> tuple[int, int]: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class SealedSegment:
    """A sealed WAL segment file ready for upload. `end_offset` is inclusive."""

    topic: str
    base_offset: int
    end_offset: int
    record_count: int
    local_path: Path

    def __post_init__(self) -> None:
        split_topic(self.topic)
        check_offset("base_offset", self.base_offset)
        check_offset("end_offset", self.end_offset)
        if self.end_offset < self.base_offset or not 1 <= self.record_count <= self.end_offset - self.base_offset + 1:
            raise InvalidArgument(
                f"sealed segment {self.topic}@{self.base_offset}: bad range ..{self.end_offset} / {self.record_count} records"
            )


@dataclass(frozen=True, slots=True, kw_only=True)
class UploaderConfig:
    """Bounds of the uploader; validated at construction."""

    # Uploads running at the same time (worker threads in use). Default 4.
    uploads_max: int = 4
    # Segments submitted and not finished (running, waiting or backing off). Default 64.
    pending_uploads_max: int = 64
    # Attempts per submit before the segment is reported failed. Default 5.
    attempts_max: int = 5
    # First retry delay; doubles per failed attempt. Default 200 ms.
    backoff_ms_base: int = 200
    # Ceiling of the retry delay. Default 10 s.
    backoff_ms_max: int = 10_000

    def __post_init__(self) -> None:
        for name in ("uploads_max", "pending_uploads_max", "attempts_max"):
            if getattr(self, name) < 1:
                raise InvalidArgument(f"uploader {name} must be >= 1, got {getattr(self, name)}")
        if not 0 <= self.backoff_ms_base <= self.backoff_ms_max:
            raise InvalidArgument("uploader needs 0 <= backoff_ms_base <= backoff_ms_max")

    def backoff_ms(self, failed_attempts: int) -> int:
        """Delay after the n-th failed attempt (n >= 1): base * 2**(n-1), capped."""
        assert failed_attempts >= 1
        return min(self.backoff_ms_max, self.backoff_ms_base << min(failed_attempts - 1, 32))


@dataclass(frozen=True, slots=True)
class UploadFailure:
    topic: str
    base_offset: int
    attempts: int
    error: str


@dataclass(frozen=True, slots=True)
class UploaderStatistics:
    pending: int
    in_flight: int
    uploaded_segments: int
    uploaded_bytes: int
    failed_attempts: int
    failures: tuple[UploadFailure, ...] = field(default=())


class Uploader:
    """Background uploads of sealed segments; see the module docstring."""

    def __init__(
        self,
        store: SegmentPublisher,
        segments: SegmentCatalog,
        config: UploaderConfig | None = None,
        *,
        clock: Clock | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        on_uploaded: Callable[[SegmentDescriptor], None] | None = None,
    ) -> None:
        self._store = store
        # Told (on the loop thread) after a descriptor is recorded: the owner tells the topic.
        self._on_uploaded = on_uploaded
        self._segments = segments
        self._config = config or UploaderConfig()
        self._clock = clock or SystemClock()
        self._sleep = sleep
        self._semaphore = asyncio.Semaphore(self._config.uploads_max)
        self._pending: dict[tuple[str, int], SealedSegment] = {}
        self._failures: dict[tuple[str, int], UploadFailure] = {}
        self._idle = asyncio.Event()
        self._idle.set()
        self._stop_requested = asyncio.Event()
        self._group: asyncio.TaskGroup | None = None
        self._runner: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._in_flight = 0
        self._uploaded_segments = 0
        self._uploaded_bytes = 0
        self._failed_attempts = 0

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        if self._runner is not None:
            raise FailedPrecondition("uploader already started")
        started = asyncio.Event()
        self._runner = asyncio.create_task(self._run(started), name="durable-uploader")
        await started.wait()

    async def _run(self, started: asyncio.Event) -> None:
        try:
            async with asyncio.TaskGroup() as group:
                self._group = group
                started.set()
                await self._stop_requested.wait()
                for task in self._tasks:
                    task.cancel()
        finally:
            self._group = None

    async def stop(self) -> None:
        """Cancel running uploads and stop; raises an upload task's unexpected error, if any."""
        if self._runner is None:
            return
        self._stop_requested.set()
        runner, self._runner = self._runner, None
        await runner

    async def __aenter__(self) -> Uploader:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def wait_idle(self) -> None:
        """Return when no upload is pending; raise if the uploader failed (a bug)."""
        if self._runner is None:
            raise FailedPrecondition("uploader is not running")
        idle = asyncio.ensure_future(self._idle.wait())
        try:
            await asyncio.wait({idle, self._runner}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            idle.cancel()
        if self._runner.done():
            self._runner.result()  # re-raises the task group's error
            raise FailedPrecondition("uploader stopped")

    # ------------------------------------------------------------------ submit

    def submit(self, segment: SealedSegment) -> None:
        """Queue an upload of `segment`. Already pending: no-op. Full: ResourceExhausted."""
        if self._group is None or self._stop_requested.is_set():
            raise FailedPrecondition("uploader is not running")
        ident = (segment.topic, segment.base_offset)
        if ident in self._pending:
            return
        if len(self._pending) >= self._config.pending_uploads_max:
            raise ResourceExhausted(
                f"{len(self._pending)} segment uploads pending (pending_uploads_max); "
                f"{segment.topic}@{segment.base_offset} stays local"
            )
        self._failures.pop(ident, None)
        self._pending[ident] = segment
        self._idle.clear()
        task = self._group.create_task(self._upload(segment), name=f"upload {segment.topic}@{segment.base_offset}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ------------------------------------------------------------------ one upload

    async def _upload(self, segment: SealedSegment) -> None:
        ident = (segment.topic, segment.base_offset)
        try:
            key = self._store.segment_key(segment.topic, segment.base_offset)
            for attempt in range(1, self._config.attempts_max + 1):
                try:
                    await self._attempt(segment, key)
                    return
                except AssertionError:
                    raise  # our bug: let the task group fail loudly
                except Exception as exc:  # the world's faults: network, disk, store, catalog
                    self._failed_attempts += 1
                    error = f"{type(exc).__name__}: {exc}"[:_ERROR_CHARS_MAX]
                    if attempt == self._config.attempts_max:
                        log.error(
                            "upload of %s@%d to %s failed after %d attempts; segment stays local",
                            segment.topic, segment.base_offset, key, attempt, exc_info=exc,
                        )
                        self._failures[ident] = UploadFailure(segment.topic, segment.base_offset, attempt, error)
                        return
                    delay_ms = self._config.backoff_ms(attempt)
                    log.warning(
                        "upload of %s@%d failed (attempt %d/%d), retrying in %d ms: %s",
                        segment.topic, segment.base_offset, attempt, self._config.attempts_max, delay_ms, error,
                    )
                # Backoff outside the semaphore, so other segments keep uploading meanwhile.
                await self._sleep(delay_ms / 1000)
        finally:
            del self._pending[ident]
            if not self._pending:
                self._idle.set()

    async def _attempt(self, segment: SealedSegment, key: str) -> None:
        async with self._semaphore:
            self._in_flight += 1
            try:
                size, crc = await asyncio.to_thread(self._store.publish, segment.local_path, key)
            finally:
                self._in_flight -= 1
        desc = SegmentDescriptor(
            topic=segment.topic,
            base_offset=segment.base_offset,
            end_offset=segment.end_offset,
            record_count=segment.record_count,
            size_bytes=size,
            crc32c=crc,
            object_key=key,
            created_ms=self._clock.now_ms(),
        )
        # On the loop thread, not a worker: adds for one topic are then serialized and the
        # overlap check in SegmentCatalog.add cannot race. It costs one durable metadata write.
        await self._segments.add(desc)
        self._uploaded_segments += 1
        self._uploaded_bytes += size
        if self._on_uploaded is not None:
            self._on_uploaded(desc)

    # ------------------------------------------------------------------ statistics

    def statistics(self) -> UploaderStatistics:
        return UploaderStatistics(
            pending=len(self._pending),
            in_flight=self._in_flight,
            uploaded_segments=self._uploaded_segments,
            uploaded_bytes=self._uploaded_bytes,
            failed_attempts=self._failed_attempts,
            failures=tuple(self._failures.values()),
        )

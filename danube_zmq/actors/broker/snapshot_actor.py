"""The snapshot actor: WAL snapshots of this broker's reliable topics, on a schedule
(`snapshots.interval_seconds`) and on demand (`danube admin snapshots ...`).

1. Ask the broker for the reliable topics (a glob may narrow them).
2. Ask each topic for a cut (`TakeSnapshotCut`): its subscriptions as they are, then its
   committed end, and the segment files holding every record below it. The topic pins
   those files (no retention) until released; it answers at once, so producers wait
   at most the few asks of its subscriptions.
3. Export, on this actor's own thread: a sealed segment already exported is shared (its
   footer describes it); others are scanned and written as Parquet (`snapshots/export.py`);
   the active segment's records below the cut go to the snapshot's own `tail/`.
4. Release the pins, write the manifest (now the snapshot is listed), apply retention
   (the oldest of this broker's snapshots beyond `retention_count`, then shared files
   no manifest names).

One snapshot is taken at a time; list, describe and delete wait behind one in progress.
A topic whose export fails (a damaged segment) is left out and named in the manifest's
`errors`; the others are still snapshotted.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from danube_zmq.config.broker_config import BrokerConfig
from danube_zmq.runtime.actor import Actor, Origin
from danube_zmq.snapshots.export import ExportedFile, export_segment, read_footer
from danube_zmq.snapshots.manifest import (
    FileRef,
    Manifest,
    SubscriptionState,
    TopicState,
    new_snapshot_id,
    segment_path,
    tail_path,
)
from danube_zmq.snapshots.store import SnapshotStore
from danube_zmq.storage.durable import DurableStore
from danube_zmq.storage.paths import check_snapshot_id, check_topic_glob
from danube_zmq.transport import admin_protocol as ap
from danube_zmq.transport.client_protocol import SubType
from danube_zmq.transport.codec import Message
from danube_zmq.transport.common import Ok
from danube_zmq.transport.errors import DanubeError, NotFound
from danube_zmq.transport.internal_protocol import (
    ListSnapshotTopics,
    ReleaseSnapshotCut,
    SegmentRef,
    SnapshotCut,
    SnapshotTopicRef,
    SnapshotTopics,
    TakeSnapshotCut,
    Tick,
)

log = logging.getLogger("danube_zmq.snapshots")

__all__ = ["SnapshotActor", "snapshot_url"]


def snapshot_url(config: BrokerConfig) -> str:
    return config.snapshots.url or str(Path(config.broker.data_dir) / "snapshots")


@dataclass(slots=True)
class _Export:
    topics: list[TopicState] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    written: int = 0
    shared: int = 0


class SnapshotActor(Actor):
    def __init__(self, *, config: BrokerConfig, broker_id: int, broker_url: str) -> None:
        self.config = config
        self.broker_id = broker_id
        self.broker_url = broker_url
        self.url = snapshot_url(config)
        self.store: SnapshotStore | None = None
        self.durable: DurableStore | None = None
        self._pin_ids = itertools.count(1)
        self._thread: ThreadPoolExecutor | None = None

    async def on_start(self) -> None:
        self.store = SnapshotStore(self.url)
        if self.config.storage.mode != "local" and self.config.storage.durable_url:
            self.durable = DurableStore(self.config.storage.durable_url)
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="danube-snapshot")
        interval = self.config.snapshots.interval_seconds
        if interval:
            self.system.schedule_periodic(self.endpoint, interval * 1000, Tick())

    async def on_stop(self) -> None:
        if self._thread is not None:
            self._thread.shutdown(wait=True)
            self._thread = None

    async def _in_thread(self, work: Callable[..., Any], *args: Any) -> Any:
        assert self._thread is not None
        return await asyncio.get_running_loop().run_in_executor(self._thread, work, *args)

    # ------------------------------------------------------------- requests
    async def handle_Tick(self, msg: Tick) -> None:
        try:
            created = await self.create(None)
            log.info("scheduled snapshot %s: %d topics, %d records", created.snapshot.snapshot_id,
                     created.snapshot.topics, created.snapshot.records)
        except DanubeError as exc:
            log.error("scheduled snapshot failed: %s", exc)

    async def handle_CreateSnapshot(self, msg: ap.CreateSnapshot, origin: Origin) -> Message:
        if msg.topic is not None:
            check_topic_glob(msg.topic)
        created = await self.create(msg.topic)
        return ap.SnapshotCreated(request_id=msg.request_id, url=created.url, snapshot=created.snapshot,
                                  files_written=created.files_written, files_shared=created.files_shared,
                                  elapsed_ms=created.elapsed_ms)

    async def handle_ListSnapshots(self, msg: ap.ListSnapshots, origin: Origin) -> Message:
        store = self._store()
        manifests = await self._in_thread(lambda: list(store.manifests()))
        return ap.SnapshotList(request_id=msg.request_id, url=self.url, snapshots=[_summary(m) for m in manifests])

    async def handle_DescribeSnapshot(self, msg: ap.DescribeSnapshot, origin: Origin) -> Message:
        check_snapshot_id(msg.snapshot_id)  # here too, so bad input never reaches the thread
        manifest = await self._in_thread(self._store().manifest, msg.snapshot_id)
        return ap.SnapshotDescription(request_id=msg.request_id, url=self.url, manifest=manifest.to_json())

    async def handle_DeleteSnapshot(self, msg: ap.DeleteSnapshot, origin: Origin) -> Message:
        check_snapshot_id(msg.snapshot_id)
        await self._in_thread(self._store().delete, msg.snapshot_id)
        return Ok(request_id=msg.request_id)

    def _store(self) -> SnapshotStore:
        assert self.store is not None
        return self.store

    # ------------------------------------------------------------- taking one
    async def create(self, pattern: str | None) -> ap.SnapshotCreated:
        started = time.monotonic()
        created_ms = self.system.clock.now_ms()
        snapshot_id = new_snapshot_id(created_ms, self.config.cluster.node_id)
        listed = await self.system.ask(self.system.broker_endpoint, ListSnapshotTopics(pattern=pattern))
        assert isinstance(listed, SnapshotTopics)
        if pattern is not None and not listed.topics:
            raise NotFound(f"no reliable topic served by this broker matches {pattern!r}")
        cuts: list[tuple[SnapshotTopicRef, SnapshotCut]] = []
        pins: list[tuple[str, int]] = []
        try:
            for ref in listed.topics:
                pin_id = next(self._pin_ids)
                try:
                    cut = await self.system.ask(ref.endpoint, TakeSnapshotCut(pin_id=pin_id,
                                                                              pin_ms=self.config.snapshots.pin_ms))
                except DanubeError as exc:  # deleted or restarting meanwhile
                    log.warning("snapshot %s: topic %s left out: %s", snapshot_id, ref.topic, exc)
                    continue
                assert isinstance(cut, SnapshotCut)
                pins.append((ref.endpoint, pin_id))
                cuts.append((ref, cut))
            exported = await self._in_thread(self._export, snapshot_id, cuts)
        finally:
            for endpoint, pin_id in pins:
                self.system.tell(endpoint, ReleaseSnapshotCut(pin_id=pin_id))
        manifest = Manifest(snapshot_id=snapshot_id, created_ms=created_ms, broker_id=self.broker_id,
                            broker_url=self.broker_url, include_payloads=self.config.snapshots.include_payloads,
                            topics=exported.topics, errors=exported.errors)
        store = self._store()
        await self._in_thread(store.write_manifest, manifest)
        await self._in_thread(self._retention)
        return ap.SnapshotCreated(request_id=0, url=self.url, snapshot=_summary(manifest),
                                  files_written=exported.written, files_shared=exported.shared,
                                  elapsed_ms=round((time.monotonic() - started) * 1000))

    def _export(self, snapshot_id: str, cuts: list[tuple[SnapshotTopicRef, SnapshotCut]]) -> _Export:
        out = _Export()
        with tempfile.TemporaryDirectory(prefix="danube-snapshot-") as scratch:
            for ref, cut in cuts:
                try:
                    files = [self._export_segment(snapshot_id, cut.topic, ref.partition, seg, Path(scratch), out)
                             for seg in cut.segments]
                except (DanubeError, OSError) as exc:
                    text = exc.message if isinstance(exc, DanubeError) else f"{type(exc).__name__}: {exc}"
                    log.error("snapshot %s: topic %s left out: %s", snapshot_id, cut.topic, text)
                    out.errors.append(f"{cut.topic}: {text}")
                    continue
                out.topics.append(TopicState(
                    topic=cut.topic, base_topic=ref.base_topic, partition=ref.partition,
                    log_start_offset=cut.log_start_offset, end_offset=cut.end_offset, messages_in=cut.messages_in,
                    producers=cut.producers, files=files,
                    subscriptions=[SubscriptionState(
                        name=s.name, sub_type=SubType(s.sub_type).name.lower().replace("_", "-"), cursor=s.cursor,
                        acked_above=s.acked_above, unacked=s.unacked, consumers=s.consumers,
                        backlog_messages=s.backlog_messages) for s in cut.subscriptions]))
        return out

    def _export_segment(self, snapshot_id: str, topic: str, partition: int | None, seg: SegmentRef, scratch: Path,
                        out: _Export) -> FileRef:
        store, payloads = self._store(), self.config.snapshots.include_payloads
        last = seg.upto_offset - 1
        if seg.sealed:
            relative = segment_path(topic, seg.base_offset, last, payloads)
            if store.exists(relative):
                with store.open_read(relative) as file:
                    done = read_footer(file, f"{self.url}/{relative}")
                out.shared += 1
                return _file_ref(relative, done, shared=True)
        else:
            relative = tail_path(snapshot_id, topic, seg.base_offset, last, payloads)
        source, where = self._source(seg, scratch)
        result: list[ExportedFile] = []

        def write(file: IO[bytes]) -> None:
            result.append(export_segment(source, file, where=where, topic=topic, partition=partition,
                                         base_offset=seg.base_offset, upto_offset=seg.upto_offset, payloads=payloads))
        try:
            store.publish(relative, write)
        finally:
            if seg.path is None:
                source.unlink(missing_ok=True)
        out.written += 1
        return _file_ref(relative, result[0], shared=seg.sealed)

    def _source(self, seg: SegmentRef, scratch: Path) -> tuple[Path, str]:
        """The segment as a local file: the WAL's own, or the durable copy fetched."""
        if seg.path is not None:
            return Path(seg.path), seg.path
        assert seg.durable is not None
        if self.durable is None:
            raise NotFound(f"segment {seg.durable.object_key} is only in the durable store, which is not configured")
        dest = scratch / f"{seg.base_offset:020d}.seg"
        self.durable.fetch(seg.durable.object_key, dest, size_bytes=seg.durable.size_bytes,
                           crc32c=seg.durable.crc32c)
        return dest, f"{self.durable.url}/{seg.durable.object_key}"

    def _retention(self) -> None:
        store, keep = self._store(), self.config.snapshots.retention_count
        if keep:
            suffix = new_snapshot_id(0, self.config.cluster.node_id).rsplit("-", 1)[1]
            own = [s for s in store.snapshot_ids() if s.endswith(f"-{suffix}")]  # this broker's, every incarnation
            for snapshot_id in own[:max(0, len(own) - keep)]:
                store.delete(snapshot_id)
                log.info("snapshot %s deleted (snapshots.retention_count %d)", snapshot_id, keep)
        store.delete_unreferenced_segments()


def _file_ref(relative: str, done: ExportedFile, *, shared: bool) -> FileRef:
    return FileRef(path=relative, base_offset=done.base_offset, last_offset=done.last_offset, records=done.records,
                   record_bytes=done.record_bytes, shared=shared)


def _summary(manifest: Manifest) -> ap.SnapshotSummary:
    return ap.SnapshotSummary(
        snapshot_id=manifest.snapshot_id, created_ms=manifest.created_ms, broker_id=manifest.broker_id,
        topics=len(manifest.topics), subscriptions=sum(len(t.subscriptions) for t in manifest.topics),
        records=manifest.records, record_bytes=manifest.record_bytes, files=len(manifest.files))


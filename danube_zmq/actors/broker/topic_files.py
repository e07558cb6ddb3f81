"""The files of the reliable topics a broker holds: their WAL directories on its disk,
and (durable modes) their sealed segments in the durable store with the uploads that
put them there. A helper of the broker actor; what to do with a topic is the broker's
(and `ownership.py`'s, pure), the files are here.

1. Loading: where a reliable topic starts (`start_offset`: `ownership.reliable_start`
   from the store's record, the local WAL's end and the durable segments'); a stale
   local WAL of an earlier turn here is dropped, a damaged one recovered from the
   durable store when it holds every offset (`recover_from_durable`, the WAL set
   aside under `quarantine/`).
2. Unloading: `seal` seals the active segment and waits for the uploads, so the next
   broker opens the topic from the durable store.
3. Deleting: the WAL and durable cache here (`delete_files`); the durable segments,
   checkpoints-only segments and compacted ledgers by the broker that deleted the
   topic (`delete_durable`).
4. A topic's sealed segments are uploaded as it reports them (`SegmentSealed`); the
   broker tells the topic each one that is durable (`on_uploaded`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
from collections.abc import Callable
from pathlib import Path

from danube_zmq.actors.cluster.ownership import damaged_wal_is_stale, reliable_start
from danube_zmq.actors.metrics import METRICS
from danube_zmq.actors.topic.wal.writer import publish_cursor_tail
from danube_zmq.clock import Clock
from danube_zmq.config.broker_config import BrokerConfig
from danube_zmq.consensus.metadata_catalog import MetadataCatalog
from danube_zmq.consensus.metadata_store import RaftMetadataStore
from danube_zmq.storage.catalog import SegmentCatalog, SegmentDescriptor
from danube_zmq.storage.durable import (
    DurableStore,
    SealedSegment,
    Uploader,
    UploaderConfig,
    compacted_key,
    cursors_key,
)
from danube_zmq.storage.paths import resolve_inside
from danube_zmq.storage.wal.errors import WalDamaged
from danube_zmq.storage.wal.log import WalLog
from danube_zmq.storage.wal.segment import parse_segment_file_name
from danube_zmq.transport import cluster_records as cr
from danube_zmq.transport.errors import DanubeError, Unavailable
from danube_zmq.transport.internal_protocol import DurableSegment, SegmentSealed
from danube_zmq.transport.topic_name import TopicName

__all__ = ["TopicFiles", "durable_segment"]

log = logging.getLogger("danube_zmq.broker")

# How long a clean stop, or a topic's seal, waits for the uploads of just-sealed segments.
_UPLOADS_AT_STOP_S = 30.0


class TopicFiles:
    def __init__(self, *, config: BrokerConfig, metadata: RaftMetadataStore, broker_id: int, data_dir: Path,
                 clock: Clock) -> None:
        self.config = config
        self.metadata = metadata
        self.broker_id = broker_id
        self.data_dir = data_dir
        self.clock = clock
        self.durable_store: DurableStore | None = None
        self.segment_catalog: SegmentCatalog | None = None
        self.uploader: Uploader | None = None

    async def start(self, on_uploaded: Callable[[SegmentDescriptor], None]) -> None:
        """Durable modes: sealed segments of reliable topics are copied to the durable store."""
        storage = self.config.storage
        if storage.mode == "local":
            return
        assert storage.durable_url
        self.durable_store = DurableStore(storage.durable_url)
        self.segment_catalog = SegmentCatalog(MetadataCatalog(self.metadata))
        self.uploader = Uploader(self.durable_store, self.segment_catalog, UploaderConfig(uploads_max=storage.uploads_max),
                                 clock=self.clock, on_uploaded=on_uploaded)
        await self.uploader.start()

    async def stop(self) -> None:
        """Wait (bounded) for the uploads of the segments topics sealed while stopping."""
        if self.uploader is None:
            return
        try:
            async with asyncio.timeout(_UPLOADS_AT_STOP_S):
                await self.uploader.wait_idle()
        except (TimeoutError, DanubeError) as exc:
            log.warning("uploads still pending at shutdown (%s); they resume at the next start", exc)
        await self.uploader.stop()
        self.uploader = None

    def wal_dir(self, name: TopicName) -> Path:
        # Deleted recursively with the topic: checked to stay inside the data dir.
        return resolve_inside(self.data_dir, "wal", name.namespace, name.topic)

    async def seal(self, name: TopicName) -> int | None:
        """Seal the WAL of a reliable topic no longer served here: where its offsets
        stop (None: no WAL here). Durable modes: every sealed segment reaches the durable
        store before the next broker opens the topic from it (the topic's own reports
        of them may still be in the broker's mailbox)."""
        topic = name.full
        next_offset, sealed = await asyncio.to_thread(self._seal_wal, name)
        if self.uploader is not None and self.segment_catalog is not None:
            for segment in sealed:
                if self.segment_catalog.get(topic, segment.base_offset) is None:
                    with contextlib.suppress(DanubeError):  # queued already
                        self.uploader.submit(segment)
            try:
                async with asyncio.timeout(_UPLOADS_AT_STOP_S):
                    await self.uploader.wait_idle()
            except TimeoutError:
                raise Unavailable(f"uploads did not finish within {_UPLOADS_AT_STOP_S:g} s") from None
        return next_offset

    def _seal_wal(self, name: TopicName) -> tuple[int | None, list[SealedSegment]]:
        """Seal the active segment of a topic no longer served here (durable modes);
        its next offset and its sealed segments. Runs in a thread."""
        directory = self.wal_dir(name)
        if not directory.exists():
            return None, []
        storage = self.config.storage
        wal = WalLog.open(directory, segment_bytes_max=storage.wal_segment_bytes_max,
                          segment_age_ms_max=storage.wal_segment_age_ms_max, clock=self.clock)
        try:
            if storage.mode == "local":
                return wal.next_offset, []
            if wal.seal_active() is None and storage.cursors_in_segments and self.durable_store is not None:
                # Checkpoints only (a stop with a flush in flight does not seal): the next
                # broker reads them from the store as they are.
                publish_cursor_tail(wal, self.durable_store, name.full)
            return wal.next_offset, [
                SealedSegment(topic=name.full, base_offset=info.base_offset, end_offset=info.next_offset - 1,
                              record_count=info.next_offset - info.base_offset, local_path=Path(info.path))
                for info in wal.segments() if info.sealed and info.next_offset > info.base_offset]
        finally:
            wal.close()

    def _wal_end(self, name: TopicName) -> int | None:
        """The next offset of the topic's local WAL (None: it has none). Runs in a thread."""
        directory = self.wal_dir(name)
        if not directory.exists():
            return None
        storage = self.config.storage
        wal = WalLog.open(directory, segment_bytes_max=storage.wal_segment_bytes_max,
                          segment_age_ms_max=storage.wal_segment_age_ms_max, clock=self.clock)
        try:
            return wal.next_offset
        finally:
            wal.close()

    async def start_offset(self, name: TopicName) -> int | None:
        """Where a reliable topic loaded here must start (`ownership.reliable_start`
        decides from the store's record, the local WAL's end and the durable segments').
        A local WAL of an earlier turn here that ends below is stale: it is dropped."""
        value = self.metadata.local_get(cr.topic_state_key(name.full))
        state = cr.decode(value.value, cr.TopicState) if value is not None else None
        try:
            local_end = await asyncio.to_thread(self._wal_end, name)
        except WalDamaged as damage:
            if not damaged_wal_is_stale(me=self.broker_id, state=state, claimed_end=damage.claimed_end):
                raise
            log.warning("topic %s: a stale local WAL from an earlier turn is damaged (%s): dropping it",
                        name.full, damage)
            await asyncio.to_thread(shutil.rmtree, self.wal_dir(name))
            local_end = None
        durable_end = None
        if self.segment_catalog is not None:
            segments = self.segment_catalog.list(name.full)
            if segments:
                durable_end = segments[-1].end_offset + 1
        storage = self.config.storage
        start = reliable_start(me=self.broker_id, state=state, local_end=local_end, durable_end=durable_end,
                               wal_exact=storage.wal_sync == "always",
                               cursors_in_segments=storage.mode != "local" and storage.cursors_in_segments)
        if start.damage is not None:
            assert state is not None and local_end is not None
            wal_dir = self.wal_dir(name)
            log.error("topic %s: WAL %s: %s; the topic is not served", name.full, wal_dir, start.damage)
            raise WalDamaged(wal_dir, 0, start.damage, valid_end=local_end, claimed_end=start.claimed_end,
                             acknowledged_offset=state.next_offset, quarantined=None)
        if start.drop_local_wal:
            log.warning("topic %s: the local WAL ends at %s, the topic at %d (served elsewhere since): dropping it",
                        name.full, local_end, start.start_offset)
            await asyncio.to_thread(shutil.rmtree, self.wal_dir(name))
        if start.continue_after_gap:
            log.warning("topic %s: the local WAL ends at %s, below offsets this broker may have given out"
                        " (wal_sync interval): it continues at %d, the offsets between given up",
                        name.full, local_end, start.start_offset)
            await asyncio.to_thread(WalLog.repair, self.wal_dir(name), resume_offset=start.start_offset,
                                    clock=self.clock)
        return start.start_offset

    async def recover_from_durable(self, name: TopicName, damage: WalDamaged) -> bool:
        """Durable modes: when the durable segments hold every offset the damaged local
        WAL held, set the WAL aside (whole, under `quarantine/`) and let the topic start
        again from the durable store, past its reservation. False: they do not."""
        if self.segment_catalog is None:
            return False
        wal_dir = self.wal_dir(name)
        # From the WAL's first offset: an upload that failed leaves a hole the last durable
        # segment's end would hide.
        bases = [parse_segment_file_name(path.name) for path in wal_dir.glob("*.wal")]
        wal_start = min((base for base in bases if base is not None), default=damage.valid_end)
        if not self.segment_catalog.covers_range(name.full, wal_start, damage.claimed_end):
            return False
        aside = self.data_dir / "quarantine" / name.namespace / f"{name.topic}.{self.clock.now_ms()}"
        aside.parent.mkdir(parents=True, exist_ok=True)
        await asyncio.to_thread(wal_dir.rename, aside)
        METRICS.wal_damage.inc()
        log.error("topic %s: its WAL is damaged (%s) but the durable store holds every offset it held (%d..%d):"
                  " the WAL is set aside in %s and the topic recovers from the durable segments", name.full, damage,
                  wal_start, damage.claimed_end - 1, aside)
        return True

    async def delete_files(self, name: TopicName) -> None:
        """A topic's files here: WAL and durable cache."""
        await asyncio.to_thread(shutil.rmtree, self.wal_dir(name), True)
        await asyncio.to_thread(shutil.rmtree, self.cache_dir(name), True)

    def cache_dir(self, name: TopicName) -> Path:
        return resolve_inside(self.data_dir, "durable-cache", name.namespace, name.topic)

    async def delete_durable(self, topic: str) -> None:
        """A deleted topic's durable segments go too: objects first, then descriptors;
        then the objects found by listing (checkpoints-only segments, compacted ledgers)."""
        if self.segment_catalog is None:
            return
        for desc in self.segment_catalog.list(topic):
            if self.durable_store is not None:
                await asyncio.to_thread(self.durable_store.delete, desc.object_key)
            await self.segment_catalog.remove(topic, desc.base_offset)
        if self.durable_store is not None:  # checkpoints-only segments: no descriptor, listed
            store = self.durable_store
            for base in await asyncio.to_thread(store.cursor_bases, topic):
                await asyncio.to_thread(store.delete, cursors_key(topic, base))
            for horizon in await asyncio.to_thread(store.compacted_horizons, topic):
                await asyncio.to_thread(store.delete, compacted_key(topic, horizon))

    def submit_sealed(self, msg: SegmentSealed, on_uploaded: Callable[[SegmentDescriptor], None]) -> None:
        """A segment a topic sealed, queued for upload (`on_uploaded` at once when the
        catalog has it already)."""
        if self.uploader is None or self.segment_catalog is None:
            return
        known = self.segment_catalog.get(msg.topic, msg.base_offset)
        if known is not None and known.end_offset >= msg.end_offset:
            on_uploaded(known)
            return
        try:
            self.uploader.submit(SealedSegment(topic=msg.topic, base_offset=msg.base_offset, end_offset=msg.end_offset,
                                               record_count=msg.record_count, local_path=Path(msg.path)))
        except DanubeError as exc:
            log.warning("segment %s@%d not queued for upload (%s); the topic reports it again", msg.topic,
                        msg.base_offset, exc)


def durable_segment(desc: SegmentDescriptor) -> DurableSegment:
    return DurableSegment(base_offset=desc.base_offset, end_offset=desc.end_offset, object_key=desc.object_key,
                          size_bytes=desc.size_bytes, crc32c=desc.crc32c, created_ms=desc.created_ms)

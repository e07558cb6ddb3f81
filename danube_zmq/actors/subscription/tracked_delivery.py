"""The delivery side of a reliable subscription (`TrackedDelivery`): at-least-once
delivery from the log, the dispatch rule with the delivery tracker. Its subscription
actor (`shell.SubscriptionActor`) holds the consumers and calls it from its handlers.

1. Records come from the topic: the `Publish` notice of each committed batch when the
   subscription is caught up, else `ReadResult`s it asks for (`ReadRequest`) from its
   read position; a bounded read-ahead (`records`) holds them until acknowledged.
2. Dispatch: first the redeliveries that are due, then new records from the
   tracker's read offset, to consumers with permits and room in their window
   (`reliable.max_unacked_messages`), split by the subscription type's rule.
3. Acks move the cursor (highest contiguously acknowledged offset; out-of-order acks
   are kept above it); nacks and ack timeouts schedule redelivery with backoff; a
   message redelivered `max_redelivery_count` times meets the poison policy.
4. A consumer that leaves gives its unacknowledged messages back: Shared and
   Key-Shared hand them to the others, an Exclusive or Failover consumer that
   attaches next gets them again.
5. The cursor is sent to the broker (which persists it in the catalog) at most every
   `storage.cursor_flush_interval_ms` and when the actor stops; a restart resumes at
   cursor + 1, redelivering at most that window.
6. Seek (a consumer's `Seek`, or the admin's `SeekSubscription` through the topic):
   the topic turns a publish time into an offset and checks it against the log, then
   `SeekTo` restarts the tracker there and empties the read-ahead; consumers stay
   attached and each gets `SeekReset` (drop what you hold) before the new deliveries.
7. Failure policy: the broker's `reliable:` defaults until an admin sets one
   (`SetSubscriptionPolicy`); from then on it applies (`tracker.set_policy`) and is
   persisted with the cursor, so a restart keeps it.
8. Dispatch window: `reliable.max_unacked_messages` until an admin sets one
   (`SetSubscriptionDispatchConfig`); it applies at once (a consumer above a smaller
   window gets nothing new until its acks bring it under) and is persisted with the
   cursor like the failure policy.

The tracker (`dispatch/tracker.py`) is the pure core; this side and its shell do the I/O.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Sequence
from functools import partial
from itertools import groupby, islice, repeat
from operator import attrgetter, itemgetter
from pathlib import Path
from typing import TYPE_CHECKING

from danube_zmq.actors.dispatch import make_rule
from danube_zmq.actors.dispatch.chunks import ChunkAffinity, chunk_of
from danube_zmq.actors.dispatch.tracker import CursorState, DeliveryTracker, FailurePolicy, Poisoned
from danube_zmq.actors.metrics import METRICS
from danube_zmq.actors.sockets.gateway import OUTBOX, reply_client
from danube_zmq.actors.subscription.delayed import DelayedLane
from danube_zmq.actors.subscription.delivery import Consumer, DeliverySample
from danube_zmq.actors.subscription.records import Record as _Record
from danube_zmq.config.broker_config import ENVELOPE_BYTES_MAX, BrokerConfig
from danube_zmq.transport import client_protocol as cp
from danube_zmq.transport.client_protocol import DELIVER_AT
from danube_zmq.transport.codec import Message
from danube_zmq.transport.common import Ok
from danube_zmq.transport.errors import DanubeError, InvalidArgument, ResourceExhausted
from danube_zmq.transport.internal_protocol import (
    INTERNAL_PROTOCOL,
    READ_AHEAD,
    DeadLetter,
    DelayedDue,
    DelayedState,
    FailurePolicyState,
    PersistCursor,
    Publish,
    ReadRequest,
    ReadResult,
    ResolveSeek,
    SeekTo,
    SetSubscriptionDispatchConfig,
    SetSubscriptionPolicy,
    SubscriptionCursor,
    SubscriptionCut,
    SubscriptionCutState,
    SubscriptionDispatchConfig,
    SubscriptionPolicy,
    Tick,
)
from danube_zmq.transport.topic_name import parse_topic

if TYPE_CHECKING:
    from danube_zmq.actors.subscription.shell import SubscriptionActor

log = logging.getLogger("danube_zmq.subscription")

_READ_BYTES_MAX = 1 << 20
_new = tuple.__new__
# What one `Deliver` shares: producer and schema version.
_run_key = attrgetter("producer_id", "schema_id", "schema_version")


_make_record = partial(_new, _Record)
# Bytes a message adds to a Deliver besides its payload, key and attributes (msgpack
# headers, publish time; over-estimated).
_MESSAGE_OVERHEAD_BYTES = 32


def _record_bytes(record: _Record) -> int:
    size = len(record.payload) + _MESSAGE_OVERHEAD_BYTES
    if record.key is not None:
        size += len(record.key)
    if record.attributes:
        size += sum(len(k) + len(v) + 8 for k, v in record.attributes.items())
    return size


def _cuts(records: list[_Record], start: int, end: int, budget: int) -> list[tuple[int, int]]:
    """[start, end) cut into runs of at most `budget` bytes (at least one record each)."""
    run = records[start:end]
    if not any(map(itemgetter(1), run)) and not any(map(itemgetter(2), run)) \
            and sum(map(len, map(itemgetter(0), run))) + len(run) * _MESSAGE_OVERHEAD_BYTES <= budget:
        return [(start, end)]  # the usual case, counted in C: payloads only, within a frame
    cuts = []
    size = 0
    cut_start = start
    for i in range(start, end):
        size_i = _record_bytes(records[i])
        if i > cut_start and size + size_i > budget:
            cuts.append((cut_start, i))
            cut_start, size = i, 0
        size += size_i
    cuts.append((cut_start, end))
    return cuts


class TrackedDelivery:
    # Set at each attach (the consumer's choice): reads below the topic's compaction
    # horizon come from its compacted view, whose gaps are crossed without a warning.
    read_compacted = False
    _compacted_gap = False  # the gap at `gap_end` is keys compaction dropped
    _stale_reads = 0  # reads in flight when `read_compacted` changed: their results are dropped

    def __init__(self, *, topic: str, name: str, sub_type: int, config: BrokerConfig, cursor: int,
                 acked_above: Sequence[int], committed_offset: int, policy: FailurePolicyState | None = None,
                 max_unacked_messages: int | None = None, seeks: int = 0, durable: bool = True,
                 delayed: DelayedState | None = None, spill_dir: Path | None = None) -> None:
        self.topic = topic
        # False: a reader's, whose cursor is neither stored nor counted by the topic.
        self.durable = durable
        self.subscription = name
        self.sub_type = sub_type
        self.config = config
        self.rule = make_rule(cp.SubType(sub_type))
        # Consumers a record is too large for, found in a dispatch pass: detached after it.
        self._too_large: dict[int, str] = {}
        # The explicit ones are an admin's: persisted, no longer following the broker's
        # `reliable:` defaults.
        self.policy, self.policy_explicit, self.window, self.window_explicit = _settings(
            f"{topic}:{name}", config, policy, max_unacked_messages)
        self.seeks = seeks  # carried in its cursor records; from its topic at a restart
        self.tracker = DeliveryTracker(cursor=cursor, acked_above=acked_above, policy=self.policy)
        self.records: dict[int, _Record] = {}
        # The next offset to add to `records`: from the cursor, so that unacknowledged holes
        # below the read offset (after a restart with out-of-order acks) have their records.
        self.buffer_end = cursor + 1
        self.head = committed_offset  # offsets below are committed in the topic's log
        self.log_start = 0  # the log's first offset, as reads answered it (for GetLastOffset)
        self.reading = False
        # The end of offsets the log never held, found at `buffer_end` (0: none): crossed
        # once everything buffered before it is delivered (`_cross_gap`).
        self.gap_end = 0
        self.read_ahead_max = 2 * self.window
        self.persisted = (cursor, tuple(sorted(acked_above)))
        self.redeliveries = 0
        self.dead_lettered = 0
        # Ticks (ack timeouts, due redeliveries, poison, cursor flushes) are armed one at
        # a time and only while there is such work: an idle subscription costs nothing,
        # where a periodic tick cost every one of 1,000 idle topics ten wake-ups a second.
        self._tick_ms = min(self.config.storage.cursor_flush_interval_ms, 100)
        self._tick_armed = False
        self._persisted_mark = (cursor, len(acked_above))
        # Shared: chunks of one message to one consumer, once the subscription saw a
        # chunk (before, dealing pays nothing for it).
        self.affinity = ChunkAffinity() if sub_type == cp.SubType.SHARED else None
        self._chunks_seen = False
        # Shared and Key-Shared: delayed messages (`delayed.py`), once one is seen or
        # when the subscription held some before.
        self._spill_dir = spill_dir if sub_type in (cp.SubType.SHARED, cp.SubType.KEY_SHARED) else None
        self.delayed = self._lane(delayed, cursor, acked_above) if delayed is not None and self._spill_dir else None
        self._delayed_timer: int | None = None
        self._persisted_changes = 0

    def bind(self, shell: SubscriptionActor) -> None:
        self.shell = shell

    def _lane(self, state: DelayedState | None, cursor: int = -1, acked_above: Sequence[int] = ()) -> DelayedLane:
        """The delayed messages' lane: resumed from `state` with the cursor it was
        persisted with (what that cursor settled is what the lane's scan looks for)."""
        assert self._spill_dir is not None
        settled_above = frozenset(acked_above)
        return DelayedLane(topic=self.topic, subscription=self.subscription, policy=self.policy,
                           config=self.config.reliable, spill_dir=self._spill_dir, state=state,
                           settled=lambda offset: offset <= cursor or offset in settled_above,
                           scan_end=max(cursor, max(acked_above, default=cursor)) + 1, records_max=self.read_ahead_max)

    def start(self) -> None:
        if self.durable:
            self.shell.system.tell(self.shell.topic_endpoint, SubscriptionCursor(subscription=self.subscription,
                                                                                 cursor=self._retained_below()))
        self._fill()

    def stop(self) -> None:
        self._persist(force=True)
        if self.delayed is not None:
            self.delayed.close()

    def _retained_below(self) -> int:
        """The cursor the topic's retention goes by: delayed messages held keep the log
        from the lowest of them (`delayed.py`, step 4)."""
        low = self.delayed.low() if self.delayed is not None else None
        return self.tracker.cursor if low is None else min(self.tracker.cursor, low - 1)

    def attached(self, replay: list[bytes]) -> None:
        self.dispatch()  # a reliable subscription starts from its cursor, never from a replay

    def set_read_compacted(self, on: bool) -> None:
        """The attached consumer's choice. Records read ahead from the other view and
        not delivered yet go, and are read again (a read in flight is dropped)."""
        if on == self.read_compacted:
            return
        self.read_compacted = on
        start = self.tracker.read_offset
        for offset in [o for o in self.records if o >= start]:
            del self.records[offset]
        self.buffer_end, self.gap_end = start, 0
        self._stale_reads += self.reading
        self.reading = False

    def consumer_left(self, consumer_id: int) -> None:
        if self.affinity is not None:
            self.affinity.consumer_left(consumer_id)
        self.tracker.consumer_gone(consumer_id, self.shell.system.clock.monotonic_ms())
        if self.delayed is not None:
            self.delayed.tracker.consumer_gone(consumer_id, self.shell.system.clock.monotonic_ms())
        self._arm_tick()

    # ------------------------------------------------------------- records in
    def publish(self, msg: Publish) -> None:
        end = msg.base_offset + len(msg.payloads)
        self.head = max(self.head, end)
        if msg.base_offset <= self.buffer_end < end and not self.reading and self._room():
            self._buffer(msg)
        self._fill()
        self.dispatch()

    def read_result(self, msg: ReadResult) -> None:
        if msg.purpose != READ_AHEAD:
            if self.delayed is not None:
                self.delayed.read_result(msg, self.shell.system.clock.monotonic_ms(), self.shell.system.clock.now_ms())
                self._fill()
                self.dispatch()
            return
        self._read_result(msg)
        self._arm_tick()

    def _read_result(self, msg: ReadResult) -> None:
        self.head = max(self.head, msg.committed_offset)
        self.log_start = max(self.log_start, msg.log_start_offset)
        if self._stale_reads:  # asked before the view changed
            self._stale_reads -= 1
            return self._fill()
        self.reading = False
        if msg.start_offset != self.buffer_end:
            return self._fill()  # an answer to a read made before a seek or skip
        if not msg.frames and self.buffer_end < msg.log_start_offset:
            log.warning("%s:%s: offsets %d..%d are no longer in the log; skipped", self.topic, self.subscription,
                        self.buffer_end, msg.log_start_offset - 1)
            # None of them can be read again: those already delivered or waiting since a
            # resume (below `read_offset`) are settled now; the rest is crossed as a gap,
            # once everything before it is delivered (`_cross_gap`, within the bound).
            self.tracker.forget(self.buffer_end, msg.log_start_offset, self.shell.system.clock.monotonic_ms())
            gap_start = max(self.buffer_end, self.tracker.read_offset)
            if msg.log_start_offset > gap_start:
                self.buffer_end, self.gap_end = gap_start, msg.log_start_offset
            else:
                self.buffer_end = msg.log_start_offset
        elif not msg.frames and msg.gap_end > self.buffer_end:
            self.gap_end = msg.gap_end
            self._compacted_gap = msg.compacted
        for frame in msg.frames:
            publish = INTERNAL_PROTOCOL.decode(frame)
            assert isinstance(publish, Publish)
            if publish.base_offset <= self.buffer_end < publish.base_offset + len(publish.payloads):
                self._buffer(publish)
        self._fill()
        self.dispatch()

    def _room(self) -> bool:
        return self.buffer_end - self.tracker.read_offset < self.read_ahead_max

    def _buffer(self, publish: Publish) -> None:
        base = publish.base_offset
        keys, attributes = publish.keys, publish.attributes
        start, count = self.buffer_end - base, len(publish.payloads)
        if attributes is not None and self.affinity is not None and not self._chunks_seen:
            self._chunks_seen = any(chunk_of(a) is not None for a in attributes)
        if attributes is not None and self.delayed is None and self._spill_dir is not None \
                and any(a and DELIVER_AT in a for a in attributes):
            self.delayed = self._lane(None)
        if self.tracker.acked_above_count == 0 and self.buffer_end > self.tracker.cursor:
            # Nothing at or above buffer_end is acked yet (the steady state): every record
            # goes in, built in C (zip, then tuple.__new__ per row) rather than in a loop.
            self.records.update(zip(range(base + start, base + count), map(_make_record, zip(
                publish.payloads[start:], repeat(None) if keys is None else keys[start:],
                repeat(None) if attributes is None else attributes[start:], publish.publish_times[start:],
                repeat(publish.producer_id), repeat(publish.producer_name), repeat(publish.schema_id),
                repeat(publish.schema_version), strict=False)), strict=True))
            self.buffer_end = base + count
            return
        for i in range(start, count):
            offset = base + i
            if not self.tracker.is_acked(offset):
                self.records[offset] = _new(_Record, (
                    publish.payloads[i], None if keys is None else keys[i],
                    None if attributes is None else attributes[i], publish.publish_times[i], publish.producer_id,
                    publish.producer_name, publish.schema_id, publish.schema_version))
        self.buffer_end = base + len(publish.payloads)

    def _cross_gap(self) -> bool:
        """Past the gap at `buffer_end` once every record before it is delivered (the
        tracker settles its offsets, never held, as acknowledged)."""
        if self.gap_end <= self.buffer_end:
            self.gap_end = 0
            return True
        if self.tracker.read_offset != self.buffer_end or not self.tracker.skip_gap(
                self.buffer_end, self.gap_end, self.shell.system.clock.monotonic_ms()):
            return False
        if not self._compacted_gap:
            log.warning("%s:%s: offsets %d..%d are not in the log (reserved by a broker that died before storing"
                        " them, or deleted); skipped", self.topic, self.subscription, self.buffer_end, self.gap_end - 1)
        self.buffer_end, self.gap_end = self.gap_end, 0
        self._persist()
        return True

    def _fill(self) -> None:
        if self.delayed is not None and (request := self.delayed.read_request(self.subscription)) is not None \
                and not self.shell.system.tell(self.shell.topic_endpoint, request):
            self.delayed.reading = self.delayed.scanning = False  # a full mailbox: asked again at the next fill
        if self.gap_end and not self._cross_gap():
            return
        if not self.reading and self.buffer_end < self.head and self._room():
            self.reading = self.shell.system.tell(self.shell.topic_endpoint, ReadRequest(
                subscription=self.subscription, start_offset=self.buffer_end, max_bytes=_READ_BYTES_MAX,
                compacted=self.read_compacted))

    # ------------------------------------------------------------- dispatch
    def dispatch(self) -> None:
        self._dispatch()
        while self._too_large:
            # Detached after the pass, which holds the consumers' capacities; their
            # deliveries go back to the tracker (`consumer_left`).
            consumer_id, reason = self._too_large.popitem()
            log.error("subscription %r: consumer %d detached: %s", self.subscription, consumer_id, reason)
            self.shell.detach(consumer_id, reason=reason)
        # Ticks (ack timeouts, due redeliveries, poison, cursor flushes) are armed here, after
        # whatever changed the tracker: every path that does ends in a dispatch (or in
        # `consumer_left`, `read_result`).
        self._arm_tick()
        if self.delayed is not None:
            self._arm_delayed()

    def _arm_delayed(self) -> None:
        """A `DelayedDue` for the earliest delayed message, unless one is armed as early."""
        assert self.delayed is not None
        at = self.delayed.next_time()
        if at is None or (self._delayed_timer is not None and self._delayed_timer <= at):
            return
        self._delayed_timer = at
        self.shell.system.schedule_once(self.shell.endpoint, max(1, at - self.shell.system.clock.now_ms()),
                                        DelayedDue())

    def delayed_due(self) -> None:
        self._delayed_timer = None
        self.dispatch()

    def _dispatch(self) -> None:
        now = self.shell.system.clock.monotonic_ms()
        capacity = self._capacity()
        if not capacity:
            return
        lane = self.delayed
        if lane is not None:
            lane.dispatch(now, self.shell.system.clock.now_ms(), capacity, self.rule,
                          self.sub_type == cp.SubType.KEY_SHARED, self._send_released)
            if not capacity:
                return self._fill()
        due = self.tracker.due(now, sum(capacity.values()))
        if due:
            # A resumed subscription's holes (unacked below acks it kept) are due at once,
            # before the read-ahead holds them: they go out when their records come.
            offsets = [d.offset for d in due if d.offset in self.records]
            counts = {d.offset: d.redelivery_count for d in due}
            taken = self._assign(offsets, capacity, counts, now) if offsets else set()
            left = [d.offset for d in due if d.offset not in taken]
            if left:
                self.tracker.requeue(left, now)
        while capacity and self.tracker.may_deliver_new():
            limit = min(sum(capacity.values()), self.tracker.new_allowance())
            # The buffered offsets from the read offset on (acked ones are not buffered).
            offsets = list(islice(filter(self.records.__contains__, range(self.tracker.read_offset, self.buffer_end)),
                                  limit))
            full = False
            if lane is not None and offsets:
                offsets, full = self._defer(lane, offsets, now)
                if not offsets and not full:
                    continue
            if not offsets or not self._assign(offsets, capacity, None, now) or full:
                break
        self._fill()

    def _defer(self, lane: DelayedLane, offsets: list[int], now: int) -> tuple[list[int], bool]:
        """Delayed messages among new `offsets` go to the lane, settled here (`delayed.py`,
        step 1); returns the others and whether the lane is full."""
        offsets, deferred, full = lane.defer(offsets, self.records, self.shell.system.clock.now_ms())
        if deferred:
            self.tracker.skip(deferred, now)
            for offset in deferred:
                del self.records[offset]
        return offsets, full

    def _send_released(self, consumer_id: int, offsets: list[int], counts: dict[int, int] | None,
                       records: dict[int, _Record]) -> None:
        self._send_records(self.shell.consumers[consumer_id], offsets, counts, records)

    def _capacity(self) -> dict[int, int]:
        lane = self.delayed
        return self.shell.rate_capped({
            cid: room for cid, c in self.shell.consumers.items()
            if not c.paused and (room := min(c.permits, self.window - self.tracker.in_flight_count(cid)
                                             - (lane.in_flight(cid) if lane is not None else 0))) > 0
        })

    def _assign(self, offsets: list[int], capacity: dict[int, int], counts: dict[int, int] | None,
                now: int) -> set[int]:
        """Give `offsets` to consumers within `capacity`; returns the offsets sent (or
        settled). New offsets nobody could take stay behind: those below the read offset
        become holes the tracker hands out again through `due`."""
        if self._chunks_seen:
            return self._assign_chunks(offsets, capacity, counts, now)
        keys = [self._key(o) for o in offsets] if self.sub_type == cp.SubType.KEY_SHARED else None
        assignment = self.rule.assign(len(offsets), keys, "", capacity)
        if counts is None and len(assignment.slices) == 1 and not assignment.skipped:
            # New offsets (ascending) to one consumer: one run, nothing to sort.
            (part,) = assignment.slices
            run = offsets if len(part.indices) == len(offsets) else [offsets[i] for i in part.indices]
            cid = part.consumer_id
            self.tracker.delivered(cid, run, now)
            capacity[cid] -= len(run)
            if capacity[cid] <= 0:
                del capacity[cid]
            self._send_records(self.shell.consumers[cid], run, None)
            return set(run)
        owner: dict[int, int] = {}
        for part in assignment.slices:
            for i in part.indices:
                owner[offsets[i]] = part.consumer_id
        return self._deliver_owned(owner, [offsets[i] for i in assignment.skipped], capacity, counts, now)

    def _assign_chunks(self, offsets: list[int], capacity: dict[int, int], counts: dict[int, int] | None,
                       now: int) -> set[int]:
        """Shared, with chunks about: chunks of a message a consumer holds go to it (within
        its capacity, else they wait), the rule deals the rest, and the chunks following
        a first chunk dealt now go where it went (`dispatch/chunks.py`)."""
        affinity = self.affinity
        assert affinity is not None
        chunks = [chunk_of(self.records[o].attributes) for o in offsets]
        plan = affinity.plan(chunks)
        room = dict(capacity)
        owner: dict[int, int] = {}
        for i, cid in plan.owned:
            if room.get(cid, 0) > 0:
                owner[offsets[i]] = cid
                room[cid] -= 1
        room = {cid: n for cid, n in room.items() if n > 0}
        assignment = self.rule.assign(len(plan.dealt), None, "", room)
        for part in assignment.slices:
            for j in part.indices:
                i = plan.dealt[j]
                owner[offsets[i]] = part.consumer_id
                room[part.consumer_id] -= 1
                if (chunk := chunks[i]) is not None:
                    affinity.take(chunk.message, part.consumer_id)
        for i, message in plan.following:
            cid = affinity.owner(message)
            if cid is not None and room.get(cid, 0) > 0:
                owner[offsets[i]] = cid
                room[cid] -= 1
        affinity.delivered(chunks[i] for i, o in enumerate(offsets) if o in owner and chunks[i] is not None)
        return self._deliver_owned(owner, [], capacity, counts, now)

    def _deliver_owned(self, owner: dict[int, int], skipped: list[int], capacity: dict[int, int],
                       counts: dict[int, int] | None, now: int) -> set[int]:
        """Record and send the deliveries `owner` (offset -> consumer) names, in ascending
        offset order, one run per consumer at a time; settle `skipped`."""
        if skipped:
            # Key-Shared: no consumer's filters accept these keys; settled for this subscription.
            self.tracker.skip(skipped, now)
            for offset in skipped:
                self.records.pop(offset, None)
            self.shell.dropped_messages += len(skipped)
        # Record deliveries in ascending offset order, one run per consumer at a time.
        runs: list[tuple[int, list[int]]] = []
        for offset in sorted(owner):
            cid = owner[offset]
            if runs and runs[-1][0] == cid:
                runs[-1][1].append(offset)
            else:
                runs.append((cid, [offset]))
        for cid, run in runs:
            self.tracker.delivered(cid, run, now)
            capacity[cid] -= len(run)
            if capacity[cid] <= 0:
                del capacity[cid]
            self._send_records(self.shell.consumers[cid], run, counts)
        return set(owner).union(skipped)

    def _key(self, offset: int) -> str:
        record = self.records[offset]
        return record.key if record.key is not None else record.producer_name

    def _send_records(self, consumer: Consumer, offsets: list[int], counts: dict[int, int] | None,
                      held: dict[int, _Record] | None = None) -> None:
        """One `Deliver` per run of offsets from one producer and schema version with one
        redelivery count, cut where it would outgrow a frame: a run gathers records of many
        publishes, and a frame over the client's ZMQ_MAXMSGSIZE is dropped whole."""
        if consumer.consumer_id in self._too_large:
            return
        records = list(map((self.records if held is None else held).__getitem__, offsets))
        keys = map(_run_key, records) if counts is None else zip(map(_run_key, records), map(counts.__getitem__, offsets),
                                                                strict=True)
        budget = self.config.limits.frame_bytes_max - ENVELOPE_BYTES_MAX
        start = 0
        for key, group in groupby(keys):
            end = start + sum(1 for _ in group)
            count = key[1] if counts is not None else 0
            for cut_start, cut_end in _cuts(records, start, end, budget):
                if consumer.consumer_id in self._too_large:
                    return
                self._deliver_run(consumer, offsets[cut_start:cut_end], records[cut_start:cut_end], count)
            start = end

    def _deliver_run(self, consumer: Consumer, run: list[int], records: list[_Record], count: int) -> None:
        first = records[0]
        keys = [r.key for r in records]
        attributes = [r.attributes for r in records]
        contiguous = run[-1] - run[0] + 1 == len(run)
        deliver = cp.Deliver(
            consumer_id=consumer.consumer_id, topic=self.topic, producer_id=first.producer_id,
            producer_name=first.producer_name, base_offset=run[0], payloads=[r.payload for r in records],
            publish_times=[r.publish_time for r in records],
            keys=keys if any(k is not None for k in keys) else None,
            attributes=attributes if any(attributes) else None,
            offsets=None if contiguous else run, redelivery_count=count,
            schema_id=first.schema_id, schema_version=first.schema_version)
        frame = cp.CLIENT_PROTOCOL.encode(deliver)
        if len(frame) > self.config.limits.frame_bytes_max + ENVELOPE_BYTES_MAX:
            # A record stored while the limits were higher: no client takes the frame (its
            # ZMQ_MAXMSGSIZE resets the connection, again at every redelivery). Its consumer
            # is told why, after this dispatch pass; the record stays for a raised limit.
            self._too_large.setdefault(consumer.consumer_id, (
                f"message at offset {run[0]} of {self.topic} is {len(records[0].payload)} bytes, a frame of"
                f" {len(frame)} over what a client takes (limits.frame_bytes_max {self.config.limits.frame_bytes_max}"
                f" + 1 MiB): raise limits.frame_bytes_max to read it"))
            return
        consumer.permits -= len(run)
        self.shell.dispatched(len(run))
        if self.shell.system.push_frames(OUTBOX, [consumer.identity, frame]):
            self.shell.delivered_messages += len(run)
            self.shell.out_metric.inc(len(run))
            if not count:  # a first delivery (as the rule's: one observation a frame, see there)
                age_ms = self.shell.system.clock.now_ms() - first.publish_time
                self.shell.e2e_metric.observe_many(age_ms / 1000 if age_ms > 0 else 0.0, len(run))
        # A frame the gateway could not take is redelivered after the ack timeout.
        if count:
            self.redeliveries += len(run)

    def refused(self, consumer: Consumer, offsets: list[int]) -> None:
        """Given back to the tracker: delivered again."""
        self.shell.delivered_messages -= len(offsets)
        consumer.permits += len(offsets)  # the client never saw them: it gives no permits back for them
        now = self.shell.system.clock.monotonic_ms()
        if self.delayed is not None:
            offsets = self.delayed.refused(consumer.consumer_id, offsets, now)
        self.tracker.undeliver(consumer.consumer_id, offsets, now)
        self.dispatch()

    # ------------------------------------------------------------- consumers
    def ack(self, consumer: Consumer, msg: cp.Ack) -> Message:
        offsets = msg.offsets
        if self.delayed is not None and self.delayed.holds(offsets):
            offsets = self.delayed.ack(consumer.consumer_id, offsets)
        cursor = self.tracker.ack(consumer.consumer_id, offsets)
        pop = self.records.pop
        if offsets and max(offsets) <= cursor:
            deque(map(pop, offsets, repeat(None)), maxlen=0)  # acks in order (the steady state): a loop in C
        else:
            for offset in offsets:
                if offset <= cursor or self.tracker.is_acked(offset):
                    pop(offset, None)
        self.dispatch()
        return Ok(request_id=msg.request_id)

    def nack(self, consumer: Consumer, msg: cp.Nack) -> Message:
        now, offsets = self.shell.system.clock.monotonic_ms(), msg.offsets
        if self.delayed is not None and self.delayed.holds(offsets):
            offsets = self.delayed.nack(consumer.consumer_id, offsets, now, msg.delay_ms)
        self.tracker.nack(consumer.consumer_id, offsets, now, msg.delay_ms)
        self.dispatch()
        return Ok(request_id=msg.request_id)

    # ------------------------------------------------------------- time
    def _arm_tick(self) -> None:
        tracker, lane = self.tracker, self.delayed
        if self._tick_armed or (
            tracker.settled() and (tracker.cursor, tracker.acked_above_count) == self._persisted_mark
            and (lane is None or (lane.settled() and lane.changes == self._persisted_changes))
        ):
            return
        self._tick_armed = True
        self.shell.system.schedule_once(self.shell.endpoint, self._tick_ms, Tick())

    def tick(self) -> None:
        self._tick_armed = False
        now = self.shell.system.clock.monotonic_ms()
        self.tracker.expire(now)
        if self.delayed is not None:
            self.delayed.tracker.expire(now)
        self._handle_poison(now)
        self._dispatch()
        self._persist()
        self._arm_tick()

    def _handle_poison(self, now: int) -> None:
        self._poison(self.tracker.poisoned(now), self.records, self.tracker.dead_lettered)
        if self.delayed is not None:
            self._poison(self.delayed.poisoned(now), self.delayed.records, self.delayed.dead_lettered)

    def _poison(self, poisoned: list[Poisoned], records: dict[int, _Record],
                dead_lettered: Callable[[int], object]) -> None:
        if not poisoned:
            return
        letters = []
        for item in poisoned:
            record = records.get(item.offset)
            if item.action == "block":
                log.error("%s:%s: offset %d failed %d deliveries; the subscription is blocked there (poison policy"
                          " block)", self.topic, self.subscription, item.offset, item.attempts)
            elif item.action == "drop":
                log.warning("%s:%s: offset %d dropped after %d deliveries", self.topic, self.subscription,
                            item.offset, item.attempts)
                records.pop(item.offset, None)
                self.shell.dropped_messages += 1
            elif record is not None:
                letters.append((item, record))
        if letters:
            self.shell.system.tell(self.shell.broker_endpoint, DeadLetter(
                topic=self.policy.dead_letter_topic or "",
                payloads=[r.payload for _, r in letters], publish_times=[r.publish_time for _, r in letters],
                keys=[r.key for _, r in letters],
                attributes=[{**(r.attributes or {}), "x-original-topic": self.topic,
                             "x-original-subscription": self.subscription, "x-original-offset": str(item.offset),
                             "x-original-producer-id": str(r.producer_id), "x-delivery-attempt": str(item.attempts),
                             "x-poison-policy": "dead_letter",
                             "x-failure-reason": "max_redelivery_count reached"} for item, r in letters]))
            for item, _ in letters:
                dead_lettered(item.offset)
                records.pop(item.offset, None)
                self.dead_lettered += 1

    def _persist(self, *, force: bool = False) -> None:
        state = self.tracker.snapshot()
        current = (state.cursor, tuple(state.acked_above))
        changes = self.delayed.changes if self.delayed is not None else 0
        if (current == self.persisted and changes == self._persisted_changes and not force) or not self.durable:
            return
        # The topic needs every subscription's cursor for retention.
        self.shell.system.tell(self.shell.topic_endpoint, SubscriptionCursor(subscription=self.subscription,
                                                                             cursor=self._retained_below()))
        if self.shell.system.tell(self.shell.cursor_endpoint, self._cursor_record(state)):
            self.persisted = current
            self._persisted_changes = changes
            self._persisted_mark = (state.cursor, len(state.acked_above))

    def _cursor_record(self, state: CursorState | None = None) -> PersistCursor:
        """What the broker stores for this subscription: cursor, acks above it, and the
        failure policy when an admin set one."""
        state = state or self.tracker.snapshot()
        return PersistCursor(
            topic=self.topic, subscription=self.subscription, sub_type=self.sub_type, cursor=state.cursor,
            acked_above=list(state.acked_above),
            policy=failure_policy_state(self.policy) if self.policy_explicit else None,
            max_unacked_messages=self.window if self.window_explicit else None, seeks=self.seeks,
            delayed=self.delayed.state() if self.delayed is not None else None)

    # ------------------------------------------------------------- seek
    def seek(self, consumer: Consumer, msg: cp.Seek) -> None:
        # The topic holds the log: it turns a publish time into an offset and checks the
        # range, then tells `SeekTo`, which answers the client.
        if not self.shell.system.tell(self.shell.topic_endpoint, ResolveSeek(
                subscription=self.subscription, identity=consumer.identity, request_id=msg.request_id,
                offset=msg.offset, publish_time=msg.publish_time)):
            raise ResourceExhausted(f"topic {self.topic} is busy (full mailbox); retry the seek")

    def seek_to(self, msg: SeekTo) -> Message:
        """Restart delivery at `msg.offset` (checked by the topic against its log).

        Everything below counts as consumed, everything from it on is delivered again;
        deliveries in flight, redeliveries, poisonings and a block are forgotten (acks
        for them are then ignored, or count for a redelivery of the same offset). The
        consumers stay attached: each first gets `SeekReset` so that it drops what it
        had received and not yet processed, then `Ok` goes to the client that asked,
        then deliveries from the new position, in that order on every connection.
        """
        offset = msg.offset
        log.info("%s:%s: seek to offset %d (cursor was %d)", self.topic, self.subscription, offset,
                 self.tracker.cursor)
        self.tracker.seek(offset)
        self.records.clear()
        if self.delayed is not None:
            self.delayed.reset()
        self.gap_end = 0
        # A read in flight answers for another start offset and is dropped (`handle_ReadResult`),
        # unless it starts exactly here, when its records are the right ones.
        self.buffer_end = offset
        self.head = max(self.head, offset)
        self.seeks += 1
        for consumer in self.shell.consumers.values():
            reset = cp.SeekReset(consumer_id=consumer.consumer_id, offset=offset)
            self.shell.system.push_frames(OUTBOX, [consumer.identity, cp.CLIENT_PROTOCOL.encode(reset)])
        if msg.identity is not None:
            reply_client(self.shell.system, msg.identity, Ok(request_id=msg.request_id))
        self._persist(force=True)
        self._fill()
        self.dispatch()
        return self._cursor_record()

    def expire_below(self, end: int) -> None:
        """The topic's message TTL ran out below `end`: every message there counts as
        acknowledged (deliveries in flight too: their acks are then ignored), delayed
        ones held or released too."""
        now = self.shell.system.clock.monotonic_ms()
        expired = self.tracker.expire_below(end, now)
        if self.delayed is not None:
            expired += self.delayed.expire_below(end, now)
        if not expired:
            return
        for offset in [o for o in self.records if o < end]:
            del self.records[offset]
        if self.buffer_end < end:
            # A read in flight from below answers for another start and is dropped.
            self.buffer_end = end
            if self.gap_end <= end:
                self.gap_end = 0
        METRICS.messages_expired.labels(topic=self.topic, subscription=self.subscription).inc(expired)
        # DEBUG: with a steady stream every check expires some; the metric counts them.
        log.debug("%s:%s: %d messages below offset %d expired (message_ttl_s)", self.topic, self.subscription,
                  expired, end)
        self._persist()
        self.dispatch()

    # ------------------------------------------------------------- failure policy
    def set_policy(self, msg: SetSubscriptionPolicy) -> Message:
        """Apply an admin's failure policy from now on; answers the record to persist."""
        policy = failure_policy_from_state(msg.policy)
        now = self.shell.system.clock.monotonic_ms()
        self.tracker.set_policy(policy, now)
        self.policy = policy
        self.policy_explicit = True
        log.info("%s:%s: failure policy set to %s", self.topic, self.subscription, policy)
        self._handle_poison(now)  # a lower max_redelivery_count may poison waiting messages now
        self.dispatch()
        return self._cursor_record()

    def get_policy(self) -> Message:
        return SubscriptionPolicy(policy=failure_policy_state(self.policy), explicit=self.policy_explicit)

    # ------------------------------------------------------------- dispatch window
    def set_window(self, msg: SetSubscriptionDispatchConfig) -> Message:
        """Apply an admin's window at once; answers the record to persist. Deliveries in
        flight stay: a consumer above a smaller window gets nothing new until its acks
        bring it under; a larger one lets dispatch go on now."""
        self.window = check_max_unacked_messages(msg.max_unacked_messages)
        self.window_explicit = True
        self.read_ahead_max = 2 * self.window
        log.info("%s:%s: dispatch window set to %d unacked messages per consumer", self.topic, self.subscription,
                 self.window)
        self._fill()
        self.dispatch()
        return self._cursor_record()

    def get_window(self) -> Message:
        return SubscriptionDispatchConfig(max_unacked_messages=self.window, explicit=self.window_explicit)

    # ------------------------------------------------------------- admin
    def describe_cut(self) -> Message:
        state, t = self.tracker.snapshot(), self.tracker.statistics()
        return SubscriptionCut(state=SubscriptionCutState(
            name=self.subscription, sub_type=self.sub_type, cursor=state.cursor, acked_above=list(state.acked_above),
            unacked=t.in_flight, consumers=sorted(c.name for c in self.shell.consumers.values()),
            backlog_messages=self.tracker.backlog(self.head)))

    def info(self) -> dict[str, int | None]:
        t = self.tracker.statistics()
        backlog = self.tracker.backlog(self.head)
        lane = self.delayed
        return {"pending_messages": backlog, "cursor": t.cursor, "backlog_messages": backlog,
                "unacked_messages": t.in_flight + (lane.tracker.statistics().in_flight if lane is not None else 0),
                "redeliveries": t.redeliveries_total, "blocked_offset": t.blocked_offset,
                "delayed_messages": len(lane) if lane is not None else 0}

    def sample(self) -> DeliverySample:
        t = self.tracker.statistics()
        return DeliverySample(backlog_messages=self.tracker.backlog(self.head), pending_bytes=None, cursor=t.cursor,
                              lag_messages=max(0, self.head - t.read_offset), unacked_messages=t.in_flight,
                              redeliveries=t.redeliveries_total, dead_lettered=self.dead_lettered,
                              delayed_messages=len(self.delayed) if self.delayed is not None else 0,
                              oldest_publish_ms=oldest.publish_time if (oldest := self.records.get(t.cursor + 1))
                              else None)


def _settings(name: str, config: BrokerConfig, policy: FailurePolicyState | None,
              max_unacked_messages: int | None) -> tuple[FailurePolicy, bool, int, bool]:
    """A subscription's failure policy and dispatch window, each with whether an admin
    set it: the persisted ones, else (absent or invalid) the broker's defaults."""
    reliable = config.reliable
    resolved = FailurePolicy(
        max_redelivery_count=reliable.max_redelivery_count, ack_timeout_ms=reliable.ack_timeout_ms,
        base_redelivery_delay_ms=reliable.base_redelivery_delay_ms,
        max_redelivery_delay_ms=reliable.max_redelivery_delay_ms, backoff=reliable.backoff,
        poison_policy=reliable.poison_policy, dead_letter_topic=reliable.dead_letter_topic)
    window = reliable.max_unacked_messages
    policy_explicit = window_explicit = False
    if policy is not None:
        try:
            resolved, policy_explicit = failure_policy_from_state(policy), True
        except InvalidArgument as exc:
            log.error("%s: the persisted failure policy is invalid (%s); the broker's defaults apply", name,
                      exc.message)
    if max_unacked_messages is not None:
        try:
            window, window_explicit = check_max_unacked_messages(max_unacked_messages), True
        except InvalidArgument as exc:
            log.error("%s: the persisted dispatch window is invalid (%s); the broker's default applies", name,
                      exc.message)
    return resolved, policy_explicit, window, window_explicit


# An admin-set policy stays within the ranges the broker config allows for the
# `reliable:` defaults (STYLE 8): name -> (minimum, maximum).
_POLICY_RANGES = {
    "max_redelivery_count": (0, 1000),
    "ack_timeout_ms": (10, 86_400_000),
    "base_redelivery_delay_ms": (0, 86_400_000),
    "max_redelivery_delay_ms": (0, 86_400_000),
}


def failure_policy_from_state(state: FailurePolicyState) -> FailurePolicy:
    """Check a failure policy from an admin (or the catalog); INVALID_ARGUMENT names the field.

    `FailurePolicy`'s own rules, the ranges of the config's `reliable:` section, and a
    valid topic name for `dead_letter_topic` ("" counts as none).
    """
    policy = FailurePolicy(
        max_redelivery_count=state.max_redelivery_count, ack_timeout_ms=state.ack_timeout_ms,
        base_redelivery_delay_ms=state.base_redelivery_delay_ms, max_redelivery_delay_ms=state.max_redelivery_delay_ms,
        backoff=state.backoff, poison_policy=state.poison_policy, dead_letter_topic=state.dead_letter_topic or None)
    for name, (minimum, maximum) in _POLICY_RANGES.items():
        value = getattr(policy, name)
        if not minimum <= value <= maximum:
            raise InvalidArgument(f"{name} must be {minimum}..{maximum}, not {value}")
    if policy.dead_letter_topic is not None:
        try:
            parse_topic(policy.dead_letter_topic)
        except DanubeError as exc:
            raise InvalidArgument(f"dead_letter_topic: {exc.message}") from None
    return policy


# The same range the broker config allows for `reliable.max_unacked_messages`.
MAX_UNACKED_MESSAGES_RANGE = (1, 10_000)


def check_max_unacked_messages(value: int) -> int:
    """An admin's (or the catalog's) window, checked; INVALID_ARGUMENT names the field."""
    minimum, maximum = MAX_UNACKED_MESSAGES_RANGE
    if type(value) is not int or not minimum <= value <= maximum:
        raise InvalidArgument(f"max_unacked_messages must be {minimum}..{maximum}, not {value}")
    return value


def failure_policy_state(policy: FailurePolicy) -> FailurePolicyState:
    return FailurePolicyState(
        max_redelivery_count=policy.max_redelivery_count, ack_timeout_ms=policy.ack_timeout_ms,
        base_redelivery_delay_ms=policy.base_redelivery_delay_ms,
        max_redelivery_delay_ms=policy.max_redelivery_delay_ms, backoff=policy.backoff,
        poison_policy=policy.poison_policy, dead_letter_topic=policy.dead_letter_topic)

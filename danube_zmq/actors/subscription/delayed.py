"""Delayed delivery on reliable Shared and Key-Shared subscriptions (`DelayedLane`):
Pulsar's `deliverAfter` / `deliverAt`. A message carries its time in the attribute
`__deliver_at` (`client_protocol.DELIVER_AT`, ms since the epoch by the broker's clock);
Exclusive and Failover subscriptions deliver it at once, as Pulsar's do.

1. Deferring: when the subscription's read offset reaches a message with a time, it goes
   out at once if (time, offset) is at or below the release mark (`mark`); otherwise its
   (time, offset) goes into the index (`dispatch/delayed_index.py`: sorted runs spilled
   to files past `reliable.delayed_memory_entries`) and the delivery tracker settles its
   offset, so that the cursor moves past it and new messages keep flowing. Past
   `reliable.delayed_messages_max` held, the subscription stops reading on until some
   are due (backpressure, as a full window).
2. Releasing: a timer message at the index's earliest time (`DelayedDue`, armed for
   that millisecond: well within 100 ms, where Pulsar ticks every second) moves the due
   entries to the lane's own `DeliveryTracker`, numbered in release order, and the mark
   to the last of them. Their records are read again from the log (`READ_DELAYED_DUE`)
   and delivered before new messages; acks, nacks, ack timeouts, redelivery and the
   poison policy work on them as on any message. At most `_RELEASED_MAX` released
   messages wait for their acks; past it releases wait.
3. Persisted with the cursor (`DelayedState`): the mark, the lowest offset the lane still
   needs (`low`) and the released offsets not yet acknowledged. The index itself is not
   persisted: the log holds every message, so a (re)start rebuilds it by reading the log
   once from `low` (`READ_DELAYED_SCAN`), taking the time-marked messages above the mark
   that the cursor had settled and that are not among the released ones. A restart,
   kill -9 or a move (the log and the cursor go with the topic) loses no delayed message;
   a release or an ack newer than the persisted cursor is delivered again, as any
   message is (at least once). While the scan runs nothing is released: the mark stays.
4. Retention keeps the log from `low`: the subscription reports min(cursor, low - 1) as
   its cursor to its topic.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from danube_zmq.actors.dispatch.delayed_index import DelayedIndex
from danube_zmq.actors.dispatch.rule import DispatchRule
from danube_zmq.actors.dispatch.tracker import DeliveryTracker, FailurePolicy, Poisoned
from danube_zmq.actors.subscription.delayed_spill import FileRunStore
from danube_zmq.actors.subscription.records import Record, record_at
from danube_zmq.config.broker_config import ReliableSection
from danube_zmq.transport.client_protocol import DELIVER_AT
from danube_zmq.transport.internal_protocol import (
    INTERNAL_PROTOCOL,
    READ_DELAYED_DUE,
    READ_DELAYED_SCAN,
    DelayedState,
    Publish,
    ReadRequest,
    ReadResult,
)

__all__ = ["DelayedLane", "deliver_at_of"]

log = logging.getLogger("danube_zmq.subscription")

# The mark's offset once everything due at its time is released.
_ALL = (1 << 63) - 1
_RELEASED_MAX = 10_000
_SEGMENT_ENTRIES = 1_024
_READ_BYTES_MAX = 1 << 20
# Records of held messages due within this long are kept (`prefetch`), up to these bytes:
# a release then needs no read of the log, which would decode a whole read (up to
# _READ_BYTES_MAX) for the few messages due at one millisecond.
_PREFETCH_MS = 2_000
_PREFETCH_BYTES_MAX = 16 << 20

# (consumer id, topic offsets, redelivery count by offset or None for first deliveries,
# the records): the subscription's `Deliver` path.
Send = Callable[[int, list[int], dict[int, int] | None, dict[int, Record]], None]
Tell = Callable[[ReadRequest], bool]


def deliver_at_of(attributes: dict[str, str] | None) -> int | None:
    """A message's delivery time from its attributes; None: none, or one that does not
    read as a non-negative integer (delivered at once)."""
    if not attributes:
        return None
    text = attributes.get(DELIVER_AT)
    if text is None:
        return None
    try:
        value = int(text)
    except ValueError:
        return None
    return value if value >= 0 else None


class DelayedLane:
    def __init__(self, *, topic: str, subscription: str, policy: FailurePolicy, config: ReliableSection,
                 spill_dir: Path, state: DelayedState | None, settled: Callable[[int], bool] | None = None,
                 scan_end: int = 0, records_max: int = 2_000) -> None:
        """`state`: what was persisted; `settled(offset)` and `scan_end`: which offsets
        the resumed cursor had settled, below `scan_end`, for the scan (step 3)."""
        self.topic, self.subscription = topic, subscription
        self.held_max = config.delayed_messages_max
        # The index clears the runs of an earlier turn: it is rebuilt from the log (step 3).
        self.index = DelayedIndex(store=FileRunStore(spill_dir), entries_max=self.held_max,
                                  open_entries_max=config.delayed_memory_entries, segment_entries=_SEGMENT_ENTRIES)
        self.mark = (state.released_ms, state.released_offset) if state is not None else (-1, -1)
        self.tracker = DeliveryTracker(cursor=-1, read_offset=0, policy=policy, acked_above_max=_RELEASED_MAX)
        self.offset_of: dict[int, int] = {}  # release number -> offset, until settled
        self.number_of: dict[int, int] = {}  # offset -> release number
        self.records: dict[int, Record] = {}  # offset -> record, of released messages
        self.unread: set[int] = set()  # released offsets whose record is still to be read
        self.prefetch: dict[int, tuple[int, Record]] = {}  # offset -> (time, record) of held ones due soon
        self.prefetch_bytes = 0
        self.records_max = records_max
        self.next_number = 0
        self.reading = False  # a READ_DELAYED_DUE in flight
        self.scanning = False  # a READ_DELAYED_SCAN in flight
        self.scan: tuple[int, int] | None = None  # [next offset, end) of the log to scan
        self._settled = settled
        self._over = False  # a scan found more than `held_max` (logged once)
        # The index's `low_offset` (O(entries in memory)), known until the index changes.
        self._index_low: int | None = None
        self._index_low_known = False
        self.changes = 0  # moves whenever the state to persist changes
        if state is not None:
            for offset in state.unacked:
                self._release(offset)
            if state.low is not None and state.low < scan_end:
                self.scan = (state.low, scan_end)
                log.info("%s:%s: rebuilding the delayed-message index from offsets %d..%d of the log", topic,
                         subscription, state.low, scan_end - 1)

    # ------------------------------------------------------------- state
    def __len__(self) -> int:
        """Delayed messages held, not yet due (those a scan has yet to find aside)."""
        return len(self.index)

    def state(self) -> DelayedState:
        if not self._index_low_known:
            self._index_low, self._index_low_known = self.index.low_offset(), True
        lows = [offset for offset in (self._index_low, self.scan[0] if self.scan else None) if offset is not None]
        if self.offset_of:
            lows.append(min(self.offset_of.values()))
        return DelayedState(released_ms=self.mark[0], released_offset=self.mark[1], low=min(lows, default=None),
                            unacked=[self.offset_of[n] for n in sorted(self.offset_of)])

    def low(self) -> int | None:
        return self.state().low

    def settled(self) -> bool:
        """No delivery of a released message to watch (ack deadline, redelivery)."""
        return self.tracker.settled()

    def in_flight(self, consumer_id: int) -> int:
        return self.tracker.in_flight_count(consumer_id)

    def holds(self, offsets: list[int]) -> bool:
        return bool(self.number_of) and not self.number_of.keys().isdisjoint(offsets)

    # ------------------------------------------------------------- deferring (step 1)
    def defer(self, offsets: list[int], records: dict[int, Record], wall_ms: int) -> tuple[list[int], list[int], bool]:
        """Of new `offsets` (ascending, records held), those to deliver now, those deferred
        into the index (the caller settles them), and whether the index is full at the
        next one (nothing from it on may go out yet). `wall_ms`: the broker's clock."""
        self.advance(wall_ms)
        keep: list[int] = []
        deferred: list[int] = []
        mark = self.mark
        for offset in offsets:
            at = deliver_at_of(records[offset].attributes)
            if at is None or (at, offset) <= mark:
                keep.append(offset)
            elif len(self.index) >= self.held_max:
                return keep, deferred, True
            else:
                self.index.add(at, offset)
                self._index_low_known = False
                self._keep_ahead(offset, at, records[offset], wall_ms)
                deferred.append(offset)
        if deferred:
            self.changes += 1
        return keep, deferred, False

    # ------------------------------------------------------------- releasing (step 2)
    def advance(self, wall_ms: int) -> None:
        """Release what is due at `wall_ms` (the broker's clock), as far as `_RELEASED_MAX`
        allows."""
        if self.scan is not None:
            return
        room = _RELEASED_MAX - (self.next_number - self.tracker.cursor - 1)
        due = self.index.pop_due(wall_ms, room) if room > 0 else []
        if due:
            self._index_low_known = False
        for _, offset in due:
            self._release(offset)
        if due:
            self.mark = due[-1]
            self.changes += 1
        following = self.index.next_due()
        if (following is None or following[0] > wall_ms) and (wall_ms, _ALL) > self.mark:
            # Persisted with the next change: any message judged by this mark was judged
            # at or below the mark persisted with the cursor that covers it.
            self.mark = (wall_ms, _ALL)

    def next_time(self) -> int | None:
        """When the next release is due (None: nothing to wait for by time)."""
        following = self.index.next_due()
        if following is None or self.scan is not None:
            return None
        if self.next_number - self.tracker.cursor - 1 >= _RELEASED_MAX:
            return None  # releases wait for acks, which dispatch again
        return following[0]

    def _release(self, offset: int) -> None:
        number = self.next_number
        self.next_number += 1
        self.offset_of[number] = offset
        self.number_of[offset] = number
        kept = self.prefetch.pop(offset, None)
        if kept is not None:
            self.records[offset] = kept[1]
            self.prefetch_bytes -= len(kept[1].payload)
        else:
            self.unread.add(offset)

    def _keep_ahead(self, offset: int, at: int, record: Record, wall_ms: int) -> None:
        if at > wall_ms + _PREFETCH_MS or offset in self.prefetch:
            return
        if self.prefetch_bytes + len(record.payload) > _PREFETCH_BYTES_MAX:
            # Full: what is no longer held (settled by a TTL, a seek) goes first.
            mark = self.mark
            for stale in [o for o, (t, _) in self.prefetch.items() if (t, o) <= mark]:
                self.prefetch_bytes -= len(self.prefetch.pop(stale)[1].payload)
            if self.prefetch_bytes + len(record.payload) > _PREFETCH_BYTES_MAX:
                return
        self.prefetch[offset] = (at, record)
        self.prefetch_bytes += len(record.payload)

    def dispatch(self, now_ms: int, wall_ms: int, capacity: dict[int, int], rule: DispatchRule, key_shared: bool,
                 send: Send) -> None:
        """Deliver released messages within `capacity` (taken from it): redeliveries
        first, then first deliveries in release order. `now_ms`: the monotonic clock of
        ack deadlines; `wall_ms`: the broker's clock of delivery times."""
        self.advance(wall_ms)
        tracker = self.tracker
        if not capacity or not self.offset_of:
            return
        due = tracker.due(now_ms, sum(capacity.values()))
        if due:
            # Due numbers whose record is read; the others wait for it (`read_request`).
            numbers = [d.offset for d in due if self.offset_of[d.offset] in self.records]
            counts = {d.offset: d.redelivery_count for d in due}
            taken = self._deal(numbers, counts, now_ms, capacity, rule, key_shared, send)
            left = [d.offset for d in due if d.offset not in taken]
            if left:
                tracker.requeue(left, now_ms)
        if capacity and tracker.may_deliver_new():
            limit = min(sum(capacity.values()), tracker.new_allowance())
            new = []
            for number in range(tracker.read_offset, self.next_number):
                if len(new) >= limit:
                    break
                # One whose record is not read yet is passed over: the tracker keeps it
                # as a hole, delivered through `due` once its record is here.
                if self.offset_of.get(number) in self.records:
                    new.append(number)
            self._deal(new, None, now_ms, capacity, rule, key_shared, send)

    def _deal(self, numbers: list[int], counts: dict[int, int] | None, now_ms: int, capacity: dict[int, int],
              rule: DispatchRule, key_shared: bool, send: Send) -> set[int]:
        if not numbers or not capacity:
            return set()
        offsets = [self.offset_of[n] for n in numbers]
        keys = [self._key(o) for o in offsets] if key_shared else None
        assignment = rule.assign(len(numbers), keys, "", capacity)
        taken: set[int] = set()
        for part in assignment.slices:
            run = sorted(numbers[i] for i in part.indices)
            cid = part.consumer_id
            self.tracker.delivered(cid, run, now_ms)
            capacity[cid] -= len(run)
            if capacity[cid] <= 0:
                del capacity[cid]
            run_offsets = [self.offset_of[n] for n in run]
            send(cid, run_offsets, None if counts is None else {self.offset_of[n]: counts[n] for n in run},
                 self.records)
            taken.update(run)
        skipped = [numbers[i] for i in assignment.skipped]
        if skipped and counts is None:
            # Key-Shared: no consumer's filters take these keys; settled, as new messages are.
            self.tracker.skip(sorted(skipped), now_ms)
            self._forget_settled(skipped)
            taken.update(skipped)
        return taken

    def _key(self, offset: int) -> str:
        record = self.records[offset]
        return record.key if record.key is not None else record.producer_name

    # ------------------------------------------------------------- reading
    def read_request(self, subscription: str) -> ReadRequest | None:
        """The next read the lane needs: the scan's (step 3), else the records of
        released messages (bounded by `records_max`)."""
        if self.scan is not None:
            if self.scanning:
                return None
            self.scanning = True
            return ReadRequest(subscription=subscription, start_offset=self.scan[0], max_bytes=_READ_BYTES_MAX,
                               purpose=READ_DELAYED_SCAN)
        if self.reading or len(self.records) >= self.records_max:
            return None
        if not self.unread:
            return None
        self.reading = True
        return ReadRequest(subscription=subscription, start_offset=min(self.unread), max_bytes=_READ_BYTES_MAX,
                           purpose=READ_DELAYED_DUE)

    def read_result(self, msg: ReadResult, now_ms: int, wall_ms: int) -> None:
        if msg.purpose == READ_DELAYED_SCAN:
            self._scanned(msg)
            return
        self.reading = False
        mark = self.mark
        for frame in msg.frames:
            publish = INTERNAL_PROTOCOL.decode(frame)
            assert isinstance(publish, Publish)
            base, attributes = publish.base_offset, publish.attributes
            for i in range(len(publish.payloads)):
                if (offset := base + i) in self.number_of:
                    if offset in self.unread:
                        self.records[offset] = record_at(publish, i)
                        self.unread.discard(offset)
                elif attributes is not None and (at := deliver_at_of(attributes[i])) is not None \
                        and (at, offset) > mark:
                    # Held, or to be when judged: (time, offset) above the mark then and now.
                    self._keep_ahead(offset, at, record_at(publish, i), wall_ms)
        if not msg.frames:
            gone_below = max(msg.log_start_offset, msg.gap_end)
            lost = sorted(o for o in self.unread if o < gone_below)
            if lost:
                log.warning("%s:%s: delayed messages at offsets %d..%d are no longer in the log; dropped", self.topic,
                            self.subscription, lost[0], lost[-1])
                self.settle(lost, now_ms)

    def _scanned(self, msg: ReadResult) -> None:
        self.scanning = False
        assert self.scan is not None
        position, end = self.scan
        if msg.start_offset != position:
            return
        settled = self._settled or (lambda offset: True)
        for frame in msg.frames:
            publish = INTERNAL_PROTOCOL.decode(frame)
            assert isinstance(publish, Publish)
            base, attributes = publish.base_offset, publish.attributes
            if attributes is not None:
                for i, attrs in enumerate(attributes):
                    offset = base + i
                    at = deliver_at_of(attrs)
                    if at is not None and position <= offset < end and (at, offset) > self.mark \
                            and offset not in self.number_of and settled(offset):
                        self._rescan(at, offset)
            position = max(position, base + len(publish.payloads))
        if not msg.frames:
            if msg.log_start_offset > position:
                log.warning("%s:%s: offsets %d..%d are no longer in the log: the delayed messages there are lost",
                            self.topic, self.subscription, position, msg.log_start_offset - 1)
                position = msg.log_start_offset
            elif msg.gap_end > position:
                position = msg.gap_end
            else:
                position = end  # the log holds nothing more
        if position >= end:
            self.scan = None
            log.info("%s:%s: delayed-message index rebuilt: %d held", self.topic, self.subscription, len(self.index))
        else:
            self.scan = (position, end)
        self.changes += 1

    def _rescan(self, at: int, offset: int) -> None:
        if self.index.room():
            self.index.add(at, offset)
            self._index_low_known = False
            return
        # Held before under a larger `delayed_messages_max`: delivered now rather than lost.
        if not self._over:
            log.error("%s:%s: reliable.delayed_messages_max (%d) is below the delayed messages this subscription"
                      " held: those past it, from offset %d, are delivered at once", self.topic, self.subscription,
                      self.held_max, offset)
        self._over = True
        self._release(offset)

    # ------------------------------------------------------------- acks and failures
    def ack(self, consumer_id: int, offsets: list[int]) -> list[int]:
        """Count the acks of released messages among `offsets`; returns the others."""
        numbers, rest = [], []
        for offset in offsets:
            number = self.number_of.get(offset)
            if number is None:
                rest.append(offset)
            else:
                numbers.append(number)
        if numbers:
            self.tracker.ack(consumer_id, numbers)
            self._forget_settled(numbers)
        return rest

    def nack(self, consumer_id: int, offsets: list[int], now_ms: int, delay_ms: int | None) -> list[int]:
        numbers = [self.number_of[o] for o in offsets if o in self.number_of]
        if numbers:
            self.tracker.nack(consumer_id, numbers, now_ms, delay_ms)
        return [o for o in offsets if o not in self.number_of] if numbers else offsets

    def refused(self, consumer_id: int, offsets: list[int], now_ms: int) -> list[int]:
        numbers = [self.number_of[o] for o in offsets if o in self.number_of]
        if numbers:
            self.tracker.undeliver(consumer_id, numbers, now_ms)
        return [o for o in offsets if o not in self.number_of] if numbers else offsets

    def poisoned(self, now_ms: int) -> list[Poisoned]:
        """As `DeliveryTracker.poisoned`, in topic offsets; dropped ones are settled here,
        dead letters wait for `dead_lettered` and blocked ones stay."""
        reported = self.tracker.poisoned(now_ms)
        out = [Poisoned(self.offset_of[p.offset], p.attempts, p.action) for p in reported]
        self._forget_settled([p.offset for p in reported if p.action == "drop"])
        return out

    def dead_lettered(self, offset: int) -> None:
        number = self.number_of[offset]
        self.tracker.dead_lettered(number)
        self._forget_settled([number])

    def settle(self, offsets: list[int], now_ms: int) -> int:
        """Count `offsets` (released or held) as acknowledged, whatever their state (a
        message TTL ran out, or the log lost them); returns how many."""
        numbers = sorted(self.number_of[o] for o in offsets if o in self.number_of)
        below = [n for n in numbers if n < self.tracker.read_offset]
        for number in below:
            self.tracker.forget(number, number + 1, now_ms)
        above = [n for n in numbers if n >= self.tracker.read_offset]
        if above:
            self.tracker.skip(above, now_ms)
        self._forget_settled(numbers)
        return len(numbers)

    def expire_below(self, end: int, now_ms: int) -> int:
        """The message TTL ran out below `end`: held and released messages there are
        settled; returns how many."""
        dropped = self.index.drop_below(end)
        self._index_low_known = False
        settled = self.settle([o for o in self.number_of if o < end], now_ms)
        if self.scan is not None and self.scan[0] < end:
            self.scan = (end, self.scan[1]) if end < self.scan[1] else None
        if dropped or settled:
            self.changes += 1
        return dropped + settled

    def _forget_settled(self, numbers: list[int]) -> None:
        for number in numbers:
            if self.tracker.is_acked(number) and (offset := self.offset_of.pop(number, None)) is not None:
                del self.number_of[offset]
                self.records.pop(offset, None)
                self.unread.discard(offset)
                self.changes += 1

    def reset(self) -> None:
        """A seek: everything is read and judged again from the new position."""
        self.index.clear()
        self._index_low_known = False
        self.tracker.seek(self.next_number)
        self.offset_of.clear()
        self.number_of.clear()
        self.records.clear()
        self.unread.clear()
        self.prefetch.clear()
        self.prefetch_bytes = 0
        self.scan = None
        self.mark = (-1, -1)
        self.changes += 1

    def close(self) -> None:
        self.index.clear()

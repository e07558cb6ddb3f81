"""Bounds on what a reliable topic takes (`BacklogQuota`): the disk's free space and the
backlog quota, checked before a send is accepted, and the subscriptions' cursors the
backlog is measured from.

8. Bounds on the disk (before step 1 of `commit.py`): a send is refused with
   RESOURCE_EXHAUSTED while the WAL's filesystem has less than
   `storage.disk_free_bytes_min` free (measured at most once per
   `disk_check_interval_ms`), or while `storage.receipts_held_max` receipts wait for
   their segments (`segments.py`), and meets the backlog quota's policy while the
   slowest subscription's backlog is over its quota (the topic's, its namespace's or
   the broker's `policies.backlog_quota_bytes_max`; `ApplyBacklogQuota` changes it):
   refused (producer_exception), held until acks free room or the hold times out
   (producer_request_hold), or accepted while the slowest cursors are moved forward
   (consumer_backlog_eviction). The backlog is measured in the log when the slowest
   cursor moves and grown by each commit, so a send costs no syscall.
"""

from __future__ import annotations

import logging
import os
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from danube_zmq.actors.topic.storage import TopicPort, refused_first
from danube_zmq.actors.topic.wal.commit import WalCommit
from danube_zmq.actors.topic.wal.log import TopicLog
from danube_zmq.actors.topic.wal.segments import DurableSegments
from danube_zmq.config.broker_config import BrokerConfig
from danube_zmq.transport import client_protocol as cp
from danube_zmq.transport.common import Error
from danube_zmq.transport.errors import DanubeError, ErrorCode, NotFound, ResourceExhausted
from danube_zmq.transport.internal_protocol import (
    ApplyBacklogQuota,
    ClientRequest,
    HeldSendsDue,
    SeekTo,
    SubscriptionCursor,
)

log = logging.getLogger("danube_zmq.topic")

# consumer_backlog_eviction moves cursors until the backlog is this share of the quota
# (Pulsar's 0.9), so that eviction runs once per tenth of the quota, not once per send.
_EVICT_TO = 0.9
# producer_request_hold: how often held sends are checked for their deadline, ms at most.
_HOLD_CHECK_MS_MAX = 200


@dataclass(slots=True)
class _Held:
    """A send held while the backlog is over its quota (producer_request_hold)."""

    req: ClientRequest
    msg: cp.Send
    size: int
    deadline_ms: int


class BacklogQuota:
    def __init__(self, *, port: TopicPort, config: BrokerConfig, topic_log: TopicLog, commit: WalCommit,
                 segments: DurableSegments, wal_dir: Path, backlog_quota: tuple[int, str] | None) -> None:
        self.port = port
        self.topic = port.topic
        self.config = config
        self.topic_log = topic_log
        self.commit = commit
        self.segments = segments
        self.wal_dir = wal_dir
        # Each subscription's acknowledged cursor (`SubscriptionCursor`).
        self.cursors: dict[str, int] = {}
        # Backlog quota: bytes of committed records after the slowest cursor (0 without
        # subscriptions), measured when that cursor moves and grown by each commit.
        self.backlog_floor: int | None = None
        self.backlog_bytes = 0
        # The quota in force: the topic's or its namespace's from the metadata store
        # (the broker passes it and tells changes), else the broker's `policies`.
        quota: tuple[int, str] = backlog_quota or (
            config.policies.backlog_quota_bytes_max, config.policies.backlog_quota_policy)
        self.quota_bytes_max, self.quota_policy = quota
        self.held: deque[_Held] = deque()
        self.held_bytes = 0
        self.held_timer = False
        self.evicted_messages = 0
        # Eviction moved these cursors to (offset - 1); reports older than the move are ignored.
        self.evicted_to: dict[str, int] = {}
        self.disk_free_bytes: int | None = None
        self.disk_check_due_ms = 0

    def send(self, req: ClientRequest, msg: cp.Send) -> None:
        producer = self.port.producers.get(msg.producer_id)
        if producer is None:
            raise NotFound(f"producer {msg.producer_id} is not attached to topic {self.topic}")
        refusal = self._disk_refusal()
        if refusal is not None:
            raise refused_first(producer, msg, ResourceExhausted(refusal))
        segments = self.segments
        # No call per send unless receipts wait for their segments (seal_every_flush).
        if segments.receipts_held and (refusal := segments.refusal()) is not None:
            raise refused_first(producer, msg, ResourceExhausted(refusal))
        if self.held or self.over_quota():
            if self.quota_policy == "producer_exception":
                raise refused_first(producer, msg, ResourceExhausted(self._quota_text()))
            if self.quota_policy == "producer_request_hold":
                self._hold(req, msg)
                return
            self.evict()
        self.commit.accept(req, msg)

    def _disk_refusal(self) -> str | None:
        """Why sends are refused for lack of disk space, or None; statvfs at most once
        per `disk_check_interval_ms`."""
        storage = self.config.storage
        if not storage.disk_free_bytes_min:
            return None
        now = self.port.clock.monotonic_ms()
        if now >= self.disk_check_due_ms:
            self.disk_check_due_ms = now + storage.disk_check_interval_ms
            try:
                stat = os.statvfs(self.wal_dir)
            except OSError as exc:
                log.warning("%s: free space of %s unknown (%s)", self.topic, self.wal_dir, exc)
                self.disk_free_bytes = None
            else:
                self.disk_free_bytes = stat.f_bavail * stat.f_frsize
        free = self.disk_free_bytes
        if free is None or free >= storage.disk_free_bytes_min:
            return None
        return (f"topic {self.topic}: the WAL's filesystem has {free} bytes free, under the reserve of"
                f" {storage.disk_free_bytes_min} bytes (storage.disk_free_bytes_min); sends are refused until"
                " space is freed")

    def over_quota(self, extra_bytes: int = 0) -> bool:
        quota = self.quota_bytes_max
        return bool(quota) and self.backlog_floor is not None and self.backlog_bytes + extra_bytes > quota

    def _quota_text(self) -> str:
        return (f"topic {self.topic}: backlog of {self.backlog_bytes} bytes is over the backlog quota of"
                f" {self.quota_bytes_max} bytes (policy {self.quota_policy}); the slowest"
                " subscription must acknowledge messages before more are accepted")

    # ------------------------------------------------------------- producer_request_hold
    def _hold(self, req: ClientRequest, msg: cp.Send) -> None:
        size = len(req.frame)
        policies = self.config.policies
        if self.held_bytes + size > policies.backlog_quota_hold_bytes_max:
            raise ResourceExhausted(f"{self._quota_text()}; {self.held_bytes} bytes of sends are held already"
                                    f" (backlog_quota_hold_bytes_max {policies.backlog_quota_hold_bytes_max})")
        now = self.port.clock.monotonic_ms()
        self.held.append(_Held(req, msg, size, now + policies.backlog_quota_hold_ms_max))
        self.held_bytes += size
        self._arm_hold_timer()

    def _arm_hold_timer(self) -> None:
        if self.held and not self.held_timer:
            self.held_timer = True
            self.port.schedule_once(min(_HOLD_CHECK_MS_MAX, self.config.policies.backlog_quota_hold_ms_max),
                                    HeldSendsDue())

    def held_sends_due(self) -> None:
        self.held_timer = False
        now = self.port.clock.monotonic_ms()
        hold_ms = self.config.policies.backlog_quota_hold_ms_max
        while self.held and self.held[0].deadline_ms <= now:
            held = self.held.popleft()
            self.held_bytes -= held.size
            self.port.reply(held.req.identity, Error(
                request_id=held.msg.request_id, code=ErrorCode.RESOURCE_EXHAUSTED,
                message=f"{self._quota_text()}; the batch was held {hold_ms} ms (backlog_quota_hold_ms_max)"
                        " and not stored; send it again"))
        self._arm_hold_timer()

    def apply_backlog_quota(self, msg: ApplyBacklogQuota) -> None:
        """A quota set or removed for this topic or its namespace applies at once: held
        sends that now fit are accepted; under another policy the rest are refused (or,
        for eviction, accepted once the cursors are moved on)."""
        if (msg.limit_bytes, msg.policy) == (self.quota_bytes_max, self.quota_policy):
            return
        log.info("%s: backlog quota now %d bytes, %s", self.topic, msg.limit_bytes, msg.policy)
        self.quota_bytes_max, self.quota_policy = msg.limit_bytes, msg.policy
        self._release_held()
        if self.quota_policy == "producer_request_hold" or not self.held:
            return
        if self.quota_policy == "consumer_backlog_eviction":
            self.evict()
        while self.held:
            held = self.held.popleft()
            self.held_bytes -= held.size
            try:
                if self.quota_policy != "consumer_backlog_eviction":
                    raise ResourceExhausted(self._quota_text())
                self.commit.accept(held.req, held.msg)
            except DanubeError as exc:
                self.port.reply(held.req.identity,
                                Error(request_id=held.msg.request_id, code=exc.code, message=exc.message))

    def _release_held(self) -> None:
        """The backlog shrank: accept held sends, oldest first, while they fit the quota."""
        released = 0
        while self.held and not self.over_quota(released):
            held = self.held.popleft()
            self.held_bytes -= held.size
            released += held.size
            try:
                self.commit.accept(held.req, held.msg)
            except DanubeError as exc:
                self.port.reply(held.req.identity,
                                Error(request_id=held.msg.request_id, code=exc.code, message=exc.message))

    def refuse_held(self, state: str) -> None:
        """The topic stops (`state`: moved, restarted, closed): held sends are answered
        now rather than left to the client's timeout."""
        for held in self.held:
            self.port.reply(held.req.identity, Error(
                request_id=held.msg.request_id, code=ErrorCode.UNAVAILABLE,
                message=f"topic {self.topic} {state} while this batch was held over its backlog quota; send it again"))
        self.held.clear()

    # ------------------------------------------------------------- consumer_backlog_eviction
    def evict(self) -> None:
        """consumer_backlog_eviction: move every cursor below the offset from which the
        log holds 90% of the quota to that offset (a seek: those messages are skipped)."""
        floor = self.backlog_floor
        if floor is None:
            return
        end = self.topic_log.committed_offset
        target = eviction_target(floor, end, lambda start: self.topic_log.log_bytes(start, end),
                                 int(self.quota_bytes_max * _EVICT_TO))
        if target <= floor:
            return
        for name in self.port.cursor_names:
            cursor = self.cursors.get(name)
            if cursor is None or cursor + 1 >= target:
                continue
            if not self.port.tell_subscription(name, SeekTo(offset=target)):
                continue  # full mailbox: the next send over the quota tries again
            log.warning("%s: backlog of %d bytes over its quota: subscription '%s' evicted from offset %d to %d",
                        self.topic, self.backlog_bytes, name, cursor + 1, target)
            self.evicted_messages += target - cursor - 1
            self.cursors[name] = target - 1
            self.evicted_to[name] = target
        self.measure_backlog()

    # ------------------------------------------------------------- the backlog
    def subscription_cursor(self, msg: SubscriptionCursor) -> None:
        if msg.subscription in self.port.cursor_names:
            cursor = msg.cursor
            evicted = self.evicted_to.get(msg.subscription)
            if evicted is not None:
                if cursor >= evicted - 1:
                    del self.evicted_to[msg.subscription]  # the subscription has taken the move
                else:
                    cursor = evicted - 1  # sent before it did
            self.cursors[msg.subscription] = cursor
            self.measure_backlog()

    def forget_subscription(self, name: str) -> None:
        self.cursors.pop(name, None)
        self.evicted_to.pop(name, None)
        self.measure_backlog()

    def committed(self, size: int) -> None:
        """`size` bytes of records were committed: the backlog grows by them."""
        if self.backlog_floor is not None:
            self.backlog_bytes += size

    def acked_floor(self) -> int:
        """Offsets below are acknowledged by every subscription."""
        return min((self.cursors.get(name, -1) + 1 for name in self.port.cursor_names),
                   default=self.topic_log.committed_offset)

    def measure_backlog(self) -> None:
        known = [self.cursors[name] for name in self.port.cursor_names if name in self.cursors]
        if not known:
            self.backlog_floor, self.backlog_bytes = None, 0
            return
        floor = min(known) + 1
        if floor != self.backlog_floor:
            self.backlog_floor = floor
            committed = self.topic_log.committed_offset
            self.backlog_bytes = self.topic_log.log_bytes(floor, committed) if floor < committed else 0
        if self.held and not self.over_quota():
            self._release_held()

    def tick(self) -> None:
        """The retention timer: measured again, evicted when over the quota."""
        self.measure_backlog()
        if self.over_quota() and self.quota_policy == "consumer_backlog_eviction":
            self.evict()


def eviction_target(floor: int, end: int, bytes_from: Callable[[int], int], target_bytes: int) -> int:
    """The lowest offset in [floor, end] from which the log holds at most `target_bytes`
    (`bytes_from(offset)` falls as the offset rises): binary search, O(log n) reads of
    the segment index."""
    low, high = floor, end
    while low < high:
        middle = (low + high) // 2
        if bytes_from(middle) <= target_bytes:
            high = middle
        else:
            low = middle + 1
    return low

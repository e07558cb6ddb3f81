"""The outbound byte ledger (actors/sockets/outbound.py): budgets, FIFO settling, pause,
resume and stall, with fake trackers and an explicit clock."""

from __future__ import annotations

import random
from dataclasses import dataclass

from danube_zmq.actors.sockets.outbound import OutboundLedger

KIB = 1024


@dataclass
class FakeTracker:
    done: bool = False


def make(**kw: int) -> OutboundLedger:
    args = {"connection_bytes_max": 100 * KIB, "broker_bytes_max": 150 * KIB, "stall_ms": 1000,
            "track_every_bytes": 10 * KIB}
    args.update(kw)
    return OutboundLedger(**args)


def test_frames_past_the_connection_budget_are_refused_whatever_was_granted() -> None:
    """Queued bytes count until libzmq is done with them; a frame that would take the
    connection past its budget is refused, and one frame always passes to an empty queue."""
    ledger = make()
    assert ledger.admit(b"a", 500 * KIB)  # larger than the budget, but the queue is empty
    ledger.sent(b"a", 60 * KIB, FakeTracker(), 0)
    assert ledger.admit(b"a", 40 * KIB)
    ledger.sent(b"a", 40 * KIB, FakeTracker(), 0)
    assert not ledger.admit(b"a", 1)
    assert ledger.admit(b"b", 1)  # another connection has its own budget


def test_broker_budget_refuses_across_connections() -> None:
    """The broker budget binds even when each connection is within its own."""
    ledger = make()
    ledger.sent(b"a", 90 * KIB, FakeTracker(), 0)
    assert ledger.admit(b"b", 60 * KIB)
    ledger.sent(b"b", 60 * KIB, FakeTracker(), 0)
    assert not ledger.admit(b"c", 1)
    assert ledger.statistics().frames_refused == 1


def test_a_done_tracker_settles_every_frame_sent_before_it() -> None:
    """libzmq's queue per peer is FIFO: untracked frames are released with the next
    tracked one, and not before it."""
    ledger = make()
    for _ in range(5):
        ledger.sent(b"a", KIB, None, 0)
    tracker = FakeTracker()
    ledger.sent(b"a", 20 * KIB, tracker, 0)
    ledger.sent(b"a", KIB, None, 0)
    ledger.settle(b"a")
    assert ledger.queued(b"a") == 26 * KIB
    tracker.done = True
    ledger.settle(b"a")
    assert ledger.queued(b"a") == KIB
    ledger.settle(b"a", now_ms=1)  # the untracked tail, nothing tracked ahead of it
    assert ledger.queued(b"a") == 0 and ledger.queued_bytes == 0


def test_untracked_tail_is_kept_behind_an_outstanding_tracked_frame() -> None:
    """The tail may only be assumed gone when nothing tracked is still queued ahead."""
    ledger = make()
    ledger.sent(b"a", 20 * KIB, FakeTracker(), 0)
    ledger.sent(b"a", KIB, None, 0)
    ledger.settle(b"a", now_ms=10)
    assert ledger.queued(b"a") == 21 * KIB


def test_tracking_every_track_every_bytes_bounds_the_untracked_tail() -> None:
    """A frame is tracked once the untracked bytes reach track_every_bytes."""
    ledger = make()
    sent_untracked = 0
    for _ in range(100):
        if ledger.should_track(b"a", KIB):
            ledger.sent(b"a", KIB, FakeTracker(), 0)
            sent_untracked = 0
        else:
            ledger.sent(b"a", KIB, None, 0)
            sent_untracked += KIB
        assert sent_untracked < 10 * KIB


def test_pause_at_half_resume_at_quarter_and_stall_after_the_deadline() -> None:
    """A connection past half its budget is paused once; it resumes at a quarter; one
    paused for stall_ms is reported stalled."""
    ledger = make()
    trackers = [FakeTracker() for _ in range(6)]
    for t in trackers:
        ledger.sent(b"a", 10 * KIB, t, 0)
    assert ledger.should_pause(b"a", 0)
    assert not ledger.should_pause(b"a", 0)  # once
    for t in trackers[:3]:
        t.done = True
    assert ledger.review(500) == ([], [])  # 30 KiB left: above a quarter
    trackers[3].done = True
    assert ledger.review(600) == ([b"a"], [])
    assert not ledger.is_paused(b"a")
    ledger.sent(b"a", 60 * KIB, FakeTracker(), 650)
    assert not ledger.admit(b"a", 30 * KIB)
    assert ledger.refused(b"a", 700)
    assert ledger.review(1699) == ([], [])
    assert ledger.review(1700) == ([], [b"a"])
    assert ledger.statistics().connections_stalled == 1


def test_randomized_queued_bytes_equal_what_is_not_done() -> None:
    """With every frame tracked, queued bytes always equal the bytes of frames whose
    trackers are not done up to the first not-done one (FIFO), and the total is the sum."""
    rng = random.Random(19)
    ledger = make(connection_bytes_max=1 << 40, broker_bytes_max=1 << 40, track_every_bytes=1)
    frames: dict[bytes, list[tuple[int, FakeTracker]]] = {b"a": [], b"b": []}
    for step in range(2000):
        peer = rng.choice([b"a", b"b"])
        if rng.random() < 0.6:
            size, tracker = rng.randint(1, 5000), FakeTracker()
            frames[peer].append((size, tracker))
            ledger.sent(peer, size, tracker, step)
        elif frames[peer]:
            # libzmq finishes frames in order
            for _size, tracker in frames[peer]:
                if not tracker.done:
                    tracker.done = True
                    break
        ledger.settle(peer)
        expected = 0
        seen_pending = False
        for size, tracker in frames[peer]:
            seen_pending = seen_pending or not tracker.done
            if seen_pending:
                expected += size
        assert ledger.queued(peer) == expected
    assert ledger.queued_bytes == ledger.queued(b"a") + ledger.queued(b"b")

"""Cursor checkpoint records in the WAL: they take no offset, reads skip them, and a log
reopened after a cut (kill -9, torn tail) and retention resumes from the newest
checkpoint of each subscription in what survived."""

from __future__ import annotations

import os
import random
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from danube_zmq.clock import ManualClock
from danube_zmq.storage.wal import WalLog, encode_batch, encode_checkpoints, scan
from danube_zmq.storage.wal import files as wal_files


@pytest.fixture(autouse=True)
def no_fsync(monkeypatch: pytest.MonkeyPatch) -> None:
    """fsync as a no-op: these tests cut files themselves, no crash relies on it."""
    monkeypatch.setattr(wal_files.current, "fsync", lambda fd: None)


def open_log(directory: Path, **options: object) -> WalLog:
    settings_: dict = {"segment_bytes_max": 1 << 20, "segment_age_ms_max": None, "index_interval_bytes": 64}
    settings_.update(options)
    return WalLog.open(directory, clock=ManualClock(), **settings_)


def append(wal: WalLog, count: int) -> None:
    payloads = [f"m{wal.next_offset + i}".encode() for i in range(count)]
    wal.append(encode_batch(wal.next_offset, payloads, [0] * count, 1, "p"), count)


def test_a_checkpoint_takes_no_offset_and_reads_never_see_it(tmp_path: Path) -> None:
    """Messages, then checkpoints, then messages: offsets stay consecutive, every read
    (from each start offset) returns messages only, and scan reports the checkpoints
    apart with the offset of the message that follows them."""
    wal = open_log(tmp_path)
    append(wal, 3)
    wal.append_checkpoints([("s1", b"cursor-2"), ("s2", None)])
    append(wal, 2)
    wal.sync()
    for start in range(5):
        batch = wal.read(start, max_bytes=1 << 20, upto_offset=5)
        assert batch.offsets == list(range(start, 5))
        assert batch.payloads == [f"m{i}".encode() for i in range(start, 5)]
    data = (tmp_path / "00000000000000000000.wal").read_bytes()
    result = scan(data, expected_offset=0)
    assert result.fault is None and result.next_offset == 5 and len(result.records) == 5
    assert [(c.offset, c.subscription, c.state) for c in result.checkpoints] == [(3, "s1", b"cursor-2"), (3, "s2", None)]
    assert wal.checkpoints() == {"s1": b"cursor-2"}
    wal.close()


def test_a_read_smaller_than_its_first_message_reads_past_checkpoints_before_it(tmp_path: Path) -> None:
    """A checkpoint before a message larger than `max_bytes`: the read still returns
    that message whole (the re-read covers the checkpoint and the record)."""
    wal = open_log(tmp_path)
    append(wal, 1)
    wal.append_checkpoints([("s", b"x" * 40)])
    wal.append(encode_batch(1, [b"y" * 5000], [0], 1, "p"), 1)
    wal.sync()
    batch = wal.read(1, max_bytes=100, upto_offset=2)
    assert batch.offsets == [1] and batch.payloads == [b"y" * 5000]
    wal.close()


def test_a_checkpoint_damaged_in_a_sealed_segment_is_damage(tmp_path: Path) -> None:
    """A checkpoint's CRC covers its body like a message's: a flipped byte in it is found
    when the records after it are read."""
    data = bytearray(encode_checkpoints(0, [("s", b"state")]) + encode_batch(0, [b"a"], [0], 1, "p"))
    data[20] ^= 0xFF
    result = scan(bytes(data), expected_offset=0)
    assert result.fault is not None and result.fault.position == 0 and not result.checkpoints


def _kill(wal: WalLog) -> None:
    """Drop the log as kill -9 would: no sync, no frontier written; descriptors closed."""
    for segment in wal._segments:
        segment.close()
    if wal._frontier is not None:
        wal._frontier.close()
    wal._closed = True


_ops = st.lists(st.one_of(
    st.tuples(st.just("batch"), st.integers(1, 4)),
    st.tuples(st.just("checkpoint"), st.sampled_from(["a", "b", "c"]), st.one_of(st.none(), st.binary(max_size=40))),
    st.tuples(st.just("retain"), st.integers(0, 60)),
), max_size=40)


@settings(max_examples=60, deadline=None)
@given(ops=_ops, cut=st.floats(0, 1), seed=st.integers(0, 2**32 - 1))
def test_the_recovered_cursor_is_the_newest_checkpoint_in_the_surviving_prefix(ops: list, cut: float,
                                                                              seed: int) -> None:
    """Random interleavings of batches, checkpoints (and deletions) and retention over
    small rolling segments, then a cut of the active segment anywhere past what its roll
    synced (a kill -9 or torn tail): the reopened log's checkpoints are the newest of each
    subscription among the records that survived the cut (those of deleted segments
    included: each roll carries every cursor into the next segment), and its messages
    are the surviving ones, consecutive."""
    rng = random.Random(seed)
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory)
        wal = open_log(path, segment_bytes_max=rng.choice([120, 300, 1000]))
        # Every record appended, in log order: (kind, value, segment base, start byte, end byte).
        history: list[tuple[str, object, int, int, int]] = []

        def placed(kind: str, value: object, size: int) -> None:
            active = wal.segments()[-1]
            end = Path(active.path).stat().st_size
            history.append((kind, value, active.base_offset, end - size, end))

        for op in ops:
            if op[0] == "batch":
                for _ in range(op[1]):
                    offset = wal.next_offset
                    encoded = encode_batch(offset, [f"m{offset}".encode()], [0], 1, "p")
                    wal.append(encoded, 1)
                    placed("msg", offset, len(encoded))
            elif op[0] == "checkpoint":
                wal.append_checkpoints([(op[1], op[2])])
                placed("cp", (op[1], op[2]), len(encode_checkpoints(wal.next_offset, [(op[1], op[2])])))
            else:
                wal.delete_segments_before(op[1])
        active = Path(wal.segments()[-1].path)
        base = wal.segments()[-1].base_offset
        _kill(wal)
        # The cursors a roll carried into the active segment were fsynced with it: a
        # crash cuts only what follows them.
        floor = min((start for _, _, b, start, _ in history if b == base), default=0)
        size = active.stat().st_size
        keep = floor + int((size - floor) * cut)
        os.truncate(active, keep)
        expected: dict[str, bytes] = {}
        messages = 0
        for kind, value, segment_base, _, end in history:
            if segment_base == base and end > keep:
                break  # this record and all after it were cut
            if kind == "msg":
                messages = int(value) + 1  # type: ignore[call-overload]
            else:
                name, state = value  # type: ignore[misc]
                if state is None:
                    expected.pop(name, None)
                else:
                    expected[name] = state
        wal = open_log(path)
        assert wal.checkpoints() == expected
        assert wal.next_offset == max(messages, base)
        start = wal.segments()[0].base_offset
        batch = wal.read(start, max_bytes=1 << 20, upto_offset=wal.next_offset)
        assert batch.offsets == list(range(start, wal.next_offset))
        assert batch.payloads == [f"m{i}".encode() for i in batch.offsets]
        wal.close()


def test_a_repair_keeps_the_newest_checkpoint_of_every_subscription_it_can_read(tmp_path: Path) -> None:
    """Segment 0 holds messages 0..5 and `a`'s first checkpoint; the roll carries it into
    segment 1, which then holds checkpoints only: `b` created, `a` moved on. Damage in
    segment 0's last message makes an operator repair the log: segment 0 is cut there
    and segment 1 is set aside (it starts after the fault). The repaired log still
    resumes `a` from its newest checkpoint and still knows `b`: checkpoints are not
    messages (they take no offset, none of them is lost with the given-up range), and
    one lost with a set-aside segment would reset its subscription (`b` would be
    created afresh, at the latest message, or `a` would redeliver from its older one)."""
    wal = open_log(tmp_path)
    append(wal, 3)
    wal.append_checkpoints([("a", b"a-2")])
    append(wal, 3)
    wal.roll()
    wal.append_checkpoints([("b", b"b-5"), ("a", b"a-5")])
    wal.close()
    first = tmp_path / "00000000000000000000.wal"
    data = bytearray(first.read_bytes())
    data[-3] ^= 0x10  # in message 5's body
    first.write_bytes(bytes(data))
    report = WalLog.repair(tmp_path, resume_offset=6, clock=ManualClock())
    assert report.lost == (5, 6) and len(report.quarantined) == 2
    wal = open_log(tmp_path)
    assert wal.checkpoints() == {"a": b"a-5", "b": b"b-5"}
    wal.close()


def test_the_bytes_of_a_range_of_messages_leave_the_checkpoints_among_them_out(tmp_path: Path) -> None:
    """Messages with checkpoints before, between and after them: the log's byte count of
    any range of messages (what backlog quotas and `backlog_bytes` use) is the sum of
    those messages' records alone, written now and after a reopen (recovered from the
    file). Counted with them, a subscription acking often grew every other
    subscription's backlog with no message sent."""
    wal = open_log(tmp_path)
    wal.append_checkpoints([("a", b"first")])
    append(wal, 3)
    wal.append_checkpoints([("a", b"a-2"), ("b", b"b-" + b"x" * 200)])
    append(wal, 2)
    wal.append_checkpoints([("a", b"a-4")])
    wal.sync()
    data = (tmp_path / "00000000000000000000.wal").read_bytes()
    sizes = scan(data, expected_offset=0, with_sizes=True).sizes
    assert sizes is not None and len(sizes) == 5
    for reopened in (False, True):
        if reopened:
            wal.close()
            wal = open_log(tmp_path)
        for start in range(6):
            for end in range(start, 6):
                assert wal.bytes_between(start, end) == sum(sizes[start:end]), (start, end, reopened)
    wal.close()


def test_the_newest_sealed_segment_alone_holds_every_subscriptions_newest_checkpoint(tmp_path: Path) -> None:
    """What a broker taking a durable topic over reads (`segment_checkpoints` on the
    newest uploaded segment): after checkpoints spread over three segments (a, b and a
    deletion of c in the first, a newer a in the second, a newer b in the third), the
    third segment's file alone, copied out of the log, gives a and b at their newest and
    c's deletion marker; the first alone gives the old states."""
    from danube_zmq.storage.wal import segment_checkpoints

    wal = open_log(tmp_path / "wal")
    append(wal, 2)
    wal.append_checkpoints([("a", b"a-1"), ("b", b"b-1"), ("c", b"c-1")])
    wal.append_checkpoints([("c", None)])
    wal.seal_active()
    append(wal, 2)
    wal.append_checkpoints([("a", b"a-3")])
    wal.seal_active()
    append(wal, 2)
    wal.append_checkpoints([("b", b"b-5")])
    wal.seal_active()
    sealed = [info.path for info in wal.segments() if info.sealed]
    assert len(sealed) == 3
    copies = []
    for path in sealed:  # as downloaded from the durable store: the file alone
        copy = tmp_path / "fetched" / path.name
        copy.parent.mkdir(exist_ok=True)
        copy.write_bytes(path.read_bytes())
        copies.append(copy)
    wal.close()
    assert segment_checkpoints([copies[-1]], ManualClock()) == {"a": b"a-3", "b": b"b-5", "c": None}
    assert segment_checkpoints([copies[0]], ManualClock()) == {"a": b"a-1", "b": b"b-1", "c": None}

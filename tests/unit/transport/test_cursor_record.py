"""The reliable subscription's cursor record (`cluster_records.CursorRecord`): declared
like every other record, and read back from stores written before it was (a msgpack map
by field name)."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from danube_zmq.transport import cluster_records as cr
from danube_zmq.transport.errors import InvalidArgument
from danube_zmq.transport.internal_protocol import FailurePolicyState

POLICY = FailurePolicyState(max_redelivery_count=3, ack_timeout_ms=30_000, base_redelivery_delay_ms=100,
                            max_redelivery_delay_ms=5_000, backoff="exponential", poison_policy="dead_letter",
                            dead_letter_topic="/default/dlq")


def _old_form(sub_type: int, cursor: int, acked_above: list[int], policy: FailurePolicyState | None,
              max_unacked_messages: int | None) -> bytes:
    """Exactly what the broker wrote before the record was declared (broker.py,
    handle_PersistCursor at ae71d56)."""
    return msgpack.packb({"sub_type": sub_type, "cursor": cursor, "acked_above": acked_above,
                          "policy": None if policy is None else policy.to_record(),
                          "max_unacked_messages": max_unacked_messages})


@given(sub_type=st.integers(0, 3), cursor=st.integers(-1, 2**62), acked_above=st.lists(st.integers(0, 2**62)),
       policy=st.sampled_from([None, POLICY]), window=st.one_of(st.none(), st.integers(1, 10_000)))
def test_a_cursor_written_the_old_way_reads_as_the_record(sub_type: int, cursor: int, acked_above: list[int],
                                                          policy: FailurePolicyState | None,
                                                          window: int | None) -> None:
    """Any cursor the broker wrote as a msgpack map decodes to the same fields as the
    declared record, and the declared form round-trips to the same record."""
    record = cr.decode_cursor(_old_form(sub_type, cursor, acked_above, policy, window))
    assert record == cr.CursorRecord(sub_type=sub_type, cursor=cursor, acked_above=acked_above, policy=policy,
                                     max_unacked_messages=window)
    assert cr.decode_cursor(cr.encode(record)) == record


def test_an_old_cursor_without_the_later_fields_reads() -> None:
    """The first stores wrote no policy and no window, and a policy without a
    dead-letter topic: they read with those fields absent (None)."""
    policy = POLICY.to_record()
    del policy["dead_letter_topic"]
    old = msgpack.packb({"sub_type": 1, "cursor": 7, "acked_above": [9], "policy": policy})
    record = cr.decode_cursor(old)
    assert record.cursor == 7 and record.max_unacked_messages is None
    assert record.policy is not None and record.policy.dead_letter_topic is None


@pytest.mark.parametrize("old", [
    {"sub_type": 1, "acked_above": []},  # no cursor
    {"sub_type": 1, "cursor": "7", "acked_above": []},  # a cursor that is not a number
    {"sub_type": 1, "cursor": 7, "acked_above": [], "policy": {"backoff": "fixed"}},  # half a policy
])
def test_a_damaged_old_cursor_is_an_invalid_argument(old: dict[str, object]) -> None:
    """A map missing a field or holding one of the wrong type is refused with
    InvalidArgument naming the record, never a KeyError or a half-built state."""
    with pytest.raises(InvalidArgument, match="CursorRecord"):
        cr.decode_cursor(msgpack.packb(old))


def test_another_record_under_a_cursor_key_is_refused() -> None:
    """A declared record of another kind where a cursor should be is InvalidArgument."""
    with pytest.raises(InvalidArgument):
        cr.decode_cursor(cr.encode(cr.LeaderRecord(broker_id=1, term=2)))

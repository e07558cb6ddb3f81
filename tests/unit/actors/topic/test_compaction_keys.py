"""Compaction's rule (`CompactionKeys`): the latest record per key, tombstones delete,
keyless records pass, and the table is bounded by `keys_max`."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from danube_zmq.actors.topic.compaction import CompactionKeys, TooManyKeys
from danube_zmq.transport.errors import ErrorCode, ResourceExhausted

Record = tuple[str | None, bytes]


def fed(records: list[Record], keys_max: int = 1000, batch: int = 3) -> CompactionKeys:
    """A table fed `records` at offsets 0.., a few at a time (as batches come)."""
    keys = CompactionKeys(keys_max)
    for first in range(0, len(records), batch):
        chunk = records[first : first + batch]
        keys.add(range(first, first + len(chunk)), [key for key, _ in chunk], [payload for _, payload in chunk])
    return keys


def kept(keys: CompactionKeys, records: list[Record]) -> list[int]:
    return [offset for offset, (key, payload) in enumerate(records) if keys.keeps(offset, key, payload)]


def test_latest_record_per_key_wins() -> None:
    """Of several records of one key only the last is kept, whatever lies between."""
    records: list[Record] = [("a", b"1"), ("b", b"1"), ("a", b"2"), ("a", b"3"), ("b", b"2")]
    keys = fed(records)
    assert kept(keys, records) == [3, 4]
    assert len(keys) == 2


def test_tombstone_deletes_its_key() -> None:
    """An empty payload as a key's latest record drops the key: neither its older
    records nor the tombstone itself are kept, and the key is no longer counted."""
    records: list[Record] = [("a", b"1"), ("b", b"1"), ("a", b"")]
    keys = fed(records)
    assert kept(keys, records) == [1]
    assert len(keys) == 1


def test_value_after_tombstone_brings_the_key_back() -> None:
    """A record after a tombstone is the key's latest again, and kept."""
    records: list[Record] = [("a", b"1"), ("a", b""), ("a", b"3")]
    keys = fed(records)
    assert kept(keys, records) == [2]
    assert len(keys) == 1


def test_keyless_records_pass_through() -> None:
    """Records without a key are all kept, empty or not, and take no place in the table."""
    records: list[Record] = [(None, b"x"), ("a", b"1"), (None, b""), ("a", b"2"), (None, b"x")]
    keys = fed(records, keys_max=1)
    assert kept(keys, records) == [0, 2, 3, 4]
    assert len(keys) == 1


def test_empty_string_is_a_key() -> None:
    """The key "" is a key like any other (only None is keyless)."""
    records: list[Record] = [("", b"1"), ("", b"2")]
    assert kept(fed(records), records) == [1]


def test_too_many_keys_past_keys_max() -> None:
    """keys_max distinct live keys fit, and new records of those keys too; one more key
    raises TooManyKeys, a non-retriable ResourceExhausted naming the limit and setting."""
    keys = CompactionKeys(3)
    keys.add([0, 1, 2], ["a", "b", "c"], [b"1", b"1", b"1"])
    keys.add([3, 4, 5], ["c", "a", None], [b"2", b"2", b"2"])
    assert len(keys) == 3
    with pytest.raises(TooManyKeys) as raised:
        keys.add([6], ["d"], [b"1"])
    assert isinstance(raised.value, ResourceExhausted)
    assert raised.value.code is ErrorCode.RESOURCE_EXHAUSTED
    assert not raised.value.retriable
    assert raised.value.keys_max == 3
    assert str(raised.value) == "compaction stopped: more than 3 distinct keys (storage.compaction_keys_max)"
    assert "1,000,000" in str(TooManyKeys(1_000_000))


def test_tombstoned_key_frees_its_place() -> None:
    """A deleted key holds no place under keys_max: a new key fits after a tombstone,
    and a tombstone of a key never seen costs nothing."""
    keys = CompactionKeys(1)
    keys.add([0, 1, 2, 3], ["a", "a", "zz", "b"], [b"1", b"", b"", b"1"])
    assert len(keys) == 1
    assert keys.keeps(3, "b", b"1")


@given(st.lists(st.tuples(st.one_of(st.none(), st.sampled_from("abcde")), st.sampled_from([b"", b"v", b"w"])),
                max_size=60),
       st.integers(min_value=1, max_value=7))
def test_keeps_equals_a_replay_model(records: list[Record], batch: int) -> None:
    """Against a model that replays the records into a dict (key -> last offset, a
    tombstone deleting it): the kept offsets are the keyless ones and each surviving
    key's last, and `len` is the model's key count, however the records are batched."""
    model: dict[str, int] = {}
    for offset, (key, payload) in enumerate(records):
        if key is not None:
            if payload:
                model[key] = offset
            else:
                model.pop(key, None)
    expected = sorted([offset for offset, (key, _) in enumerate(records) if key is None] + list(model.values()))
    keys = fed(records, batch=batch)
    assert kept(keys, records) == expected
    assert len(keys) == len(model)

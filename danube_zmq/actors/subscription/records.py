"""A message as a reliable subscription holds it between its read from the log and its
acknowledgement: the read-ahead's and the delayed messages' (`delayed.py`)."""

from __future__ import annotations

from typing import NamedTuple

from danube_zmq.transport.internal_protocol import Publish

__all__ = ["Record", "record_at", "records_of"]

_new = tuple.__new__


class Record(NamedTuple):
    """One message; built with `tuple.__new__` (one C call per message)."""

    payload: bytes
    key: str | None
    attributes: dict[str, str] | None
    publish_time: int
    producer_id: int
    producer_name: str
    schema_id: int | None
    schema_version: int | None


def record_at(publish: Publish, index: int) -> Record:
    """The `index`-th message of `publish`."""
    keys, attributes = publish.keys, publish.attributes
    return _new(Record, (publish.payloads[index], None if keys is None else keys[index],
                         None if attributes is None else attributes[index], publish.publish_times[index],
                         publish.producer_id, publish.producer_name, publish.schema_id, publish.schema_version))


def records_of(publish: Publish, wanted: dict[int, object]) -> dict[int, Record]:
    """The messages of `publish` at the offsets `wanted` holds."""
    base = publish.base_offset
    return {base + i: record_at(publish, i) for i in range(len(publish.payloads)) if base + i in wanted}

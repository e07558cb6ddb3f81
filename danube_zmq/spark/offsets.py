"""Where each micro-batch starts and ends (pure: no I/O).

An offset, as Spark keeps it in the query's checkpoint, is a dict from partition topic
(`/ns/t` or `/ns/t-part-N`) to the next offset to read there. A micro-batch reads each
partition's `[start, end)`; `end` comes from the partitions' heads (the offset after
the last message each holds), capped by `max_offsets_per_trigger` spread over the
partitions in proportion to what each has to read, as Spark's Kafka source does.
"""

from __future__ import annotations

from dataclasses import dataclass

from danube_zmq.transport.errors import InvalidArgument

__all__ = ["EARLIEST", "LATEST", "Offsets", "Range", "cap", "parse_offsets", "ranges"]

# Kafka's JSON conventions for starting_offsets / ending_offsets.
EARLIEST = -2
LATEST = -1

Offsets = dict[str, int]


@dataclass(frozen=True, slots=True)
class Range:
    """One partition's `[start, end)`: what one Spark task reads."""

    partition: str
    start: int
    end: int


def parse_offsets(text: object, option: str) -> Offsets:
    """A JSON map `{"/ns/t-part-0": 42, ...}` (already parsed) of partition topic to
    offset, -2 meaning earliest and -1 latest, as in Kafka's options."""
    if not isinstance(text, dict) or not text:
        raise InvalidArgument(f"option {option!r}: expected 'earliest', 'latest' or a JSON object of partition"
                              ' topic to offset, such as {"/default/orders-part-0": 42}')
    offsets: Offsets = {}
    for name, value in text.items():
        if not isinstance(name, str) or not name.startswith("/"):
            raise InvalidArgument(f"option {option!r}: {name!r} is not a topic name (/namespace/topic[-part-N])")
        if type(value) is not int or value < EARLIEST:
            raise InvalidArgument(f"option {option!r}: the offset of {name} must be an int >= -2"
                                  f" (-2 earliest, -1 latest), got {value!r}")
        offsets[name] = value
    return offsets


def cap(start: Offsets, heads: Offsets, limit: int | None) -> Offsets:
    """The end of the next micro-batch: each partition's head, or, when more than
    `limit` offsets are waiting in all, a share of `limit` for each in proportion to
    what it has waiting (at least one offset in all, so that a query always moves)."""
    end = {p: max(heads.get(p, start[p]), start[p]) for p in start}
    waiting = {p: end[p] - start[p] for p in start if end[p] > start[p]}
    total = sum(waiting.values())
    if limit is None or total <= limit:
        return end
    shares = {p: limit * n // total for p, n in waiting.items()}
    left = limit - sum(shares.values())
    # What rounding left goes to the partitions with the most waiting, in name order for ties.
    for p in sorted(waiting, key=lambda p: (-waiting[p], p)):
        if left == 0:
            break
        if shares[p] < waiting[p]:
            shares[p] += 1
            left -= 1
    return {p: start[p] + shares.get(p, 0) for p in start}


def ranges(start: Offsets, end: Offsets) -> list[Range]:
    """The non-empty ranges between two offsets, in partition name order (Spark's
    partition index of a range is then the same when a micro-batch is replayed). A
    partition only in `end` joined in this micro-batch, with nothing to read yet."""
    return [Range(p, start[p], end[p]) for p in sorted(end) if p in start and end[p] > start[p]]

"""Topic and namespace names: the one place that says what a valid name is.

A topic name is `/namespace/topic`. Each of the two parts is 1..255 ASCII
characters from `[A-Za-z0-9_-]`; there is no nesting and no dot, so a name is
also safe as a file name, a metadata key segment and a metrics label. A topic
whose last part ends in `-part-N` (N a decimal without leading zeros) is
partition N of the partitioned topic without that suffix, as in Danube.

Everything that accepts a name from outside (client requests, admin commands,
config) goes through `parse_topic` / `validate_namespace`, so the rest of the
broker can rely on `TopicName` being valid.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from danube_zmq.transport.errors import InvalidArgument

__all__ = ["PART_LENGTH_MAX", "TopicName", "parse_topic", "validate_namespace"]

# Longest namespace or topic part, in characters (= bytes, the parts are ASCII).
PART_LENGTH_MAX = 255

# Spelled out on purpose: `\w` and `\d` also match non-ASCII letters and
# digits, which we do not accept.
_PART_CHARS = re.compile(r"[A-Za-z0-9_-]+")
# `-part-N`, N without leading zeros so that a partition name has exactly one
# spelling and `partition_name(partition_index)` gives back the same string.
_PARTITION_SUFFIX = re.compile(r"(?P<base>.+)-part-(?P<index>0|[1-9][0-9]*)")
_RULE = "may contain only A-Z, a-z, 0-9, '_' and '-'"
# Names in error messages are cut to this many characters: a name comes from
# the network and may be megabytes long.
_SHOWN_CHARS_MAX = 80


def _show(name: object) -> str:
    """repr() of a name for an error message, cut short if it is long."""
    if isinstance(name, str) and len(name) > _SHOWN_CHARS_MAX:
        return repr(name[:_SHOWN_CHARS_MAX]) + f"... ({len(name)} characters)"
    return repr(name)


def _part_problem(part: str) -> str | None:
    """Why `part` is not a valid namespace or topic part, or None if it is."""
    if not part:
        return "is empty"
    if len(part) > PART_LENGTH_MAX:
        return f"is {len(part)} characters long, more than {PART_LENGTH_MAX}"
    if _PART_CHARS.fullmatch(part) is None:
        return _RULE
    return None


def validate_namespace(name: str) -> str:
    """Return `name` if it is a valid namespace name, else raise InvalidArgument."""
    if not isinstance(name, str):
        raise InvalidArgument(
            f"invalid namespace name {_show(name)}: expected a string"
        )
    problem = _part_problem(name)
    if problem is not None:
        raise InvalidArgument(f"invalid namespace name {_show(name)}: {problem}")
    return name


def _checked_part(full: str, part: str) -> str:
    problem = _part_problem(part)
    if problem is not None:
        raise InvalidArgument(
            f"invalid topic name {_show(full)}: part {_show(part)} {problem}"
        )
    return part


@dataclass(frozen=True, slots=True)
class TopicName:
    """A valid topic name, split into its namespace and topic parts.

    Build it with `parse_topic("/ns/topic")`; the constructor checks both
    parts too, so an invalid TopicName cannot exist.
    """

    namespace: str
    topic: str

    def __post_init__(self) -> None:
        for part in (self.namespace, self.topic):
            if not isinstance(part, str):
                raise InvalidArgument(
                    f"invalid topic name: parts must be strings, got {_show(part)}"
                )
        full = f"/{self.namespace}/{self.topic}"
        _checked_part(full, self.namespace)
        _checked_part(full, self.topic)

    def __str__(self) -> str:
        return self.full

    @property
    def full(self) -> str:
        """The name as clients write it: `/namespace/topic`."""
        return f"/{self.namespace}/{self.topic}"

    @property
    def partition_index(self) -> int | None:
        """N if this is partition N (`.../topic-part-N`), else None."""
        match = _PARTITION_SUFFIX.fullmatch(self.topic)
        return None if match is None else int(match["index"])

    @property
    def base(self) -> TopicName:
        """The partitioned topic this partition belongs to; itself if not a partition."""
        match = _PARTITION_SUFFIX.fullmatch(self.topic)
        return self if match is None else TopicName(self.namespace, match["base"])

    def partition_name(self, index: int) -> str:
        """Full name of partition `index` of this topic: `/ns/topic-part-{index}`."""
        if isinstance(index, bool) or not isinstance(index, int) or index < 0:
            raise InvalidArgument(
                f"invalid partition index {index!r} for topic {_show(self.full)}: "
                "expected an integer >= 0"
            )
        if self.partition_index is not None:
            raise InvalidArgument(
                f"topic {_show(self.full)} is already a partition; "
                "partitions have no partitions of their own"
            )
        # Through the constructor so that a suffix pushing the part past
        # PART_LENGTH_MAX is refused here rather than later.
        return TopicName(self.namespace, f"{self.topic}-part-{index}").full


def parse_topic(name: str) -> TopicName:
    """Parse `/namespace/topic` into a TopicName, or raise InvalidArgument naming the rule."""
    if not isinstance(name, str):
        raise InvalidArgument(f"invalid topic name {_show(name)}: expected a string")
    if not name.startswith("/"):
        raise InvalidArgument(
            f"invalid topic name {_show(name)}: must start with '/' (format /namespace/topic)"
        )
    parts = name[1:].split("/")
    if len(parts) != 2:
        raise InvalidArgument(
            f"invalid topic name {_show(name)}: expected exactly two parts "
            f"(format /namespace/topic), got {len(parts)}"
        )
    namespace, topic = (_checked_part(name, part) for part in parts)
    return TopicName(namespace, topic)

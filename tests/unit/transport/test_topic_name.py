"""Topic and namespace names: what is accepted, what is refused and how it is said."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from danube_zmq.transport.errors import InvalidArgument
from danube_zmq.transport.topic_name import (
    PART_LENGTH_MAX,
    TopicName,
    parse_topic,
    validate_namespace,
)

ALLOWED = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-"
parts = st.text(alphabet=ALLOWED, min_size=1, max_size=PART_LENGTH_MAX)
# Characters a name must not contain: a few ASCII ones, then anything non-ASCII
# (letters and digits included, which `\w` and `\d` would have let through).
forbidden_chars = st.sampled_from(list(" ./\\:*?\t\n\x00+@#'\"")) | st.characters(
    min_codepoint=128
)


def test_parse_splits_namespace_and_topic() -> None:
    """A plain name parses into its two parts and prints back the same."""
    name = parse_topic("/default/orders_v2-eu")
    assert name == TopicName("default", "orders_v2-eu")
    assert name.full == "/default/orders_v2-eu"
    assert str(name) == "/default/orders_v2-eu"
    assert name.partition_index is None
    assert name.base is name


def test_partition_name_parses_back_to_its_index_and_base() -> None:
    """partition_name(3) gives '-part-3', which parses to index 3 and the base topic."""
    orders = parse_topic("/default/orders")
    assert orders.partition_name(3) == "/default/orders-part-3"
    partition = parse_topic("/default/orders-part-3")
    assert partition.partition_index == 3
    assert partition.base == orders


@pytest.mark.parametrize(
    "topic", ["orders-part-01", "orders-part-", "-part-1", "orders-part-x"]
)
def test_suffix_that_is_not_canonical_is_not_a_partition(topic: str) -> None:
    """Only '-part-N' with N in canonical decimal after a non-empty base marks a partition."""
    name = TopicName("default", topic)
    assert name.partition_index is None
    assert name.base is name


def test_partition_of_a_partition_is_refused() -> None:
    """A partition has no partitions: asking for one is an error, not '-part-1-part-2'."""
    with pytest.raises(InvalidArgument, match="already a partition"):
        parse_topic("/default/orders-part-1").partition_name(2)


@pytest.mark.parametrize("index", [-1, True, 1.0, "1"])
def test_partition_index_must_be_a_non_negative_int(index: object) -> None:
    """partition_name rejects negative numbers, bools, floats and strings."""
    with pytest.raises(InvalidArgument, match="invalid partition index"):
        parse_topic("/default/orders").partition_name(index)  # type: ignore[arg-type]


def test_partition_name_that_would_be_too_long_is_refused() -> None:
    """The '-part-N' suffix counts towards the 255-character limit."""
    longest = parse_topic("/ns/" + "t" * PART_LENGTH_MAX)
    with pytest.raises(InvalidArgument, match="more than 255"):
        longest.partition_name(0)


@pytest.mark.parametrize(
    ("name", "message"),
    [
        (
            "/default/a b",
            (
                "invalid topic name '/default/a b': part 'a b' may contain only "
                "A-Z, a-z, 0-9, '_' and '-'"
            ),
        ),
        ("default/orders", "must start with '/'"),
        ("/default", "expected exactly two parts"),
        ("/default/orders/extra", "expected exactly two parts"),
        ("/default/", "part '' is empty"),
        ("//orders", "part '' is empty"),
        ("", "must start with '/'"),
        ("/default/or.ders", "part 'or.ders' may contain only"),
        ("/défault/orders", "part 'défault' may contain only"),
        ("/default/orders\n", "may contain only"),
        ("/default/" + "x" * 256, "is 256 characters long, more than 255"),
    ],
)
def test_invalid_topic_names_are_refused_naming_the_rule(
    name: str, message: str
) -> None:
    """Each kind of bad name raises InvalidArgument whose message quotes it and the rule."""
    with pytest.raises(InvalidArgument) as info:
        parse_topic(name)
    assert message in str(info.value)
    assert "invalid topic name" in str(info.value)


def test_long_bad_names_are_shortened_in_messages() -> None:
    """A name from the network may be huge; the message quotes only its start."""
    with pytest.raises(InvalidArgument) as info:
        parse_topic("/default/" + "x" * 100_000)
    assert len(str(info.value)) < 400
    assert "100009 characters" in str(info.value)


def test_non_string_topic_is_refused() -> None:
    """A non-string name (say, bytes off the wire) is an InvalidArgument, not a TypeError."""
    with pytest.raises(InvalidArgument, match="expected a string"):
        parse_topic(b"/default/orders")  # type: ignore[arg-type]


def test_topic_name_constructor_validates_its_parts() -> None:
    """TopicName cannot be built invalid, even bypassing parse_topic."""
    with pytest.raises(InvalidArgument, match="part 'a/b'"):
        TopicName("default", "a/b")
    with pytest.raises(InvalidArgument, match="parts must be strings"):
        TopicName("default", 5)  # type: ignore[arg-type]


def test_validate_namespace() -> None:
    """A namespace is one part: returned as is when valid, else the rule is named."""
    assert validate_namespace("tenant_1-eu") == "tenant_1-eu"
    with pytest.raises(InvalidArgument, match="invalid namespace name ''"):
        validate_namespace("")
    with pytest.raises(
        InvalidArgument,
        match=r"invalid namespace name 'a/b': may contain only A-Z, a-z, 0-9, '_' and '-'",
    ):
        validate_namespace("a/b")
    with pytest.raises(InvalidArgument, match="more than 255"):
        validate_namespace("n" * 256)


@given(namespace=parts, topic=parts)
def test_any_valid_name_round_trips(namespace: str, topic: str) -> None:
    """Property: every name built from allowed characters parses back to the same parts."""
    name = parse_topic(f"/{namespace}/{topic}")
    assert (name.namespace, name.topic) == (namespace, topic)
    assert name.full == f"/{namespace}/{topic}"
    assert validate_namespace(namespace) == namespace


@given(
    namespace=parts,
    topic=parts,
    bad=forbidden_chars,
    position=st.integers(min_value=0),
    in_namespace=st.booleans(),
)
def test_a_forbidden_character_anywhere_is_refused(
    namespace: str, topic: str, bad: str, position: int, in_namespace: bool
) -> None:
    """Property: one forbidden or non-ASCII character inserted anywhere makes the name invalid."""
    if in_namespace:
        at = position % (len(namespace) + 1)
        namespace = namespace[:at] + bad + namespace[at:]
        with pytest.raises(InvalidArgument):
            validate_namespace(namespace)
    else:
        at = position % (len(topic) + 1)
        topic = topic[:at] + bad + topic[at:]
    with pytest.raises(InvalidArgument):
        parse_topic(f"/{namespace}/{topic}")


@given(topic=parts, index=st.integers(min_value=0, max_value=10**9))
def test_partition_names_parse_back(topic: str, index: int) -> None:
    """Property: a partition name gives back its index and its base topic.

    Topics that already end in a partition suffix are skipped: they are partitions.
    """
    base = TopicName("default", topic)
    if (
        base.partition_index is not None
        or len(topic) + len(f"-part-{index}") > PART_LENGTH_MAX
    ):
        return
    partition = parse_topic(base.partition_name(index))
    assert partition.partition_index == index
    assert partition.base == base
    assert partition.base.partition_name(index) == partition.full

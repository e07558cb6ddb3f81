"""The `-a k1:v1,k2:v2` attribute parser: what it accepts and how it refuses the rest."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from danube_zmq.cli.main import cli
from danube_zmq.cli.options import parse_attributes
from danube_zmq.transport.errors import InvalidArgument


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("k1:v1", {"k1": "v1"}),
        ("k1:v1,k2:v2", {"k1": "v1", "k2": "v2"}),
        (" priority : high , region:us-west ", {"priority": "high", "region": "us-west"}),
        ("url:tcp://host:6650", {"url": "tcp://host:6650"}),
        ("empty:", {"empty": ""}),
    ],
)
def test_parse_attributes_accepts_key_value_pairs(text: str, expected: dict[str, str]) -> None:
    """Pairs split on ',' then on the first ':'; blanks around keys and values go."""
    assert parse_attributes(text) == expected


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("k1", "item 'k1' has no ':'"),
        ("k1:v1,k2", "item 'k2' has no ':'"),
        (":v1", "item ':v1' has an empty key"),
        ("k1:v1,,k2:v2", "has an empty item"),
        ("k1:v1,", "has an empty item"),
        ("", "has an empty item"),
        ("k:1,k:2", "key 'k' is given twice"),
    ],
)
def test_parse_attributes_rejects_bad_forms_naming_the_item(text: str, problem: str) -> None:
    """Each bad form is an InvalidArgument that quotes the input, the fault and the format."""
    with pytest.raises(InvalidArgument) as caught:
        parse_attributes(text)
    assert str(caught.value) == f"attributes {text!r}: {problem} (expected k1:v1,k2:v2)"


def test_bad_attributes_flag_is_a_usage_error() -> None:
    """`produce -a oops` stops before connecting: exit 2 with the parser's message."""
    result = CliRunner().invoke(
        cli, ["produce", "-t", "/default/t", "-m", "x", "-a", "oops"], prog_name="danube"
    )
    assert result.exit_code == 2
    assert "item 'oops' has no ':'" in result.stderr
    assert "Traceback" not in result.output

"""The data source's options: defaults, and a clear error naming the option for each
mistake a user makes."""

from __future__ import annotations

import pytest

from danube_zmq.spark.offsets import EARLIEST, LATEST
from danube_zmq.spark.options import SinkOptions, SourceOptions
from danube_zmq.transport.errors import InvalidArgument

URL = {"service_url": "tcp://127.0.0.1:6650"}


def test_source_defaults_follow_the_kafka_source() -> None:
    options = SourceOptions.of({**URL, "topics": "/default/a, /default/b"})
    assert options.topics == ("/default/a", "/default/b")
    assert (options.starting, options.starting_default) == (None, LATEST)
    assert options.ending is None and options.max_offsets_per_trigger is None
    assert options.fail_on_data_loss and not options.read_compacted and options.value_format == "binary"


def test_source_offsets_and_limits() -> None:
    options = SourceOptions.of({**URL, "topics": "/default/a", "starting_offsets": '{"/default/a": 5}',
                                "ending_offsets": '{"/default/a": 9}', "max_offsets_per_trigger": "100",
                                "fail_on_data_loss": "False", "read_compacted": "true"})
    assert (options.starting, options.starting_default, options.ending) == ({"/default/a": 5}, EARLIEST,
                                                                           {"/default/a": 9})
    assert options.max_offsets_per_trigger == 100 and not options.fail_on_data_loss and options.read_compacted
    assert SourceOptions.of({**URL, "topics": "/d/a", "starting_offsets": "earliest"}).starting_default == EARLIEST
    assert SourceOptions.of({**URL, "topics": "/d/a", "starting_timestamp_ms": "1700000000000"}) \
        .starting_timestamp_ms == 1_700_000_000_000


@pytest.mark.parametrize(("options", "said"), [
    ({"topics": "/d/a"}, r"needs option\('service_url'"),
    ({"path": "/snapshots"}, r"format\('danube_snapshots'\)"),
    ({**URL}, r"needs option\('topics', '/namespace/topic\[,...\]'\) or option\('topics_pattern'"),
    ({**URL, "topics": "default/a"}, "'topics'.*must start with '/'"),
    ({**URL, "topics": "/d/a", "topics_pattern": "/d/.*"}, "one of them"),
    ({**URL, "topics_pattern": "d/.*"}, "'topics_pattern' is /namespace/regex"),
    ({**URL, "topics_pattern": "/d"}, "'topics_pattern' is /namespace/regex"),
    ({**URL, "topics_pattern": "/bad ns/.*"}, "'topics_pattern': invalid namespace"),
    ({**URL, "topics_pattern": "/d/orders-(["}, "is not a regex"),
    ({**URL, "topics": "/d/a", "starting_offsets": "first"}, "'starting_offsets': expected 'earliest'"),
    ({**URL, "topics": "/d/a", "ending_offsets": '{"/d/a": "x"}'}, "'ending_offsets': the offset of /d/a"),
    ({**URL, "topics": "/d/a", "max_offsets_per_trigger": "0"}, "'max_offsets_per_trigger' must be >= 1"),
    ({**URL, "topics": "/d/a", "max_offsets_per_trigger": "lots"}, "'max_offsets_per_trigger' is a whole number"),
    ({**URL, "topics": "/d/a", "fail_on_data_loss": "yes"}, "'fail_on_data_loss' is true or false"),
    ({**URL, "topics": "/d/a", "value_format": "json"}, "'value_format' is binary or schema"),
    ({**URL, "topics": "/d/a", "starting_offsets": "earliest", "starting_timestamp_ms": "5"}, "not both"),
    ({**URL, "topics": "/d/a", "token": "t", "token_file": "f"}, "'token' or 'token_file', not both"),
])
def test_source_mistakes_are_named(options: dict[str, str], said: str) -> None:
    with pytest.raises(InvalidArgument, match=said):
        SourceOptions.of(options)


def test_sink_defaults_and_mistakes() -> None:
    options = SinkOptions.of({**URL, "topic": "/default/out"})
    assert options.exactly_once and options.compression is None and options.row_order == "given"
    assert SinkOptions.of({**URL, "compression": "zstd", "row_order": "sorted"}).compression == "zstd"
    for bad, said in (({"compression": "gzip"}, "'compression' is one of none, lz4"),
                      ({"row_order": "random"}, "'row_order' is given or sorted"),
                      ({"exactly_once": "maybe"}, "'exactly_once' is true or false"),
                      ({"topic": "out"}, "'topic'.*must start with '/'")):
        with pytest.raises(InvalidArgument, match=said):
            SinkOptions.of({**URL, **bad})


def test_a_topics_pattern_is_a_namespace_and_a_regex_over_its_topics_names() -> None:
    options = SourceOptions.of({**URL, "topics_pattern": "/sales/orders-(eu|us)"})
    assert options.topics == ()
    assert options.pattern is not None
    namespace, regex = options.pattern
    assert namespace == "sales" and regex.fullmatch("orders-eu") and not regex.fullmatch("orders-eu-old")

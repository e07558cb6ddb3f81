"""The `danube` data source's options, read once and checked, with an error naming the
option (pure: no I/O but reading a token file when the client is made).

Names follow Spark's Kafka source where there is one to follow (`starting_offsets`,
`ending_offsets`, `max_offsets_per_trigger`, `fail_on_data_loss`).
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from danube_zmq.client.schemas import SchemaRegistryClient
from danube_zmq.client.sync import SyncClient
from danube_zmq.rpc.tokens import read_token_file
from danube_zmq.spark.offsets import EARLIEST, LATEST, Offsets, parse_offsets
from danube_zmq.transport.client_protocol import SchemaInfo
from danube_zmq.transport.errors import InvalidArgument
from danube_zmq.transport.topic_name import parse_topic, validate_namespace

__all__ = ["Connection", "SinkOptions", "SourceOptions"]

_COMPRESSIONS = ("none", "lz4", "zstd", "snappy", "zlib")


def _flag(options: Mapping[str, str], name: str, default: bool) -> bool:
    value = str(options.get(name, str(default))).strip().lower()
    if value not in ("true", "false"):
        raise InvalidArgument(f"danube option {name!r} is true or false, not {value!r}")
    return value == "true"


def _int(options: Mapping[str, str], name: str, default: int | None, low: int) -> int | None:
    value = options.get(name)
    if value is None:
        return default
    try:
        number = int(str(value).strip())
    except ValueError:
        raise InvalidArgument(f"danube option {name!r} is a whole number, not {value!r}") from None
    if number < low:
        raise InvalidArgument(f"danube option {name!r} must be >= {low}, got {number}")
    return number


def _topic(name: str, option: str) -> str:
    try:
        parse_topic(name)
    except InvalidArgument as exc:
        raise InvalidArgument(f"danube option {option!r}: {exc}") from None
    return name


@dataclass(frozen=True, slots=True)
class Connection:
    """Where the broker is and who we are: what each task needs to make its client.
    Only these options count, never the executor's DANUBE_* environment (a task runs
    wherever Spark puts it)."""

    service_url: str
    server_key: str | None = None
    client_keys: str | None = None
    token: str | None = None
    token_file: str | None = None

    @classmethod
    def of(cls, options: Mapping[str, str]) -> Connection:
        url = options.get("service_url")
        if not url:
            if options.get("path"):
                raise InvalidArgument("format('danube') reads topics and needs option('service_url', 'tcp://host:6650');"
                                      " WAL snapshots are read with format('danube_snapshots')")
            raise InvalidArgument("the danube data source needs option('service_url', 'tcp://host:6650')")
        if options.get("token") and options.get("token_file"):
            raise InvalidArgument("give danube option 'token' or 'token_file', not both")
        return cls(url, options.get("server_key") or None, options.get("client_keys") or None,
                   options.get("token") or None, options.get("token_file") or None)

    def credentials(self) -> dict[str, Any]:
        token = read_token_file(self.token_file) if self.token_file else self.token
        return {"server_public_key": self.server_key, "client_keys": self.client_keys, "token": token,
                "use_env": False}

    def client(self, name: str) -> SyncClient:
        return SyncClient(self.service_url, client_name=name, **self.credentials())

    def schema(self, subject: str, version: int | None) -> SchemaInfo:
        """A version of `subject` (the newest: None) from the broker's schema registry."""
        async def get() -> SchemaInfo:
            async with SchemaRegistryClient(self.service_url, client_name="danube-spark", **self.credentials()) as reg:
                return await reg.get_schema(subject=subject, version=version)
        return asyncio.run(get())


@dataclass(frozen=True, slots=True)
class SourceOptions:
    connection: Connection
    topics: tuple[str, ...]
    pattern: tuple[str, re.Pattern[str]] | None  # topics_pattern: a namespace, a regex over its topics' names
    starting: Offsets | None  # a map of partition topic to offset, or None: `starting_default` for all
    starting_default: int  # EARLIEST or LATEST
    starting_timestamp_ms: int | None
    ending: Offsets | None  # batch reads: None is latest
    max_offsets_per_trigger: int | None
    fail_on_data_loss: bool
    read_compacted: bool
    value_format: str  # binary | schema
    schema_subject: str | None  # value_format=schema: the subject the topics' producers write
    schema_version: int | None  # ... and its version to read with (None: the newest)
    read_timeout_s: float  # a task waiting this long for an offset its range holds fails

    @classmethod
    def of(cls, options: Mapping[str, str]) -> SourceOptions:
        connection = Connection.of(options)
        names = [t.strip() for t in str(options.get("topics", "")).split(",") if t.strip()]
        pattern = _pattern(options.get("topics_pattern"))
        if bool(names) == (pattern is not None):
            raise InvalidArgument("the danube source needs option('topics', '/namespace/topic[,...]') or"
                                  " option('topics_pattern', '/namespace/regex'), one of them")
        starting, default = _starting(options)
        timestamp = _int(options, "starting_timestamp_ms", None, 0)
        if timestamp is not None and "starting_offsets" in options:
            raise InvalidArgument("give danube option 'starting_offsets' or 'starting_timestamp_ms', not both")
        ending = options.get("ending_offsets", "latest")
        value_format = str(options.get("value_format", "binary")).lower()
        if value_format not in ("binary", "schema"):
            raise InvalidArgument(f"danube option 'value_format' is binary or schema, not {value_format!r}")
        subject = options.get("schema_subject") or None
        if value_format == "schema" and subject is None:
            raise InvalidArgument("danube option value_format=schema needs option('schema_subject', ...): the"
                                  " subject the topic's producers write (danube admin topics get-schema-config TOPIC)")
        return cls(
            connection=connection, topics=tuple(_topic(t, "topics") for t in names), pattern=pattern,
            starting=starting,
            starting_default=default, starting_timestamp_ms=timestamp,
            ending=None if ending == "latest" else parse_offsets(_json(ending, "ending_offsets"), "ending_offsets"),
            max_offsets_per_trigger=_int(options, "max_offsets_per_trigger", None, 1),
            fail_on_data_loss=_flag(options, "fail_on_data_loss", True),
            read_compacted=_flag(options, "read_compacted", False), value_format=value_format,
            schema_subject=subject, schema_version=_int(options, "schema_version", None, 1),
            read_timeout_s=float(_int(options, "read_timeout_ms", 120_000, 1) or 0) / 1000)


def _pattern(text: str | None) -> tuple[str, re.Pattern[str]] | None:
    """`/namespace/regex`: the namespace's topics whose name (the part after it)
    the regex matches in full."""
    if not text:
        return None
    namespace, _, regex = text.removeprefix("/").partition("/")
    if not text.startswith("/") or not regex:
        raise InvalidArgument(f"danube option 'topics_pattern' is /namespace/regex, such as /default/orders-.*;"
                              f" got {text!r}")
    try:
        validate_namespace(namespace)
    except InvalidArgument as exc:
        raise InvalidArgument(f"danube option 'topics_pattern': {exc}") from None
    try:
        return namespace, re.compile(regex)
    except re.error as exc:
        raise InvalidArgument(f"danube option 'topics_pattern': {regex!r} is not a regex: {exc}") from None


def _starting(options: Mapping[str, str]) -> tuple[Offsets | None, int]:
    text = str(options.get("starting_offsets", "latest")).strip()
    if text == "earliest":
        return None, EARLIEST
    if text == "latest":
        return None, LATEST
    # A partition the map leaves out starts at its beginning, as one found later does.
    return parse_offsets(_json(text, "starting_offsets"), "starting_offsets"), EARLIEST


def _json(text: str, option: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        raise InvalidArgument(f"danube option {option!r}: expected 'earliest', 'latest' or a JSON object,"
                              f" got {text[:80]!r}") from None


@dataclass(frozen=True, slots=True)
class SinkOptions:
    connection: Connection
    topic: str | None  # rows without a topic column (or a null one) go here
    producer_name: str | None  # the stable name exactly-once needs; else from the checkpoint location
    exactly_once: bool
    compression: str | None
    batch_messages_max: int
    batch_delay_ms: int
    chunking: bool
    row_order: str  # given | sorted (each task sorts its rows: for plans after a shuffle)
    sort_buffer_bytes: int

    @classmethod
    def of(cls, options: Mapping[str, str]) -> SinkOptions:
        compression = str(options.get("compression", "none")).lower()
        if compression not in _COMPRESSIONS:
            raise InvalidArgument(f"danube option 'compression' is one of {', '.join(_COMPRESSIONS)},"
                                  f" not {compression!r}")
        topic = options.get("topic")
        row_order = str(options.get("row_order", "given")).lower()
        if row_order not in ("given", "sorted"):
            raise InvalidArgument(f"danube option 'row_order' is given or sorted, not {row_order!r}")
        return cls(
            connection=Connection.of(options), topic=_topic(topic, "topic") if topic else None,
            producer_name=options.get("producer_name") or None,
            exactly_once=_flag(options, "exactly_once", True),
            compression=None if compression == "none" else compression,
            batch_messages_max=_int(options, "batch_messages_max", 1_000, 1) or 1_000,
            batch_delay_ms=_int(options, "batch_delay_ms", 10, 0) or 0,
            chunking=_flag(options, "chunking", False), row_order=row_order,
            sort_buffer_bytes=_int(options, "sort_buffer_bytes", 256 * 1024 * 1024, 1) or 1)

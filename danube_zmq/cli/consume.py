"""`danube consume`: subscribe, print and ack messages.

1. Check the topic name, connect and subscribe within `--connect-timeout`.
2. Receive; print each message (one line, or one JSON object with `--json`),
   then ack it, so a message is acked only once it is printed (at-least-once).
3. Stop after `--count` messages, after `--timeout` seconds without one, or on
   Ctrl-C / SIGTERM (exit 0 in all three cases).

`--reader` reads through a reader instead (`DanubeClient.create_reader`): from
`--start`, with no durable subscription and nothing acknowledged to keep.

In `--json` mode stdout carries nothing but messages; status goes to stderr.

A message written with a schema is decoded by the version it names (fetched from the
registry once): the human view pretty-prints the value under the message's line, the
JSON record gets `value` and `schema_id`/`schema_version`/`schema_subject` beside the
raw payload. `--reader-schema FILE` resolves Avro messages against that schema.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
from pathlib import Path
from typing import Any

import click

from danube_zmq.cli.options import (
    Interrupted,
    StopSignals,
    check_topic,
    connect_timeout_option,
    load_client,
    partition_of,
    service_url_option,
    within,
)
from danube_zmq.cli.output import emit_json, emit_line, status
from danube_zmq.transport.client_protocol import SubType
from danube_zmq.transport.errors import DanubeError, Timeout

__all__ = ["SUB_TYPES", "consume", "message_line", "message_record"]

SUB_TYPES = {
    "exclusive": SubType.EXCLUSIVE,
    "shared": SubType.SHARED,
    "failover": SubType.FAILOVER,
    "key-shared": SubType.KEY_SHARED,
}
# Without --timeout we still wake up this often; a quiet topic is no error.
_IDLE_RECEIVE_SECONDS = 60.0


@click.command("consume")
@service_url_option
@click.option("-t", "--topic", required=True, help="Topic to read: /namespace/topic.")
@click.option("-m", "--subscription", help="Subscription name (not with --reader).")
@click.option("-n", "--consumer-name", help="Consumer name [default: chosen by the client].")
@click.option(
    "--sub-type",
    type=click.Choice(list(SUB_TYPES), case_sensitive=False),
    default="shared",
    show_default=True,
    help="Subscription type.",
)
@click.option(
    "--initial-position",
    type=click.Choice(["latest", "earliest"], case_sensitive=False),
    default="latest",
    show_default=True,
    help="Where a new subscription starts.",
)
@click.option("--reader", "as_reader", is_flag=True,
              help="Read as a reader: no durable subscription, nothing kept for it (reliable topics).")
@click.option("--start", default="latest", show_default=True, metavar="earliest|latest|OFFSET",
              help="With --reader: where to start reading (an offset on one partition topic).")
@click.option("--read-compacted", is_flag=True,
              help="Below the topic's compaction horizon, the latest message per key only (exclusive, failover,"
                   " --reader).")
@click.option("-c", "--count", type=click.IntRange(min=1), help="Exit after this many messages.")
@click.option(
    "--timeout",
    type=click.FloatRange(min=0, min_open=True),
    metavar="SECONDS",
    help="Exit when no message arrives for this long [default: wait forever].",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object per message.")
@click.option("--reader-schema", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Decode schema'd messages against this reader schema (Avro schema resolution).")
@connect_timeout_option
def consume(
    service_url: str,
    topic: str,
    subscription: str | None,
    consumer_name: str | None,
    sub_type: str,
    initial_position: str,
    as_reader: bool,
    start: str,
    read_compacted: bool,
    count: int | None,
    timeout: float | None,
    as_json: bool,
    reader_schema: Path | None,
    connect_timeout: float,
) -> None:
    """Receive messages from a topic, print and acknowledge them.

    Runs until Ctrl-C unless --count or --timeout says otherwise. With --json,
    each message is one line: topic, partition, offset, producer_id, key,
    attributes, publish_time, redelivery_count and payload (UTF-8 text) or
    payload_b64 (anything else). Messages written with a schema are decoded:
    the value is pretty-printed, and --json adds value, schema_subject,
    schema_id and schema_version.

    \b
    Examples:
      danube consume -t /default/demo -m my-sub
      danube consume -t /default/orders -m audit --sub-type exclusive --initial-position earliest
      danube consume -t /default/events -m batch -c 100 --timeout 5 --json | jq .payload
      danube consume -t /default/orders --reader --start earliest --timeout 5
      danube consume -t /default/prices --reader --start earliest --read-compacted --timeout 5
    """
    topic = check_topic(topic)
    reader_start = _reader_start(as_reader, start, subscription)
    if not as_reader and not subscription:
        raise click.UsageError("name a subscription (-m/--subscription), or read with --reader")
    asyncio.run(
        _consume(
            service_url=service_url,
            connect_timeout=connect_timeout,
            topic=topic,
            subscription=subscription,
            consumer_name=consumer_name,
            sub_type=SUB_TYPES[sub_type.lower()],
            initial_position=initial_position.lower(),
            count=count,
            timeout=timeout,
            as_json=as_json,
            reader_schema=reader_schema.read_bytes() if reader_schema is not None else None,
            reader_start=reader_start,
            read_compacted=read_compacted,
        )
    )


def _reader_start(as_reader: bool, start: str, subscription: str | None) -> str | int | None:
    """`--start` as `create_reader` takes it; None without --reader."""
    if not as_reader:
        if start != "latest":
            raise click.UsageError("--start goes with --reader (a subscription starts at --initial-position)")
        return None
    if subscription is not None:
        raise click.UsageError("a reader has no subscription: leave out -m/--subscription")
    if start.lower() in ("earliest", "latest"):
        return start.lower()
    if not start.isdigit():
        raise click.UsageError(f"--start {start!r}: earliest, latest or an offset (an integer >= 0)")
    return int(start)


async def _consume(
    *,
    service_url: str,
    connect_timeout: float,
    topic: str,
    subscription: str | None,
    consumer_name: str | None,
    sub_type: SubType,
    initial_position: str,
    count: int | None,
    timeout: float | None,
    as_json: bool,
    reader_schema: bytes | None = None,
    reader_start: str | int | None = None,
    read_compacted: bool = False,
) -> None:
    DanubeClient = load_client()
    received = 0
    with StopSignals() as stop:
        try:
            async with contextlib.AsyncExitStack() as stack:
                client = DanubeClient(service_url)
                # Registered before start: a start cut short still closes its sockets.
                stack.push_async_callback(client.close)
                await stop.race(within(client.start(), connect_timeout, service_url))
                if reader_start is not None:
                    reader = await stop.race(within(
                        client.create_reader(topic, start=reader_start, reader_schema=reader_schema,
                                             read_compacted=read_compacted),
                        connect_timeout, service_url))
                    stack.push_async_callback(reader.close)
                    receive, ack = reader.read_next, _read_already
                    attached = f"reading {topic} from {reader_start}"
                else:
                    assert subscription is not None
                    consumer = await stop.race(within(
                        client.subscribe(topic, subscription, sub_type=sub_type, consumer_name=consumer_name,
                                         initial_position=initial_position, reader_schema=reader_schema,
                                         read_compacted=read_compacted),
                        connect_timeout, service_url))
                    stack.push_async_callback(consumer.close)
                    receive, ack = consumer.receive, consumer.ack
                    attached = f"subscribed {subscription!r} ({sub_type.name.lower()}) to {topic}"
                status(
                    attached + "; "
                    + ("waiting for messages" if count is None and timeout is None else "receiving")
                    + " (Ctrl-C to stop)"
                )
                while count is None or received < count:
                    wait_seconds = timeout if timeout is not None else _IDLE_RECEIVE_SECONDS
                    try:
                        message = await stop.race(receive(timeout=wait_seconds))
                    except Timeout:
                        if timeout is None:
                            continue
                        status(f"no message for {timeout:g} s")
                        break
                    if as_json:
                        emit_json(message_record(message))
                    else:
                        emit_line(message_line(message))
                    await ack(message)
                    received += 1
        except Interrupted:
            status(f"{stop.signal_name or 'signal'} received")
    status(f"received {received} message{'s' if received != 1 else ''}")


async def _read_already(message: Any) -> None:
    """A reader acknowledges as it reads: nothing left to do once a message is printed."""


def _payload_text(payload: bytes) -> str | None:
    try:
        return payload.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _message_topic(message: Any) -> str:
    # The id's topic names the partition the message is stored in.
    return message.message_id.topic


def message_record(message: Any) -> dict[str, Any]:
    """The `--json` object for one message."""
    topic = _message_topic(message)
    record: dict[str, Any] = {
        "topic": topic,
        "partition": partition_of(topic),
        "offset": message.message_id.offset,
        "producer_id": message.message_id.producer_id,
        "key": message.key,
        "attributes": dict(message.attributes or {}),
        "publish_time": message.publish_time,
        "redelivery_count": message.redelivery_count,
    }
    payload = bytes(message.payload)
    text = _payload_text(payload)
    if text is not None:
        record["payload"] = text
    else:
        record["payload_b64"] = base64.b64encode(payload).decode("ascii")
    if getattr(message, "schema_id", None) is not None:
        schema = message.schema
        record["schema_subject"] = schema.subject if schema is not None else None
        record["schema_id"] = message.schema_id
        record["schema_version"] = message.schema_version
        try:
            record["value"] = _jsonable(message.value())
        except DanubeError as exc:
            record["value_error"] = exc.message
    return record


def _jsonable(value: Any) -> Any:
    """A decoded value as JSON can hold it: bytes as base64, sets and tuples as lists."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set):
        return [_jsonable(v) for v in value]
    if isinstance(value, bytes | bytearray):
        return base64.b64encode(value).decode("ascii")
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return str(value)  # decimals, datetimes, uuids of Avro logical types


def message_line(message: Any) -> str:
    """The human line for one message: where it is from, then its payload on the same line."""
    topic = _message_topic(message)
    parts = [f"{topic} offset={message.message_id.offset}"]
    if message.key is not None:
        parts.append(f"key={message.key}")
    if message.attributes:
        parts.append("attributes={" + ",".join(f"{k}:{v}" for k, v in message.attributes.items()) + "}")
    if message.redelivery_count:
        parts.append(f"redelivery={message.redelivery_count}")
    if getattr(message, "schema_id", None) is not None:
        return _schema_line(message, parts)
    payload = bytes(message.payload)
    text = _payload_text(payload)
    if text is None:
        shown = f"<{len(payload)} bytes of binary; --json shows it as base64>"
    elif any(ch < " " and ch != "\t" for ch in text):
        # Keep one message on one line: escape line breaks and other controls.
        shown = json.dumps(text, ensure_ascii=False)[1:-1]
    else:
        shown = text
    return " ".join(parts) + " | " + shown


def _schema_line(message: Any, parts: list[str]) -> str:
    """A schema'd message: its line names the schema; a structured value follows, indented."""
    schema = message.schema
    subject = schema.subject if schema is not None else f"id {message.schema_id}"
    parts.append(f"schema={subject} v{message.schema_version}")
    try:
        value = _jsonable(message.value())
    except DanubeError as exc:
        return " ".join(parts) + f" | <not decodable: {exc.message}>"
    if isinstance(value, dict | list):
        return " ".join(parts) + "\n" + json.dumps(value, indent=2, ensure_ascii=False)
    return " ".join(parts) + " | " + (value if isinstance(value, str) else json.dumps(value))

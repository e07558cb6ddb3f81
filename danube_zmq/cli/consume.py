"""`danube consume`: subscribe, print and ack messages.

1. Check the topic name, connect and subscribe within `--connect-timeout`.
2. Receive; print each message (one line, or one JSON object with `--json`),
   then ack it, so a message is acked only once it is printed (at-least-once).
3. Stop after `--count` messages, after `--timeout` seconds without one, or on
   Ctrl-C / SIGTERM (exit 0 in all three cases).

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
@click.option("-m", "--subscription", required=True, help="Subscription name.")
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
    subscription: str,
    consumer_name: str | None,
    sub_type: str,
    initial_position: str,
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
    """
    topic = check_topic(topic)
    if not subscription:
        raise click.UsageError("the subscription name must not be empty")
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
        )
    )


async def _consume(
    *,
    service_url: str,
    connect_timeout: float,
    topic: str,
    subscription: str,
    consumer_name: str | None,
    sub_type: SubType,
    initial_position: str,
    count: int | None,
    timeout: float | None,
    as_json: bool,
    reader_schema: bytes | None = None,
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
                consumer = await stop.race(
                    within(
                        client.subscribe(
                            topic,
                            subscription,
                            sub_type=sub_type,
                            consumer_name=consumer_name,
                            initial_position=initial_position,
                            reader_schema=reader_schema,
                        ),
                        connect_timeout,
                        service_url,
                    )
                )
                stack.push_async_callback(consumer.close)
                status(
                    f"subscribed {subscription!r} ({sub_type.name.lower()}) to {topic}; "
                    + ("waiting for messages" if count is None and timeout is None else "receiving")
                    + " (Ctrl-C to stop)"
                )
                while count is None or received < count:
                    wait_seconds = timeout if timeout is not None else _IDLE_RECEIVE_SECONDS
                    try:
                        message = await stop.race(consumer.receive(timeout=wait_seconds))
                    except Timeout:
                        if timeout is None:
                            continue
                        status(f"no message for {timeout:g} s")
                        break
                    if as_json:
                        emit_json(message_record(message))
                    else:
                        emit_line(message_line(message))
                    await consumer.ack(message)
                    received += 1
        except Interrupted:
            status(f"{stop.signal_name or 'signal'} received")
    status(f"received {received} message{'s' if received != 1 else ''}")


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

"""`danube produce`: send messages from text, a file or stdin lines.

1. Check the topic name and the payload source before touching the network.
2. Connect and create the producer within `--connect-timeout`.
3. With `--interval 0`, pipeline: `send_nowait` up to `_IN_FLIGHT_MAX` messages,
   then `flush` and collect their ids; otherwise `send`, wait, repeat.
4. Report each id (`--json`: one object per line) and a summary.

With a schema (`--schema-subject`, or `--schema-file` registered on the way) each -m or
--stdin text is read as the schema's type has it: JSON for json_schema, avro and
protobuf (a JSON object of the message's fields), a number for number, text for string;
the client encodes and checks it. -f sends the file's bytes as they are (already
encoded), and the broker checks them if the topic validates payloads.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import re
import sys
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from danube_zmq.cli.options import (
    attributes_callback,
    check_topic,
    connect_timeout_option,
    load_client,
    partition_of,
    service_url_option,
    within,
)
from danube_zmq.cli.output import emit_json, emit_line, status, stderr_console, stderr_is_terminal
from danube_zmq.schemas.types import SchemaType, parse_schema_type
from danube_zmq.transport.compression import CODECS
from danube_zmq.transport.errors import InvalidArgument, ResourceExhausted

__all__ = ["produce"]

# Messages sent with send_nowait before we flush and collect their ids: bounds
# the futures we hold and how much a failed run leaves unreported.
_IN_FLIGHT_MAX = 1000
# Stdin lines read ahead of the producer.
_STDIN_LINES_MAX = 1000


@dataclass(frozen=True, slots=True, kw_only=True)
class _Plan:
    service_url: str
    connect_timeout: float
    topic: str
    payload: bytes | None  # None: lines from stdin
    count: int
    interval_ms: int
    key: str | None
    attributes: dict[str, str] | None
    partitions: int | None
    reliable: bool
    producer_name: str | None
    as_json: bool
    schema_subject: str | None = None
    schema_version: int | None = None
    schema_min_version: int | None = None
    schema_file: Path | None = None
    schema_type: SchemaType | None = None
    text_payloads: bool = True  # -m / --stdin (read by the schema) rather than -f (sent as is)
    chunking: bool = False
    compression: str | None = None
    deliver_after_ms: int | None = None
    deliver_at_ms: int | None = None

    def timing(self) -> dict[str, int | None]:
        return {"deliver_after_ms": self.deliver_after_ms, "deliver_at_ms": self.deliver_at_ms}


_DELAY_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def _delay_ms(ctx: click.Context, param: click.Parameter, value: str | None) -> int | None:
    """`1500ms`, `30s`, `5m`, `2h`, `1d` (a bare number is ms) -> ms."""
    if value is None:
        return None
    match = re.fullmatch(r"\s*(\d{1,12})\s*(ms|s|m|h|d)?\s*", value)
    if match is None:
        raise click.BadParameter(f"{value!r} is not a duration: a whole number with ms, s, m, h or d, as 30s")
    return int(match.group(1)) * _DELAY_UNITS_MS[match.group(2) or "ms"]


def _time_ms(ctx: click.Context, param: click.Parameter, value: str | None) -> int | None:
    """ISO 8601 (UTC unless it names a zone) or ms since the epoch -> ms since the epoch."""
    if value is None:
        return None
    if value.strip().isdigit():
        return int(value)
    try:
        moment = datetime.datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except ValueError:
        raise click.BadParameter(f"{value!r} is neither ISO 8601 (2026-12-24T18:00:00Z) nor ms since the epoch")\
            from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.UTC)
    return int(moment.timestamp() * 1000)


@click.command("produce")
@service_url_option
@click.option("-t", "--topic", required=True, help="Topic to send to: /namespace/topic.")
@click.option("-m", "--message", metavar="TEXT", help="Payload text (sent as UTF-8); '-' means --stdin.")
@click.option(
    "-f",
    "--file",
    "file_path",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Send the whole file as one binary payload.",
)
@click.option("--stdin", "from_stdin", is_flag=True, help="Send each line of stdin as one message.")
@click.option(
    "-c", "--count", type=click.IntRange(min=1), default=1, show_default=True,
    help="How many times to send the -m/-f payload.",
)
@click.option(
    "-i", "--interval", "interval_ms", type=click.IntRange(min=0), default=0, show_default=True,
    metavar="MS", help="Pause between messages; 0 sends as fast as the broker takes them.",
)
@click.option("-k", "--key", help="Routing key (picks the partition; Key-Shared dispatch).")
@click.option(
    "-a", "--attributes", callback=attributes_callback, metavar="K1:V1,K2:V2",
    help="Message attributes.",
)
@click.option(
    "-p", "--partitions", type=click.IntRange(min=1),
    help="Create the topic with this many partitions if it does not exist.",
)
@click.option("--reliable", is_flag=True, help="Reliable dispatch: stored and redelivered until acked.")
@click.option("-n", "--producer-name", help="Producer name [default: chosen by the client].")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object per sent message.")
@click.option("--chunking", is_flag=True,
              help="Send a payload larger than the broker's message size in chunks (the consumer puts it together).")
@click.option("--compression", type=click.Choice(list(CODECS)),
              help="Compress each payload with this codec (consumers decompress it).")
@click.option("--deliver-after", "deliver_after_ms", callback=_delay_ms, metavar="DURATION",
              help="Delayed message: Shared and Key-Shared subscriptions get it this long from now, as 1500ms, 30s,"
                   " 5m, 2h or 1d (reliable topics).")
@click.option("--deliver-at", "deliver_at_ms", callback=_time_ms, metavar="TIME",
              help="Delayed message: delivered at this time, ISO 8601 (2026-12-24T18:00:00Z) or ms since the epoch.")
@click.option("--schema-subject", metavar="SUBJECT", help="Write this registered schema subject (binds the topic).")
@click.option("--schema-version", type=click.IntRange(min=1), metavar="N", help="Pin this version of the subject.")
@click.option("--schema-min-version", type=click.IntRange(min=1), metavar="N",
              help="Use the latest version if it is at least N.")
@click.option("--schema-file", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Register this schema (subject: --schema-subject or the topic's name) and write it.")
@click.option("--schema-type", metavar="TYPE",
              help="Type of --schema-file: json_schema, avro, protobuf, string, bytes or number.")
@connect_timeout_option
def produce(
    service_url: str,
    topic: str,
    message: str | None,
    file_path: Path | None,
    from_stdin: bool,
    count: int,
    interval_ms: int,
    key: str | None,
    attributes: dict[str, str] | None,
    partitions: int | None,
    reliable: bool,
    producer_name: str | None,
    as_json: bool,
    chunking: bool,
    compression: str | None,
    deliver_after_ms: int | None,
    deliver_at_ms: int | None,
    schema_subject: str | None,
    schema_version: int | None,
    schema_min_version: int | None,
    schema_file: Path | None,
    schema_type: str | None,
    connect_timeout: float,
) -> None:
    """Send messages to a topic.

    The payload is -m TEXT, -f FILE (binary, one message) or --stdin (one
    message per line, empty lines skipped). With --json, stdout gets one
    {"topic","offset","producer_id","partition"} object per message.

    \b
    Examples:
      danube produce -t /default/demo -m "Hello, Danube!" -c 10
      danube produce -t /default/events -p 3 -m "partitioned" -c 50 --json
      danube produce -t /default/orders --reliable -a "priority:high,region:eu" -m '{"id":1}'
      danube produce -t /default/images -f photo.jpg
      danube produce -t /default/videos --reliable --chunking -f clip.mp4
      danube produce -t /default/logs --reliable --compression zstd --stdin < app.log
      danube produce -t /default/reminders --reliable --deliver-after 1m -m "call back"
      seq 1000 | danube produce -t /default/numbers --stdin
      danube produce -t /default/orders --schema-subject orders -m '{"id": 1, "sku": "apple"}'
      danube produce -t /default/payments --schema-file payment.avsc --schema-type avro -m '{"amount": 9.5}'
    """
    if message == "-":
        message, from_stdin = None, True
    sources = sum((message is not None, file_path is not None, from_stdin))
    if sources != 1:
        raise click.UsageError("give the payload with exactly one of -m TEXT, -f FILE or --stdin")
    if from_stdin and count != 1:
        raise click.UsageError("--count applies to -m and -f; with --stdin each line is sent once")
    if deliver_after_ms is not None and deliver_at_ms is not None:
        raise click.UsageError("give --deliver-after or --deliver-at, not both")
    topic = check_topic(topic)
    kind = _schema_options(schema_subject, schema_version, schema_min_version, schema_file, schema_type)
    if message is not None:
        payload: bytes | None = message.encode("utf-8")
    elif file_path is not None:
        payload = file_path.read_bytes()
    else:
        payload = None
        if sys.stdin.isatty():
            status("reading messages from stdin, one per line; end with Ctrl-D")
    plan = _Plan(
        service_url=service_url,
        connect_timeout=connect_timeout,
        topic=topic,
        payload=payload,
        count=count,
        interval_ms=interval_ms,
        key=key,
        attributes=attributes,
        partitions=partitions,
        reliable=reliable,
        producer_name=producer_name,
        as_json=as_json,
        schema_subject=schema_subject or (_subject_of(topic) if schema_file is not None else None),
        schema_version=schema_version,
        schema_min_version=schema_min_version,
        schema_file=schema_file,
        schema_type=kind,
        text_payloads=file_path is None,
        chunking=chunking,
        compression=compression,
        deliver_after_ms=deliver_after_ms,
        deliver_at_ms=deliver_at_ms,
    )
    asyncio.run(_produce(plan))


def _schema_options(subject: str | None, version: int | None, min_version: int | None, schema_file: Path | None,
                    schema_type: str | None) -> SchemaType | None:
    if (schema_file is None) != (schema_type is None):
        raise click.UsageError("--schema-file and --schema-type go together")
    if subject is None and schema_file is None and (version is not None or min_version is not None):
        raise click.UsageError("--schema-version and --schema-min-version need --schema-subject")
    if version is not None and min_version is not None:
        raise click.UsageError("give --schema-version or --schema-min-version, not both")
    if schema_type is None:
        return None
    try:
        return parse_schema_type(schema_type)
    except InvalidArgument as exc:
        raise click.BadParameter(exc.message, param_hint="--schema-type") from None


def _subject_of(topic: str) -> str:
    """The subject a --schema-file registers under by default: the topic's own name."""
    return topic.rstrip("/").rsplit("/", 1)[-1]


def schema_value(schema_type: SchemaType, payload: bytes) -> Any:
    """What a -m / --stdin text means under a schema of `schema_type`."""
    if schema_type is SchemaType.BYTES:
        return payload
    text = payload.decode("utf-8")
    if schema_type is SchemaType.STRING:
        return text
    if schema_type is SchemaType.NUMBER:
        try:
            return int(text)
        except ValueError:
            try:
                return float(text)
            except ValueError:
                raise InvalidArgument(f"message {text[:60]!r} is not a number") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidArgument(f"message is not JSON ({exc.msg} at column {exc.colno}): {text[:60]!r}") from None


async def _produce(plan: _Plan) -> None:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn  # not for --help

    DanubeClient = load_client()
    total = plan.count if plan.payload is not None else None
    sent = 0
    started = time.monotonic()
    show_progress = not plan.as_json and stderr_is_terminal() and total != 1
    progress = Progress(
        TextColumn("sending to {task.fields[topic]}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[rate]}"),
        TimeElapsedColumn(),
        console=stderr_console(),
        transient=True,
        disable=not show_progress,
    )
    last_id: Any = None

    def report(message_id: Any) -> None:
        nonlocal sent, last_id
        sent += 1
        last_id = message_id
        if plan.as_json:
            emit_json(
                {
                    "topic": message_id.topic,
                    "offset": message_id.offset,
                    "producer_id": message_id.producer_id,
                    "partition": partition_of(message_id.topic),
                }
            )
        elif show_progress:
            elapsed = max(time.monotonic() - started, 1e-9)
            progress.update(task, advance=1, rate=f"{sent / elapsed:,.0f} msg/s")

    async with contextlib.AsyncExitStack() as stack:
        client = DanubeClient(plan.service_url)
        # Registered before start: a start cut short by the timeout still closes its sockets.
        stack.push_async_callback(client.close)
        await within(client.start(), plan.connect_timeout, plan.service_url)
        if plan.schema_file is not None:
            await within(_register(plan), plan.connect_timeout, plan.service_url)
        producer = await within(
            client.create_producer(
                plan.topic,
                name=plan.producer_name,
                dispatch="reliable" if plan.reliable else "non_reliable",
                partitions=plan.partitions,
                schema_subject=plan.schema_subject,
                schema_version=plan.schema_version,
                schema_min_version=plan.schema_min_version,
                chunking=plan.chunking,
                compression=plan.compression,
            ),
            plan.connect_timeout,
            plan.service_url,
        )
        stack.push_async_callback(producer.close)
        started = time.monotonic()  # rates count sending, not connecting
        with progress:
            task = progress.add_task("send", total=total, topic=plan.topic, rate="")
            payloads: AsyncIterator[Any] = _repeat(plan.payload, plan.count) if plan.payload is not None \
                else _stdin_lines()
            if producer.schema is not None and plan.text_payloads:
                payloads = _as_values(payloads, producer.schema.schema_type)
            if plan.interval_ms == 0:
                await _send_pipelined(producer, payloads, plan, report)
            else:
                await _send_paced(producer, payloads, plan, report)

    elapsed = time.monotonic() - started
    if sent == 1 and last_id is not None:
        summary = f"sent 1 message to {last_id.topic} at offset {last_id.offset}"
    else:
        rate = f" ({sent / elapsed:,.0f} msg/s)" if elapsed > 0 and sent else ""
        summary = f"sent {sent} messages to {plan.topic} in {elapsed:.2f} s{rate}"
    if plan.as_json:
        status(summary)
    else:
        emit_line(summary)


async def _send_pipelined(
    producer: Any, payloads: AsyncIterator[Any], plan: _Plan, report: Callable[[Any], None]
) -> None:
    pending: deque[Any] = deque()

    async def collect() -> None:
        await producer.flush()
        while pending:
            report(await pending.popleft())

    async for payload in payloads:
        try:
            future = producer.send_nowait(payload, key=plan.key, attributes=plan.attributes, **plan.timing())
        except ResourceExhausted:
            # The client's own send queue is full: drain it, then try once more.
            if not pending:
                raise
            await collect()
            future = producer.send_nowait(payload, key=plan.key, attributes=plan.attributes, **plan.timing())
        pending.append(future)
        if len(pending) >= _IN_FLIGHT_MAX:
            await collect()
    await collect()


async def _send_paced(
    producer: Any, payloads: AsyncIterator[Any], plan: _Plan, report: Callable[[Any], None]
) -> None:
    first = True
    async for payload in payloads:
        if not first:
            await asyncio.sleep(plan.interval_ms / 1000)
        first = False
        report(await producer.send(payload, key=plan.key, attributes=plan.attributes, **plan.timing()))


async def _register(plan: _Plan) -> None:
    from danube_zmq.client.schemas import SchemaRegistryClient

    assert plan.schema_file is not None and plan.schema_type is not None and plan.schema_subject is not None
    async with SchemaRegistryClient(plan.service_url) as registry:
        done = await registry.register(plan.schema_subject, plan.schema_type.value, plan.schema_file.read_bytes())
    state = "registered" if done.is_new else "already registered"
    status(f"schema {plan.schema_subject!r} {state} as version {done.version}")


async def _as_values(payloads: AsyncIterator[bytes], schema_type: SchemaType) -> AsyncIterator[Any]:
    async for payload in payloads:
        yield schema_value(schema_type, payload)


async def _repeat(payload: bytes, count: int) -> AsyncIterator[bytes]:
    for _ in range(count):
        yield payload


async def _stdin_lines() -> AsyncIterator[bytes]:
    """Lines of stdin without their line ending; empty lines skipped.

    A daemon thread reads, so a read blocked on a terminal never holds up exit
    (the loop's default executor would be joined at shutdown).
    """
    loop = asyncio.get_running_loop()
    lines: asyncio.Queue[bytes | None] = asyncio.Queue(maxsize=_STDIN_LINES_MAX)
    stream = click.get_binary_stream("stdin")

    def read() -> None:
        try:
            for line in stream:
                asyncio.run_coroutine_threadsafe(lines.put(line), loop).result()
        except RuntimeError:
            return  # the loop closed: nobody is listening any more
        finally:
            with contextlib.suppress(RuntimeError):
                asyncio.run_coroutine_threadsafe(lines.put(None), loop)

    threading.Thread(target=read, name="danube-stdin", daemon=True).start()
    while (line := await lines.get()) is not None:
        line = line.rstrip(b"\r\n")
        if line:
            yield line

"""`danube produce`: send messages from text, a file or stdin lines.

1. Check the topic name and the payload source before touching the network.
2. Connect and create the producer within `--connect-timeout`.
3. With `--interval 0`, pipeline: `send_nowait` up to `_IN_FLIGHT_MAX` messages,
   then `flush` and collect their ids; otherwise `send`, wait, repeat.
4. Report each id (`--json`: one object per line) and a summary.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

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
from danube_zmq.transport.errors import ResourceExhausted

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
      seq 1000 | danube produce -t /default/numbers --stdin
    """
    if message == "-":
        message, from_stdin = None, True
    sources = sum((message is not None, file_path is not None, from_stdin))
    if sources != 1:
        raise click.UsageError("give the payload with exactly one of -m TEXT, -f FILE or --stdin")
    if from_stdin and count != 1:
        raise click.UsageError("--count applies to -m and -f; with --stdin each line is sent once")
    topic = check_topic(topic)
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
    )
    asyncio.run(_produce(plan))


async def _produce(plan: _Plan) -> None:
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
        producer = await within(
            client.create_producer(
                plan.topic,
                name=plan.producer_name,
                dispatch="reliable" if plan.reliable else "non_reliable",
                partitions=plan.partitions,
            ),
            plan.connect_timeout,
            plan.service_url,
        )
        stack.push_async_callback(producer.close)
        started = time.monotonic()  # rates count sending, not connecting
        with progress:
            task = progress.add_task("send", total=total, topic=plan.topic, rate="")
            payloads = _repeat(plan.payload, plan.count) if plan.payload is not None else _stdin_lines()
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
    producer: Any, payloads: AsyncIterator[bytes], plan: _Plan, report: Callable[[Any], None]
) -> None:
    pending: deque[Any] = deque()

    async def collect() -> None:
        await producer.flush()
        while pending:
            report(await pending.popleft())

    async for payload in payloads:
        try:
            future = producer.send_nowait(payload, key=plan.key, attributes=plan.attributes)
        except ResourceExhausted:
            # The client's own send queue is full: drain it, then try once more.
            if not pending:
                raise
            await collect()
            future = producer.send_nowait(payload, key=plan.key, attributes=plan.attributes)
        pending.append(future)
        if len(pending) >= _IN_FLIGHT_MAX:
            await collect()
    await collect()


async def _send_paced(
    producer: Any, payloads: AsyncIterator[bytes], plan: _Plan, report: Callable[[Any], None]
) -> None:
    first = True
    async for payload in payloads:
        if not first:
            await asyncio.sleep(plan.interval_ms / 1000)
        first = False
        report(await producer.send(payload, key=plan.key, attributes=plan.attributes))


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

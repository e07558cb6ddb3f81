"""A reader: reads a reliable topic from a position, as Pulsar's Reader does, without a
durable subscription.

Underneath, a consumer of a non-durable Exclusive subscription of its own
(`Subscribe.durable` False): the broker keeps no cursor for it, counts it for neither
retention nor the backlog quota, and drops it when the reader closes or its connection
goes. Each message read is acknowledged at once (that frees the consumer's window, it
stores nothing); when the reader attaches again (a broker restart, a topic move, a
reconnect) it starts after the last message it read, partition by partition.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from danube_zmq.client.errors import AlreadyClosed
from danube_zmq.client.message import Message
from danube_zmq.transport.client_protocol import LastOffset
from danube_zmq.transport.errors import FailedPrecondition

if TYPE_CHECKING:
    from danube_zmq.client.consumer import Consumer

__all__ = ["Reader"]


class Reader:
    """Made by `DanubeClient.create_reader`; iterate with `async for`."""

    def __init__(self, consumer: Consumer) -> None:
        self._consumer = consumer

    @property
    def topic(self) -> str:
        return self._consumer.topic

    @property
    def partitions(self) -> list[str]:
        return self._consumer.partitions

    async def read_next(self, timeout: float | None = None) -> Message:
        """The next message; waits at most `timeout` seconds (forever if None), then
        raises `Timeout`. A message read already (queued before the reader attached
        again, and delivered again after it) is skipped."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            message = await self._consumer.receive(left)
            await self._consumer.ack(message)
            partition = self._consumer._by_topic[message.message_id.topic]
            if partition.resume_offset is None or message.message_id.offset >= partition.resume_offset:
                # After a chunked message, after its last chunk.
                partition.resume_offset = max(message.chunk_offsets or (message.message_id.offset,)) + 1
                return message

    async def has_message_available(self) -> bool:
        """Whether a message is there to read now: one is queued here, or a partition
        holds a message past what this reader read (asked of the broker)."""
        if self._consumer.queued:
            return True
        await self._consumer.flush_acks()  # the cursor the broker answers with counts them
        for partition in self._consumer._partitions:
            last = await partition.last_offset()
            if last.offset > last.cursor:
                return True
        return bool(self._consumer.queued)

    async def last_offsets(self) -> dict[str, LastOffset]:
        """Per partition topic, as the broker answers for this reader: the last offset
        the partition holds, what this reader has read (`cursor`) and the first offset
        its log still holds (`log_start_offset`, below it retention removed)."""
        await self._consumer.flush_acks()
        return {p.topic: await p.last_offset() for p in self._consumer._partitions}

    async def seek(self, *, offset: int | None = None, publish_time: int | None = None) -> None:
        """Read from `offset` (one partition topic) or from the first message published
        at or after `publish_time` (ms since the epoch, every partition) on."""
        await self._consumer.seek(offset=offset, publish_time=publish_time)

    async def close(self) -> None:
        """Detach: the broker drops the reader's subscription."""
        await self._consumer.close()

    def __aiter__(self) -> Reader:
        return self

    async def __anext__(self) -> Message:
        try:
            return await self.read_next()
        except AlreadyClosed:
            raise StopAsyncIteration from None

    async def __aenter__(self) -> Reader:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()


def check_reliable(consumer: Consumer) -> None:
    """A reader needs stored messages: a non-reliable topic has none to read back."""
    if consumer.reliable is False:
        raise FailedPrecondition(f"topic {consumer.topic} is not reliable: a reader reads stored messages")
